"""``Graph.events`` and ``Graph.aevents``: a run's events as they happen — a node started,
finished, failed, retried, timed out, paused for an answer, what a node sends with
``ctx.emit(value)`` — then its result, its pause or its error, last; a run with a journal taken
up where it was left begins with ``"resumed"``.

A stream is told each work by the engine's observer (``soma._run.observe``), on the thread or in
the task that does it, so the events of one branch come in the order the branch made them, and
branches interleave as they ran. The reader never holds the run up: events wait for it in a
buffer of ``buffer`` events (10,000 unless set); once the buffer is full, newer events are
dropped and counted — the last event (``"result"`` or ``"error"``) is never dropped, and its
``dropped`` says how many were. A stream's results are never dropped: at most
:data:`RESULTS_WAITING` wait, and past that the stream waits for the reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from soma._run import observe as _observe
from soma._run.stream import AsyncStream

if TYPE_CHECKING:
    from soma._run.stream import Stream

DEFAULT_BUFFER: Final = 10_000


class Event:
    """One thing that happened in a run, as it happened.

    ``kind`` is ``"started"``, ``"finished"``, ``"failed"``, ``"retried"``, ``"timed_out"``,
    ``"paused"`` or ``"emitted"``, and last ``"result"``, ``"paused"`` or ``"error"``; a run
    with a journal taken up where it was left begins with ``"resumed"``. ``node`` is the
    node's id (a step's inner nodes by their path, ``"step/inner"``), ``None`` for the first
    and the last event. ``item`` is the index of the ``each`` item or streamed item the node
    ran in, or ``None``. ``value`` is what was emitted, the node's exception (``"failed"``,
    ``"retried"``, ``"timed_out"``), the question a node asked (``"paused"``), the run's
    result, its :class:`soma.Paused` (the last ``"paused"``) or its exception, the run's id
    (``"resumed"``); ``None`` otherwise. ``seconds`` is how long the attempt took
    (``"finished"`` and the failures), ``attempt`` which attempt it was (from 0), ``cached``
    whether the cache answered (``"finished"``), ``dropped`` how many events the buffer
    dropped before this one (set on the last event).
    """

    __slots__ = ("attempt", "cached", "dropped", "item", "kind", "node", "seconds", "value")

    kind: str
    node: str | None
    item: int | None
    value: Any
    seconds: float | None
    attempt: int
    cached: bool
    dropped: int

    def __init__(
        self,
        kind: str,
        node: str | None = None,
        item: int | None = None,
        value: Any = None,
        *,
        seconds: float | None = None,
        attempt: int = 0,
        cached: bool = False,
        dropped: int = 0,
    ) -> None:
        self.kind = kind
        self.node = node
        self.item = item
        self.value = value
        self.seconds = seconds
        self.attempt = attempt
        self.cached = cached
        self.dropped = dropped

    def __repr__(self) -> str:
        shown = [repr(self.kind)]
        if self.node is not None:
            shown.append(f"node={self.node!r}")
        if self.item is not None:
            shown.append(f"item={self.item}")
        if self.value is not None:
            shown.append(f"value={self.value!r}")
        return f"Event({', '.join(shown)})"


class _Collector:
    """Turns the works a run tells of into events, and hands each to ``put``."""

    def __init__(self, put: Callable[[Event], bool]) -> None:
        self._put = put
        self.dropped = 0

    def _send(self, event: Event) -> None:
        if not self._put(event):
            self.dropped += 1

    def last(self, kind: str, value: Any, item: int | None = None) -> Event:
        """A result or an error, which is never dropped: it carries the count of the events
        that were."""
        return Event(kind, item=item, value=value, dropped=self.dropped)

    def begin(self, work: _observe.Work) -> Any:
        kind, node, number = work[0], work[1], work[3]
        if kind == _observe.CALL:
            self._send(Event("started", node, _observe.current_item.get(), attempt=number))
            return (node, number, time.perf_counter())
        if kind == _observe.CACHED:
            self._send(
                Event("finished", node, _observe.current_item.get(), cached=True, seconds=0.0)
            )
        return None

    def end(
        self, opened: Any, outcome: int, error: BaseException | None, retry_in: float | None
    ) -> None:
        node, attempt, started = opened
        seconds = time.perf_counter() - started
        item = _observe.current_item.get()
        if outcome == _observe.RETURNED:
            self._send(Event("finished", node, item, seconds=seconds, attempt=attempt))
        elif outcome == _observe.FAILED and (asked := _observe.pausing(error)) is not None:
            # A question (`ctx.ask` with no answer yet): the node's call ends, and its run
            # pauses, rather than fail.
            self._send(
                Event("paused", node, item, asked.question, seconds=seconds, attempt=attempt)
            )
        elif outcome in (_observe.FAILED, _observe.TIMED_OUT):
            kind = (
                "retried"
                if retry_in is not None
                else "timed_out"
                if outcome == _observe.TIMED_OUT
                else "failed"
            )
            self._send(Event(kind, node, item, error, seconds=seconds, attempt=attempt))

    def emit(self, node: str, value: Any, watched: _observe.Watched) -> None:
        self._send(Event("emitted", node, watched.item, value))

    def emitted_late(self, node: str) -> None:
        self.dropped += 1

    def span_of(self, opened: Any) -> Any:
        return None

    def adopt(self, spans: list[Any], host: str, sent_ns: int) -> None:
        """The nodes a slice ran on ``host``, once it is back: each ``"finished"`` (or
        ``"failed"``, its error's text as the value), in the order they began there."""
        item = _observe.current_item.get()
        for node, start, end, _thread, _branch, _turns, error, _device, cached in sorted(
            spans, key=lambda span: span[1]
        ):
            kind = "failed" if error is not None else "finished"
            self._send(Event(kind, node, item, error, seconds=end - start, cached=cached))


def resumed(run: str) -> None:
    """Run ``run``, with a journal, is taken up where it was left (``soma.journal``): the
    event stream the current call reports to, if any, begins with ``"resumed"``."""
    stream = _observe.current_stream.get()
    if isinstance(stream, _Collector):
        stream._send(Event("resumed", value=run))


def _last(error: BaseException) -> str:
    """The kind of the last event of a run that raised ``error``: ``"paused"`` for a run that
    paused for answers (``soma.Paused``), ``"error"`` otherwise."""
    return "paused" if isinstance(error, _observe.PausedRun) else "error"


# What a run hands the reader besides the works' events: its results and its error, which are
# never dropped, each carrying the count of the events dropped so far; then the end. Handing one
# over says whether the reader is still there.
Finish = Callable[[Event], bool]
AsyncFinish = Callable[[Event], Awaitable[bool]]
_END: Final = Event("end")
# The kinds of the events handed over by `finish`, with no node: a result, and the last event.
_HANDED_OVER: Final = ("result", "error", "paused")

# How many results wait for the reader at most: past that, a stream's next result waits for the
# reader to take one, as `map` waits for its reader (and the stream stops taking items once its
# own bound is in flight), so that a slow reader costs no more memory than `map` would.
RESULTS_WAITING: Final = 64


def events(
    forward: Callable[..., Any], input: Any, buffer: int, keywords: dict[str, Any]
) -> Iterator[Event]:
    """``Graph.events``: ``forward(input, **keywords)`` on a thread of its own while the caller
    reads its events; the last its result or its error."""

    def work(collector: _Collector, finish: Finish) -> None:
        try:
            result = forward(input, **keywords)
        except BaseException as error:  # The run's error is the stream's last event.
            finish(collector.last(_last(error), error))
        else:
            finish(collector.last("result", result))

    return _read(work, buffer)


def map_events(
    map: Callable[..., Stream], inputs: Any, buffer: int, keywords: dict[str, Any]
) -> Iterator[Event]:
    """``Graph.map_events``: ``map(inputs, **keywords)`` on a thread of its own while the caller
    reads its events; each item's result as a ``"result"`` event with its index, an error
    (the first failing item's, or the stream's own) as the last event."""

    def work(collector: _Collector, finish: Finish) -> None:
        index = 0
        try:
            # Closed when this ends: a reader that left early stops the stream.
            with contextlib.closing(map(inputs, **keywords)) as results:
                for result in results:
                    if not finish(collector.last("result", result, index)):
                        return
                    index += 1
        except BaseException as error:  # The stream's error is its last event.
            finish(collector.last(_last(error), error, index))

    return _read(work, buffer)


def _read(work: Callable[[_Collector, Finish], None], buffer: int) -> Iterator[Event]:
    """Runs ``work`` on a thread of its own, in a context whose runs report to a stream, and
    yields what it reports until it is done."""
    _check_buffer(buffer)
    inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
    closed = threading.Event()
    results_room = threading.Semaphore(RESULTS_WAITING)

    def finish(event: Event) -> bool:
        # Wakes now and then to see whether the reader left: a work never waits for it then.
        while not results_room.acquire(timeout=0.05):
            if closed.is_set():
                return False
        inbox.put(event)
        return not closed.is_set()

    def put(event: Event) -> bool:
        # No lock: the count is the queue's own, read as the event is put. Two branches that
        # put at once may both see room for one, so the bound holds within the branches in
        # flight; a lock here would hold every branch up behind the one that holds it.
        if inbox.qsize() >= buffer or closed.is_set():
            return False
        inbox.put(event)
        return True

    collector = _Collector(put)

    def run() -> None:
        try:
            work(collector, finish)
        finally:
            inbox.put(_END)
            _observe.stream_closed()

    _observe.stream_opened()
    runner = threading.Thread(
        target=_observe.run_in_stream, args=(collector, run), name="soma-events", daemon=True
    )
    try:
        runner.start()
    except BaseException:
        _observe.stream_closed()
        raise
    try:
        while True:
            try:
                event = inbox.get_nowait()
            except queue.Empty:
                try:
                    # Wakes now and then, so that Ctrl-C reaches a reader that waits.
                    event = inbox.get(timeout=0.05)
                except queue.Empty:
                    continue
            if event is _END:
                return
            if event.node is None and event.kind in _HANDED_OVER:
                results_room.release()
            yield event
    finally:
        # A reader that left early (a `break`, an exception, Ctrl-C) leaves a run to finish on
        # its thread, what it still tells dropped, and stops a stream at its next result.
        closed.set()


async def aevents(
    aforward: Callable[..., Any], input: Any, buffer: int, keywords: dict[str, Any]
) -> AsyncIterator[Event]:
    """``Graph.aevents``: awaits ``aforward(input, **keywords)`` as a task of this loop while
    the caller reads its events."""

    async def work(collector: _Collector, finish: AsyncFinish) -> None:
        try:
            result = await aforward(input, **keywords)
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # The run's error is the stream's last event.
            await finish(collector.last(_last(error), error))
        else:
            await finish(collector.last("result", result))

    async for event in _aread(work, buffer):
        yield event


async def amap_events(
    amap: Callable[..., AsyncStream],
    inputs: Any,
    buffer: int,
    keywords: dict[str, Any],
) -> AsyncIterator[Event]:
    """``Graph.amap_events``: ``async for`` over ``amap(inputs, **keywords)`` as a task of this
    loop while the caller reads its events, as :func:`map_events`."""

    async def work(collector: _Collector, finish: AsyncFinish) -> None:
        index = 0
        try:
            # Closed when this ends: leaving early, or a cancellation, stops the stream.
            async with contextlib.aclosing(amap(inputs, **keywords)) as results:
                async for result in results:
                    await finish(collector.last("result", result, index))
                    index += 1
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # The stream's error is its last event.
            await finish(collector.last(_last(error), error, index))

    async for event in _aread(work, buffer):
        yield event


async def _aread(
    work: Callable[[_Collector, AsyncFinish], Awaitable[None]], buffer: int
) -> AsyncIterator[Event]:
    """Runs ``work`` as a task of this loop, in a context whose runs report to a stream, and
    yields what it reports until it is done; leaving early cancels it."""
    _check_buffer(buffer)
    loop = asyncio.get_running_loop()
    # The events wait in a queue any thread puts into at once, counted as `_read`'s are: a sync
    # node on a lent thread puts there itself rather than ask the loop to (a callback per event
    # would wait in the loop's own queue, uncounted, while the reader holds the loop).
    inbox: queue.SimpleQueue[Event] = queue.SimpleQueue()
    # Set on the loop when the reader may go on; `asleep` says the reader waits for it, so a
    # thread asks the loop to set it once per wait rather than once per event.
    arrived = asyncio.Event()
    asleep = False

    def wake() -> None:
        nonlocal asleep
        if not asleep:
            return
        asleep = False
        # The loop may be closed already, after a reader that left: nothing waits then.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(arrived.set)

    def put(event: Event) -> bool:
        # As `_read`'s: the queue's own count, read without a lock.
        if inbox.qsize() >= buffer:
            return False
        inbox.put(event)
        wake()
        return True

    collector = _Collector(put)
    results_room = asyncio.Semaphore(RESULTS_WAITING)

    async def finish(event: Event) -> bool:
        await results_room.acquire()
        inbox.put(event)
        wake()
        return True

    async def run() -> None:
        try:
            await work(collector, finish)
        finally:
            # After every event a sync node put from its thread: it put them before it returned.
            inbox.put(_END)
            wake()

    async def next_event() -> Event:
        nonlocal asleep
        while True:
            try:
                return inbox.get_nowait()
            except queue.Empty:
                pass
            # Asleep before the queue is looked at again: an event put after that look wakes it.
            arrived.clear()
            asleep = True
            try:
                return inbox.get_nowait()
            except queue.Empty:
                await arrived.wait()

    _observe.stream_opened()
    try:
        task = _observe.run_in_stream(collector, lambda: loop.create_task(run()))
        try:
            while True:
                event = await next_event()
                if event is _END:
                    return
                if event.node is None and event.kind in _HANDED_OVER:
                    results_room.release()
                yield event
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        _observe.stream_closed()


def _check_buffer(buffer: int) -> None:
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise ValueError(f"buffer takes an int of at least 1, not {buffer!r}")
