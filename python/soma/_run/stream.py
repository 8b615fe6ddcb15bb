"""Streams: ``Graph.map`` and ``Graph.forward(batch, micro_batches=k)``.

The engine (``soma._soma.StreamCore``, on ``soma_core::Stream``) runs the stages, keeps the
order and the bound, and reads the inputs lazily; this module says what comes out: results,
``(index, result)`` pairs, :class:`Failed` records or raised exceptions, as ``ordered`` and
``on_error`` ask, and draws progress. Micro-batches are a stream of slices of one batch, joined
back by type. A graph with async nodes streams through the engine's ``Flow`` instead
(``soma._soma.FlowCore``): each item a run of its own on the event loop Soma keeps, its core
answering as ``StreamCore`` does. Which of the two runs a stream is the core's route
(``GraphCore.route``), which refuses a graph with hosts.

A stream with a run id is held in a journal (``soma.journal``'s ``StreamRun``, a :class:`Held`)
from the call that makes it to its end: the stream tells it how it ended, makes it current while
items are read (each item runs in a copy of the context it was read in), and stops at an item
whose node asked a question, whatever ``on_error`` says.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import importlib
import sys
import time
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
    Sized,
)
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

from soma import _soma
from soma._build.policy import checked_concurrency

if TYPE_CHECKING:
    from types import TracebackType

    from soma.cache._cache import RunCacheSource

DEFAULT_IN_FLIGHT = 64
"""How many items a stream holds at once unless told otherwise."""

OnError = Literal["raise", "skip", "collect"]


# How often progress is reported while items come out, in seconds.
_PROGRESS_EVERY = 0.1


@dataclasses.dataclass(frozen=True)
class Failed:
    """An item that failed, in place of its result (``on_error="collect"``), or kept aside
    (``on_error="skip"``, in :attr:`Stream.failures`)."""

    index: int
    """Its position in the input, from 0."""
    input: Any
    """The input it was."""
    exception: BaseException
    """What was raised, as ``forward`` would raise it: its own type, traceback and note."""
    node: str | None
    """The node that raised it, when a node is to blame."""


@dataclasses.dataclass(frozen=True)
class StageFigures:
    """Where one stage's time went: a stage is a step of the plan's top-level sequence."""

    nodes: list[str]
    """Its nodes, in plan order."""
    workers: int
    """How many items it may work on at once."""
    items: int
    """Items it has passed on, failed ones included."""
    busy: float
    """Seconds its workers spent running items, summed over workers."""
    waiting: float
    """Seconds its workers spent idle with an item still to come from before them (the stages
    before, or the inputs being read), summed over workers."""
    blocked: float
    """Seconds its workers spent idle because what comes after held the stream back: every item
    in flight was past the stage and no input was being read, since the stream was at its
    ``in_flight`` bound or the consumer had not asked for the next result. Summed over
    workers."""


@dataclasses.dataclass(frozen=True)
class StreamFigures:
    """A stream's counters so far."""

    read: int
    """Inputs read."""
    succeeded: int
    """Results handed back."""
    failed: int
    """Failed items handed back (or kept aside)."""
    in_flight: int
    """Items read and not yet handed back."""
    waiting: float
    """Seconds the reader spent waiting for the next result."""
    stages: list[StageFigures]
    """Each stage, in plan order."""

    @property
    def bottleneck(self) -> str | None:
        """The busiest stage's nodes (busy time per worker), or ``None`` before any work."""
        busiest = max(self.stages, key=lambda s: s.busy / s.workers, default=None)
        if busiest is None or busiest.busy == 0:
            return None
        return ", ".join(busiest.nodes)


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a progress callable receives: counts, items per second, the bottleneck now."""

    read: int
    """Inputs read."""
    succeeded: int
    """Results handed back."""
    failed: int
    """Failed items handed back (or kept aside)."""
    in_flight: int
    """Items read and not yet handed back."""
    elapsed: float
    """Seconds since the stream started."""
    rate: float
    """Items handed back per second, since the stream started."""
    bottleneck: str | None
    """The busiest stage's nodes (busy time per worker), or ``None`` before any work."""
    done: bool
    """True once, for the last event of the stream."""


def _figures(raw: dict[str, Any]) -> StreamFigures:
    stages = [StageFigures(**stage) for stage in raw["stages"]]
    return StreamFigures(
        read=raw["read"],
        succeeded=raw["succeeded"],
        failed=raw["failed"],
        in_flight=raw["in_flight"],
        waiting=raw["waiting"],
        stages=stages,
    )


class _Line:
    """A progress line on stderr, for when tqdm is not installed."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, event: Progress) -> None:
        now = time.monotonic()
        if not event.done and now - self._last < 0.5:
            return
        self._last = now
        slowest = f", bottleneck `{event.bottleneck}`" if event.bottleneck else ""
        failed = f", {event.failed} failed" if event.failed else ""
        end = "\n" if event.done else ""
        sys.stderr.write(
            f"\r{event.succeeded + event.failed} items{failed}, {event.rate:.1f}/s{slowest}{end}"
        )
        sys.stderr.flush()


class _Bar:
    """A tqdm bar (``tqdm.auto``: a widget in a notebook)."""

    def __init__(self, tqdm: Any, total: int | None) -> None:
        self._bar = tqdm(total=total, unit="item")
        self._shown = 0

    def __call__(self, event: Progress) -> None:
        done = event.succeeded + event.failed
        self._bar.update(done - self._shown)
        self._shown = done
        if event.bottleneck:
            self._bar.set_postfix(bottleneck=event.bottleneck, refresh=False)
        if event.done:
            self._bar.close()


def _reporter(progress: bool | Callable[[Progress], object], inputs: object) -> Any:
    if progress is False:
        return None
    if progress is True:
        try:
            # Looked up at run time: tqdm is optional, and not a dependency of Soma.
            tqdm = importlib.import_module("tqdm.auto").tqdm
        except ImportError:
            return _Line()
        total = len(inputs) if isinstance(inputs, Sized) else None
        return _Bar(tqdm, total)
    if callable(progress):
        return progress
    raise TypeError(
        f"progress must be True, False or a callable, not {type(progress).__name__}\n"
        "hint: pass a function that takes a soma.Progress"
    )


class Held(Protocol):
    """What holds a stream's run in a journal while the stream goes (``soma.journal``'s
    ``StreamRun``), told by the stream: a lower stage's view of it, so that streams need not
    know the journal."""

    def entered(self) -> Any:
        """Makes the run current here while the stream reads items; a token for ``left``."""

    def left(self, token: Any) -> None:
        """Undoes ``entered``."""

    def pauses(self, exception: BaseException) -> bool:
        """Whether an item's ``exception`` is a node's question: the stream stops at it."""

    def ended(
        self, raised: BaseException | None, failed: int, first: Failed | None
    ) -> BaseException | None:
        """The stream ran out (``raised`` ``None``) with ``failed`` items failed, ``first``
        the first of them, or ``raised`` ended it: what to raise instead, if anything."""

    def closed(self) -> None:
        """The stream was closed, or dropped, before its end."""


class _Tally:
    """The items a stream's ``on_error`` let fail, for its run's end: how many, the first."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count = 0
        self.first: Failed | None = None


# What `_handed_back` answers for an item `on_error="skip"` leaves out.
_LEFT_OUT: Any = object()


def _handed_back(
    step: tuple[int, Any, Any],
    ordered: bool,
    on_error: OnError,
    failures: list[Failed],
    held: Held | None = None,
    tally: _Tally | None = None,
) -> Any:
    """What a stream (``map``'s or ``amap``'s) hands back for one item its core answered
    ``(index, value, failure)``: the result (``(index, result)`` unordered), or for a failure
    what ``on_error`` says: raised, a :class:`Failed` in its place, or kept in ``failures``
    and :data:`_LEFT_OUT`. A stream ``held`` in a journal raises a node's question whatever
    ``on_error`` says (it pauses the run), and counts the other failures in ``tally``."""
    index, value, failure = step
    if failure is None:
        return value if ordered else (index, value)
    exception, node, item = failure
    if on_error == "raise" or (held is not None and held.pauses(exception)):
        raise exception
    failed = Failed(index=index, input=item, exception=exception, node=node)
    if tally is not None:
        tally.count += 1
        tally.first = tally.first or failed
    if on_error == "skip":
        failures.append(failed)
        return _LEFT_OUT
    return failed if ordered else (index, failed)


def checked_on_error(on_error: object) -> OnError:
    """``on_error`` as a stream takes it; a ``ValueError`` saying what it takes otherwise."""
    if on_error not in ("raise", "skip", "collect"):
        raise ValueError(
            f"on_error must be 'raise', 'skip' or 'collect', not {on_error!r}\n"
            "hint: 'skip' leaves failed items out (kept in stream.failures); 'collect' yields a "
            "soma.Failed in their place"
        )
    return on_error


# Streams not closed yet: closed when the interpreter exits, before it finalizes. After that, a
# thread that asks for the GIL (a stage going back to its crew) is ended mid-stack by Python,
# which aborts the process through Rust's frames. Closed as a drop closes them: a node that
# does not return within a second (one waiting for an event that will not come) is left on its
# thread, rather than hold the exit forever.
_OPEN: weakref.WeakSet[Stream] = weakref.WeakSet()


@atexit.register
def _close_open_streams() -> None:
    for stream in list(_OPEN):
        # One being read by another thread right now refuses; nothing more can be done for it.
        with contextlib.suppress(RuntimeError):
            stream._core.abandon()


class Stream(Iterator[Any]):
    """The results of :meth:`soma.Graph.map`, as an iterator.

    Closing it — ``close()``, leaving a ``with`` block, ``break`` out of a ``for`` loop over it
    and dropping it, or the garbage collector — stops every stage before its next item and
    gives their threads back; the graph stays usable. ``close()`` waits for a node already
    running to return (Ctrl-C or the stream's ``timeout`` cuts the wait short); dropping the
    stream waits a second at most, then leaves such a node to finish on its thread.

    Made by ``Graph.map`` and ``Graph.amap``, not by hand: ``core`` is the engine's stream,
    ``ordered``, ``on_error`` and ``progress`` are what ``map`` was given, and ``held`` the run
    a journal holds for a stream with an id (``map(..., run=, journal=)``), ended with it.
    """

    def __init__(
        self,
        core: _soma.StreamCore | _soma.FlowCore,
        *,
        ordered: bool,
        on_error: OnError,
        progress: Any,
        held: Held | None = None,
    ) -> None:
        self._core = core
        self._ordered = ordered
        self._on_error = on_error
        self._progress = progress
        self._started = time.monotonic()
        self._reported = 0.0
        self._ended = False
        self._held = held
        self._tally = _Tally()
        self.failures: list[Failed] = []
        """With ``on_error="skip"``: every item that failed, in the order they came out."""
        _OPEN.add(self)
        if held is not None:
            # A stream dropped unclosed (or open at exit) ends its run too: the journal would
            # otherwise renew its hold for as long as the process lives.
            weakref.finalize(self, held.closed)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Any:
        held = self._held
        while True:
            token = None if held is None else held.entered()
            try:
                step = self._core.__next__()
                if step is None:
                    raise StopIteration
                out = _handed_back(
                    step, self._ordered, self._on_error, self.failures, held, self._tally
                )
            except StopIteration:
                self._end()
                if held is not None:
                    held.ended(None, self._tally.count, self._tally.first)
                raise
            except BaseException as raised:
                self._end()
                if held is None:
                    raise
                if held.pauses(raised):
                    # With `on_error` "skip" or "collect" the core goes on past a question.
                    self._core.close()
                instead = held.ended(raised, self._tally.count, self._tally.first)
                if instead is None:
                    raise
                raise instead from None
            finally:
                if held is not None:
                    held.left(token)
            self._report()
            if out is _LEFT_OUT:
                continue
            return out

    def figures(self) -> StreamFigures | None:
        """Counters so far: items read, handed back and failed, and each stage's busy, waiting
        and blocked time (``None`` while another thread is reading the stream)."""
        raw = self._core.figures()
        return None if raw is None else _figures(raw)

    def close(self) -> None:
        """Stops the stream; returns once every stage has stopped (a node already running
        finishes first, unless Ctrl-C or the stream's ``timeout`` cuts the wait short: such a
        node is left to finish on its thread). What was in flight is dropped."""
        self._core.close()
        self._end()
        if self._held is not None:
            self._held.closed()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _report(self) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        if now - self._reported < _PROGRESS_EVERY:
            return
        self._reported = now
        self._emit(done=False)

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._progress is not None:
            self._emit(done=True)

    def _emit(self, *, done: bool) -> None:
        figures = self.figures()
        if figures is None:
            return
        elapsed = time.monotonic() - self._started
        out = figures.succeeded + figures.failed
        self._progress(
            Progress(
                read=figures.read,
                succeeded=figures.succeeded,
                failed=figures.failed,
                in_flight=figures.in_flight,
                elapsed=elapsed,
                rate=out / elapsed if elapsed > 0 else 0.0,
                bottleneck=figures.bottleneck,
                done=done,
            )
        )


def concurrency_of(core: _soma.GraphCore, asked: Mapping[str, int] | None) -> list[tuple[str, int]]:
    """How many items each node of the graph of ``core`` works on at once in a stream: the
    graph's setting (``Graph.concurrency``), or what ``asked`` says for this stream, each id
    refused by the core as ``Graph.concurrency`` refuses it."""
    counts = list((asked or {}).items())
    for _, count in counts:
        checked_concurrency(count)
    return core.stream_concurrency(counts)


def stream_map(
    graph_core: _soma.GraphCore,
    route: Literal["stream", "flow"],
    inputs: Iterable[Any],
    *,
    in_flight: int,
    ordered: bool,
    on_error: OnError,
    concurrency: Mapping[str, int] | None,
    progress: bool | Callable[[Progress], object],
    driver: Any,
    turn_limit: int,
    trace: _soma.Trace | None,
    timeout: float | None,
    cache: RunCacheSource | None,
    held: Held | None = None,
) -> Stream:
    """``Graph.map`` of the graph of ``graph_core``, on the route the core chose for it: the
    engine's ``Stream``, or its ``Flow`` for a graph with async nodes: a graph without one never
    reaches an event loop. ``held``: the stream's run in a journal, with ``cache`` its
    recording."""
    checked_on_error(on_error)
    if not isinstance(in_flight, int) or isinstance(in_flight, bool) or in_flight < 1:
        raise ValueError(f"in_flight must be an int of at least 1, not {in_flight!r}")
    reporter = _reporter(progress, inputs)
    runner: type[_soma.StreamCore] | type[_soma.FlowCore]
    match route:
        case "stream":
            runner = _soma.StreamCore
        case "flow":
            runner = _soma.FlowCore
    counts = concurrency_of(graph_core, concurrency)
    # The items run in copies of the context the core is made in: a held run is current there.
    token = None if held is None else held.entered()
    try:
        core = runner(
            graph_core,
            inputs,
            in_flight,
            ordered,
            on_error == "raise",
            counts,
            driver,
            turn_limit,
            trace,
            timeout,
            cache=cache,
        )
    finally:
        if held is not None:
            held.left(token)
    return Stream(core, ordered=ordered, on_error=on_error, progress=reporter, held=held)


def split(batch: Any, pieces: int) -> list[Any]:
    """``batch`` cut along its first axis into at most ``pieces`` slices of near-equal length
    (the first ones one longer), by ``len`` and slicing: a list, a tuple, a numpy array, a torch
    tensor, anything that slices."""
    if not isinstance(pieces, int) or isinstance(pieces, bool) or pieces < 1:
        raise ValueError(f"micro_batches must be an int of at least 1, not {pieces!r}")
    try:
        length = len(batch)
        batch[0:0]
    except TypeError:
        raise TypeError(
            f"a batch of type `{type(batch).__name__}` cannot be split into micro-batches: it "
            "needs `len` and slicing\nhint: pass a list, tuple, array or tensor"
        ) from None
    pieces = min(pieces, length) or 1
    size, longer = divmod(length, pieces)
    slices = []
    start = 0
    for at in range(pieces):
        end = start + size + (1 if at < longer else 0)
        slices.append(batch[start:end])
        start = end
    return slices


def _module(value: object) -> str:
    return type(value).__module__.split(".")[0]


def join(outputs: Sequence[Any]) -> Any:
    """Micro-batch outputs joined back along the first axis, by their type: lists and tuples
    concatenated, numpy arrays and torch tensors concatenated by their own library (neither is
    imported here), pandas frames by ``pandas.concat``; a dict (a graph of several leaves) is
    joined leaf by leaf."""
    if not outputs:
        return []
    first = outputs[0]
    if isinstance(first, dict):
        return {key: _join_one([out[key] for out in outputs]) for key in first}
    return _join_one(outputs)


def _join_one(outputs: Sequence[Any]) -> Any:
    first = outputs[0]
    if isinstance(first, list):
        return [item for out in outputs for item in out]
    if isinstance(first, tuple):
        return tuple(item for out in outputs for item in out)
    library = _module(first)
    if library == "numpy":
        return sys.modules["numpy"].concatenate(outputs)
    if library == "torch":
        return sys.modules["torch"].cat(list(outputs))
    if library == "pandas":
        return sys.modules["pandas"].concat(list(outputs))
    raise TypeError(
        f"outputs of type `{type(first).__name__}` cannot be joined by type\n"
        "hint: pass join=, a function that takes the list of micro-batch outputs"
    )


def forward_in_micro_batches(
    core: _soma.GraphCore,
    route: Literal["stream", "flow"],
    batch: Any,
    micro_batches: int,
    join_with: Callable[[list[Any]], Any] | None,
    *,
    driver: Any,
    turn_limit: int,
    trace: _soma.Trace | None,
    timeout: float | None,
    cache: RunCacheSource | None = None,
) -> Any:
    """See :meth:`soma.Graph.forward`: the stream of ``route``, ``core``'s."""
    pieces = split(batch, micro_batches)
    outputs = list(
        stream_map(
            core,
            route,
            pieces,
            in_flight=len(pieces),
            ordered=True,
            on_error="raise",
            concurrency=None,
            progress=False,
            driver=driver,
            turn_limit=turn_limit,
            trace=trace,
            timeout=timeout,
            cache=cache,
        )
    )
    return (join_with or join)(outputs)


class AsyncStream(AsyncIterator[Any]):
    """The results of :meth:`soma.Graph.amap`, as an async iterator: what :class:`Stream` is
    to ``map``. Leaving early — ``break``, an error, a cancellation, ``aclose()`` — cancels the
    items in flight and waits for them to end.

    Made by ``Graph.amap``, not by hand: ``results`` is the generator of the results as they
    come, ``failures`` the list it puts each failed item in with ``on_error="skip"``, ``held``
    the run a journal holds for a stream with an id, ended with it, and ``tally`` what counts
    the items that failed, which that run's end reports.
    """

    def __init__(
        self,
        results: AsyncGenerator[Any, None],
        failures: list[Failed],
        held: Held | None = None,
        tally: _Tally | None = None,
    ) -> None:
        self._results = results
        self.failures = failures
        """With ``on_error="skip"``: every item that failed, in the order they came out."""
        self._held = held
        self._tally = tally or _Tally()
        if held is not None:
            # As `Stream`'s: dropped unclosed, its run ends too.
            weakref.finalize(self, held.closed)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        held = self._held
        if held is None:
            return await anext(self._results)
        token = held.entered()
        try:
            return await anext(self._results)
        except StopAsyncIteration:
            held.ended(None, self._tally.count, self._tally.first)
            raise
        except BaseException as raised:
            instead = held.ended(raised, self._tally.count, self._tally.first)
            if instead is None:
                raise
            raise instead from None
        finally:
            held.left(token)

    async def aclose(self) -> None:
        """Stops the stream: the items in flight cancelled, and waited for until they end."""
        await self._results.aclose()
        if self._held is not None:
            self._held.closed()


def stream_amap(
    core: _soma.GraphCore,
    inputs: Iterable[Any] | AsyncIterable[Any],
    *,
    in_flight: int,
    ordered: bool,
    on_error: OnError,
    concurrency: list[tuple[str, int]],
    driver: Any,
    turn_limit: int,
    trace: _soma.Trace | None,
    timeout: float | None,
    cache: RunCacheSource | None,
    held: Held | None = None,
) -> AsyncStream:
    """``Graph.amap``: the engine's ``Flow`` on the running loop, as ``map``'s is on the loop
    Soma keeps; this only reads the inputs — an async iterable among them, which only Python
    can read — while the flow has room, and hands the results back as ``map`` does (``ordered``,
    ``on_error``). An ordinary exception the inputs raise is the core's to hold, as ``map``'s
    core holds it: raised once the items read before it are out. Leaving early (an error, a
    ``break``, a cancellation) cancels the items in flight and waits for them to end.
    ``held``: the stream's run in a journal, with ``cache`` its recording."""
    # A stream's route, for its refusal of a graph with hosts, as `map`'s: either way each item
    # is a run on this loop.
    core.route(True)
    # As `stream_map`'s: a held run is current where the flow is made.
    token = None if held is None else held.entered()
    try:
        flow = _soma.FlowCore(
            core,
            None,
            in_flight,
            ordered,
            on_error == "raise",
            concurrency,
            driver,
            turn_limit,
            trace,
            timeout,
            cache=cache,
            on_running_loop=True,
        )
    finally:
        if held is not None:
            held.left(token)
    failures: list[Failed] = []
    tally = _Tally()
    return AsyncStream(
        _flowing(flow, inputs, ordered, on_error, failures, held, tally), failures, held, tally
    )


async def _flowing(
    flow: _soma.FlowCore,
    inputs: Iterable[Any] | AsyncIterable[Any],
    ordered: bool,
    on_error: OnError,
    failures: list[Failed],
    held: Held | None,
    tally: _Tally,
) -> AsyncGenerator[Any, None]:
    """The results of ``flow`` over ``inputs``, read on the running loop; the failures
    ``on_error="skip"`` leaves out kept in ``failures``; those of a stream ``held`` in a
    journal counted in ``tally``."""
    # Told apart once: an ABC's `isinstance` per item would cost what the rest of the read does.
    asynchronous = isinstance(inputs, AsyncIterable)
    source: Any = aiter(inputs) if isinstance(inputs, AsyncIterable) else iter(inputs)
    read_all = False
    finished = False
    try:
        while True:
            while not read_all and flow.has_room():
                try:
                    if asynchronous:
                        left = flow.time_left()
                        x = await (
                            anext(source) if left is None else asyncio.wait_for(anext(source), left)
                        )
                    else:
                        x = next(source)
                except (StopIteration, StopAsyncIteration):
                    read_all = True
                    break
                except TimeoutError:
                    raise flow.timed_out() from None
                except BaseException as raised:
                    # The core keeps an ordinary exception until the items before it are out,
                    # and hands back at once what stops a stream at once (Ctrl-C).
                    read_all = True
                    flow.inputs_raised(raised)
                    break
                flow.start(x)
            out = await flow.next(read_all)
            if out is None:
                finished = True
                return
            if out[2] is None:  # A result: the common case, without a call.
                yield out[1] if ordered else (out[0], out[1])
                continue
            handed = _handed_back(out, ordered, on_error, failures, held, tally)
            if handed is not _LEFT_OUT:
                yield handed
    finally:
        if not finished:
            await flow.stopped()
