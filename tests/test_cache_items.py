"""What a first run digests once: an ``each``'s items, with the list they are in, when a node
makes it or the run is given it, each item's run keyed on that digest — never a stale one; a
``switch``'s output, digested as its case's result; a ``loop``'s values, where no call ran
between two digests of one.

The engine asks for the items' digests with the list's when an ``each`` reads it, and hands
each item's run its item's digest, where it digested each item again as its run began. It
hands them only when no node's call ran in the run since they were taken: an item that a node
may have changed in place meanwhile is digested again as its run begins, so that its run is
keyed on what it reads. A switch's output is its case's result, the same value: its digest,
taken as the case's last node returned it, is the switch's, when nothing ran since.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import soma
from conftest import DEADLINE, CallRecord, run_script
from soma.cache import _fingerprint

CALLS = CallRecord()

# Each item an array of a length of its own, so that the hashing of its bytes is told apart.
LENGTHS = (1001, 1002, 1003)


def arrays(seed: int) -> list[np.ndarray[Any, Any]]:
    return [np.full(n, float(seed + i)) for i, n in enumerate(LENGTHS)]


class Make(soma.Node):
    def forward(self, seed: int) -> list[np.ndarray[Any, Any]]:
        CALLS.append("make")
        return arrays(seed)


class Total(soma.Node):
    def forward(self, item: np.ndarray[Any, Any]) -> float:
        CALLS.append("total")
        return float(item.sum())


class AsyncTotal(soma.Node):
    async def forward(self, item: np.ndarray[Any, Any]) -> float:
        CALLS.append("total")
        await asyncio.sleep(0)
        return float(item.sum())


def always(_: object) -> str:
    return "all"


def once(_: object) -> bool:
    return True


class Scale(soma.Node):
    def __init__(self, k: float) -> None:
        self.k = k

    def forward(self, total: float) -> float:
        CALLS.append("scale")
        return total * self.k


def graph(where: str, body: Any) -> soma.Graph:
    """An ``each`` over the graph's input, over a node's output, inside a switch's case, or
    inside a loop's body."""
    step = soma.each(body).named("totals")
    if where == "over the input":
        return soma.Graph.somatize(step)
    if where == "over a node's output":
        return soma.Graph.somatize(Make() >> step)
    if where == "inside a loop":
        return soma.Graph.somatize(Make() >> soma.loop(step, until=once, max_iterations=1))
    return soma.Graph.somatize(Make() >> soma.switch(always, {"all": step}).named("pick"))


class Hashed:
    """Counts, by length in bytes, the buffers a digest hashes: `soma._soma` as
    `_fingerprint` sees it, but for its `blake3`."""

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()

    def blake3(self, data: Any) -> bytes:
        self.counts[memoryview(data).nbytes] += 1
        return bytes(_fingerprint_soma.blake3(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(_fingerprint_soma, name)


_fingerprint_soma = _fingerprint._soma


@pytest.fixture(params=["memory", "folder"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> soma.Cache:
    return soma.Cache() if request.param == "memory" else soma.Cache(tmp_path / "cache")


WHERE = ["over the input", "over a node's output", "inside a switch", "inside a loop"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("walk", ["sync", "async"])
def test_a_first_run_hashes_each_items_bytes_once(
    cache: soma.Cache, where: str, walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = Hashed()
    monkeypatch.setattr(_fingerprint, "_soma", hashed)
    g = graph(where, Total() if walk == "sync" else AsyncTotal())
    x: Any = arrays(1) if where == "over the input" else 1
    CALLS.clear()
    if walk == "sync":
        result = g.forward(x, cache=cache)
    else:
        result = asyncio.run(g.aforward(x, cache=cache))
    assert result == [float(n * (1 + i)) for i, n in enumerate(LENGTHS)]
    assert CALLS.count("total") == 3
    # Once, with the list: not again as each item's run began. Inside a switch or a loop, the
    # case's or the body's input is digested as it begins (after the selector, which may have
    # changed it): once as the step's input, once as the case's or the body's.
    times = 1 if where in ("over the input", "over a node's output") else 2
    assert [hashed.counts[8 * n] for n in LENGTHS] == [times] * 3


@pytest.mark.parametrize("where", WHERE)
def test_item_runs_keyed_on_the_digests_taken_with_the_list_hit_on_the_next_run(
    cache: soma.Cache, where: str
) -> None:
    scale = Scale(1.0)
    g = graph(where, Total() >> scale)
    x: Any = arrays(1) if where == "over the input" else 1
    first = g.forward(x, cache=cache)
    # The step edited, so that it is not found whole: its item runs are looked up one by one.
    scale.k = 2.0
    CALLS.clear()
    assert g.forward(x, cache=cache) == [2 * total for total in first]
    assert sorted(CALLS) == ["scale"] * 3


# ---------------------------------------------------------------------------------------------
# An item changed in place before its run


class StampNext(soma.Node):
    """Writes its item's stamp into the next item, in place."""

    def forward(self, item: dict[str, Any]) -> None:
        if item["next"] is not None:
            item["next"]["x"] = item["stamp"]


class ReadX(soma.Node):
    def forward(self, item: dict[str, Any]) -> int:
        CALLS.append("read")
        return int(item["x"]) * 10


class AsyncReadX(soma.Node):
    async def forward(self, item: dict[str, Any]) -> int:
        CALLS.append("read")
        await asyncio.sleep(0)
        return int(item["x"]) * 10


def chained(stamp: int) -> list[dict[str, Any]]:
    """Two items, the first naming the second: its run changes the second in place."""
    second: dict[str, Any] = {"x": 0, "stamp": 0, "next": None}
    return [{"x": 0, "stamp": stamp, "next": second}, second]


@pytest.mark.parametrize("walk", ["sync", "async"])
def test_an_item_changed_in_place_by_an_earlier_items_run_is_keyed_on_what_its_run_reads(
    cache: soma.Cache, walk: str
) -> None:
    # One item at a time: the second item's run begins after the first's changed it.
    read = ReadX() if walk == "sync" else AsyncReadX()
    g = soma.Graph.somatize(soma.each(StampNext() | read, in_flight=1))

    def second_read(stamp: int) -> int:
        if walk == "sync":
            out = g.forward(chained(stamp), cache=cache)
        else:
            out = asyncio.run(g.aforward(chained(stamp), cache=cache))
        return int(next(v for v in out[1].values() if v is not None))

    assert second_read(1) == 10
    # The second item is the same in every list given; what its run reads is not.
    assert second_read(2) == 20
    assert second_read(3) == 30


# A node of another branch under way as the list is digested: it may change an item meanwhile.
WATCHER_BEGAN = threading.Event()
ITEMS_BEGAN = threading.Event()


class Watcher(soma.Node):
    """Under way from before the list is made until its items' runs begin."""

    cacheable = False

    def forward(self, seed: int) -> int:
        WATCHER_BEGAN.set()
        assert ITEMS_BEGAN.wait(DEADLINE), "no item's run began"
        return seed


class MakeOnceWatched(soma.Node):
    def forward(self, seed: int) -> list[np.ndarray[Any, Any]]:
        assert WATCHER_BEGAN.wait(DEADLINE), "the watcher never began"
        return arrays(seed)


class TotalSeen(soma.Node):
    def forward(self, item: np.ndarray[Any, Any]) -> float:
        ITEMS_BEGAN.set()
        return float(item.sum())


def test_a_list_digested_while_another_branchs_node_runs_has_its_items_digested_as_they_run(
    cache: soma.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    WATCHER_BEGAN.clear()
    ITEMS_BEGAN.clear()
    hashed = Hashed()
    monkeypatch.setattr(_fingerprint, "_soma", hashed)
    g = soma.Graph.somatize((MakeOnceWatched() >> soma.each(TotalSeen())) | Watcher())
    out = g.forward(1, cache=cache)
    assert out == {"each": [float(n * (1 + i)) for i, n in enumerate(LENGTHS)], "watcher": 1}
    # The watcher was under way as the list was digested: each item digested again as its
    # run began, not handed the digest taken with the list.
    assert [hashed.counts[8 * n] for n in LENGTHS] == [2, 2, 2]


# ---------------------------------------------------------------------------------------------
# The digests handed are the digests


def _values() -> st.SearchStrategy[Any]:
    leaves = st.one_of(
        st.integers(),
        st.text(max_size=4),
        st.none(),
        st.builds(lambda n, v: np.full(n, v), st.integers(0, 4), st.floats(allow_nan=False)),
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner),
        max_leaves=8,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(_values(), max_size=5), st.data())
def test_the_items_digests_are_what_digest_makes_of_each_item(
    items: list[Any], data: st.DataObject
) -> None:
    # Some items held twice, in the list and inside another: what one item holds another may.
    for _ in range(data.draw(st.integers(0, 2))):
        if items:
            items.append([items[data.draw(st.integers(0, len(items) - 1))]])
    whole, each = _fingerprint.digest_items(items)
    assert whole == _fingerprint.digest(items)
    assert each == [_fingerprint.digest(item) for item in items]
    assert _fingerprint.digest_items(tuple(items)) == (
        _fingerprint.digest(tuple(items)),
        each,
    )


def test_a_value_that_is_no_list_has_no_items_digests() -> None:
    frame = {"a": [1, 2]}
    assert _fingerprint.digest_items(frame) == (_fingerprint.digest(frame), None)


# ---------------------------------------------------------------------------------------------
# Two processes

_TWO_PROCESSES = """
import sys
sys.path.insert(0, {tests!r})
import soma
from test_cache_items import CALLS, graph, Total

g = graph("over a node's output", Total())
cache = soma.Cache({folder!r})
print(g.forward(3, cache=cache), sorted(CALLS), cache.stats().hits)
"""


def test_a_second_process_finds_the_item_runs_the_first_keyed_on_the_lists_digests(
    tmp_path: Path,
) -> None:
    script = _TWO_PROCESSES.format(tests=str(Path(__file__).parent), folder=str(tmp_path))
    first = run_script(script)
    assert first.returncode == 0, first.stderr
    assert "['make', 'total', 'total', 'total']" in first.stdout
    # The same list made again, the `each` found whole; its item runs asked after the step's
    # entry is gone hit one by one.
    for entry in tmp_path.glob("*/*.entry"):
        head = entry.read_bytes()[:4096]
        if b"totals" in head and b"totals/" not in head:
            entry.unlink()
    second = run_script(script)
    assert second.returncode == 0, second.stderr
    # Nothing called: the item runs the first process keyed on the digests taken with the list
    # are found under the digests this one takes as each run begins — four hits, `make` and
    # the three items.
    assert second.stdout.split("]")[0] == first.stdout.split("]")[0]
    assert second.stdout.endswith("] [] 4\n")


# ---------------------------------------------------------------------------------------------
# A switch's output: its case's result, digested once

BIG_CASE = 4321  # float64s: a length of its own


class Grow(soma.Node):
    def forward(self, seed: int) -> np.ndarray[Any, Any]:
        CALLS.append("grow")
        return np.full(BIG_CASE, float(seed))


class AsyncGrow(soma.Node):
    async def forward(self, seed: int) -> np.ndarray[Any, Any]:
        await asyncio.sleep(0)
        return Grow().forward(seed)


class Half(soma.Node):
    def forward(self, array: np.ndarray[Any, Any]) -> float:
        CALLS.append("half")
        return float(array.sum()) / 2


@pytest.mark.parametrize("walk", ["sync", "async"])
def test_a_switchs_output_is_digested_once_as_its_cases_result(
    cache: soma.Cache, walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = Hashed()
    monkeypatch.setattr(_fingerprint, "_soma", hashed)
    case = Grow() if walk == "sync" else AsyncGrow()
    g = soma.Graph.somatize(soma.switch(always, {"all": case}).named("pick") >> Half())

    def run() -> Any:
        CALLS.clear()
        if walk == "sync":
            return g.forward(2, cache=cache)
        return asyncio.run(g.aforward(2, cache=cache))

    assert run() == BIG_CASE
    # The case's result, digested as its node's output, is the switch's output: not again.
    assert hashed.counts[8 * BIG_CASE] == 1
    assert run() == BIG_CASE
    assert CALLS == []


# ---------------------------------------------------------------------------------------------
# A loop's iteration: its output, digested once for its predicate

LOOPED = 2345  # float64s: a length of its own


class Start(soma.Node):
    def forward(self, seed: int) -> np.ndarray[Any, Any]:
        CALLS.append("start")
        return np.full(LOOPED, float(seed))


class Step(soma.Node):
    def forward(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        CALLS.append("step")
        return x + 1


class AsyncStep(soma.Node):
    async def forward(self, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        await asyncio.sleep(0)
        return Step().forward(x)


def reached_two(array: np.ndarray[Any, Any]) -> bool:
    return bool(array[0] >= 2)


@pytest.mark.parametrize("walk", ["sync", "async"])
def test_a_loops_values_are_digested_once_where_no_call_ran_between(
    cache: soma.Cache, walk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = Hashed()
    monkeypatch.setattr(_fingerprint, "_soma", hashed)
    body = Step() if walk == "sync" else AsyncStep()
    g = soma.Graph.somatize(
        Start() >> soma.loop(body, until=reached_two, max_iterations=5).named("again")
    )

    def run() -> Any:
        CALLS.clear()
        if walk == "sync":
            return g.forward(0, cache=cache)
        return asyncio.run(g.aforward(0, cache=cache))

    assert float(run()[0]) == 2.0
    # Three values: `start`'s output, digested as it, not again as the first iteration's input;
    # each iteration's, digested as the body's output, not again for the predicate — the first
    # again as the second iteration's input and the last as the loop's output, each after the
    # predicate ran (which may have changed it).
    assert hashed.counts[8 * LOOPED] == 5
    assert float(run()[0]) == 2.0
    assert CALLS == []
