"""What the browser's view knows of this process's runs: a listener of the engine's observer
(``soma._run.observe``) that keeps, per run, each node's state as the works of the run begin and
end, the spans of its timeline and what its nodes emit — all bounded.

Nothing here walks a graph or asks the engine anything: every state is one the observer told
(a call began, ended returned, failed with a retry to come, timed out...). The page reads these
records through :class:`RunSource`, a source of runs and of the changes to them, so that a
journal of runs recorded by other processes (the durable-runs issue) can be another source
beside this one.

What the observer does not tell, the records do not have: a node's output never crosses the
observer, so a node's record holds no output (its type and size are not known here); what a
node emits (``ctx.emit``) is kept as its type, its size and a short repr, never the value.

Memory stays bounded whatever a run does: each run keeps its last :data:`SPANS_KEPT` spans, its
last :data:`EMITS_KEPT` emitted values and a change log of :data:`CHANGES_KEPT` entries; the
recorder keeps every run in flight and the last finished ones, at most :data:`FINISHED_KEPT`
runs of at most :data:`FINISHED_NODES_KEPT` nodes in all (the oldest go first). A reader
that fell behind a log's window is told so and reads the whole state again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import itertools
import reprlib
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from typing import Any, Final, Generic, Protocol, TypeVar

from soma._run import observe as _observe
from soma.journal._active import ACTIVE as _journal_run
from soma.journal._calls import Asked

# How much each run keeps, and how many finished runs the recorder keeps (see the header).
SPANS_KEPT: Final = 10_000
EMITS_KEPT: Final = 200
CHANGES_KEPT: Final = 50_000
FINISHED_KEPT: Final = 200
FINISHED_NODES_KEPT: Final = 100_000
# A traceback's text and an error's one-line summary are cut at these lengths.
TRACEBACK_CHARS: Final = 20_000
SUMMARY_CHARS: Final = 300


class NodeState(enum.StrEnum):
    """A node's state in a run, as the observer told it."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CACHED = "cached"
    FAILED = "failed"
    RETRYING = "retrying"
    TIMED_OUT = "timed_out"
    # Ended unfinished: its run was stopped, or the work was dropped.
    STOPPED = "stopped"
    # It asked a question (`ctx.ask`) its run has no answer to yet.
    PAUSED = "paused"


class RunStatus(enum.StrEnum):
    """A run's status."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    # A node asked a question the run has no answer to yet: it waits in its journal.
    PAUSED = "paused"


# Each state's text, read without the enum's `value` property (on every node's way).
_TEXT: Final = {state: state.value for state in NodeState}

T = TypeVar("T")
# A span of a run's timeline: node, start, end (seconds since the run began), row, state,
# attempt.
Span = tuple[str, float, float, str | None, str, int]


class Ring(Generic[T]):
    """An append-only log that keeps its last ``kept`` entries, read from a position: each
    reader keeps where it is, so any number of readers read one log, and a writer never waits
    for them."""

    def __init__(self, kept: int) -> None:
        self._entries: deque[T] = deque(maxlen=kept)
        self._total = 0
        self._lock = threading.Lock()

    def append(self, entry: T) -> None:
        # acquire and release rather than `with`: this is on every node's way, twice.
        lock = self._lock
        lock.acquire()
        self._entries.append(entry)
        self._total += 1
        lock.release()

    @property
    def position(self) -> int:
        """Where a reader that has read everything so far is."""
        return self._total

    def since(self, position: int) -> tuple[list[T], int, bool]:
        """The entries from ``position`` on, the position after them, and whether entries
        between ``position`` and the first kept were lost (the reader fell behind)."""
        with self._lock:
            first = self._total - len(self._entries)
            lost = position < first
            start = max(position, first) - first
            return list(itertools.islice(self._entries, start, None)), self._total, lost


_short = reprlib.Repr()
_short.maxstring = 80
_short.maxother = 80
_short.maxlist = _short.maxtuple = _short.maxdict = _short.maxset = 6


def described(value: Any) -> dict[str, Any]:
    """What the page may show of a value: its type, its size when it has one (``len``, or
    ``nbytes`` for arrays and tensors), and a short repr, bounded (``reprlib``). The page
    escapes it."""
    size: int | None = None
    with contextlib.suppress(Exception):
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            size = nbytes
        elif hasattr(value, "__len__"):
            size = len(value)
    try:
        shown = _short.repr(value)
    except Exception as error:  # a user's __repr__ may raise: the page says so
        shown = f"<repr failed: {type(error).__name__}>"
    return {"type": type(value).__qualname__, "size": size, "repr": shown}


def summary(error: BaseException) -> str:
    """An error's first line, bounded: what a runs page's row shows."""
    try:
        text = str(error)
    except Exception:
        text = ""
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}"[:SUMMARY_CHARS]


def traceback_text(error: BaseException) -> str:
    """An error's traceback, notes included, bounded."""
    try:
        text = "".join(traceback.format_exception(error))
    except Exception:
        text = summary(error)
    return text[:TRACEBACK_CHARS]


class NodeRecord:
    """One node of one run (a step's inner node by its path, ``step/inner``)."""

    __slots__ = (
        "attempts",
        "device",
        "ended",
        "error",
        "host",
        "id",
        "parts_ended",
        "parts_open",
        "row",
        "seconds",
        "started",
        "state",
        "traceback",
    )

    def __init__(self, node_id: str) -> None:
        self.id = node_id
        self.state = NodeState.WAITING
        self.attempts = 0
        self.seconds: float | None = None
        self.started: float | None = None
        self.ended: float | None = None
        # Where it ran: the thread's name, or the async task's.
        self.row: str | None = None
        self.device: str | None = None
        # Set for a node a slice ran on another host (`adopt`); `None` here.
        self.host: str | None = None
        self.error: str | None = None
        self.traceback: str | None = None
        # For a step that decides: its parts (items, cases, iterations) in flight and ended.
        self.parts_open = 0
        self.parts_ended = 0

    def as_row(self) -> tuple[Any, ...]:
        """Its state as plain data, in the order of :data:`_FIELDS`: what a finished run keeps."""
        return (
            self.id,
            _TEXT[self.state],
            self.attempts,
            self.seconds,
            self.started,
            self.row,
            self.error,
            self.ended,
            self.device,
            self.host,
            self.traceback,
            (self.parts_ended + self.parts_open) or None,
        )

    def as_json(self, *, detail: bool = False) -> dict[str, Any]:
        return _shown(self.as_row(), detail)


# A node's fields as a page reads them: the first seven are what a page's stream sends of each
# node; the rest are asked for when a node is clicked.
_FIELDS: Final = (
    "id",
    "state",
    "attempts",
    "seconds",
    "started",
    "row",
    "error",
    "ended",
    "device",
    "host",
    "traceback",
    "parts",
)
_BRIEF: Final = 7


def _shown(row: tuple[Any, ...], detail: bool) -> dict[str, Any]:
    if not detail:
        return dict(zip(_FIELDS[:_BRIEF], row[:_BRIEF], strict=True))
    shown = dict(zip(_FIELDS, row, strict=True))
    # The observer does not see a node's output: nothing to show of it.
    shown["output"] = None
    return shown


class RunRecord:
    """One run of this process (a whole one, or a streamed item's), as its works were told."""

    def __init__(
        self,
        run_id: str,
        graph: Any,
        nodes: int,
        item: int | None,
        asynchronous: bool,
        parent: str | None,
    ) -> None:
        self.id = run_id
        # The run's graph (`_soma.GraphCore`), whose plan the page draws; `None` if not told.
        self.graph = graph
        self.total = nodes
        self.item = item
        self.asynchronous = asynchronous
        self.parent = parent
        self.status = RunStatus.RUNNING
        self.started_at = time.time()
        self.clock = time.perf_counter()
        self.seconds: float | None = None
        self.error: str | None = None
        self.traceback: str | None = None
        # Each node's record while the run goes; once it has ended, each node's state as plain
        # data (`frozen`), which the garbage collector need not walk: a process keeps many
        # finished runs, and thousands of live records would slow every collection.
        self.nodes: dict[str, NodeRecord] = {}
        self.frozen: dict[str, tuple[Any, ...]] | None = None
        # Top-level nodes done (finished or cached): the "done of total" of the runs page.
        self.done = 0
        self.lock = threading.Lock()
        # Which nodes began or changed otherwise than by ending a call, in order; the spans
        # ended (each a node's change too); what was emitted, and how much.
        self.changes: Ring[str] = Ring(CHANGES_KEPT)
        # Each span (node, start, end, row, state, attempt): a tuple, as thousands are kept.
        self.spans: Ring[Span] = Ring(SPANS_KEPT)
        self.emits: Ring[dict[str, Any]] = Ring(EMITS_KEPT)
        self._label: str | None = None
        # The id of the run in its journal, for a run with one (`forward(run=, journal=)`).
        self.journal_run: str | None = None

    def freeze(self) -> None:
        """Keeps each node's state as plain data, once the run has ended."""
        self.frozen = {node.id: node.as_row() for node in list(self.nodes.values())}
        self.nodes = {}

    def node_json(self, node_id: str, *, detail: bool = False) -> dict[str, Any] | None:
        """A node's state as the page reads it; ``None`` for one not begun."""
        if self.frozen is not None:
            row = self.frozen.get(node_id)
            return None if row is None else _shown(row, detail)
        node = self.nodes.get(node_id)
        return None if node is None else node.as_json(detail=detail)

    def nodes_json(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """Every begun node's state."""
        ids = list(self.frozen if self.frozen is not None else self.nodes)
        return [shown for shown in map(self._shown(detail), ids) if shown is not None]

    def _shown(self, detail: bool) -> Any:
        return lambda node_id: self.node_json(node_id, detail=detail)

    def kept_nodes(self) -> int:
        return len(self.frozen if self.frozen is not None else self.nodes)

    def now(self) -> float:
        """Seconds since the run began."""
        return time.perf_counter() - self.clock

    def node(self, node_id: str) -> NodeRecord:
        found = self.nodes.get(node_id)
        if found is None:
            found = self.nodes.setdefault(node_id, NodeRecord(node_id))
        return found

    @property
    def label(self) -> str:
        """The graph, as a row names it: its first root and last leaf."""
        if self._label is None:
            label = "?"
            with contextlib.suppress(Exception):
                roots, leaves = self.graph.roots(), self.graph.leaves()
                if roots and leaves:
                    label = roots[0] if roots == leaves else f"{roots[0]} → {leaves[-1]}"
            self._label = f"{label} ({self.total} nodes)"
        return self._label

    def elapsed(self) -> float:
        return self.seconds if self.seconds is not None else self.now()

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "graph": self.label,
            "status": self.status.value,
            "started": self.started_at,
            "seconds": self.elapsed(),
            "done": self.done,
            "total": self.total,
            "error": self.error,
            "item": self.item,
            "parent": self.parent,
            "emitted": self.emits.position,
        }


def span_json(span: Span) -> dict[str, Any]:
    node, start, end, row, state, attempt = span
    return {
        "node": node,
        "start": start,
        "end": end,
        "row": row,
        "state": state,
        "attempt": attempt,
    }


class RunSource(Protocol):
    """Where the page reads runs from: this process's recorder, and later a journal of runs
    recorded by any process (the durable-runs issue), behind the same three reads."""

    def runs(self) -> list[RunRecord]:
        """Every run it has, newest first."""
        ...

    def run(self, run_id: str) -> RunRecord | None: ...

    @property
    def changes(self) -> Ring[str]:
        """The ids of runs as they begin and end (a page reads the rows of running runs at
        every tick: their times and counts move on)."""
        ...


# The run the current work is part of: set where a run begins, in the context its branches,
# items and async tasks copy, as `soma._run.observe` sets a stream's.
_current_run: contextvars.ContextVar[RunRecord | None] = contextvars.ContextVar(
    "soma_view_run", default=None
)

perf_counter = time.perf_counter

# The states that count as done in a run's "done of total".
_DONE: Final = frozenset({NodeState.FINISHED, NodeState.CACHED})


def _paused(error: BaseException | None) -> bool:
    """Whether ``error`` is a node's question (``ctx.ask``), which pauses its run."""
    return isinstance(error, Asked) or (
        isinstance(error, BaseExceptionGroup)
        and all(isinstance(inner, Asked) for inner in error.exceptions)
    )


def _become(run: RunRecord, node: NodeRecord, state: NodeState) -> None:
    """Sets ``node``'s state, keeping the run's count of top-level nodes done."""
    if "/" in node.id or (state in _DONE) == (node.state in _DONE):
        node.state = state
        return
    with run.lock:
        # Branches end on their own threads: the count is read and written under the lock.
        run.done += (state in _DONE) - (node.state in _DONE)
        node.state = state


# What `begin` hands `end`, by the work's kind.
_RUN, _CALL, _PART = range(3)


# Each thread's name, read once per thread: a thread is lent to many nodes.
_thread = threading.local()


def _row(awaited: bool) -> str:
    """Where a work runs, as the timeline's rows name it: the async task, or the thread."""
    if awaited:
        with contextlib.suppress(RuntimeError):
            task = asyncio.current_task()
            if task is not None:
                return f"task {task.get_name()}"
    try:
        name: str = _thread.name
    except AttributeError:
        name = _thread.name = threading.current_thread().name
    return name


class Recorder:
    """The listener a view installs (``soma._run.observe.set_watcher``): a record per run of
    this process, kept as the observer tells each work."""

    def __init__(self) -> None:
        self._runs: dict[str, RunRecord] = {}
        self._finished: deque[str] = deque()
        self._finished_nodes = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._changes: Ring[str] = Ring(CHANGES_KEPT)

    # The source the page reads.

    def runs(self) -> list[RunRecord]:
        with self._lock:
            return list(reversed(self._runs.values()))

    def run(self, run_id: str) -> RunRecord | None:
        return self._runs.get(run_id)

    @property
    def changes(self) -> Ring[str]:
        return self._changes

    # The observer's listener.

    def begin(self, work: _observe.Work) -> Any:
        kind = work[0]
        if kind == _observe.RUN:
            parent = _current_run.get()
            begun = RunRecord(
                str(next(self._ids)),
                work[7],
                work[3],
                work[2],
                work[6],
                None if parent is None else parent.id,
            )
            journaled = _journal_run.get()
            if journaled is not None:
                begun.journal_run = journaled.name
            with self._lock:
                self._runs[begun.id] = begun
            self._changes.append(begun.id)
            return (_RUN, begun, _current_run.set(begun))
        run = _current_run.get()
        node_id = work[1]
        if run is None or node_id is None:
            return None
        node = run.node(node_id)
        if kind == _observe.CALL:
            call = _observe.current_call.get()
            if call is not None:  # Where an emit from a thread the node starts finds the run.
                call.watcher_run = run
            if node.state in _DONE:  # run again: a loop's next iteration
                _become(run, node, NodeState.RUNNING)
            else:
                node.state = NodeState.RUNNING
            node.attempts = work[3] + 1
            node.device = work[4]
            node.row = _row(work[6])
            node.started = started = perf_counter() - run.clock
            run.changes.append(node_id)
            return (_CALL, run, node, started)
        if kind == _observe.CACHED:
            _become(run, node, NodeState.CACHED)
            node.device = work[4]
            node.seconds = 0.0
            run.changes.append(node_id)
            return None
        # A part of a step that decides: the step runs while any part is in flight.
        node.parts_open += 1
        if node.state is not NodeState.FAILED:
            _become(run, node, NodeState.RUNNING)
        if node.started is None:
            node.started = run.now()
        run.changes.append(node_id)
        return (_PART, run, node, node.started)

    def end(
        self, opened: Any, outcome: int, error: BaseException | None, retry_in: float | None
    ) -> None:
        kind = opened[0]
        if kind == _RUN:
            self._run_ended(opened[1], opened[2], outcome, error)
        elif kind == _CALL:
            self._call_ended(opened[1], opened[2], opened[3], outcome, error, retry_in)
        else:
            self._part_ended(opened[1], opened[2], outcome, error)

    def _run_ended(
        self, run: RunRecord, token: Any, outcome: int, error: BaseException | None
    ) -> None:
        with contextlib.suppress(ValueError):
            # A streamed item ends on another thread, outside the context it began in.
            _current_run.reset(token)
        run.seconds = run.now()
        if outcome == _observe.RETURNED:
            run.status = RunStatus.FINISHED
        elif _paused(error):
            run.status = RunStatus.PAUSED
        elif outcome in (_observe.FAILED, _observe.TIMED_OUT):
            run.status = RunStatus.FAILED
        else:
            run.status = RunStatus.STOPPED
        if error is not None:
            run.error = summary(error)
            run.traceback = traceback_text(error)
        with self._lock:
            self._finished.append(run.id)
            run.freeze()
            self._finished_nodes += run.kept_nodes()
            while len(self._finished) > 1 and (
                len(self._finished) > FINISHED_KEPT or self._finished_nodes > FINISHED_NODES_KEPT
            ):
                dropped = self._runs.pop(self._finished.popleft(), None)
                if dropped is not None:
                    self._finished_nodes -= dropped.kept_nodes()
        self._changes.append(run.id)

    def _call_ended(
        self,
        run: RunRecord,
        node: NodeRecord,
        started: float,
        outcome: int,
        error: BaseException | None,
        retry_in: float | None,
    ) -> None:
        ended = perf_counter() - run.clock
        node.ended, node.seconds = ended, ended - started
        if outcome == _observe.RETURNED:
            _become(run, node, NodeState.FINISHED)
        elif outcome in (_observe.FAILED, _observe.TIMED_OUT):
            from soma.errors import TimeLimitError

            if retry_in is not None:
                _become(run, node, NodeState.RETRYING)
            elif _paused(error):
                _become(run, node, NodeState.PAUSED)
            elif outcome == _observe.TIMED_OUT or isinstance(error, TimeLimitError):
                _become(run, node, NodeState.TIMED_OUT)
            else:
                _become(run, node, NodeState.FAILED)
            if error is not None:
                node.error = summary(error)
                node.traceback = traceback_text(error)
        else:
            _become(run, node, NodeState.STOPPED)
        # The span tells the node's change too: a reader takes changed nodes from both logs.
        span = (node.id, started, ended, node.row, _TEXT[node.state], node.attempts - 1)
        run.spans.append(span)

    def _part_ended(
        self, run: RunRecord, node: NodeRecord, outcome: int, error: BaseException | None
    ) -> None:
        node.parts_open -= 1
        node.parts_ended += 1
        if outcome in (_observe.FAILED, _observe.TIMED_OUT):
            _become(run, node, NodeState.FAILED)
            if error is not None and node.error is None:
                node.error = summary(error)
                node.traceback = traceback_text(error)
        elif outcome == _observe.STOPPED and node.state is NodeState.RUNNING:
            _become(run, node, NodeState.STOPPED)
        elif node.parts_open == 0 and node.state is NodeState.RUNNING:
            # No part in flight: the step is done, until a part begins again (an `each` with
            # `in_flight` between its items, a `loop`'s next iteration).
            _become(run, node, NodeState.FINISHED)
        node.ended = run.now()
        node.seconds = node.ended - (node.started or 0.0)
        run.changes.append(node.id)

    def emit(self, node: str, value: Any, watched: _observe.Watched) -> None:
        """What a node emitted, in the run ``watched`` was begun in: from a thread the node
        started too, where the run is not current."""
        run = _current_run.get() or watched.watcher_run
        if run is None:
            return
        shown = described(value)
        shown["node"] = node
        shown["at"] = run.now()
        run.emits.append(shown)

    def emitted_late(self, node: str) -> None:
        """An emit after its call returned: the view shows what came while the node ran."""

    def span_of(self, opened: Any) -> Any:
        """The view keeps no span of its own."""
        return None

    def adopt(self, spans: list[Any], host: str, sent_ns: int) -> None:
        """The nodes a slice ran on ``host``: each finished (or failed) there."""
        run = _current_run.get()
        if run is None:
            return
        for node_id, start, end, _thread, _branch, _turns, error, device, cached in spans:
            node = run.node(node_id)
            node.host, node.device = host, device
            node.seconds = end - start
            if error is not None:
                _become(run, node, NodeState.FAILED)
                node.error = str(error)[:SUMMARY_CHARS]
            else:
                _become(run, node, NodeState.CACHED if cached else NodeState.FINISHED)
            run.changes.append(node_id)


def walk_plan_nodes(plan: Any) -> Iterator[str]:
    """The ids of the nodes a plan runs, steps' inner nodes included: a walk with a stack of
    its own, as deep as the plan nests."""
    stack = [plan]
    while stack:
        step = stack.pop()
        if step.node is not None:
            yield step.node
        stack.extend(reversed(step.children))
