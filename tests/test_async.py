"""Async nodes and ``aforward``: an ``async def forward`` composes like any node, runs as a task
on the caller's event loop (sync nodes on the graph's lent threads, the loop never waiting on
them), and keeps every promise of ``forward``: results, first declared error with the node's own
exception and note, contexts, retries and time limits, tracing, drivers, devices.

Concurrency is shown by rendezvous with a deadline (``asyncio.Barrier``, an event set from the
other side), never by timing. What could hang (cancellation, timeouts, Ctrl-C) runs in a child
process with a deadline of its own, at the end of this file.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import textwrap
import threading
import weakref
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import soma
from conftest import DEADLINE, CallRecord, interrupt_script, registered, run_script
from test_devices import OnDevice, Recorder
from test_properties import Dag, Traced, dags, expected_run

# ---------------------------------------------------------------------------------------------
# Nodes


class AsyncTraced(soma.Node):
    """``Traced`` (test_properties), async: logs the call, awaits the loop once, and returns
    ``(id, input)``."""

    def __init__(self, log: Any) -> None:
        self.log = log

    async def forward(self, x: Any, ctx: Any) -> Any:
        self.log.add(ctx.node, x)
        await asyncio.sleep(0)
        if isinstance(x, dict):
            return (ctx.node, list(x.items()))
        return (ctx.node, x)


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


class Total(soma.Node):
    def forward(self, x: dict[str, Any]) -> Any:
        return sum(x.values())


class AsyncMeet(soma.Node):
    """Waits at ``barrier`` (with a deadline): returns only if every party got there."""

    def __init__(self, barrier: asyncio.Barrier) -> None:
        self.barrier = barrier

    async def forward(self, x: Any) -> Any:
        await asyncio.wait_for(self.barrier.wait(), DEADLINE)
        return x


class AsyncCall(soma.Node):
    """Awaits ``fn(x)``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    async def forward(self, x: Any) -> Any:
        return await self.fn(x)


class Call(soma.Node):
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def forward(self, x: Any) -> Any:
        return self.fn(x)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# ---------------------------------------------------------------------------------------------
# Results


class Log:
    """What each node was called with, from any thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.lock = threading.Lock()

    def add(self, node: str, value: Any) -> None:
        with self.lock:
            self.calls.append((node, value))


@st.composite
def mixed_dags(draw: st.DrawFn) -> tuple[Dag, frozenset[str]]:
    dag = draw(dags())
    chosen = draw(st.sets(st.sampled_from(dag.nodes))) if dag.nodes else set()
    return dag, frozenset(chosen)


def mixed_graph(dag: Dag, asynced: frozenset[str]) -> soma.Graph:
    log = Log()
    g = soma.Graph()
    for node in dag.nodes:
        g.node(node, AsyncTraced(log) if node in asynced else Traced(log))  # type: ignore[arg-type]
    for source, target in dag.edges:
        g.edge(source, target)
    return g


@given(mixed_dags(), st.integers())
def test_aforward_of_any_graph_with_any_nodes_async_returns_what_sync_nodes_return(
    case: tuple[Dag, frozenset[str]], x: int
) -> None:
    dag, asynced = case
    g = mixed_graph(dag, asynced)
    assert run(g.aforward(x)) == expected_run(dag, x)


@given(mixed_dags(), st.integers())
def test_forward_of_any_graph_with_async_nodes_returns_what_sync_nodes_return(
    case: tuple[Dag, frozenset[str]], x: int
) -> None:
    dag, asynced = case
    assert mixed_graph(dag, asynced).forward(x) == expected_run(dag, x)


class NodeFailed(Exception):
    """What ``Fails`` raises: its node's id."""


class Fails(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        raise NodeFailed(ctx.node)


class AsyncFails(soma.Node):
    async def forward(self, x: Any, ctx: Any) -> Any:
        await asyncio.sleep(0)
        raise NodeFailed(ctx.node)


@given(mixed_dags(), st.data())
def test_aforward_raises_the_error_forward_raises_with_sync_nodes_on_any_graph(
    case: tuple[Dag, frozenset[str]], data: st.DataObject
) -> None:
    dag, asynced = case
    assume(dag.nodes)
    failing = data.draw(st.sets(st.sampled_from(dag.nodes), min_size=1))
    log = Log()

    def build(mixed: bool) -> soma.Graph:
        g = soma.Graph()
        for node in dag.nodes:
            is_async = mixed and node in asynced
            if node in failing:
                g.node(node, AsyncFails() if is_async else Fails())
            else:
                g.node(node, AsyncTraced(log) if is_async else Traced(log))  # type: ignore[arg-type]
        for source, target in dag.edges:
            g.edge(source, target)
        return g

    with pytest.raises(NodeFailed) as expected:
        build(mixed=False).forward(0)
    with pytest.raises(NodeFailed) as got:
        run(build(mixed=True).aforward(0))
    assert str(got.value) == str(expected.value)
    assert got.value.__notes__ == expected.value.__notes__


def test_an_async_node_composes_with_sync_nodes_and_its_plan_is_the_same() -> None:
    mixed = soma.Graph.somatize(
        Add(1).named("a") >> (AsyncAdd(10).named("b") | Add(100).named("c")) >> Total().named("d")
    )
    sync = soma.Graph.somatize(
        Add(1).named("a") >> (Add(10).named("b") | Add(100).named("c")) >> Total().named("d")
    )
    assert mixed.plan() == sync.plan()
    assert run(mixed.aforward(1)) == sync.forward(1) == mixed.forward(1)


def test_aforward_of_a_graph_without_async_nodes_returns_what_forward_returns() -> None:
    g = soma.Graph.somatize(Add(1) >> (Add(2).named("b") | Add(3).named("c")))
    assert run(g.aforward(1)) == g.forward(1) == {"b": 4, "c": 5}


def test_aforward_of_an_empty_graph_returns_its_input_as_forward_does() -> None:
    assert run(soma.Graph().aforward(7)) == soma.Graph().forward(7) == 7


def test_a_graph_is_streamed_on_the_loop_once_an_async_node_is_registered() -> None:
    g = soma.Graph.somatize(Add(1).named("a"))
    assert g._core.route(True) == "stream"
    g.edge("a", g.node("b", AsyncAdd(1)))
    assert g._core.route(True) == "flow"


def test_a_graph_changed_after_a_run_runs_as_changed() -> None:
    g = soma.Graph()
    g.node("a", AsyncAdd(1))
    assert run(g.aforward(1)) == 2
    g.edge("a", g.node("b", Add(10)))
    assert run(g.aforward(1)) == 12


# ---------------------------------------------------------------------------------------------
# Side by side, on one loop, without a thread each


def test_the_async_branches_of_a_wave_are_in_flight_together() -> None:
    async def main() -> Any:
        barrier = asyncio.Barrier(3)
        g = soma.Graph.somatize(
            AsyncMeet(barrier).named("a") | AsyncMeet(barrier).named("b") | AsyncMeet(barrier)
        )
        return await g.aforward(1)

    assert list(run(main()).values()) == [1, 1, 1]


def test_a_wave_of_a_thousand_awaiting_nodes_holds_no_thread_each() -> None:
    count = 1_000
    seen: dict[str, int] = {}

    async def main() -> Any:
        arrived = 0
        everyone = asyncio.Event()

        async def wait(x: Any) -> Any:
            nonlocal arrived
            arrived += 1
            if arrived == count:
                seen["threads"] = threading.active_count()
                everyone.set()
            await asyncio.wait_for(everyone.wait(), DEADLINE)
            return x

        g = soma.Graph()
        for i in range(count):
            g.node(f"n{i}", AsyncCall(wait))
        before = threading.active_count()
        out = await g.aforward(0)
        return before, out

    before, out = run(main())
    assert len(out) == count
    assert seen["threads"] - before <= 4


def test_many_aforward_calls_of_one_graph_are_in_flight_at_once_on_one_loop() -> None:
    calls = 50

    async def main() -> list[Any]:
        barrier = asyncio.Barrier(calls)
        g = soma.Graph.somatize(Add(1) >> AsyncMeet(barrier) >> Add(1))
        return await asyncio.gather(*(g.aforward(i) for i in range(calls)))

    assert run(main()) == [i + 2 for i in range(calls)]


def test_the_loop_runs_on_while_a_sync_node_holds_its_thread() -> None:
    async def main() -> Any:
        loop = asyncio.get_running_loop()
        released = threading.Event()
        # The sync node waits for the loop to release it: a loop blocked on it never would.
        g = soma.Graph.somatize(
            Call(lambda x: x if released.wait(DEADLINE) else "the loop was blocked")
        )
        loop.call_soon(released.set)
        return await g.aforward("ran")

    assert run(main()) == "ran"


def test_a_sync_piece_and_an_async_branch_of_one_wave_are_in_flight_together() -> None:
    async def main() -> Any:
        released = threading.Event()

        async def release(x: Any) -> Any:
            released.set()
            return x

        g = soma.Graph.somatize(
            Call(lambda x: x if released.wait(DEADLINE) else "alone").named("sync")
            | AsyncCall(release).named("async")
        )
        return await g.aforward("together")

    assert run(main()) == {"sync": "together", "async": "together"}


# ---------------------------------------------------------------------------------------------
# Memory


class Value:
    """An output a test can watch with a weak reference."""


class Makes(soma.Node):
    """Returns a fresh :class:`Value`, and keeps a weak reference to it in ``refs``."""

    def __init__(self, refs: list[weakref.ref[Value]]) -> None:
        self.refs = refs

    async def forward(self, x: Any) -> Any:
        value = Value()
        self.refs.append(weakref.ref(value))
        return value


class Signals(soma.Node):
    """Sets ``done`` and passes its input on."""

    def __init__(self, done: asyncio.Event) -> None:
        self.done = done

    async def forward(self, x: Any) -> Any:
        self.done.set()
        return x


class AwaitsThenLooks(soma.Node):
    """Waits (with a deadline) for ``done``, then answers whether the value behind ``refs[0]``
    is still alive."""

    def __init__(self, done: asyncio.Event, refs: list[weakref.ref[Value]]) -> None:
        self.done = done
        self.refs = refs

    async def forward(self, x: Any) -> Any:
        async with asyncio.timeout(DEADLINE):
            await self.done.wait()
        return self.refs[0]() is not None


def watched_graph(reader: soma.Node, *, late_reader: bool) -> tuple[soma.Graph, Any]:
    """``make`` >> ``use`` (``reader``) >> ``signal`` beside ``look``, which waits for
    ``signal`` and answers whether ``make``'s output is alive; with ``late_reader``, ``late``
    reads ``make``'s output again after ``look``."""
    refs: list[weakref.ref[Value]] = []
    done = asyncio.Event()
    g = soma.Graph()
    g.node("make", Makes(refs))
    g.node("use", reader)
    g.node("signal", Signals(done))
    g.node("look", AwaitsThenLooks(done, refs))
    g.edge("make", "use")
    g.edge("use", "signal")
    if late_reader:
        g.node("late", Call(lambda x: x["look"]))
        g.edge("make", "late")
        g.edge("look", "late")
    return g, refs


@pytest.mark.parametrize(
    "reader",
    [AsyncCall(lambda x: asyncio.sleep(0, "used")), Call(lambda x: "used")],
    ids=["async", "sync"],
)
def test_an_output_is_dropped_once_its_last_reader_has_run_while_the_run_goes_on(
    reader: soma.Node,
) -> None:
    g, refs = watched_graph(reader, late_reader=False)
    assert run(g.aforward(None)) == {"signal": "used", "look": False}
    assert len(refs) == 1


def test_an_output_is_kept_while_a_reader_is_still_to_read_it() -> None:
    g, refs = watched_graph(AsyncCall(lambda x: asyncio.sleep(0, "used")), late_reader=True)
    assert run(g.aforward(None)) == {"signal": "used", "late": True}
    assert refs[0]() is None  # The run is over: nothing holds it.


def test_amap_drops_each_items_outputs_after_their_last_reader() -> None:
    g, refs = watched_graph(AsyncCall(lambda x: asyncio.sleep(0, "used")), late_reader=False)

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(1))]

    assert run(main()) == [{"signal": "used", "look": False}]
    assert len(refs) == 1


# ---------------------------------------------------------------------------------------------
# Errors


class Boom(Exception):
    pass


def test_an_async_nodes_exception_keeps_its_type_and_notes_the_node_as_forward_does() -> None:
    async def fail(x: Any) -> Any:
        raise Boom("no")

    g = soma.Graph.somatize(Add(1) >> AsyncCall(fail).named("bad"))
    with pytest.raises(Boom, match="no") as raised:
        run(g.aforward(1))
    assert raised.value.__notes__ == ["raised in soma node `bad`"]
    with pytest.raises(Boom) as again:
        g.forward(1)
    assert again.value.__notes__ == ["raised in soma node `bad`"]


def test_a_sync_nodes_exception_in_aforward_is_the_one_forward_raises() -> None:
    def fail(x: Any) -> Any:
        raise Boom("sync")

    g = soma.Graph.somatize(AsyncAdd(1) >> Call(fail).named("bad"))
    with pytest.raises(Boom) as in_aforward:
        run(g.aforward(1))
    sync = soma.Graph.somatize(Add(1) >> Call(fail).named("bad"))
    with pytest.raises(Boom) as in_forward:
        sync.forward(1)
    assert in_aforward.value.__notes__ == in_forward.value.__notes__


def test_the_first_declared_failing_branch_wins_even_when_it_fails_last() -> None:
    async def main() -> None:
        second_failed = asyncio.Event()

        async def first(x: Any) -> Any:
            await asyncio.wait_for(second_failed.wait(), DEADLINE)
            raise Boom("first")

        async def second(x: Any) -> Any:
            second_failed.set()
            raise ValueError("second")

        g = soma.Graph.somatize(AsyncCall(first).named("a") | AsyncCall(second).named("b"))
        await g.aforward(0)

    with pytest.raises(Boom, match="first") as raised:
        run(main())
    assert raised.value.__notes__ == ["raised in soma node `a`"]


def test_branches_declared_after_a_failed_one_stop_at_their_next_node_boundary() -> None:
    ran: list[str] = []

    async def main() -> None:
        failed = asyncio.Event()

        async def fail(x: Any) -> Any:
            failed.set()
            raise Boom("first")

        async def slow(x: Any) -> Any:
            await asyncio.wait_for(failed.wait(), DEADLINE)
            # The first branch's failure reaches its wave in two turns of the loop (the done
            # callback of the wave's `asyncio.wait`, then the wave's own wake-up). On 3.11
            # `wait_for` ran its awaitable in a task of its own, which took turns enough; from
            # 3.12 it awaits it directly, and the turns are given here.
            for _ in range(2):
                await asyncio.sleep(0)
            return x

        async def after(x: Any) -> Any:
            ran.append("after")
            return x

        g = soma.Graph.somatize(
            AsyncCall(fail).named("a") | (AsyncCall(slow).named("b") >> AsyncCall(after))
        )
        await g.aforward(0)

    with pytest.raises(Boom):
        run(main())
    assert ran == []


def test_branches_declared_before_a_failed_one_run_on_and_their_error_is_not_lost() -> None:
    ran: list[str] = []

    async def main() -> None:
        failed = asyncio.Event()

        async def slow(x: Any) -> Any:
            await asyncio.wait_for(failed.wait(), DEADLINE)
            return x

        async def after(x: Any) -> Any:
            ran.append("after")
            return x

        async def fail(x: Any) -> Any:
            failed.set()
            raise Boom("second")

        g = soma.Graph.somatize(
            (AsyncCall(slow).named("a") >> AsyncCall(after)) | AsyncCall(fail).named("b")
        )
        await g.aforward(0)

    with pytest.raises(Boom, match="second"):
        run(main())
    assert ran == ["after"]


def test_a_thread_the_system_refuses_a_piece_is_a_thread_error_and_the_graph_runs_again() -> None:
    g = soma.Graph.somatize(AsyncAdd(1) >> Add(1))
    g._core._refuse_next_threads(1)
    with pytest.raises(soma.ThreadError, match="refused a thread"):
        run(g.aforward(1))
    assert run(g.aforward(1)) == 3


def test_a_copy_of_a_graph_with_async_nodes_runs_them() -> None:
    g = soma.Graph.somatize(AsyncAdd(1) >> Add(1))
    assert run(copy.copy(g).aforward(1)) == run(copy.deepcopy(g).aforward(1)) == 3


def test_an_async_node_returning_await_is_refused_naming_it() -> None:
    async def asks(x: Any) -> Any:
        return soma.Await([x])

    g = soma.Graph.somatize(AsyncCall(asks).named("asks"))
    with pytest.raises(TypeError, match=r"async node `asks` returned soma\.Await"):
        run(g.aforward(1))


def test_forward_inside_a_running_loop_refuses_pointing_to_aforward() -> None:
    g = soma.Graph.somatize(AsyncAdd(1).named("a"))

    async def main() -> None:
        g.forward(1)

    with pytest.raises(RuntimeError, match=r"await g\.aforward\(x\)") as raised:
        run(main())
    assert "`a`" in str(raised.value)


# ---------------------------------------------------------------------------------------------
# Forward's kept loop


def test_forward_runs_async_nodes_on_one_loop_kept_across_forwards() -> None:
    loops: list[Any] = []

    async def where(x: Any) -> Any:
        loops.append(asyncio.get_running_loop())
        return x

    g = soma.Graph.somatize(AsyncCall(where))
    assert g.forward(1) == 1
    assert g.forward(2) == 2
    other = soma.Graph.somatize(AsyncCall(where))
    assert other.forward(3) == 3
    assert loops[0] is loops[1] is loops[2]


# ---------------------------------------------------------------------------------------------
# Context, devices, drivers

LABEL: contextvars.ContextVar[str] = contextvars.ContextVar("LABEL", default="unset")


def test_the_callers_context_reaches_async_and_sync_nodes_and_nodes_set_never_reach_it() -> None:
    async def read_and_set(x: Any) -> Any:
        seen = LABEL.get()
        LABEL.set("set by a node")
        return [*x, seen]

    g = soma.Graph.somatize(
        AsyncCall(read_and_set) >> Call(lambda x: [*x, LABEL.get()]) >> AsyncCall(read_and_set)
    )

    async def main() -> Any:
        LABEL.set("caller")
        out = await g.aforward([])
        return out, LABEL.get()

    out, after = run(main())
    assert out == ["caller", "set by a node", "set by a node"]
    assert after == "caller"
    token = LABEL.set("sync caller")
    try:
        assert g.forward([]) == ["sync caller", "set by a node", "set by a node"]
        assert LABEL.get() == "sync caller"
    finally:
        LABEL.reset(token)


def test_what_a_sync_node_sets_reaches_the_later_nodes_of_its_piece_only() -> None:
    def set_label(x: Any) -> Any:
        LABEL.set("set by a sync node")
        return x

    async def read(x: Any) -> Any:
        return [*x, LABEL.get()]

    g = soma.Graph.somatize(Call(set_label) >> Call(lambda x: [*x, LABEL.get()]) >> AsyncCall(read))
    assert run(g.aforward([])) == ["set by a sync node", "unset"]


def test_each_branch_of_a_wave_has_a_context_of_its_own() -> None:
    async def set_then_read(x: Any) -> Any:
        LABEL.set(x)
        await asyncio.sleep(0)
        return LABEL.get()

    g = soma.Graph.somatize(
        AsyncCall(set_then_read).named("a")
        | (Call(lambda x: x + "!").named("b") >> AsyncCall(set_then_read).named("c"))
    )
    assert run(g.aforward("x")) == {"a": "x", "c": "x!"}


class WithCtx(soma.Node):
    async def forward(self, x: Any, ctx: Any) -> Any:
        return (ctx.node, ctx.device, ctx.turn, ctx.results)


def test_an_async_node_with_ctx_is_told_its_id_and_device() -> None:
    g = soma.Graph.somatize(WithCtx().named("w").on("cpu"))
    assert run(g.aforward(0)) == ("w", "cpu", 0, [])


class SeesDevice(soma.Node):
    """Records the current cuda device of its thread at each of its steps; between steps, meets
    the other parties at ``barrier`` (with a deadline), so every party takes a step of each
    round before any takes the next: the steps interleave on the loop."""

    def __init__(self, backend: Recorder, barrier: asyncio.Barrier, rounds: int) -> None:
        self.backend = backend
        self.barrier = barrier
        self.rounds = rounds

    async def forward(self, x: Any) -> Any:
        seen = []
        for _ in range(self.rounds):
            seen.append(self.backend.current("cuda"))
            async with asyncio.timeout(DEADLINE):
                await self.barrier.wait()
        seen.append(self.backend.current("cuda"))
        return seen


def test_interleaved_async_nodes_on_two_devices_each_see_their_own_at_every_step() -> None:
    rounds = 4
    with registered(Recorder()) as backend:

        async def main() -> tuple[Any, list[str | None], str | None]:
            barrier = asyncio.Barrier(4)
            g = soma.Graph.somatize(
                SeesDevice(backend, barrier, rounds).named("a").on("cuda:1")
                | SeesDevice(backend, barrier, rounds).named("b").on("cuda:2")
                | SeesDevice(backend, barrier, rounds).named("c")
            )
            between: list[str | None] = []  # What the loop's other tasks see between the steps.

            async def watch() -> None:
                for _ in range(rounds):
                    between.append(backend.current("cuda"))
                    async with asyncio.timeout(DEADLINE):
                        await barrier.wait()

            out, _ = await asyncio.gather(g.aforward(None), watch())
            return out, between, backend.current("cuda")

        out, between, after = run(main())
    assert out == {
        "a": ["cuda:1"] * (rounds + 1),
        "b": ["cuda:2"] * (rounds + 1),
        "c": ["cuda:0"] * (rounds + 1),
    }
    assert between == ["cuda:0"] * rounds
    assert after == "cuda:0"


def test_forward_makes_a_placed_async_nodes_device_current_at_every_step() -> None:
    with registered(Recorder()) as backend:
        g = soma.Graph.somatize(
            SeesDevice(backend, asyncio.Barrier(1), 3).named("a").on("xpu:1")
            >> SeesDevice(backend, asyncio.Barrier(1), 3).named("b").on("cuda:3")
        )
        assert g.forward(None) == ["cuda:3"] * 4
        assert "xpu:1" in [device for _, device in backend.sets]


class Cleans(soma.Node):
    """Waits for ever; its ``finally`` records the current cuda device."""

    def __init__(self, backend: Recorder, seen: list[str | None]) -> None:
        self.backend = backend
        self.seen = seen

    async def forward(self, x: Any) -> Any:
        try:
            await asyncio.Event().wait()
        finally:
            self.seen.append(self.backend.current("cuda"))


def test_a_cancelled_placed_async_node_runs_its_finally_on_its_device_and_puts_it_back() -> None:
    seen: list[str | None] = []
    with registered(Recorder()) as backend:
        g = soma.Graph.somatize(Cleans(backend, seen).named("a").on("cuda:1"))
        # A positive timeout: at 0 the deadline has passed at the run's first node boundary,
        # where the engine stops a run before any node starts, sync or async.
        with pytest.raises(TimeoutError, match="`a`"):
            run(g.aforward(None, timeout=0.05))
        assert seen == ["cuda:1"]
        assert backend.current("cuda") == "cuda:0"


def test_a_placed_async_node_that_raises_puts_its_device_back() -> None:
    async def fails(x: Any) -> Any:
        raise KeyError(x)

    with registered(Recorder()) as backend:
        g = soma.Graph.somatize(AsyncCall(fails).named("a").on("cuda:1"))
        with pytest.raises(KeyError):
            run(g.aforward(1))
        assert backend.current("cuda") == "cuda:0"
        assert [device for _, device in backend.sets] == ["cuda:1", "cuda:0"]


@pytest.mark.parametrize(
    "value", [OnDevice("cpu"), (OnDevice("cuda:1"), OnDevice("cpu")), {"x": OnDevice("cpu")}]
)
def test_a_placed_async_nodes_output_on_another_device_fails_as_a_sync_nodes_does(
    value: Any,
) -> None:
    async def gives(x: Any) -> Any:
        return value

    def raised(g: soma.Graph) -> soma.WrongDeviceError:
        with pytest.raises(soma.WrongDeviceError) as failed:
            g.forward(None)
        return failed.value

    expected = raised(soma.Graph.somatize(Call(lambda x: value).named("head").on("cuda:1")))
    error = raised(soma.Graph.somatize(AsyncCall(gives).named("head").on("cuda:1")))
    assert (error.node, error.declared, error.found) == ("head", "cuda:1", "cpu")
    assert str(error) == str(expected)
    assert error.__notes__ == expected.__notes__


@pytest.mark.parametrize(
    ("placed", "value"), [("cuda:1", OnDevice("cuda:1")), ("cuda:1", 3), ("mps", OnDevice("mps:0"))]
)
def test_a_placed_async_nodes_output_on_its_device_or_saying_nothing_passes(
    placed: str, value: Any
) -> None:
    async def gives(x: Any) -> Any:
        return value

    g = soma.Graph.somatize(AsyncCall(gives).named("head").on(placed))
    assert run(g.aforward(None)) is value


class Asks(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        if ctx.turn == 0:
            return soma.Await([x])
        return ctx.results[0]


class Doubling:
    def perform(self, requests: list[Any]) -> list[Any]:
        return [2 * r for r in requests]


def test_a_driver_serves_the_awaiting_sync_nodes_of_a_graph_with_async_nodes() -> None:
    g = soma.Graph.somatize(AsyncAdd(1) >> Asks() >> AsyncAdd(1))
    assert run(g.aforward(1, driver=Doubling())) == 5
    assert g.forward(1, driver=Doubling()) == 5


# ---------------------------------------------------------------------------------------------
# Retries, time limits, tracing


def test_an_async_node_is_retried_as_a_sync_node_is() -> None:
    attempts: list[int] = []

    async def flaky(x: Any) -> Any:
        attempts.append(x)
        if len(attempts) < 3:
            raise ConnectionError("flaky")
        return x

    g = soma.Graph.somatize(AsyncCall(flaky).named("f").retry(2, backoff=0))
    assert run(g.aforward(1)) == 1
    assert attempts == [1, 1, 1]


def test_an_async_node_failing_every_attempt_notes_how_many_were_made() -> None:
    async def broken(x: Any) -> Any:
        raise ConnectionError("down")

    g = soma.Graph.somatize(AsyncCall(broken).named("f").retry(1, backoff=0))
    with pytest.raises(ConnectionError) as raised:
        run(g.aforward(1))
    # The same notes, in the same order, as a sync node's (test_policies).
    assert raised.value.__notes__ == [
        "raised in soma node `f`",
        "soma node `f` failed on each of its 2 attempts",
    ]


def test_an_async_node_past_its_time_limit_is_cancelled_and_named() -> None:
    cancelled: list[str] = []

    async def never(x: Any) -> Any:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.append("finally ran")

    g = soma.Graph.somatize(AsyncCall(never).named("slow").time_limit(0.05))
    with pytest.raises(soma.TimeLimitError, match="`slow`") as raised:
        run(g.aforward(1))
    assert raised.value.node == "slow"
    assert cancelled == ["finally ran"]


def test_a_run_past_its_timeout_is_never_a_success_even_when_a_node_swallows_its_cancel() -> None:
    after: list[Any] = []

    async def swallows(x: Any) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return "swallowed"

    async def later(x: Any) -> Any:
        after.append(x)
        return x

    g = soma.Graph.somatize(AsyncCall(swallows).named("stubborn") >> AsyncCall(later))
    with pytest.raises(TimeoutError, match="`stubborn`"):
        run(g.aforward(0, timeout=0.05))
    assert after == []


def test_a_trace_has_a_span_per_node_from_the_call_to_the_return() -> None:
    trace = soma.Trace()
    marks: list[float] = []

    threads: list[int] = []

    async def steps(x: Any) -> Any:
        threads.append(soma.Trace._thread())
        for _ in range(3):
            await asyncio.sleep(0)
        marks.append(trace._now())
        return x

    g = soma.Graph.somatize(Add(1).named("a") >> (AsyncCall(steps).named("b") | Add(1).named("c")))
    run(g.aforward(1, trace=trace))
    spans = {span.node: span for span in trace.spans}
    assert set(spans) == {"a", "b", "c"}
    assert spans["b"].end >= marks[0] >= spans["b"].start
    assert spans["b"].branch == "0"
    assert spans["b"].thread == threads[0]
    assert spans["c"].branch == "1"


# ---------------------------------------------------------------------------------------------
# The cache


#: The nodes called, in order: kept out of the nodes' state, which their cache keys cover.
CALLED = CallRecord()  # Keyed as an empty record: recording a call changes no key.


class Counted(soma.Node):
    """Adds ``k``, noting its call in ``CALLED``."""

    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: Any, ctx: Any) -> Any:
        CALLED.append(ctx.node)
        return x + self.k


class AsyncCounted(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    async def forward(self, x: Any, ctx: Any) -> Any:
        CALLED.append(ctx.node)
        return x + self.k


@pytest.fixture
def calls() -> list[str]:
    CALLED.clear()
    return CALLED


def counted_graph(calls: list[str]) -> soma.Graph:
    return soma.Graph.somatize(
        AsyncCounted(1).named("a")
        >> Counted(2).named("s")
        >> (AsyncCounted(3).named("b") | Counted(5).named("c"))
    )


def test_a_rerun_with_a_cache_calls_no_node_and_returns_the_same(calls: list[str]) -> None:
    g = counted_graph(calls)
    cache = soma.Cache()
    first = run(g.aforward(1, cache=cache))
    assert sorted(calls) == ["a", "b", "c", "s"]
    calls.clear()
    trace = soma.Trace()
    assert run(g.aforward(1, cache=cache, trace=trace)) == first
    assert calls == []
    assert {span.node: span.cached for span in trace.spans} == dict.fromkeys("asbc", True)
    assert g.forward(1, cache=cache) == first
    assert calls == []


def test_an_async_node_whose_state_changed_runs_again_and_only_what_reads_it(
    calls: list[str],
) -> None:
    g = counted_graph(calls)
    cache = soma.Cache()
    run(g.aforward(1, cache=cache))
    calls.clear()
    g.implementation("a").k = 10
    assert run(g.aforward(1, cache=cache)) == {"b": 16, "c": 18}
    assert sorted(calls) == ["a", "b", "c", "s"]
    calls.clear()
    g.implementation("b").k = 4
    assert run(g.aforward(1, cache=cache)) == {"b": 17, "c": 18}
    assert calls == ["b"]


def test_a_new_input_runs_every_node_again_with_a_cache(calls: list[str]) -> None:
    g = counted_graph(calls)
    cache = soma.Cache()
    run(g.aforward(1, cache=cache))
    calls.clear()
    run(g.aforward(2, cache=cache))
    assert sorted(calls) == ["a", "b", "c", "s"]


# ---------------------------------------------------------------------------------------------
# amap


def test_amap_gives_the_results_in_input_order() -> None:
    async def later_first(x: Any) -> Any:
        for _ in range(10 - x):
            await asyncio.sleep(0)
        return x

    g = soma.Graph.somatize(AsyncCall(later_first).concurrency(10) >> Add(100))

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(10))]

    assert run(main()) == [100 + i for i in range(10)]


def test_amap_lets_an_async_node_work_on_as_many_items_as_its_concurrency() -> None:
    async def main() -> list[Any]:
        barrier = asyncio.Barrier(4)
        g = soma.Graph.somatize(AsyncMeet(barrier).concurrency(4))
        return [y async for y in g.amap(range(8))]

    assert run(main()) == list(range(8))


def test_amap_runs_a_piece_of_sync_nodes_on_as_many_items_as_its_least_concurrent_node() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)

    def meet(x: Any) -> Any:
        barrier.wait()
        return x

    g = soma.Graph.somatize(
        Call(meet).concurrency(2) >> Call(lambda x: x).concurrency(5) >> AsyncAdd(0)
    )

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(4))]

    assert run(main()) == [0, 1, 2, 3]


def test_amap_takes_a_nodes_concurrency_as_asked_when_it_is_called_or_set_by_its_id() -> None:
    async def main() -> list[Any]:
        barrier = asyncio.Barrier(3)
        g = soma.Graph.somatize(AsyncMeet(barrier).named("meet"))
        assert [y async for y in g.amap(range(3), concurrency={"meet": 3})] == [0, 1, 2]
        g.concurrency("meet", 3)
        return [y async for y in g.amap(range(3))]

    assert run(main()) == [0, 1, 2]


def test_amap_keeps_at_most_in_flight_items_in_flight() -> None:
    inside = 0
    most = 0

    async def count(x: Any) -> Any:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0)
        inside -= 1
        return x

    g = soma.Graph.somatize(AsyncCall(count).concurrency(100))

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(50), in_flight=3)]

    assert run(main()) == list(range(50))
    assert 1 <= most <= 3


def test_amap_reads_an_async_iterable() -> None:
    async def items() -> Any:
        for i in range(3):
            yield i

    g = soma.Graph.somatize(AsyncAdd(1))

    async def main() -> list[Any]:
        return [y async for y in g.amap(items())]

    assert run(main()) == [1, 2, 3]


def test_amap_raises_the_first_failing_items_error_at_its_position() -> None:
    async def fail_on_two(x: Any) -> Any:
        if x == 2:
            raise Boom("two")
        return x

    g = soma.Graph.somatize(AsyncCall(fail_on_two).named("f"))
    got: list[Any] = []

    async def main() -> None:
        async for y in g.amap(range(5)):
            got.append(y)

    with pytest.raises(Boom) as raised:
        run(main())
    assert got == [0, 1]
    assert raised.value.__notes__ == ["raised in soma node `f`"]


def test_amap_cancels_the_items_after_a_failed_one() -> None:
    cancelled: list[Any] = []

    async def main() -> None:
        started = asyncio.Event()

        async def work(x: Any) -> Any:
            if x == 0:
                await asyncio.wait_for(started.wait(), DEADLINE)
                raise Boom("first")
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(x)
                raise
            return x

        g = soma.Graph.somatize(AsyncCall(work).concurrency(3))
        async for _ in g.amap(range(3)):
            pass

    with pytest.raises(Boom):
        run(main())
    assert sorted(cancelled) == [1, 2]


def test_amap_with_a_cache_calls_no_node_for_items_seen_before(calls: list[str]) -> None:
    g = counted_graph(calls)
    cache = soma.Cache()

    async def main(xs: list[int]) -> list[Any]:
        return [y async for y in g.amap(xs, cache=cache)]

    first = run(main([1, 2]))
    assert sorted(calls) == sorted(["a", "s", "b", "c"] * 2)
    third = g.forward(3)
    calls.clear()
    assert run(main([2, 1, 3])) == [first[1], first[0], third]
    assert sorted(calls) == ["a", "b", "c", "s"]  # Item 3's: the only one not seen before.


def test_map_of_async_nodes_with_a_cache_calls_no_node_for_items_seen_before(
    calls: list[str],
) -> None:
    g = counted_graph(calls)
    cache = soma.Cache()
    first = list(g.map([1, 2], cache=cache))
    assert sorted(calls) == sorted(["a", "s", "b", "c"] * 2)
    calls.clear()
    assert list(g.map([2, 1], cache=cache)) == first[::-1]
    assert calls == []


def test_amap_refuses_a_timeout_that_is_no_number_of_seconds_where_it_is_called() -> None:
    g = soma.Graph.somatize(AsyncAdd(1))
    with pytest.raises(ValueError, match="timeout"):
        g.amap([1], timeout=-1)


# ---------------------------------------------------------------------------------------------
# g.map and micro-batches, through forward's kept loop


class FailsOn(soma.Node):
    """Adds 1, awaiting the loop; raises :class:`Boom` on ``bad``."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    async def forward(self, x: Any) -> Any:
        await asyncio.sleep(0)
        if x == self.bad:
            raise Boom(str(x))
        return x + 1


def test_map_of_a_graph_with_async_nodes_gives_what_forward_gives_in_input_order() -> None:
    async def later_first(x: Any) -> Any:
        for _ in range(10 - x):
            await asyncio.sleep(0)
        return x

    g = soma.Graph.somatize(AsyncCall(later_first).concurrency(10) >> Add(100) >> AsyncAdd(1))
    assert list(g.map(range(10))) == [g.forward(i) for i in range(10)]
    assert sorted(g.map(range(10), ordered=False)) == [(i, 101 + i) for i in range(10)]


def test_map_of_async_nodes_raises_the_first_failing_items_error_at_its_position() -> None:
    g = soma.Graph.somatize(FailsOn(2).named("f") >> Add(10))
    stream = g.map(range(5))
    assert [next(stream), next(stream)] == [11, 12]
    with pytest.raises(Boom) as raised:
        next(stream)
    assert raised.value.__notes__ == ["raised in soma node `f`"]
    assert list(stream) == []


def test_map_of_async_nodes_collects_or_skips_failed_items_naming_the_node() -> None:
    g = soma.Graph.somatize(FailsOn(2).named("f") >> Add(10))
    collected = list(g.map(range(4), on_error="collect"))
    failed = collected[2]
    assert isinstance(failed, soma.Failed)
    assert (failed.index, failed.input, failed.node) == (2, 2, "f")
    assert isinstance(failed.exception, Boom)
    assert [collected[i] for i in (0, 1, 3)] == [11, 12, 14]
    stream = g.map(range(4), on_error="skip")
    assert list(stream) == [11, 12, 14]
    assert [(f.index, f.node) for f in stream.failures] == [(2, "f")]


def test_map_lets_an_async_node_work_on_as_many_items_as_its_concurrency() -> None:
    barrier = asyncio.Barrier(4)  # Bound to the kept loop when first waited on, there.
    g = soma.Graph.somatize(AsyncMeet(barrier).concurrency(4))
    assert list(g.map(range(4))) == [0, 1, 2, 3]


def test_each_item_of_map_runs_in_a_copy_of_the_callers_context_of_its_own() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def read_then_set(x: Any) -> Any:
        seen = var.get()
        var.set(f"item {x}")
        return seen

    g = soma.Graph.somatize(AsyncCall(read_then_set) >> AsyncCall(lambda x: asyncio.sleep(0, x)))
    token = var.set("caller")
    try:
        assert list(g.map(range(3))) == ["caller"] * 3
        assert var.get() == "caller"
    finally:
        var.reset(token)


def test_forward_in_micro_batches_runs_async_nodes_and_joins_the_slices() -> None:
    async def doubled(x: Any) -> Any:
        await asyncio.sleep(0)
        return [2 * v for v in x]

    g = soma.Graph.somatize(AsyncCall(doubled) >> Call(lambda x: [v + 1 for v in x]))
    assert g.forward([1, 2, 3, 4, 5], micro_batches=2) == [3, 5, 7, 9, 11]
    assert g.forward([1, 2], micro_batches=2, join=lambda outs: outs) == [[3], [5]]


def test_map_of_async_nodes_inside_a_running_loop_refuses_pointing_to_aforward() -> None:
    g = soma.Graph.somatize(AsyncAdd(1).named("a"))

    async def in_map() -> None:
        g.map([1])

    async def in_micro_batches() -> None:
        g.forward([1, 2], micro_batches=2)

    for main in (in_map, in_micro_batches):
        with pytest.raises(RuntimeError, match=r"await g\.aforward\(x\)"):
            run(main())


def test_closing_a_stream_of_async_nodes_cancels_its_items_in_flight() -> None:
    started = threading.Barrier(3, timeout=DEADLINE)  # Items 1 and 2 in flight, and the test.
    ended: list[Any] = []

    async def waits(x: Any) -> Any:
        if x == 0:
            return x
        try:
            await asyncio.to_thread(started.wait)
            await asyncio.Event().wait()
        finally:
            ended.append(x)

    g = soma.Graph.somatize(AsyncCall(waits).concurrency(3).named("w") >> Add(1))
    stream = g.map(range(3))
    assert next(stream) == 1
    started.wait()
    stream.close()
    assert sorted(ended) == [1, 2]
    assert list(stream) == []
    assert list(g.map([0])) == [1]


def test_a_stream_of_async_nodes_dropped_with_items_in_flight_cancels_them() -> None:
    started = threading.Barrier(2, timeout=DEADLINE)  # Item 1 in flight, and the test.
    ended = threading.Event()

    async def waits(x: Any) -> Any:
        if x == 0:
            return x
        try:
            await asyncio.to_thread(started.wait)
            await asyncio.Event().wait()
        finally:
            ended.set()

    g = soma.Graph.somatize(AsyncCall(waits).concurrency(2) >> Add(1))
    stream = g.map(range(2))
    assert next(stream) == 1
    started.wait()
    del stream
    assert ended.wait(DEADLINE)


def test_map_of_async_nodes_reads_its_inputs_lazily_at_most_in_flight_ahead() -> None:
    read: list[int] = []

    def inputs() -> Any:
        for i in range(10):
            read.append(i)
            yield i

    stream = soma.Graph.somatize(AsyncAdd(1)).map(inputs(), in_flight=2)
    assert read == []
    assert next(stream) == 1
    assert read == [0, 1]
    assert next(stream) == 2
    assert read == [0, 1, 2]
    assert list(stream) == list(range(3, 11))


def test_map_of_async_nodes_reports_progress_to_a_callable() -> None:
    events: list[soma.Progress] = []
    g = soma.Graph.somatize(AsyncAdd(1))
    assert list(g.map(range(5), progress=events.append)) == [1, 2, 3, 4, 5]
    assert events[-1].done
    assert (events[-1].read, events[-1].succeeded, events[-1].failed) == (5, 5, 0)


def test_the_figures_of_a_stream_of_async_nodes_count_its_items() -> None:
    g = soma.Graph.somatize(FailsOn(1) >> Add(1))
    stream = g.map(range(3), on_error="skip")
    assert list(stream) == [2, 4]
    figures = stream.figures()
    assert figures is not None
    assert (figures.read, figures.succeeded, figures.failed, figures.in_flight) == (3, 2, 1, 0)
    assert figures.stages == []


# ---------------------------------------------------------------------------------------------
# Cancellation and timeouts, each in a child process with a deadline

CANCEL_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, threading
    import soma

    report = {"finally": []}
    release = threading.Event()

    class Stuck(soma.Node):
        async def forward(self, x):
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                report["finally"].append("cancelled")
                raise
            finally:
                report["finally"].append("finally")

    class Blocks(soma.Node):
        def forward(self, x):
            started_sync.set()
            release.wait()
            return x

    class After(soma.Node):
        def forward(self, x):
            report.setdefault("after ran", True)
            return x

    class Pass(soma.Node):
        async def forward(self, x):
            return x

    async def main():
        global started
        started = asyncio.Event()
        g = soma.Graph.somatize(__ARRANGEMENT__)
        __HOW__
        report["again"] = await soma.Graph.somatize(Pass() >> Pass()).aforward("go")
        print(json.dumps(report), flush=True)

    started_sync = threading.Event()
    asyncio.run(main())
    release.set()
    """
)

HOWS = {
    "cancel": """
        task = asyncio.create_task(g.aforward(0))
        await asyncio.wait_for(started.wait(), 10)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            report["raised"] = "CancelledError"
        """,
    "asyncio.timeout": """
        try:
            async with asyncio.timeout(0.2):
                await g.aforward(0)
        except TimeoutError:
            report["raised"] = "TimeoutError"
        """,
    "timeout=": """
        try:
            await g.aforward(0, timeout=0.2)
        except TimeoutError as error:
            report["raised"] = "TimeoutError"
            report["message"] = str(error)
        """,
}


def child_report(arrangement: str, how: str) -> dict[str, Any]:
    body = textwrap.indent(textwrap.dedent(HOWS[how]).strip(), " " * 4)
    script = CANCEL_SCRIPT.replace("__ARRANGEMENT__", arrangement).replace("    __HOW__", body)
    child = run_script(script)
    assert child.returncode == 0, child.stderr
    report: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("how", list(HOWS))
@pytest.mark.parametrize(
    "arrangement",
    [
        "Stuck().named('stuck')",
        "Pass() >> (Pass() | Stuck().named('stuck')) >> After()",
        "Pass() >> (Stuck().named('stuck') | (Pass() >> (Pass() | Pass()))) >> Pass()",
    ],
)
def test_cancelling_aforward_cancels_the_async_nodes_in_flight_and_the_next_run_works(
    arrangement: str, how: str
) -> None:
    report = child_report(arrangement, how)
    expected = "CancelledError" if how == "cancel" else "TimeoutError"
    assert report["raised"] == expected
    assert report["finally"] == ["cancelled", "finally"]
    assert "after ran" not in report
    assert report["again"] == "go"


def test_a_timeout_names_the_nodes_still_running() -> None:
    report = child_report("Pass() >> (Pass() | Stuck().named('stuck'))", "timeout=")
    assert "`stuck`" in report["message"]
    assert "timeout of 0.2 s" in report["message"]


def test_aforward_returns_at_its_timeout_while_a_sync_node_holds_its_thread() -> None:
    script = textwrap.dedent(
        """
        import asyncio, threading
        import soma

        release = threading.Event()

        class Blocks(soma.Node):
            def forward(self, x):
                release.wait()
                return x

        class Pass(soma.Node):
            async def forward(self, x):
                return x

        async def main():
            g = soma.Graph.somatize(Pass() >> Blocks().named("blocks") >> Pass())
            try:
                await g.aforward(0, timeout=0.2)
            except TimeoutError as error:
                print("timed out:", error, flush=True)
            release.set()
            print("again:", await g.aforward(1), flush=True)

        asyncio.run(main())
        """
    )
    child = run_script(script)
    assert "timed out:" in child.stdout, child.stderr
    assert "`blocks`" in child.stdout
    assert "again: 1" in child.stdout, child.stderr


def test_forward_of_async_nodes_honours_its_timeout_and_runs_again() -> None:
    script = textwrap.dedent(
        """
        import asyncio
        import soma

        class Stuck(soma.Node):
            async def forward(self, x):
                if x == "block":
                    await asyncio.Event().wait()
                return x

        g = soma.Graph.somatize(Stuck().named("stuck"))
        try:
            g.forward("block", timeout=0.2)
        except TimeoutError as error:
            print("timed out:", error, flush=True)
        print("again:", g.forward("go"), flush=True)
        """
    )
    child = run_script(script)
    assert "timed out:" in child.stdout, child.stderr
    assert "`stuck`" in child.stdout
    assert "again: go" in child.stdout, child.stderr


@pytest.mark.parametrize(
    "call", ['g.forward("block")', 'list(g.map(["go", "block"]))', 'list(g.map(["block"]))']
)
def test_ctrl_c_stops_forward_or_map_of_async_nodes_and_cancels_them(call: str) -> None:
    script = textwrap.dedent(
        """
        import asyncio, signal
        import soma

        signal.signal(signal.SIGINT, signal.default_int_handler)
        cancelled = []

        class Stuck(soma.Node):
            async def forward(self, x):
                if x == "block":
                    print("started", flush=True)  # the parent sends Ctrl-C once it reads this
                    try:
                        await asyncio.Event().wait()
                    finally:
                        cancelled.append("finally")
                return x

        g = soma.Graph.somatize(Stuck().named("stuck"))
        try:
            __CALL__
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
        print("again:", g.forward("go"), cancelled, flush=True)
        """
    )
    child = interrupt_script(script.replace("__CALL__", call), "started")
    assert "caught KeyboardInterrupt" in child.stdout, (child.stdout, child.stderr)
    assert "again: go ['finally']" in child.stdout, (child.stdout, child.stderr)


@pytest.mark.parametrize("call", ['g.forward("block")', 'list(g.map(["block"]))'])
def test_ctrl_c_landing_while_a_run_is_handed_to_the_loop_still_cancels_it(call: str) -> None:
    # The calling thread runs Python to hand the run to the kept loop; a Ctrl-C raised there,
    # after the run is on the loop, must still cancel it (it used to be left waiting forever).
    script = textwrap.dedent(
        """
        import asyncio, signal, threading
        import soma
        import soma._run.loop as kept

        signal.signal(signal.SIGINT, signal.default_int_handler)
        began, ended = threading.Event(), threading.Event()

        class Stuck(soma.Node):
            async def forward(self, x):
                if x == "block":
                    began.set()
                    try:
                        await asyncio.Event().wait()
                    finally:
                        ended.set()
                return x

        begin = kept.Started.begin
        def begin_then_ctrl_c(self, stepper):
            begin(self, stepper)
            assert began.wait(10), "the node never began"
            signal.raise_signal(signal.SIGINT)
        kept.Started.begin = begin_then_ctrl_c

        g = soma.Graph.somatize(Stuck().named("stuck"))
        try:
            __CALL__
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
        kept.Started.begin = begin
        print("cancelled:", ended.wait(10), flush=True)
        print("again:", g.forward("go"), flush=True)
        """
    )
    child = run_script(script.replace("__CALL__", call))
    assert "caught KeyboardInterrupt" in child.stdout, (child.stdout, child.stderr)
    assert "cancelled: True" in child.stdout, (child.stdout, child.stderr)
    assert "again: go" in child.stdout, (child.stdout, child.stderr)


def test_ctrl_c_under_asyncio_run_cancels_the_async_nodes_of_aforward() -> None:
    script = textwrap.dedent(
        """
        import asyncio
        import soma

        cancelled = []

        class Stuck(soma.Node):
            async def forward(self, x):
                print("started", flush=True)  # the parent sends Ctrl-C once it reads this
                try:
                    await asyncio.Event().wait()
                finally:
                    cancelled.append("finally")

        g = soma.Graph.somatize(Stuck().named("stuck"))
        try:
            asyncio.run(g.aforward(0))
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", cancelled, flush=True)
        """
    )
    child = interrupt_script(script, "started")
    assert "caught KeyboardInterrupt ['finally']" in child.stdout, (child.stdout, child.stderr)


STREAM_TIMEOUTS = textwrap.dedent(
    """
    import asyncio
    import soma

    class Add(soma.Node):
        async def forward(self, x):
            await asyncio.sleep(0)
            return x + 1

    class Stuck(soma.Node):
        \"\"\"Passes items below 3 on; waits for ever on the others, until cancelled.\"\"\"

        async def forward(self, x):
            values = x if isinstance(x, list) else [x]
            if max(values) >= 3:
                try:
                    await asyncio.Event().wait()
                finally:
                    print("cancelled", x, flush=True)
            return x

    # `b` one item at a time (an async node takes `in_flight` unless told): item 3 waits in it.
    g = soma.Graph.somatize(
        Add().named("a") >> Stuck().named("b").concurrency(1) >> Add().named("c")
    )
    taken = []
    try:
        for y in g.map(range(100), timeout=1.0):
            taken.append(y)
    except TimeoutError as error:
        print("map timed out after", taken, "|", str(error).splitlines()[0], flush=True)
    print("map again", list(g.map([0, 1], timeout=30)), flush=True)

    rows = soma.Graph.somatize(Stuck().named("rows"))
    try:
        rows.forward([0, 1, 2, 3], micro_batches=2, timeout=1.0)
    except TimeoutError as error:
        print("micro-batches timed out |", str(error).splitlines()[0], flush=True)
    print("micro-batches again", rows.forward([0, 1], micro_batches=2, timeout=30), flush=True)

    async def main():
        taken = []
        try:
            async for y in g.amap(range(100), timeout=1.0):
                taken.append(y)
        except TimeoutError as error:
            print("amap timed out after", taken, "|", str(error).splitlines()[0], flush=True)
        print("amap again", [y async for y in g.amap([0, 1], timeout=30)], flush=True)

    asyncio.run(main())
    """
)


def test_map_micro_batches_and_amap_of_async_nodes_past_their_timeout_cancel_and_run_again() -> (
    None
):
    child = run_script(STREAM_TIMEOUTS)
    assert child.returncode == 0, child.stderr
    out = child.stdout
    late = "within its timeout of 1 s; still running:"
    assert f"map timed out after [2, 3] | the stream did not finish {late} `b` (cancelled)" in out
    assert "map again [2, 3]" in out
    assert f"micro-batches timed out | the stream did not finish {late} `rows` (cancelled)" in out
    assert "micro-batches again [0, 1]" in out
    assert f"amap timed out after [2, 3] | the stream did not finish {late} `b` (cancelled)" in out
    assert "amap again [2, 3]" in out
    assert out.count("cancelled 3") == 2  # `b` on item 2, in map and in amap.
    assert "cancelled [2, 3]" in out
