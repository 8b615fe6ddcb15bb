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

A run pays as little as can be. A run of ``forward`` or ``aforward``, and each item's run of a
``map``, keeps its nodes' states on a board the engine writes (``_soma.Board``): its nodes'
calls tell Python nothing, unless they fail (for the error's traceback, which only Python has)
or are awaited (for the async task's name), and neither does the run as it begins and ends: its
board, with what the run told, waits in the glue's ledger (``_soma.boarded_runs``) until a
reader takes it, and the run's record is made then (for a run that had ended, only once a reader
asks for it). The board is read in bulk, the records changed since the last read, by whoever
reads the run. Every other work (an ``amap`` item's run and its calls, a step's part) appends
one entry to its run's log, and the nodes' records are made from the log (folded) by whoever
reads the run — the server, a report — on the reader's thread, once for many works; nothing is
folded for a run nobody reads until its log passes :data:`LOG_FOLDED` entries. A board's times
are marks of a coarse clock (``soma_core::RESOLUTION``, a millisecond): a node's seconds are
right to within it, and a node that lasted a tick or more never reads shorter than it was,
however late a busy machine makes the tick (its end is read from the clock itself).

Memory stays bounded whatever a run does: each run keeps its last :data:`SPANS_KEPT` spans, its
last :data:`EMITS_KEPT` emitted values, a change log of :data:`CHANGES_KEPT` entries and a log
of at most :data:`LOG_FOLDED` works not yet folded; the recorder keeps every run in flight and
the last finished ones, at most :data:`FINISHED_KEPT` runs of at most
:data:`FINISHED_NODES_KEPT` nodes or works not yet folded in all (the oldest go first). A
reader that fell behind a log's window is told so and reads the whole state again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import reprlib
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from typing import Any, Final, Generic, Protocol, TypeVar

from soma import _soma
from soma._run import observe as _observe
from soma.journal._active import ACTIVE as _journal_run

# How much each run keeps, and how many finished runs the recorder keeps (see the header).
SPANS_KEPT: Final = 10_000
EMITS_KEPT: Final = 200
CHANGES_KEPT: Final = 50_000
FINISHED_KEPT: Final = 200
FINISHED_NODES_KEPT: Final = 100_000
# A run's log of works told is folded into its nodes' records by whoever reads the run; past
# this many entries, by the run itself (a run nobody reads keeps no more).
LOG_FOLDED: Final = 50_000
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
    # Past its deadline (`forward(timeout=)`), or failed for a node's time limit.
    TIMED_OUT = "timed_out"
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


# A run's log entry, as the run's threads append it (see `Recorder.began`): one list a work,
# which a call's or a part's end fills in and appends again, folded into the nodes' records by
# whoever reads the run next (`RunRecord.fold`). Its fields, by index:
(
    _RUN_OF,
    _STAGE,
    _KIND,
    _NODE,
    _NUMBER,
    _DEVICE,
    _ROW,
    _STARTED,
    _ENDED,
    _OUTCOME,
    _ERROR,
    _RETRY,
) = range(12)
# The labels of the programs last labelled, by program (`RunRecord.label`), each with a board of
# the program, which keeps it alive; at most LABELS_KEPT.
LABELS_KEPT: Final = 8
_LABELS: dict[int, tuple[Any, str]] = {}
# A board's state names, as the view's states.
_BOARD_STATES: Final = {state.value: state for state in NodeState}
# The states of a call that failed, which a failure told through the log may refine (a
# question paused it; its run's deadline passed).
_FAILURES: Final = frozenset({NodeState.FAILED, NodeState.TIMED_OUT, NodeState.RETRYING})
# How far an entry is folded (`_STAGE`): not yet, its beginning, all of it.
_NEW, _BEGUN, _FOLDED = range(3)
# What a run's log holds last: the run ended; what comes after it (the end of a call the run
# left running) is not told.
_RUN_ENDED: Final = object()


class RunRecord:
    """One run of this process (a whole one, or a streamed item's), as its works were told.

    The run's threads only append to its log (:attr:`log`), one entry a work begun and again
    ended: a node's record is made from the log when the run is read (:meth:`fold`), on the
    reader's thread, or on the run's own when its log passes :data:`LOG_FOLDED` entries."""

    def __init__(
        self,
        run_id: str,
        graph: Any,
        nodes: int,
        item: int | None,
        asynchronous: bool,
        parent: str | None,
        hidden: frozenset[str] = frozenset(),
        board: Any = None,
    ) -> None:
        self.id = run_id
        # The run's graph (`_soma.GraphCore`), whose plan the page draws; `None` if not told.
        self.graph = graph
        self.total = nodes
        self.item = item
        self.asynchronous = asynchronous
        self.parent = parent
        # The nodes that stand for nothing the user wrote (`soma._run.observe.hidden`).
        self.hidden = hidden
        self.status = RunStatus.RUNNING
        self.started_at = time.time()
        self.clock = time.perf_counter()
        self.seconds: float | None = None
        self.error: str | None = None
        self.traceback: str | None = None
        # The works told and not yet folded: appended by the run's threads (a deque's append
        # and popleft are each atomic), taken by whoever folds.
        self.log: deque[Any] = deque()
        # Each node's record while the run goes; once it has ended, each node's state as plain
        # data (`frozen`), which the garbage collector need not walk: a process keeps many
        # finished runs, and thousands of live records would slow every collection.
        self.nodes: dict[str, NodeRecord] = {}
        self.frozen: dict[str, tuple[Any, ...]] | None = None
        # Top-level nodes done (finished or cached), as far as folded.
        self._done = 0
        # Held while folding: one reader folds at a time, in the log's order.
        self.lock = threading.Lock()
        # Which nodes began or changed otherwise than by ending a call, in order; the spans
        # ended (each a node's change too); what was emitted, and how much.
        self.changes: Ring[str] = Ring(CHANGES_KEPT)
        # Each span (node, start, end, row, state, attempt): a tuple, as thousands are kept.
        self.spans: Ring[Span] = Ring(SPANS_KEPT)
        self.emits: Ring[dict[str, Any]] = Ring(EMITS_KEPT)
        # How much a finished run weighs in the recorder's budget (`FINISHED_NODES_KEPT`).
        self.weight = 0
        self._label: str | None = None
        self._thread_names: dict[int, str] = {}
        # The id of the run in its journal, for a run with one (`forward(run=, journal=)`).
        self.journal_run: str | None = None
        # The run's board (`_soma.Board`), until its last read once the run ended; whether it
        # had one; its nodes' ids and devices by index, read once.
        self.board = board
        self.boarded = board is not None
        # For a run that keeps a board, made when the recorder took the board in flight: what
        # ends it here once its board says it ended (`Recorder._board_ended`).
        self._board_end: Any = None
        # The program the run resolved, by number, and its board, held while its label is
        # known by that number (`label`): the program lives as long, so the number stays its.
        self._program: int | None = None if board is None else board.program
        self._board_kept = board
        self._board_nodes: list[tuple[str, str | None]] | None = None
        # The failures the log told of nodes the board keeps, by node: the attempt, and the
        # state the failure's error makes it (a question pauses it).
        self._told: dict[str, tuple[int, NodeState]] = {}

    # Folding the log into the nodes' records.

    def fold(self) -> None:
        """Makes each node's record say what the board and the log have told so far."""
        board = self.board
        # Its board is let go only once its end is in its log, after its status changed.
        if (
            board is not None
            and self._board_end is not None
            and self.status is RunStatus.RUNNING
            and board.has_ended
        ):
            self._board_end(self)  # Its end goes in its log.
        if not self.log and board is None:
            return
        with self.lock:
            log = self.log
            while log:
                entry = log.popleft()
                if self.frozen is not None:
                    continue  # told after the run ended: not shown
                if entry is _RUN_ENDED:
                    self._ended()
                elif entry[_STAGE] != _FOLDED:
                    self._fold(entry)
            # After the log: a failure it told of an attempt the board holds is known by then
            # (the engine writes the board first), and its span comes before the attempt after.
            if self.board is not None:
                self._read_board(self.board)

    def _read_board(self, board: Any) -> None:
        """Makes each node's record say what the board holds, for the records changed since
        its last read."""
        changes = board.read()
        if not changes:
            return
        nodes = self._board_nodes
        if nodes is None:
            nodes = self._board_nodes = board.nodes()
        hidden, told = self.hidden, self._told
        for index, name, attempt, thread, started, ended in changes:
            node_id, device = nodes[index]
            if hidden and node_id in hidden:
                continue
            node = self.node(node_id)
            state = _BOARD_STATES[name]
            failed = state in _FAILURES
            if failed:
                failure = told.get(node_id)
                if failure is not None and failure[0] == attempt:
                    state = failure[1]
            self._become(node, state)
            node.attempts, node.device = attempt + 1, device
            node.row = self._row_name(thread)
            node.started = started
            if ended is None:
                self.changes.append(node_id)
                continue
            node.ended, node.seconds = ended, ended - started
            if failed or state is NodeState.CACHED:
                # A failure's span is told with its error, through the log.
                self.changes.append(node_id)
            else:
                self.spans.append((node_id, started, ended, node.row, _TEXT[state], attempt))

    def _board_failure(self, node: NodeRecord, entry: list[Any]) -> None:
        """A failure of a call the board keeps, told through the log for what only it has:
        the error, and the state the error makes it (paused by a question, say)."""
        entry[_STAGE], entry[_RUN_OF] = _FOLDED, None
        error, attempt = entry[_ERROR], entry[_NUMBER]
        if error is None:
            return
        node.error, node.traceback = error[0], error[1]
        state = self._failure_state(entry[_OUTCOME], error, entry[_RETRY])
        self._told[node.id] = (attempt, state)
        if node.attempts == attempt + 1 and node.state in _FAILURES:
            self._become(node, state)
        # Each failed attempt's span is told here, the board keeping only the last attempt.
        started, ended = entry[_STARTED] - self.clock, entry[_ENDED] - self.clock
        row = node.row or self._row_name(entry[_ROW])
        self.spans.append((node.id, started, ended, row, _TEXT[state], attempt))

    def _fold(self, entry: list[Any]) -> None:
        kind, ended = entry[_KIND], entry[_ENDED]
        node = self.node(entry[_NODE])
        if kind == _observe.CALL and self.boarded and entry[_ROW].__class__ is int:
            self._board_failure(node, entry)
            return
        if kind == _observe.CALL:
            if entry[_STAGE] == _NEW:
                if node.state in _DONE:  # run again: a loop's next iteration
                    self._become(node, NodeState.RUNNING)
                else:
                    node.state = NodeState.RUNNING
                node.attempts = entry[_NUMBER] + 1
                node.device = entry[_DEVICE]
                node.row = self._row_name(entry[_ROW])
                node.started = entry[_STARTED] - self.clock
                entry[_STAGE] = _BEGUN
                if ended is None:
                    self.changes.append(node.id)
                    return
            if ended is not None:
                entry[_STAGE], entry[_RUN_OF] = _FOLDED, None
                self._call_ended(node, entry)
            return
        if kind == _observe.CACHED:
            entry[_STAGE], entry[_RUN_OF] = _FOLDED, None
            self._become(node, NodeState.CACHED)
            node.device = entry[_DEVICE]
            node.seconds = 0.0
            self.changes.append(node.id)
            return
        # A part of a step that decides: the step runs while any part is in flight.
        if entry[_STAGE] == _NEW:
            entry[_STAGE] = _BEGUN
            node.parts_open += 1
            if node.state is not NodeState.FAILED:
                self._become(node, NodeState.RUNNING)
            if node.started is None:
                node.started = entry[_STARTED] - self.clock
            if ended is None:
                self.changes.append(node.id)
                return
        if ended is not None:
            entry[_STAGE], entry[_RUN_OF] = _FOLDED, None
            self._part_ended(node, entry)

    def _call_ended(self, node: NodeRecord, entry: list[Any]) -> None:
        outcome, error = entry[_OUTCOME], entry[_ERROR]
        started, ended = node.started or 0.0, entry[_ENDED] - self.clock
        node.ended, node.seconds = ended, ended - started
        if outcome == _observe.RETURNED:
            self._become(node, NodeState.FINISHED)
        elif outcome in (_observe.FAILED, _observe.TIMED_OUT):
            self._become(node, self._failure_state(outcome, error, entry[_RETRY]))
            if error is not None:
                node.error, node.traceback = error[0], error[1]
        else:
            self._become(node, NodeState.STOPPED)
        # The span tells the node's change too: a reader takes changed nodes from both logs.
        self.spans.append((node.id, started, ended, node.row, _TEXT[node.state], node.attempts - 1))

    @staticmethod
    def _failure_state(
        outcome: int, error: tuple[str, str, bool, bool] | None, retry: float | None
    ) -> NodeState:
        """The state a call that failed as ``outcome`` with ``error`` leaves its node in."""
        if retry is not None:
            return NodeState.RETRYING
        if error is not None and error[3]:
            return NodeState.PAUSED
        if outcome == _observe.TIMED_OUT or (error is not None and error[2]):
            return NodeState.TIMED_OUT
        return NodeState.FAILED

    def _part_ended(self, node: NodeRecord, entry: list[Any]) -> None:
        outcome, error = entry[_OUTCOME], entry[_ERROR]
        node.parts_open -= 1
        node.parts_ended += 1
        if outcome in (_observe.FAILED, _observe.TIMED_OUT):
            self._become(node, NodeState.FAILED)
            if error is not None and node.error is None:
                node.error, node.traceback = error[0], error[1]
        elif outcome == _observe.STOPPED and node.state is NodeState.RUNNING:
            self._become(node, NodeState.STOPPED)
        elif node.parts_open == 0 and node.state is NodeState.RUNNING:
            # No part in flight: the step is done, until a part begins again (an `each` with
            # `in_flight` between its items, a `loop`'s next iteration).
            self._become(node, NodeState.FINISHED)
        node.ended = entry[_ENDED] - self.clock
        node.seconds = node.ended - (node.started or 0.0)
        self.changes.append(node.id)

    def _ended(self) -> None:
        """The run has ended: a node still running was left to finish unwatched (past the
        run's deadline, or after a sibling failed), so it shows as timed out with its run, or
        stopped; then each node's state is kept as plain data."""
        board = self.board
        if board is not None:
            # Its last read: every change the run made is on it now.
            self._read_board(board)
            self.board = None
        left = NodeState.TIMED_OUT if self.status is RunStatus.TIMED_OUT else NodeState.STOPPED
        for node in list(self.nodes.values()):
            if node.state is NodeState.RUNNING:
                node.state = left
                node.error = node.error or (
                    "left running when its run timed out"
                    if left is NodeState.TIMED_OUT
                    else "left running when its run ended"
                )
                self.changes.append(node.id)
        self.freeze()

    def freeze(self) -> None:
        """Keeps each node's state as plain data, once the run has ended."""
        self.frozen = {node.id: node.as_row() for node in list(self.nodes.values())}
        self.nodes = {}

    def _become(self, node: NodeRecord, state: NodeState) -> None:
        """Sets ``node``'s state, keeping the run's count of top-level nodes done."""
        if "/" not in node.id:
            self._done += (state in _DONE) - (node.state in _DONE)
        node.state = state

    def _row_name(self, row: int | str) -> str:
        """A timeline row's name: a thread's, told by its id, or an async task's."""
        if isinstance(row, str):
            return row
        name = self._thread_names.get(row)
        if name is None:
            for thread in threading.enumerate():
                if thread.ident is not None:
                    self._thread_names[thread.ident] = thread.name
            name = self._thread_names.setdefault(row, f"thread {row}")
        return name

    # Reading the run.

    @property
    def done(self) -> int:
        """Top-level nodes done (finished or cached): the "done of total" of the runs page. A
        run that returned ran each of its nodes, or had it from the cache: its log and its
        board need not be read to tell; a running run's board counts its own."""
        if self.status is RunStatus.FINISHED and (self.log or self.board is not None):
            return self.total
        board = self.board
        if board is not None and self.status is RunStatus.RUNNING:
            # The runs page asks each running run at every tick: the board counts them, with
            # no record made in Python.
            return int(board.done)
        self.fold()
        return self._done

    @done.setter
    def done(self, count: int) -> None:
        # A run not recorded here (a journal's) is told its count.
        self._done = count

    def node_json(self, node_id: str, *, detail: bool = False) -> dict[str, Any] | None:
        """A node's state as the page reads it; ``None`` for one not begun."""
        self.fold()
        if self.frozen is not None:
            row = self.frozen.get(node_id)
            return None if row is None else _shown(row, detail)
        node = self.nodes.get(node_id)
        return None if node is None else node.as_json(detail=detail)

    def nodes_json(self, *, detail: bool = False) -> list[dict[str, Any]]:
        """Every begun node's state."""
        self.fold()
        frozen = self.frozen
        if frozen is not None:
            return [_shown(row, detail) for row in list(frozen.values())]
        return [node.as_json(detail=detail) for node in list(self.nodes.values())]

    def kept_nodes(self) -> int:
        return len(self.frozen if self.frozen is not None else self.nodes)

    def now(self) -> float:
        """Seconds since the run began."""
        return time.perf_counter() - self.clock

    def node(self, node_id: str) -> NodeRecord:
        found = self.nodes.get(node_id)
        if found is None:
            found = self.nodes[node_id] = NodeRecord(node_id)
        return found

    @property
    def label(self) -> str:
        """The graph, as a row names it: its first root and last leaf. Asking a graph its
        roots and leaves lists them all (milliseconds for a wave of 10,000, the GIL held):
        a run of a program whose label is known takes it (see :data:`_LABELS`)."""
        if self._label is None:
            known = _LABELS.get(self._program) if self._program is not None else None
            if known is not None:
                self._label = known[1]
                self._board_kept = None
                return self._label
            label = "?"
            with contextlib.suppress(Exception):
                roots, leaves = self.graph.roots(), self.graph.leaves()
                if roots and leaves:
                    label = roots[0] if roots == leaves else f"{roots[0]} → {leaves[-1]}"
            self._label = f"{label} ({self.total} nodes)"
            if self._program is not None and self._board_kept is not None:
                _LABELS[self._program] = (self._board_kept, self._label)
                while len(_LABELS) > LABELS_KEPT:
                    del _LABELS[next(iter(_LABELS))]
        self._board_kept = None
        return self._label

    def elapsed(self) -> float:
        return self.seconds if self.seconds is not None else self.now()

    def progress(self) -> str:
        """How far it got, as the pages show it: its nodes done of its total."""
        return f"{self.done} / {self.total} nodes"

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "graph": self.label,
            "status": self.status.value,
            "started": self.started_at,
            "seconds": self.elapsed(),
            "done": self.done,
            "total": self.total,
            "progress": self.progress(),
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

    def running(self) -> list[RunRecord]:
        """The runs in flight."""
        ...

    @property
    def changes(self) -> Ring[str]:
        """The ids of runs as they begin and end (a page reads the rows of running runs at
        every tick: their times and counts move on)."""
        ...


# The run the current work is part of: its record, set where a run begins, in the context its
# branches, items and async tasks copy, as `soma._run.observe` sets a stream's; or the board of
# a run that keeps one, set by the glue (`Recorder._run_of` finds its record).
_current_run = _observe.current_run

perf_counter = time.perf_counter
get_ident = threading.get_ident
# The kinds of work most told, read on each node's way as module names, not attributes.
_CALL: Final = _observe.CALL
_RUN: Final = _observe.RUN

# The states that count as done in a run's "done of total".
_DONE: Final = frozenset({NodeState.FINISHED, NodeState.CACHED})


def _task_row() -> int | str:
    """Where an async node's call runs: its task, by name (or the thread, outside a task)."""
    with contextlib.suppress(RuntimeError):
        task = asyncio.current_task()
        if task is not None:
            return f"task {task.get_name()}"
    return get_ident()


def _paused(error: BaseException | None) -> bool:
    """Whether ``error`` is a node's question (``ctx.ask``), which pauses its run: as the
    observer tells a pause (``soma._run.observe.pausing``), a group's nested ones included."""
    return _observe.pausing(error) is not None


def _error(error: BaseException | None) -> tuple[str, str, bool, bool] | None:
    """What a record keeps of a work's error: its summary, its traceback's text, whether it is
    a node's time limit, and whether a node's question (which pauses its run); the exception
    itself (its frames, what they hold) is let go."""
    if error is None:
        return None
    from soma.errors import TimeLimitError

    return (
        summary(error),
        traceback_text(error),
        isinstance(error, TimeLimitError),
        _paused(error),
    )


class Recorder:
    """The listener a view installs (``soma._run.observe.set_watcher``): a record per run of
    this process, kept as the observer tells each work.

    On a run's way it does the least it can: each work appends one entry to its run's log
    (:meth:`began`, :meth:`end`), and the records are folded from the log when read. While no
    telemetry or event stream listens, the engine calls it directly (:attr:`alone`), not
    through the observer's dispatch, and a run of ``forward`` or ``aforward`` tells it nothing
    as it begins or ends: its board, with what the run told, waits in the glue's ledger
    (``_soma.boarded_runs``) until a reader takes it (:meth:`_take_boards`), and its record is
    made then — so that a run nobody reads costs no Python for the view at all."""

    def __init__(self) -> None:
        # Every run kept, by id: its record; or, for a run that keeps a board and had ended
        # when its board was taken, the board, of which a record is made when one is asked for
        # (a page that reads the newest rows makes no record of the others).
        self._runs: dict[str, RunRecord | _soma.Board] = {}
        # The finished runs kept, as they ended (their ids and weights): the oldest go first.
        self._finished: deque[tuple[str, int]] = deque()
        self._finished_weight = 0
        self._lock = threading.Lock()
        self._changes: Ring[str] = Ring(CHANGES_KEPT)
        # The records of runs that keep a board and had not ended when their board was
        # taken, by the board's number (what an emit finds its run by), until their end is told.
        self._boarded: dict[int, RunRecord] = {}
        # Runs are numbered from the process's one count (`_soma.run_number`), a run that keeps
        # a board as it begins; a run's id is its number past this one: the first run a view
        # sees is its run 1.
        self._base = _soma.run_number()
        #: What the engine calls in the dispatch's stead while nothing else listens: the
        #: dispatch's ``begin(*work)`` and ``end(...)``, here.
        self.alone = _Alone(self)

    # The source the page reads.

    def runs(self) -> list[RunRecord]:
        self._take_boards()
        with self._lock:
            kept = list(self._runs.items())
        runs = [
            found if found.__class__ is RunRecord else self._made(run_id) for run_id, found in kept
        ]
        # Newest first, by number: a run that keeps a board is listed when its board is taken,
        # after runs that began later.
        listed = [run for run in runs if run is not None]
        listed.sort(key=_number, reverse=True)
        return listed

    def run(self, run_id: str) -> RunRecord | None:
        self._take_boards()
        found = self._runs.get(run_id)
        if found is None or found.__class__ is RunRecord:
            return found
        return self._made(run_id)

    def running(self) -> list[RunRecord]:
        """The runs in flight: what a runs page reads at every tick, as their times and counts
        move on."""
        self._take_boards()
        with self._lock:
            kept = list(self._runs.values())
        return [
            run for run in kept if run.__class__ is RunRecord and run.status is RunStatus.RUNNING
        ]

    @property
    def changes(self) -> Ring[str]:
        self._take_boards()
        return self._changes

    # The runs that keep a board.

    def _take_boards(self) -> None:
        """Takes the boards of the runs begun since the last call: keeps those whose run had
        ended (a record is made of one when it is asked for), makes the records of the others,
        and ends those whose board says their run ended since."""
        # A board goes in the ledger as its run begins: each has what its run told then.
        for board in _soma.boarded_runs():
            if not board.has_ended:
                self._board_began(board)
                continue
            run_id = str(board.number - self._base)
            with self._lock:
                self._runs[run_id] = board
                self._kept_finished(run_id, len(board))
            self._changes.append(run_id)
        if self._boarded:
            for run in list(self._boarded.values()):
                board = run.board  # `None` once another reader told its end and read it last.
                if board is not None and board.has_ended:
                    self._board_ended(run)

    def _made(self, run_id: str) -> RunRecord | None:
        """The record of the kept run ``run_id``, made of its board if not yet."""
        with self._lock:
            found = self._runs.get(run_id)
        if found is None or found.__class__ is RunRecord:
            return found
        board: Any = found
        run = self._record_of_board(board)
        if run is None:
            return None
        outcome, error, seconds = board.ended
        self._mark_ended(run, outcome, error, seconds)
        run.weight = len(board)
        with self._lock:
            now = self._runs.get(run_id)
            if now is not board:  # Made meanwhile by another reader, or no longer kept.
                return now if now.__class__ is RunRecord else None
            self._runs[run_id] = run
        return run

    def _record_of_board(self, board: _soma.Board) -> RunRecord | None:
        """A record of the run that keeps ``board``, made from what the run told as it
        began; ``None`` for one not begun."""
        begun = board.begun
        if begun is None:
            return None
        nodes, asynchronous, parent, hidden, journaled, item = begun
        run = RunRecord(
            str(board.number - self._base),
            board.graph,
            nodes,
            item,
            asynchronous,
            self._id_of(parent),
            hidden,
            board,
        )
        run.started_at = board.started_at
        run.clock = perf_counter() - board.elapsed
        if journaled is not None:
            run.journal_run = journaled.name
        return run

    def _board_began(self, board: _soma.Board) -> None:
        """The record of the run in flight that keeps ``board``, made as its board is taken."""
        run = self._record_of_board(board)
        if run is None:
            return
        run._board_end = self._board_ended
        with self._lock:
            self._runs[run.id] = run
            self._boarded[board.number] = run
        self._changes.append(run.id)
        if board.has_ended:
            self._board_ended(run)

    def _board_ended(self, run: RunRecord) -> None:
        """The run that keeps a board ended, as its board says: once, whoever sees it first."""
        with self._lock:
            if self._boarded.pop(int(run.id) + self._base, None) is None:
                return
        # Its board until its end is in its log, which only this call puts there.
        ended = None if run.board is None else run.board.ended
        if ended is None:  # Not possible once `has_ended`; kept for the typing.
            return
        outcome, error, seconds = ended
        self._run_ended_as(run, outcome, error, seconds)

    def _id_of(self, current: Any) -> str | None:
        """The id of the run ``current`` stands for (``soma._run.observe.current_run``'s value:
        its record, or its board), whether or not its record is made."""
        if current is None or current.__class__ is RunRecord:
            return None if current is None else current.id
        return str(current.number - self._base)

    def _run_of(self, current: Any) -> RunRecord | None:
        """The record of the run ``current`` stands for (``soma._run.observe.current_run``'s
        value, or a ``Watched``'s ``watcher_run``): a record is itself; a board, or a board's
        number, the record made of it (its board taken first, if not yet); ``None`` for a run
        no longer kept."""
        if current is None or current.__class__ is RunRecord:
            return current
        number = current if current.__class__ is int else current.number
        found = self._boarded.get(number)
        if found is None:
            self._take_boards()
            found = self._boarded.get(number)
        if found is None:  # Ended when its board was taken, or no longer kept.
            run_id = str(number - self._base)
            return self._made(run_id) if run_id in self._runs else None
        return found

    # The observer's listener.

    def begin(self, work: _observe.Work) -> Any:
        """A work begins, told through the dispatch (beside the telemetry or a stream)."""
        opened = self.began(*work)
        if work[0] == _observe.CALL and opened is not None:
            call = _observe.current_call.get()
            if call is not None:  # Where an emit from a thread the node starts finds the run.
                call.watcher_run = opened[_RUN_OF]
        return opened

    def began(
        self,
        kind: int,
        node: str | None,
        part: Any,
        number: int,
        device: str | None,
        branch: tuple[int, ...],
        awaited: bool,
        function: Any,
    ) -> Any:
        """A work begins (see :data:`soma._run.observe.Work`): one entry in its run's log."""
        if kind == _CALL:
            run = self._run_of(_current_run.get())
            if run is None or (run.hidden and node in run.hidden):
                return None
            log = run.log
            entry = [
                run,
                _NEW,
                kind,
                node,
                number,
                device,
                _task_row() if awaited else get_ident(),
                # A call the run's board keeps is told only as it failed, with when it began.
                perf_counter() if part is None else run.clock + part,
                None,
                None,
                None,
                None,
            ]
            log.append(entry)
            if len(log) > LOG_FOLDED:
                run.fold()
            return entry
        if kind == _RUN:
            return self._run_began(part, number, awaited, function)
        run = self._run_of(_current_run.get())
        if run is None or node is None:
            return None
        now = perf_counter()
        if kind == _observe.CACHED:
            returned = _observe.RETURNED
            run.log.append(
                [None, _NEW, kind, node, number, device, None, now, now, returned, None, None]
            )
            return None
        entry = [run, _NEW, kind, node, part, device, None, now, None, None, None, None]
        run.log.append(entry)
        return entry

    def end(
        self, opened: Any, outcome: int, error: BaseException | None, retry_in: float | None
    ) -> None:
        if opened.__class__ is list:  # a call, or a step's part
            # In one assignment: a reader on another thread sees all of the end or none of it.
            opened[_ENDED:] = (
                perf_counter(),
                outcome,
                None if error is None else _error(error),
                retry_in,
            )
            opened[_RUN_OF].log.append(opened)
            return
        self._run_ended(opened, outcome, error)

    def _run_began(self, item: Any, nodes: int, asynchronous: bool, graph: Any) -> Any:
        begun = RunRecord(
            str(_soma.run_number() - self._base),
            graph,
            nodes,
            item,
            asynchronous,
            self._id_of(_current_run.get()),
            _observe.hidden.get(),
        )
        journaled = _journal_run.get()
        if journaled is not None:
            begun.journal_run = journaled.name
        with self._lock:
            self._runs[begun.id] = begun
        self._changes.append(begun.id)
        # What an emit of the run's nodes finds, from a thread a node starts too; the dispatch,
        # when it is the one called, sets one of its own for each call.
        watched = _observe.Watched(None, item, None, self)
        watched.watcher_run = begun
        return (begun, _current_run.set(begun), _observe.current_call.set(watched))

    def _run_ended(self, opened: Any, outcome: int, error: BaseException | None) -> None:
        run, token, call = opened
        with contextlib.suppress(ValueError):
            # A streamed item ends on another thread, outside the context it began in.
            _observe.current_call.reset(call)
        with contextlib.suppress(ValueError):
            _current_run.reset(token)
        self._run_ended_as(run, outcome, error, run.now())

    def _run_ended_as(
        self, run: RunRecord, outcome: int, error: BaseException | None, seconds: float
    ) -> None:
        """``run`` ended as ``outcome``, with ``error``, after ``seconds``: its status, then
        its place among the finished runs the recorder keeps."""
        self._mark_ended(run, outcome, error, seconds)
        with self._lock:
            # What the run keeps until read: its log, or its nodes once folded.
            run.weight = max(
                len(run.log), run.kept_nodes(), 0 if run.board is None else len(run.board)
            )
            self._kept_finished(run.id, run.weight)
        self._changes.append(run.id)

    @staticmethod
    def _mark_ended(
        run: RunRecord, outcome: int, error: BaseException | None, seconds: float
    ) -> None:
        """Sets what ``run``, ended as ``outcome`` with ``error`` after ``seconds``, shows, and
        puts its end in its log."""
        run.seconds = seconds
        if error is not None:
            run.error = summary(error)
            run.traceback = traceback_text(error)
        # Last: a reader that sees the run ended sees its error.
        if outcome == _observe.RETURNED:
            run.status = RunStatus.FINISHED
        elif _paused(error):
            run.status = RunStatus.PAUSED
        elif outcome == _observe.TIMED_OUT:
            run.status = RunStatus.TIMED_OUT
        elif outcome == _observe.FAILED:
            run.status = RunStatus.FAILED
        else:
            run.status = RunStatus.STOPPED
        run.log.append(_RUN_ENDED)

    def _kept_finished(self, run_id: str, weight: int) -> None:
        """The run ``run_id``, of ``weight``, is among the finished runs kept, and the oldest
        go past what the recorder keeps. Called holding the lock."""
        self._finished.append((run_id, weight))
        self._finished_weight += weight
        while len(self._finished) > 1 and (
            len(self._finished) > FINISHED_KEPT or self._finished_weight > FINISHED_NODES_KEPT
        ):
            dropped_id, dropped_weight = self._finished.popleft()
            dropped = self._runs.pop(dropped_id, None)
            self._finished_weight -= dropped_weight
            if dropped.__class__ is RunRecord:
                # Its entries not folded refer to it: let go of them here, so that it is freed
                # now, not by a collection of cycles (which a program may have turned off).
                dropped.log.clear()

    def emit(self, node: str, value: Any, watched: _observe.Watched) -> None:
        """What a node emitted, in the run ``watched`` was begun in: from a thread the node
        started too, where the run is not current."""
        run = self._run_of(_current_run.get() or watched.watcher_run)
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
        run = self._run_of(_current_run.get())
        if run is None:
            return
        run.fold()
        with run.lock:
            if run.frozen is not None:
                return
            for node_id, start, end, _thread, _branch, _turns, error, device, cached in spans:
                node = run.node(node_id)
                node.host, node.device = host, device
                node.seconds = end - start
                if error is not None:
                    run._become(node, NodeState.FAILED)
                    node.error = str(error)[:SUMMARY_CHARS]
                else:
                    run._become(node, NodeState.CACHED if cached else NodeState.FINISHED)
                run.changes.append(node_id)


class _Alone:
    """The recorder as the engine's observer itself, while nothing else listens (see
    ``soma._run.observe.set_watcher``): the engine calls ``begin(*work)`` and ``end(...)``."""

    __slots__ = ("begin", "end")

    #: How many finished runs, of how many nodes in all, the glue's ledger of boards keeps for
    #: the recorder until it takes them: what the recorder itself keeps.
    kept: Final = (FINISHED_KEPT, FINISHED_NODES_KEPT)

    def __init__(self, recorder: Recorder) -> None:
        self.begin = recorder.began
        self.end = recorder.end


def _number(run: RunRecord) -> int:
    """A run's number, by which runs are listed."""
    return int(run.id)


def walk_plan_nodes(plan: Any) -> Iterator[str]:
    """The ids of the nodes a plan runs, steps' inner nodes included: a walk with a stack of
    its own, as deep as the plan nests."""
    stack = [plan]
    while stack:
        step = stack.pop()
        if step.node is not None:
            yield step.node
        stack.extend(reversed(step.children))
