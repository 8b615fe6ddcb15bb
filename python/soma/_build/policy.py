"""What ``.retry()``, ``.time_limit()`` and ``.concurrency()`` accept, checked where they are
written.

A node keeps what they said under Soma's own attributes (``_soma_retry``, ``_soma_time_limit``,
``_soma_concurrency``), as ``.on``/``.at`` keep theirs: a node of an HTTP or LLM client often
has a ``timeout`` or ``retries`` of its own, which Soma must not touch. ``Graph.node`` hands them
to the graph, which holds them per node (``Graph.retry``, ``Graph.time_limit``,
``Graph.concurrency``).
"""

from __future__ import annotations

import math
from typing import NamedTuple


class RetryPolicy(NamedTuple):
    """A node's retries: ``times`` more attempts after a failing one, the first after
    ``backoff`` seconds, each next pause twice the last (at most 128 s) and up to a quarter
    longer at random, only for exceptions of the types in ``on``."""

    times: int
    backoff: float
    on: tuple[type[BaseException], ...]


def checked_retry(
    times: object,
    backoff: object,
    on: type[BaseException] | tuple[type[BaseException], ...],
) -> RetryPolicy:
    """The retry ``.retry(times, backoff, on)`` asks for; a ``ValueError`` or ``TypeError``
    saying what is wrong otherwise."""
    if not isinstance(times, int) or isinstance(times, bool) or not 0 <= times < 2**32:
        raise ValueError(
            f"retry takes a number of retries, an int of at least 0, not {times!r}\n"
            "hint: `.retry(3)` makes up to 4 attempts"
        )
    if (
        not isinstance(backoff, (int, float))
        or isinstance(backoff, bool)
        or not math.isfinite(backoff)
        or backoff < 0
    ):
        raise ValueError(
            f"retry's backoff is a number of seconds, at least 0, not {backoff!r}\n"
            "hint: `.retry(3, backoff=0.5)` pauses 0.5 s, then 1 s, then 2 s"
        )
    classes = on if isinstance(on, tuple) else (on,)
    for caught in classes:
        if not (isinstance(caught, type) and issubclass(caught, BaseException)):
            raise TypeError(
                f"retry's `on` takes exception classes, not {caught!r}\n"
                "hint: `.retry(3, on=(ConnectionError, TimeoutError))`"
            )
    return RetryPolicy(times, float(backoff), classes)


def checked_time_limit(seconds: object) -> float:
    """The limit ``.time_limit(seconds)`` asks for; a ``ValueError`` otherwise."""
    if (
        not isinstance(seconds, (int, float))
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ValueError(
            f"time_limit takes a number of seconds above 0, not {seconds!r}\n"
            "hint: `.time_limit(2.5)` fails a call still running after 2.5 s"
        )
    return float(seconds)


def checked_concurrency(workers: object) -> int:
    """The items at once ``.concurrency(workers)`` asks for; a ``ValueError`` otherwise."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"concurrency takes an int of at least 1, not {workers!r}")
    return workers
