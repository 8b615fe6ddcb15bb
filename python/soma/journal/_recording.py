"""A run with a journal as the engine asks it: the run cache of ``crates/soma-python/src/cache.rs``
(the same eight methods a :class:`soma.Cache` answers), so the journal hooks into the one place a
node's call ends in both walks — ``put`` — and resume is a rerun whose cache is the journal.

A node whose key the run recorded is answered from the journal; any other is asked of the run's
cache, when it has one (a hit there is not copied into the journal: a resume asks the cache
again); a node that runs is recorded as it returns. Keys are the cache's own: an edited node
runs again on resume, and what depends on it. A node the cache keeps out (``cacheable =
False``, state that cannot be digested) is still recorded, under a key of its run, its id, its
code and its ``cache_key()``'s answer when it has one, so that a resumed run gets back what it
returned rather than calling it again. A slice of a graph with hosts is such a node here
(``soma.remote``): recorded by the caller when the slice returns, keyed by its nodes'
fingerprints, which its ``cache_key()`` answers.
"""

from __future__ import annotations

import hashlib
import os
import types
from typing import TYPE_CHECKING, Any

from soma.cache import _fingerprint
from soma.cache._cache import Cache

if TYPE_CHECKING:
    from soma import _soma
    from soma.cache._cache import _RunCache
    from soma.journal._active import ActiveRun


class Recording:
    """What ``forward`` hands the engine as its cache for a run with a journal."""

    __slots__ = ("_active", "_cache", "_plain")

    def __init__(self, active: ActiveRun, cache: Cache | None, plain: Cache) -> None:
        self._active = active
        self._cache = cache
        # Fingerprints and digests as a cache takes them, without one to keep outputs in.
        self._plain = plain

    @property
    def cache(self) -> Cache | None:
        """The user's :class:`soma.Cache` behind the journal, if the run was given one."""
        return self._cache

    def _run(self, core: _soma.GraphCore) -> _RecordingRun:
        cache = self._cache
        return _RecordingRun(
            self._active,
            core,
            (cache if cache is not None else self._plain)._run(core),
            cache is not None,
        )


class _RecordingRun:
    """One run's lookups and records (see ``crates/soma-python/src/cache.rs``)."""

    __slots__ = (
        "_active",
        "_core",
        "_has_cache",
        "_inner",
        "_unkeyed",
        "digest",
        "digest_items",
        "input_digest",
        "input_digest_items",
    )

    def __init__(
        self, active: ActiveRun, core: _soma.GraphCore, inner: _RunCache, has_cache: bool
    ) -> None:
        self._active = active
        self._core = core
        self._inner = inner
        self._has_cache = has_cache
        # Nodes keyed by the journal alone (kept out of the cache): never filed in the cache.
        self._unkeyed: set[str] = set()
        # Values are digested as the cache digests them, with or without a cache: what an
        # `each`'s item runs are keyed on included.
        self.digest = inner.digest
        self.digest_items = inner.digest_items
        self.input_digest = inner.input_digest
        self.input_digest_items = inner.input_digest_items

    def fingerprint(self, node_id: str) -> bytes | None:
        if self._has_cache:
            found = self._inner.fingerprint(node_id)
        else:
            node = self._core.implementation(node_id)
            found = None
            if getattr(node, "cacheable", True) is not False:
                try:
                    found = _fingerprint.fingerprint(node)
                except Exception:  # Unkeyable state: keyed by the journal alone, below.
                    found = None
        if found is not None:
            return found
        self._unkeyed.add(node_id)
        return self._run_fingerprint(node_id)

    def _run_fingerprint(self, node_id: str) -> bytes:
        """A node kept out of the cache, keyed for this run alone: its output is this run's,
        never another's."""
        node = self._core.implementation(node_id)
        code = b""
        forward = getattr(type(node), "forward", None)
        if isinstance(forward, types.FunctionType):
            code = _fingerprint._code_digest(forward.__code__)
        said = b""
        hook = getattr(node, "cache_key", None)
        if hook is not None:
            try:
                said = _fingerprint.digest(hook())
            except Exception:  # What it said has no digest: a key no other call has.
                said = os.urandom(32)
        return hashlib.blake2b(
            b"\0".join(
                (
                    b"soma-journal-run",
                    self._active.name.encode(),
                    node_id.encode(),
                    _fingerprint._qualified(type(node)).encode(),
                    code,
                    said,
                )
            ),
            digest_size=32,
        ).digest()

    def get(self, key: bytes) -> tuple[bool, Any, bytes | None]:
        if key in self._active.done:
            found, output = self._active.output(key)
            if found:
                return True, output, self._active.done[key].digest
        return self._inner.get(key) if self._has_cache else (False, None, None)

    def peek(self, key: bytes) -> tuple[bool, bytes | None]:
        if key in self._active.done:
            return True, self._active.done[key].digest
        return self._inner.peek(key) if self._has_cache else (False, None)

    def find(self, key: bytes) -> tuple[bool, bytes | None, bool, object]:
        if key in self._active.done:
            return True, self._active.done[key].digest, False, _Recorded(key)
        return self._inner.find(key) if self._has_cache else (False, None, False, None)

    def read(self, unread: object) -> tuple[bool, Any]:
        if isinstance(unread, _Recorded):
            return self._active.output(unread.key)
        return self._inner.read(unread)

    def put(
        self, node_id: str, key: bytes, output: object, digest: bytes | None, seconds: float
    ) -> None:
        self._active.finished(node_id, key, output, digest, seconds)
        if self._has_cache and node_id not in self._unkeyed:
            self._inner.put(node_id, key, output, digest, seconds)


class _Recorded:
    """An output the journal holds, not read yet."""

    __slots__ = ("key",)

    def __init__(self, key: bytes) -> None:
        self.key = key
