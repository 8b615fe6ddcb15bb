"""What a run tells as it goes, in Python: the engine's observer (``soma_core::Observer``)
calls :meth:`Dispatch.begin` and :meth:`Dispatch.end` for each work — an attempt of a node's
call, a node answered by the cache, an ``each`` item, a ``switch`` case, a ``loop`` iteration,
a run, whole or a streamed item's — where the work runs and in its context; this module hands
each to what listens: OpenTelemetry (``soma.telemetry``), the event streams of ``Graph.events``
and the browser's view of this process's runs (``soma.view``).

The rules — what is told, when, on which thread, in which order — are the engine's. Here is
only what only Python can do: make a span current in a context, put an event where a reader
waits. The dispatch is installed in the engine (``_soma.observe``) only while something
listens, so a process that uses neither pays nothing; while the view alone listens, the engine
calls the view's recorder itself (``set_watcher``), and each run keeps a board of its nodes'
states (``_soma.Board``) that the recorder reads in bulk, so that a node's call makes no call
into Python for the view unless it fails.

Which event stream a work belongs to is read from a context variable the stream's run is
started in: every branch, item and async task of a run runs in a copy of its caller's context,
so the run's works all find their stream, and no other run's do.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import Any, Protocol

from soma import _soma

# What begins (the engine glue's numbers): a node's call (one attempt), a node the cache
# answered, an `each` item, a `switch` case, a `loop` iteration, a run (whole, or a stream's item).
CALL, CACHED, ITEM, CASE, ITERATION, RUN = range(6)
# How it ended: returned, failed, stopped without an outcome of its own, or failed for time
# running out (its time limit, the run's deadline: the engine's `RunError::timed_out`).
RETURNED, FAILED, STOPPED, TIMED_OUT = range(4)


class Pausing(BaseException):
    """What unwinds a node that waits for something no run here can give it — a person's
    answer (the journal's ``ctx.ask``): its call ends, and so does its run, paused rather than
    failed. A ``BaseException``, so that no ``except Exception`` in the node keeps it. Defined
    here, where a work's end is told, so that a listener tells a pause from a failure without
    knowing the journal: ``question`` is what the node waits for."""

    question: object = None


class PausedRun:
    """Mixed into what a run raises as it ends paused (the journal's ``soma.Paused``), so that
    a listener tells a run that paused from one that failed without knowing the journal."""


def pausing(error: BaseException | None) -> Pausing | None:
    """The pause ``error`` stands for — itself, or one a group holds (a ``TaskGroup`` in an
    async node gathers what its tasks raised) when everything it holds pauses — or ``None``."""
    if isinstance(error, Pausing):
        return error
    if not isinstance(error, BaseExceptionGroup):
        return None
    first: Pausing | None = None
    stack: list[BaseException] = [error]
    while stack:  # Without recursion: a group nests as deep as the user's code nests it.
        inner = stack.pop()
        if isinstance(inner, BaseExceptionGroup):
            stack.extend(reversed(inner.exceptions))
        elif isinstance(inner, Pausing):
            first = first or inner
        else:
            return None
    return first


# A work as the engine tells it: what begins (`kind`), the node (or the step, for a part; `None`
# for a run), the part (an item's index, a case's key, an iteration; a streamed item's index for
# a run; for a call told only as it failed, which a run's board keeps, when it began), a number
# (the attempt of a call, the node count of a run), the device, the branch (the index in each
# wave), whether it is async, and what the work runs: a call's
# `module.Class.forward`, a run's graph (`_soma.GraphCore`, whose plan a watcher draws).
Work = tuple[int, str | None, Any, int, str | None, tuple[int, ...], bool, Any]


class Listener(Protocol):
    """What the dispatch hands each work to: OpenTelemetry's mapping, or an event stream."""

    def begin(self, work: Work) -> Any: ...

    def end(
        self, opened: Any, outcome: int, error: BaseException | None, retry_in: float | None
    ) -> None: ...

    def emit(self, node: str, value: Any, watched: Watched) -> None:
        """What a node sent with ``ctx.emit(value)``, in its call ``watched``, while it ran."""

    def emitted_late(self, node: str) -> None:
        """A node sent a value after its call returned: nothing shows it."""

    def adopt(self, spans: list[Any], host: str, sent_ns: int) -> None:
        """The nodes a slice ran on ``host``, once it is back (see :func:`adopt`)."""

    def span_of(self, opened: Any) -> Any:
        """The span of a call ``begin`` opened (``opened``, what it returned), for the call's
        emits; ``None`` for a listener without spans."""


# The event stream the current run reports to, if it was started by `Graph.events`.
current_stream: contextvars.ContextVar[Listener | None] = contextvars.ContextVar(
    "soma_event_stream", default=None
)
# Nodes of the current run that stand for nothing the user wrote, not told of: a graph with
# hosts runs a local graph where each node a slice returns is picked out of the slice's
# returns by a node of the same id (`soma.remote`), which would otherwise be told twice.
hidden: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "soma_hidden_nodes", default=frozenset()
)
# The index of the `each` item or streamed item the current work is in, for events' `.item`.
current_item: contextvars.ContextVar[int | None] = contextvars.ContextVar("soma_item", default=None)


class Watched:
    """What watches one node call, fixed where the call begins: its event stream, its item, the
    telemetry and the call's span, the view and its record of the call's run. The call's ``ctx``
    carries it, so that ``ctx.emit`` from a thread the node started — where none of the call's
    context is — reaches what the call's own thread would. ``returned`` once the call has: an
    emit after it is counted as dropped."""

    __slots__ = ("item", "returned", "span", "stream", "telemetry", "watcher", "watcher_run")

    def __init__(
        self,
        stream: Listener | None,
        item: int | None,
        telemetry: Listener | None,
        watcher: Listener | None,
    ) -> None:
        self.stream = stream
        self.item = item
        self.telemetry = telemetry
        self.watcher = watcher
        # Set by the telemetry's `begin` for the call: its span.
        self.span: Any = None
        # Set by the view's `begin` for the call: its record of the call's run.
        self.watcher_run: Any = None
        self.returned = False


# The run the current work is part of, as the view knows it: its record
# (`soma.view.record.RunRecord`), set where a run begins, in the context its branches, items
# and async tasks copy — or, for a run that keeps a board, its board (`_soma.Board`), set by
# the glue, which tells the view nothing else as the run begins.
current_run: contextvars.ContextVar[Any] = contextvars.ContextVar("soma_view_run", default=None)


def board_watched(board: _soma.Board) -> Watched:
    """What watches the calls of a run that keeps ``board``, for what its nodes emit: made by
    the glue the first time a node of the run takes a ``ctx`` (a run that keeps a board tells
    the view nothing as it begins, so no call of it has a :class:`Watched` of its own)."""
    watched = Watched(None, None, None, dispatch.watcher)
    # The board's number, not the board, which keeps what it makes: a cycle through the board
    # would never be collected.
    watched.watcher_run = board.number
    return watched


# What watches the node call going on here, if anything does: read by the glue when it makes the
# call's `ctx` (`_soma`'s `observer::watched`).
current_call: contextvars.ContextVar[Watched | None] = contextvars.ContextVar(
    "soma_call", default=None
)


class Dispatch:
    """The one object the engine calls: each work to the telemetry, when it is on, to the
    view (``soma.view``), when one is open, and to the event stream of the run it is part of,
    when it has one."""

    def __init__(self) -> None:
        self.telemetry: Listener | None = None
        self.watcher: Listener | None = None
        # What the engine calls instead of the dispatch while the watcher alone listens.
        self.watcher_alone: Any = None
        self.streams = 0

    def begin(self, *work: Any) -> Any:
        """A work begins: ``work`` is what the engine tells of it (see :data:`Work`)."""
        kind, node, part = work[0], work[1], work[2]
        telemetry, watcher, stream = self.telemetry, self.watcher, current_stream.get()
        if kind == CALL and node in hidden.get():
            return None
        item = None
        if kind == ITEM or (kind == RUN and part is not None):
            item = current_item.set(part)
        call = None
        if kind == CALL:
            watched = Watched(stream, current_item.get(), telemetry, watcher)
            call = (watched, current_call.set(watched))
        opened_telemetry = None if telemetry is None else telemetry.begin(work)
        opened_watcher = None if watcher is None else watcher.begin(work)
        opened_stream = None if stream is None else stream.begin(work)
        if call is not None and telemetry is not None:
            call[0].span = telemetry.span_of(opened_telemetry)
        if (
            item is None
            and call is None
            and opened_telemetry is None
            and opened_watcher is None
            and opened_stream is None
        ):
            return None
        return (
            item,
            call,
            telemetry,
            opened_telemetry,
            watcher,
            opened_watcher,
            stream,
            opened_stream,
        )

    def end(
        self, opened: Any, outcome: int, error: BaseException | None, retry_in: float | None
    ) -> None:
        item, call, telemetry, opened_telemetry, watcher, opened_watcher, stream, opened_stream = (
            opened
        )
        try:
            if call is not None:
                # Before the call's own end is told: an emit from now on is late.
                call[0].returned = True
                with contextlib.suppress(ValueError):  # Ended where it did not begin.
                    current_call.reset(call[1])
            if stream is not None and opened_stream is not None:
                stream.end(opened_stream, outcome, error, retry_in)
            if watcher is not None and opened_watcher is not None:
                watcher.end(opened_watcher, outcome, error, retry_in)
            if telemetry is not None and opened_telemetry is not None:
                telemetry.end(opened_telemetry, outcome, error, retry_in)
        finally:
            if item is not None:
                # A streamed item ends on whichever thread finishes it, outside the context it
                # began in; that context goes with the item, so nothing is left set there.
                with contextlib.suppress(ValueError):
                    current_item.reset(item)


dispatch = Dispatch()
_installing = threading.Lock()


def _reinstall() -> None:
    """Installs the dispatch in the engine while anything listens, and removes it otherwise;
    while the view alone listens, what it gave to be called instead (its recorder, which
    then pays no dispatch on each node's way)."""
    if dispatch.telemetry is not None or dispatch.streams:
        _soma.observe(dispatch)
    elif dispatch.watcher_alone is not None:
        # The view alone: each run keeps a board its recorder reads, and is told the recorder
        # only what a board does not hold.
        _soma.observe(dispatch.watcher_alone, boards=dispatch.watcher_alone.kept)
    elif dispatch.watcher is not None:
        _soma.observe(dispatch)
    else:
        _soma.observe(None)


def set_telemetry(listener: Listener | None) -> None:
    """Makes ``listener`` the telemetry every run from now on reports to (``None``: none)."""
    with _installing:
        dispatch.telemetry = listener
        _reinstall()


def set_watcher(listener: Listener | None) -> None:
    """Makes ``listener`` the view every run from now on reports to (``None``: none). Its
    ``alone`` attribute, when it has one, is what the engine calls in the dispatch's stead
    while nothing else listens: the dispatch's own ``begin(*work)`` and ``end(opened, outcome,
    error, retry_in)``, which then also sets :data:`current_call` where each run begins."""
    with _installing:
        dispatch.watcher = listener
        dispatch.watcher_alone = getattr(listener, "alone", None)
        _reinstall()


def stream_opened() -> None:
    """An event stream begins: runs from now on report their works."""
    with _installing:
        dispatch.streams += 1
        _reinstall()


def stream_closed() -> None:
    """An event stream has ended."""
    with _installing:
        dispatch.streams -= 1
        _reinstall()


def watched() -> bool:
    """Whether a run started here now is watched: the telemetry is on, a view is open, or it
    is part of an event stream. A run with hosts then asks its hosts for their nodes' spans (see
    :func:`adopt`)."""
    return (
        dispatch.telemetry is not None
        or dispatch.watcher is not None
        or current_stream.get() is not None
    )


def adopt(spans: list[Any], host: str, sent_ns: int) -> None:
    """Tells what listens of the nodes a slice ran on ``host``, from the spans the host
    shipped back with its result (``soma.remote._slices.Shipped``: node, start, end, thread, branch,
    turns, error, device, cached; times in seconds since the slice began there, which is taken
    as ``sent_ns``, this process's clock when the slice was sent). Told once the slice is back:
    a host runs a slice as one call, and tells nothing before it returns."""
    for listener in (dispatch.telemetry, dispatch.watcher, current_stream.get()):
        if listener is not None:
            listener.adopt(spans, host, sent_ns)


def emitted(node: str, value: Any, watched: Watched) -> None:
    """What ``ctx.emit(value)`` does, from whichever thread, in the call ``watched``: hands
    ``value`` to the event stream of the run the node is in, if it has one, and to the telemetry
    as an event on the call's span, when it was on as the call began. After the call returned,
    the stream counts it as dropped (in its last event's ``dropped``) and the telemetry, whose
    span has ended, leaves it."""
    stream, telemetry = watched.stream, watched.telemetry
    if watched.returned:
        if stream is not None:
            stream.emitted_late(node)
        return
    if stream is not None:
        stream.emit(node, value, watched)
    if telemetry is not None:
        telemetry.emit(node, value, watched)
    if watched.watcher is not None:
        watched.watcher.emit(node, value, watched)


def run_in_stream(stream: Listener, run: Callable[[], Any]) -> Any:
    """Runs ``run`` in a copy of this context in which works report to ``stream``."""
    context = contextvars.copy_context()
    context.run(current_stream.set, stream)
    return context.run(run)
