"""The promises, on the code users write, in the combinations they make.

Each guarantee here is already tested where its feature lives; this file asks it again on
everyday code — a module-level list counting calls, a module-level lock or logger, a node's own
``asyncio.timeout`` or ``TaskGroup``, a thread the node starts — and crossed with the other
features a user pairs it with: sync and async nodes, the cache, ``each``/``switch``/``loop``,
streams, retries. The nodes are written at module level, as users write them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import soma

# ---------------------------------------------------------------------------------------------
# What users keep at module level: a list their nodes log their calls to, a lock, a logger.

CALLS: list[str] = []
LOCK = threading.Lock()
LOG = logging.getLogger("pipeline")


class Count(soma.Node):
    """Adds 1, logging its call to the module-level ``CALLS`` under a lock, as users do."""

    def forward(self, x: int, ctx: soma.Ctx) -> int:
        with LOCK:
            CALLS.append(ctx.node)
        LOG.debug("called %s", ctx.node)
        return x + 1


class AsyncCount(soma.Node):
    async def forward(self, x: int, ctx: soma.Ctx) -> int:
        await asyncio.sleep(0)
        with LOCK:
            CALLS.append(ctx.node)
        return x + 1


def below_three(x: Any) -> bool:
    return bool(x >= 3)


def parity(x: int) -> str:
    return "even" if x % 2 == 0 else "odd"


def shaped(where: str, node: Callable[[], soma.Node]) -> Any:
    """``node`` as it stands in a user's pipeline: alone in a chain, inside ``each``, inside a
    ``switch``'s case, or as a ``loop``'s body; with a counted node before and after it."""
    if where == "chain":
        middle: Any = node().named("mid")
    elif where == "each":
        middle = (Listed() >> soma.each(node().named("mid")).named("items")) >> Summed()
    elif where == "switch":
        middle = soma.switch(parity, {"even": node().named("mid"), "odd": None}).named("route")
    else:
        middle = soma.loop(node().named("mid"), until=below_three, max_iterations=5).named("again")
    return Count().named("first") >> middle >> Count().named("last")


class Listed(soma.Node):
    def forward(self, x: int) -> list[int]:
        return [x, x + 1, x + 2]


class Summed(soma.Node):
    def forward(self, xs: list[int]) -> int:
        return sum(xs)


WHERE = ["chain", "each", "switch", "loop"]
KINDS = {"sync": Count, "async": AsyncCount}


@pytest.fixture(autouse=True)
def fresh_calls() -> None:
    CALLS.clear()


# ---------------------------------------------------------------------------------------------
# The cache, on nodes that log their calls to a module-level list under a module-level lock


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_rerun_with_the_same_cache_calls_no_node_though_every_node_logs_its_calls(
    where: str, kind: str
) -> None:
    g = soma.Graph.somatize(shaped(where, KINDS[kind]))
    cache = soma.Cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # No CacheWarning: the lock and the log are not data.
        first = g.forward(0, cache=cache)
        assert CALLS, "the first run called nothing"
        CALLS.clear()
        assert g.forward(0, cache=cache) == first
    assert CALLS == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_async_rerun_with_the_same_cache_calls_no_node(kind: str) -> None:
    g = soma.Graph.somatize(shaped("each", KINDS[kind]))
    cache = soma.Cache()
    first = asyncio.run(g.aforward(0, cache=cache))
    CALLS.clear()
    assert asyncio.run(g.aforward(0, cache=cache)) == first
    assert CALLS == []


def test_a_streamed_rerun_with_the_same_cache_calls_no_node() -> None:
    g = soma.Graph.somatize(shaped("switch", Count))
    cache = soma.Cache()
    first = list(g.map(range(6), cache=cache))
    CALLS.clear()
    assert list(g.map(range(6), cache=cache)) == first
    assert CALLS == []


def test_a_new_input_calls_exactly_what_reads_it() -> None:
    g = soma.Graph.somatize(Count().named("a") >> Count().named("b"))
    cache = soma.Cache()
    g.forward(0, cache=cache)
    CALLS.clear()
    assert g.forward(1, cache=cache) == 3
    assert CALLS == ["a", "b"]


# ---------------------------------------------------------------------------------------------
# An async node's own timeouts and task groups are its own


class CatchesItsTimeout(soma.Node):
    async def forward(self, x: int) -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(30)
        except TimeoutError:
            return "gave up"
        return "slept"


class LetsItsTimeoutOut(soma.Node):
    async def forward(self, x: int) -> str:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(30)
        return "slept"


async def fails() -> None:
    await asyncio.sleep(0)
    raise ValueError("one task failed")


class FailingTaskGroup(soma.Node):
    async def forward(self, x: int) -> str:
        async with asyncio.TaskGroup() as group:
            group.create_task(fails())
            group.create_task(asyncio.sleep(30))
        return "done"


def entry_points() -> dict[str, Callable[[Any, Any], Any]]:
    return {
        "forward": lambda g, x: g.forward(x),
        "aforward": lambda g, x: asyncio.run(g.aforward(x)),
        "map": lambda g, x: next(iter(g.map([x]))),
        "amap": lambda g, x: asyncio.run(_first_of_amap(g, x)),
    }


async def _first_of_amap(g: Any, x: Any) -> Any:
    async for out in g.amap([x]):
        return out
    raise AssertionError("amap gave nothing")


ENTRIES = entry_points()


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize("where", ["chain", "each"])
def test_a_timeout_a_node_catches_itself_gives_the_nodes_value(entry: str, where: str) -> None:
    body: Any = CatchesItsTimeout().named("waits")
    if where == "each":
        body = Listed() >> soma.each(body).named("items")
    g = soma.Graph.somatize(body)
    expected = "gave up" if where == "chain" else ["gave up"] * 3
    assert ENTRIES[entry](g, 0) == expected


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_timeout_a_node_lets_out_is_a_timeout_error_with_its_note(entry: str) -> None:
    g = soma.Graph.somatize(Count().named("first") >> LetsItsTimeoutOut().named("waits"))
    with pytest.raises(TimeoutError) as raised:
        ENTRIES[entry](g, 0)
    assert any("`waits`" in note for note in getattr(raised.value, "__notes__", []))


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_a_failing_task_group_is_the_nodes_exception_group(entry: str) -> None:
    g = soma.Graph.somatize(FailingTaskGroup().named("group"))
    with pytest.raises(ExceptionGroup) as raised:
        ENTRIES[entry](g, 0)
    assert raised.group_contains(ValueError, match="one task failed")
    assert any("`group`" in note for note in getattr(raised.value, "__notes__", []))


class TimesOutTwice(soma.Node):
    """Lets its own timeout out on the first two attempts, then returns."""

    def __init__(self) -> None:
        self.attempts = 0

    async def forward(self, x: int) -> str:
        self.attempts += 1
        if self.attempts <= 2:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(30)
        return f"attempt {self.attempts}"


@pytest.mark.parametrize("entry", ["forward", "aforward"])
def test_a_retry_on_timeout_error_retries_a_nodes_own_timeout(entry: str) -> None:
    node = TimesOutTwice()
    g = soma.Graph.somatize(node.named("flaky").retry(3, backoff=0.0, on=(TimeoutError,)))
    assert ENTRIES[entry](g, 0) == "attempt 3"


class Length(soma.Node):
    def forward(self, text: str, ctx: soma.Ctx) -> int:
        with LOCK:
            CALLS.append(ctx.node)
        return len(text)


def test_a_caught_timeout_is_the_nodes_value_and_is_cached_like_any_other() -> None:
    g = soma.Graph.somatize(CatchesItsTimeout().named("waits") >> Length().named("after"))
    cache = soma.Cache()
    assert g.forward(0, cache=cache) == len("gave up")
    assert CALLS == ["after"]
    CALLS.clear()
    assert g.forward(0, cache=cache) == len("gave up")
    assert CALLS == []
    assert cache.stats().hits == 2


# ---------------------------------------------------------------------------------------------
# What a node sends from threads it starts reaches the run's events


class EmitsFromItsThreads(soma.Node):
    def forward(self, words: list[str], ctx: soma.Ctx) -> int:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(ctx.emit, words))
        thread = threading.Thread(target=ctx.emit, args=("from a thread",))
        thread.start()
        thread.join()
        return len(words)


class AsyncEmitsFromItsThreads(soma.Node):
    async def forward(self, words: list[str], ctx: soma.Ctx) -> int:
        loop = asyncio.get_running_loop()
        for word in words:
            await loop.run_in_executor(None, ctx.emit, word)
        await asyncio.to_thread(ctx.emit, "from a thread")
        return len(words)


@pytest.mark.parametrize("node", [EmitsFromItsThreads, AsyncEmitsFromItsThreads])
def test_what_a_node_emits_from_threads_it_started_is_delivered(node: type[soma.Node]) -> None:
    g = soma.Graph.somatize(node().named("talks"))
    events = list(g.events(["a", "b", "c"]))
    emitted = [e.value for e in events if e.kind == "emitted"]
    assert sorted(emitted) == ["a", "b", "c", "from a thread"]
    assert events[-1].kind == "result"
    assert events[-1].dropped == 0
