"""``soma.Cache``: outputs kept from one run to the next, so that a rerun computes only what
changed.

The engine decides what to look up (see the guide's "Running again"): it asks, for each node,
its fingerprint (here: :func:`soma.cache._fingerprint.fingerprint`), chains it with the keys of what
the node reads, and looks the key up before calling the node. This module keeps the entries:
in memory, or in a folder that several processes share.

A folder entry is written to a temporary file in the same folder and renamed into place, so a
process killed mid-write leaves a stray temporary file, never half an entry. It begins with a
record — the node that made it, its class, when, the seconds it took, the digest of the output
and the checksum of its payload, itself checksummed — which a hit reads alone when the
engine leaves the output unread (``find``, read later by ``read`` if a node that runs needs
it), and ``python -m soma.cache`` lists and prunes by. Its payload is the output pickled, its
large buffers (a numeric column, an array, Arrow's buffers) apart: written to the file straight
from the output's memory rather than copied into the pickle, and read back as views of the
file's bytes; the glue writes them while a second thread checksums the same bytes
(``soma._soma.write_hashed``), the head that holds the checksum written last, at the start.
The checksum is XXH3-128, which finds damage at memory speed, or BLAKE3 in an entry sealed
with the cache's key, whose seal is worth only what the checksum it covers cannot be forged to
(see ``_MAGIC``). One truncated or corrupted since is detected when read, counted, and computed
again, never returned. A folder that cannot be written (full, read-only) makes the run go on
uncached, with one warning per cache.

A folder's size bound holds across processes: the bytes its entries hold are counted in the
file ``.held`` beside them, and an entry is renamed into place only under an advisory lock on
``.lock`` (``flock``), after the count says it fits — or after a scan of the folder has found
the true size and removed the least recently used entries until it does. The count is never
below the truth (an entry written over, or removed by ``--clear``, leaves it high, which only
brings the next scan sooner), so once every writer is a ``soma.Cache`` with the bound, the
folder's entries never hold more than it.
"""

from __future__ import annotations

import contextlib
import copyreg
import dataclasses
import hmac
import io
import os
import pickle
import struct
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

try:
    import fcntl
except ImportError:  # Not on Windows: there the bound holds per process only.
    fcntl = None  # type: ignore[assignment]

from soma import _soma
from soma.cache import _fingerprint

if TYPE_CHECKING:  # `soma._graph` imports this module: the graph is named for the typing only.
    from soma._graph import Graph


class CacheWarning(UserWarning):
    """A cache could not do something and the run went on without it: a node whose state has
    no key ran uncached, an output that does not pickle was not kept, a folder could not be
    written."""


@dataclasses.dataclass(frozen=True)
class CacheStats:
    """What a :class:`Cache` did since it was made: lookups that found an entry (``hits``) and
    that did not (``misses``, a corrupted entry among them, also counted in ``corrupted``),
    bytes read from and written to its store (``bytes_read``, ``bytes_written``),
    ``seconds_saved``, the time the nodes that hit had taken to compute their outputs, and
    ``evicted``, the entries it removed to stay within ``max_bytes``."""

    hits: int = 0
    misses: int = 0
    corrupted: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds_saved: float = 0.0
    evicted: int = 0


# An entry: this mark; the checksum (BLAKE3) of its record; the record — the payload's length
# and checksum (XXH3-128: its 16 bytes, then 16 zeros), the seconds computing it took, when it
# was made (seconds since the epoch), whether it has a content digest and that digest (zeros
# when not), and the lengths of the id of the node that made it and of its class's name — then
# that id and that name (UTF-8), then the payload (the output, pickled). A hit whose output no
# node that runs reads reads the record alone (`Cache._find`); the command (`python -m
# soma.cache`) lists and prunes by it.
_MAGIC = b"SOMA-CACHE-4\n"
# The same, its payload's checksum BLAKE3: what entries were before XXH3, read as they are.
# XXH3-128 checksums 240 MB in 16 ms where BLAKE3 takes 38 on two threads, which every read of
# an entry pays, and a write on its second thread (68.5 against 58.4 ms for the entry written,
# medians, 2026-12-07; BENCHMARKS.md).
_MAGIC_BLAKE3 = b"SOMA-CACHE-3\n"
# An entry of a cache with a key: as `_MAGIC_BLAKE3`, with its seal (HMAC-SHA256 of its key
# and record, `Cache._seal`) after the record; what a cache with the key accepts, and no other.
# Its payload's checksum stays BLAKE3: the seal covers the checksum, and a checksum that bytes
# can be made to match on purpose (XXH3's) would let another payload through under the seal.
_SIGNED = b"SOMA-CACHE-3S"
_SEAL = 32
# The checksums a payload may carry: which one, its mark says.
_Algorithm = Literal["xxh3", "blake3"]
assert len(_SIGNED) == len(_MAGIC) == len(_MAGIC_BLAKE3)
_CHECKSUM = 32
_RECORD = struct.Struct("<Q32sdd?32sHH")
_RECORD_AT = len(_MAGIC) + _CHECKSUM
# The longest id or class name kept in a record (UTF-8 bytes): longer ones are cut.
_NAME_BYTES = 1000
# What a hit reads first: a whole record, whatever its names, and the whole of a small entry.
_HEAD_BYTES = 4096
assert _RECORD_AT + _RECORD.size + 2 * _NAME_BYTES <= _HEAD_BYTES
# A hit marks its entry used at most this often in a folder without a bound (where nothing
# is evicted by it): marking it on every hit would cost a hit a system call.
_MARK_USED_EVERY_S = 3600.0


# What `_Entry.output` holds when the output is kept pickled only.
_NOT_KEPT: Any = object()


@dataclasses.dataclass(frozen=True)
class _Entry:
    # A folder entry's is a view of the file's bytes it was read from, not a copy.
    payload: bytes | bytearray | memoryview
    seconds: float
    # What the nodes that read this output are keyed on (see `NodeCache::digest`).
    digest: bytes | None
    # In memory, an output that cannot change in place (a number, a string, a tuple of them)
    # as it is: a copy of it could not be told from it, and unpickling one costs a hit a tenth.
    output: object = _NOT_KEPT


class _Record(NamedTuple):
    """What a folder entry says of itself, read without its payload: a tuple, which a hit
    makes faster than a dataclass."""

    length: int
    checksum: bytes
    seconds: float
    made: float
    digest: bytes | None
    # Its node's id and its class's name, in UTF-8, the id's length apart.
    names: bytes
    node_length: int
    # Where its payload begins in the file.
    end: int
    # Its payload's checksum (`_checksum`), which its mark says.
    algorithm: _Algorithm

    @property
    def node(self) -> str:
        return self.names[: self.node_length].decode("utf-8", "replace")

    @property
    def cls(self) -> str:
        return self.names[self.node_length :].decode("utf-8", "replace")


def _packed_text(array: Any) -> Any:
    """How a numpy array is pickled into an entry: a text column (an ``object`` array of
    strings, pandas' ``str`` and ``object`` columns) packed by ``soma._soma.text_pack`` — its
    distinct strings once each and an index per row, made back by ``text_unpack`` — where
    pickle writes and memoizes a million strings one by one; any other as numpy pickles it."""
    if array.dtype.hasobject:
        packed = _soma.text_pack(array)
        if packed is not None:
            return _soma.text_unpack, (packed, array.shape)
    return array.__reduce_ex__(5)


# The pickler's table of reducers: `copyreg`'s, as of `_COPIED`, numpy's arrays, and pandas'
# arrays backed by Arrow once pandas has loaded them (`_ARROW_KNOWN`).
_TABLE: dict[type, Any] = {}
_COPIED: dict[type, Any] = {}
_ARROW_KNOWN = False


def _pandas_arrow_pickled(value: Any) -> tuple[Any, ...]:
    """How a pandas array backed by Arrow is pickled into an entry: as pandas pickles it, but
    with its chunks as they are where each holds no more than its own elements — pandas'
    ``__getstate__`` copies them into one, always — and copied into one, as pandas does, where
    one is a slice of larger buffers (a group of a ``groupby``), which pickle would write
    whole."""
    chunked = value._pa_array
    if any(_arrow_slice(chunk) for chunk in chunked.chunks):
        chunked = chunked.combine_chunks()
    state = dict(value.__dict__)
    state["_pa_array"] = chunked
    state["_cache"] = {}  # What pandas' own leaves out: values computed from the rest.
    return (copyreg.__newobj__, (type(value),), state, None, None)  # type: ignore[attr-defined]


# What an Arrow array's buffers may hold beyond its own elements when it is no slice: a text
# array's offsets hold one more than its length, its validity bitmap is rounded up to a byte.
_ARROW_LAYOUT_SLACK = 64


def _arrow_slice(chunk: Any) -> bool:
    """Whether the Arrow array ``chunk`` is a slice of larger buffers, which pickle would write
    whole: they hold more than its elements and Arrow's layout (``nbytes`` counts a slice's
    share of them). A column of a million strings once counted a slice for its one last
    offset, and was copied whole at each entry: 3 ms a column."""
    return bool(chunk.get_total_buffer_size() > chunk.nbytes + _ARROW_LAYOUT_SLACK)


def _pandas_arrow_classes() -> dict[type, Any]:
    """pandas' arrays backed by Arrow, each pickled by :func:`_pandas_arrow_pickled`."""
    module = sys.modules.get("pandas.core.arrays.arrow.array")
    base = getattr(module, "ArrowExtensionArray", None)
    if not isinstance(base, type):
        return {}
    found, pending = {}, [base]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if _fingerprint._pandas_arrow(cls):
            found[cls] = _pandas_arrow_pickled
    return found


def _pickled(output: object, buffer_callback: Callable[[Any], Any] | None = None) -> bytes:
    """``output`` pickled for an entry (protocol 5); a text column packed once numpy is loaded
    (a value holding an array has it imported); with ``buffer_callback``, pickle's out-of-band
    buffers handed to it (see :func:`_pickled_apart`)."""
    global _TABLE, _COPIED, _ARROW_KNOWN
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return pickle.dumps(output, protocol=5, buffer_callback=buffer_callback)
    arrow = "pandas.core.arrays.arrow.array" in sys.modules
    if not _TABLE or copyreg.dispatch_table != _COPIED or arrow != _ARROW_KNOWN:
        # Made again when `copyreg.pickle` has been called since: the user's reducers hold.
        _COPIED = dict(copyreg.dispatch_table)
        _ARROW_KNOWN = arrow
        _TABLE = {**_pandas_arrow_classes(), **_COPIED, numpy.ndarray: _packed_text}
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5, buffer_callback=buffer_callback)
    pickler.dispatch_table = _TABLE
    pickler.dump(output)
    # Its bytes as they are (getvalue hands over the buffer it wrote into, no copy of a large
    # output's): not a view (`getbuffer`), which would keep the stream open behind it, and
    # whose stream, collected with the view in a cycle, cannot close (a BufferError, said as
    # unraisable on CPython 3.13).
    return buffer.getvalue()


# A folder entry's payload is its output pickled, whose first byte is pickle's PROTO (0x80) —
# or, when the output holds large buffers (a numeric column, an array, Arrow's buffers), this
# mark, the count of those buffers, where its pickle and each buffer lie in the payload (offset
# and length, `_SPAN` each), then them: each buffer written to the file straight from the
# output's memory (pickle's out-of-band buffers), never copied into the pickle, and beginning at
# a multiple of `_ALIGN` bytes into the file, so that an array read back is aligned.
_APART = b"\x00OB1"
_COUNT = struct.Struct("<I")
_SPAN = struct.Struct("<QQ")
_ALIGN = 64
# A buffer shorter than this stays in the pickle: apart, it would cost more than it saves.
_APART_FROM = 1 << 16


def _pickled_apart(output: object, at: int) -> list[bytes | memoryview]:
    """The payload of a folder entry holding ``output``, beginning ``at`` bytes into its file,
    as the pieces to write one after the other: its pickle alone, or its pickle and its large
    buffers apart (see `_APART`)."""
    buffers: list[memoryview] = []

    def apart(buffer: pickle.PickleBuffer) -> bool:
        try:
            view = buffer.raw()
        except BufferError:  # Not contiguous: in the pickle, as pickle copies it.
            return True
        if view.nbytes < _APART_FROM:
            return True
        buffers.append(view)
        return False

    stream = _pickled(output, apart)
    if not buffers:
        return [stream]
    end = len(_APART) + _COUNT.size + _SPAN.size * (1 + len(buffers))
    spans = [(end, len(stream))]
    pieces: list[bytes | memoryview] = [stream]
    end += len(stream)
    for view in buffers:
        pad = -(at + end) % _ALIGN
        pieces += [bytes(pad), view]
        spans.append((end + pad, view.nbytes))
        end += pad + view.nbytes
    header = _APART + _COUNT.pack(len(buffers)) + b"".join(_SPAN.pack(*s) for s in spans)
    return [header, *pieces]


def _unpickled_payload(payload: bytes | bytearray | memoryview) -> Any:
    """The output pickled in a payload, its pickle alone or with its buffers apart: those read
    in place, so an array read back from a writable payload (a file read into a bytearray) is
    writable. Raises ``ValueError`` for a payload whose spans lie outside it."""
    if not payload or payload[0] != 0 or payload[: len(_APART)] != _APART:
        return pickle.loads(payload)  # Its first byte alone tells most: a hit's cost.
    view = memoryview(payload)
    (count,) = _COUNT.unpack_from(view, len(_APART))
    at = len(_APART) + _COUNT.size
    if count > (len(view) - at) // _SPAN.size:
        raise ValueError("the payload's spans lie outside it")
    pieces = []
    for i in range(count + 1):
        offset, length = _SPAN.unpack_from(view, at + i * _SPAN.size)
        if offset + length > len(view):
            raise ValueError("the payload's spans lie outside it")
        pieces.append(view[offset : offset + length])
    return pickle.loads(pieces[0], buffers=pieces[1:])


def _checksum(payload: bytes | bytearray | memoryview, algorithm: _Algorithm) -> bytes:
    """The checksum of ``payload`` by ``algorithm`` ("xxh3" or "blake3"), as a record holds
    it: 32 bytes, XXH3-128's 16 followed by zeros."""
    if algorithm == "blake3":
        return _soma.blake3(payload)
    return _soma.xxh3_128(payload).ljust(_CHECKSUM, b"\0")


def _name(text: str) -> bytes:
    return text.encode("utf-8", "replace")[:_NAME_BYTES]


def _head_size(node: str, cls: str, sealed: bool) -> int:
    """How long the head :func:`_head` makes for ``node`` and ``cls`` is, before its payload is
    known: where that payload begins in the file."""
    names = len(_name(node)) + len(_name(cls))
    return _RECORD_AT + _RECORD.size + names + (_SEAL if sealed else 0)


def _head(
    entry: _Entry,
    node: str,
    cls: str,
    made: float,
    seal: Callable[[bytes], bytes] | None,
    *,
    length: int,
    checksum: bytes,
) -> bytes:
    """The head of an entry: its mark, its record's checksum, its record (the payload's
    ``length`` and ``checksum``, XXH3-128's 16 bytes padded with zeros by the record's
    packing, or BLAKE3's where ``seal`` is given), and its seal."""
    node_bytes, class_bytes = _name(node), _name(cls)
    record = (
        _RECORD.pack(
            length,
            checksum,
            entry.seconds,
            made,
            entry.digest is not None,
            entry.digest or b"",
            len(node_bytes),
            len(class_bytes),
        )
        + node_bytes
        + class_bytes
    )
    if seal is None:
        return _MAGIC + _soma.blake3(record) + record
    return _SIGNED + _soma.blake3(record) + record + seal(record)


#: How a cache with a key checks an entry's record: given the record and its seal (``None``
#: for an entry written without one), whether to accept it.
Verify = Callable[[memoryview, bytes | None], bool]


def _read_record(data: bytes | bytearray, verify: Verify | None = None) -> _Record | None:
    """The record at the start of ``data``, or ``None`` if it is not whole and intact (or not
    all there: ``data`` is the file's first bytes), or if ``verify`` refuses it."""
    signed = data.startswith(_SIGNED)
    if len(data) < _RECORD_AT + _RECORD.size:
        return None
    algorithm: _Algorithm
    if data.startswith(_MAGIC):
        algorithm = "xxh3"
    elif signed or data.startswith(_MAGIC_BLAKE3):
        algorithm = "blake3"
    else:
        return None
    length, checksum, seconds, made, has_digest, digest, node, cls = _RECORD.unpack_from(
        data, _RECORD_AT
    )
    names = _RECORD_AT + _RECORD.size
    end = names + node + cls
    sealed = end + _SEAL if signed else end
    if (
        len(data) < sealed
        or _soma.blake3(memoryview(data)[_RECORD_AT:end]) != data[len(_MAGIC) : _RECORD_AT]
    ):
        return None
    if verify is not None and not verify(
        memoryview(data)[_RECORD_AT:end], bytes(data[end:sealed]) if signed else None
    ):
        return None
    digest = digest if has_digest else None
    return _Record(
        length, checksum, seconds, made, digest, bytes(data[names:end]), node, sealed, algorithm
    )


def _read_file(name: str) -> tuple[bytes | bytearray, float]:
    """The bytes of the file ``name`` and when it was last modified, read with a few system
    calls and no Python file object: a hit from a folder is mostly this. A large file is read
    into a bytearray, which the arrays of its output's buffers are then views of, writable as
    the arrays a node returned were."""
    handle = os.open(name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        status = os.fstat(handle)
        size = status.st_size
        if size >= _APART_FROM:
            whole = bytearray(size)
            view = memoryview(whole)
            reader = io.FileIO(handle, closefd=False)  # `readinto` on every platform.
            done = 0
            while done < size:  # A read cut short (a signal): what is left.
                count = reader.readinto(view[done:])
                if not count:
                    break
                done += count
            view.release()
            return (whole if done == size else whole[:done]), status.st_mtime
        data = os.read(handle, size)
        while len(data) < size:  # A read cut short (a signal): what is left.
            more = os.read(handle, size - len(data))
            if not more:
                break
            data += more
        return data, status.st_mtime
    finally:
        os.close(handle)


def _read_head(name: str, verify: Verify | None = None) -> tuple[_Record | None, bytes, int, float]:
    """The record of the entry in the file ``name``, the bytes read (the whole file when it is
    small), the file's size and when it was last modified; reads no more of a large payload
    than its first bytes."""
    handle = os.open(name, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    try:
        status = os.fstat(handle)
        data = os.read(handle, _HEAD_BYTES)  # A record is shorter: its names are cut.
        record = _read_record(data, verify)
        if record is not None and status.st_size != record.end + record.length:
            record = None  # Cut short, or grown: not whole.
        return record, data, status.st_size, status.st_mtime
    finally:
        os.close(handle)


def _read_whole(
    data: bytes | bytearray, verify: Verify | None = None
) -> tuple[_Record, memoryview] | None:
    """The record in ``data`` and its payload, checked against the record's checksum; ``None``
    if either is not whole and intact, or ``verify`` refuses the record."""
    record = _read_record(data, verify)
    if record is None:
        return None
    payload = memoryview(data)[record.end :]
    if len(payload) != record.length or _checksum(payload, record.algorithm) != record.checksum:
        return None
    return record, payload


def _read_entry(data: bytes | bytearray, verify: Verify | None = None) -> _Entry | None:
    """The entry in ``data``, or ``None`` if it is not whole and intact, or ``verify`` refuses
    it."""
    whole = _read_whole(data, verify)
    if whole is None:
        return None
    record, payload = whole
    return _Entry(payload, record.seconds, record.digest)


class _Unread(NamedTuple):
    """A folder entry found, its output not read yet: where it lies, and its payload's checksum
    and which checksum it is, which the entry read later must have (one written over since is
    another entry; one made to carry the checksum under another one's name is refused)."""

    file: str
    checksum: bytes
    algorithm: _Algorithm
    # The whole file, when the first read was all of it.
    data: bytes | bytearray | None


class RunCacheSource(Protocol):
    """What a run can be given to look its nodes up in and file their outputs: a
    :class:`Cache`, or a run journal's recording (``soma.journal``), each making the run cache
    the glue asks (``crates/soma-python/src/cache.rs``) for one run."""

    def _run(self, core: _soma.GraphCore) -> Any: ...


class Cache:
    """Outputs of nodes, kept by key: ``g.forward(x, cache=c)`` calls only the nodes whose key
    is not in ``c``.

    ``Cache()`` keeps entries in this process's memory for as long as it lives; ``Cache(path)``
    keeps them as files in the folder ``path`` (made if missing), shared by every thread and
    process that opens it. With ``max_bytes``, the entries least recently used are removed
    once they hold more than that (a folder's down to nine tenths of it, so that not every
    entry written scans the folder); an entry larger than the bound is not kept. Outputs are
    stored pickled, and an entry is read back unpickled: a node reading a hit gets a copy,
    never an object another run holds (in memory, an output that cannot change in place, a
    number or a tuple of strings, is kept and returned as it is, which no node can tell from a
    copy). A cache folder is trusted like code: unpickling an entry can run what whoever wrote
    it put there — unless the cache has a ``key`` (bytes or a str): then each entry of its folder
    is sealed when written (HMAC-SHA256 of its key and its record, which holds its payload's
    checksum) and one that does not verify — written without the key, with another, or changed
    since — is refused before anything of it is unpickled: a miss, said once with a
    :class:`CacheWarning`, its node computed again and the entry written anew. (In memory there
    is nothing to seal: the entries are this process's own.)
    """

    __slots__ = (
        "_clock",
        "_counts",
        "_folder_text",
        "_key",
        "_lock",
        "_lock_between_threads",
        "_max_bytes",
        "_memory",
        "_path",
        "_warned",
    )

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int | None = None,
        key: bytes | str | None = None,
    ) -> None:
        if max_bytes is not None and (
            not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0
        ):
            raise ValueError(f"max_bytes must be an int of at least 0, not {max_bytes!r}")
        if isinstance(key, str):
            key = key.encode()
        if key is not None and (not isinstance(key, bytes) or not key):
            raise ValueError("key is a non-empty bytes or str, or None")
        self._key = key
        self._path = None if path is None else Path(path)
        self._folder_text = "" if self._path is None else os.fspath(self._path)
        if self._path is not None:
            self._path.mkdir(parents=True, exist_ok=True)
        self._max_bytes = max_bytes
        # In memory: the entries, held by the glue, as the counts are, where no Python lock
        # guards them: threads of an `each` taking turns at one convoyed on it (see
        # `crates/soma-python/src/cache_state.rs`). A folder's are its files.
        self._memory = _soma.MemoryEntries(max_bytes) if self._path is None else None
        self._counts = _soma.CacheCounts()
        # The last modification time this process gave a file, in ns: each next one later, so
        # that the order of use survives a coarse clock.
        self._clock = 0
        # For what is rare: a warning said once, the order of a folder's uses.
        self._lock = threading.Lock()
        self._lock_between_threads = threading.Lock()
        self._warned: set[str] = set()

    @property
    def path(self) -> Path | None:
        """The folder entries are kept in; ``None`` for a cache in memory."""
        return self._path

    def stats(self) -> CacheStats:
        """What the cache did since it was made."""
        hits, misses, corrupted, read, written, saved, evicted = self._counts.read()
        return CacheStats(
            hits=int(hits),
            misses=int(misses),
            corrupted=int(corrupted),
            bytes_read=int(read),
            bytes_written=int(written),
            seconds_saved=saved,
            evicted=int(evicted),
        )

    def __len__(self) -> int:
        """How many entries it holds (in its folder, for a folder cache)."""
        if self._path is None:
            assert self._memory is not None
            return len(self._memory)
        return sum(1 for _ in self._path.glob("*/*.entry"))

    def __repr__(self) -> str:
        where = "memory" if self._path is None else str(self._path)
        return f"soma.Cache({where})"

    def _warn_once(self, topic: str, message: str) -> None:
        with self._lock:
            if topic in self._warned:
                return
            self._warned.add(topic)
        warnings.warn(message, CacheWarning, stacklevel=2)

    def _folder(self) -> tuple[str, int | None, bytes | None] | None:
        """What another process, on a host, opens this cache with: its folder, bound and key;
        ``None`` for a cache in memory, which no other process can reach."""
        return None if self._path is None else (str(self._path), self._max_bytes, self._key)

    def _sealer(self, key: bytes) -> Callable[[bytes], bytes] | None:
        """How the record of the entry under ``key`` is sealed; ``None`` without a key."""
        secret = self._key
        if secret is None:
            return None
        return lambda record: hmac.digest(secret, b"soma-cache\0" + key + record, "sha256")

    def _verifier(self, key: bytes) -> Verify | None:
        """How the record of the entry under ``key`` is checked before anything of it is read;
        ``None`` without a key (a folder trusted like code)."""
        secret = self._key
        if secret is None:
            return None

        def verify(record: memoryview, seal: bytes | None) -> bool:
            if seal is not None and hmac.compare_digest(
                seal, hmac.digest(secret, b"soma-cache\0" + key + record, "sha256")
            ):
                return True
            self._warn_once(
                "seal",
                f"an entry of the cache `{self._folder_text}` does not verify under its key "
                f"({'unsealed' if seal is None else 'sealed otherwise, or changed since'}): "
                "refused, not unpickled; its node runs again\n"
                "hint: whoever can write the folder can run code where it is read; find who "
                "wrote it, or open the cache with the key it was written with",
            )
            return False

        return verify

    def _file(self, key: bytes) -> Path:
        return Path(self._file_name(key))

    def _file_name(self, key: bytes) -> str:
        """Where the entry of ``key`` lies, as text: a hit reads it without making a `Path`,
        which costs more than reading a small file."""
        assert self._path is not None
        name = key.hex()
        return os.path.join(self._folder_text, name[:2], f"{name}.entry")

    def _load(self, key: bytes) -> tuple[bool, Any, bytes | None]:
        """The output filed under ``key`` and its digest: ``(True, output, digest)``, or
        ``(False, None, None)``."""
        if self._memory is not None:
            found = self._memory.used(key)
            if found is None:
                self._counts.add(misses=1)
                return False, None, None
            # Counted in one call: a hit is what a rerun is made of. An entry that does not
            # unpickle is counted back below.
            self._counts.add(hits=1, bytes_read=len(found.payload), seconds_saved=found.seconds)
            if found.output is not _NOT_KEPT:
                return True, found.output, found.digest
            try:
                return True, pickle.loads(found.payload), found.digest
            except Exception:  # Its class has gone, say: the node computes it again.
                self._counts.add(
                    hits=-1,
                    bytes_read=-len(found.payload),
                    seconds_saved=-found.seconds,
                    misses=1,
                    corrupted=1,
                )
                return False, None, None
        file = self._file_name(key)
        try:
            data, modified = _read_file(file)
            self._mark_used(file, modified)
        except OSError:  # Missing, or unreadable: either way, not there.
            self._counts.add(misses=1)
            return False, None, None
        found = _read_entry(data, self._verifier(key))
        if found is None:
            self._counts.add(misses=1, corrupted=1)
            return False, None, None
        try:
            output = _unpickled_payload(found.payload)
        except Exception:  # Its class has gone, say: the node computes it again.
            self._counts.add(misses=1, corrupted=1)
            return False, None, None
        self._counts.add(hits=1, bytes_read=len(found.payload), seconds_saved=found.seconds)
        return True, output, found.digest

    def _mark_used(self, file: str, modified: float) -> None:
        """Marks the entry ``file``, last modified at ``modified``, used now: on every hit where
        the least recently used are evicted, at most once an hour elsewhere (for the command's
        listing and ``--older-than``)."""
        if self._max_bytes is not None or time.time() - modified > _MARK_USED_EVERY_S:
            self._touch(file)

    def _peek(self, key: bytes) -> tuple[bool, bytes | None]:
        """Whether an entry is filed under ``key``, and its digest; counts nothing and reads
        no output (of a folder entry, its record alone)."""
        if self._memory is not None:
            found = self._memory.peek(key)
            return (False, None) if found is None else (True, found.digest)
        try:
            record = _read_head(self._file_name(key), self._verifier(key))[0]
        except OSError:
            record = None
        return (False, None) if record is None else (True, record.digest)

    def _find(self, key: bytes) -> tuple[bool, bytes | None, bool, object]:
        """A hit counted as ``_load`` counts it, its output not read: ``(True, digest, False,
        unread)``, the output read later by ``_read(unread)`` — or ``(True, digest, True,
        output)`` for an output kept as it is, which costs nothing to read; or ``(False, None,
        False, None)``. Of a folder entry, it reads the record alone (and a small entry
        whole)."""
        if self._memory is not None:
            found = self._memory.used(key)
            if found is None:
                self._counts.add(misses=1)
                return False, None, False, None
            if found.output is not _NOT_KEPT:
                read = len(found.payload)
                self._counts.add(hits=1, bytes_read=read, seconds_saved=found.seconds)
                return True, found.digest, True, found.output
            self._counts.add(hits=1, seconds_saved=found.seconds)
            return True, found.digest, False, found
        file = self._file_name(key)
        try:
            record, data, size, modified = _read_head(file, self._verifier(key))
            self._mark_used(file, modified)
        except OSError:  # Missing, or unreadable: either way, not there.
            self._counts.add(misses=1)
            return False, None, False, None
        if record is None:
            self._counts.add(misses=1, corrupted=1)
            return False, None, False, None
        self._counts.add(hits=1, seconds_saved=record.seconds)
        whole = data if len(data) == size else None
        return True, record.digest, False, _Unread(file, record.checksum, record.algorithm, whole)

    def _read(self, unread: object) -> tuple[bool, Any]:
        """The output of an entry ``_find`` found: ``(True, output)``, or ``(False, None)``
        when it cannot be read whole any more (removed, damaged, written over since), which
        the engine computes again."""
        if isinstance(unread, _Entry):
            return self._unpickled(unread.payload)
        assert isinstance(unread, _Unread)
        try:
            data = unread.data if unread.data is not None else _read_file(unread.file)[0]
        except OSError:
            return False, None
        whole = _read_whole(data)
        if whole is None:  # Damaged since it was found.
            self._counts.add(corrupted=1)
            return False, None
        record, payload = whole
        # Its payload matches its record's checksum, which must be the one found: one
        # written over since is another entry.
        if record.checksum != unread.checksum or record.algorithm != unread.algorithm:
            return False, None
        return self._unpickled(payload)

    def _unpickled(self, payload: bytes | bytearray | memoryview) -> tuple[bool, Any]:
        """The output pickled in ``payload``, counted as read: ``(True, output)``, or ``(False,
        None)``, counted as corrupted, when it does not unpickle."""
        try:
            output = _unpickled_payload(payload)
        except Exception:  # Its class has gone, say.
            self._counts.add(corrupted=1)
            return False, None
        self._counts.add(bytes_read=len(payload))
        return True, output

    def would_hit(self, graph: Graph, input: Any = None) -> dict[str, bool]:
        """For each node of ``graph``, in plan order, whether ``graph.forward(input,
        cache=self)`` would find its output here, without running a node or reading an output.

        A node after one that would run counts as running too, though it may yet hit: what it
        reads is not computed yet.

        Args:
            graph: the graph to ask about.
            input: the input the run would be given (``None`` unless given), keyed as
                ``forward`` keys it.
        """
        return dict(graph._core.would_hit(input, self))

    def _store(
        self,
        node_id: str,
        key: bytes,
        output: object,
        digest: bytes | None,
        seconds: float,
        cls: str = "",
    ) -> None:
        """Files ``output``, node ``node_id``'s (of class ``cls``), with its ``digest``, under
        ``key``; what cannot be kept is warned about, not raised."""
        sealer = None if self._path is None else self._sealer(key)
        unchangeable = _fingerprint._unchangeable(output)
        try:
            if unchangeable:  # Numbers and text, held by no array: pickle's own, its fastest.
                pieces: list[bytes | memoryview] = [pickle.dumps(output, protocol=5)]
            elif self._path is None:
                pieces = [_pickled(output)]
            else:
                pieces = _pickled_apart(output, _head_size(node_id, cls, sealer is not None))
        except Exception as error:
            self._warn_once(
                f"pickle:{node_id}",
                f"the output of node `{node_id}` is not kept in the cache: it does not pickle "
                f"({type(error).__name__}: {error})\n"
                "hint: return a value that pickles, or set `cacheable = False` on the class",
            )
            return
        if self._memory is not None:
            (payload,) = pieces
            kept = output if unchangeable else _NOT_KEPT
            entry = _Entry(payload, seconds, digest, kept)
            filed, evicted = self._memory.put(key, entry, len(payload))
            if filed:  # Not when it could not fit, whatever was removed: the others stay.
                self._counts.add(bytes_written=len(payload), evicted=evicted)
            return
        length = sum(len(piece) if isinstance(piece, bytes) else piece.nbytes for piece in pieces)
        head_size = _head_size(node_id, cls, sealer is not None)
        size = head_size + length
        if self._max_bytes is not None and size > self._max_bytes:
            return  # It could not fit, whatever was removed.

        def head(checksum: bytes) -> bytes:
            made = _head(
                _Entry(b"", seconds, digest),
                node_id,
                cls,
                time.time(),
                sealer,
                length=length,
                checksum=checksum,
            )
            assert len(made) == head_size
            return made

        algorithm: _Algorithm = "xxh3" if sealer is None else "blake3"
        final = self._file(key)
        temporary = None
        try:
            final.parent.mkdir(exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=final.parent, prefix=".", suffix=".tmp")
            with os.fdopen(handle, "wb") as file:
                if len(pieces) == 1:  # Its pickle alone: small, or no buffer to write apart.
                    file.write(head(_checksum(pieces[0], algorithm)))
                    file.write(pieces[0])
                else:
                    # Its pieces written and checksummed at once by the glue, the GIL released,
                    # after the head's room; then the head, which holds the checksum, at 0.
                    file.write(head(_soma.write_hashed(temporary, head_size, pieces, algorithm)))
            if self._max_bytes is None:
                os.replace(temporary, final)
            else:
                self._touch(temporary)
                self._counts.add(evicted=self._place_within_bound(temporary, final, size))
        except OSError as error:
            if temporary is not None:
                with contextlib.suppress(OSError):
                    os.unlink(temporary)
            self._warn_once(
                "write",
                f"the cache folder `{self._path}` cannot be written ({error.strerror or error}):"
                " the run goes on, and what it computes is not kept\n"
                "hint: free space there, or give the cache a folder it can write",
            )
            return
        self._counts.add(bytes_written=length)

    def _touch(self, file: str | Path) -> None:
        """Marks ``file`` used now, later than any file this process marked before."""
        with self._lock:
            self._clock = max(time.time_ns(), self._clock + 1)
            now = self._clock
        with contextlib.suppress(OSError):
            os.utime(file, ns=(now, now))

    def _files(self) -> list[tuple[int, int, Path]]:
        """The folder's entries as (last use in ns, size, path)."""
        assert self._path is not None
        found = []
        for file in self._path.glob("*/*.entry"):
            with contextlib.suppress(OSError):  # Removed meanwhile by another process.
                status = file.stat()
                found.append((status.st_mtime_ns, status.st_size, file))
        return found

    @contextlib.contextmanager
    def _folder_lock(self) -> Any:
        """Holds the folder's advisory lock, which every process bounding it takes to change
        what it holds; this process's threads take turns at it first (a ``flock`` is held by
        an open file, which they would share)."""
        assert self._path is not None
        with self._lock_between_threads:
            handle = os.open(self._path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if fcntl is not None:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                yield
            finally:
                os.close(handle)  # Which releases the lock.

    def _place_within_bound(self, temporary: str, final: Path, size: int) -> int:
        """Renames ``temporary`` (``size`` bytes) to ``final`` under the folder's lock, once
        the folder has room for it: removes the least recently used entries, down to nine
        tenths of the bound with it, when the count says it would not fit. Returns how many it
        removed."""
        assert self._path is not None
        assert self._max_bytes is not None
        counter = self._path / ".held"
        with self._folder_lock():
            try:
                held = struct.unpack("<Q", counter.read_bytes())[0]
            except (OSError, struct.error):  # Not made yet, or damaged: the scan says.
                held = None
            with contextlib.suppress(OSError):  # An entry written over frees its bytes.
                held = None if held is None else held - final.stat().st_size
            evicted = 0
            if held is None or held + size > self._max_bytes:
                held, evicted = self._evict_in_folder(self._max_bytes * 9 // 10 - size, final)
            os.replace(temporary, final)
            held += size
            self._write_count(counter, held)
        return evicted

    def _write_count(self, counter: Path, held: int) -> None:
        """Writes the count whole or not at all: a reader never sees half of it."""
        assert self._path is not None
        handle, temporary = tempfile.mkstemp(dir=self._path, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(struct.pack("<Q", max(held, 0)))
            os.replace(temporary, counter)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def _evict_in_folder(self, target: int, keep: Path) -> tuple[int, int]:
        """Removes the least recently used entries (``keep`` aside: it is being written
        over) until the rest hold ``target`` bytes at most; returns what they hold and how
        many it removed. Under the folder's lock."""
        files = sorted(self._files())
        held = sum(size for _, size, file in files if file != keep)
        evicted = 0
        for _, size, file in files:
            if held <= target:
                break
            if file == keep:
                continue
            with contextlib.suppress(OSError):
                file.unlink()
                evicted += 1
            held -= size
        return held, evicted

    def _run(self, core: _soma.GraphCore) -> _RunCache:
        """What one run of ``core`` asks: made by the glue (``PythonCache::of`` in
        ``crates/soma-python/src/cache.rs``) for every run, stream and ``would_hit`` given
        this cache, so that no caller makes it."""
        return _RunCache(self, core)


class _RunCache:
    """The cache as one forward's engine asks it (see ``crates/soma-python/src/cache.rs``)."""

    __slots__ = ("_cache", "_core", "find", "get", "peek", "read")

    def __init__(self, cache: Cache, core: _soma.GraphCore) -> None:
        self._cache = cache
        self._core = core
        # The store's own methods, asked with a key alone: a hit is one call, no frame between.
        self.get = cache._load
        self.peek = cache._peek
        self.find = cache._find
        self.read = cache._read

    def fingerprint(self, node_id: str) -> bytes | None:
        node = self._core.implementation(node_id)
        if getattr(node, "cacheable", True) is False:
            return None
        try:
            return _fingerprint.fingerprint(node)
        except _fingerprint.Unkeyable as unkeyable:
            self._cache._warn_once(
                f"state:{node_id}",
                f"node `{node_id}` runs uncached: the `{unkeyable.kind}` at "
                f"`{unkeyable.where}` cannot be digested\n"
                "hint: set `cacheable = False` on its class to say so and silence this",
            )
        except Exception as error:  # What its code or state raised when read.
            self._cache._warn_once(
                f"state:{node_id}",
                f"node `{node_id}` runs uncached: reading its code and state raised "
                f"`{type(error).__name__}: {error}`\n"
                "hint: set `cacheable = False` on its class to say so and silence this",
            )
        return None

    def digest(self, value: object, node_id: str | None = None) -> bytes | None:
        """The digest of an output: ``None`` where it has none, and its readers are keyed on
        its node's key instead, which loses nothing but early cutoff."""
        try:
            return _fingerprint.digest(value)
        except Exception:  # Unkeyable, or what its `__reduce_ex__` raised.
            return None

    def digest_items(self, value: object) -> tuple[bytes | None, list[bytes] | None]:
        """The digest of an output that an ``each`` reads, and its items' digests when it is a
        list or a tuple (:func:`soma.cache._fingerprint.digest_items`), which the engine hands
        the item runs; ``(None, None)`` where it has none."""
        try:
            return _fingerprint.digest_items(value)
        except Exception:  # Unkeyable, or what its `__reduce_ex__` raised.
            return None, None

    def input_digest(self, node_id: str, value: object) -> bytes | None:
        """The digest of the run's input, asked by its first reader ``node_id``; where it has
        none, each node reading it runs uncached, which is said once."""
        return self.input_digest_items(node_id, value, False)[0]

    def input_digest_items(
        self, node_id: str, value: object, items: bool = True
    ) -> tuple[bytes | None, list[bytes] | None]:
        """The digest of the run's input, asked by its first reader ``node_id``, and with
        ``items`` (when an ``each`` reads it) its items' as :meth:`digest_items` gives them;
        where it has none, each node reading it runs uncached, which is said once."""
        try:
            if items:
                return _fingerprint.digest_items(value)
            return _fingerprint.digest(value), None
        except _fingerprint.Unkeyable as unkeyable:
            kind, where = unkeyable.kind, unkeyable.where
        except Exception as error:  # What its `__reduce_ex__` raised.
            kind, where = f"{type(value).__qualname__} ({type(error).__name__}: {error})", ""
        self._cache._warn_once(
            f"input:{kind}",
            f"node `{node_id}` runs uncached, and every node that reads the graph's input: the "
            f"`{kind}` at `{where or '(the input itself)'}` in it cannot be digested\n"
            "hint: give the graph an input made of values that pickle",
        )
        return None, None

    def put(
        self, node_id: str, key: bytes, output: object, digest: bytes | None, seconds: float
    ) -> None:
        cls = ""
        if self._cache._path is not None:  # Named in a folder's entries, for the command.
            node = self._core.implementation(node_id)
            cls = _fingerprint._qualified(type(node))
        self._cache._store(node_id, key, output, digest, seconds, cls)
