"""``soma.Journal``: where runs are written down as they go, so that one can be resumed after a
crash, in this process or another, or after a pause for a person's answer.

A run with an id (``g.forward(x, run="nightly-42", journal=j)``) is recorded node by node as its
nodes return; ``g.resume("nightly-42", journal=j)`` reruns it with the journal as its cache,
calling exactly the nodes whose outputs were not recorded (and any edited since, and what
depends on them). While a run is being run it is held, by a lease the holder renews; a second
process asking for it is refused with the holder's name until the lease lapses.
"""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from soma.cache import _fingerprint
from soma.cache._cache import Cache
from soma.journal._active import ACTIVE, ActiveRun, answer_payload
from soma.journal._calls import Asked
from soma.journal._recording import Recording
from soma.journal._signing import Signer
from soma.journal._store import RunRow, Store, journal_error

if TYPE_CHECKING:
    from soma import _soma

#: How long a hold on a run lasts unless renewed; renewed every third of it while the run runs.
LEASE_SECONDS = 30.0

#: How long a finished node may wait unwritten: what a process killed at any instant loses.
WRITE_EVERY_S = 0.05


class Paused(Exception):
    """A run paused for a person's answers: ``forward`` raises it, holding nothing — no thread,
    no frame. ``.run`` is the run's id, ``.questions`` every open question by the path it is
    answered at (a node's id, with a mark where several calls of one node ask at once).
    ``g.resume(run, journal=j, answers={path: answer})`` continues it, from any process."""

    def __init__(self, run: str, questions: dict[str, object]) -> None:
        listed = "; ".join(f"`{path}`: {question!r}" for path, question in questions.items())
        super().__init__(f"run `{run}` paused for answers: {listed}")
        self.run = run
        self.questions = questions


@dataclass(frozen=True)
class RunRecord:
    """A run as a journal holds it (``soma.runs``)."""

    #: The run's id.
    id: str
    #: The graph it ran: its leaves and its number of nodes.
    graph: str
    #: ``running``, ``paused``, ``failed``, ``finished``, or ``abandoned`` (running, its
    #: holder gone: its lease lapsed).
    status: str
    #: When it began (seconds since the epoch).
    started: float
    #: When it last ended, ``None`` while running.
    ended: float | None
    #: Seconds spent running it, over every resume.
    seconds: float
    #: Nodes recorded finished, of the graph's nodes.
    done: int
    nodes: int
    #: Its error's message, for a failed run.
    error: str | None
    #: Who holds it while running.
    holder: str | None
    #: Its open questions by path, for a paused run.
    questions: dict[str, str]


class Journal:
    """Runs written down as they go: ``Journal("runs.db")`` in an SQLite file (made if
    missing), ``Journal("postgresql://...")`` in a PostgreSQL database, shared by processes and
    machines (needs ``psycopg``).

    A journal keeps, per run, the key each finished node ran under and its output (stored once
    by key), its effects' results and its questions — not snapshots of state. Outputs are
    pickled: whoever can write the store can run code in every process that resumes from it.
    With ``key``, everything is signed when written and refused, never unpickled, when it does
    not verify (:class:`soma.errors.SignatureError`).

    Args:
        target: a file path, or a ``postgresql://`` URL.
        key: signs and verifies every entry (bytes or str); ``None`` signs nothing.
        lease: seconds a hold on a running run lasts unless renewed (renewed every third of
            it while the run runs); a holder that dies lets it lapse after that.
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        key: bytes | str | None = None,
        lease: float = LEASE_SECONDS,
    ) -> None:
        if not (isinstance(lease, (int, float)) and lease > 0):
            raise ValueError(f"lease is a number of seconds above 0, not {lease!r}")
        self._target = os.fspath(target)
        self._store = Store(self._target)
        self._signer = Signer(key, self._target)
        self._lease = float(lease)
        self._plain = Cache()
        self._held: dict[int, ActiveRun] = {}
        self._lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._wake = threading.Condition(self._lock)

    def __repr__(self) -> str:
        return f"Journal({self._target!r})"

    @property
    def target(self) -> str:
        """Where the journal is kept: its file, or its database's URL."""
        return self._target

    def close(self) -> None:
        """Closes the journal's connection; runs it holds keep their records."""
        self._store.close()

    # ----- a run --------------------------------------------------------------------------------

    def _begin(
        self, name: str, core: _soma.GraphCore, kind: str, input: Any, *, resumed: bool
    ) -> ActiveRun:
        """Holds run ``name`` for this call: begun, or taken up where the journal left it."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"run is a non-empty str, not {name!r}")
        try:
            payload = pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)
            digest = _fingerprint.digest(input)
        except Exception as error:
            raise TypeError(
                f"run `{name}`'s input cannot be recorded, so it could not be resumed: "
                f"`{type(error).__name__}: {error}`\n"
                "hint: give a run with a journal an input that pickles"
            ) from error
        holder = f"{socket.gethostname()} pid {os.getpid()} ({uuid.uuid4().hex[:8]})"
        started = self._store.start(
            name,
            graph=", ".join(core.leaves()),
            nodes=len(core),
            kind=kind,
            input=payload,
            input_sig=self._signer.sign(b"input", name.encode(), payload),
            input_digest=digest,
            holder=holder,
            lease_seconds=self._lease,
            same_input=not resumed,
        )
        if started.existing:
            self._store.forget_open_questions(started.id)
        active = ActiveRun(
            self._store,
            self._signer,
            name,
            started.id,
            holder,
            self._store.done(started.id) if started.existing else {},
        )
        with self._lock:
            self._held[active.id] = active
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name="soma-journal", daemon=True)
                self._keeper.start()
        return active

    def _end(self, active: ActiveRun, status: str, error: str | None) -> None:
        with self._lock:
            self._held.pop(active.id, None)
            self._wake.notify_all()
        active.flush()
        self._store.end(
            active.id, active.holder, status, error, time.perf_counter() - active.started
        )

    def _keep(self) -> None:
        """Writes what runs held here finished, every few milliseconds, and renews their
        leases: one thread a journal, while it holds a run."""
        renewed = time.monotonic()
        while True:
            with self._lock:
                if not self._held:
                    self._keeper = None
                    return
                self._wake.wait(WRITE_EVERY_S)
                held = list(self._held.values())
            for active in held:
                if active.due(WRITE_EVERY_S):
                    active.flush()
            if time.monotonic() - renewed > self._lease / 3:
                renewed = time.monotonic()
                for active in held:
                    self._store.renew([active.id], active.holder, self._lease)

    @contextmanager
    def _running(
        self,
        name: str,
        core: _soma.GraphCore,
        kind: str,
        input: Any,
        cache: Cache | None,
        *,
        resumed: bool,
    ) -> Iterator[Recording]:
        """Holds run ``name`` around one call of the engine, which the yielded cache records;
        ends it as the call ends: finished, paused (raising :class:`Paused`), or failed."""
        active = self._begin(name, core, kind, input, resumed=resumed)
        token = ACTIVE.set(active)
        try:
            active.verify_recorded()
            yield Recording(active, cache, self._plain)
            if active.refused is not None:
                raise active.refused
        except BaseException as raised:
            if _asked(raised):
                self._end(active, "paused", None)
                questions = dict(sorted(active.asked.items()))
                raise Paused(name, questions) from None
            self._end(active, "failed", f"{type(raised).__name__}: {raised}")
            raise
        else:
            self._end(active, "finished", None)
        finally:
            ACTIVE.reset(token)

    def _resumable(self, name: str, answers: dict[str, Any] | None) -> Any:
        """Run ``name``'s input, as recorded, once ``answers`` are recorded."""
        found = self._store.input(name)
        if found is None:
            raise journal_error(name, f"run `{name}` is not in the journal `{self._target}`")
        _, payload, sig = found
        run = self._store.run(name)
        assert run is not None
        for path, answer in (answers or {}).items():
            if not answer_payload(self._signer, self._store, run.id, path, answer):
                open_paths = [path for path, _, _ in self._store.open_questions(run.id)]
                raise journal_error(
                    name,
                    f"run `{name}` has no open question at `{path}`; its open questions are "
                    f"at {', '.join(f'`{p}`' for p in open_paths) or 'no path'}",
                )
        assert payload is not None
        self._signer.verify(b"input", name.encode(), payload, sig, f"run `{name}`'s input")
        return pickle.loads(payload)

    # ----- history ----------------------------------------------------------------------------

    def runs(self) -> list[RunRecord]:
        """Every run the journal holds, the newest first."""
        return [self._record(row) for row in self._store.runs()]

    def run(self, name: str) -> RunRecord:
        """Run ``name`` as the journal holds it."""
        row = self._store.run(name)
        if row is None:
            raise journal_error(name, f"run `{name}` is not in the journal `{self._target}`")
        return self._record(row)

    def nodes(self, name: str) -> list[tuple[str, float, int]]:
        """Each node run ``name`` recorded finished: its id, its seconds, its output's size in
        bytes (pickled)."""
        row = self._store.run(name)
        if row is None:
            raise journal_error(name, f"run `{name}` is not in the journal `{self._target}`")
        return self._store.nodes(row.id)

    def prune(self, older_than: float) -> int:
        """Removes runs that ended more than ``older_than`` seconds ago (none running), and the
        outputs only they held; how many runs."""
        return self._store.prune(older_than)

    def _record(self, row: RunRow) -> RunRecord:
        status = row.status
        if status == "running" and (row.lease_until is None or row.lease_until < time.time()):
            status = "abandoned"
        questions = (
            {path: shown for path, _, shown in self._store.open_questions(row.id)}
            if status == "paused"
            else {}
        )
        return RunRecord(
            id=row.name,
            graph=row.graph,
            status=status,
            started=row.started,
            ended=row.ended,
            seconds=row.seconds,
            done=row.done,
            nodes=row.nodes,
            error=row.error,
            holder=row.holder if status == "running" else None,
            questions=questions,
        )


def _asked(raised: BaseException) -> bool:
    """Whether ``raised`` is a node's question (alone, or among a group's — a ``TaskGroup``
    in an async node gathers what its tasks raised)."""
    if isinstance(raised, Asked):
        return True
    if isinstance(raised, BaseExceptionGroup):
        return all(_asked(inner) for inner in raised.exceptions)
    return False


def runs(journal: Journal) -> list[RunRecord]:
    """Every run ``journal`` holds, the newest first: each a :class:`RunRecord` (``.id``,
    ``.status``, ``.started``, ``.done`` of ``.nodes``, ``.error``, ``.questions``, ...)."""
    return journal.runs()


def checked_run(run: object, journal: object) -> tuple[str, Journal]:
    """``run`` and ``journal``, checked: a run is recorded with an id and a journal."""
    if journal is None or run is None:
        raise ValueError(
            "a run is recorded with both an id and a journal: run='some-id', "
            "journal=soma.Journal('runs.db')"
        )
    if not isinstance(journal, Journal):
        raise TypeError(
            f"journal is a soma.Journal, not an object of type `{type(journal).__name__}`"
        )
    if not isinstance(run, str) or not run:
        raise ValueError(f"run is a non-empty str, not {run!r}")
    return run, journal
