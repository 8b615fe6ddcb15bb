"""Streams: ``Graph.map`` and ``forward(batch, micro_batches=k)``.

Each node takes items one at a time and in order while different nodes work on different items
at once (proved by rendezvous, never by timing); inputs are read lazily within a bound; errors
come out per item; closing, breaking out and Ctrl-C stop the stream and give its threads back.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import sys
import textwrap
import threading
import time
import types
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import soma
from conftest import DEADLINE, Log, interrupt_script, run_script
from test_properties import dags, expected_run, graph_of


class Add(soma.Node):
    def __init__(self, n: int = 1) -> None:
        self.n = n

    def forward(self, x: Any) -> Any:
        return x + self.n


class Fn(soma.Node):
    """A node that answers ``body(x)``."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def forward(self, x: Any) -> Any:
        return self.body(x)


def meet_on(item: int, barrier: threading.Barrier) -> Fn:
    """A node that waits at ``barrier`` when it gets ``item``; a broken barrier fails it."""

    def body(x: int) -> int:
        if x == item:
            barrier.wait()
        return x

    return Fn(body)


def chain(*nodes: soma.Node) -> soma.Graph:
    expr: Any = nodes[0].named("s0")
    for at, node in enumerate(nodes[1:], start=1):
        expr = expr >> node.named(f"s{at}")
    return soma.Graph.somatize(expr)


# ---------------------------------------------------------------------------------------------
# Order and overlap


def test_map_yields_the_results_in_input_order() -> None:
    g = chain(Add(1), Fn(lambda x: x * 10))
    assert list(g.map(range(300))) == [(i + 1) * 10 for i in range(300)]


def test_stage_one_on_item_two_meets_stage_two_on_item_one() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = chain(meet_on(2, barrier), meet_on(1, barrier))
    assert list(g.map(range(4))) == [0, 1, 2, 3]


def test_every_stage_of_a_chain_is_in_flight_at_once_on_its_own_thread() -> None:
    barrier = threading.Barrier(3, timeout=DEADLINE)
    threads: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}

    def stage(at: int) -> Fn:
        def body(x: int) -> int:
            threads[at].add(threading.get_ident())
            if x == 2 - at:
                barrier.wait()
            return x

        return Fn(body)

    g = chain(stage(0), stage(1), stage(2))
    assert list(g.map(range(5))) == list(range(5))
    # Each stage kept one thread for the whole stream, and no two stages shared one.
    assert all(len(ids) == 1 for ids in threads.values())
    assert len(set().union(*threads.values())) == 3


class OneAtATime(soma.Node):
    """Fails when entered twice at once, or when an item comes out of order; keeps state."""

    def __init__(self) -> None:
        self.busy = False
        self.seen: list[int] = []

    def forward(self, x: int) -> int:
        assert not self.busy, "entered twice at once"
        self.busy = True
        try:
            assert x == len(self.seen), f"item {x} came when {len(self.seen)} was due"
            self.seen.append(x)
            return x
        finally:
            self.busy = False


def test_a_stateful_node_takes_items_one_at_a_time_and_in_order_after_a_concurrent_one() -> None:
    first, last = OneAtATime(), OneAtATime()
    g = chain(first, Fn(lambda x: x).concurrency(4), last)
    assert list(g.map(range(500))) == list(range(500))
    assert last.seen == list(range(500))


def test_a_concurrent_node_works_on_as_many_items_at_once_as_it_is_allowed() -> None:
    barrier = threading.Barrier(3, timeout=DEADLINE)

    def body(x: int) -> int:
        if x < 3:
            barrier.wait()
        return x * 2

    g = chain(Fn(body).concurrency(3))
    assert list(g.map(range(9))) == [x * 2 for x in range(9)]


def test_concurrency_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Add().concurrency(0)
    g = chain(Add())
    with pytest.raises(ValueError, match="at least 1"):
        g.map([1], concurrency={"s0": 0})
    with pytest.raises(soma.UnknownNodeError, match="`nope`"):
        g.map([1], concurrency={"nope": 2})


@pytest.mark.parametrize("node_id", ["items/s0", "nope"])
def test_a_streams_concurrency_is_refused_for_an_id_as_g_concurrency_refuses_it(
    node_id: str,
) -> None:
    g = soma.Graph.somatize(soma.each(Add().named("s0")).named("items"))
    with pytest.raises(soma.GraphError) as by_the_graph:
        g.concurrency(node_id, 2)
    with pytest.raises(soma.GraphError) as by_map:
        list(g.map([[1]], concurrency={node_id: 2}))

    async def amapped() -> list[Any]:
        return [y async for y in g.amap([[1]], concurrency={node_id: 2})]

    with pytest.raises(soma.GraphError) as by_amap:
        asyncio.run(amapped())
    for refused in (by_map.value, by_amap.value):
        assert type(refused) is type(by_the_graph.value)
        assert str(refused) == str(by_the_graph.value)
    assert list(g.map([[1]], concurrency={"items": 2})) == [[2]]


@pytest.mark.parametrize("given", ["to_map", "on_the_graph"])
def test_concurrency_given_by_node_id_to_map_or_on_the_built_graph_holds_in_map(
    given: str,
) -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)

    def body(x: int) -> int:
        if x < 2:
            barrier.wait()
        return x

    g = chain(Add(0), Fn(body))
    if given == "to_map":
        assert list(g.map(range(4), concurrency={"s1": 2})) == [0, 1, 2, 3]
        return
    g.concurrency("s1", 2)
    assert g.concurrencies() == {"s1": 2}
    assert list(g.map(range(4))) == [0, 1, 2, 3]


def workers(g: soma.Graph) -> list[int]:
    """The workers of each stage of a stream of ``g``, in stage order."""
    with g.map(range(2)) as stream:
        list(stream)
        figures = stream.figures()
    assert figures is not None
    return [stage.workers for stage in figures.stages]


def test_a_nodes_own_concurrency_is_the_graphs_until_set_by_id_and_none_takes_it_off() -> None:
    g = chain(Add(0), Add(0).concurrency(3))
    assert (g.concurrencies(), workers(g)) == ({"s1": 3}, [1, 3])
    g.concurrency("s1", None)
    assert (g.concurrencies(), workers(g)) == ({}, [1, 1])


def test_a_nodes_concurrency_written_after_it_is_registered_changes_nothing() -> None:
    g = chain(Add(0), Add(0))
    g.implementation("s1").concurrency(3)
    assert (g.concurrencies(), workers(g)) == ({}, [1, 1])


def test_concurrency_set_by_id_is_refused_for_an_unknown_id_and_below_one() -> None:
    g = chain(Add(0))
    with pytest.raises(soma.UnknownNodeError, match="`nope`"):
        g.concurrency("nope", 2)
    for wrong in (0, True, 1.5):
        with pytest.raises(ValueError, match="at least 1"):
            g.concurrency("s0", wrong)  # type: ignore[arg-type]
    assert g.concurrencies() == {}


def test_the_branches_of_a_wave_still_run_side_by_side_for_each_item() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Add(0).named("a") >> (meet_on(1, barrier).named("l") | meet_on(1, barrier).named("r"))
    )
    assert list(g.map(range(3))) == [{"l": i, "r": i} for i in range(3)]


def test_unordered_yields_index_and_result_pairs_as_items_finish() -> None:
    g = chain(Add(1), Fn(lambda x: x * 2).concurrency(3))
    pairs = list(g.map(range(100), ordered=False))
    assert sorted(pairs) == [(i, (i + 1) * 2) for i in range(100)]


@given(dags(max_nodes=7), st.lists(st.integers(), max_size=8))
def test_map_equals_a_loop_of_forward_on_random_graphs(dag: Any, inputs: list[int]) -> None:
    g = graph_of(dag, Log())
    looped = [g.forward(x) for x in inputs]
    assert looped == [expected_run(dag, x) for x in inputs]
    assert list(g.map(inputs, in_flight=3)) == looped


def test_a_wave_of_chains_with_a_wave_inside_maps_to_what_a_loop_of_forward_gives() -> None:
    inner = Fn(lambda x: x + 7).named("c2") | (
        Fn(lambda x: x * x).named("c3") >> Add(0).named("c4")
    )
    g = soma.Graph.somatize(
        Add(1).named("a")
        >> (
            (Fn(lambda x: x * 2).named("b1") >> Add(-3).named("b2"))
            | (Fn(lambda x: x * 5).named("c1") >> inner)
        )
    )
    assert list(g.map(range(40), in_flight=5)) == [g.forward(x) for x in range(40)]


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="none")


def test_every_stage_runs_in_the_callers_context() -> None:
    g = chain(Fn(lambda x: (x, REQUEST_ID.get())), Fn(lambda pair: (*pair, REQUEST_ID.get())))
    token = REQUEST_ID.set("caller's")
    try:
        assert list(g.map(range(3))) == [(i, "caller's", "caller's") for i in range(3)]
    finally:
        REQUEST_ID.reset(token)


def test_a_node_sees_what_the_node_before_it_set_for_the_same_item() -> None:
    def remember(x: int) -> int:
        REQUEST_ID.set(f"item {x}")
        return x

    g = chain(
        Fn(remember), Fn(lambda x: (x, REQUEST_ID.get())), Fn(lambda x: (*x, REQUEST_ID.get()))
    )
    expected = [(i, f"item {i}", f"item {i}") for i in range(50)]
    assert list(g.map(range(50), in_flight=8)) == expected
    assert [g.forward(i) for i in range(50)] == expected


def test_what_a_node_sets_for_one_item_is_seen_by_no_other_item() -> None:
    def seen_then_set(x: int) -> tuple[int, str]:
        seen = REQUEST_ID.get()
        REQUEST_ID.set(f"item {x}")
        return x, seen

    # The stage of `s0` runs every item on one thread, one after the other.
    g = chain(Fn(seen_then_set), Fn(lambda pair: (*pair, REQUEST_ID.get())))
    token = REQUEST_ID.set("caller's")
    try:
        out = list(g.map(range(30)))
    finally:
        REQUEST_ID.reset(token)
    assert out == [(i, "caller's", f"item {i}") for i in range(30)]


def test_a_concurrent_stage_carries_each_items_context_too() -> None:
    def remember(x: int) -> int:
        REQUEST_ID.set(f"item {x}")
        return x

    g = chain(Fn(remember), Fn(lambda x: x).concurrency(3), Fn(lambda x: (x, REQUEST_ID.get())))
    assert list(g.map(range(40))) == [(i, f"item {i}") for i in range(40)]


def test_the_branches_of_a_wave_in_a_stage_see_what_the_node_before_the_wave_set() -> None:
    def remember(x: int) -> int:
        REQUEST_ID.set(f"item {x}")
        return x

    g = soma.Graph.somatize(
        Fn(remember).named("set")
        >> (Fn(lambda x: REQUEST_ID.get()).named("l") | Fn(lambda x: REQUEST_ID.get()).named("r"))
    )
    assert list(g.map(range(10))) == [{"l": f"item {i}", "r": f"item {i}"} for i in range(10)]


def test_what_the_nodes_of_a_stream_set_does_not_reach_the_caller() -> None:
    g = chain(Fn(lambda x: REQUEST_ID.set("a node's")))
    token = REQUEST_ID.set("caller's")
    try:
        list(g.map(range(3)))
        g.forward([1, 2], micro_batches=2, join=list)
        assert REQUEST_ID.get() == "caller's"
    finally:
        REQUEST_ID.reset(token)


SCALE: contextvars.ContextVar[int] = contextvars.ContextVar("scale", default=1)


class SetScale(soma.Node):
    """A per-request setting, set for the nodes after it."""

    def forward(self, xs: list[int]) -> list[int]:
        SCALE.set(10)
        return xs


class Scaled(soma.Node):
    def forward(self, xs: list[int]) -> list[int]:
        return [x * SCALE.get() for x in xs]


def test_micro_batches_see_what_the_nodes_before_set_as_forward_does() -> None:
    g = soma.Graph.somatize(SetScale().named("set") >> Scaled().named("use"))
    assert g.forward([1, 2, 3, 4]) == [10, 20, 30, 40]
    assert g.forward([1, 2, 3, 4], micro_batches=2) == [10, 20, 30, 40]
    assert list(g.map([[1, 2], [3, 4]])) == [[10, 20], [30, 40]]


GRAD_MODE_SCRIPT = textwrap.dedent(
    """
    import sys, threading, types
    import soma

    # torch's per-thread grad mode, as Soma reads and sets it once `torch` is in sys.modules:
    # a stand-in, in a process of its own, so that the suite needs no torch.
    state = threading.local()
    torch = types.ModuleType("torch")
    torch._C = types.SimpleNamespace(
        _is_any_autocast_enabled=lambda: False,
        _set_grad_enabled=lambda on: setattr(state, "grad", bool(on)),
    )
    torch.is_grad_enabled = lambda: getattr(state, "grad", True)
    torch.is_inference_mode_enabled = lambda: False
    sys.modules["torch"] = torch

    class SwitchOff(soma.Node):
        def forward(self, x):
            seen = torch.is_grad_enabled()
            torch._C._set_grad_enabled(False)
            return [x, seen]

    class Read(soma.Node):
        def forward(self, pair):
            return [*pair, torch.is_grad_enabled()]

    g = soma.Graph.somatize(SwitchOff().named("off") >> Read().named("read"))
    print(list(g.map(range(4))), g.forward(0), torch.is_grad_enabled())
    torch._C._set_grad_enabled(False)
    print(list(soma.Graph.somatize(Read().named("read")).map([[0], [1]])))
    """
)


def test_torch_grad_mode_travels_with_each_item_as_a_contextvar_does() -> None:
    run = run_script(GRAD_MODE_SCRIPT)
    assert run.returncode == 0, run.stderr
    switched, caller_off = run.stdout.splitlines()
    # `off` sees the caller's grad mode for every item, whatever the item before left on its
    # thread; `read` sees what `off` left for the same item, as in forward; the caller's own
    # is untouched.
    items = [[i, True, False] for i in range(4)]
    assert switched == f"{items} {[0, True, False]} True"
    # A caller with grad mode off: every stage runs with it off.
    assert caller_off == "[[0, False], [1, False]]"


def test_a_placed_node_sees_its_device_in_a_stream_too() -> None:
    class Where(soma.Node):
        def forward(self, x: int, ctx: soma.Ctx) -> tuple[int, str | None]:
            return x, ctx.device

    g = soma.Graph.somatize(Add(0).named("a") >> Where().named("where").on("meta"))
    assert list(g.map(range(2))) == [(0, "meta"), (1, "meta")]


# ---------------------------------------------------------------------------------------------
# Laziness and bounds


def test_a_generator_is_read_no_further_ahead_than_in_flight() -> None:
    read = 0

    def numbers() -> Iterator[int]:
        nonlocal read
        for i in range(10_000):
            read += 1
            yield i

    g = chain(Add(0), Add(0))
    for taken, _ in enumerate(g.map(numbers(), in_flight=7), start=1):
        # The item just handed back was still in flight when the last input was read.
        assert read <= taken - 1 + 7
    assert read == 10_000


def test_a_reader_that_stops_reading_stops_the_stream_at_the_bound() -> None:
    calls = 0

    def count(x: int) -> int:
        nonlocal calls
        calls += 1
        return x

    g = chain(Fn(count))
    stream = g.map(iter(range(10**9)), in_flight=4)
    assert next(stream) == 0
    figures = stream.figures()
    assert figures is not None
    assert (figures.read, figures.in_flight) == (4, 3)
    assert calls <= 4
    stream.close()


FLAT_MEMORY_SCRIPT = textwrap.dedent(
    """
    import json
    import soma

    def resident_kib():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4

    class Add(soma.Node):
        def forward(self, x):
            return x + 1

    g = soma.Graph.somatize(Add().named("a") >> Add().named("b") >> Add().named("c"))
    for taken, _ in enumerate(g.map(iter(range(310_000)), in_flight=32), start=1):
        if taken == 10_000:
            after_warm_up = resident_kib()
    print(json.dumps({"taken": taken, "grew_kib": resident_kib() - after_warm_up}))
    """
)


def test_a_long_generator_streams_in_flat_memory() -> None:
    # Resident memory, which counts what the engine holds in Rust as well as Python's objects,
    # in a process of its own. 300,000 items went through after the warm-up: keeping even 15
    # bytes of each would add 4 MiB.
    run = run_script(FLAT_MEMORY_SCRIPT)
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    assert figures["taken"] == 310_000
    assert figures["grew_kib"] < 4 * 1024, figures


# ---------------------------------------------------------------------------------------------
# Errors per item


def drain(stream: Iterator[Any], into: list[Any]) -> None:
    """Appends each result to ``into`` until the stream ends or raises."""
    for item in stream:
        into.append(item)


def three_fails(x: int) -> int:
    if x == 3:
        raise ValueError(f"bad item {x}")
    return x


def test_the_first_failing_item_raises_its_own_exception_at_its_position() -> None:
    g = chain(Fn(three_fails), Add(0))
    got: list[int] = []
    with pytest.raises(ValueError, match="bad item 3") as raised:
        drain(g.map(range(1000), in_flight=8), into=got)
    assert got == [0, 1, 2]
    assert raised.value.__notes__ == ["raised in soma node `s0`"]
    assert raised.tb is not None
    # Stopped cleanly: the graph runs again at once.
    assert g.forward(5) == 5
    assert list(g.map([1, 2])) == [1, 2]


def test_after_a_failure_no_stage_starts_an_item_far_beyond_it() -> None:
    seen: list[int] = []

    def record(x: int) -> int:
        seen.append(x)
        return x

    g = chain(Fn(three_fails), Fn(record))
    with pytest.raises(ValueError, match="bad item 3"):
        list(g.map(range(1000), in_flight=8))
    calls = len(seen)
    assert calls <= 8
    # The stream's threads are back: nothing runs the node any more.
    g.forward(0)
    assert len(seen) == calls + 1


def test_collect_yields_a_failed_record_in_place_and_goes_on() -> None:
    g = chain(Fn(three_fails))
    out = list(g.map(range(6), on_error="collect"))
    failed = out[3]
    assert isinstance(failed, soma.Failed)
    assert (failed.index, failed.input, failed.node) == (3, 3, "s0")
    assert isinstance(failed.exception, ValueError)
    assert out[:3] + out[4:] == [0, 1, 2, 4, 5]


def test_skip_leaves_failed_items_out_and_keeps_their_records() -> None:
    g = chain(Fn(lambda x: three_fails(x % 5)))
    stream = g.map(range(10), on_error="skip")
    assert list(stream) == [0, 1, 2, 4, 0, 1, 2, 4]
    assert [f.index for f in stream.failures] == [3, 8]
    figures = stream.figures()
    assert figures is not None
    assert (figures.succeeded, figures.failed) == (8, 2)


def test_an_unknown_on_error_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="'raise', 'skip' or 'collect'"):
        chain(Add()).map([1], on_error="ignore")  # type: ignore[arg-type]


def test_an_exception_from_the_inputs_comes_after_the_items_read_before_it() -> None:
    def broken() -> Iterator[int]:
        yield 1
        yield 2
        raise KeyError("inputs broke")

    g = chain(Add(1))
    got: list[int] = []
    with pytest.raises(KeyError, match="inputs broke"):
        drain(g.map(broken()), into=got)
    assert got == [2, 3]


def test_a_panicking_rust_node_raises_panic_error_and_the_same_graph_streams_again() -> None:
    took: list[int] = []

    def first(x: int) -> int:
        took.append(x)
        return x

    g = soma.Graph.somatize(Fn(first).named("a") >> soma.native.Panic("kaboom").named("boom"))
    for _ in range(3):
        with pytest.raises(soma.PanicError, match="kaboom"):
            list(g.map(range(3)))
    # Each stream of the same graph ran its stages anew: its first stage took item 0 each time,
    # on the threads the streams before gave back.
    assert took.count(0) == 3
    assert g.threads() <= 2


# ---------------------------------------------------------------------------------------------
# Closing and threads


def test_breaking_out_of_the_loop_stops_the_stream_and_gives_its_threads_back() -> None:
    seen: list[int] = []

    def record(x: int) -> int:
        seen.append(x)
        return x

    g = chain(Add(0), Fn(record), Add(0))
    for _ in range(10):
        for item in g.map(iter(range(10**9))):
            if item == 2:
                break
    calls = len(seen)
    g.forward(0)
    assert len(seen) == calls + 1
    # Ten streams of three stages, one after another, on the same lent threads.
    assert g.threads() <= 4


def test_close_and_with_stop_the_stream_and_leave_the_graph_usable() -> None:
    g = chain(Add(1), Add(1))
    with g.map(iter(range(10**9))) as stream:
        assert next(stream) == 2
    with pytest.raises(StopIteration):
        next(stream)
    stream = g.map(range(10))
    stream.close()
    assert list(stream) == []
    assert g.forward(1) == 3


def test_a_stream_dropped_unread_stops_and_gives_its_threads_back() -> None:
    g = chain(Add(0), Add(0))
    for _ in range(10):
        stream = g.map(iter(range(10**9)))
        next(stream)
        del stream
    assert g.threads() <= 3


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import signal
    import time
    import soma

    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Nap(soma.Node):
        def forward(self, x):
            time.sleep(0.01)
            return x

    g = soma.Graph.somatize(Nap().named("a") >> Nap().named("b") >> Nap().named("c"))
    taken = 0
    try:
        for item in g.map(iter(range(10**9))):
            taken += 1
            if taken == 3:
                print("started", flush=True)
    except KeyboardInterrupt:
        print("caught KeyboardInterrupt after", taken, "items", flush=True)
        print("usable", g.forward(7), list(g.map([1, 2])), flush=True)
    """
)


def test_ctrl_c_while_iterating_raises_keyboard_interrupt_and_leaves_the_graph_usable() -> None:
    child = interrupt_script(CTRL_C_SCRIPT, "started")
    out, err = child.stdout, child.stderr
    assert "caught KeyboardInterrupt" in out, (out, err)
    assert "usable 7 [1, 2]" in out, (out, err)
    # The stream would run forever: stopping within 500 items (5 s) is stopping promptly.
    assert int(out.split("after")[1].split()[0]) < 500, out


STUCK_SCRIPT = textwrap.dedent(
    """
    import signal
    import threading
    import soma

    signal.signal(signal.SIGINT, signal.default_int_handler)
    never = threading.Event()

    class Stuck(soma.Node):
        def forward(self, x):
            if x == 3:
                print("stuck", flush=True)
                never.wait()
            return x

    class Add(soma.Node):
        def forward(self, x):
            return x + 1

    g = soma.Graph.somatize(Add().named("a") >> Stuck().named("b") >> Add().named("c"))
    taken = []
    try:
        for item in g.map(range(100)):
            taken.append(item)
    except KeyboardInterrupt:
        print("caught KeyboardInterrupt after", taken, flush=True)
    print("usable", g.forward(10), flush=True)
    """
)


def test_ctrl_c_returns_even_while_a_node_of_the_stream_never_returns() -> None:
    child = interrupt_script(STUCK_SCRIPT, "stuck")
    out, err = child.stdout, child.stderr
    assert "caught KeyboardInterrupt after" in out, (out, err)
    # Whatever came out before the signal came in order; item 2 never came.
    assert out.split("after ")[1].split("\n")[0] in ("[]", "[2]", "[2, 3]"), out
    # The stuck node is left on its thread; the graph runs on others.
    assert "usable 12" in out, (out, err)
    assert child.returncode == 0, err


# ---------------------------------------------------------------------------------------------
# Progress, figures, trace


def test_a_progress_callable_gets_counts_and_a_last_event_marked_done() -> None:
    events: list[soma.Progress] = []
    g = chain(Add(1), Add(1))
    assert len(list(g.map(range(50), progress=events.append))) == 50
    assert events[-1].done
    assert (events[-1].succeeded, events[-1].failed, events[-1].read) == (50, 0, 50)
    assert sum(event.done for event in events) == 1


def test_progress_true_without_tqdm_writes_a_line_to_stderr(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    g = chain(Add(1))
    assert list(g.map(range(5), progress=True)) == [1, 2, 3, 4, 5]
    assert "5 items" in capsys.readouterr().err


def test_progress_true_with_tqdm_installed_draws_a_bar_of_the_inputs_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bars: list[FakeBar] = []

    class FakeBar:
        def __init__(self, total: int | None, unit: str) -> None:
            self.total, self.shown, self.closed = total, 0, False
            self.postfix: dict[str, Any] = {}
            bars.append(self)

        def update(self, n: int) -> None:
            self.shown += n

        def set_postfix(self, refresh: bool = True, **values: Any) -> None:
            self.postfix.update(values)

        def close(self) -> None:
            self.closed = True

    fake = types.ModuleType("tqdm.auto")
    fake.tqdm = FakeBar  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake)
    g = chain(Add(1))
    assert list(g.map(range(7), progress=True)) == list(range(1, 8))
    [bar] = bars
    assert (bar.total, bar.shown, bar.closed) == (7, 7, True)


def test_figures_name_each_stage_and_count_its_items() -> None:
    g = soma.Graph.somatize(Add().named("a") >> (Add().named("b") | Add().named("c")))
    stream = g.map(range(20))
    list(stream)
    figures = stream.figures()
    assert figures is not None
    assert [stage.nodes for stage in figures.stages] == [["a"], ["b", "c"]]
    assert [stage.items for stage in figures.stages] == [20, 20]
    assert figures.bottleneck in ("a", "b, c")


def test_a_trace_of_a_stream_has_a_span_per_node_per_item() -> None:
    trace = soma.Trace()
    g = chain(Add(1), Add(1), Add(1))
    list(g.map(range(10), trace=trace))
    assert len(trace) == 30
    assert {span.node for span in trace.spans} == {"s0", "s1", "s2"}


def test_a_driver_serves_awaiting_nodes_in_a_stream() -> None:
    class Ask(soma.Node):
        def forward(self, x: int, ctx: soma.Ctx) -> Any:
            if ctx.turn == 0:
                return soma.Await([x])
            return ctx.results[0] * 2

    class Echo:
        def perform(self, requests: list[Any]) -> list[Any]:
            return list(requests)

    g = soma.Graph.somatize(Ask().named("ask") >> Add(1).named("add"))
    assert list(g.map(range(4), driver=Echo())) == [1, 3, 5, 7]


# ---------------------------------------------------------------------------------------------
# Micro-batches


row_wise = chain(Fn(lambda x: x * 2), Fn(lambda x: x + 1))


@given(st.lists(st.integers(-1000, 1000), max_size=40), st.integers(1, 12))
def test_micro_batches_of_a_numpy_array_equal_one_forward(rows: list[int], k: int) -> None:
    batch = np.array(rows, dtype=np.int64)
    whole = row_wise.forward(batch)
    pieces = row_wise.forward(batch, micro_batches=k)
    assert type(pieces) is np.ndarray
    assert np.array_equal(pieces, whole)


@given(st.lists(st.integers(), max_size=40), st.integers(1, 12), st.booleans())
def test_micro_batches_of_a_list_or_tuple_equal_one_forward(
    rows: list[int], k: int, as_tuple: bool
) -> None:
    g = chain(Fn(lambda xs: type(xs)(x * 3 for x in xs)))
    batch = tuple(rows) if as_tuple else rows
    assert g.forward(batch, micro_batches=k) == g.forward(batch)


def test_micro_batches_join_several_leaves_leaf_by_leaf() -> None:
    g = soma.Graph.somatize(
        Add(0).named("a") >> (Fn(lambda x: x * 2).named("l") | Fn(lambda x: -x).named("r"))
    )
    batch = np.arange(10)
    out = g.forward(batch, micro_batches=3)
    assert np.array_equal(out["l"], batch * 2)
    assert np.array_equal(out["r"], -batch)


def test_micro_batches_run_each_slice_through_the_stages_overlapped() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)

    def stage(slice_start: int) -> Fn:
        def body(xs: list[int]) -> list[int]:
            if xs and xs[0] == slice_start:
                barrier.wait()
            return xs

        return Fn(body)

    g = chain(stage(4), stage(2))  # stage 0 on the third slice meets stage 1 on the second
    assert g.forward(list(range(8)), micro_batches=4) == list(range(8))


def test_a_join_given_by_the_user_receives_the_outputs_of_each_slice() -> None:
    g = chain(Fn(sum))
    assert g.forward(list(range(10)), micro_batches=3, join=list) == [6, 15, 24]


def test_outputs_that_cannot_be_joined_by_type_ask_for_a_join() -> None:
    g = chain(Fn(sum))
    with pytest.raises(TypeError, match="pass join="):
        g.forward(list(range(10)), micro_batches=3)


def test_a_batch_that_cannot_be_sliced_is_refused_with_a_hint() -> None:
    with pytest.raises(TypeError, match="needs `len` and slicing"):
        chain(Add()).forward(5, micro_batches=2)


def test_a_script_that_ends_with_a_stream_still_open_exits() -> None:
    script = textwrap.dedent(
        """
        import time
        import soma

        class Nap(soma.Node):
            def forward(self, x):
                time.sleep(0.005)
                return x

        g = soma.Graph.somatize(Nap().named("a") >> Nap().named("b"))
        open_stream = g.map(iter(range(10**9)))
        print(next(open_stream), next(open_stream), flush=True)
        """
    )
    run = run_script(script)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "0 1\n"


def test_a_stream_in_a_reference_cycle_with_its_inputs_is_collected() -> None:
    g = chain(Add(0), Add(0))

    class Inputs:
        """An iterator that holds the stream that reads it."""

        def __init__(self) -> None:
            self.stream: Any = None
            self.numbers = iter(range(10**9))

        def __iter__(self) -> Inputs:
            return self

        def __next__(self) -> int:
            return next(self.numbers)

    inputs = Inputs()
    stream = g.map(inputs)
    inputs.stream = stream
    assert next(stream) == 0
    collected = weakref.ref(stream)
    del stream, inputs
    gc.collect()
    # Collected, so closed: the graph streams again on the same threads.
    assert collected() is None
    assert list(g.map(range(3))) == [0, 1, 2]
    assert g.threads() <= 3


# ---------------------------------------------------------------------------------------------
# Deadlines, and a stage that never returns

STUCK_STAGE = textwrap.dedent(
    """
    import signal
    import sys
    import threading
    import soma

    signal.signal(signal.SIGINT, signal.default_int_handler)
    never = threading.Event()
    reached = threading.Event()
    returned = threading.Event()
    announce = True  # whether the stuck node prints "stuck"

    class Stuck(soma.Node):
        # Never returns for item 3 (or a slice holding 3).
        def forward(self, x):
            if x == 3 or (isinstance(x, list) and 3 in x):
                reached.set()
                if announce:
                    # One write, not print's two: a line another thread prints meanwhile
                    # cannot land inside it.
                    sys.stdout.write("stuck\\n")
                    sys.stdout.flush()
                never.wait()
                returned.set()
            return x

    class Add(soma.Node):
        def forward(self, x):
            return x + 1 if isinstance(x, int) else x

    g = soma.Graph.somatize(Add().named("a") >> Stuck().named("b") >> Add().named("c"))
    """
)


def test_a_stream_past_its_timeout_raises_timeout_error_naming_the_stuck_node() -> None:
    script = STUCK_STAGE + textwrap.dedent(
        """
        taken = []
        try:
            # A second is ample for items 0 to 2 to reach `b`; the deadline is what ends it.
            for item in g.map(range(100), timeout=1.0):
                taken.append(item)
        except TimeoutError as error:
            print("timed out after", taken, "|", str(error).splitlines()[0], flush=True)
        # The stuck node keeps its thread; the same graph runs again at once, on others.
        print("usable", g.forward(10), list(g.map([5, 6], timeout=30)), flush=True)
        never.set()
        print("the stuck node returned:", returned.wait(30), flush=True)
        """
    )
    run = run_script(script)
    assert run.returncode == 0, run.stderr
    # Items 0 and 1 went through; item 2 reached `b` as 3.
    assert "timed out after [2, 3]" in run.stdout, run.stdout
    assert "within its timeout of 1 s; still running: `b`" in run.stdout, run.stdout
    assert "usable 12 [7, 8]" in run.stdout, run.stdout
    assert "the stuck node returned: True" in run.stdout, run.stdout


def test_a_stuck_node_in_a_wave_is_named_with_its_wave() -> None:
    script = STUCK_STAGE + textwrap.dedent(
        """
        g = soma.Graph.somatize(Add().named("a") >> (Stuck().named("b") | Add().named("c")))
        try:
            list(g.map(range(10), timeout=1.0))
        except TimeoutError as error:
            print(str(error).splitlines()[0], flush=True)
        """
    )
    run = run_script(script)
    assert run.returncode == 0, run.stderr
    assert "still running: one or more of the wave `b`, `c`" in run.stdout, run.stdout


def test_micro_batches_past_their_timeout_raise_timeout_error_and_the_graph_runs_again() -> None:
    script = STUCK_STAGE + textwrap.dedent(
        """
        try:
            g.forward([0, 1, 2, 3], micro_batches=2, timeout=1.0)
        except TimeoutError as error:
            print(str(error).splitlines()[0], flush=True)
        print("usable", g.forward([0, 1], micro_batches=2, timeout=30), flush=True)
        """
    )
    run = run_script(script)
    assert run.returncode == 0, run.stderr
    assert "within its timeout of 1 s; still running: `b`" in run.stdout, run.stdout
    assert "usable [0, 1]" in run.stdout, run.stdout


def test_a_deadline_passed_is_never_reported_as_success() -> None:
    g = chain(Add(1), Add(1))
    stream = g.map(range(10), timeout=0.05)
    taken: list[int] = []

    def take_slowly() -> None:
        for result in stream:
            taken.append(result)
            time.sleep(0.1)  # past the deadline, with the other results ready and not taken

    with pytest.raises(TimeoutError, match="every stage stopped at a node boundary"):
        take_slowly()
    # One result at most, taken before the deadline (none on a machine slower than 50 ms).
    assert taken in ([], [2])
    assert list(stream) == []
    assert list(g.map(range(3), timeout=30)) == [2, 3, 4]


def test_a_timeout_not_reached_changes_nothing() -> None:
    g = chain(Add(1), Fn(lambda x: x * 10))
    assert list(g.map(range(100), timeout=60)) == [(i + 1) * 10 for i in range(100)]
    rows = chain(Fn(lambda xs: [x + 1 for x in xs]), Fn(lambda xs: [x * 10 for x in xs]))
    assert rows.forward([1, 2, 3], micro_batches=2, timeout=60) == [20, 30, 40]


@pytest.mark.parametrize("timeout", [-1.0, float("inf"), float("nan")])
def test_a_timeout_that_is_not_a_finite_duration_is_refused(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
        chain(Add()).map([1], timeout=timeout)


def test_ctrl_c_still_stops_a_stream_with_a_timeout_while_its_node_never_returns() -> None:
    script = STUCK_STAGE + textwrap.dedent(
        """
        try:
            list(g.map(range(100), timeout=600))
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
        print("usable", g.forward(10), flush=True)
        """
    )
    child = interrupt_script(script, "stuck")
    assert "caught KeyboardInterrupt" in child.stdout, (child.stdout, child.stderr)
    assert "usable 12" in child.stdout, (child.stdout, child.stderr)
    assert child.returncode == 0, child.stderr


def test_ctrl_c_stops_close_while_it_waits_for_a_node_that_never_returns() -> None:
    script = STUCK_STAGE + textwrap.dedent(
        """
        announce = False
        stream = g.map(range(100))
        next(stream)
        assert reached.wait(30)
        try:
            print("closing", flush=True)
            stream.close()  # waits for the node already running: until Ctrl-C
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
        print("usable", g.forward(10), flush=True)
        """
    )
    child = interrupt_script(script, "closing")
    assert child.stdout == "caught KeyboardInterrupt\nusable 12\n", (child.stdout, child.stderr)
    assert child.returncode == 0, child.stderr


def test_a_script_that_ends_with_a_stream_stuck_in_a_node_still_exits() -> None:
    script = STUCK_STAGE + textwrap.dedent(
        """
        left_open = g.map(range(100))
        sys.stdout.write(f"{next(left_open)}\\n")
        sys.stdout.flush()
        assert reached.wait(30)
        sys.exit(3)
        """
    )
    run = run_script(script)
    assert run.returncode == 3, run.stderr
    assert sorted(run.stdout.splitlines()) == ["2", "stuck"], run.stdout


def test_dropping_a_stream_stuck_in_a_node_leaves_a_later_ctrl_c_to_the_program() -> None:
    script = STUCK_STAGE + textwrap.dedent(
        """
        import time

        announce = False
        dropped = g.map(range(100))
        next(dropped)
        assert reached.wait(30)
        del dropped
        try:
            print("dropped", flush=True)
            while True:
                time.sleep(0.01)
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
        """
    )
    # Ctrl-C once the drop has returned: the program's own handler gets it.
    child = interrupt_script(script, "dropped")
    assert child.stdout == "caught KeyboardInterrupt\n", (child.stdout, child.stderr)
    assert child.returncode == 0, child.stderr
