"""A rerun reads only what it needs: the outputs its result is made of and the inputs of the
nodes that run; nothing else is read or unpickled (``stats().bytes_read`` says so).

A hit needs the digest of what a node read, which its entry keeps beside the output, so the
outputs of nodes that hit and that only nodes that hit read are never read. An entry gone by
the time a node that runs reads it is computed again by its node, never returned wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import soma
from conftest import CallRecord

CALLS = CallRecord()

BIG = 10_000_000  # float64s: 80 MB


class Big(soma.Node):
    def forward(self, seed: int) -> np.ndarray[Any, Any]:
        CALLS.append("big")
        return np.full(BIG, float(seed))


class Smaller(soma.Node):
    def forward(self, big: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        CALLS.append("smaller")
        return big[::100] * 2  # 800 kB


class Tiny(soma.Node):
    def __init__(self, k: float = 1.0) -> None:
        self.k = k

    def forward(self, smaller: np.ndarray[Any, Any]) -> float:
        CALLS.append("tiny")
        return float(smaller.sum()) * self.k


def calls(graph: soma.Graph, x: Any, cache: soma.Cache) -> tuple[Any, list[str]]:
    CALLS.clear()
    result = graph.forward(x, cache=cache)
    return result, list(CALLS)


@pytest.fixture(params=["memory", "folder"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> soma.Cache:
    return soma.Cache() if request.param == "memory" else soma.Cache(tmp_path / "cache")


def test_a_fully_cached_rerun_of_big_smaller_tiny_reads_under_one_percent_of_big(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Big() >> Smaller() >> Tiny())
    first, called = calls(g, 3, cache)
    assert called == ["big", "smaller", "tiny"]
    before = cache.stats()
    assert calls(g, 3, cache) == (first, [])
    read = cache.stats().bytes_read - before.bytes_read
    assert 0 < read <= 0.01 * BIG * 8
    assert cache.stats().hits - before.hits == 3


def test_a_node_that_runs_reads_what_it_reads_and_nothing_before_it(cache: soma.Cache) -> None:
    tiny = Tiny()
    g = soma.Graph.somatize(Big() >> Smaller() >> tiny)
    first, _ = calls(g, 3, cache)
    tiny.k = 2.0
    before = cache.stats()
    assert calls(g, 3, cache) == (first * 2, ["tiny"])
    read = cache.stats().bytes_read - before.bytes_read
    # `smaller`'s 800 kB, read for `tiny`; `big`'s 80 MB never.
    assert 800_000 <= read < 1_000_000


class Plus(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        CALLS.append(self._soma_id or "plus")
        return x + self.k


class Grow(soma.Node):
    """Outputs 10 kB more than it read: an entry larger than what a hit reads first."""

    def forward(self, x: bytes) -> bytes:
        CALLS.append(self._soma_id or "grow")
        return x + bytes([len(x) % 251]) * 10_000


def test_an_entry_removed_between_its_hit_and_its_read_is_computed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = soma.Cache(tmp_path / "cache")
    g = soma.Graph.somatize(Grow().named("a") >> Grow().named("b") >> Size().named("c"))
    assert calls(g, b"x", cache) == (20_001, ["a", "b", "c"])
    found = soma.Cache._find

    def found_then_removed(self: soma.Cache, key: bytes) -> tuple[bool, bytes | None, bool, object]:
        answer = found(self, key)
        self._file(key).unlink()  # By another process, say: `python -m soma.cache PATH --clear`.
        return answer

    with monkeypatch.context() as patched:
        patched.setattr(soma.Cache, "_find", found_then_removed)
        patched.setattr(Size, "extra", 1)  # `c` edited: it runs
        # `a` and `b` hit, their outputs unread; `c` runs and reads `b`'s, gone by then: `b`
        # is computed again from `a`'s, gone too, and `a` from the input.
        assert calls(g, b"x", cache) == (20_002, ["a", "b", "c"])
        assert cache.stats().corrupted == 0  # Gone is not damaged.
    # Each computed again was filed again: `a` and `b` hit.
    assert calls(g, b"x", cache) == (20_001, [])


class Size(soma.Node):
    extra = 0

    def forward(self, x: bytes) -> int:
        CALLS.append(self._soma_id or "size")
        return len(x) + self.extra


def test_a_long_chain_of_entries_that_cannot_be_read_is_computed_again_without_recursion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = soma.Cache(tmp_path / "cache")
    nodes = [Plus(1).named(f"n{i}") for i in range(3_000)]
    expr: Any = nodes[0]
    for node in nodes[1:]:
        expr = expr >> node
    g = soma.Graph.somatize(expr)
    assert g.forward(0, cache=cache) == 3_000
    nodes[-1].k = 2
    monkeypatch.setattr(soma.Cache, "_read", lambda self, unread: (False, None))
    CALLS.clear()
    assert g.forward(0, cache=cache) == 3_001
    assert len(CALLS) == 3_000


def test_a_damaged_entry_found_unread_is_counted_and_computed_again_when_read(
    tmp_path: Path,
) -> None:
    cache = soma.Cache(tmp_path / "cache")
    last = Plus(3).named("c")
    g = soma.Graph.somatize(Plus(1).named("a") >> Plus(2).named("b") >> last)
    calls(g, 10, cache)
    for entry in (tmp_path / "cache").glob("*/*.entry"):
        data = entry.read_bytes()
        entry.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # Its payload, not its record.
    last.k = 30
    assert calls(g, 10, cache) == (43, ["a", "b", "c"])
    assert cache.stats().corrupted == 2  # `a`'s and `b`'s, read for `c`; `c` missed.


def test_an_output_read_by_a_step_that_decides_is_read_when_found(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(
        Plus(1).named("a")
        >> soma.switch(
            lambda x: "odd" if x % 2 else "even",
            {
                "odd": Plus(10).named("odd"),
                "even": Plus(20).named("even"),
            },
        )
    )
    assert calls(g, 2, cache) == (13, ["a", "odd"])
    assert calls(g, 2, cache) == (13, [])
