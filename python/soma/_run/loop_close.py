"""``soma.on_loop_close``: what a client bound to an event loop needs to be closed on it.

An aiohttp session, an httpx client, an OpenAI client: each is bound to the loop it was made on,
and must be closed by awaiting its ``close()`` there. One made inside an async node that
``forward`` or ``map`` runs lives on the loop Soma keeps (``soma._run.loop``), which no user code
ends, so nothing could close it, and the interpreter said "Unclosed client session" at exit.

A loop says it is closing the one way asyncio has: whoever closes it first finalizes the async
generators still open on it (``loop.shutdown_asyncgens()``; ``asyncio.run`` does, as it ends).
So the closers registered on a loop are held by one async generator of that loop, suspended
until then, whose ``finally`` runs them there, newest first. The loop Soma keeps is closed that
way at the interpreter's exit, before it finalizes: the same hook, and the same order, for the
loop ``asyncio.run`` made and the loop Soma keeps.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable

from soma._run import loop as _loop

Closer = Callable[[], Awaitable[object] | object]

# How long the exit waits for the kept loop's closers, in seconds: a closer that never returns
# (a server that does not answer a goodbye) leaves the exit at most this late.
EXIT_GRACE = 5.0


class _Closers:
    """The closers of one loop, and the suspended generator whose ``finally`` runs them."""

    __slots__ = ("closers", "keeper")

    def __init__(self) -> None:
        self.closers: list[Closer] = []
        self.keeper: AsyncGenerator[None, None] | None = None


# By loop: a loop collected takes its closers with it (they ran as it closed, or never will).
_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Closers] = (
    weakref.WeakKeyDictionary()
)


async def on_loop_close(close: Closer) -> None:
    """Runs ``close()`` — a coroutine function, such as a client's ``close``, or a plain
    function — on the running event loop as that loop closes: as ``asyncio.run`` ends, or, for
    the loop ``forward``, ``map`` and ``forward(micro_batches=)`` run async nodes on, at the
    interpreter's exit. The closers of one loop run newest first; one that raises is reported
    to the loop's exception handler and the others still run.

    Meant for what is bound to a loop and made inside an async node: make one per loop, and
    register its close the first time::

        sessions = weakref.WeakKeyDictionary()

        async def session():
            loop = asyncio.get_running_loop()
            if loop not in sessions:
                sessions[loop] = aiohttp.ClientSession()
                await soma.on_loop_close(sessions[loop].close)
            return sessions[loop]
    """
    loop = asyncio.get_running_loop()
    kept = _BY_LOOP.get(loop)
    if kept is None:
        kept = _BY_LOOP[loop] = _Closers()
    kept.closers.append(close)
    if kept.keeper is None:
        # Its first step registers it with the loop (asyncio's first-iteration hook) and
        # suspends it inside its `try`, where the loop's shutdown finds it.
        kept.keeper = _keeper(kept.closers)
        await anext(kept.keeper)


async def _keeper(closers: list[Closer]) -> AsyncGenerator[None, None]:
    """Suspended until the loop finalizes it, then runs ``closers`` on it, newest first."""
    try:
        yield
    finally:
        loop = asyncio.get_running_loop()
        while closers:
            close = closers.pop()
            try:
                done = close()
                if inspect.isawaitable(done):
                    await done
            except Exception as failure:  # The user's closer: reported, the others still run.
                loop.call_exception_handler(
                    {"message": f"soma.on_loop_close: {close!r} raised", "exception": failure}
                )


@atexit.register
def _close_the_kept_loop() -> None:
    """At exit, before the interpreter finalizes: the kept loop's closers run on it (its async
    generators are finalized, as ``asyncio.run`` finalizes its loop's), for ``EXIT_GRACE``
    seconds at most. The loop itself runs on, for what else may still use it."""
    held = _loop._KEPT
    if held is None or held[0] != os.getpid():  # None made, or the parent's, inherited by fork.
        return
    kept = held[1]
    if kept not in _BY_LOOP or kept.is_closed():
        return
    finalized = asyncio.run_coroutine_threadsafe(kept.shutdown_asyncgens(), kept)
    try:
        finalized.result(EXIT_GRACE)
    except TimeoutError:
        finalized.cancel()
