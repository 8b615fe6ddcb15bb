"""``soma.Journal``: where runs are written down as they go, so that one can be resumed after a
crash, in this process or another, or after a pause for a person's answer.

A run with an id (``g.forward(x, run="nightly-42", journal=j)``) is recorded node by node as its
nodes return; ``g.resume("nightly-42", journal=j)`` reruns it with the journal as its cache,
calling exactly the nodes whose outputs were not recorded (and any edited since, and what
depends on them). While a run is being run it is held, by a lease the holder renews; a second
process asking for it is refused with the holder's name until the lease lapses.

A stream with an id (``g.map(items, run="id", journal=j)``, ``g.amap``) is one run, held from
the call that makes the stream to its end (:class:`StreamRun`), whose items' nodes are keyed by
content as the cache keys each item: calling ``map`` again with the same id takes it up, every
node an item recorded answered from the journal, the rest called. Its items are the caller's
(an iterable read lazily, perhaps a generator), so the journal keeps no input for it, and
``g.resume`` refuses it, pointing back to ``map``.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import pickle
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from soma import _soma
from soma._run import events as _events
from soma._run import observe as _observe
from soma.cache import _fingerprint
from soma.cache._cache import Cache
from soma.errors import JournalError
from soma.journal import _holders
from soma.journal._active import ACTIVE, ActiveRun, answer_payload
from soma.journal._calls import Asked
from soma.journal._recording import Recording
from soma.journal._signing import Signer
from soma.journal._store import RunRow, Store, journal_error

if TYPE_CHECKING:
    from soma._run.stream import Failed

#: How long a hold on a run lasts unless renewed; renewed every third of it while the run runs.
LEASE_SECONDS = 30.0

#: How long a finished node may wait unwritten: what a process killed at any instant loses.
WRITE_EVERY_S = 0.05

#: The kinds of run that are streams (``g.map``, ``g.amap``): no input of their own.
STREAM_KINDS = ("map", "amap")

#: How long the journal's thread outlives the last run it held: a thread started for every run
#: would cost a pause more than the rest of it (0.2 to 0.4 ms on a loaded two-core machine).
KEEPER_IDLE_S = 1.0

#: What a stream run is recorded with in place of its input's digest: the same for every stream,
#: so that ``map`` again with the id takes it up (``amap`` too), and never a digest of an input,
#: so that ``forward`` with a stream's id is refused rather than taken for it.
_STREAM_DIGEST = hashlib.blake2b(
    b"soma-journal: a stream, its items the caller's", digest_size=32
).digest()


class Paused(Exception, _observe.PausedRun):
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
class JournalRun:
    """A run as a journal holds it (``soma.runs``, ``Journal.run``).

    Attributes:
        id: the run's id.
        graph: the graph it ran, by its leaves.
        status: ``running``, ``paused``, ``failed``, ``finished``, or ``abandoned`` (running,
            its holder gone: its lease lapsed, or it was a process of this machine that ended).
        started: when it began (seconds since the epoch).
        ended: when it last ended; ``None`` while running.
        seconds: seconds spent running it, over every resume.
        done: nodes recorded finished; for a stream, node calls recorded over all its items.
        nodes: the graph's nodes (for a stream, each item's).
        stream: whether it is a stream's run (``g.map``, ``g.amap``), whose items are the
            caller's: how many there are is not known to the journal.
        error: its error's message, for a failed run; ``None`` otherwise.
        holder: who holds it while it runs (host, process id, a mark of the call).
        questions: its open questions by path, as shown, for a paused run.
    """

    id: str
    graph: str
    status: str
    started: float
    ended: float | None
    seconds: float
    done: int
    nodes: int
    error: str | None
    holder: str | None
    questions: dict[str, str]
    stream: bool = False


class Journal:
    """Runs written down as they go: ``Journal("runs.db")`` in an SQLite file (made if
    missing), ``Journal("postgresql://...")`` in a PostgreSQL database, shared by processes and
    machines (needs ``psycopg``).

    A journal keeps, per run, the key each finished node ran under and its output, its
    effects' results and its questions — not snapshots of state. Outputs are
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
        # The graph each run was last run with here, by run id: what a view resumes an answered
        # run with. Weak: a journal never keeps a graph alive.
        self._graphs: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()

    def __repr__(self) -> str:
        return f"Journal({self._target!r})"

    @property
    def target(self) -> str:
        """Where the journal is kept: its file, or its database's URL."""
        return self._target

    def close(self) -> None:
        """Closes the journal's connection; runs it holds keep their records."""
        self._store.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *raised: object) -> None:
        self.close()

    # ----- a run --------------------------------------------------------------------------------

    def _begin(
        self, name: str, core: _soma.GraphCore, kind: str, input: Any, *, resumed: bool
    ) -> ActiveRun:
        """Holds run ``name`` for this call: begun, or taken up where the journal left it (then
        an event stream the call reports to begins with ``"resumed"``). A stream's run
        (``kind`` ``"map"`` or ``"amap"``) keeps no input."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"run is a non-empty str, not {name!r}")
        payload: bytes | None = None
        sig: bytes | None = None
        if kind in STREAM_KINDS:
            digest = _STREAM_DIGEST
        else:
            try:
                payload = pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)
                digest = _fingerprint.digest(input)
            except Exception as error:
                raise TypeError(
                    f"run `{name}`'s input cannot be recorded, so it could not be resumed: "
                    f"`{type(error).__name__}: {error}`\n"
                    "hint: give a run with a journal an input that pickles"
                ) from error
            sig = self._signer.sign(b"input", name.encode(), payload)
        holder = f"{socket.gethostname()} pid {os.getpid()} ({uuid.uuid4().hex[:8]})"
        try:
            started = self._store.start(
                name,
                graph=", ".join(core.leaves()),
                nodes=len(core),
                kind=kind,
                input=payload,
                input_sig=sig,
                input_digest=digest,
                holder=holder,
                lease_seconds=self._lease,
                same_input=not resumed,
            )
        except JournalError as refused:
            raise self._other_kind(name, kind) or refused from None
        if started.existing:
            # The questions it left open are asked again by the nodes that asked them, which
            # run again: an answer belongs to what its node read, which an edit may change.
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
            # Counted before any of its nodes is called: their calls read `ACTIVE` only while
            # the process holds a run with a journal.
            _soma._journal_run_held(True)
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep, name="soma-journal", daemon=True)
                self._keeper.start()
        if started.existing:
            _events.resumed(name)
        return active

    def _other_kind(self, name: str, kind: str) -> JournalError | None:
        """Why run ``name`` cannot be taken up by a run of ``kind`` when one is a stream and
        the other not: a stream's id names no input to run ``forward`` on, and a run's id no
        items to stream; ``None`` when both are of one sort."""
        found = self._store.input(name)
        if found is None or (found[0] in STREAM_KINDS) == (kind in STREAM_KINDS):
            return None
        if found[0] in STREAM_KINDS:
            return journal_error(
                name,
                f"run `{name}` is a stream ({found[0]}), not a run on one input\n"
                f"hint: take it up with g.{found[0]}(the same items, run={name!r}, "
                "journal=j), or give this run another id",
            )
        return journal_error(
            name,
            f"run `{name}` is a run on one input ({found[0]}), not a stream\n"
            "hint: resume it with g.resume(run, journal=j), or give this stream another id",
        )

    def _end(self, active: ActiveRun, status: str, error: str | None) -> None:
        with self._lock:
            if self._held.pop(active.id, None) is not None:
                _soma._journal_run_held(False)
            self._wake.notify_all()
        active.flush()
        self._store.end(
            active.id, active.holder, status, error, time.perf_counter() - active.started
        )

    def _keep(self) -> None:
        """Writes what runs held here finished, every few milliseconds, and renews their
        leases: one thread a journal, while it holds a run and for ``KEEPER_IDLE_S`` after, so
        that runs begun one after another (a pause, its resume, the next run) do not each pay
        for starting a thread. What it cannot write (the store gone, a full disk) is said once
        a run, and written by the run's next write or its end."""
        renewed = time.monotonic()
        idle_since: float | None = None
        while True:
            with self._lock:
                if self._held:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= KEEPER_IDLE_S:
                    self._keeper = None
                    return
                self._wake.wait(WRITE_EVERY_S)
                held = list(self._held.values())
            renewing = time.monotonic() - renewed > self._lease / 3
            if renewing:
                renewed = time.monotonic()
            for active in held:
                try:
                    if active.due(WRITE_EVERY_S):
                        active.flush()
                    if renewing:
                        self._store.renew([active.id], active.holder, self._lease)
                except Exception as error:  # The run's own writes say it again, or succeed.
                    active.warn(
                        "keeper",
                        f"the journal `{self._target}` could not be written while run "
                        f"`{active.name}` ran: `{type(error).__name__}: {error}`",
                    )

    @contextmanager
    def _running(
        self,
        name: str,
        graph: Any,
        kind: str,
        input: Any,
        cache: Cache | None,
        *,
        resumed: bool,
    ) -> Iterator[Recording]:
        """Holds run ``name`` of ``graph`` (a ``soma.Graph``) around one call of the engine,
        which the yielded cache records; ends it as the call ends: finished, paused (raising
        :class:`Paused`), or failed."""
        active = self._begin(name, graph._core, kind, input, resumed=resumed)
        self._graphs[name] = graph
        token = ACTIVE.set(active)
        try:
            active.verify_recorded()
            yield Recording(active, cache, self._plain)
            if active.refused is not None:
                raise active.refused
        except BaseException as raised:
            paused = self._ended(active, raised)
            if paused is not None:
                raise paused from None
            raise
        else:
            self._end(active, "finished", None)
        finally:
            ACTIVE.reset(token)

    def _ended(self, active: ActiveRun, raised: BaseException) -> Paused | None:
        """Ends ``active``, which ``raised`` cut off: paused, when a node asked (the
        :class:`Paused` to raise instead), else failed."""
        if _asked(raised):
            self._end(active, "paused", None)
            # As asked here, never read back unpickled from the store (questions are not
            # signed: only what they were asked with is trusted).
            return Paused(active.name, dict(sorted(active.asked.items())))
        self._end(active, "failed", f"{type(raised).__name__}: {raised}")
        return None

    def _stream(
        self,
        name: str,
        core: _soma.GraphCore,
        kind: str,
        cache: Cache | None,
        answers: dict[str, Any] | None,
    ) -> StreamRun:
        """Holds run ``name``, a stream of ``kind`` (``map`` or ``amap``), from now until the
        stream ends; ``answers`` to its open questions recorded first, as :meth:`_resumable`
        records them."""
        if answers:
            self._answered(name, answers)
        active = self._begin(name, core, kind, None, resumed=False)
        return StreamRun(self, active, Recording(active, cache, self._plain))

    def _answered(self, name: str, answers: dict[str, Any]) -> None:
        """Records ``answers`` to the open questions of run ``name``, by path."""
        run = self._store.run(name)
        if run is None:
            raise journal_error(
                name,
                f"run `{name}` is not in the journal `{self._target}`, so it has no question "
                "to answer",
            )
        for path, answer in answers.items():
            if not answer_payload(self._signer, self._store, run.id, path, answer):
                open_paths = [path for path, _, _ in self._store.open_questions(run.id)]
                raise journal_error(
                    name,
                    f"run `{name}` has no open question at `{path}`; its open questions are "
                    f"at {', '.join(f'`{p}`' for p in open_paths) or 'no path'}",
                )

    def _resumable(self, name: str, answers: dict[str, Any] | None) -> Any:
        """Run ``name``'s input, as recorded, once ``answers`` are recorded."""
        found = self._store.input(name)
        if found is None:
            raise journal_error(name, f"run `{name}` is not in the journal `{self._target}`")
        kind, payload, sig = found
        if kind in STREAM_KINDS:
            # Its items were an iterable of the caller's, read lazily (a generator, a query):
            # the journal keeps none of them, and only the caller can give them again.
            raise journal_error(
                name,
                f"run `{name}` is a stream ({kind}): its items are the caller's, and the journal "
                "keeps none of them, so it cannot be resumed on its own\n"
                f"hint: take it up with g.{kind}(the same items, run={name!r}, journal=j, "
                "answers=...): the items it finished are answered from the journal",
            )
        if answers:
            self._answered(name, answers)
        assert payload is not None
        self._signer.verify(b"input", name.encode(), payload, sig, f"run `{name}`'s input")
        return pickle.loads(payload)

    def answer(self, run: str, answers: dict[str, Any]) -> None:
        """Records ``answers`` (by the path :class:`Paused` gave each question at) to run
        ``run``'s open questions, for whoever resumes it, in any process.

        Args:
            run: the paused run's id.
            answers: each answer by its question's path.

        Raises:
            soma.errors.JournalError: the journal holds no run ``run``, or no question is open
                at a path of ``answers``.
        """
        self._resumable(run, answers)

    def graph_of(self, run: str) -> Any:
        """The ``soma.Graph`` this process last ran run ``run`` with, while it lives; ``None``
        when none here did."""
        return self._graphs.get(run)

    # ----- history ----------------------------------------------------------------------------

    def runs(self) -> list[JournalRun]:
        """Every run the journal holds, the newest first."""
        return [self._record(row) for row in self._store.runs()]

    def run(self, name: str) -> JournalRun:
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
        """Removes runs that ended more than ``older_than`` seconds ago (none running), with
        what they recorded; how many runs."""
        return self._store.prune(older_than)

    def _record(self, row: RunRow) -> JournalRun:
        status = row.status
        if status == "running" and (
            row.lease_until is None
            or row.lease_until < time.time()
            or _holders.gone(row.holder_process)
        ):
            status = "abandoned"
        questions = (
            {path: shown for path, _, shown in self._store.open_questions(row.id)}
            if status == "paused"
            else {}
        )
        return JournalRun(
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
            stream=row.kind in STREAM_KINDS,
        )


def _asked(raised: BaseException) -> bool:
    """Whether ``raised`` is a node's question (alone, or among a group's — a ``TaskGroup``
    in an async node gathers what its tasks raised)."""
    return isinstance(_observe.pausing(raised), Asked)


class StreamRun:
    """A stream's run (``g.map``/``g.amap`` with ``run=``), held from the call that made the
    stream until the stream ends (:class:`soma._run.stream.Held`, which the stream tells).

    ``recording`` is the stream's cache: every item's nodes are keyed by content, as
    ``forward(item, cache=...)`` keys them, so a node an item recorded is answered from the
    journal whichever call of ``map`` recorded it. The run is current (``ctx.effect``,
    ``ctx.ask`` find it) while the stream reads its items, each of which runs in a copy of the
    context it was read in. It ends once: ``finished`` when the stream ran out with every item
    done; ``failed`` when an item's error ended it, when items failed and were skipped or
    collected (the error names how many, and the first: they run again when ``map`` is called
    again), or when the stream was closed or dropped before its end; ``paused`` when an item's
    node asked a question (:class:`Paused`, raised by the stream in place of that item's
    result, whatever ``on_error`` says: a question is no failure of the item)."""

    __slots__ = ("_active", "_ended", "_journal", "_lock", "recording")

    def __init__(self, journal: Journal, active: ActiveRun, recording: Recording) -> None:
        self._journal = journal
        self._active = active
        self._lock = threading.Lock()
        self._ended = False
        self.recording = recording

    def entered(self) -> contextvars.Token[ActiveRun | None]:
        """Makes the run current here, while the stream reads items; undone by ``left``."""
        return ACTIVE.set(self._active)

    def left(self, token: contextvars.Token[ActiveRun | None]) -> None:
        ACTIVE.reset(token)

    def pauses(self, exception: BaseException) -> bool:
        """Whether an item's ``exception`` is a node's question, which pauses the stream."""
        return _asked(exception)

    def ended(
        self, raised: BaseException | None, failed: int, first: Failed | None
    ) -> BaseException | None:
        """Ends the run as the stream ended: ran out (``raised`` ``None``) with ``failed`` items
        failed (``first`` the first), or cut off by ``raised``; what the stream raises instead
        of ``raised`` (a :class:`Paused`), if anything. Once: a second end is a no-op."""
        with self._lock:
            if self._ended:
                return None
            self._ended = True
        if raised is not None:
            return self._journal._ended(self._active, raised)
        if failed:
            assert first is not None
            where = f" at node `{first.node}`" if first.node is not None else ""
            self._journal._end(
                self._active,
                "failed",
                f"{failed} item{'s' if failed > 1 else ''} failed; the first, item "
                f"{first.index}{where}: {type(first.exception).__name__}: {first.exception}",
            )
        else:
            self._journal._end(self._active, "finished", None)
        return None

    def closed(self) -> None:
        """Ends the run as the stream was closed, or dropped, before its end."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._journal._end(self._active, "failed", "the stream was closed before its end")


def runs(journal: Journal) -> list[JournalRun]:
    """Every run ``journal`` holds, the newest first: each a :class:`JournalRun` (``.id``,
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
