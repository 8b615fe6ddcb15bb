"""A rerun reads only what it needs: the outputs its result is made of and the inputs of the
nodes that run; nothing else is read or unpickled (``stats().bytes_read`` says so).

A hit needs the digest of what a node read, which its entry keeps beside the output, so the
outputs of nodes that hit and that only nodes that hit read are never read. An entry gone by
the time a node that runs reads it is computed again by its node, never returned wrong.
"""

from __future__ import annotations

import asyncio
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


# ---------------------------------------------------------------------------------------------
# The async walk: steps found whole through `aforward`, `amap`, and `forward` with async nodes

# How many `Part`s were unpickled: keyed as an empty record, so that counting changes no key.
UNPICKLED = CallRecord()


def _unpickled_part(numbers: list[int]) -> Part:
    UNPICKLED.append(len(numbers))
    return Part(numbers)


class Part:
    """Numbers whose unpickling is counted: a `Part` read back from the cache says so."""

    def __init__(self, numbers: list[int]) -> None:
        self.numbers = numbers

    def __reduce__(self) -> tuple[Any, tuple[list[int]]]:
        return (_unpickled_part, (self.numbers,))


class Parts(soma.Node):
    def forward(self, n: int) -> list[Part]:
        CALLS.append("parts")
        return [Part(list(range(i * 1000, i * 1000 + 1000))) for i in range(n)]


class Total(soma.Node):
    async def forward(self, part: Part) -> int:
        CALLS.append("total")
        await asyncio.sleep(0)
        return sum(part.numbers)


async def size(totals: list[int]) -> str:
    CALLS.append("size")
    await asyncio.sleep(0)
    return "big" if sum(totals) > 10**6 else "small"


class Pick(soma.Node):
    """The largest total, or the smallest, plus `extra`."""

    def __init__(self, largest: bool, extra: int = 0) -> None:
        self.largest = largest
        self.extra = extra

    async def forward(self, totals: list[int]) -> int:
        CALLS.append(self._soma_id or "pick")
        await asyncio.sleep(0)
        return (max(totals) if self.largest else min(totals)) + self.extra


# How a test runs the graph: each of the ways a run with async nodes is walked by the engine's
# async walk, and one with a deadline and every node retried (each call under its policy).
HOW = ["aforward", "aforward with timeout and retries", "forward", "amap"]


def run(how: str, graph: soma.Graph, x: Any, cache: soma.Cache) -> tuple[Any, list[str]]:
    CALLS.clear()
    UNPICKLED.clear()

    async def streamed() -> list[Any]:
        return [y async for y in graph.amap([x], cache=cache)]

    if how == "aforward":
        result = asyncio.run(graph.aforward(x, cache=cache))
    elif how == "aforward with timeout and retries":
        result = asyncio.run(graph.aforward(x, cache=cache, timeout=30.0))
    elif how == "forward":
        result = graph.forward(x, cache=cache)
    else:
        [result] = asyncio.run(streamed())
    return result, sorted(CALLS)


def pipeline(how: str) -> tuple[soma.Graph, Pick, Pick]:
    """`parts >> each(total) >> switch(size, {"big": largest, "small": smallest})`, its body,
    its selector and its cases async; and the two cases, to edit."""
    taken, untaken = Pick(largest=True).named("largest"), Pick(largest=False).named("smallest")
    expr = (
        Parts()
        >> soma.each(Total()).named("totals")
        >> soma.switch(size, {"big": taken, "small": untaken}).named("pick")
    )
    if "retries" in how:
        expr = expr.retry(2, backoff=0)
    return soma.Graph.somatize(expr), taken, untaken


FIRST_CALLS = sorted(["parts", "total", "total", "total", "total", "size", "largest"])


@pytest.mark.parametrize("how", HOW)
def test_a_rerun_with_async_nodes_in_its_steps_finds_each_step_whole_and_unpickles_nothing_it_read(
    cache: soma.Cache, how: str
) -> None:
    g, _, _ = pipeline(how)
    first, called = run(how, g, 4, cache)
    assert (first, called) == (3_499_500, FIRST_CALLS)
    before = cache.stats()
    assert run(how, g, 4, cache) == (first, [])
    # Neither the parts the `each` ran over (found, left unread) nor the totals the switch
    # chose on were read: `parts` and each step found whole are three hits, and the switch's
    # output is all that was read.
    assert UNPICKLED == []
    assert cache.stats().hits - before.hits == 3
    assert 0 < cache.stats().bytes_read - before.bytes_read < 1000


@pytest.mark.parametrize("how", HOW)
def test_an_async_switch_whose_untaken_case_is_edited_calls_neither_its_selector_nor_its_case(
    cache: soma.Cache, how: str
) -> None:
    g, _, untaken = pipeline(how)
    first, _ = run(how, g, 4, cache)
    untaken.extra = 1
    # The switch is not found whole (a case it may run changed): it reads the totals, and its
    # selector and the case it takes hit; the `each` before it is found whole.
    assert run(how, g, 4, cache) == (first, [])
    assert UNPICKLED == []
    # Filed whole under its new key: found whole from now on.
    before = cache.stats()
    assert run(how, g, 4, cache) == (first, [])
    assert cache.stats().hits - before.hits == 3


@pytest.mark.parametrize("how", HOW)
def test_an_async_switch_whose_taken_case_is_edited_runs_that_case_again_and_nothing_else(
    cache: soma.Cache, how: str
) -> None:
    g, taken, _ = pipeline(how)
    first, _ = run(how, g, 4, cache)
    taken.extra = 1
    assert run(how, g, 4, cache) == (first + 1, ["largest"])
    assert UNPICKLED == []
    assert run(how, g, 4, cache) == (first + 1, [])


# ---------------------------------------------------------------------------------------------
# Outputs of async nodes: left unread as a sync node's are, when only the async walk reads them


class AsyncBig(soma.Node):
    async def forward(self, seed: int) -> np.ndarray[Any, Any]:
        CALLS.append("big")
        await asyncio.sleep(0)
        return np.full(BIG, float(seed))


class AsyncSmaller(soma.Node):
    async def forward(self, big: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        CALLS.append("smaller")
        await asyncio.sleep(0)
        return big[::100] * 2  # 800 kB


class AsyncTiny(soma.Node):
    def __init__(self, k: float = 1.0) -> None:
        self.k = k

    async def forward(self, smaller: np.ndarray[Any, Any]) -> float:
        CALLS.append("tiny")
        await asyncio.sleep(0)
        return float(smaller.sum()) * self.k


@pytest.mark.parametrize("how", ["aforward", "forward", "amap"])
def test_a_fully_cached_rerun_of_async_big_smaller_tiny_reads_under_one_percent_of_big(
    cache: soma.Cache, how: str
) -> None:
    g = soma.Graph.somatize(AsyncBig() >> AsyncSmaller() >> AsyncTiny())
    first, called = run(how, g, 3, cache)
    assert called == ["big", "smaller", "tiny"]
    before = cache.stats()
    assert run(how, g, 3, cache) == (first, [])
    read = cache.stats().bytes_read - before.bytes_read
    assert 0 < read <= 0.01 * BIG * 8
    assert cache.stats().hits - before.hits == 3


def test_an_async_node_that_runs_reads_what_it_reads_and_nothing_before_it(
    cache: soma.Cache,
) -> None:
    tiny = AsyncTiny()
    g = soma.Graph.somatize(AsyncBig() >> AsyncSmaller() >> tiny)
    first, _ = run("aforward", g, 3, cache)
    tiny.k = 2.0
    before = cache.stats()
    assert run("aforward", g, 3, cache) == (first * 2, ["tiny"])
    read = cache.stats().bytes_read - before.bytes_read
    # `smaller`'s 800 kB, read for `tiny`; `big`'s 80 MB never.
    assert 800_000 <= read < 1_000_000


class AsyncGrow(soma.Node):
    """`Grow`, async."""

    async def forward(self, x: bytes) -> bytes:
        CALLS.append(self._soma_id or "grow")
        await asyncio.sleep(0)
        return x + bytes([len(x) % 251]) * 10_000


class AsyncSize(soma.Node):
    extra = 0

    async def forward(self, x: bytes) -> int:
        CALLS.append(self._soma_id or "size")
        await asyncio.sleep(0)
        return len(x) + self.extra


def test_an_async_nodes_entry_removed_between_its_hit_and_its_read_is_computed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = soma.Cache(tmp_path / "cache")
    g = soma.Graph.somatize(
        AsyncGrow().named("a") >> AsyncGrow().named("b") >> AsyncSize().named("c")
    )
    assert run("aforward", g, b"x", cache) == (20_001, ["a", "b", "c"])
    found = soma.Cache._find

    def found_then_removed(self: soma.Cache, key: bytes) -> tuple[bool, bytes | None, bool, object]:
        answer = found(self, key)
        self._file(key).unlink()
        return answer

    with monkeypatch.context() as patched:
        patched.setattr(soma.Cache, "_find", found_then_removed)
        patched.setattr(AsyncSize, "extra", 1)  # `c` edited: it runs
        # `a` and `b` hit, their outputs unread; `c` runs and reads `b`'s, gone by then: `b`
        # is awaited again on `a`'s, gone too, and `a` on the input.
        assert run("aforward", g, b"x", cache) == (20_002, ["a", "b", "c"])
        assert cache.stats().corrupted == 0
    assert run("aforward", g, b"x", cache) == (20_001, [])
