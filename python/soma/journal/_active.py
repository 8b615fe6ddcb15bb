"""One run being run in this process under a journal: what it finds recorded, what it records as
its nodes finish, its effects and questions.

A node's output is recorded as soon as the engine files it (the run cache's ``put``, where a
node's call ends), in a batch the run writes every few milliseconds, at an effect, a question,
and its end: a process killed loses at most the last batch, whose nodes run again on resume. A
batch keeps the order the nodes finished in and is written in one transaction, so a node is
never recorded after a node that read its output.

The run is found by the calls of its nodes through a context variable, which every branch, item
and task of the run inherits (the engine runs each in a copy of the caller's context).
"""

from __future__ import annotations

import contextvars
import pickle
import threading
import time
import warnings
from typing import Any

from soma.errors import SignatureError
from soma.journal._signing import Signer
from soma.journal._store import Done, Finished, Store

#: Pending nodes past which a batch is written at once, whatever its age.
_BATCH = 256

#: The run the current node's call belongs to; ``None`` outside any run with a journal.
ACTIVE: contextvars.ContextVar[ActiveRun | None] = contextvars.ContextVar(
    "soma_journal_run", default=None
)


class JournalWarning(UserWarning):
    """What a journal could not record: the run goes on, and what was not recorded runs again
    on resume."""


class ActiveRun:
    """Run ``name`` (row ``id`` of ``store``), held by ``holder`` while it runs here."""

    def __init__(
        self,
        store: Store,
        signer: Signer,
        name: str,
        id: int,
        holder: str,
        done: dict[bytes, Done],
    ) -> None:
        self.store = store
        self.signer = signer
        self.name = name
        self.id = id
        self.holder = holder
        # What the run had recorded when it began, each key with its output's digest and row:
        # its lookups are answered from here.
        self.done = done
        self.started = time.perf_counter()
        self._pending: list[Finished] = []
        self._oldest = 0.0
        self._lock = threading.Lock()
        # Held from taking a batch to writing it (and an effect with it).
        self._writing = threading.Lock()
        self._warned: set[str] = set()
        # The questions asked while it ran here, by path: its open questions when it pauses (a
        # run taken up forgets the others), handed over as asked, never read back unpickled.
        self.asked: dict[str, object] = {}
        # An output refused while the run ran: the run fails with it when the engine returns.
        self.refused: SignatureError | None = None

    # ----- nodes ------------------------------------------------------------------------------

    def finished(
        self, node: str, key: bytes, output: object, digest: bytes | None, seconds: float
    ) -> None:
        """Records that ``node`` finished under ``key`` with ``output``."""
        try:
            payload = pickle.dumps(output, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:  # An output that does not pickle: it runs again on resume.
            self.warn(
                f"output:{node}",
                f"node `{node}`'s output is not recorded in run `{self.name}`: pickling it "
                f"raised `{type(error).__name__}: {error}`; it runs again on resume",
            )
            return
        sig = self.signer.sign(b"output", key, payload)
        self._add(Finished(key, node, seconds, digest, payload, sig))

    def _add(self, finished: Finished) -> None:
        with self._lock:
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending.append(finished)
            full = len(self._pending) >= _BATCH
        if full:
            self.flush()

    def take_pending(self) -> list[Finished]:
        with self._lock:
            pending, self._pending = self._pending, []
        return pending

    def flush(self) -> None:
        """Writes what finished since the last write: batches in the order they were taken,
        whichever thread writes them, so no node is durable after one that read it."""
        with self._writing:
            pending = self.take_pending()
            if pending:
                self.store.write(self.id, pending)

    def due(self, age: float) -> bool:
        """Whether the oldest unwritten node has waited ``age`` seconds."""
        with self._lock:
            return bool(self._pending) and time.monotonic() - self._oldest >= age

    def verify_recorded(self) -> None:
        """Raises ``SignatureError`` unless every output the run recorded verifies under the
        journal's key: checked as the run is taken up, before any node runs, because a lookup
        cannot fail a run (the engine reads a lookup that raised as a miss, and would call the
        node again)."""
        if not self.signer.signs:
            return
        for key, recorded in self.done.items():
            found = self.store.output(recorded.row)
            if found is not None:
                payload, sig = found
                self.signer.verify(
                    b"output", key, payload, sig, f"the output under key {key.hex()}"
                )

    def output(self, key: bytes) -> tuple[bool, Any]:
        """The recorded output under ``key``: ``(True, output)``, or ``(False, None)`` when it
        cannot be read (then computed again). One that does not verify under the journal's key
        (altered since the run was taken up) is never unpickled: read as a miss, its
        ``SignatureError`` kept in ``refused`` for the run to end with."""
        recorded = self.done.get(key)
        found = None if recorded is None else self.store.output(recorded.row)
        if found is None:
            return False, None
        payload, sig = found
        try:
            self.signer.verify(b"output", key, payload, sig, f"the output under key {key.hex()}")
        except SignatureError as error:
            with self._lock:
                if self.refused is None:
                    self.refused = error
            return False, None
        try:
            return True, pickle.loads(payload)
        except Exception:  # Its class has gone, say: the node computes it again.
            return False, None

    # ----- effects and questions --------------------------------------------------------------

    def effect(self, call: bytes, ordinal: int) -> tuple[bool, Any]:
        found = self.store.effect(self.id, call, ordinal)
        if found is None:
            return False, None
        result, sig = found
        place = call + ordinal.to_bytes(4, "big")
        self.signer.verify(b"effect", place, result, sig, f"effect {ordinal} of a call")
        return True, pickle.loads(result)

    def record_effect(self, node: str, call: bytes, ordinal: int, result: object) -> None:
        try:
            payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            self.warn(
                f"effect:{node}",
                f"an effect of node `{node}` is not recorded in run `{self.name}`: pickling "
                f"its result raised `{type(error).__name__}: {error}`; it runs again on resume",
            )
            return
        place = call + ordinal.to_bytes(4, "big")
        sig = self.signer.sign(b"effect", place, payload)
        with self._writing:
            self.store.record_effect(self.id, call, ordinal, payload, sig, self.take_pending())

    def answer(self, call: bytes, ordinal: int) -> tuple[bool, Any]:
        found = self.store.answer_of(self.id, call, ordinal)
        if found is None:
            return False, None
        answer, sig = found
        place = call + ordinal.to_bytes(4, "big")
        self.signer.verify(b"answer", place, answer, sig, f"answer {ordinal} of a call")
        return True, pickle.loads(answer)

    def ask(self, node: str, call: bytes, ordinal: int, question: object) -> str:
        """Records ``question``, open, after what finished before it; the path it is answered
        by."""
        self.flush()
        payload = pickle.dumps(question, protocol=pickle.HIGHEST_PROTOCOL)
        shown = question if isinstance(question, str) else repr(question)
        path = self.store.ask(self.id, call, ordinal, node, payload, shown)
        with self._lock:
            self.asked[path] = question
        return path

    def warn(self, topic: str, message: str) -> None:
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        warnings.warn(message, JournalWarning, stacklevel=3)


def answer_payload(signer: Signer, store: Store, run: int, path: str, answer: object) -> bool:
    """Records ``answer`` to the open question at ``path`` of ``run``; whether there was one.
    Signed over its call and ordinal, which the store knows by the path."""
    payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
    place = store.question_place(run, path)
    if place is None:
        return False
    return store.answer(run, path, payload, signer.sign(b"answer", place, payload))
