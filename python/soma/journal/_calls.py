"""A node's effects and questions (``ctx.effect``, ``ctx.ask``), replayed by ordinal.

A Python frame cannot be kept across processes, so a node that paused, failed or was cut off
by a crash runs again from its start on resume. What makes that safe is that each call numbers
its effects and its questions as it makes them: the n-th ``ctx.effect(...)`` of a call returns
the n-th recorded result when there is one, and runs (then records) only past the end of the
record; the n-th ``ctx.ask(...)`` returns the n-th answer, and one past the answers records the
question and unwinds the node with :class:`Asked`, which no ``except Exception`` catches, so the
run pauses holding nothing. Code between effects must take the same path on every run of the
call — a random number or the time read outside an effect is the user's to make an effect.

A call is told from another by its node, its turn and the content of its input (its digest):
two calls of one node on equal inputs in one run share their effects and answers.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from collections.abc import Callable
from typing import Any

from soma._run.observe import Pausing
from soma._soma import Ctx
from soma.cache import _fingerprint
from soma.journal._active import ACTIVE


class Asked(Pausing):
    """Unwinds a node that asked a question with no answer yet: its run pauses. A
    ``BaseException`` (a :class:`Pausing`, which events report as ``"paused"``), so that no
    ``except Exception`` in the node keeps it from pausing."""

    def __init__(self, path: str, question: object) -> None:
        super().__init__(f"node `{path}` asked {question!r}: the run pauses for an answer")
        self.path = path
        self.question = question


class Call:
    """One call of a node, as its effects and questions are numbered in: made by the call's
    ``Ctx`` when the node first makes an effect or asks."""

    __slots__ = ("_effects", "_identity", "_input", "_lock", "_questions", "node", "turn")

    def __init__(self, node: str, input: object, turn: int) -> None:
        self.node = node
        self.turn = turn
        self._input: object = input
        self._identity: bytes | None = None
        self._effects = 0
        self._questions = 0
        self._lock = threading.Lock()

    def identity(self) -> bytes:
        """What tells this call from another in its run: node, turn, input's content."""
        if self._identity is None:
            try:
                content = _fingerprint.digest(self._input)
            except Exception:  # An input with no digest: calls of the node share effects.
                content = b""
            self._input = None  # Not kept past what it was read for.
            self._identity = hashlib.blake2b(
                b"\0".join((self.node.encode(), str(self.turn).encode(), content)),
                digest_size=16,
            ).digest()
        return self._identity

    def next_effect(self) -> int:
        with self._lock:
            self._effects += 1
            return self._effects - 1

    def next_question(self) -> int:
        with self._lock:
            self._questions += 1
            return self._questions - 1


def effect(
    ctx: Ctx, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> Any:
    """``ctx.effect``: ``function(*args, **kwargs)``, once per run."""
    run = ACTIVE.get()
    if run is None:
        return function(*args, **(kwargs or {}))
    call: Call = ctx._call
    ordinal = call.next_effect()
    identity = call.identity()
    found, result = run.effect(identity, ordinal)
    if found:
        return result
    result = function(*args, **(kwargs or {}))
    run.record_effect(call.node, identity, ordinal, result)
    return result


async def aeffect(
    ctx: Ctx, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> Any:
    """``ctx.aeffect``: awaits ``function(*args, **kwargs)`` once per run."""
    run = ACTIVE.get()
    if run is None:
        return await _awaited(function(*args, **(kwargs or {})))
    call: Call = ctx._call
    ordinal = call.next_effect()
    identity = call.identity()
    found, result = run.effect(identity, ordinal)
    if found:
        return result
    result = await _awaited(function(*args, **(kwargs or {})))
    run.record_effect(call.node, identity, ordinal, result)
    return result


async def _awaited(made: Any) -> Any:
    return await made if inspect.isawaitable(made) else made


def ask(ctx: Ctx, question: object) -> Any:
    """``ctx.ask``: the answer to ``question``, or the run pauses until it has one."""
    run = ACTIVE.get()
    if run is None:
        raise RuntimeError(
            f"node `{ctx.node}` asked {question!r}, and a run pauses for an answer only with a "
            "journal to keep it in\n"
            "hint: g.forward(x, run='some-id', journal=soma.Journal('runs.db'))"
        )
    call: Call = ctx._call
    ordinal = call.next_question()
    identity = call.identity()
    found, answer = run.answer(identity, ordinal)
    if found:
        return answer
    path = run.ask(call.node, identity, ordinal, question)
    raise Asked(path, question)


async def aask(ctx: Ctx, question: object) -> Any:
    """``ctx.aask``: ``ctx.ask`` to await in an async node."""
    return ask(ctx, question)
