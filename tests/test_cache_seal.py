"""A cache with a key: its folder's entries are sealed when written, and one that does not verify
— written without the key, with another, or changed since — is refused before anything of it is
unpickled: a miss, said once, its node computed again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import soma
from soma import CacheWarning

CALLS: list[str] = []


class Double(soma.Node):
    def forward(self, x: int) -> int:
        CALLS.append("double")
        return 2 * x


class Plants:
    """Writes ``marker`` when unpickled: what a forged entry could run in a process that reads
    it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path(self.marker).write_text, ("unpickled",))


def graph() -> soma.Graph:
    return soma.Graph.somatize(Double().named("double"))


def entry_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.entry"))


def test_a_sealed_entry_hits_for_a_cache_opened_with_its_key(tmp_path: Path) -> None:
    CALLS.clear()
    assert graph().forward(2, cache=soma.Cache(tmp_path, key=b"secret")) == 4
    assert graph().forward(2, cache=soma.Cache(tmp_path, key="secret")) == 4
    assert CALLS == ["double"]


@pytest.mark.parametrize(
    ("written_with", "read_with"),
    [(None, b"secret"), (b"other", b"secret")],
    ids=["unsealed", "another-key"],
)
def test_an_entry_not_sealed_with_the_key_is_refused_and_its_node_runs_again(
    tmp_path: Path, written_with: bytes | None, read_with: bytes
) -> None:
    CALLS.clear()
    graph().forward(2, cache=soma.Cache(tmp_path, key=written_with))
    sealed = soma.Cache(tmp_path, key=read_with)
    with pytest.warns(CacheWarning, match="does not verify under its key"):
        assert graph().forward(2, cache=sealed) == 4
    assert CALLS == ["double", "double"]
    assert sealed.stats().hits == 0
    # Written anew, sealed with the key: the next run hits.
    assert graph().forward(2, cache=soma.Cache(tmp_path, key=read_with)) == 4
    assert CALLS == ["double", "double"]


def test_an_entry_forged_in_the_folder_is_refused_never_unpickled(tmp_path: Path) -> None:
    CALLS.clear()
    graph().forward(2, cache=soma.Cache(tmp_path, key=b"secret"))
    (entry,) = entry_files(tmp_path)
    marker = tmp_path / "marker"
    # Whoever can write the folder, without the key, puts an entry of their own in its place.
    soma.Cache(tmp_path, key=b"forger")._store(
        "double", bytes.fromhex(entry.stem), Plants(str(marker)), None, 0.0, ""
    )
    with pytest.warns(CacheWarning, match="does not verify under its key"):
        assert graph().forward(2, cache=soma.Cache(tmp_path, key=b"secret")) == 4
    assert not marker.exists()
    assert CALLS == ["double", "double"]


def test_a_cache_without_a_key_reads_sealed_entries(tmp_path: Path) -> None:
    CALLS.clear()
    graph().forward(2, cache=soma.Cache(tmp_path, key=b"secret"))
    assert graph().forward(2, cache=soma.Cache(tmp_path)) == 4
    assert CALLS == ["double"]


def test_a_key_must_be_non_empty_bytes_or_a_str(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="key is a non-empty bytes or str"):
        soma.Cache(tmp_path, key=b"")
    with pytest.raises(ValueError, match="key is a non-empty bytes or str"):
        soma.Cache(tmp_path, key=3)  # type: ignore[arg-type]


def test_the_command_lists_sealed_entries(tmp_path: Path) -> None:
    graph().forward(2, cache=soma.Cache(tmp_path, key=b"secret"))
    from soma.cache import listing

    assert "double" in listing(tmp_path)


def test_a_sealed_folders_key_goes_with_it_to_the_hosts_which_seal_what_they_write(
    tmp_path: Path,
) -> None:
    from test_hosts import _CALLED, _Counted, _HostsHere

    soma.remote.use(_HostsHere())  # type: ignore[arg-type]
    try:
        g = soma.Graph.somatize(_Counted(1) >> _Counted(2).at("one"))
        _CALLED.clear()
        results = [g.forward(0, cache=soma.Cache(tmp_path, key=b"secret")) for _ in range(2)]
    finally:
        soma.remote.use(None)
    assert results == [3, 3]
    assert _CALLED == [1, 2]  # The host's node hit on the second run, under the key.
    files = entry_files(tmp_path)
    assert len(files) == 2
    assert all(file.read_bytes().startswith(b"SOMA-CACHE-3S") for file in files)


def test_a_sealed_entrys_payload_is_checksummed_with_blake3_which_its_seal_covers(
    tmp_path: Path,
) -> None:
    # The seal covers the record, which holds the payload's checksum: a checksum that bytes can
    # be made to match (XXH3's, which unsealed entries carry) would let a payload made so
    # through under the seal.
    from soma.cache import _cache

    graph().forward(2, cache=soma.Cache(tmp_path, key=b"secret"))
    graph().forward(3, cache=soma.Cache(tmp_path))
    sealed, unsealed = sorted(entry_files(tmp_path), key=lambda f: f.read_bytes()[:13])
    for file, algorithm in ((sealed, "blake3"), (unsealed, "xxh3")):
        whole = _cache._read_whole(file.read_bytes())
        assert whole is not None
        record, payload = whole
        assert record.algorithm == algorithm
    record, payload = _cache._read_whole(sealed.read_bytes())  # type: ignore[misc]
    assert record.checksum == soma._soma.blake3(payload)
