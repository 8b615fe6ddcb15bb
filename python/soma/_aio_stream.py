"""``g.map`` and ``forward(batch, micro_batches=k)`` of a graph with async nodes: each item run
as ``aforward`` runs it, as a task on the event loop Soma keeps (``_aio.kept_loop``), while the
thread that iterates reads the inputs and waits for the results.

:class:`LoopStreamCore` answers what ``soma._stream.Stream`` asks of the engine's
``StreamCore`` — the next ``(index, value, failure)``, ``close``, ``abandon``, ``figures`` — so
a stream of a graph with async nodes comes out exactly as one of sync nodes does: in order or
not, failures raised, collected or skipped, progress drawn. The engine's stream cuts the plan into
stages on threads; here an async node waits on the loop without a thread, so an item is one task
walking the whole plan, and the items in flight overlap there (``amap``'s limits: each node on as
many items at once as its concurrency allows).

What runs on the loop is held by :class:`_Flight`, never by the core: the tasks' callbacks keep
it alive, so a stream dropped with items in flight is still collected, and its drop cancels
them. A Ctrl-C anywhere in ``__next__`` ends the stream the same way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from soma import _aio, _soma

if TYPE_CHECKING:
    from soma._cache import Cache

#: Seconds a stream past its deadline, or interrupted, waits for its cancelled items to end.
_GRACE = 0.05

#: The note ``forward`` adds to a node's exception, which names the node.
_NOTE = re.compile(r"raised in soma node `(.+)`")


class _Item:
    """An item in flight: where it was read, what it was, its result to come."""

    __slots__ = ("done", "index", "input")

    def __init__(self, index: int, input: Any) -> None:
        self.index = index
        self.input = input
        self.done: concurrent.futures.Future[Any] = concurrent.futures.Future()


class LoopStreamCore:
    """A stream of a graph with async nodes, with the interface of ``_soma.StreamCore``."""

    def __init__(
        self,
        graph: _aio.Graph,
        inputs: Iterable[Any],
        in_flight: int,
        ordered: bool,
        stop_on_error: bool,
        concurrency: Mapping[str, int] | None,
        driver: Any,
        turn_limit: int,
        trace: _soma.Trace | None,
        timeout: float | None,
        cache: Cache | None,
    ) -> None:
        self._ended = True  # Until it has started: a refused stream has nothing to end.
        _aio.refuse_inside_loop(graph, "map")
        self._timeout = _aio.checked_timeout(timeout)
        # From this call, as the engine's stream counts it.
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._graph = graph
        prepared = graph._prepared()
        limits = _aio.limits_for(graph, prepared, concurrency)
        self._loop = _aio.kept_loop()
        self._flight = _Flight(graph, prepared, limits, (driver, turn_limit, trace, cache))
        self._inputs: Iterator[Any] | None = iter(inputs)
        self._in_flight = in_flight
        self._ordered = ordered
        self._stop_on_error = stop_on_error
        self._pending: deque[_Item] = deque()
        self._reading = threading.Lock()
        self._read = self._succeeded = self._failed = 0
        self._waiting = 0.0
        self._ended = False

    # -- the caller's side -------------------------------------------------------------------

    def __next__(self) -> tuple[int, Any, tuple[BaseException, str | None, Any] | None] | None:
        if not self._reading.acquire(blocking=False):
            raise RuntimeError("this stream is being read by another thread")
        try:
            return self._next()
        finally:
            self._reading.release()

    def _next(self) -> tuple[int, Any, tuple[BaseException, str | None, Any] | None] | None:
        if self._ended:
            return None
        _aio.refuse_inside_loop(self._graph, "a stream")
        try:
            return self._step()
        except BaseException:  # The inputs raised, a deadline passed, Ctrl-C: the stream ends.
            self._stop(_GRACE)
            raise

    def _step(self) -> tuple[int, Any, tuple[BaseException, str | None, Any] | None] | None:
        self._check_deadline()
        self._fill()
        if not self._pending:
            self._end()
            return None
        item = self._wait()
        # Cancelled: by a node, as no item left in the stream is cancelled by the stream.
        failure = asyncio.CancelledError() if item.done.cancelled() else item.done.exception()
        if failure is None:
            self._succeeded += 1
            return (item.index, item.done.result(), None)
        self._failed += 1
        if self._stop_on_error:
            self._stop(_GRACE)
        return (item.index, None, (failure, _node_of(failure), item.input))

    def _fill(self) -> None:
        """Reads inputs, on this thread, until ``in_flight`` items are in flight."""
        inputs = self._inputs
        while inputs is not None and len(self._pending) < self._in_flight:
            try:
                x = next(inputs)
            except StopIteration:
                self._inputs = inputs = None
                break
            item = _Item(self._read, x)
            self._read += 1
            self._pending.append(item)
            # Each item in a copy of the caller's context of its own, copied when it is read.
            self._loop.call_soon_threadsafe(
                self._flight.launch, item, context=contextvars.copy_context()
            )

    def _wait(self) -> _Item:
        """The next item to come out: the first in order, or the first done."""
        pending = self._pending
        waits = [pending[0].done] if self._ordered else [item.done for item in pending]
        began = time.monotonic()
        left = None if self._deadline is None else max(self._deadline - began, 0.0)
        try:
            concurrent.futures.wait(
                waits, timeout=left, return_when=concurrent.futures.FIRST_COMPLETED
            )
        finally:
            self._waiting += time.monotonic() - began
        self._check_deadline()
        if self._ordered:
            return pending.popleft()
        item = next(item for item in pending if item.done.done())
        pending.remove(item)
        return item

    def _check_deadline(self) -> None:
        """Past the deadline, even with results ready: the items in flight cancelled, and the
        stream over with a :class:`TimeoutError` naming the nodes that were running."""
        if self._deadline is None or time.monotonic() <= self._deadline:
            return
        assert self._timeout is not None
        late = self._stop(_GRACE)
        raise _aio.stream_timed_out(self._timeout, late)

    def close(self) -> None:
        """Cancels what is in flight and waits for it to end."""
        self._stop(None)

    def abandon(self) -> None:
        """Cancels what is in flight, without waiting."""
        self._stop(0.0)

    def figures(self) -> dict[str, Any] | None:
        if self._reading.locked():
            return None
        return {
            "read": self._read,
            "succeeded": self._succeeded,
            "failed": self._failed,
            "in_flight": len(self._pending),
            "waiting": self._waiting,
            "stages": [],
        }

    def __del__(self) -> None:
        """Dropped unfinished: its items in flight cancelled, and given a moment to end (none
        when dropped on the loop's own thread, which they need)."""
        if self._ended:
            return
        on_loop = threading.get_ident() == self._flight.thread
        self._stop(0.0 if on_loop else _GRACE)

    def _end(self) -> None:
        self._ended = True
        self._inputs = None
        self._pending.clear()

    def _stop(self, wait: float | None) -> list[str]:
        """Ends the stream: its items in flight cancelled on the loop; waits ``wait`` seconds at
        most (``None``: until they have ended) for them; the nodes that were running."""
        if self._ended:
            return []
        self._end()
        late: concurrent.futures.Future[list[str]] = concurrent.futures.Future()
        ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        try:
            self._loop.call_soon_threadsafe(self._flight.cancel, late, ended)
        except RuntimeError:  # The loop is closed: nothing runs on it any more.
            return []
        if wait == 0:  # Abandoned, maybe by the collector on the loop's own thread.
            return []
        try:
            names = late.result(timeout=None if wait is None else max(wait, _GRACE))
            concurrent.futures.wait([ended], timeout=wait)
        except concurrent.futures.TimeoutError:
            return []
        return names


class _Flight:
    """A stream's items in flight on the loop: launched, settled and cancelled there, on the
    loop's thread only."""

    def __init__(
        self,
        graph: _aio.Graph,
        prepared: _aio.Prepared,
        limits: dict[int, asyncio.Semaphore],
        run: tuple[Any, int, _soma.Trace | None, Cache | None],
    ) -> None:
        self.graph = graph
        self.prepared = prepared
        self.limits = limits
        self.run = run
        self.tasks: set[asyncio.Task[Any]] = set()
        self.running: dict[str, int] = {}
        self.stopped = False
        #: The loop's thread, once it has launched an item.
        self.thread: int | None = None

    def launch(self, item: _Item) -> None:
        self.thread = threading.get_ident()
        if self.stopped:
            item.done.cancel()
            return
        driver, turn_limit, trace, cache = self.run
        try:
            task = _aio.start(
                self.graph,
                item.input,
                driver=driver,
                turn_limit=turn_limit,
                trace=trace,
                timeout=None,
                limits=self.limits,
                prepared=self.prepared,
                cache=cache,
                running=self.running,
            )
        except BaseException as failure:
            item.done.set_exception(failure)
            return
        self.tasks.add(task)
        task.add_done_callback(lambda task: self.settle(task, item))

    def settle(self, task: asyncio.Task[Any], item: _Item) -> None:
        self.tasks.discard(task)
        if item.done.done():
            return
        if task.cancelled():
            item.done.cancel()
        elif (failure := task.exception()) is not None:
            item.done.set_exception(failure)
        else:
            item.done.set_result(task.result())

    def cancel(
        self, late: concurrent.futures.Future[list[str]], ended: concurrent.futures.Future[None]
    ) -> None:
        """Cancels every item in flight, and every one launched from now on; ``late``: the
        nodes that were running; ``ended``: set once the cancelled items have ended."""
        self.stopped = True
        late.set_result(list(self.running))
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            ended.set_result(None)
            return
        left = [len(tasks)]

        def one_ended(_: asyncio.Task[Any]) -> None:
            left[0] -= 1
            if not left[0]:
                ended.set_result(None)

        for task in tasks:
            task.add_done_callback(one_ended)


def _node_of(failure: BaseException) -> str | None:
    """The node ``failure`` was raised in, from the note ``forward`` adds to it."""
    for note in reversed(getattr(failure, "__notes__", ())):
        named = _NOTE.fullmatch(note) if isinstance(note, str) else None
        if named is not None:
            return named.group(1)
    return None
