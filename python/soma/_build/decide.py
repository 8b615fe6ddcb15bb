"""``soma.each``, ``soma.switch`` and ``soma.loop``: steps that decide as the graph runs.

Each is one node of the graph around it — composed with ``>>`` and ``|``, named with
``.named()`` — that runs sub-graphs of its own: ``each`` its body on every item of a list, items
in flight together; ``switch`` the one case its selector names; ``loop`` its body until a
predicate says done. The plan shows them as ``Map``, ``Switch`` and ``Loop`` steps holding their
sub-plans; the nodes inside get ids namespaced under the step's (``chunks/clean``), which
traces, errors and ``Graph.retries()`` use.

A sub-graph is made from its expression when the step is registered in a graph, so that
``.retry()``, ``.time_limit()`` and ``.on()`` written on the step — or on an expression around
it — reach the nodes inside that have none of their own, as they reach the nodes of an
expression. A step runs in this process: ``.at()`` on it, or on a node inside, is refused.

A step with an async node inside — at any depth — makes the graph around it async: its core
holds that node under its namespaced id, and the graph then runs on an event loop, where the
engine walks the step, its items as tasks of their own.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Hashable, Mapping
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, Self, cast

from soma import _soma
from soma._build.dsl import Expr
from soma._build.node import Node
from soma.errors import HostError, RunError


# What a sub-graph is written as: a node, an expression of nodes, or `None` for a case that
# passes its input on as it is.
Body = Expr | Node


# A sub-graph made for a step: its core, which holds its settings and knows its async nodes.
_Made = _soma.GraphCore

#: How the graph a step is registered in makes a sub-graph of an expression: the core of a
#: graph of its own class made of it (``Graph.somatize``), handed down by ``Graph.node``.
MadeOf = Callable[[Expr], _soma.GraphCore]


class Decision(Node):
    """What ``each``, ``switch`` and ``loop`` share: sub-graphs made at registration."""

    # Its sub-graphs, made before the registration that uses them (see `_graphs`).
    _soma_prebuilt: tuple[MadeOf, list[_Made]] | None = None

    def _register(self, core: _soma.GraphCore, node_id: str, made_of: MadeOf) -> None:
        """Registers this step in ``core`` as ``node_id``, with its sub-graphs, each made by
        ``made_of`` (called by ``Graph.node``). Their async nodes need no note here: embedded,
        they are the core's under their ids in ``core``, which then runs on an event loop."""
        self._checked(node_id)
        self._add(core, node_id, self._graphs(made_of))

    def _add(
        self, core: _soma.GraphCore, node_id: str, graphs: list[tuple[str | None, _soma.GraphCore]]
    ) -> None:
        """Registers this step in ``core`` as ``node_id``, running ``graphs`` (see ``_bodies``
        for their keys)."""
        raise NotImplementedError

    def at(self, host: str) -> NoReturn:
        """Refused: a step that decides runs in this process, with what it runs."""
        raise _host_refused(type(self).__name__.lower(), self._soma_id or "this step", own=True)

    def _expr(self, body: Body, step: str) -> Expr:
        """``body`` as an expression, this step's retries, time limit and device given to the
        nodes inside that have none."""
        expr = Expr.of(body, step)
        if self._soma_retry is not None:
            expr.retry(*self._soma_retry)
        if self._soma_time_limit is not None:
            expr.time_limit(self._soma_time_limit)
        if self._soma_device is not None:
            expr.on(self._soma_device)
        return expr

    def _made(self, made_of: MadeOf, body: Body | None) -> _Made:
        """The core of the sub-graph of ``body`` (an empty one for a case that passes its input
        on), made by ``made_of`` (see ``_expr``). Its ids are its own, not yet namespaced."""
        if body is None:
            return _soma.GraphCore()
        kind = type(self).__name__.lower()
        sub = made_of(self._expr(body, kind))
        hosts = sub.hosts()
        if hosts:
            inner, _ = hosts[0]
            raise _host_refused(kind, inner, own=False)
        return sub

    def _graphs(self, made_of: MadeOf) -> list[tuple[str | None, _soma.GraphCore]]:
        """Its sub-graphs, made by ``made_of`` to embed in the graph it is registered in, each
        with its key.

        A sub-graph is made by registering its nodes, and a step among them makes its own in
        turn: made that way, a nesting a thousand steps deep would recurse a thousand times.
        So the steps nested in this one are found first, with a stack of their own, and their
        sub-graphs made innermost first, each kept on its step for the registration that
        follows, which then goes one level down only.
        """
        bodies = self._bodies()
        prebuilt = self._soma_prebuilt
        self.__dict__.pop("_soma_prebuilt", None)
        if prebuilt is not None and prebuilt[0] == made_of:  # Made as a graph of one class.
            made = prebuilt[1]
        else:
            made = self._made_innermost_first(made_of, [body for _, body in bodies])
        return [(key, core) for (key, _), core in zip(bodies, made, strict=True)]

    def _made_innermost_first(self, made_of: MadeOf, bodies: list[Body | None]) -> list[_Made]:
        """What ``_made`` makes of ``bodies``, the steps nested in them made first (see
        ``_graphs``)."""
        # Outermost first, each step's retries, time limit and device given to what it runs
        # before what that runs is looked into, as registering them would.
        found: list[Decision] = []
        stack: list[tuple[Decision, list[Body | None]]] = [(self, bodies)]
        while stack:
            step, held = stack.pop()
            found.append(step)
            kind = type(step).__name__.lower()
            for body in held:
                if body is not None:
                    for node in step._expr(body, kind)._flattened().nodes:
                        if isinstance(node, Decision):
                            stack.append((node, [inner for _, inner in node._bodies()]))
        try:
            for step in reversed(found[1:]):
                made = [step._made(made_of, inner) for _, inner in step._bodies()]
                step._soma_prebuilt = (made_of, made)
            return [self._made(made_of, body) for body in bodies]
        finally:
            # What a failure left made is not kept for a later registration.
            for step in found:
                step.__dict__.pop("_soma_prebuilt", None)

    def _bodies(self) -> list[tuple[str | None, Body | None]]:
        """What the step runs: each sub-graph's key (a switch's case, as the plan names it;
        ``None`` otherwise), and its body."""
        raise NotImplementedError

    def _checked(self, node_id: str) -> None:
        if self._soma_host is not None:  # Set by an `.at()` around it.
            raise _host_refused(type(self).__name__.lower(), node_id, own=True)


def _host_refused(kind: str, node_id: str, *, own: bool) -> HostError:
    # The engine's refusal, as `g.place_at` on a built graph's step meets it.
    return _soma.host_refused(kind, node_id, own)


class Each(Decision):
    """``soma.each(body)``: ``body`` on every item of the list the step reads.

    Made by :func:`each`, which checks ``in_flight`` first; ``body`` and ``in_flight`` are as
    there."""

    # Not in its key: the nodes of its body are keyed as themselves.
    _soma_not_state = ("_body",)

    def __init__(self, body: Body, in_flight: int | None) -> None:
        self._body = body
        self._in_flight = in_flight
        Expr.of(body, "each")  # Refuses what is no node or expression, here.

    def forward(self, items: Any, ctx: _soma.Ctx) -> NoReturn:
        """Not called: the plan runs the body on each of ``items`` itself.

        Raises:
            RuntimeError: always, naming the step (the node of ``ctx``).
        """
        raise RuntimeError(f"`each` step `{ctx.node}` is run by its plan, not called")

    def _add(
        self, core: _soma.GraphCore, node_id: str, graphs: list[tuple[str | None, _soma.GraphCore]]
    ) -> None:
        [(_, body)] = graphs
        core.add_each(node_id, self, body, self._in_flight)

    def _bodies(self) -> list[tuple[str | None, Body | None]]:
        return [(None, self._body)]


class Switch(Decision):
    """``soma.switch(selector, cases)``: the case ``selector(input)`` names, on that input.

    Made by :func:`switch`; ``selector`` and ``cases`` are as there."""

    # Not in its key, which its selector and its cases' labels make: the nodes of each case are
    # keyed as themselves, so an edit to a case the selector did not take reruns no selector.
    _soma_not_state = ("_cases",)

    def __init__(
        self, selector: Callable[[Any], Hashable], cases: Mapping[Any, Body | None]
    ) -> None:
        if not callable(selector):
            raise TypeError(
                f"switch's selector is a callable of the input, not an object of type "
                f"`{type(selector).__name__}`\nhint: `soma.switch(lambda doc: doc.kind, {{...}})`"
            )
        if not isinstance(cases, Mapping) or not cases:
            raise TypeError(
                "switch's cases are a non-empty dict from key to expression\n"
                'hint: `soma.switch(kind, {"ocr": Ocr() >> Parse(), "text": Parse()})`'
            )
        self._selector = selector
        self._cases = dict(cases)
        for case in self._cases.values():
            if case is not None:
                Expr.of(case, "switch")
        # Each key's name in the plan: a `str` as it is, anything else as its `repr`.
        self._labels: dict[Any, str] = {
            key: key if isinstance(key, str) else repr(key) for key in self._cases
        }
        if len(set(self._labels.values())) != len(self._labels):
            raise ValueError(
                "two of switch's keys read the same in the plan\nhint: use keys that differ as text"
            )

    def forward(self, x: Any, ctx: _soma.Ctx) -> str:
        """The key of the case to run on ``x``, as the plan names it.

        Raises:
            soma.RunError: ``selector(x)`` names no case (the message names it and the known
                ones; ``.node`` is the step, the node of ``ctx``).
        """
        return self._label(self._selector(x), ctx)

    def _label(self, key: Any, ctx: _soma.Ctx) -> str:
        """The label of the case ``key`` names, as the plan names it."""
        try:
            return self._labels[key]
        except (KeyError, TypeError):
            # As written, by `repr`: a key `False` and a case `"False"` read apart.
            known = ", ".join(f"`{known!r}`" for known in self._labels)
            error = RunError(
                f"`switch` step `{ctx.node}` has no case for key `{key!r}`; its cases: {known}\n"
                "hint: make the selector return one of these keys, or add a case for it"
            )
            error.node = ctx.node
            raise error from None

    def _add(
        self, core: _soma.GraphCore, node_id: str, graphs: list[tuple[str | None, _soma.GraphCore]]
    ) -> None:
        core.add_switch(node_id, self, [(cast(str, label), case) for label, case in graphs])

    def _bodies(self) -> list[tuple[str | None, Body | None]]:
        # A case's ids are namespaced by its key too: two cases may hold a node of one name.
        return [(label, self._cases[key]) for key, label in self._labels.items()]


class Loop(Decision):
    """``soma.loop(body, until=..., max_iterations=...)``: ``body`` on its own output until
    ``until`` of it is true.

    Made by :func:`loop`; ``body``, ``until`` and ``max_iterations`` are as there."""

    # Not in its key, which its predicate and bound make: the body's nodes are keyed as
    # themselves.
    _soma_not_state = ("_body",)

    def __init__(self, body: Body, until: Callable[[Any], object], max_iterations: int) -> None:
        if not callable(until):
            raise TypeError(
                "loop's `until` is a callable of the body's output, not an object of type "
                f"`{type(until).__name__}`\n"
                "hint: `soma.loop(Ask(), until=parses, max_iterations=5)`"
            )
        if (
            not isinstance(max_iterations, int)
            or isinstance(max_iterations, bool)
            or not 1 <= max_iterations < 2**32
        ):
            raise ValueError(
                f"loop's max_iterations is an int of at least 1, not {max_iterations!r}\n"
                "hint: the body runs at most that many times"
            )
        Expr.of(body, "loop")
        self._body = body
        self._until = until
        self._max_iterations = max_iterations

    def forward(self, output: Any, ctx: _soma.Ctx) -> bool:
        """Whether the body's ``output`` is done: ``until(output)``, as a bool (``ctx``, the
        call's, is not read)."""
        return bool(self._until(output))

    def _add(
        self, core: _soma.GraphCore, node_id: str, graphs: list[tuple[str | None, _soma.GraphCore]]
    ) -> None:
        [(_, body)] = graphs
        core.add_loop(node_id, self, body, self._max_iterations)

    def _bodies(self) -> list[tuple[str | None, Body | None]]:
        return [(None, self._body)]


class AsyncSwitch(Switch):
    """``soma.switch`` with an async selector: the step's node is async, awaited where the
    engine awaits an async node's call."""

    async def forward(self, x: Any, ctx: _soma.Ctx) -> str:  # type: ignore[override]
        # The selector is async here (see `switch`), though typed as a switch's is.
        return self._label(await cast(Awaitable[Hashable], self._selector(x)), ctx)


class AsyncLoop(Loop):
    """``soma.loop`` with an async ``until``: the step's node is async, awaited where the
    engine awaits an async node's call."""

    async def forward(self, output: Any, ctx: _soma.Ctx) -> bool:  # type: ignore[override]
        # `until` is async here (see `loop`), though typed as a loop's is.
        return bool(await cast(Awaitable[object], self._until(output)))


def _is_async(function: Callable[..., object]) -> bool:
    """Whether calling ``function`` makes a coroutine: an ``async def`` function or method, or
    an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        inspect.getattr_static(type(function), "__call__", None)
    )


def each(body: Body, *, in_flight: int | None = None) -> Each:
    """A step that runs ``body`` — a node or an expression — on every item of the list (any
    sized sequence but text, bytes and mappings) it reads, and returns their results as a list
    in input order.

    The items are in flight together, each item's run a branch of its own (a thread lent to
    it start to finish, a copy of the context, a table of values of its own), at most
    ``in_flight`` at once when given. The error of the first failing item *by index* is the
    step's: later items stop at their next node boundary, earlier ones run on, as the branches
    of a wave do. ``each`` nests inside ``each`` at any depth (up to 32 steps that decide).

    Args:
        body: the node or expression run on each item.
        in_flight: how many items run at once at most; ``None`` (the default) lets every item
            be in flight at once.

    Returns:
        The step, a node to compose with ``>>`` and ``|``.

    Raises:
        ValueError: ``in_flight`` is not an int of at least 1, or ``None``.
        TypeError: ``body`` is no node or expression.
    """
    if in_flight is not None and (
        not isinstance(in_flight, int) or isinstance(in_flight, bool) or in_flight < 1
    ):
        raise ValueError(
            f"each's in_flight is an int of at least 1, or None, not {in_flight!r}\n"
            "hint: None lets every item be in flight at once"
        )
    return Each(body, in_flight)


def switch(selector: Callable[[Any], Hashable], cases: Mapping[Any, Body | None]) -> Switch:
    """A step that calls ``selector`` on its input and runs only the case it names, on that
    same input; the other cases are not called at all. A case of ``None`` passes the input on.
    A key no case has is a ``soma.RunError`` naming it and the known ones, when the step runs.
    An async selector (``async def``) is awaited, as an async node is.

    Args:
        selector: a callable of the step's input that returns a key of ``cases``.
        cases: a non-empty mapping from key to the node or expression to run (``None``: the
            input passes on). A key that is not a ``str`` is named by its ``repr`` in the plan.

    Returns:
        The step, a node to compose with ``>>`` and ``|``.

    Raises:
        TypeError: ``selector`` is not callable, ``cases`` is not a non-empty mapping, or a
            case is no node or expression.
        ValueError: two keys read the same in the plan.
    """
    if _is_async(selector):
        return AsyncSwitch(selector, cases)
    return Switch(selector, cases)


def loop(body: Body, *, until: Callable[[Any], object], max_iterations: int) -> Loop:
    """A step that runs ``body`` on its input, then on its own output, until ``until(output)``
    is true, and returns that output. A body that ran ``max_iterations`` times without is a
    ``soma.RunError`` saying so, with the last output's type, when the step runs. An async
    ``until`` is awaited, as an async node is.

    Args:
        body: the node or expression run on each iteration.
        until: a callable of the body's output, true when the loop is done.
        max_iterations: how many times the body may run at most (no default: a loop is
            bounded), from 1 to 2**32 - 1.

    Returns:
        The step, a node to compose with ``>>`` and ``|``.

    Raises:
        TypeError: ``until`` is not callable, or ``body`` is no node or expression.
        ValueError: ``max_iterations`` is not an int of at least 1.
    """
    if _is_async(until):
        return AsyncLoop(body, until, max_iterations)
    return Loop(body, until, max_iterations)
