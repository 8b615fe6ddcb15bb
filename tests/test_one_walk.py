"""One walk: the engine walks every run, async nodes included, so every feature composes with
every other the same way for a sync node and an async one — the cache's keys, retries, time
limits, deadlines, Ctrl-C, hosts, the steps that decide — and a property holds it over random
graphs: an async twin of a graph gives the same results, the same errors and the same cache
counts as the graph itself.

What could hang (Ctrl-C, a node that computes past its deadline) runs in a child process with a
deadline of its own.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import soma
from conftest import DEADLINE, run_script, serving
from test_hosts import _HostsHere
from test_properties import Dag, dags

# ---------------------------------------------------------------------------------------------
# Nodes


class Who(soma.Node):
    """Returns its own id: a node whose output depends on nothing but who it is."""

    def forward(self, x: Any, ctx: Any) -> Any:
        return ctx.node


class AsyncWho(soma.Node):
    async def forward(self, x: Any, ctx: Any) -> Any:
        await asyncio.sleep(0)
        return ctx.node


class AsyncAdd(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    async def forward(self, x: Any) -> Any:
        await asyncio.sleep(0)
        return x + self.k


class Add(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: Any) -> Any:
        return x + self.k


class Spin(soma.Node):
    """Computes for `seconds` without ever awaiting: nothing on the loop can interrupt it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def forward(self, x: Any) -> Any:
        end = time.monotonic() + self.seconds
        while time.monotonic() < end:
            pass
        return x


class FailsFirst(soma.Node):
    """Raises `error` on its first `times` calls, then adds 1."""

    def __init__(self, error: type[BaseException], times: int) -> None:
        self.error = error
        self.times = times
        self.calls = 0

    def forward(self, x: Any) -> Any:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error("not yet")
        return x + 1


class AsyncFailsFirst(FailsFirst):
    async def forward(self, x: Any) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return FailsFirst.forward(self, x)


class Brittle(BaseException):
    """A `BaseException` that is no `Exception`: a user's own, listed in a retry."""


# ---------------------------------------------------------------------------------------------
# The cache: one key


def test_an_async_nodes_cache_key_covers_its_id_as_a_sync_nodes_does() -> None:
    for node in (Who, AsyncWho):
        g = soma.Graph.somatize(node().named("a") | node().named("b"))
        cache = soma.Cache()
        assert g.forward(0, cache=cache) == {"a": "a", "b": "b"}
        assert g.forward(0, cache=cache) == {"a": "a", "b": "b"}
        assert cache.stats().hits == 2


def test_an_async_nodes_cache_key_covers_its_device_as_a_sync_nodes_does() -> None:
    g = soma.Graph.somatize(AsyncWho().named("a"))
    cache = soma.Cache()
    g.forward(0, cache=cache)
    g.place("a", "cpu")
    g.forward(0, cache=cache)
    assert cache.stats().hits == 0


def test_would_hit_and_the_plan_with_a_cache_say_what_an_async_rerun_finds() -> None:
    g = soma.Graph.somatize(AsyncAdd(1).named("a") >> Add(2).named("b"))
    cache = soma.Cache()
    assert cache.would_hit(g, 1) == {"a": False, "b": False}
    assert g.forward(1, cache=cache) == 4
    assert cache.would_hit(g, 1) == {"a": True, "b": True}
    assert g.plan(cache=cache, input=1).cached == ["a", "b"]
    before = cache.stats().hits
    assert run(g.aforward(1, cache=cache)) == 4
    assert cache.stats().hits == before + 2


def test_a_sync_and_an_async_run_of_one_graph_share_the_cache() -> None:
    g = soma.Graph.somatize(AsyncAdd(1).named("a") >> Add(2).named("b"))
    cache = soma.Cache()
    assert g.forward(1, cache=cache) == 4
    assert run(g.aforward(1, cache=cache)) == 4
    assert cache.stats().hits == 2


def test_the_nodes_inside_a_step_are_looked_up_on_the_async_path() -> None:
    g = soma.Graph.somatize(soma.each(AsyncAdd(1)).named("items"))
    cache = soma.Cache()
    assert run(g.aforward([1, 2], cache=cache)) == [2, 3]
    assert run(g.aforward([1, 2, 3], cache=cache)) == [2, 3, 4]
    assert cache.stats().hits == 2


# ---------------------------------------------------------------------------------------------
# Retries and time limits: one schedule, one filter


@pytest.mark.parametrize("node", [FailsFirst, AsyncFailsFirst])
def test_a_base_exception_subclass_listed_in_on_is_retried_for_every_node(node: Any) -> None:
    flaky = node(Brittle, 2)
    g = soma.Graph.somatize(flaky.retry(2, backoff=0, on=(Brittle,)))
    assert g.forward(1) == 2
    assert flaky.calls == 3


@pytest.mark.parametrize("node", [FailsFirst, AsyncFailsFirst])
def test_a_listed_keyboard_interrupt_is_retried_and_the_run_goes_on(node: Any) -> None:
    flaky = node(KeyboardInterrupt, 1)
    g = soma.Graph.somatize(flaky.retry(1, backoff=0, on=(KeyboardInterrupt,)))
    assert g.forward(1) == 2
    assert flaky.calls == 2


@pytest.mark.parametrize("node", [FailsFirst, AsyncFailsFirst])
def test_a_failure_not_listed_in_on_is_not_retried_for_any_node(node: Any) -> None:
    flaky = node(ValueError, 1)
    g = soma.Graph.somatize(flaky.retry(3, backoff=0, on=(KeyError,)))
    with pytest.raises(ValueError, match="not yet"):
        g.forward(1)
    assert flaky.calls == 1


def test_an_async_node_that_computes_past_its_time_limit_is_a_time_limit_error() -> None:
    g = soma.Graph.somatize(Spin(0.3).named("spin").time_limit(0.05))
    with pytest.raises(soma.TimeLimitError, match="`spin`"):
        g.forward(1)
    with pytest.raises(soma.TimeLimitError, match="`spin`"):
        run(g.aforward(1))


# Past what a `Duration` holds (about 1.8e19 s) too: one conversion takes every number of seconds.
PAST_ANY_CLOCK = [sys.maxsize, 1e19, 2**80, 1e300]


@pytest.mark.parametrize("seconds", PAST_ANY_CLOCK)
def test_a_time_limit_past_any_clock_is_no_limit_for_any_node(seconds: float) -> None:
    for node in (Add(1), AsyncAdd(1)):
        assert soma.Graph.somatize(node.time_limit(seconds)).forward(1) == 2
        g = soma.Graph.somatize(type(node)(1).named("n"))
        g.time_limit("n", seconds)
        assert run(g.aforward(1)) == 2


@pytest.mark.parametrize("seconds", PAST_ANY_CLOCK)
def test_a_timeout_past_any_clock_is_no_deadline_for_forward_map_and_aforward(
    seconds: float,
) -> None:
    for g in (soma.Graph.somatize(Add(1)), soma.Graph.somatize(AsyncAdd(1))):
        assert g.forward(1, timeout=seconds) == 2
        assert list(g.map([1, 2], timeout=seconds)) == [2, 3]
    async_graph = soma.Graph.somatize(AsyncAdd(1))
    assert run(async_graph.aforward(1, timeout=seconds)) == 2

    async def streamed() -> list[int]:
        return [y async for y in async_graph.amap([1, 2], timeout=seconds)]

    assert run(streamed()) == [2, 3]


class _Paused(InMemorySpanExporter):
    """Keeps the spans it is handed, and says when one was an attempt a retry pauses after
    (its ``soma.retry_in`` set): the pause is then being taken."""

    def __init__(self) -> None:
        super().__init__()
        self.pausing = threading.Event()

    def export(self, spans: Any) -> SpanExportResult:
        exported = super().export(spans)
        if any(span.attributes and "soma.retry_in" in span.attributes for span in spans):
            self.pausing.set()
        return exported


@pytest.mark.parametrize("node", [FailsFirst, AsyncFailsFirst])
def test_a_backoff_past_the_longest_pause_is_the_longest_pause(node: Any) -> None:
    paused = _Paused()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(paused))

    class FailsOncePausing(soma.Node):
        """Fails once the first attempt of its sibling has failed and its pause begun, which
        ends the pause at once: the run fails with this error."""

        def forward(self, x: Any) -> Any:
            assert paused.pausing.wait(DEADLINE), "no pause began"
            raise LookupError("a sibling failed")

    flaky = node(ConnectionError, 1)
    # `b` first: the failure of an earlier branch is the run's, and ends a later one's pause.
    g = soma.Graph.somatize(
        FailsOncePausing().named("b")
        | flaky.named("a").retry(2, backoff=1e300, on=(ConnectionError,))
    )
    assert g.retries()["a"].backoff == 1e300
    soma.telemetry.enable(provider)
    try:
        with pytest.raises(LookupError, match="a sibling failed"):
            g.forward(1)
    finally:
        soma.telemetry.disable()
    assert flaky.calls == 1
    pauses = [
        span.attributes["soma.retry_in"]
        for span in paused.get_finished_spans()
        if span.attributes and "soma.retry_in" in span.attributes
    ]
    # The first pause is the longest pause (128 s), lengthened by up to a quarter at random.
    assert len(pauses) == 1, pauses
    assert 128 <= float(pauses[0]) <= 128 * 1.25, pauses


# ---------------------------------------------------------------------------------------------
# The steps that decide


class Lazy:
    """A dataset that says its length, then fails to read as `fails` says: the disk went away,
    or Ctrl-C landed while it read."""

    def __init__(self, fails: BaseException) -> None:
        self.fails = fails

    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Iterator[Any]:
        raise self.fails


@pytest.mark.parametrize("how", ["forward", "aforward"])
@pytest.mark.parametrize("kind", [OSError, KeyboardInterrupt])
@pytest.mark.parametrize("inside", [Add, AsyncAdd])
def test_what_a_step_raises_reading_its_items_comes_out_as_itself_naming_the_step(
    inside: Any, kind: type[BaseException], how: str
) -> None:
    fails = kind("the items could not be read")
    g = soma.Graph.somatize(soma.each(inside(1)).named("chunks"))
    call = (
        (lambda: g.forward(Lazy(fails)))
        if how == "forward"
        else lambda: run(g.aforward(Lazy(fails)))
    )
    with pytest.raises(type(fails)) as raised:
        call()
    assert raised.value is fails
    assert type(raised.value) is type(fails)
    assert raised.value.__notes__ == ["raised in soma node `chunks`"]
    # Its own traceback, down to where it was raised.
    assert traceback.extract_tb(raised.value.__traceback__)[-1].name == "__iter__"


def test_an_async_selector_is_awaited_and_runs_only_the_case_it_names() -> None:
    async def kind(x: int) -> str:
        await asyncio.sleep(0)
        return "big" if x > 9 else "small"

    g = soma.Graph.somatize(soma.switch(kind, {"big": Add(100), "small": AsyncAdd(1)}))
    assert g.forward(10) == 110
    assert g.forward(1) == 2
    assert run(g.aforward(10)) == 110


def test_an_async_predicate_is_awaited_after_each_iteration() -> None:
    async def done(y: int) -> bool:
        await asyncio.sleep(0)
        return y >= 3

    g = soma.Graph.somatize(soma.loop(Add(1), until=done, max_iterations=10))
    assert g.forward(0) == 3
    assert run(g.aforward(0)) == 3


# ---------------------------------------------------------------------------------------------
# Hosts


@pytest.fixture
def hosts_here() -> Iterator[_HostsHere]:
    with serving(_HostsHere()) as hosts:
        yield hosts


def test_async_nodes_run_beside_a_slice_on_a_host(hosts_here: _HostsHere) -> None:
    g = soma.Graph.somatize(AsyncAdd(1).named("a") >> Add(10).named("far").at("one"))
    assert g.forward(1) == 12
    assert run(g.aforward(1)) == 12
    assert hosts_here.hosts["one"].loads


class AsyncWhere(soma.Node):
    """Adds 10, and records which copy of it ran: this one, or one a host made of it."""

    def __init__(self, ran: list[int]) -> None:
        self.ran = ran

    async def forward(self, x: Any) -> Any:
        await asyncio.sleep(0)
        self.ran.append(id(self))
        return x + 10

    def __reduce__(self) -> Any:
        # A host's copy records into the test's own list: the hosts here share this process.
        return (_copy_of_where, (id(self.ran),))


_WHERE: dict[int, list[int]] = {}


def _copy_of_where(ran: int) -> AsyncWhere:
    return AsyncWhere(_WHERE[ran])


def test_an_async_node_runs_on_a_host(hosts_here: _HostsHere) -> None:
    ran: list[int] = []
    _WHERE[id(ran)] = ran
    here = AsyncWhere(ran)
    g = soma.Graph.somatize(Add(1).named("a") >> here.named("far").at("one"))
    try:
        assert g.forward(1) == 12
        assert run(g.aforward(1)) == 12
    finally:
        del _WHERE[id(ran)]
    # Both runs called the copy host `one` was sent, never the node here; `one` was sent
    # `far` alone.
    assert len(ran) == 2, ran
    assert id(here) not in ran
    assert hosts_here.hosts["one"].loads
    assert all(load == [["far"]] for load in hosts_here.hosts["one"].loads), hosts_here.hosts


# ---------------------------------------------------------------------------------------------
# What could hang, in a child process


def test_keyboard_interrupt_and_system_exit_from_an_async_node_come_out_of_forward() -> None:
    script = textwrap.dedent(
        """
        import soma

        class Raises(soma.Node):
            def __init__(self, error):
                self.error = error
            async def forward(self, x):
                raise self.error

        class Pass(soma.Node):
            async def forward(self, x):
                return x

        for error in (KeyboardInterrupt("from a node"), SystemExit(3)):
            try:
                soma.Graph.somatize(Raises(error).named("raises")).forward(0)
            except BaseException as raised:
                print("raised", type(raised).__name__, raised.__notes__, flush=True)
            print("next run", soma.Graph.somatize(Pass()).forward(7), flush=True)
        """
    )
    child = run_script(script)
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()
    assert lines == [
        "raised KeyboardInterrupt ['raised in soma node `raises`']",
        "next run 7",
        "raised SystemExit ['raised in soma node `raises`']",
        "next run 7",
    ], child.stdout


def test_forward_raises_at_its_deadline_while_an_async_node_computes_past_it() -> None:
    script = textwrap.dedent(
        """
        import threading
        import soma

        released = threading.Event()

        class Spin(soma.Node):
            async def forward(self, x):
                while not released.is_set():  # computes on the loop, never awaiting
                    pass
                return x

        try:
            soma.Graph.somatize(Spin().named("spin")).forward(0, timeout=0.1)
            print("a late success", flush=True)
        except TimeoutError as error:
            # Raised while the node computes: it cannot end before this line releases it.
            print("timed out while it computed", not released.is_set(), flush=True)
            print("names", "`spin`" in str(error), flush=True)
        released.set()
        """
    )
    child = run_script(script)
    assert child.returncode == 0, child.stderr
    assert "timed out while it computed True" in child.stdout, child.stdout
    assert "names True" in child.stdout


def test_a_loop_whose_async_body_never_awaits_stops_at_its_timeout() -> None:
    script = textwrap.dedent(
        """
        import time
        import soma

        class Busy(soma.Node):
            async def forward(self, x):
                end = time.monotonic() + 0.05
                while time.monotonic() < end:
                    pass
                return x + 1

        g = soma.Graph.somatize(soma.loop(Busy(), until=lambda y: False, max_iterations=200))
        began = time.monotonic()
        try:
            g.forward(0, timeout=0.5)
            print("ran every iteration", flush=True)
        except TimeoutError:
            print("timed out within", time.monotonic() - began < 1.5, flush=True)
        """
    )
    child = run_script(script)
    assert child.returncode == 0, child.stderr
    assert "timed out within True" in child.stdout, child.stdout


# ---------------------------------------------------------------------------------------------
# The property: an async twin gives what its graph gives


class Step(soma.Node):
    """A node of a random graph: adds its number to what it reads (summing a join), fails
    the first `failures` calls with `Brittle`, and fails for good on an input of `fatal`."""

    def __init__(self, number: int, failures: int, fatal: int | None) -> None:
        self.number = number
        self.failures = failures
        self.fatal = fatal
        self.calls = 0

    def compute(self, x: Any) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise Brittle(f"{self.number} not yet")
        value = sum(x.values()) if isinstance(x, dict) else x
        if value == self.fatal:
            raise ValueError(f"{self.number} cannot take {value}")
        return value + self.number

    def forward(self, x: Any) -> Any:
        return self.compute(x)


class AsyncStep(Step):
    async def forward(self, x: Any) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return self.compute(x)


@st.composite
def random_runs(draw: st.DrawFn) -> tuple[Dag, dict[str, tuple[int, int, int | None]], set[str]]:
    dag = draw(dags(max_nodes=7))
    shapes = {
        node: (
            number,
            draw(st.integers(min_value=0, max_value=2)),
            draw(st.one_of(st.none(), st.integers(min_value=0, max_value=30))),
        )
        for number, node in enumerate(dag.nodes, start=1)
    }
    asynced = draw(st.sets(st.sampled_from(dag.nodes))) if dag.nodes else set()
    return dag, shapes, asynced


def twin(dag: Dag, shapes: dict[str, tuple[int, int, int | None]], asynced: set[str]) -> soma.Graph:
    """The random graph, its nodes in `asynced` async, each retried twice on `Brittle`."""
    g = soma.Graph()
    for node in dag.nodes:
        kind = AsyncStep if node in asynced else Step
        g.node(node, kind(*shapes[node]))
        g.retry(node, 2, backoff=0, on=(Brittle,))
    for source, target in dag.edges:
        g.edge(source, target)
    return g


def outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("value", call())
    except (ValueError, Brittle) as error:
        return ("error", f"{type(error).__name__}: {error}")


@settings(max_examples=40, deadline=None)
@given(random_runs(), st.integers(min_value=0, max_value=20))
def test_an_async_twin_gives_the_results_errors_and_cache_counts_of_its_graph(
    run_of: tuple[Dag, dict[str, tuple[int, int, int | None]], set[str]], x: int
) -> None:
    dag, shapes, asynced = run_of
    sync_cache, async_cache = soma.Cache(), soma.Cache()
    sync_graph, async_graph = twin(dag, shapes, set()), twin(dag, shapes, asynced)
    first = outcome(lambda: sync_graph.forward(x, cache=sync_cache, timeout=30))
    assert outcome(lambda: async_graph.forward(x, cache=async_cache, timeout=30)) == first
    # The second run reads what the first filed, as far as the nodes' state (their count of
    # calls) lets it: the same nodes hit on both.
    again = outcome(lambda: sync_graph.forward(x, cache=sync_cache))
    assert outcome(lambda: run(async_graph.aforward(x, cache=async_cache))) == again
    if first[0] == "value":
        assert async_cache.stats().hits == sync_cache.stats().hits
        assert async_cache.stats().misses == sync_cache.stats().misses


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


@pytest.fixture(scope="module")
def watching() -> Iterator[Any]:
    """A view recording every run of the tests that ask for it (the engine then keeps each
    forward's states on a board)."""
    opened = soma.view(port=0, quiet=True)
    try:
        yield opened
    finally:
        opened.close()


@settings(max_examples=30, deadline=None)
@given(
    random_runs(),
    st.integers(min_value=0, max_value=20),
    st.sampled_from(["memory cache", "folder cache", "journal"]),
    st.booleans(),
)
def test_a_watched_run_with_a_cache_or_a_journal_gives_twice_what_a_plain_run_gives(
    watching: Any,
    tmp_path_factory: pytest.TempPathFactory,
    run_of: tuple[Dag, dict[str, tuple[int, int, int | None]], set[str]],
    x: int,
    kind: str,
    asynchronously: bool,
) -> None:
    dag, shapes, asynced = run_of
    expected = outcome(lambda: twin(dag, shapes, set()).forward(x, timeout=30))
    g = twin(dag, shapes, asynced)
    folder = tmp_path_factory.mktemp("kept")
    keywords: dict[str, Any] = {
        "memory cache": {"cache": soma.Cache()},
        "folder cache": {"cache": soma.Cache(folder)},
        "journal": {"journal": soma.Journal(folder / "runs.db"), "run": "r"},
    }[kind]
    try:
        for _ in range(2):  # The second from what the first kept (a journal: taken up again).
            if asynchronously:
                got = outcome(lambda: run(g.aforward(x, **keywords)))
            else:
                got = outcome(lambda: g.forward(x, timeout=30, **keywords))
            if kind == "journal" and got[0] == "error":
                break  # A failed run taken up again calls its failed node again: other counts.
            assert got == expected
    finally:
        if "journal" in keywords:
            keywords["journal"].close()
    # The view saw the last of them end as it ended.
    assert watching.runs()[0].as_json()["status"] == ("finished" if got[0] == "value" else "failed")
