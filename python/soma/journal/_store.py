"""Where a journal keeps its runs: one SQL store with two homes, an SQLite file (the embedded
default, nothing to start) and a PostgreSQL database (shared by processes and machines).

A journal holds positions and keys, not snapshots: for each node that finished in a run, the key
it ran under (the cache's key), and its output, in one row of the run's. Rows are kept in the
order they are written (a row number), found by run through an index in the same order, so a
batch of nodes is appended to the last pages of the file, whatever the run's size: rows ordered
by key — random, a digest — put each node of a batch on a page of its own once a run outgrew a
few hundred pages (a 100,000-node chain wrote a 4 kB page a node, and wrote it again at the next
checkpoint), and an output kept once by key for every run did so from the first node. A row is
found by key only where a run is taken up: its keys are read once then (``done``), each with its
row's number, and its outputs read by that number. Nothing stops a key being written twice (two
nodes of a run with equal code, state and input; two processes that both held a run, a lease
lapsed under a holder still at work): every reader takes a key's first row.
Effects and questions are kept by the call that made them and their ordinal in it.
Both homes run the same statements (placeholders told apart), so nothing here is written twice.

Every method takes the store's lock: one connection serves every thread of the process, and a
write of one run never interleaves with another's. A process forked from one that holds a store
gets a connection and a lock of its own (a connection is never shared across a fork).
Writes are grouped (`write`) so that a run pays for a transaction per batch of nodes, not per
node; a batch is one transaction, so a node is never durable without the nodes that finished
before it — never after one that read its output.

Where the homes differ, one statement serves both: SQLite serialises writers (a write
transaction takes the file's lock), PostgreSQL lets them run at once, so a run is begun by an
``INSERT ... ON CONFLICT DO NOTHING`` that loses to another process's without an error, a run
taken up is locked (``FOR UPDATE``) while its lease is read, and the tables are made under a
lock of the database's (``CREATE TABLE IF NOT EXISTS`` races on PostgreSQL). A journal made
before rows were kept in order (its ``done`` keyed by run and key) is brought to this layout as
it is opened, under the same lock.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from soma.errors import JournalError, RunHeldError
from soma.journal._holders import gone, this_process

#: Node ids looked up in one statement: well under SQLite's limit of bound values (32,766) and
#: PostgreSQL's (65,535).
_NAMES_AT_ONCE = 500

#: A run's status as kept. ``abandoned`` is never kept: it is how a ``running`` run whose holder
#: stopped renewing its lease reads.
STATUSES = ("running", "paused", "failed", "finished")

_SCHEMA_SQLITE = (
    """CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY,
        name TEXT UNIQUE NOT NULL,
        graph TEXT NOT NULL,
        nodes INTEGER NOT NULL,
        kind TEXT NOT NULL,
        input BLOB,
        input_digest BLOB,
        input_sig BLOB,
        status TEXT NOT NULL,
        started REAL NOT NULL,
        ended REAL,
        seconds REAL NOT NULL DEFAULT 0,
        error TEXT,
        holder TEXT,
        holder_process TEXT,
        lease_until REAL
    )""",
    "CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL)",
    """CREATE TABLE IF NOT EXISTS done (
        id INTEGER PRIMARY KEY,
        run INTEGER NOT NULL, key BLOB NOT NULL, node INTEGER NOT NULL, seconds REAL NOT NULL,
        digest BLOB, payload BLOB NOT NULL, sig BLOB
    )""",
    "CREATE INDEX IF NOT EXISTS done_by_run ON done (run, id)",
    """CREATE TABLE IF NOT EXISTS effects (
        run INTEGER NOT NULL, call BLOB NOT NULL, ordinal INTEGER NOT NULL,
        result BLOB NOT NULL, sig BLOB, PRIMARY KEY (run, call, ordinal)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS questions (
        run INTEGER NOT NULL, call BLOB NOT NULL, ordinal INTEGER NOT NULL, path TEXT NOT NULL,
        question BLOB NOT NULL, shown TEXT NOT NULL, answer BLOB, sig BLOB,
        PRIMARY KEY (run, call, ordinal)
    ) WITHOUT ROWID""",
)

_SCHEMA_POSTGRES = tuple(
    statement.replace("INTEGER PRIMARY KEY,", "BIGSERIAL PRIMARY KEY,")
    .replace("id INTEGER PRIMARY KEY, name", "id BIGSERIAL PRIMARY KEY, name")
    .replace("BLOB", "BYTEA")
    .replace("REAL", "DOUBLE PRECISION")
    .replace("run INTEGER", "run BIGINT")
    .replace("node INTEGER", "node BIGINT")
    .replace(") WITHOUT ROWID", ")")
    for statement in _SCHEMA_SQLITE
)

#: The lock of the database's (``pg_advisory_xact_lock``) that PostgreSQL processes make the
#: tables under, one at a time: an arbitrary number, "soma" in ASCII.
_SCHEMA_LOCK = 0x736F6D61


@dataclass(frozen=True)
class RunRow:
    """A run as kept: what ``soma.runs`` lists."""

    id: int
    name: str
    graph: str
    nodes: int
    kind: str
    status: str
    started: float
    ended: float | None
    seconds: float
    error: str | None
    holder: str | None
    lease_until: float | None
    holder_process: str | None
    done: int


@dataclass(frozen=True)
class Started:
    """A run begun or taken up by ``Store.start``."""

    id: int
    #: Whether the journal held the run already (a resume).
    existing: bool
    #: The pickled input and its signature, as first recorded.
    input: bytes | None
    input_sig: bytes | None
    input_digest: bytes | None


class Store:
    """A journal's tables, in an SQLite file or a PostgreSQL database (``target`` a
    ``postgresql://`` URL)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.postgres = target.startswith(("postgresql://", "postgres://"))
        self._lock = threading.RLock()
        self._names: dict[str, int] = {}
        self._pid = os.getpid()
        self._connection: Any = self._connect()
        _OPEN.add(self)
        # SQLite's write lock taken at once: a table read, then written, by two processes
        # opening one file at the same moment.
        with self._transaction(immediate=True) as cursor:
            if self.postgres:
                cursor.execute(f"SELECT pg_advisory_xact_lock({_SCHEMA_LOCK})")
            ordered = self._done_in_order(cursor)
            if ordered is False:  # Made before rows were kept in order: kept under a new name.
                cursor.execute("ALTER TABLE done RENAME TO done_by_key")
            for statement in _SCHEMA_POSTGRES if self.postgres else _SCHEMA_SQLITE:
                cursor.execute(statement)
            if ordered is False:
                cursor.execute(
                    "INSERT INTO done (run, key, node, seconds, digest, payload, sig)"
                    " SELECT run, key, node, seconds, digest, payload, sig FROM done_by_key"
                    " ORDER BY run, key"
                )
                cursor.execute("DROP TABLE done_by_key")

    def _done_in_order(self, cursor: _Cursor) -> bool | None:
        """Whether the ``done`` table keeps its rows in order (has a row number); ``None``
        where there is none yet."""
        if self.postgres:
            cursor.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND table_name = 'done'"
            )
        else:
            cursor.execute("SELECT name FROM pragma_table_info('done')")
        columns = {row[0] for row in cursor.fetchall()}
        return None if not columns else "id" in columns

    def _connect(self) -> Any:
        if self.postgres:
            try:
                import psycopg
            except ImportError as missing:
                raise ImportError(
                    "a PostgreSQL journal needs psycopg 3: pip install 'soma[postgres]'"
                ) from missing
            return psycopg.connect(self.target, autocommit=True)
        connection = sqlite3.connect(
            self.target, check_same_thread=False, isolation_level=None, timeout=30.0
        )
        # WAL: readers never wait for the writer, and a commit is one append. NORMAL: a commit
        # survives the process being killed at any instant; only the machine losing power can
        # lose the last ones (each then runs again on resume).
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    def _sql(self, statement: str) -> str:
        return statement.replace("?", "%s") if self.postgres else statement

    def _forked(self) -> None:
        """Run in a process just forked from this one (``os.register_at_fork``): a lock another
        thread held at the fork would never be released here, so the child has its own; and a
        PostgreSQL connection is let go at once, before any thread of the child can use it."""
        self._lock = threading.RLock()
        if self.postgres:
            self._let_go()

    def _let_go(self) -> None:
        """Forgets the connection of the process this one was forked from; the next use makes
        one of its own. A PostgreSQL connection is not closed, which would end the parent's
        session (the goodbye goes down the socket they share); it is dropped unclosed, as
        psycopg itself does in a child, its warning about that silenced. SQLite's is dropped
        on its first use in the child, as it always was."""
        self._pid = os.getpid()
        self._names = {}
        inherited, self._connection = self._connection, None
        if self.postgres and inherited is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                del inherited
                gc.collect()  # Its cycles go now, while the warning is silenced.

    def _connected(self) -> Any:
        """The store's connection, made again in a forked process and after a PostgreSQL
        connection broke (the server restarted, say, or ended the session)."""
        if os.getpid() != self._pid:  # SQLite's, or a fork no hook saw (one made by C code).
            self._let_go()
        connection = self._connection
        if connection is None or (self.postgres and connection.broken):
            self._names = {}
            connection = self._connection = self._connect()
        return connection

    @contextmanager
    def _transaction(self, immediate: bool = False) -> Iterator[Any]:
        """One transaction, under the store's lock: committed when the block ends, rolled back
        when it raises. ``immediate`` takes SQLite's write lock at once, so that a read then a
        write in it cannot be overtaken by another process."""
        with self._lock:
            connection = self._connected()
            if self.postgres:
                with ExitStack() as stack:
                    try:
                        stack.enter_context(connection.transaction())
                    except Exception:
                        # Its BEGIN found the connection broken: nothing was done, so begun
                        # again on a new one, once. (A statement that finds it broken fails.)
                        if not connection.broken:
                            raise
                        connection = self._connected()
                        stack.enter_context(connection.transaction())
                    cursor = stack.enter_context(connection.cursor())
                    try:
                        yield _Cursor(cursor, self._sql)
                    except BaseException:
                        self._names.clear()  # Names it added are gone with it.
                        raise
                return
            cursor = connection.cursor()
            cursor.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
            try:
                yield _Cursor(cursor, self._sql)
            except BaseException:
                connection.execute("ROLLBACK")
                self._names.clear()  # Names it added are gone with it.
                raise
            connection.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:  # None in a forked child that never used it.
                self._connection.close()

    def __del__(self, getpid: Callable[[], int] = os.getpid) -> None:
        # A journal let go unclosed (one a module made, say) closes its connection rather than
        # leave it to the driver, which complains (psycopg's ResourceWarning) — except a
        # parent's, in a forked process no hook told: closing that one ends the parent's.
        # (`getpid` is bound early: at the interpreter's exit, this module's names may be gone.)
        connection = getattr(self, "_connection", None)
        if connection is not None and self._pid == getpid():
            connection.close()

    # ----- runs -------------------------------------------------------------------------------

    def start(
        self,
        name: str,
        *,
        graph: str,
        nodes: int,
        kind: str,
        input: bytes | None,
        input_sig: bytes | None,
        input_digest: bytes | None,
        holder: str,
        lease_seconds: float,
        same_input: bool,
    ) -> Started:
        """Begins run ``name``, or takes it up where the journal holds it: either way it is
        ``running``, held by ``holder`` (this process) for ``lease_seconds``. Refused with
        ``RunHeldError`` while another holder's lease runs and that holder is not known to have
        ended (``soma.journal._holders``), and, with ``same_input``, with ``JournalError`` when
        the run was begun on an input of another digest."""
        now = time.time()
        process = this_process()
        lock = " FOR UPDATE" if self.postgres else ""
        with self._transaction(immediate=True) as cursor:
            # Begun here unless the run is there already, or another process begins it now: on
            # PostgreSQL, that one's insert is waited for, and this one's then does nothing.
            cursor.execute(
                "INSERT INTO runs (name, graph, nodes, kind, input, input_digest, input_sig,"
                " status, started, holder, holder_process, lease_until) VALUES (?, ?, ?, ?, ?,"
                " ?, ?, 'running', ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING RETURNING id",
                (
                    name,
                    graph,
                    nodes,
                    kind,
                    input,
                    input_digest,
                    input_sig,
                    now,
                    holder,
                    process,
                    now + lease_seconds,
                ),
            )
            begun = cursor.fetchone()
            if begun is not None:
                return Started(int(begun[0]), False, input, input_sig, input_digest)
            # Taken up: locked until this transaction ends, so that of two processes taking it
            # up at once, the second reads the first's lease.
            cursor.execute(
                "SELECT id, holder, holder_process, lease_until, input, input_sig, input_digest"
                f" FROM runs WHERE name = ?{lock}",
                (name,),
            )
            run, held_by, held_in, until, kept, kept_sig, kept_digest = cursor.fetchone()
            # Held while its lease runs, unless its holder is a process of this machine that
            # has ended (killed, crashed): then it is taken at once, not once the lease lapses.
            if held_by is not None and until is not None and until > now and not gone(held_in):
                raise _held(name, held_by, until)
            if same_input and (kept_digest is None or bytes(kept_digest) != input_digest):
                raise journal_error(
                    name,
                    f"run `{name}` is in the journal with another input: a run id names one "
                    "run\nhint: resume it with g.resume(run, journal=j), or give this one "
                    "another id",
                )
            cursor.execute(
                "UPDATE runs SET status = 'running', holder = ?, holder_process = ?,"
                " lease_until = ?, ended = NULL, error = NULL, graph = ?, nodes = ? WHERE id = ?",
                (holder, process, now + lease_seconds, graph, nodes, run),
            )
            return Started(
                run,
                True,
                None if kept is None else bytes(kept),
                None if kept_sig is None else bytes(kept_sig),
                None if kept_digest is None else bytes(kept_digest),
            )

    def renew(self, runs: Sequence[int], holder: str, lease_seconds: float) -> None:
        """Extends the leases ``holder`` holds on ``runs``."""
        until = time.time() + lease_seconds
        with self._transaction() as cursor:
            for run in runs:
                cursor.execute(
                    "UPDATE runs SET lease_until = ? WHERE id = ? AND holder = ?",
                    (until, run, holder),
                )

    def end(self, run: int, holder: str, status: str, error: str | None, seconds: float) -> None:
        """Ends ``holder``'s hold on ``run``, leaving it ``status``."""
        with self._transaction() as cursor:
            cursor.execute(
                "UPDATE runs SET status = ?, error = ?, ended = ?, seconds = seconds + ?,"
                " holder = NULL, holder_process = NULL, lease_until = NULL"
                " WHERE id = ? AND holder = ?",
                (status, error, time.time(), seconds, run, holder),
            )

    def run(self, name: str) -> RunRow | None:
        rows = self._runs("WHERE r.name = ?", (name,))
        return rows[0] if rows else None

    def runs(self) -> list[RunRow]:
        """Every run, the newest first."""
        return self._runs("", ())

    def _runs(self, where: str, parameters: tuple[Any, ...]) -> list[RunRow]:
        with self._transaction() as cursor:
            cursor.execute(
                "SELECT r.id, r.name, r.graph, r.nodes, r.kind, r.status, r.started, r.ended,"
                " r.seconds, r.error, r.holder, r.lease_until, r.holder_process,"
                " (SELECT COUNT(DISTINCT d.key) FROM done d WHERE d.run = r.id)"
                f" FROM runs r {where} ORDER BY r.started DESC, r.id DESC",
                parameters,
            )
            return [RunRow(*row) for row in cursor.fetchall()]

    def input(self, name: str) -> tuple[str, bytes | None, bytes | None] | None:
        """Run ``name``'s kind and its input as recorded (pickled, with its signature)."""
        with self._transaction() as cursor:
            cursor.execute("SELECT kind, input, input_sig FROM runs WHERE name = ?", (name,))
            row = cursor.fetchone()
        if row is None:
            return None
        kind, payload, sig = row
        return kind, _bytes(payload), _bytes(sig)

    def prune(self, older_than: float) -> int:
        """Removes the runs not running that ended (or began) more than ``older_than`` seconds
        ago, with their nodes, effects and questions; how many."""
        cut = time.time() - older_than
        with self._transaction(immediate=True) as cursor:
            cursor.execute(
                "SELECT id FROM runs WHERE COALESCE(ended, started) < ?"
                " AND (holder IS NULL OR lease_until < ?)",
                (cut, time.time()),
            )
            gone = [row[0] for row in cursor.fetchall()]
            for run in gone:
                for table in ("done", "effects", "questions"):
                    cursor.execute(f"DELETE FROM {table} WHERE run = ?", (run,))
                cursor.execute("DELETE FROM runs WHERE id = ?", (run,))
        return len(gone)

    # ----- what finished ----------------------------------------------------------------------

    def _numbers(self, cursor: _Cursor, names: Iterable[str]) -> dict[str, int]:
        """The numbers of ``names`` in the names table (and of every name known before): the
        ones not known yet added and read back a few hundred at a time, two statements for
        them all rather than two a name — a resume in a new process meets every node's name
        for the first time."""
        missing = sorted({name for name in names if name not in self._names})
        for at in range(0, len(missing), _NAMES_AT_ONCE):
            chunk = missing[at : at + _NAMES_AT_ONCE]
            cursor.executemany(
                "INSERT INTO names (name) VALUES (?) ON CONFLICT DO NOTHING",
                [(name,) for name in chunk],
            )
            cursor.execute(
                f"SELECT id, name FROM names WHERE name IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
            for number, name in cursor.fetchall():
                self._names[name] = int(number)
        return self._names

    def write(self, run: int, finished: Iterable[Finished]) -> None:
        """Records ``finished`` nodes of ``run``, in the order given, in one transaction."""
        with self._transaction() as cursor:
            self._write(cursor, run, finished)

    def _write(self, cursor: _Cursor, run: int, finished: Iterable[Finished]) -> None:
        # In the order they finished, appended: no row is locked by another writer's.
        entries = list(finished)
        numbers = self._numbers(cursor, [entry.node for entry in entries])
        cursor.executemany(
            "INSERT INTO done (run, key, node, seconds, digest, payload, sig)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run,
                    entry.key,
                    numbers[entry.node],
                    entry.seconds,
                    entry.digest,
                    entry.payload,
                    entry.sig,
                )
                for entry in entries
            ],
        )

    def done(self, run: int) -> dict[bytes, Done]:
        """What ``run`` recorded as finished: each key with its output's digest and its row
        (the first row of a key written twice)."""
        recorded: dict[bytes, Done] = {}
        with self._transaction() as cursor:
            cursor.execute("SELECT key, digest, id FROM done WHERE run = ? ORDER BY id", (run,))
            for key, digest, row in cursor:
                recorded.setdefault(bytes(key), Done(_bytes(digest), int(row)))
        return recorded

    def output(self, row: int) -> tuple[bytes, bytes | None] | None:
        """The output recorded in ``row`` (of ``done``), pickled, with its signature."""
        with self._transaction() as cursor:
            cursor.execute("SELECT payload, sig FROM done WHERE id = ?", (row,))
            found = cursor.fetchone()
        return None if found is None else (bytes(found[0]), _bytes(found[1]))

    def nodes(self, run: int) -> list[tuple[str, float, int]]:
        """The nodes ``run`` recorded finished: id, seconds, and the size of the output."""
        with self._transaction() as cursor:
            cursor.execute(
                "SELECT n.name, d.seconds, LENGTH(d.payload) FROM done d"
                " JOIN names n ON n.id = d.node WHERE d.id IN"
                " (SELECT MIN(id) FROM done WHERE run = ? GROUP BY key) ORDER BY n.name",
                (run,),
            )
            return [(name, seconds, size) for name, seconds, size in cursor]

    # ----- effects and questions --------------------------------------------------------------

    def effect(self, run: int, call: bytes, ordinal: int) -> tuple[bytes, bytes | None] | None:
        with self._transaction() as cursor:
            cursor.execute(
                "SELECT result, sig FROM effects WHERE run = ? AND call = ? AND ordinal = ?",
                (run, call, ordinal),
            )
            row = cursor.fetchone()
        return None if row is None else (bytes(row[0]), _bytes(row[1]))

    def record_effect(
        self,
        run: int,
        call: bytes,
        ordinal: int,
        result: bytes,
        sig: bytes | None,
        finished: Iterable[Finished],
    ) -> None:
        """Records an effect's result, after the nodes that finished before it (``finished``)."""
        with self._transaction() as cursor:
            self._write(cursor, run, finished)
            cursor.execute(
                "INSERT INTO effects (run, call, ordinal, result, sig) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (run, call, ordinal, result, sig),
            )

    def answer_of(self, run: int, call: bytes, ordinal: int) -> tuple[bytes, bytes | None] | None:
        """The answer to question ``ordinal`` of ``call``, when it has one."""
        with self._transaction() as cursor:
            cursor.execute(
                "SELECT answer, sig FROM questions WHERE run = ? AND call = ? AND ordinal = ?",
                (run, call, ordinal),
            )
            row = cursor.fetchone()
        if row is None or row[0] is None:
            return None
        return bytes(row[0]), _bytes(row[1])

    def ask(
        self, run: int, call: bytes, ordinal: int, node: str, question: bytes, shown: str
    ) -> str:
        """Records question ``ordinal`` of ``call`` (a call of ``node``), open, and returns the
        path it is answered by: the node's id, or, where another call of the same node has a
        question open in the run, the id and a short mark of the call."""
        with self._transaction(immediate=True) as cursor:
            cursor.execute(
                "SELECT path FROM questions WHERE run = ? AND call = ? AND ordinal = ?",
                (run, call, ordinal),
            )
            row = cursor.fetchone()
            if row is not None:
                return str(row[0])
            cursor.execute(
                "SELECT COUNT(*) FROM questions WHERE run = ? AND path = ? AND call <> ?"
                " AND answer IS NULL",
                (run, node, call),
            )
            path = node if cursor.fetchone()[0] == 0 else f"{node}@{call.hex()[:8]}"
            cursor.execute(
                "INSERT INTO questions (run, call, ordinal, path, question, shown)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (run, call, ordinal, path, question, shown),
            )
            return path

    def forget_open_questions(self, run: int) -> None:
        """Removes ``run``'s unanswered questions, as a run is taken up: each node that asked
        one never finished, so runs again and asks again, and one no node asks now (its node
        edited, or reading another input since) is no longer a question of the run."""
        with self._transaction(immediate=True) as cursor:
            cursor.execute("DELETE FROM questions WHERE run = ? AND answer IS NULL", (run,))

    def open_questions(self, run: int) -> list[tuple[str, bytes, str]]:
        """The questions of ``run`` with no answer: path, pickled question, as shown."""
        with self._transaction() as cursor:
            cursor.execute(
                "SELECT path, question, shown FROM questions WHERE run = ? AND answer IS NULL"
                " ORDER BY path",
                (run,),
            )
            return [(path, bytes(question), shown) for path, question, shown in cursor]

    def question_place(self, run: int, path: str) -> bytes | None:
        """The call and ordinal (an answer is signed over them) of the open question at
        ``path``; ``None`` when none is open there."""
        with self._transaction() as cursor:
            cursor.execute(
                "SELECT call, ordinal FROM questions WHERE run = ? AND path = ? AND answer IS NULL",
                (run, path),
            )
            row = cursor.fetchone()
        return None if row is None else bytes(row[0]) + int(row[1]).to_bytes(4, "big")

    def answer(self, run: int, path: str, answer: bytes, sig: bytes | None) -> bool:
        """Answers the open question at ``path``; whether there was one."""
        with self._transaction(immediate=True) as cursor:
            cursor.execute(
                "UPDATE questions SET answer = ?, sig = ? WHERE run = ? AND path = ?"
                " AND answer IS NULL",
                (answer, sig, run, path),
            )
            return bool(cursor.rowcount)


class Done(NamedTuple):
    """A key a run recorded: its output's digest, and the row its output is in."""

    digest: bytes | None
    row: int


class Finished(NamedTuple):
    """A node that finished, to be written: the key it ran under, the node, its seconds, its
    output pickled, with the output's digest and the entry's signature. A tuple: one is made
    for every node a run records, and a frozen dataclass costs twice as much to make."""

    key: bytes
    node: str
    seconds: float
    digest: bytes | None
    payload: bytes
    sig: bytes | None


class _Cursor:
    """A cursor of either driver, its statements written with ``?`` placeholders."""

    __slots__ = ("_cursor", "_sql")

    def __init__(self, cursor: Any, sql: Any) -> None:
        self._cursor = cursor
        self._sql = sql

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> None:
        self._cursor.execute(self._sql(statement), parameters)

    def executemany(self, statement: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._cursor.executemany(self._sql(statement), rows)

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cursor.fetchall())

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)


#: Every store open in this process, for the hook that runs in a forked child.
_OPEN: weakref.WeakSet[Store] = weakref.WeakSet()


def _forget_in_child() -> None:
    for store in list(_OPEN):
        store._forked()


os.register_at_fork(after_in_child=_forget_in_child)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _held(name: str, holder: str, until: float) -> RunHeldError:
    error = RunHeldError(
        f"run `{name}` is held by {holder} for {max(0.0, until - time.time()):.1f} s more "
        "(its lease is renewed while it runs; a holder that died lets it lapse)\n"
        "hint: wait for it to finish, or resume it once the lease has passed"
    )
    error.run = name
    error.holder = holder
    error.until = until
    return error


def journal_error(run: str, message: str) -> JournalError:
    error = JournalError(message)
    error.run = run
    return error
