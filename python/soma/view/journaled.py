"""A journal's runs on the view: every run any process recorded in a :class:`soma.Journal`,
listed beside this process's live runs, and the form a paused run is answered by.

The page reads runs through :class:`~soma.view.record.RunSource`; :class:`JournalSource` is one
over this process's recorder and a journal. A run this process is running or ran while the view
was open is shown as the recorder saw it (its plan, timeline and emits); any other run the
journal holds is shown as the journal has it — status, time, nodes done, error, open questions
— and a node's detail is what the journal knows of it (finished, its seconds, its output's
size). The journal is read at most every :data:`READ_EVERY_S`; a run whose status changed since
is told to the open pages as the recorder tells its own.

Answering records the answers in the journal; when this process holds the run's graph (it ran
the run under ``forward``), the run is resumed here, on a thread of its own, and its page follows
it on; otherwise the answers wait in the journal for whoever resumes it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, Final

from soma.errors import JournalError
from soma.journal._journal import Journal, JournalRun
from soma.view.record import NodeRecord, NodeState, Recorder, RunRecord, RunStatus

if TYPE_CHECKING:
    from soma.view.record import Ring

#: How often the journal is read for the runs page, at most.
READ_EVERY_S: Final = 0.5
#: How long an answer waits for the run it resumes here to begin, at most, before the browser
#: is sent to the run's page.
RESUME_BEGINS_S: Final = 5.0
#: How often an answer looks for that run to have begun.
_LOOK_EVERY_S: Final = 0.01

_STATUS: Final = {
    "running": RunStatus.RUNNING,
    "paused": RunStatus.PAUSED,
    "failed": RunStatus.FAILED,
    "finished": RunStatus.FINISHED,
    "abandoned": RunStatus.STOPPED,
}


class JournaledRun(RunRecord):
    """A run as a journal holds it, shaped as the page reads a recorded one."""

    def __init__(self, run: JournalRun) -> None:
        super().__init__(run.id, None, run.nodes, None, False, None)
        self.status = _STATUS[run.status]
        self.started_at = run.started
        self.seconds = run.seconds
        self.error = run.error
        self.done = run.done
        self.questions: dict[str, str] = dict(run.questions)
        self.journal_status = run.status
        self.stream = run.stream
        self._graph_text = run.graph
        self.frozen = {}

    def progress(self) -> str:
        # A stream's items are its caller's: its nodes' calls are counted, not "done of total".
        return f"{self.done} calls" if self.stream else super().progress()

    @property
    def label(self) -> str:
        return f"{self._graph_text} ({self.total} nodes)"

    def with_nodes(self, nodes: list[tuple[str, float, int]]) -> JournaledRun:
        """Itself, with each node the journal recorded finished."""
        for node_id, seconds, _ in nodes:
            record = NodeRecord(node_id)
            record.state = NodeState.FINISHED
            record.seconds = seconds
            record.attempts = 1
            self.nodes[node_id] = record
        self.freeze()
        return self


class JournalSource:
    """This process's recorder, and ``journal``'s runs beside its own."""

    def __init__(self, recorder: Recorder, journal: Journal) -> None:
        self._recorder = recorder
        self.journal = journal
        self._lock = threading.Lock()
        self._read_at = 0.0
        self._rows: list[JournalRun] = []
        self._statuses: dict[str, tuple[str, int]] = {}

    @property
    def changes(self) -> Ring[str]:
        return self._recorder.changes

    def _journal_runs(self) -> list[JournalRun]:
        with self._lock:
            if time.monotonic() - self._read_at < READ_EVERY_S:
                return self._rows
            self._read_at = time.monotonic()
            rows = self.journal.runs()
            told = self._statuses
            self._statuses = {row.id: (row.status, row.done) for row in rows}
            self._rows = rows
        for row in rows:
            if told.get(row.id) != (row.status, row.done):
                self._recorder.changes.append(row.id)
        return rows

    def _live_names(self) -> dict[str, RunRecord]:
        """This process's runs with a journal id, each id's newest."""
        named: dict[str, RunRecord] = {}
        for run in self._recorder.runs():  # The newest first.
            if run.journal_run is not None:
                named.setdefault(run.journal_run, run)
        return named

    def runs(self) -> list[RunRecord]:
        live = self._recorder.runs()
        named = self._live_names()
        kept: list[RunRecord] = [
            JournaledRun(row) for row in self._journal_runs() if row.id not in named
        ]
        return sorted([*live, *kept], key=lambda run: run.started_at, reverse=True)

    def running(self) -> list[RunRecord]:
        return [run for run in self.runs() if run.status is RunStatus.RUNNING]

    def run(self, run_id: str) -> RunRecord | None:
        found = self._recorder.run(run_id)
        if found is not None:
            return found
        live = self._live_names().get(run_id)
        if live is not None:
            return live
        try:
            row = self.journal.run(run_id)
            return JournaledRun(row).with_nodes(self.journal.nodes(run_id))
        except JournalError:
            return None

    def answer(self, run_id: str, answers: dict[str, str]) -> bool:
        """Records ``answers`` to run ``run_id``'s open questions, and resumes the run here when
        this process holds its graph (on a thread of its own), returning once the resumed run
        has begun, so that its page follows it: whether it resumed. Raises
        :class:`soma.errors.JournalError` for an answer to no open question."""
        self.journal.answer(run_id, answers)
        graph = self.journal.graph_of(run_id)
        if graph is None:
            return False
        before = self._live_names().get(run_id)
        ended = threading.Event()
        threading.Thread(
            target=_resume,
            args=(graph, run_id, self.journal, ended),
            name="soma-view-resume",
            daemon=True,
        ).start()
        deadline = time.monotonic() + RESUME_BEGINS_S
        while not ended.wait(_LOOK_EVERY_S) and time.monotonic() < deadline:
            if self._live_names().get(run_id) is not before:
                break
        return True


def _resume(graph: Any, run_id: str, journal: Journal, ended: threading.Event) -> None:
    """Resumes a run answered on the page, setting ``ended`` once it ends; what it raises (it
    pauses again, it fails) the journal and the page show, so nothing more is said here."""
    try:
        # `soma.Paused` is an `Exception` too: a run that asks again waits on its page.
        with contextlib.suppress(Exception):
            graph.resume(run_id, journal=journal)
    finally:
        ended.set()
