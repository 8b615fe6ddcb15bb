"""The event loop's side of a run with async nodes, which only Python can provide: the future a
task of Soma's waits on, and the loop ``forward`` runs async nodes on.

The engine walks every run itself (``soma._soma`` drives its tasks, ``crates/soma-python/src/
aio.rs``); nothing here knows a plan. A task of Soma's is an asyncio task driving one of the
engine's, through a ``_soma.Stepper``: a coroutine in all but type, registered as one below so
that ``asyncio.create_task``, ``asyncio.run`` and ``asyncio.gather`` take it.

``forward`` of a graph with async nodes runs them on one event loop Soma keeps for the process,
on a daemon thread of its own started on first use (again in a child made by ``fork``, which
inherits the loop but not its thread): one loop, so that what async clients keep between calls
(connection pools) survives from one ``forward`` to the next. Nothing a node raises reaches
the loop itself: a node's ``KeyboardInterrupt`` or ``SystemExit`` is its run's outcome, raised
by ``forward`` in the calling thread, and the loop runs on for the next run. A task a node
starts is the loop's, not the run's: one that raises ``KeyboardInterrupt`` or ``SystemExit``
ends ``run_forever`` as asyncio has it, which the kept loop's thread hands to the loop's
exception handler, and runs the loop on (``keep_running``), so that no node can stop it.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import os
import threading

from soma import _soma

collections.abc.Coroutine.register(_soma.Stepper)


class Wait(asyncio.Future[None]):
    """What a task of Soma's awaits while the engine waits on something that is not an async
    node's call (sync work on a crew thread, its branches, a retry's pause); the engine's waker
    sets its result, from whichever thread, through the loop.

    It refuses to be cancelled: cancelling the task that awaits it ends the wait at once (its
    result is set, so the task steps), and the task's own cancellation is then thrown into the
    stepper, which tells the engine. The engine decides what a cancelled wait means — sync work
    on a thread is waited out at its next node boundary, branches are cancelled in turn — so a
    task never ends while work it lent still runs."""

    __slots__ = ()

    def cancel(self, msg: object = None) -> bool:
        if not self.done():
            self.set_result(None)
        return False


class Started:
    """A run handed to the kept loop, as the calling thread holds it: to cancel it from that
    thread (Ctrl-C, its deadline, its stop flag).

    The caller holds it before the run is handed over (``begin``): a Ctrl-C lands in whatever
    Python the calling thread runs, the handing over among it, and a ``KeyboardInterrupt``
    raised there may come after the run was handed to the loop. Held, the run is still the
    caller's to cancel; lost, it would wait on the loop forever."""

    __slots__ = ("_cancelled", "_lock", "_loop", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False

    def begin(self, stepper: _soma.Stepper) -> None:
        """Hands ``stepper`` to the loop, to run as a task in a copy of the calling thread's
        context."""
        self._loop.call_soon_threadsafe(self._create, stepper, context=contextvars.copy_context())

    def _create(self, stepper: _soma.Stepper) -> None:
        with self._lock:
            if self._cancelled:  # Given up before it began: it never begins.
                return
            self._task = self._loop.create_task(stepper)

    def cancel(self) -> None:
        """Cancels the run's task on the loop, from any thread."""
        with self._lock:
            self._cancelled = True
            task = self._task
        if task is not None:
            # A closed loop refuses: nothing of the run is left to cancel.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(task.cancel)


_KEPT: tuple[int, asyncio.AbstractEventLoop] | None = None
_KEPT_LOCK = threading.Lock()


def kept_loop() -> asyncio.AbstractEventLoop:
    """The event loop Soma keeps for ``forward`` of graphs with async nodes: one per process,
    running on a daemon thread started on first use."""
    global _KEPT
    kept = _KEPT
    if kept is not None and kept[0] == os.getpid():
        return kept[1]
    with _KEPT_LOCK:
        if _KEPT is None or _KEPT[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=keep_running, args=(loop,), name="soma-event-loop", daemon=True
            ).start()
            _KEPT = (os.getpid(), loop)
        return _KEPT[1]


def keep_running(loop: asyncio.AbstractEventLoop) -> None:
    """Runs ``loop`` for good, on the kept loop's thread. A ``KeyboardInterrupt`` or
    ``SystemExit`` raised in a task a node started comes out of ``run_forever`` (asyncio lets
    them through its callbacks); a node may stop the loop (``loop.stop()``). Neither ends what
    every later run of the process needs: the exception goes to the loop's exception handler
    (which logs it), as one a callback raises does, and the loop runs on, the task that raised
    it done with it."""
    while not loop.is_closed():
        try:
            loop.run_forever()
        except (KeyboardInterrupt, SystemExit) as raised:
            loop.call_exception_handler(
                {
                    "message": f"a task on Soma's event loop raised {type(raised).__name__}; "
                    "the loop runs on (it is no program's main loop to stop)",
                    "exception": raised,
                }
            )


def set_unless_done(future: asyncio.Future[None]) -> None:
    """Sets ``future``'s result unless it is done: a timer's wake-up of a waiter that may have
    been woken already."""
    if not future.done():
        future.set_result(None)
