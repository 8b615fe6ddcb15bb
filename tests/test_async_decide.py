"""Async nodes inside ``soma.each``, ``soma.switch`` and ``soma.loop``: the step walked on the
event loop, items as tasks, with every promise of an async node and of the step.

Items in flight together are shown by a rendezvous with a deadline, never by sleeping; a hang
(a cancelled run, a deadline) is tested in a child process with a deadline of its own.
"""

from __future__ import annotations

import asyncio
import contextvars
import textwrap
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import soma
from conftest import DEADLINE, Add, CallRecord, Double, Pass, SumValues, run_script


class AsyncAdd(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    async def forward(self, x: int) -> int:
        await asyncio.sleep(0)
        return x + self.k


class AsyncDouble(soma.Node):
    async def forward(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x


class Split(soma.Node):
    def forward(self, n: int) -> list[int]:
        return list(range(n))


class Meeting(soma.Node):
    """An async node whose calls meet at a barrier of ``parties``: they return only if that
    many are in flight together, within the deadline. Counts the most inside at once."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.barrier: asyncio.Barrier | None = None
        self.now = 0
        self.most = 0

    async def forward(self, x: int) -> int:
        if self.barrier is None:  # Made on the loop that runs it.
            self.barrier = asyncio.Barrier(self.parties)
        self.now += 1
        self.most = max(self.most, self.now)
        async with asyncio.timeout(DEADLINE):
            await self.barrier.wait()
        self.now -= 1
        return x


class Calls(soma.Node):
    """An async node that counts its calls and returns its input."""

    def __init__(self) -> None:
        self.calls = 0

    async def forward(self, x: Any) -> Any:
        self.calls += 1
        await asyncio.sleep(0)
        return x


# ---------------------------------------------------------------------------------------------
# The same results as sync nodes


@dataclass(frozen=True)
class Body:
    """A random body of steps that decide, each node async or sync as drawn."""

    shape: tuple[Any, ...]

    def build(self, sync: bool) -> Any:
        kind, *parts = self.shape
        if kind == "add":
            k, is_async = parts
            return Add(k) if sync or not is_async else AsyncAdd(k)
        if kind == "double":
            return Double() if sync or not parts[0] else AsyncDouble()
        if kind == "each":
            inner = Body(parts[0]).build(sync)
            return Pass() >> soma.each(inner, in_flight=parts[1]) >> SumValuesOfList()
        if kind == "switch":
            even, odd = (Body(p).build(sync) for p in parts)
            return soma.switch(lambda x: x % 2 == 0, {True: even, False: odd})
        if kind == "loop":
            inner = Body(parts[0]).build(sync)
            return soma.loop(inner >> Bounded(), until=lambda y: abs(y) > 50, max_iterations=4)
        left, right = (Body(p).build(sync) for p in parts)
        if kind == "series":
            return left >> right
        return (left | right) >> SumValues()


class SumValuesOfList(soma.Node):
    def forward(self, xs: list[int]) -> int:
        return sum(xs)


class Bounded(soma.Node):
    """Keeps a loop's value growing and small: its iterations end, by `until` or the bound."""

    def forward(self, x: int) -> int:
        return (abs(x) + 7) % 1000


leaves = st.one_of(
    st.tuples(st.just("add"), st.integers(-3, 3), st.booleans()),
    st.tuples(st.just("double"), st.booleans()),
)
shapes = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["series", "wave", "switch"]), inner, inner),
        st.tuples(st.just("each"), inner, st.sampled_from([None, 1, 2])),
        st.tuples(st.just("loop"), inner),
    ),
    max_leaves=6,
).map(Body)


@given(body=shapes, x=st.integers(-20, 20))
def test_steps_with_async_and_sync_nodes_inside_give_the_all_sync_results(
    body: Body, x: int
) -> None:
    sync = soma.Graph.somatize(Split() >> soma.each(Pass() >> body.build(sync=True)))
    mixed = soma.Graph.somatize(Split() >> soma.each(Pass() >> body.build(sync=False)))
    n = abs(x) % 5
    expected = outcome(lambda: sync.forward(n))
    assert outcome(lambda: asyncio.run(mixed.aforward(n))) == expected
    assert outcome(lambda: mixed.forward(n)) == expected


def outcome(run: Any) -> Any:
    """What ``run()`` returns, or the text of the ``soma.RunError`` it raises (a loop past its
    bound), so that the two ways compare either way."""
    try:
        return run()
    except soma.RunError as error:
        return ("RunError", str(error))


# ---------------------------------------------------------------------------------------------
# each


def test_each_items_of_an_async_node_are_in_flight_together() -> None:
    meet = Meeting(5)
    g = soma.Graph.somatize(soma.each(meet))
    assert asyncio.run(g.aforward([1, 2, 3, 4, 5])) == [1, 2, 3, 4, 5]
    assert meet.most == 5


def test_each_of_an_async_node_has_at_most_in_flight_items_at_once() -> None:
    meet = Meeting(3)
    g = soma.Graph.somatize(soma.each(meet, in_flight=3))
    assert asyncio.run(g.aforward(list(range(9)))) == list(range(9))
    assert meet.most == 3


def test_a_thousand_waiting_items_add_no_thread_each() -> None:
    meet = Meeting(1000)
    g = soma.Graph.somatize(soma.each(meet))
    before = threading.active_count()
    assert g.forward(list(range(1000))) == list(range(1000))  # All 1,000 met: all in flight.
    assert threading.active_count() - before <= 4  # The loop Soma keeps, and a lent thread.


def test_each_of_an_async_node_refuses_text_as_the_engine_does() -> None:
    sync = soma.Graph.somatize(soma.each(Double()).named("chunks"))
    mixed = soma.Graph.somatize(soma.each(AsyncDouble()).named("chunks"))
    for value in ("abc", b"ab", {"a": 1}, 3):
        with pytest.raises(soma.RunError) as engine:
            sync.forward(value)
        with pytest.raises(soma.RunError) as walked:
            asyncio.run(mixed.aforward(value))
        assert (str(walked.value), walked.value.node) == (str(engine.value), "chunks")


def test_the_first_failing_item_by_index_wins_and_later_items_are_cancelled() -> None:
    ended: list[str] = []

    class Item(soma.Node):
        def __init__(self) -> None:
            self.third_failed: asyncio.Event | None = None
            self.fifth_started: asyncio.Event | None = None

        async def forward(self, x: int) -> int:
            if self.third_failed is None or self.fifth_started is None:
                self.third_failed, self.fifth_started = asyncio.Event(), asyncio.Event()
            failed = self.third_failed
            try:
                if x == 3:
                    # Item 4 is running (not merely not started) when item 3 fails.
                    async with asyncio.timeout(DEADLINE):
                        await self.fifth_started.wait()
                    failed.set()
                    raise ValueError("item 3")
                if x == 4:
                    self.fifth_started.set()
                    await asyncio.Event().wait()  # Never set: only cancelled.
                async with asyncio.timeout(DEADLINE):
                    await failed.wait()
                if x == 1:
                    raise KeyError("item 1")
                return x
            finally:
                ended.append(f"{x}")

    g = soma.Graph.somatize(soma.each(Item().named("boom")).named("items"))
    with pytest.raises(KeyError, match="item 1") as raised:
        asyncio.run(g.aforward([0, 1, 2, 3, 4]))
    assert raised.value.__notes__ == ["raised in soma node `items/boom`"]
    assert sorted(ended) == ["0", "1", "2", "3", "4"]  # Item 0 ran to its end; 4 cancelled.


def test_a_retry_on_each_reaches_the_async_nodes_inside() -> None:
    attempts: list[int] = []

    class Flaky(soma.Node):
        async def forward(self, x: int) -> int:
            attempts.append(x)
            if attempts.count(x) < 2:
                raise ConnectionError("dropped")
            return x

    g = soma.Graph.somatize(soma.each(Flaky()).retry(1, backoff=0).named("items"))
    assert asyncio.run(g.aforward([5, 6])) == [5, 6]
    assert sorted(attempts) == [5, 5, 6, 6]


def test_settings_by_namespaced_id_reach_the_async_nodes_inside() -> None:
    class Stuck(soma.Node):
        async def forward(self, x: int) -> int:
            await asyncio.sleep(DEADLINE)
            return x

    g = soma.Graph.somatize(soma.each(Stuck()).named("items"))
    g.time_limit("items/stuck", 0.01)
    with pytest.raises(soma.TimeLimitError, match="`items/stuck` ran past its time limit"):
        g.forward([1])


def test_each_of_async_items_nests_inside_each() -> None:
    g = soma.Graph.somatize(Split() >> soma.each(Split() >> soma.each(AsyncAdd(10))))
    assert asyncio.run(g.aforward(3)) == [[], [10], [10, 11]]


def test_each_item_of_an_async_node_runs_in_a_copy_of_the_context_of_its_own() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    class SetAndRead(soma.Node):
        async def forward(self, x: int) -> tuple[int, str]:
            before = var.get()
            var.set(f"item {x}")
            await asyncio.sleep(0)
            return x, before

    async def main() -> Any:
        var.set("caller")
        g = soma.Graph.somatize(soma.each(SetAndRead()))
        return await g.aforward([1, 2]), var.get()

    assert asyncio.run(main()) == ([(1, "caller"), (2, "caller")], "caller")


def test_each_of_async_items_has_a_span_per_item_and_per_node_inside() -> None:
    trace = soma.Trace()
    g = soma.Graph.somatize(soma.each(AsyncDouble() >> Add(1)).named("items"))
    assert g.forward([1, 2], trace=trace) == [3, 5]
    names = sorted(span.node for span in trace.spans)
    inside = ["items/add", "items/add", "items/async_double", "items/async_double"]
    assert names == [*inside, "items[0]", "items[1]"]


def test_amap_and_map_run_each_steps_of_async_items() -> None:
    g = soma.Graph.somatize(soma.each(AsyncAdd(1)))

    async def streamed() -> list[Any]:
        return [y async for y in g.amap([[1], [2, 3]])]

    assert asyncio.run(streamed()) == [[2], [3, 4]]
    assert list(g.map([[1], [2, 3]])) == [[2], [3, 4]]


CALLED = CallRecord()  # Keyed as an empty record: recording a call changes no key.


class Inside(soma.Node):
    async def forward(self, x: int) -> int:
        CALLED.append("inside")
        return x


class After(soma.Node):
    async def forward(self, x: int) -> int:
        CALLED.append("after")
        return x


def test_with_a_cache_the_node_after_an_async_each_hits() -> None:
    CALLED.clear()
    g = soma.Graph.somatize(soma.each(Inside()) >> SumValuesOfList() >> After())
    cache = soma.Cache()
    assert g.forward([1, 2], cache=cache) == g.forward([1, 2], cache=cache) == 3
    # The async nodes inside the step are looked up as a sync walk looks them up (an item
    # seen before hits), and so is the node after the step, keyed on the step's output.
    assert CALLED.count("inside") == 2
    assert CALLED.count("after") == 1


def test_with_a_cache_the_async_nodes_inside_an_each_hit_through_aforward_too() -> None:
    CALLED.clear()
    g = soma.Graph.somatize(soma.each(Inside()) >> SumValuesOfList())
    cache = soma.Cache()
    first = asyncio.run(g.aforward([1, 2], cache=cache))
    assert first == asyncio.run(g.aforward([1, 2, 3], cache=cache)) - 3 == 3
    # Items 1 and 2 were seen by the first run: the second calls the node for 3 alone.
    assert CALLED.count("inside") == 3
    assert cache.stats().hits >= 2


def test_on_written_on_each_places_the_async_nodes_inside() -> None:
    class Where(soma.Node):
        async def forward(self, x: int, ctx: soma.Ctx) -> str | None:
            return ctx.device

    g = soma.Graph.somatize(soma.each(Where()).on("cpu"))
    assert g.forward([1]) == ["cpu"]


# ---------------------------------------------------------------------------------------------
# switch and loop


def test_switch_with_async_cases_runs_only_the_case_its_selector_names() -> None:
    ocr, text = Calls(), Calls()
    g = soma.Graph.somatize(soma.switch(lambda doc: doc["kind"], {"ocr": ocr, "text": text}))
    assert asyncio.run(g.aforward({"kind": "text"})) == {"kind": "text"}
    assert (ocr.calls, text.calls) == (0, 1)


def test_switch_with_async_cases_names_an_unknown_key_as_the_engine_does() -> None:
    sync = soma.Graph.somatize(soma.switch(lambda d: "pdf", {"ocr": Pass()}).named("route"))
    mixed = soma.Graph.somatize(soma.switch(lambda d: "pdf", {"ocr": Calls()}).named("route"))
    with pytest.raises(soma.RunError) as engine:
        sync.forward({})
    with pytest.raises(soma.RunError) as walked:
        asyncio.run(mixed.aforward({}))
    assert str(walked.value) == str(engine.value)
    assert walked.value.__notes__ == engine.value.__notes__ == ["raised in soma node `route`"]


def test_switch_with_async_cases_has_spans_as_the_engine_names_them() -> None:
    trace = soma.Trace()
    g = soma.Graph.somatize(soma.switch(lambda x: "a", {"a": AsyncDouble()}).named("s"))
    assert g.forward(1, trace=trace) == 2
    assert sorted(span.node for span in trace.spans) == ["s", "s/a/async_double", "s[a]"]


def test_loop_with_an_async_body_runs_until_the_predicate_says_done() -> None:
    body = Calls()
    g = soma.Graph.somatize(
        soma.loop(body >> AsyncDouble(), until=lambda y: y > 20, max_iterations=10).named("l")
    )
    trace = soma.Trace()
    assert g.forward(3, trace=trace) == 24
    assert body.calls == 3
    names = [span.node for span in trace.spans]
    assert [n for n in names if n.startswith("l[")] == ["l[0]", "l[1]", "l[2]"]
    assert names.count("l") == 3


def test_loop_with_an_async_body_past_its_bound_fails_as_the_engine_does() -> None:
    sync = soma.Graph.somatize(soma.loop(Double(), until=lambda y: False, max_iterations=4))
    mixed = soma.Graph.somatize(soma.loop(AsyncDouble(), until=lambda y: False, max_iterations=4))
    with pytest.raises(soma.RunError) as engine:
        sync.forward(1)
    with pytest.raises(soma.RunError) as walked:
        asyncio.run(mixed.aforward(1))
    assert str(walked.value) == str(engine.value)
    assert walked.value.node == "loop"


def test_switches_and_loops_of_async_nodes_nest_inside_each_other() -> None:
    inner = soma.loop(AsyncAdd(3), until=lambda y: y > 10, max_iterations=10)
    route = soma.switch(lambda x: x % 2 == 0, {True: inner, False: soma.switch(bool, {True: None})})
    g = soma.Graph.somatize(Split() >> soma.each(route))
    assert g.forward(4) == [12, 1, 11, 3]


def test_steps_nested_deep_with_an_async_node_run_without_recursion() -> None:
    body: Any = AsyncAdd(1)
    for level in range(30):
        body = soma.switch(lambda x: "go", {"go": body}).named(f"s{level}")
    g = soma.Graph.somatize(body)
    assert asyncio.run(g.aforward(1)) == 2


# ---------------------------------------------------------------------------------------------
# Cancellation and deadlines


def test_cancelling_aforward_cancels_the_async_items_in_flight() -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, soma
        ended = []
        class Hang(soma.Node):
            async def forward(self, x):
                try:
                    await asyncio.sleep(60)
                finally:
                    ended.append(x)
                return x
        g = soma.Graph.somatize(soma.each(soma.switch(lambda x: "a", {{"a": Hang()}})))
        async def main():
            try:
                async with asyncio.timeout(0.2):
                    await g.aforward([1, 2, 3])
            except TimeoutError:
                print("cancelled", sorted(ended), flush=True)
            async with asyncio.timeout({DEADLINE}):
                print("again", await soma.Graph.somatize(soma.each(Hang())).aforward([]))
        asyncio.run(main())
        """
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    assert "cancelled [1, 2, 3]" in done.stdout
    assert "again []" in done.stdout


def test_a_timeout_names_the_async_nodes_still_running_inside_a_step() -> None:
    script = textwrap.dedent(
        """
        import asyncio, soma
        class Hang(soma.Node):
            async def forward(self, x):
                await asyncio.sleep(60)
        g = soma.Graph.somatize(soma.each(soma.loop(Hang(), until=bool, max_iterations=2)))
        try:
            g.forward([1, 2], timeout=0.2)
        except TimeoutError as e:
            print("timed out:", e, flush=True)
        """
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    assert "still running: `each/loop/hang` (cancelled)" in done.stdout


def test_in_amap_a_step_takes_as_many_items_at_once_as_its_concurrency() -> None:
    meet = Meeting(2)  # Both items' steps must be in flight together to meet.
    g = soma.Graph.somatize(Pass() >> soma.each(meet).named("items").concurrency(2))

    async def streamed() -> list[Any]:
        return [y async for y in g.amap([[1], [2]], in_flight=2)]

    assert asyncio.run(streamed()) == [[1], [2]]


def test_settings_by_namespaced_id_reach_a_sync_step_beside_async_nodes() -> None:
    attempts: list[int] = []

    class Flaky(soma.Node):
        def forward(self, x: int) -> int:
            attempts.append(x)
            if attempts.count(x) < 2:
                raise ConnectionError("dropped")
            return x

    # The step has no async node inside: a piece of the engine's runs it, registered again.
    g = soma.Graph.somatize(Calls() >> soma.each(Flaky()).named("items"))
    g.retry("items/flaky", 1, backoff=0.0)
    assert asyncio.run(g.aforward([5])) == [5]
    assert attempts == [5, 5]


def test_a_switch_selector_and_a_loop_predicate_beside_async_nodes_run_on_the_loop() -> None:
    seen: list[int] = []

    def selector(x: int) -> str:
        seen.append(threading.get_ident())
        return "a"

    def until(y: int) -> bool:
        seen.append(threading.get_ident())
        return True

    body = soma.switch(selector, {"a": AsyncAdd(1)})
    g = soma.Graph.somatize(soma.loop(body, until=until, max_iterations=2))
    assert asyncio.run(g.aforward(1)) == 2
    assert seen == [threading.get_ident()] * 2  # asyncio.run's loop runs on this thread.
