"""Running again with ``soma.Cache``: a rerun calls only the nodes whose code, state or input
changed and what comes after them; a failed run keeps what it completed; a folder cache is
shared by processes, and an entry that is not whole is computed again, never returned."""

from __future__ import annotations

import errno
import importlib
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import soma
from conftest import SUBPROCESS_DEADLINE, CallRecord, Fn, run_script
from soma.cache import _fingerprint
from test_properties import Dag, dags

# Which nodes were called, in order: keyed as an empty record (see `CallRecord`), so that
# recording a call changes no fingerprint.
CALLS = CallRecord()


class Scale(soma.Node):
    def __init__(self, k: float) -> None:
        self.k = k

    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "scale")
        return x * self.k


class Shift(soma.Node):
    def __init__(self, by: float) -> None:
        self.by = by

    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "shift")
        return x + self.by


class Weighted(soma.Node):
    def __init__(self, weights: np.ndarray[Any, Any]) -> None:
        self.weights = weights

    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "weighted")
        return float(np.dot(self.weights, x))


class Join(soma.Node):
    def forward(self, x: dict[str, Any]) -> Any:
        CALLS.append(self._soma_id or "join")
        return sorted(x.items())


class Breakable(soma.Node):
    def __init__(self, broken: bool) -> None:
        self.broken = broken

    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "breakable")
        if self.broken:
            raise ValueError("broken")
        return x + 1


class Clock(soma.Node):
    """Kept out: what it returns is set from outside, as a clock's would change."""

    cacheable = False
    reading = 0

    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "clock")
        return Clock.reading


class Locked(soma.Node):
    def __init__(self) -> None:
        # What has no content to digest: a generator, half read (a lock is a resource, keyed
        # by its type).
        self.pending = (i for i in range(3))

    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "locked")
        return x


class Lazy(soma.Node):
    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "lazy")
        return (i for i in range(x))


def calls(graph: soma.Graph, x: Any, cache: soma.Cache, **options: Any) -> tuple[Any, list[str]]:
    """The result of a cached forward, and the nodes it called."""
    CALLS.clear()
    result = graph.forward(x, cache=cache, **options)
    return result, list(CALLS)


def chain() -> soma.Graph:
    return soma.Graph.somatize(Scale(2).named("a") >> Shift(1).named("b") >> Scale(10).named("c"))


@pytest.fixture(params=["memory", "folder"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> soma.Cache:
    return soma.Cache() if request.param == "memory" else soma.Cache(tmp_path / "cache")


# ---------------------------------------------------------------------------------------------
# Hits


def test_a_rerun_calls_no_node_and_returns_what_the_first_run_returned(cache: soma.Cache) -> None:
    g = chain()
    assert calls(g, 3, cache) == (70, ["a", "b", "c"])
    assert calls(g, 3, cache) == (70, [])
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (3, 3)
    assert stats.bytes_written > 0
    if cache.path is None:  # Numbers, kept as they are: each handed out, none unpickled.
        assert stats.bytes_read == stats.bytes_written
    else:  # The result's entry alone is read: what `a` and `b` output, no node that ran read.
        assert 0 < stats.bytes_read < stats.bytes_written
    assert stats.seconds_saved > 0


def test_a_graph_built_again_from_equal_nodes_hits(cache: soma.Cache) -> None:
    calls(chain(), 3, cache)
    assert calls(chain(), 3, cache) == (70, [])


def test_another_input_calls_every_node_and_both_stay_kept(cache: soma.Cache) -> None:
    g = chain()
    calls(g, 3, cache)
    assert calls(g, 4, cache) == (90, ["a", "b", "c"])
    assert calls(g, 3, cache)[1] == []


def test_an_input_array_is_keyed_by_its_content(cache: soma.Cache) -> None:
    g = chain()
    x = np.arange(6.0)
    calls(g, x, cache)
    assert calls(g, x.copy(), cache)[1] == []
    x[0] = 100.0
    result, called = calls(g, x, cache)
    assert called == ["a", "b", "c"]
    assert result[0] == (200.0 + 1) * 10


def test_a_hit_is_a_copy_a_caller_may_change_freely(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(Scale(1).named("a"))
    first = calls(g, np.zeros(3), cache)[0]
    first[0] = 5.0
    assert calls(g, np.zeros(3), cache)[0].tolist() == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------------------------------------
# What invalidates


def test_changing_an_attribute_calls_that_node_and_what_follows_and_nothing_before(
    cache: soma.Cache,
) -> None:
    b = Shift(1).named("b")
    g = soma.Graph.somatize(Scale(2).named("a") >> b >> Scale(10).named("c"))
    calls(g, 3, cache)
    b.by = 2
    assert calls(g, 3, cache) == (80, ["b", "c"])


def test_changing_a_weight_array_in_place_calls_the_node_again(cache: soma.Cache) -> None:
    weights = np.ones(3)
    g = soma.Graph.somatize(Weighted(weights).named("w") >> Shift(0).named("after"))
    calls(g, np.ones(3), cache)
    weights[1] = 3.0  # As an optimizer step would.
    assert calls(g, np.ones(3), cache) == (5.0, ["w", "after"])


_NODES_V1 = """
import soma
from conftest import CallRecord

CALLS = CallRecord()


class Load(soma.Node):
    def forward(self, x):
        CALLS.append("load")
        return x + 1


class Clean(soma.Node):
    def scrub(self, x):
        return x * 2

    def forward(self, x):
        CALLS.append("clean")
        return self.scrub(x)


class Total(soma.Node):
    def forward(self, x):
        CALLS.append("total")
        return x + 1000
"""


def _import_nodes(folder: Path, source: str) -> Any:
    (folder / "edited_nodes.py").write_text(source)
    sys.modules.pop("edited_nodes", None)
    importlib.invalidate_caches()
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("edited_nodes")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("edited_nodes", None)


def test_editing_a_helper_method_calls_that_node_and_what_follows(
    cache: soma.Cache, tmp_path: Path
) -> None:
    results = []
    for source in (_NODES_V1, _NODES_V1.replace("return x * 2", "return x * 3")):
        nodes = _import_nodes(tmp_path, source)
        g = soma.Graph.somatize(nodes.Load() >> nodes.Clean() >> nodes.Total())
        results.append((g.forward(1, cache=cache), list(nodes.CALLS)))
    assert results == [(1004, ["load", "clean", "total"]), (1006, ["clean", "total"])]


def test_the_same_code_in_a_module_of_another_name_hits_the_same_entries(
    cache: soma.Cache, tmp_path: Path
) -> None:
    first = _import_nodes(tmp_path, _NODES_V1)
    soma.Graph.somatize(first.Load()).forward(1, cache=cache)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "other_nodes.py").write_text(_NODES_V1)
    sys.path.insert(0, str(tmp_path / "other"))
    try:
        other = importlib.import_module("other_nodes")
    finally:
        sys.path.remove(str(tmp_path / "other"))
        sys.modules.pop("other_nodes", None)
    soma.Graph.somatize(other.Load()).forward(1, cache=cache)
    # The module's name says where the code was run from, not what it computes.
    assert other.CALLS == []


# ---------------------------------------------------------------------------------------------
# Waves, failures, nodes kept out


def test_a_wave_calls_its_changed_branch_and_the_join_and_not_its_unchanged_branch(
    cache: soma.Cache,
) -> None:
    right = Shift(1).named("right")
    g = soma.Graph.somatize(
        Scale(2).named("source") >> (Scale(3).named("left") | right) >> Join().named("join")
    )
    calls(g, 1, cache)
    right.by = 5
    assert calls(g, 1, cache) == ([("left", 6), ("right", 7)], ["right", "join"])


def test_a_failed_run_keeps_what_it_completed_and_the_next_calls_only_the_fixed_node_and_after(
    cache: soma.Cache,
) -> None:
    broken = Breakable(broken=True).named("k")
    g = soma.Graph.somatize(Scale(2).named("a") >> broken >> Shift(1).named("after"))
    with pytest.raises(ValueError, match="broken"):
        calls(g, 1, cache)
    broken.broken = False  # The fix.
    assert calls(g, 1, cache) == (4, ["k", "after"])


def test_a_node_kept_out_always_runs_and_its_readers_hit_while_its_output_is_the_same(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Clock().named("clock") >> Shift(1).named("after"))
    Clock.reading = 7
    calls(g, 0, cache)
    assert calls(g, 0, cache) == (8, ["clock"])
    Clock.reading = 9
    assert calls(g, 0, cache) == (10, ["clock", "after"])


def test_a_node_whose_state_has_no_digest_runs_uncached_with_one_warning_naming_it(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Locked().named("locked") >> Shift(1).named("after"))
    with pytest.warns(
        soma.CacheWarning, match=r"node `locked` runs uncached.*`builtins.generator` at `\.pending`"
    ):
        calls(g, 1, cache)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert calls(g, 1, cache) == (2, ["locked"])


def test_an_output_that_does_not_pickle_is_not_kept_and_the_warning_names_its_node(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Lazy().named("lazy"))
    with pytest.warns(soma.CacheWarning, match="output of node `lazy`.*does not pickle"):
        calls(g, 3, cache)
    assert calls(g, 3, cache)[1] == ["lazy"]


def test_a_traced_rerun_marks_each_hit_cached(cache: soma.Cache) -> None:
    b = Shift(1).named("b")
    g = soma.Graph.somatize(Scale(2).named("a") >> b)
    calls(g, 1, cache)
    b.by = 3
    trace = soma.Trace()
    g.forward(1, cache=cache, trace=trace)
    assert [(span.node, span.cached, span.turns) for span in trace.spans] == [
        ("a", True, 0),
        ("b", False, 1),
    ]


def test_a_cached_run_with_a_timeout_returns_what_one_without_returns(cache: soma.Cache) -> None:
    g = chain()
    assert g.forward(3, cache=cache, timeout=30.0) == 70
    assert calls(g, 3, cache, timeout=30.0) == (70, [])


def test_a_stream_looks_each_item_up_on_its_own_and_calls_only_the_new_items(
    cache: soma.Cache,
) -> None:
    g = chain()
    CALLS.clear()
    assert list(g.map([1, 2], cache=cache)) == [30, 50]
    assert len(CALLS) == 6
    CALLS.clear()
    assert list(g.map([1, 2, 3], cache=cache)) == [30, 50, 70]
    assert CALLS == ["a", "b", "c"]
    # An item is keyed as `forward` keys it: a forward of item 3 calls nothing.
    assert calls(g, 3, cache) == (70, [])


def test_micro_batches_look_each_slice_up_on_its_own(cache: soma.Cache) -> None:
    g = chain()
    x = np.arange(4.0)
    first = g.forward(x, micro_batches=2, cache=cache)
    CALLS.clear()
    again = g.forward(x, micro_batches=2, cache=cache)
    assert CALLS == []
    assert again.tolist() == first.tolist() == ((x * 2 + 1) * 10).tolist()


# ---------------------------------------------------------------------------------------------
# The folder: whole entries, shared by processes


def _entries(cache: soma.Cache) -> list[Path]:
    assert cache.path is not None
    return sorted(cache.path.glob("*/*.entry"))


@pytest.mark.parametrize("damage", ["truncated", "one byte flipped", "emptied"])
def test_a_damaged_entry_is_counted_and_computed_again_never_returned(
    tmp_path: Path, damage: str
) -> None:
    cache = soma.Cache(tmp_path)
    g = chain()
    calls(g, 3, cache)
    for entry in _entries(cache):
        data = entry.read_bytes()
        if damage == "truncated":
            data = data[:-3]
        elif damage == "one byte flipped":
            data = data[:-1] + bytes([data[-1] ^ 1])
        else:
            data = b""
        entry.write_bytes(data)
    assert calls(g, 3, cache) == (70, ["a", "b", "c"])
    assert cache.stats().corrupted == 3
    # Computed again, each entry is whole again.
    assert calls(g, 3, cache) == (70, [])


class Ramp(soma.Node):
    """A large array (800 kB): pickled with its buffer apart from the pickle."""

    def forward(self, x: int) -> np.ndarray[Any, Any]:
        CALLS.append("ramp")
        return np.arange(100_000, dtype=np.float64) * x


def test_a_large_array_is_kept_beside_its_pickle_and_read_back_as_an_aligned_writable_copy(
    tmp_path: Path,
) -> None:
    cache = soma.Cache(tmp_path)
    g = soma.Graph.somatize(Ramp())
    calls(g, 3, cache)
    (entry,) = _entries(cache)
    # Its bytes once, apart from the pickle (not copied into it), and nothing more.
    assert soma.cache._cache._APART in entry.read_bytes()[:4096]
    assert cache.stats().bytes_written < 800_000 + 4096
    hit, called = calls(g, 3, cache)
    assert called == []
    assert hit.tolist() == (np.arange(100_000) * 3.0).tolist()
    assert hit.flags.writeable
    assert hit.ctypes.data % 16 == 0
    hit[0] = -1.0  # A copy of the entry's: changing it changes no later hit.
    assert calls(g, 3, cache)[0][0] == 0.0


def test_a_byte_flipped_in_a_large_entrys_buffer_is_counted_and_computed_again(
    tmp_path: Path,
) -> None:
    cache = soma.Cache(tmp_path)
    g = soma.Graph.somatize(Ramp())
    calls(g, 2, cache)
    (entry,) = _entries(cache)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 1
    entry.write_bytes(bytes(data))
    result, called = calls(g, 2, cache)
    assert called == ["ramp"]
    assert cache.stats().corrupted == 1
    assert result.tolist() == (np.arange(100_000) * 2.0).tolist()


class Ramps(soma.Node):
    """Three large arrays (12 MB), the last one's bytes past a megabyte: an entry the glue
    writes while a second thread checksums it (`soma._soma.write_hashed`)."""

    def forward(self, x: int) -> tuple[np.ndarray[Any, Any], ...]:
        CALLS.append("ramps")
        return tuple(np.arange(500_000, dtype=np.float64) * (x + i) for i in range(3))


def test_an_entry_written_while_checksummed_holds_its_payloads_checksum_and_reads_back_whole(
    tmp_path: Path,
) -> None:
    cache = soma.Cache(tmp_path)
    g = soma.Graph.somatize(Ramps())
    calls(g, 2, cache)
    (entry,) = _entries(cache)
    found = soma.cache._cache._read_entry(entry.read_bytes())
    assert found is not None  # Its record's checksum is its payload's, as written.
    hit, called = calls(g, 2, cache)
    assert called == []
    assert [part.tolist() for part in hit] == [
        (np.arange(500_000) * (2.0 + i)).tolist() for i in range(3)
    ]


def _as_written_before_xxh3(entry: Path) -> None:
    """Writes ``entry`` again as entries were before XXH3: its mark ``SOMA-CACHE-3``, its
    payload's checksum BLAKE3's; the rest as it was."""
    from soma.cache import _cache

    whole = _cache._read_whole(entry.read_bytes())
    assert whole is not None
    record, payload = whole
    names = record.names
    packed = _cache._RECORD.pack(
        record.length,
        soma._soma.blake3(payload),
        record.seconds,
        record.made,
        record.digest is not None,
        record.digest or b"",
        record.node_length,
        len(names) - record.node_length,
    )
    packed += names
    entry.write_bytes(b"SOMA-CACHE-3\n" + soma._soma.blake3(packed) + packed + bytes(payload))


@pytest.mark.parametrize("where", ["first buffer", "last byte"])
@pytest.mark.parametrize("written", ["now", "before xxh3"])
def test_a_byte_flipped_in_an_entry_written_while_checksummed_is_counted_and_computed_again(
    tmp_path: Path, where: str, written: str
) -> None:
    cache = soma.Cache(tmp_path)
    g = soma.Graph.somatize(Ramps())
    calls(g, 2, cache)
    (entry,) = _entries(cache)
    if written == "before xxh3":
        _as_written_before_xxh3(entry)
    data = bytearray(entry.read_bytes())
    data[len(data) // 4 if where == "first buffer" else -1] ^= 1
    entry.write_bytes(bytes(data))
    result, called = calls(g, 2, cache)
    assert called == ["ramps"]
    assert cache.stats().corrupted == 1
    assert result[2].tolist() == (np.arange(500_000) * 4.0).tolist()


@pytest.mark.parametrize("graph", ["ramps", "chain"])
def test_an_entry_written_before_xxh3_checksums_is_still_a_hit(tmp_path: Path, graph: str) -> None:
    cache = soma.Cache(tmp_path)
    g = soma.Graph.somatize(Ramps()) if graph == "ramps" else chain()
    first, _ = calls(g, 2, cache)
    for entry in _entries(cache):
        _as_written_before_xxh3(entry)
        assert entry.read_bytes().startswith(b"SOMA-CACHE-3\n")
    again, called = calls(g, 2, cache)
    assert called == []
    assert cache.stats().corrupted == 0
    assert pickle.dumps(again) == pickle.dumps(first)


@settings(max_examples=60, deadline=None)
@given(
    at=st.floats(0.0, 1.0, exclude_max=True),
    bit=st.integers(0, 7),
    key=st.sampled_from([None, b"secret"]),
    large=st.booleans(),
)
def test_a_bit_flipped_anywhere_in_an_entry_is_never_returned_and_is_computed_again_if_read(
    tmp_path_factory: pytest.TempPathFactory, at: float, bit: int, key: bytes | None, large: bool
) -> None:
    # Its mark, its record's checksum, its record, its names, its seal, its pickle, the padding
    # before a buffer, the buffer: no byte of an entry goes unchecked when it is read. An entry
    # a rerun does not read (the chain's `a` or `b`, all hits, whose record alone is read) may
    # keep a damaged payload: it is never returned.
    folder = tmp_path_factory.mktemp("flipped")
    g = soma.Graph.somatize(Ramp()) if large else chain()
    first, _ = calls(g, 3, soma.Cache(folder, key=key))
    entries = sorted(folder.glob("*/*.entry"))
    entry = entries[int(at * len(entries))]
    data = bytearray(entry.read_bytes())
    data[int(at * len(data))] ^= 1 << bit
    entry.write_bytes(bytes(data))
    cache = soma.Cache(folder, key=key)
    with warnings.catch_warnings():
        # Under a key, a record that no longer verifies is said with a CacheWarning.
        warnings.simplefilter("ignore", soma.CacheWarning)
        again, called = calls(g, 3, cache)
    assert pickle.dumps(again) == pickle.dumps(first)
    # The one damaged entry, when read, is counted and its node alone computed again.
    assert len(called) == cache.stats().corrupted <= 1
    if large:  # The leaf's entry: always read whole.
        assert called == ["ramp"]
    whole, called = calls(g, 3, soma.Cache(folder, key=key))
    assert called == []
    assert pickle.dumps(whole) == pickle.dumps(first)


def test_xxh3_128_gives_the_reference_implementations_checksums() -> None:
    # As the reference C library gives them (python-xxhash's `xxh3_128_hexdigest`); the last,
    # 256,000 bytes, read with the GIL released.
    assert soma._soma.xxh3_128(b"").hex() == "99aa06d3014798d86001c324468d497f"
    assert soma._soma.xxh3_128(b"soma").hex() == "1138e08f41c8d4bd04b053675ce8b076"
    data = np.frombuffer(bytes(range(256)) * 1000, dtype=np.uint8)
    assert soma._soma.xxh3_128(data).hex() == "548512d98989de2d776474c39d20f9aa"


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 200_000), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
    checksum=st.sampled_from(["xxh3", "blake3"]),
)
def test_a_payload_written_while_checksummed_has_the_checksum_of_its_bytes_joined(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], seed: int, checksum: str
) -> None:
    # Pieces of up to 800,000 bytes in all: on one thread below 256 KiB, on two from there.
    rng = np.random.default_rng(seed)
    pieces = [rng.integers(0, 256, length, dtype=np.uint8) for length in lengths]
    joined = b"".join(piece.tobytes() for piece in pieces)
    file = tmp_path_factory.mktemp("written") / "entry"
    file.write_bytes(b"head")
    written = soma._soma.write_hashed(file, 4, [*pieces], checksum)  # type: ignore[arg-type]
    assert file.read_bytes() == b"head" + joined
    by_itself = soma._soma.xxh3_128 if checksum == "xxh3" else soma._soma.blake3
    assert written == by_itself(joined)


def test_a_payload_written_with_a_checksum_of_no_known_name_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "entry"
    file.write_bytes(b"")
    with pytest.raises(ValueError, match=r"no checksum is named `md5`\nhint: "):
        soma._soma.write_hashed(file, 0, [b"x"], "md5")  # type: ignore[arg-type]


_FILE_TOO_LARGE = """
import resource, signal, sys, warnings
sys.path.insert(0, {tests!r})
import soma
import test_cache as t

# Files past 1 MB refused (EFBIG), as a full disk refuses them (ENOSPC), in the glue's write.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
cache = soma.Cache({folder!r})
g = soma.Graph.somatize(t.Ramps())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = g.forward(2, cache=cache)
    second = g.forward(2, cache=cache)
print(len(caught), [str(w.message).splitlines()[0] for w in caught])
print(first[1][-1], second[1][-1], cache.stats().hits)
"""


def test_a_large_entry_the_file_system_refuses_mid_write_runs_uncached_with_one_warning(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "cache"
    ran = run_script(_FILE_TOO_LARGE.format(tests=str(Path(__file__).parent), folder=str(folder)))
    assert ran.returncode == 0, ran.stderr
    warned, figures = ran.stdout.splitlines()
    assert warned.startswith("1 ")  # One warning for the two runs.
    assert "cannot be written (File too large)" in warned
    assert figures == f"{499_999 * 3.0} {499_999 * 3.0} 0"
    assert list(folder.rglob("*")) == [p for p in folder.rglob("*") if p.is_dir()]


def test_a_folder_that_cannot_be_written_runs_uncached_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = soma.Cache(tmp_path)

    def full_disk(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("soma.cache._cache.tempfile.mkstemp", full_disk)
    with pytest.warns(soma.CacheWarning, match="cannot be written.*No space left") as caught:
        assert calls(chain(), 3, cache) == (70, ["a", "b", "c"])
    assert len(caught) == 1
    assert _entries(cache) == []


def test_a_temporary_file_left_by_a_killed_writer_is_not_an_entry(tmp_path: Path) -> None:
    cache = soma.Cache(tmp_path)
    g = chain()
    calls(g, 3, cache)
    for entry in _entries(cache):
        # What a writer killed mid-write leaves: a temporary beside the entry, never the entry.
        (entry.parent / f".{entry.name}.tmp").write_bytes(entry.read_bytes()[:10])
        entry.unlink()
    assert calls(g, 3, cache) == (70, ["a", "b", "c"])
    assert cache.stats().corrupted == 0


# Where the processes of the test below meet, and which one this is: `(folder, me)`, set by
# the child script. A record keyed as empty, so that it is no part of any node's key.
MEETING = CallRecord()


class Meets(soma.Node):
    """Adds `k`, once every process running the shared-folder test is in this node: the
    processes compute each node at the same time and write its entry at the same time."""

    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: Any, ctx: Any) -> Any:
        CALLS.append(ctx.node)
        folder, me = MEETING[0]
        (Path(folder) / f"in-{ctx.node}-{me}").touch()
        deadline = time.monotonic() + SUBPROCESS_DEADLINE
        while len(list(Path(folder).glob(f"in-{ctx.node}-*"))) < 2:
            assert time.monotonic() < deadline, f"the other process never came to {ctx.node}"
            time.sleep(0.005)
        return x + self.k


_SHARED_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import soma
import test_cache as t

t.MEETING.append(({folder!r}, {me!r}))
cache = soma.Cache({folder!r} + "/cache")
g = soma.Graph.somatize(t.Meets(1).named("a") >> t.Meets(2).named("b") >> t.Meets(3).named("c"))
print(g.forward(3, cache=cache), ",".join(t.CALLS))
"""


def test_two_processes_at_once_share_one_folder_and_a_third_finds_every_entry(
    tmp_path: Path,
) -> None:
    def script(me: str) -> str:
        return _SHARED_SCRIPT.format(tests=str(Path(__file__).parent), folder=str(tmp_path), me=me)

    children = [
        subprocess.Popen(
            [sys.executable, "-c", script(me)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("left", "right")
    ]
    for child in children:
        out, err = child.communicate(timeout=SUBPROCESS_DEADLINE + 10)
        assert child.returncode == 0, err
        # Each was in each node while the other was: neither found an entry the other wrote.
        assert out.split() == ["9", "a,b,c"], out
    third = subprocess.run(
        [sys.executable, "-c", script("third")],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
        check=True,
    )
    assert third.stdout.split() == ["9"]  # Nothing called: every entry is found.


# ---------------------------------------------------------------------------------------------
# Digests


def test_a_dict_in_another_order_is_another_value_since_a_node_can_read_its_order(
    cache: soma.Cache,
) -> None:
    assert _fingerprint.digest({"a": 1, "b": [2.0]}) != _fingerprint.digest({"b": [2.0], "a": 1})
    g = soma.Graph.somatize(Fn(list).named("keys"))
    assert g.forward({"a": 1, "b": 2}, cache=cache) == ["a", "b"]
    assert g.forward({"b": 2, "a": 1}, cache=cache) == ["b", "a"]


def test_a_set_digest_does_not_depend_on_the_order_its_members_were_added() -> None:
    assert _fingerprint.digest({"a", "b", 1}) == _fingerprint.digest({1, "b", "a"})
    assert _fingerprint.digest(frozenset({"a", "b"})) != _fingerprint.digest({"a", "b"})


def test_digests_tell_apart_what_is_different() -> None:
    different = [1, 1.0, True, "1", b"1", [1], (1,), {1}, {"1": 1}, None, np.int64(1)]
    digests = {_fingerprint.digest(value) for value in different}
    assert len(digests) == len(different)


def test_an_array_is_digested_by_dtype_shape_and_bytes() -> None:
    x = np.arange(6.0)
    assert _fingerprint.digest(x) == _fingerprint.digest(x.copy())
    assert _fingerprint.digest(x) != _fingerprint.digest(x.astype(np.float32))
    assert _fingerprint.digest(x) != _fingerprint.digest(x.reshape(2, 3))
    # A strided view is digested as the values it shows.
    assert _fingerprint.digest(x[::2]) == _fingerprint.digest(np.array([0.0, 2.0, 4.0]))


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        dtype=hnp.scalar_dtypes() | hnp.byte_string_dtypes() | hnp.unicode_string_dtypes(),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
    ),
    st.booleans(),
)
def test_an_array_alone_is_digested_as_the_walk_digests_it_inside_a_value(
    array: np.ndarray[Any, Any], strided: bool
) -> None:
    # An array alone skips the walk (`_digest_at`): what it feeds must be what the walk feeds
    # for the same array, met anywhere, or a value would key otherwise alone than inside a list.
    if strided and array.ndim:
        array = array[::2]
    out = bytearray()
    _fingerprint._feed(array, "", out, frozenset())
    assert _fingerprint.digest(array) == soma._soma.blake3(out)
    assert _fingerprint.digest_items([array])[1] == [_fingerprint.digest(array)]


@settings(max_examples=200, deadline=None)
@given(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True)
    | st.text()
    | st.binary()
    | st.complex_numbers()
)
def test_a_number_or_a_string_alone_is_digested_as_the_walk_digests_it(value: Any) -> None:
    out = bytearray()
    _fingerprint._feed(value, "", out, frozenset())
    assert _fingerprint.digest(value) == soma._soma.blake3(out)
    assert _fingerprint.digest_items([value])[1] == [_fingerprint.digest(value)]


def test_an_array_whose_field_names_are_changed_in_place_is_digested_anew() -> None:
    # A dtype's own part of a digest is remembered by the dtype, but only where it has no
    # fields: a structured dtype's names can be set in place.
    x = np.zeros(3, dtype=[("a", "f8"), ("b", "i4")])
    before = _fingerprint.digest(x)
    assert _fingerprint.digest(x) == before
    x.dtype.names = ("c", "d")
    assert _fingerprint.digest(x) != before
    assert _fingerprint.digest(x) == _fingerprint.digest(
        np.zeros(3, dtype=[("c", "f8"), ("d", "i4")])
    )


def test_a_value_nested_deeper_than_the_recursion_limit_and_one_holding_itself_have_digests() -> (
    None
):
    deep: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]
    loop: list[Any] = [1]
    loop.append(loop)
    assert len(_fingerprint.digest(deep)) == 32
    assert _fingerprint.digest(loop) != _fingerprint.digest([1, [1]])


def test_digests_are_the_same_in_another_process_with_another_hash_seed() -> None:
    value = {"b": {3, 1, 2}, "a": ("x", 1.5), "c": frozenset({"p", "q"})}
    script = textwrap.dedent(f"""
        from soma.cache import _fingerprint
        print(_fingerprint.digest({value!r}).hex())
    """)
    there = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    assert there.stdout.strip() == _fingerprint.digest(value).hex()


def test_blake3_reads_an_array_in_place_as_its_bytes() -> None:
    x = np.arange(1000.0)
    assert soma._soma.blake3(x) == soma._soma.blake3(x.tobytes())
    with pytest.raises(BufferError, match="not C-contiguous"):
        soma._soma.blake3(x[::2])


def test_blake3_gives_the_published_digest_of_the_empty_input() -> None:
    assert soma._soma.blake3(b"").hex() == (
        "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    )


_KILLED_WRITER = """
import os
import sys
import threading

sys.path.insert(0, {tests!r})
import soma
import soma.cache._cache
import test_cache as t

real_fdopen = os.fdopen


class Stalled:
    # Writes the first half of an entry, says so, and never writes the rest.
    def __init__(self, file):
        self.file = file

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, data):
        self.file.write(data[: len(data) // 2])
        self.file.flush()
        print("writing", flush=True)
        threading.Event().wait()


soma.cache._cache.os.fdopen = lambda fd, mode: Stalled(real_fdopen(fd, mode))
t.chain().forward(3, cache=soma.Cache({folder!r}))
"""


def test_a_writer_killed_mid_write_leaves_no_entry_and_the_next_run_computes_it(
    tmp_path: Path,
) -> None:
    script = _KILLED_WRITER.format(tests=str(Path(__file__).parent), folder=str(tmp_path))
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    killer = threading.Timer(SUBPROCESS_DEADLINE, child.kill)
    killer.start()
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writing"
        child.kill()  # SIGKILL: no handler, no cleanup
        child.communicate()
    finally:
        killer.cancel()
    cache = soma.Cache(tmp_path)
    assert _entries(cache) == []
    assert len(list(tmp_path.glob("*/.*.tmp"))) == 1  # what the killed writer left
    assert calls(chain(), 3, cache) == (70, ["a", "b", "c"])
    assert cache.stats().corrupted == 0


# ---------------------------------------------------------------------------------------------
# A size bound


def on_threads(run: Callable[[int], None], count: int) -> None:
    """Runs ``run(0)`` to ``run(count - 1)``, each on a thread of its own, and waits for them
    all, with a deadline."""
    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SUBPROCESS_DEADLINE)
    assert not any(thread.is_alive() for thread in threads)


class Blob(soma.Node):
    """Outputs 1,000 bytes more than it read."""

    def forward(self, x: bytes) -> bytes:
        CALLS.append(self._soma_id or "blob")
        return x + b"x" * 1000


@pytest.fixture(params=["memory", "folder"])
def bounded(request: pytest.FixtureRequest, tmp_path: Path) -> soma.Cache:
    """A cache with room for two of `Blob`'s entries and not three."""
    if request.param == "memory":
        return soma.Cache(max_bytes=2_700)
    return soma.Cache(tmp_path / "cache", max_bytes=2_700)


def test_max_bytes_evicts_the_least_recently_used_entry_first(bounded: soma.Cache) -> None:
    g = soma.Graph.somatize(Blob().named("blob"))
    for x in (b"1", b"2", b"3"):
        calls(g, x, bounded)
    assert bounded.stats().evicted == 1
    assert len(bounded) == 2
    assert calls(g, b"3", bounded)[1] == []
    assert calls(g, b"2", bounded)[1] == []
    assert calls(g, b"1", bounded)[1] == ["blob"]


def test_a_hit_counts_as_a_use_so_an_entry_read_often_outlives_newer_ones(
    bounded: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Blob().named("blob"))
    calls(g, b"often", bounded)
    calls(g, b"once", bounded)
    calls(g, b"often", bounded)  # used again: now the most recent
    calls(g, b"newer", bounded)  # over the bound: the least recently used goes
    assert calls(g, b"often", bounded)[1] == []
    assert calls(g, b"once", bounded)[1] == ["blob"]


def test_a_memory_cache_used_by_many_threads_at_once_counts_every_lookup_and_keeps_its_bound() -> (
    None
):
    # Room for 30 of `Blob`'s entries; eight threads, each filing 50 inputs of its own and
    # reading each back at once, with no Python lock between them (`cache_state.rs`).
    size = len(pickle.dumps(b"0000" + b"x" * 1000, protocol=5))
    cache = soma.Cache(max_bytes=30 * size)
    g = soma.Graph.somatize(Blob().named("blob"))
    start = threading.Barrier(8)
    wrong: list[tuple[bytes, Any]] = []

    def run(thread: int) -> None:
        start.wait(timeout=SUBPROCESS_DEADLINE)
        for i in range(50):
            x = b"%04d" % (thread * 50 + i)
            for _ in range(2):
                result = g.forward(x, cache=cache)
                if result != x + b"x" * 1000:
                    wrong.append((x, result))

    on_threads(run, 8)
    assert wrong == []
    stats = cache.stats()
    assert stats.hits + stats.misses == 800
    assert stats.misses >= 400  # Each input's first run; a second finds it, or it was evicted.
    assert stats.bytes_written == stats.misses * size
    assert len(cache) == 30
    assert stats.evicted == stats.misses - 30


def test_an_entry_larger_than_the_bound_is_not_kept(tmp_path: Path) -> None:
    for cache in (soma.Cache(max_bytes=500), soma.Cache(tmp_path, max_bytes=500)):
        g = soma.Graph.somatize(Blob().named("big"))
        calls(g, b"", cache)
        assert len(cache) == 0
        assert calls(g, b"", cache)[1] == ["big"]


_BOUNDED_SCRIPT = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
import soma
import test_cache as t

folder, me = Path({folder!r}), {me!r}
cache = soma.Cache(folder / "cache", max_bytes={bound})
g = soma.Graph.somatize(t.Blob().named("blob"))
# Both writers start together, so that their writes interleave.
(folder / f"ready-{{me}}").touch()
deadline = time.monotonic() + 20
while len(list(folder.glob("ready-*"))) < 2:
    assert time.monotonic() < deadline, "the other writer never came"
    time.sleep(0.005)
for k in range({entries}):
    g.forward(f"{{me}}-{{k}}".encode(), cache=cache)
print(cache.stats().evicted)
"""


def test_two_processes_filling_one_bounded_folder_at_once_keep_it_within_the_bound(
    tmp_path: Path,
) -> None:
    bound, entries = 10_000, 40  # Each writes four times the bound, in entries of ~1.1 kB.
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _BOUNDED_SCRIPT.format(
                    tests=str(Path(__file__).parent),
                    folder=str(tmp_path),
                    me=me,
                    bound=bound,
                    entries=entries,
                ),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("left", "right")
    ]
    evicted = 0
    for child in children:
        out, err = child.communicate(timeout=SUBPROCESS_DEADLINE)
        assert child.returncode == 0, err
        evicted += int(out)
    held = sum(file.stat().st_size for file in (tmp_path / "cache").glob("*/*.entry"))
    assert 0 < held <= bound
    # What was written and is no longer there was removed by one writer or the other.
    assert evicted == 2 * entries - len(soma.Cache(tmp_path / "cache"))


def test_a_bounded_folder_counts_what_another_process_wrote_since_it_was_opened(
    tmp_path: Path,
) -> None:
    bound = 10_000
    cache = soma.Cache(tmp_path / "cache", max_bytes=bound)  # Opened while still empty.
    other = _BOUNDED_SCRIPT.format(
        tests=str(Path(__file__).parent), folder=str(tmp_path), me="other", bound=bound, entries=8
    )
    (tmp_path / "ready-here").touch()  # This process is the other writer of the rendezvous.
    subprocess.run(
        [sys.executable, "-c", other], capture_output=True, timeout=SUBPROCESS_DEADLINE, check=True
    )
    g = soma.Graph.somatize(Blob().named("blob"))
    for k in range(8):  # Each fits beside what this process wrote; not beside the other's too.
        calls(g, f"here-{k}".encode(), cache)
    held = sum(file.stat().st_size for file in (tmp_path / "cache").glob("*/*.entry"))
    assert held <= bound
    assert cache.stats().evicted > 0


def test_a_bounded_folder_counts_what_it_holds_again_after_it_was_cleared(
    tmp_path: Path,
) -> None:
    from soma import cache as command

    cache = soma.Cache(tmp_path, max_bytes=2_700)
    g = soma.Graph.somatize(Blob().named("blob"))
    calls(g, b"1", cache)
    calls(g, b"2", cache)
    command.clear(tmp_path)  # The count still says two entries: the next write scans.
    for x in (b"3", b"4"):
        calls(g, x, cache)
    assert len(cache) == 2
    assert cache.stats().evicted == 0


def test_entries_written_without_the_bound_are_counted_at_a_bounded_writers_next_scan(
    tmp_path: Path,
) -> None:
    g = soma.Graph.somatize(Blob().named("blob"))
    bounded = soma.Cache(tmp_path, max_bytes=2_700)
    calls(g, b"first", bounded)
    for x in (b"1", b"2", b"3"):  # Past the bound, uncounted.
        calls(g, x, soma.Cache(tmp_path))
    calls(g, b"4", bounded)  # The count says it fits: no scan yet.
    assert len(bounded) == 5
    calls(g, b"5", bounded)  # Now it would not: the scan finds all six and keeps two.
    assert len(bounded) == 2
    assert calls(g, b"5", bounded)[1] == []


def test_max_bytes_must_be_a_count_of_bytes() -> None:
    with pytest.raises(ValueError, match="max_bytes must be an int of at least 0, not -1"):
        soma.Cache(max_bytes=-1)


# ---------------------------------------------------------------------------------------------
# python -m soma.cache


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "soma.cache", *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
    )


def test_the_command_clears_a_folder_and_the_next_run_computes_everything(tmp_path: Path) -> None:
    cache = soma.Cache(tmp_path)
    calls(chain(), 3, cache)
    cleared = _cli(str(tmp_path), "--clear")
    assert cleared.stdout.strip() == f"{tmp_path}: removed 3 files"
    assert _entries(cache) == []
    assert calls(chain(), 3, cache)[1] == ["a", "b", "c"]


def test_the_command_says_when_there_is_no_folder(tmp_path: Path) -> None:
    missing = _cli(str(tmp_path / "nope"))
    assert missing.returncode == 1
    assert "no cache folder at" in missing.stderr


def test_a_class_without_source_is_fingerprinted_by_its_compiled_code() -> None:
    def made(body: str) -> object:
        scope: dict[str, Any] = {"soma": soma}
        exec(f"class Typed(soma.Node):\n    def forward(self, x):\n        return {body}", scope)
        return scope["Typed"]()

    assert _fingerprint.fingerprint(made("x + 1")) == _fingerprint.fingerprint(made("x + 1"))
    assert _fingerprint.fingerprint(made("x + 1")) != _fingerprint.fingerprint(made("x + 2"))


class Asks(soma.Node):
    def forward(self, x: Any, ctx: soma.Ctx) -> Any:
        CALLS.append("asks")
        if ctx.turn == 0:
            return soma.Await([x])
        return ctx.results[0]


class Counting:
    def __init__(self) -> None:
        self.performed = 0

    def perform(self, requests: list[Any]) -> list[Any]:
        self.performed += 1
        return [request * 100 for request in requests]


def test_a_node_that_awaited_is_kept_with_its_final_output_and_the_driver_is_not_asked_again(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Asks().named("asks") >> Shift(1).named("after"))
    driver = Counting()
    assert g.forward(2, driver=driver, cache=cache) == 201
    CALLS.clear()
    assert g.forward(2, driver=driver, cache=cache) == 201
    assert (CALLS, driver.performed) == ([], 1)


# ---------------------------------------------------------------------------------------------
# Random graphs, random edits


class Versioned(soma.Node):
    """Returns its id and version around what it read: a stale hit would show in the result."""

    def __init__(self, version: int) -> None:
        self.version = version

    def forward(self, x: Any, ctx: soma.Ctx) -> Any:
        CALLS.append(ctx.node)
        if isinstance(x, dict):
            x = sorted(x.items())
        return (ctx.node, self.version, x)


def _downstream(dag: Dag, edited: set[str]) -> list[str]:
    reached: set[str] = set()
    pending = list(edited)
    while pending:
        node = pending.pop()
        if node not in reached:
            reached.add(node)
            pending.extend(dag.successors(node))
    return sorted(reached)


@settings(max_examples=60)
@given(dag=dags(max_nodes=8), picks=st.lists(st.integers(min_value=0), max_size=3))
def test_a_cached_rerun_after_random_edits_equals_an_uncached_run_and_calls_what_they_reach(
    dag: Dag, picks: list[int]
) -> None:
    if not dag.nodes:
        return
    nodes = {node: Versioned(0) for node in dag.nodes}
    g = soma.Graph()
    for node in dag.nodes:
        g.node(node, nodes[node])
    for source, target in dag.edges:
        g.edge(source, target)
    cache = soma.Cache()
    g.forward(1, cache=cache)
    edited = {dag.nodes[pick % len(dag.nodes)] for pick in picks}
    for node in edited:
        nodes[node].version += 1
    CALLS.clear()
    cached = g.forward(1, cache=cache)
    called = sorted(CALLS)
    assert cached == g.forward(1)
    assert called == _downstream(dag, edited)


def test_blake3_of_a_large_buffer_split_between_threads_is_the_digest_fed_piece_by_piece() -> None:
    # From the size it splits at (2 MiB), a length BLAKE3's tree cuts unevenly, and larger.
    for size in (2 << 20, (3 << 20) + 777, 8 << 20, (40 << 20) + 12_345):
        data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
        hasher = soma._soma.Hasher()
        for start in range(0, size, 1 << 20):
            hasher.update(data[start : start + (1 << 20)])
        assert soma._soma.blake3(data) == hasher.digest()


def test_a_cache_that_is_not_a_soma_cache_is_refused_with_a_hint() -> None:
    with pytest.raises(TypeError, match=r"cache is a soma.Cache, not .* `dict`\nhint: "):
        chain().forward(1, cache={})  # type: ignore[arg-type]


def test_rust_nodes_are_keyed_on_what_they_were_made_with(cache: soma.Cache) -> None:
    first = soma.Graph.somatize(soma.native.Add(1).named("x") >> soma.native.Add(2).named("y"))
    assert first.forward(1, cache=cache) == 4
    assert first.forward(1, cache=cache) == 4
    assert cache.stats().hits == 2
    changed = soma.Graph.somatize(soma.native.Add(5).named("x") >> soma.native.Add(2).named("y"))
    assert changed.forward(1, cache=cache) == 8
    assert cache.stats().hits == 2


def test_threads_sharing_one_folder_cache_at_once_all_get_the_right_results(
    tmp_path: Path,
) -> None:
    cache = soma.Cache(tmp_path)
    start = threading.Barrier(8)
    results: list[Any] = []
    lock = threading.Lock()

    def run(x: int) -> None:
        start.wait(timeout=SUBPROCESS_DEADLINE)
        for _ in range(5):
            result = chain().forward(x % 3, cache=cache)
            with lock:
                results.append((x % 3, result))

    on_threads(run, 8)
    assert sorted(set(results)) == [(0, 10), (1, 30), (2, 50)]
    assert len(results) == 40
    assert cache.stats().corrupted == 0
    assert len(_entries(cache)) == 9


def test_a_node_changed_to_compute_the_same_output_leaves_what_follows_it_hitting(
    cache: soma.Cache,
) -> None:
    b = Shift(1).named("b")
    g = soma.Graph.somatize(Scale(2).named("a") >> b >> Scale(10).named("c"))
    calls(g, 3, cache)
    b.note = "an attribute forward does not read"  # type: ignore[attr-defined]
    assert calls(g, 3, cache) == (70, ["b"])


def test_would_hit_says_which_nodes_a_forward_would_find_without_running_or_counting(
    cache: soma.Cache,
) -> None:
    b = Shift(1).named("b")
    g = soma.Graph.somatize(Scale(2).named("a") >> b >> Scale(10).named("c"))
    CALLS.clear()
    assert cache.would_hit(g, 3) == {"a": False, "b": False, "c": False}
    calls(g, 3, cache)
    before = cache.stats()
    CALLS.clear()
    assert cache.would_hit(g, 3) == {"a": True, "b": True, "c": True}
    assert cache.would_hit(g, 4) == {"a": False, "b": False, "c": False}
    b.by = 2
    assert cache.would_hit(g, 3) == {"a": True, "b": False, "c": False}
    assert CALLS == []
    assert cache.stats() == before


def test_would_hit_counts_a_damaged_entry_as_missing(tmp_path: Path) -> None:
    cache = soma.Cache(tmp_path)
    g = soma.Graph.somatize(Scale(2).named("a"))
    calls(g, 3, cache)
    (entry,) = _entries(cache)
    entry.write_bytes(entry.read_bytes()[:-1])
    assert cache.would_hit(g, 3) == {"a": False}


def _drawn_after_an_edit(cache: soma.Cache) -> tuple[soma.Graph, soma.Plan]:
    """A three-node chain run once with ``cache``, its middle node then edited: the plan drawn
    with what would hit (``a`` only)."""
    b = Shift(1).named("b")
    g = soma.Graph.somatize(Scale(2).named("a") >> b >> Scale(10).named("c"))
    calls(g, 3, cache)
    b.by = 2
    return g, g.plan(cache=cache, input=3)


def test_a_plan_asked_for_with_a_cache_lists_the_nodes_that_would_hit_and_equals_the_plan(
    cache: soma.Cache,
) -> None:
    g, plan = _drawn_after_an_edit(cache)
    before = cache.stats()
    assert plan.cached == ["a"]
    assert plan == g.plan()
    assert g.plan().cached is None
    assert g.plan(cache=cache, input=4).cached == []
    assert cache.stats() == before


def test_the_text_tree_of_a_plan_with_a_cache_marks_each_node_that_would_hit(
    cache: soma.Cache,
) -> None:
    _, plan = _drawn_after_an_edit(cache)
    assert str(plan) == "Sequence\n├── a <- (input) (cached)\n├── b <- a\n└── c <- b"


def test_the_mermaid_drawing_of_a_plan_with_a_cache_labels_and_fills_each_node_that_would_hit(
    cache: soma.Cache,
) -> None:
    _, plan = _drawn_after_an_edit(cache)
    mermaid = plan.to_mermaid()
    assert 'a["a (cached)"]' in mermaid
    assert 'b["b"]' in mermaid
    assert mermaid.endswith("    class a soma_cached\n")
    assert "classDef soma_cached fill:" in mermaid


def test_the_dot_drawing_of_a_plan_with_a_cache_labels_and_fills_each_node_that_would_hit(
    cache: soma.Cache,
) -> None:
    _, plan = _drawn_after_an_edit(cache)
    dot = plan.to_dot()
    assert '"a" [label="a (cached)", fillcolor="#d9f2e3", color="#2f855a"];' in dot
    assert '    "b";' in dot


def test_the_svg_drawing_of_a_plan_with_a_cache_draws_each_node_that_would_hit_apart(
    cache: soma.Cache,
) -> None:
    _, plan = _drawn_after_an_edit(cache)
    svg = plan.to_svg()
    assert svg.count('<g class="node cached">') == 1
    assert ">a (cached)</text>" in svg
    assert ">b</text>" in svg


def test_a_plan_asked_for_with_something_else_than_a_cache_is_refused_with_a_hint() -> None:
    g = soma.Graph.somatize(Scale(2).named("a"))
    with pytest.raises(TypeError, match="not an object of type `dict`\nhint: "):
        g.plan(cache={}, input=1)  # type: ignore[arg-type]


class Held(soma.Node):
    def __init__(self, held: object) -> None:
        self.held = held

    def forward(self, x: int) -> int:
        return x


class Slotted:
    __slots__ = ("__weakref__", "k")

    def __init__(self, k: object) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        return x


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (1, 2),
        (1, 1.0),  # Equal, but not the same: `==` would miss it.
        (1, True),
        (0.0, -0.0),
        ("a", "b"),
        ((1, 2), (1, 3)),
        (frozenset({1}), frozenset({2})),
    ],
)
def test_a_remembered_fingerprint_changes_when_an_attribute_is_rebound_even_to_an_equal_value(
    before: object, after: object
) -> None:
    node = Held(before)
    first = _fingerprint.fingerprint(node)
    assert _fingerprint.fingerprint(node) == first
    node.held = after
    assert _fingerprint.fingerprint(node) != first
    node.held = before
    assert _fingerprint.fingerprint(node) == first


def test_a_fingerprint_sees_a_value_changed_in_place_inside_a_tuple() -> None:
    inner = [1]
    node = Held((inner, 2))
    first = _fingerprint.fingerprint(node)
    inner.append(2)
    assert _fingerprint.fingerprint(node) != first


def test_a_remembered_fingerprint_changes_when_an_attribute_is_added_or_removed() -> None:
    node = Held(1)
    first = _fingerprint.fingerprint(node)
    node.extra = 2  # type: ignore[attr-defined]
    second = _fingerprint.fingerprint(node)
    del node.extra  # type: ignore[attr-defined]
    del node.held
    third = _fingerprint.fingerprint(node)
    assert len({first, second, third}) == 3


def test_a_remembered_fingerprint_changes_when_the_class_is_swapped() -> None:
    class Other(Held):
        def forward(self, x: int) -> int:
            return x + 1

    node = Held(1)
    first = _fingerprint.fingerprint(node)
    node.__class__ = Other
    assert _fingerprint.fingerprint(node) != first


def test_a_remembered_fingerprint_of_a_node_with_slots_changes_when_a_slot_is_rebound() -> None:
    node = Slotted(1)
    first = _fingerprint.fingerprint(node)
    node.k = 1.0
    assert _fingerprint.fingerprint(node) != first


def test_a_remembered_fingerprint_is_the_one_digested_afresh() -> None:
    node = Held(("a", 1, None))
    remembered = [_fingerprint.fingerprint(node) for _ in range(2)]
    fresh = _fingerprint.fingerprint(Held(("a", 1, None)))
    assert remembered == [fresh, fresh]


def test_a_node_given_a_list_is_no_longer_remembered_and_sees_the_list_change() -> None:
    node = Held(1)
    _fingerprint.fingerprint(node)
    items: list[int] = []
    node.held = items
    first = _fingerprint.fingerprint(node)
    assert id(node) not in _fingerprint._REMEMBERED
    items.append(1)
    assert _fingerprint.fingerprint(node) != first


def test_a_remembered_fingerprint_is_forgotten_with_its_node() -> None:
    import gc

    node = Held(1)
    _fingerprint.fingerprint(node)
    where = id(node)
    assert where in _fingerprint._REMEMBERED
    del node
    gc.collect()
    assert where not in _fingerprint._REMEMBERED


# ---------------------------------------------------------------------------------------------
# Inside `each`, `switch` and `loop`

# Items a `Flaky` node fails on: outside its state, so that mending it changes no fingerprint.
# The items that fail, as a flaky service fails: no part of any key, as a network error is not
# (keyed as an empty record, see `CallRecord`).
FAILING = CallRecord()


class Flaky(soma.Node):
    def forward(self, x: int) -> int:
        CALLS.append(f"flaky {x}")
        if x in FAILING:
            raise ValueError(f"item {x}")
        return x + 1


def kind(x: int) -> str:
    """Whether `x` is even, its call recorded."""
    CALLS.append("kind")
    return "even" if x % 2 == 0 else "odd"


def test_an_each_rerun_with_one_item_changed_calls_its_body_for_that_item_only(
    cache: soma.Cache,
) -> None:
    body = Scale(2).named("a") >> Shift(1).named("b")
    g = soma.Graph.somatize(soma.each(body, in_flight=1).named("m"))
    assert calls(g, [1, 2, 3], cache) == ([3, 5, 7], ["a", "b"] * 3)
    assert calls(g, [1, 20, 3], cache) == ([3, 41, 7], ["a", "b"])
    assert calls(g, [1, 20, 3], cache) == ([3, 41, 7], [])


def test_a_switch_rerun_calls_neither_its_selector_nor_its_case(cache: soma.Cache) -> None:
    route = soma.switch(kind, {"even": Scale(2).named("half"), "odd": Shift(1).named("up")}).named(
        "route"
    )
    g = soma.Graph.somatize(Shift(0).named("first") >> route)
    assert calls(g, 4, cache) == (8, ["first", "kind", "half"])
    assert calls(g, 4, cache) == (8, [])
    # Another input asks the selector again and runs the other case, and only it.
    assert calls(g, 5, cache) == (6, ["first", "kind", "up"])


def test_a_loop_rerun_calls_neither_its_body_nor_its_predicate(cache: soma.Cache) -> None:
    seen = CallRecord()  # What it was called on, keyed as an empty record: no part of its key.

    def done(x: int) -> bool:
        seen.append(x)
        return x >= 8

    g = soma.Graph.somatize(soma.loop(Scale(2).named("twice"), until=done, max_iterations=10))
    assert calls(g, 1, cache) == (8, ["twice"] * 3)
    assert seen == [2, 4, 8]
    assert calls(g, 1, cache) == (8, [])
    assert seen == [2, 4, 8]
    # From 2 the loop meets iterations it ran before: found, not computed.
    assert calls(g, 2, cache) == (8, [])


def test_a_selector_is_looked_up_as_any_node_is(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(
        soma.switch(kind, {"even": Scale(2).named("half"), "odd": Shift(1).named("up")})
    )
    assert calls(g, 4, cache) == (8, ["kind", "half"])
    assert calls(g, 4, cache) == (8, [])


def test_hits_inside_steps_are_counted_in_the_stats(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(soma.each(Scale(2).named("a") >> Shift(1).named("b")))
    g.forward([1, 2], cache=cache)
    assert (cache.stats().hits, cache.stats().misses) == (0, 4)
    g.forward([2, 1], cache=cache)  # another list: the step runs, its items' nodes all hit
    assert (cache.stats().hits, cache.stats().misses) == (4, 4)


def test_an_each_and_a_switch_found_whole_read_nothing_they_would_have_run_on(
    cache: soma.Cache,
) -> None:
    called = CallRecord()

    class Parts(soma.Node):
        def forward(self, n: int) -> list[list[int]]:
            called.append("parts")
            return [list(range(i * 1000, i * 1000 + 1000)) for i in range(n)]

    class Total(soma.Node):
        def forward(self, part: list[int]) -> int:
            called.append("total")
            return sum(part)

    class Largest(soma.Node):
        def forward(self, totals: list[int]) -> int:
            called.append("largest")
            return max(totals)

    def size(totals: list[int]) -> str:
        called.append("size")
        return "big" if sum(totals) > 10**6 else "small"

    g = soma.Graph.somatize(
        Parts()
        >> soma.each(Total()).named("totals")
        >> soma.switch(size, {"big": Largest(), "small": None}).named("pick")
    )
    first = g.forward(4, cache=cache)
    assert called == ["parts", "total", "total", "total", "total", "size", "largest"]
    called.clear()
    before = cache.stats()
    assert g.forward(4, cache=cache) == first
    assert called == []
    # Neither the parts the `each` ran over (found, left unread), nor the totals the switch
    # chose on, read again: each step found whole is one hit, and its output is all it read.
    assert cache.stats().hits - before.hits == 3
    assert cache.stats().bytes_read - before.bytes_read < 1000


def test_a_traced_rerun_marks_the_hits_inside_an_each_cached(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(soma.each(Scale(2).named("a")).named("m"))
    g.forward([1], cache=cache)
    trace = soma.Trace()
    g.forward([1, 1], cache=cache, trace=trace)  # another list: its items run, and hit
    spans = {span.node: span for span in trace.spans}
    assert spans["m/a"].cached
    assert spans["m/a"].turns == 0
    assert not spans["m[0]"].cached
    trace = soma.Trace()
    g.forward([1], cache=cache, trace=trace)  # the same list: the step is found whole
    assert [(span.node, span.cached) for span in trace.spans] == [("m", True)]


def test_an_each_that_failed_at_an_item_resumes_from_that_item(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(soma.each(Flaky(), in_flight=1))
    FAILING.append(7)
    try:
        with pytest.raises(ValueError, match="item 7"):
            calls(g, list(range(10)), cache)
        # One item at a time: the items after the failing one never started.
        called = list(CALLS)
        assert called == [f"flaky {x}" for x in range(8)]
    finally:
        FAILING.clear()
    assert calls(g, list(range(10)), cache) == (
        list(range(1, 11)),
        ["flaky 7", "flaky 8", "flaky 9"],
    )


class Uncached(soma.Node):
    cacheable = False

    def forward(self, x: Any) -> Any:
        CALLS.append(self._soma_id or "uncached")
        return x


def test_a_step_found_whole_is_found_again_only_while_every_node_it_may_run_is_unchanged(
    cache: soma.Cache,
) -> None:
    inner = Scale(2).named("double")
    deep = Shift(1).named("deep")
    taken, untaken = Scale(1).named("big"), Scale(3).named("small")  # lists, repeated
    g = soma.Graph.somatize(
        soma.each(inner >> soma.each(deep).named("inner")).named("outer")
        >> soma.switch(
            lambda xs: "big" if len(xs) > 1 else "small", {"big": taken, "small": untaken}
        )
    )
    x = [[1, 2], [3]]
    assert calls(g, x, cache)[0] == [[2, 3, 2, 3], [4, 4]]
    first = calls(g, x, cache)
    assert first == ([[2, 3, 2, 3], [4, 4]], [])  # found whole: nothing called
    inner.k = 3  # a node inside the `each`, edited
    assert calls(g, x, cache)[0] != first[0]
    deep.by = 2  # a node in an `each` inside it
    edited = calls(g, x, cache)
    assert "deep" in edited[1]
    untaken.k = 4  # the case not taken: the selector and the taken case hit
    assert calls(g, x, cache) == (edited[0], [])
    taken.k = 2  # the case taken: it runs again
    assert calls(g, x, cache) == (edited[0] * 2, ["big"])


def test_a_step_holding_a_node_kept_out_of_the_cache_is_never_found_whole(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(soma.each(Uncached().named("live") >> Scale(2).named("a")))
    result, called = calls(g, [1, 2], cache)
    assert (result, sorted(called)) == ([2, 4], ["a", "a", "live", "live"])
    result, called = calls(g, [1, 2], cache)
    assert (result, called) == ([2, 4], ["live", "live"])  # its own node runs, what follows hits
