"""Graphs that decide as they run: ``soma.each``, ``soma.switch`` and ``soma.loop``.

Items of an ``each`` are shown in flight together by rendezvous with a deadline, never by
sleeping; a bound on them by counting who is inside at once; a hang (a deadline, Ctrl-C) is
tested in a child process with a deadline of its own.
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
from conftest import (
    DEADLINE,
    Add,
    CallRecord,
    Double,
    Fn,
    Meet,
    Pass,
    SumValues,
    interrupt_script,
    run_script,
)


class Split(soma.Node):
    """A list of the numbers below its input."""

    def forward(self, x: int) -> list[int]:
        return list(range(x))


class Calls(soma.Node):
    """Counts its calls and returns its input."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def forward(self, x: Any) -> Any:
        with self._lock:
            self.calls += 1
        return x


class Inside(soma.Node):
    """Counts how many items are inside it at once, the most it ever saw kept, and meets its
    peers at `barrier` so that the count is not a matter of luck."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier
        self.now = 0
        self.most = 0
        self._lock = threading.Lock()

    def forward(self, x: Any) -> Any:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        self.barrier.wait()
        with self._lock:
            self.now -= 1
        return x


# ---------------------------------------------------------------------------------------------
# each


def test_each_returns_its_results_in_input_order() -> None:
    g = soma.Graph.somatize(Split() >> soma.each(Add(1) >> Double()))
    assert g.forward(5) == [2, 4, 6, 8, 10]


def test_each_over_an_empty_list_returns_an_empty_list() -> None:
    g = soma.Graph.somatize(soma.each(Double()))
    assert g.forward([]) == []


def test_each_takes_any_sized_sequence_of_items() -> None:
    g = soma.Graph.somatize(soma.each(Double()))
    assert g.forward((1, 2)) == [2, 4]
    assert g.forward(range(3)) == [0, 2, 4]


def test_each_items_are_in_flight_together() -> None:
    barrier = threading.Barrier(4, timeout=DEADLINE)
    g = soma.Graph.somatize(soma.each(Add(1) >> Meet(barrier)))
    assert g.forward([1, 2, 3, 4]) == [2, 3, 4, 5]


def test_each_with_in_flight_has_exactly_that_many_items_at_once() -> None:
    barrier = threading.Barrier(3, timeout=DEADLINE)
    inside = Inside(barrier)
    g = soma.Graph.somatize(soma.each(inside, in_flight=3))
    assert g.forward(list(range(9))) == list(range(9))
    # Three met at the barrier each time, so three were in flight; never a fourth.
    assert inside.most == 3


def test_the_first_failing_item_by_index_is_the_error() -> None:
    later_failed = threading.Event()

    def item(x: int) -> int:
        if x == 3:
            later_failed.set()
            raise KeyError("item 3")
        if x == 1:
            # Fails after item 3 has: the clock's first error is not the one reported.
            assert later_failed.wait(DEADLINE)
            raise ValueError("item 1")
        return x

    g = soma.Graph.somatize(soma.each(Fn(item)).named("items"))
    with pytest.raises(ValueError, match="item 1") as raised:
        g.forward([0, 1, 2, 3])
    assert any("items/fn" in note for note in raised.value.__notes__)


def test_items_before_a_failing_one_run_to_their_end() -> None:
    failed = threading.Event()
    after = Calls()

    def item(x: int) -> int:
        if x == 1:
            failed.set()
            raise ValueError("item 1")
        assert failed.wait(DEADLINE)
        return x

    g = soma.Graph.somatize(soma.each(Fn(item) >> after))
    with pytest.raises(ValueError, match="item 1"):
        g.forward([0, 1])
    assert after.calls == 1  # Item 0's second node ran, though item 1 had failed.


def test_each_nests_inside_each() -> None:
    inner = soma.each(Split() >> soma.each(Add(10)))
    g = soma.Graph.somatize(Split() >> inner)
    assert g.forward(3) == [[], [10], [10, 11]]


def test_nested_each_ids_are_namespaced_under_each_step() -> None:
    g = soma.Graph.somatize(
        soma.each(soma.each(Double().named("double")).named("inner")).named("outer")
    )
    plan = g.plan()
    assert repr(plan) == "Map(outer, [Map(outer/inner, [Execute(outer/inner/double)])])"
    assert g.forward([[1, 2], [3]]) == [[2, 4], [6]]


def test_each_plan_is_a_map_step_holding_its_body() -> None:
    g = soma.Graph.somatize(Split() >> soma.each(Add(1) >> Double(), in_flight=2).named("chunks"))
    plan = g.plan()
    step = plan.children[1]
    assert (step.kind, step.node, step.inputs, step.bound) == ("Map", "chunks", ["split"], 2)
    assert repr(step.children[0]) == "Sequence([Execute(chunks/add), Execute(chunks/double)])"
    assert str(plan) == textwrap.dedent(
        """\
        Sequence
        ├── split <- (input)
        └── Map chunks <- split, each item: (2 in flight at most)
            └── Sequence
                ├── chunks/add <- (input)
                └── chunks/double <- chunks/add"""
    )


def test_each_is_written_with_node_and_edge_too() -> None:
    g = soma.Graph()
    split = g.node("split", Split())
    chunks = g.node("chunks", soma.each(Add(1)))
    g.edge(split, chunks)
    assert g.forward(3) == [1, 2, 3]
    assert g.plan() == soma.Graph.somatize(Split() >> soma.each(Add(1)).named("chunks")).plan()


def test_each_refuses_text_naming_the_step_and_the_type() -> None:
    g = soma.Graph.somatize(soma.each(Double()).named("chunks"))
    with pytest.raises(soma.RunError, match=r"`each` step `chunks` read a `str`") as raised:
        g.forward("abc")
    assert raised.value.node == "chunks"


def test_a_panic_in_an_item_is_a_panic_error_and_the_graph_runs_again() -> None:
    route = soma.switch(lambda x: "bad" if x else "good", {"bad": soma.native.Panic("bug")})
    g = soma.Graph.somatize(soma.each(soma.switch(bool, {True: route, False: None})))
    with pytest.raises(soma.PanicError, match="bug"):
        g.forward([0, 1, 0])
    assert g.forward([0, 0]) == [0, 0]


def test_each_refuses_bytes_and_mappings_too() -> None:
    g = soma.Graph.somatize(soma.each(Double()).named("chunks"))
    for value, kind in ((b"ab", "bytes"), ({"a": 1}, "dict"), (3, "int")):
        with pytest.raises(soma.RunError, match=f"read a `{kind}`, not a list of items"):
            g.forward(value)


def test_steps_nested_a_thousand_deep_build_draw_and_run_on_a_small_stack() -> None:
    # Each inside each, and each, switch and loop in turn: in a child, on a thread with a
    # small stack, so that recursion per level (Python's, or the engine's) fails it, not the
    # suite.
    script = textwrap.dedent(
        """
        import threading
        import soma

        class Add(soma.Node):
            def __init__(self, k):
                self.k = k

            def forward(self, x):
                return x + self.k

        def nested(mixed):
            body, x, want = Add(1).named("leaf"), 1, 2
            for level in range(1000):
                kind = level % 3 if mixed else 0
                if kind == 1:
                    cases = {"on": body, "off": Add(0).named("same")}
                    body = soma.switch(lambda v: "on", cases).named("s")
                elif kind == 2:
                    body = soma.loop(body, until=lambda v: True, max_iterations=2).named("l")
                else:
                    body, x, want = soma.each(body).named("m"), [x], [want]
            return body, x, want

        def main():
            for mixed in (False, True):
                body, x, want = nested(mixed)
                g = soma.Graph.somatize(body)
                plan = g.plan()
                deepest, stack = "", [plan]
                while stack:
                    at = stack.pop()
                    deepest = max(deepest, at.node or "", key=len)
                    stack.extend(at.children)
                assert deepest.endswith("/leaf"), deepest
                for drawing in (str(plan), plan.to_mermaid(), plan.to_dot(), plan.to_svg()):
                    assert deepest in drawing
                got = g.forward(x)
                # Unwrapped level by level: `==` on lists a thousand deep would recurse.
                while isinstance(want, list):
                    assert isinstance(got, list) and len(got) == len(want) == 1, got
                    got, want = got[0], want[0]
                assert got == want, got
            print("ok")

        threading.stack_size(512 * 1024)
        worker = threading.Thread(target=main)
        worker.start()
        worker.join()
        """
    )
    done = run_script(script)
    assert done.stdout == "ok\n", done.stderr


def test_each_refuses_a_bad_in_flight() -> None:
    with pytest.raises(ValueError, match="in_flight"):
        soma.each(Double(), in_flight=0)


def test_each_runs_many_trivial_items_on_far_fewer_threads_than_items() -> None:
    g = soma.Graph.somatize(soma.each(Add(1) >> Double() >> Pass()))
    assert g.forward(list(range(10_000))) == [2 * (x + 1) for x in range(10_000)]
    # Lent as items are in flight, never one per item; how few is the benchmark's to count.
    assert g.threads() <= 64


def test_a_retry_on_each_reaches_the_nodes_inside() -> None:
    attempts: list[int] = []

    def flaky(x: int) -> int:
        attempts.append(x)
        if attempts.count(x) < 2:
            raise ConnectionError("dropped")
        return x

    g = soma.Graph.somatize(soma.each(Fn(flaky)).retry(1, backoff=0).named("items"))
    assert g.retries() == {"items/fn": soma.RetryPolicy(1, 0.0, (Exception,))}
    assert g.forward([5, 6]) == [5, 6]
    assert sorted(attempts) == [5, 5, 6, 6]


def test_nodes_inside_a_step_take_settings_by_their_namespaced_id() -> None:
    g = soma.Graph.somatize(soma.each(Double().on("cpu")).named("items"))
    g.time_limit("items/double", 5.0)
    g.retry("items/double", 1, backoff=0.0)
    assert g.time_limits() == {"items/double": 5.0}
    assert g.retries() == {"items/double": soma.RetryPolicy(1, 0.0, (Exception,))}
    assert g.devices() == {"items/double": "cpu"}
    assert g.forward([1, 2]) == [2, 4]


def test_on_written_on_a_step_places_the_nodes_inside_that_have_no_device() -> None:
    g = soma.Graph.somatize(
        soma.each(Double().named("free") >> Double().named("own").on("meta")).on("cpu")
    )
    assert g.devices() == {"each/free": "cpu", "each/own": "meta"}


def test_a_node_inside_each_may_await_the_runs_driver() -> None:
    class Ask(soma.Node):
        def forward(self, x: int, ctx: soma.Ctx) -> Any:
            if ctx.turn == 0:
                return soma.Await([x])
            return ctx.results[0]

    class Driver:
        def perform(self, requests: list[int]) -> list[int]:
            return [10 * r for r in requests]

    g = soma.Graph.somatize(soma.each(Ask()))
    assert g.forward([1, 2, 3], driver=Driver()) == [10, 20, 30]


def test_each_item_runs_in_a_copy_of_the_context_of_its_own() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def set_and_read(x: int) -> tuple[int, str]:
        before = var.get()
        var.set(f"item {x}")
        return x, before

    token = var.set("caller")
    try:
        g = soma.Graph.somatize(soma.each(Fn(set_and_read)) >> Fn(lambda xs: (xs, var.get())))
        # Each item saw the caller's value, not another item's; what they set stayed theirs.
        assert g.forward([1, 2]) == ([(1, "caller"), (2, "caller")], "caller")
        assert var.get() == "caller"
    finally:
        var.reset(token)


class Fetch(soma.Node):
    async def forward(self, n: int) -> list[int]:
        await asyncio.sleep(0)
        return list(range(n))


def test_a_graph_with_async_nodes_runs_an_each_step_beside_them() -> None:
    g = soma.Graph.somatize(Fetch() >> soma.each(Double() >> Add(1)))
    assert g.forward(3) == [1, 3, 5]
    assert asyncio.run(g.aforward(4)) == [1, 3, 5, 7]


def test_an_async_node_inside_a_step_makes_the_graph_async() -> None:
    g = soma.Graph.somatize(soma.each(Fetch()).named("items"))
    assert g._core.route(True) == "flow"  # A stream of it runs each item on the loop.
    assert g.forward([1, 2]) == [[0], [0, 1]]  # tests/test_async_decide.py says the rest.


def test_a_stream_runs_an_each_step_as_a_stage() -> None:
    g = soma.Graph.somatize(Pass() >> soma.each(Double()))
    assert list(g.map([[1, 2], [3]])) == [[2, 4], [6]]


def test_with_a_cache_the_nodes_inside_an_each_and_after_it_hit_on_a_rerun() -> None:
    calls = CallRecord()  # A record no key covers: keyed as an empty one (see `CallRecord`).
    inside = Fn(lambda x: calls.append(x) or x)
    g = soma.Graph.somatize(soma.each(inside) >> Fn(lambda xs: calls.append(-1) or sum(xs)))
    cache = soma.Cache()
    assert g.forward([1, 2], cache=cache) == 3
    assert sorted(calls) == [-1, 1, 2]
    calls.clear()
    assert g.forward([1, 2], cache=cache) == 3
    assert calls == []  # The items' nodes hit, and the node after, keyed on the same output.


def test_each_trace_has_a_span_per_item_and_per_node_inside() -> None:
    trace = soma.Trace()
    g = soma.Graph.somatize(soma.each(Double()).named("items"))
    g.forward([1, 2, 3], trace=trace)
    names = sorted(span.node for span in trace.spans)
    assert names == [
        "items/double",
        "items/double",
        "items/double",
        "items[0]",
        "items[1]",
        "items[2]",
    ]


def test_a_host_on_each_is_refused_naming_the_step() -> None:
    with pytest.raises(soma.HostError, match="`items` is an `each` step"):
        soma.each(Double()).named("items").at("gpu-box")
    with pytest.raises(soma.HostError, match="`double` is in an `each` step"):
        soma.Graph.somatize(soma.each(Double().at("gpu-box")))


def test_a_deadline_stops_an_each_whose_items_hang() -> None:
    script = textwrap.dedent(
        f"""
        import threading, soma
        never = threading.Event()
        class Hang(soma.Node):
            def forward(self, x):
                never.wait({DEADLINE})
                return x
        g = soma.Graph.somatize(soma.each(Hang()))
        try:
            g.forward([1, 2, 3], timeout=0.2)
        except TimeoutError as e:
            print("timed out", type(e).__name__, flush=True)
        """
    )
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    assert "timed out" in done.stdout


def test_ctrl_c_stops_an_each_whose_items_hang() -> None:
    script = textwrap.dedent(
        f"""
        import threading, soma
        started = threading.Barrier(3, timeout={DEADLINE})
        never = threading.Event()
        class Hang(soma.Node):
            def forward(self, x):
                if started.wait() == 0:
                    print("ready", flush=True)
                never.wait(60)
                return x
        g = soma.Graph.somatize(soma.each(Hang()))
        g.forward([1, 2, 3])
        """
    )
    done = interrupt_script(script, "ready")
    assert done.returncode != 0
    assert "KeyboardInterrupt" in done.stderr, done.stderr


def test_ctrl_c_leaves_a_wave_inside_an_item_whose_branch_hangs() -> None:
    # Item 0 runs on the caller's thread, and so does the first branch of its wave; the other
    # branch hangs on a crew thread. The caller stops waiting for it, as for any wave.
    script = textwrap.dedent(
        f"""
        import threading, soma
        started = threading.Barrier(2, timeout={DEADLINE})
        never = threading.Event()
        class Hang(soma.Node):
            def forward(self, x):
                if started.wait() == 0:
                    print("ready", flush=True)
                never.wait(120)
                return x
        g = soma.Graph.somatize(soma.each(Hang() | Hang()))
        g.forward([1])
        """
    )
    done = interrupt_script(script, "ready")
    assert done.returncode != 0
    assert "KeyboardInterrupt" in done.stderr, done.stderr


# A random body: a node, two in series, or two side by side joined by a sum.
@dataclass(frozen=True)
class Body:
    shape: tuple[Any, ...]

    def build(self) -> Any:
        kind, *parts = self.shape
        if kind == "add":
            return Add(parts[0])
        if kind == "double":
            return Double()
        left, right = (Body(p).build() for p in parts)
        if kind == "series":
            return left >> right
        return (left | right) >> SumValues()


bodies = st.recursive(
    st.one_of(
        st.integers(-3, 3).map(lambda k: ("add", k)),
        st.just(("double",)),
    ),
    lambda inner: st.tuples(st.sampled_from(["series", "wave"]), inner, inner),
    max_leaves=6,
).map(Body)


@given(body=bodies, items=st.lists(st.integers(-100, 100), max_size=12))
def test_each_equals_a_loop_of_forward_over_random_bodies(body: Body, items: list[int]) -> None:
    alone = soma.Graph.somatize(body.build())
    mapped = soma.Graph.somatize(soma.each(body.build()))
    assert mapped.forward(items) == [alone.forward(x) for x in items]


# ---------------------------------------------------------------------------------------------
# switch


def test_switch_runs_only_the_case_its_selector_names() -> None:
    ocr, text = Calls(), Calls()
    g = soma.Graph.somatize(
        soma.switch(lambda doc: doc["kind"], {"ocr": ocr >> Pass(), "text": text})
    )
    assert g.forward({"kind": "text"}) == {"kind": "text"}
    assert (ocr.calls, text.calls) == (0, 1)


def test_switch_names_an_unknown_key_and_the_known_ones() -> None:
    g = soma.Graph.somatize(
        soma.switch(lambda doc: "pdf", {"ocr": Pass(), "text": Pass()}).named("route")
    )
    with pytest.raises(
        soma.RunError, match=r"`route` has no case for key `'pdf'`; its cases: `'ocr'`, `'text'`"
    ):
        g.forward({})


def test_switch_keys_need_not_be_text() -> None:
    g = soma.Graph.somatize(soma.switch(lambda x: x > 0, {True: Double(), False: Add(-1)}))
    assert (g.forward(4), g.forward(-4)) == (8, -5)
    assert g.plan().keys == ["True", "False"]


def test_a_switch_case_of_none_passes_its_input_on() -> None:
    g = soma.Graph.somatize(soma.switch(lambda x: "skip", {"skip": None, "work": Double()}))
    assert g.forward(3) == 3


def test_switch_cases_may_hold_nodes_of_one_name() -> None:
    g = soma.Graph.somatize(
        soma.switch(
            lambda x: "a" if x else "b", {"a": Double().named("n"), "b": Add(1).named("n")}
        ).named("s")
    )
    assert (g.forward(1), g.forward(0)) == (2, 1)
    assert [c.node for c in g.plan().children] == ["s/a/n", "s/b/n"]


def test_switch_trace_has_a_span_for_the_case_run() -> None:
    trace = soma.Trace()
    g = soma.Graph.somatize(soma.switch(lambda x: "a", {"a": Double()}).named("s"))
    g.forward(1, trace=trace)
    assert sorted(span.node for span in trace.spans) == ["s", "s/a/double", "s[a]"]


# ---------------------------------------------------------------------------------------------
# loop


def test_loop_runs_its_body_until_the_predicate_says_done() -> None:
    body = Calls()
    g = soma.Graph.somatize(soma.loop(body >> Double(), until=lambda y: y > 20, max_iterations=10))
    assert g.forward(3) == 24
    assert body.calls == 3  # 3 -> 6 -> 12 -> 24


def test_loop_past_its_bound_says_so_with_the_last_output_type() -> None:
    g = soma.Graph.somatize(
        soma.loop(Double(), until=lambda y: False, max_iterations=4).named("again")
    )
    with pytest.raises(
        soma.RunError, match=r"`again` ran its body 4 times .* the last output was a `int`"
    ) as raised:
        g.forward(1)
    assert raised.value.node == "again"


def test_loop_refuses_a_bound_below_one() -> None:
    with pytest.raises(ValueError, match="max_iterations"):
        soma.loop(Double(), until=bool, max_iterations=0)


def test_loop_trace_has_a_span_per_iteration() -> None:
    trace = soma.Trace()
    g = soma.Graph.somatize(
        soma.loop(Double(), until=lambda y: y >= 8, max_iterations=5).named("l")
    )
    assert g.forward(1, trace=trace) == 8
    names = [span.node for span in trace.spans]
    assert [n for n in names if n.startswith("l[")] == ["l[0]", "l[1]", "l[2]"]
    assert names.count("l") == 3  # The predicate, once per iteration.


def test_decisions_compose_with_each_other() -> None:
    route = soma.switch(
        lambda x: "even" if x % 2 == 0 else "odd",
        {
            "even": Double(),
            "odd": soma.loop(Add(3), until=lambda y: y > 10, max_iterations=10),
        },
    )
    g = soma.Graph.somatize(Split() >> soma.each(route))
    assert g.forward(4) == [0, 13, 4, 12]


# ---------------------------------------------------------------------------------------------
# Drawings


def test_every_drawing_shows_each_switch_and_loop_with_what_they_run() -> None:
    g = soma.Graph.somatize(
        Split()
        >> soma.each(soma.switch(lambda x: "a", {"a": Double(), "b": Add(1)}).named("route")).named(
            "chunks"
        )
    )
    mermaid, dot, svg = g.to_mermaid(), g.to_dot(), g.plan().to_svg()
    for label in ("each chunks", "switch chunks/route (a | b)", "chunks/route/a/double"):
        assert label in mermaid, mermaid
        assert label in dot, dot
        assert label in svg, svg
    assert svg.count('<g class="decision">') == 2
    # The graph's own drawing has no frames: the step is a box there.
    assert "chunks" in g.to_svg()


def test_a_node_named_as_a_node_inside_a_step_is_refused_and_the_graph_is_unchanged() -> None:
    g = soma.Graph.somatize(soma.each(Add(1).named("x")).named("a"))
    with pytest.raises(soma.InvalidIdError, match="`a/x`: `/` separates") as raised:
        g.node("a/x", Add(100))
    assert raised.value.node == "a/x"
    assert g.nodes() == ["a"]
    assert g.forward([1, 2]) == [2, 3]


def test_a_node_named_as_one_inside_a_step_is_refused_before_the_step_too() -> None:
    g = soma.Graph()
    with pytest.raises(soma.InvalidIdError, match="`a/x`") as raised:
        g.node("a/x", Add(100))
    assert raised.value.node == "a/x"
    g.node("a", soma.each(Add(1).named("x")))
    assert g.nodes() == ["a"]
    assert g.forward([1]) == [2]


def test_a_chain_that_names_a_node_as_one_inside_its_step_is_refused() -> None:
    # Either order of writing: the step first, or the node first.
    with pytest.raises(soma.InvalidIdError, match="`a/x`"):
        soma.Graph.somatize(soma.each(Add(1).named("x")).named("a") >> Add(100).named("a/x"))
    with pytest.raises(soma.InvalidIdError, match="`a/x`"):
        soma.Graph.somatize(Add(100).named("a/x") >> soma.each(Add(1).named("x")).named("a"))
