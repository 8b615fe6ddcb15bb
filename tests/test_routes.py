"""Which runner a call takes — the engine, the slices on their hosts, a stream of micro-batches —
is one decision, the core's route: every combination of micro-batches, hosts, async nodes and a
cache either runs, with its value, or is refused with the error that says why.

The hosts here are in this process (``test_hosts._HostsHere``), as a host elsewhere would be:
each keeps copies of the slices it is sent.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import soma
from conftest import DEADLINE, serving
from test_hosts import _HostsHere


class Inc(soma.Node):
    def forward(self, xs: list[int]) -> list[int]:
        return [x + 1 for x in xs]


class AsyncInc(soma.Node):
    async def forward(self, xs: list[int]) -> list[int]:
        await asyncio.sleep(0)
        return [x + 1 for x in xs]


class Twice(soma.Node):
    def forward(self, xs: list[int]) -> list[int]:
        return [2 * x for x in xs]


BATCH = [1, 2, 3, 4]
RESULT = [4, 6, 8, 10]

STREAMS_ON_HOSTS = (
    "node `b` is placed on host `one`, and streams do not run slices on hosts yet\n"
    'hint: run each item with `forward`, or bring the nodes back here with `g.place_at("b", None)`'
)


@pytest.fixture(autouse=True)
def hosts_here() -> Iterator[_HostsHere]:
    with serving(_HostsHere()) as hosts:
        yield hosts


def graph(*, hosts: bool, is_async: bool) -> soma.Graph:
    """``a >> b``: ``a`` async or not, ``b`` on host ``one`` or here."""
    b = Twice().named("b")
    first = (AsyncInc() if is_async else Inc()).named("a")
    return soma.Graph.somatize(first >> (b.at("one") if hosts else b))


def cache_of(kind: str | None, folder: Path) -> soma.Cache | None:
    if kind is None:
        return None
    return soma.Cache() if kind == "memory" else soma.Cache(folder / "cache")


def warned(hosts: bool, cache: str | None) -> list[type[Warning]]:
    """What a run warns of: only a cache in memory, which the hosts cannot reach."""
    return [soma.CacheWarning] if hosts and cache == "memory" else []


COMBINATIONS = [
    (micro_batches, hosts, is_async, cache)
    for micro_batches in (None, 2)
    for hosts in (False, True)
    for is_async in (False, True)
    for cache in (None, "memory", "folder")
]


def label(combination: tuple[int | None, bool, bool, str | None]) -> str:
    micro_batches, hosts, is_async, cache = combination
    return "-".join(
        (
            "micro_batches" if micro_batches else "one_run",
            "hosts" if hosts else "here",
            "async" if is_async else "sync",
            cache or "uncached",
        )
    )


@pytest.mark.parametrize(
    ("micro_batches", "hosts", "is_async", "cache"), COMBINATIONS, ids=map(label, COMBINATIONS)
)
def test_forward_runs_each_combination_or_refuses_micro_batches_with_hosts(
    micro_batches: int | None, hosts: bool, is_async: bool, cache: str | None, tmp_path: Path
) -> None:
    g = graph(hosts=hosts, is_async=is_async)
    run_cache = cache_of(cache, tmp_path)
    if micro_batches is not None and hosts:
        with pytest.raises(ValueError, match="streams do not run slices on hosts") as refused:
            g.forward(BATCH, micro_batches=micro_batches, cache=run_cache)
        assert type(refused.value) is ValueError
        assert str(refused.value) == STREAMS_ON_HOSTS
        return
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert g.forward(BATCH, micro_batches=micro_batches, cache=run_cache) == RESULT
        # Again: a cache given is used, whichever runner took the call.
        assert g.forward(BATCH, micro_batches=micro_batches, cache=run_cache) == RESULT
    assert [type(w.message) for w in seen] == warned(hosts, cache)
    if run_cache is not None:
        assert run_cache.stats().hits > 0


ONE_RUN = [
    (hosts, is_async, cache)
    for hosts in (False, True)
    for is_async in (False, True)
    for cache in (None, "memory", "folder")
]


@pytest.mark.parametrize(
    ("hosts", "is_async", "cache"),
    ONE_RUN,
    ids=[label((None, *combination)) for combination in ONE_RUN],
)
def test_aforward_runs_each_combination_of_hosts_async_nodes_and_a_cache(
    hosts: bool, is_async: bool, cache: str | None, tmp_path: Path
) -> None:
    g = graph(hosts=hosts, is_async=is_async)
    run_cache = cache_of(cache, tmp_path)

    async def twice() -> list[Any]:
        return [await g.aforward(BATCH, cache=run_cache) for _ in range(2)]

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert asyncio.run(twice()) == [RESULT, RESULT]
    assert [type(w.message) for w in seen] == warned(hosts, cache)
    if run_cache is not None:
        assert run_cache.stats().hits > 0


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_map_runs_a_graph_without_hosts_async_or_not(is_async: bool) -> None:
    g = graph(hosts=False, is_async=is_async)
    assert list(g.map([[1], [2, 3]])) == [[4], [6, 8]]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_map_refuses_a_graph_with_hosts_async_or_not(is_async: bool) -> None:
    g = graph(hosts=True, is_async=is_async)
    with pytest.raises(ValueError, match="streams do not run slices on hosts") as refused:
        g.map([[1]])
    assert str(refused.value) == STREAMS_ON_HOSTS


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_amap_refuses_a_graph_with_hosts_rather_than_run_its_nodes_here(is_async: bool) -> None:
    g = graph(hosts=True, is_async=is_async)

    async def main() -> list[Any]:
        return [y async for y in g.amap([[1]])]

    with pytest.raises(ValueError, match="streams do not run slices on hosts") as refused:
        asyncio.run(main())
    assert str(refused.value) == STREAMS_ON_HOSTS


def test_a_node_brought_back_from_its_host_streams_again() -> None:
    g = graph(hosts=True, is_async=False)
    g.place_at("b", None)
    assert g.forward(BATCH, micro_batches=2) == RESULT
    assert list(g.map([[1]])) == [[4]]


class FailsOnce(soma.Node):
    """Doubles, its first call failing: on a host, the first call of the host's copy."""

    def __init__(self) -> None:
        self.failed = False

    def forward(self, xs: list[int]) -> list[int]:
        return self._once(xs)

    def _once(self, xs: list[int]) -> list[int]:
        if not self.failed:
            self.failed = True
            raise ConnectionError("first call")
        return [2 * x for x in xs]


class AsyncFailsOnce(FailsOnce):
    async def forward(self, xs: list[int]) -> list[int]:  # type: ignore[override]
        await asyncio.sleep(0)
        return self._once(xs)


# What lets a stuck node go once the test has seen its limit: the module's, so that a host's
# copy of the node waits on it too.
RELEASED = threading.Event()


class Stuck(soma.Node):
    """Never returns of itself: let go by ``RELEASED``."""

    def forward(self, xs: list[int]) -> list[int]:
        RELEASED.wait(DEADLINE)
        return xs


class AsyncStuck(soma.Node):
    async def forward(self, xs: list[int]) -> list[int]:
        await asyncio.sleep(DEADLINE)
        return xs


ROUTED = [
    (micro_batches, hosts, is_async)
    for micro_batches, hosts in ((None, False), (None, True), (2, False))
    for is_async in (False, True)
]
ROUTED_IDS = [label((m, h, a, None)).removesuffix("-uncached") for m, h, a in ROUTED]


def with_b(b: soma.Node, *, hosts: bool, is_async: bool) -> soma.Graph:
    first = (AsyncInc() if is_async else Inc()).named("a")
    return soma.Graph.somatize(first >> (b.named("b").at("one") if hosts else b.named("b")))


@pytest.mark.parametrize(("micro_batches", "hosts", "is_async"), ROUTED, ids=ROUTED_IDS)
def test_a_retry_set_by_id_holds_whichever_runner_takes_the_call(
    micro_batches: int | None, hosts: bool, is_async: bool
) -> None:
    b = AsyncFailsOnce() if is_async else FailsOnce()
    unretried = with_b(b, hosts=hosts, is_async=is_async)
    with pytest.raises(ConnectionError, match="first call"):
        unretried.forward(BATCH, micro_batches=micro_batches)
    b = AsyncFailsOnce() if is_async else FailsOnce()
    g = with_b(b, hosts=hosts, is_async=is_async)
    g.retry("b", 1, backoff=0.0, on=(ConnectionError,))
    assert g.forward(BATCH, micro_batches=micro_batches) == RESULT


@pytest.mark.parametrize(("micro_batches", "hosts", "is_async"), ROUTED, ids=ROUTED_IDS)
def test_a_time_limit_set_by_id_holds_whichever_runner_takes_the_call(
    micro_batches: int | None, hosts: bool, is_async: bool
) -> None:
    RELEASED.clear()
    b = AsyncStuck() if is_async else Stuck()
    g = with_b(b, hosts=hosts, is_async=is_async)
    g.time_limit("b", 0.05)
    try:
        with pytest.raises(soma.TimeLimitError) as over:
            g.forward(BATCH, micro_batches=micro_batches)
    finally:
        RELEASED.set()
    assert over.value.node == "b"
