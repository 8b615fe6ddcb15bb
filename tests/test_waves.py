"""CU9's Python questionnaire: branches run at the same time.

Plans first (what a wave groups), then execution: the engine releases the GIL (proven in a
subprocess, where a hang is caught by a deadline), branches really are in flight together
(proven by rendezvous, never by sleeping and measuring), a branch keeps its thread, the first
declared branch's error wins whatever the clock says, and Ctrl-C stops a long run.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import soma
from conftest import (
    DEADLINE,
    Add,
    Answer,
    Double,
    Log,
    Meet,
    Pass,
    Record,
    SumValues,
    build,
    executed,
    named,
    series,
)

# How long a subprocess may take, start-up and import included, before it counts as hung.
SUBPROCESS_DEADLINE = 60.0


def plan_of(expression: Any) -> str:
    return repr(soma.Graph.somatize(expression).plan())


# ---------------------------------------------------------------------------------------------
# Decomposition: what a wave groups


def test_the_empty_graph_plans_as_empty() -> None:
    assert repr(soma.Graph().plan()) == "Empty"


def test_one_node_plans_as_one_execute() -> None:
    (a,) = named("a")
    assert plan_of(a) == "Execute(a)"


def test_a_linear_chain_plans_as_one_flat_sequence_with_no_wave() -> None:
    assert plan_of(series(*named("a b c d"))) == (
        "Sequence([Execute(a), Execute(b), Execute(c), Execute(d)])"
    )


def test_a_fan_out_plans_as_a_wave_after_its_source() -> None:
    a, b, c = named("a b c")
    assert plan_of(a >> (b | c)) == "Sequence([Execute(a), Wave([Execute(b), Execute(c)])])"


def test_a_fan_in_plans_as_a_wave_before_its_join() -> None:
    a, b, c = named("a b c")
    assert plan_of((a | b) >> c) == "Sequence([Wave([Execute(a), Execute(b)]), Execute(c)])"


def test_a_diamond_plans_as_a_wave_between_source_and_join() -> None:
    a, b, c, d = named("a b c d")
    assert plan_of(a >> (b | c) >> d) == (
        "Sequence([Execute(a), Wave([Execute(b), Execute(c)]), Execute(d)])"
    )


class Source(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class Encoder(soma.Node):
    def forward(self, x: Any) -> Any:
        return x + 1


class Bottleneck(soma.Node):
    def forward(self, x: Any) -> Any:
        return x * 10


class Other(soma.Node):
    def forward(self, x: Any) -> Any:
        return x - 1


class Other2(soma.Node):
    def forward(self, x: Any) -> Any:
        return x * 100


class Join(soma.Node):
    def forward(self, x: dict[str, Any]) -> Any:
        return x


def seed_expression() -> Any:
    return Source() >> ((Encoder() >> Bottleneck()) | (Other() >> Other2())) >> Join()


def test_the_seed_shape_plans_as_a_wave_of_two_sequences() -> None:
    plan = soma.Graph.somatize(seed_expression()).plan()
    assert plan.shape() == (
        "Sequence([Execute, Wave([Sequence([Execute, Execute]), Sequence([Execute, Execute])]), "
        "Execute])"
    )
    assert repr(plan) == (
        "Sequence([Execute(source), Wave([Sequence([Execute(encoder), Execute(bottleneck)]), "
        "Sequence([Execute(other), Execute(other2)])]), Execute(join)])"
    )


def test_the_seed_shape_runs_both_branches_into_the_join() -> None:
    out = soma.Graph.somatize(seed_expression()).forward(5)
    assert out == {"bottleneck": (5 + 1) * 10, "other2": (5 - 1) * 100}
    assert list(out) == ["bottleneck", "other2"]


def test_branches_of_unequal_length_are_one_wave_not_lockstep() -> None:
    a, b, b2, b3, c, c2, d = named("a b b2 b3 c c2 d")
    assert plan_of(a >> ((b >> b2 >> b3) | (c >> c2)) >> d) == (
        "Sequence([Execute(a), Wave([Sequence([Execute(b), Execute(b2), Execute(b3)]), "
        "Sequence([Execute(c), Execute(c2)])]), Execute(d)])"
    )


def test_the_barrier_counterexample_does_not_split_the_branch() -> None:
    a, a2, b, c, d = named("a a2 b c d")
    assert plan_of(((a >> a2) | b) >> (c | d)) == (
        "Sequence([Wave([Sequence([Execute(a), Execute(a2)]), Execute(b)]), "
        "Wave([Execute(c), Execute(d)])])"
    )


def test_parallel_into_parallel_is_two_waves_not_one_of_four() -> None:
    a, b, c, d = named("a b c d")
    assert plan_of((a | b) >> (c | d)) == (
        "Sequence([Wave([Execute(a), Execute(b)]), Wave([Execute(c), Execute(d)])])"
    )


def test_a_wave_nests_inside_another_waves_branch() -> None:
    a, b, c, d, e, f, g = named("a b c d e f g")
    assert plan_of(a >> ((b >> (c | d) >> e) | f) >> g) == (
        "Sequence([Execute(a), Wave([Sequence([Execute(b), Wave([Execute(c), Execute(d)]), "
        "Execute(e)]), Execute(f)]), Execute(g)])"
    )


def test_two_unrelated_long_chains_are_two_branches() -> None:
    left = series(*named("l1 l2 l3 l4 l5"))
    right = series(*named("r1 r2 r3 r4"))
    plan = soma.Graph.somatize(left | right).plan()
    assert plan.kind == "Wave"
    assert [executed(branch) for branch in plan.children] == [
        ["l1", "l2", "l3", "l4", "l5"],
        ["r1", "r2", "r3", "r4"],
    ]


def test_a_wave_lists_its_branches_in_declaration_order() -> None:
    z, a, m = named("z a m")
    assert plan_of(z | a | m) == "Wave([Execute(z), Execute(a), Execute(m)])"


N_NODES = ["a", "b", "c", "d"]
N_EDGES = [("a", "c"), ("a", "d"), ("b", "d")]


def test_the_n_is_walked_in_sequence() -> None:
    g = build(N_NODES, N_EDGES)
    assert repr(g.plan()) == "Sequence([Execute(a), Execute(b), Execute(c), Execute(d)])"


def test_the_n_does_not_spoil_the_parallelism_beside_it() -> None:
    g = build([*N_NODES, "x", "y"], [*N_EDGES, ("x", "y")])
    assert repr(g.plan()) == (
        "Wave([Sequence([Execute(a), Execute(b), Execute(c), Execute(d)]), "
        "Sequence([Execute(x), Execute(y)])])"
    )


def test_the_n_does_not_spoil_the_parallelism_after_it() -> None:
    nodes = [*N_NODES, "e", "f", "g"]
    edges = [*N_EDGES, ("c", "e"), ("d", "e"), ("e", "f"), ("e", "g")]
    assert repr(build(nodes, edges).plan()) == (
        "Sequence([Execute(a), Execute(b), Execute(c), Execute(d), Execute(e), "
        "Wave([Execute(f), Execute(g)])])"
    )


def test_the_n_runs_with_each_node_reading_its_own_predecessors() -> None:
    log = Log()
    g = build(N_NODES, N_EDGES, factory=lambda: Record(log, lambda x: 1 if x is None else x))
    out = g.forward(None)
    assert out == {"c": 1, "d": {"a": 1, "b": 1}}
    assert log.inputs("d") == [{"a": 1, "b": 1}]


def test_the_dsl_with_branches_gives_the_same_plan_as_node_and_edge() -> None:
    from_dsl = soma.Graph.somatize(seed_expression())
    nodes = ["source", "encoder", "bottleneck", "other", "other2", "join"]
    edges = [
        ("source", "encoder"),
        ("encoder", "bottleneck"),
        ("source", "other"),
        ("other", "other2"),
        ("bottleneck", "join"),
        ("other2", "join"),
    ]
    by_hand = build(nodes, edges)
    assert from_dsl.plan() == by_hand.plan()
    assert repr(from_dsl.plan()) == repr(by_hand.plan())


def test_the_barrier_counterexample_gives_the_same_plan_from_node_and_edge() -> None:
    a, a2, b, c, d = named("a a2 b c d")
    from_dsl = soma.Graph.somatize(((a >> a2) | b) >> (c | d))
    edges = [("a", "a2"), ("a2", "c"), ("a2", "d"), ("b", "c"), ("b", "d")]
    assert build(["a", "a2", "b", "c", "d"], edges).plan() == from_dsl.plan()


# ---------------------------------------------------------------------------------------------
# The GIL: in another process, because a hang cannot be caught from inside


GIL_SCRIPT = textwrap.dedent(
    """
    import threading
    import soma

    barrier = threading.Barrier(2, timeout={deadline})
    left_done = threading.Event()

    class Left(soma.Node):
        def forward(self, x):
            barrier.wait()
            left_done.set()
            return x

    class Right(soma.Node):
        def forward(self, x):
            barrier.wait()
            return x

    class After(soma.Node):
        def forward(self, x):
            if not left_done.wait({deadline}):
                raise RuntimeError("the left branch never reached its end")
            return x + 1

    # The two branches meet; then the calling thread's branch ends and the engine waits on the
    # other, which still has Python to run. Had the engine kept the GIL on the calling thread,
    # `after` could never get it back from `left_done.wait`: the process would hang.
    g = soma.Graph.somatize(Left() | (Right() >> After()))
    print("result", sorted(g.forward(1).items()), flush=True)
    """
)


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_DEADLINE,
            check=False,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the child hung past {SUBPROCESS_DEADLINE}s: the engine holds the GIL\n{hung}")


def test_the_engine_releases_the_gil_while_branches_run() -> None:
    done = run_script(GIL_SCRIPT.format(deadline=DEADLINE))
    assert done.returncode == 0, done.stderr
    assert "result [('after', 2), ('left', 1)]" in done.stdout, done.stdout


# ---------------------------------------------------------------------------------------------
# Branches are in flight at the same time: they meet, with no driver in the way


def test_two_branches_meet_at_a_rendezvous_without_a_driver() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(Meet(barrier).named("x") | Meet(barrier).named("y"))
    assert g.forward(7) == {"x": 7, "y": 7}


def test_three_branches_meet_at_a_rendezvous_without_a_driver() -> None:
    barrier = threading.Barrier(3, timeout=DEADLINE)
    meets = [Meet(barrier).named(name) for name in ("x", "y", "z")]
    g = soma.Graph.somatize(Pass() >> (meets[0] | meets[1] | meets[2]))
    assert g.forward(7) == {"x": 7, "y": 7, "z": 7}


def test_branches_meet_even_deep_inside_each_branch() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    left = Add(1) >> Double() >> Meet(barrier).named("x")
    right = Add(2) >> Meet(barrier).named("y") >> Double()
    g = soma.Graph.somatize(Pass() >> (left | right) >> SumValues())
    assert g.forward(0) == (0 + 1) * 2 + (0 + 2) * 2


def test_nested_waves_meet_across_levels() -> None:
    barrier = threading.Barrier(3, timeout=DEADLINE)
    inner = Meet(barrier).named("i1") | Meet(barrier).named("i2")
    g = soma.Graph.somatize(Pass() >> ((Pass() >> inner) | Meet(barrier).named("o")))
    assert g.forward(1) == {"i1": 1, "i2": 1, "o": 1}


class Spin(soma.Node):
    """Pure-Python busy work, long enough for the interpreter to switch threads inside it."""

    def __init__(self, start: int) -> None:
        self.start = start

    def forward(self, x: int) -> int:
        total = self.start
        for i in range(x):
            total += i % 7
        return total


def test_two_pure_python_branches_give_the_right_result_although_the_gil_interleaves_them() -> None:
    n = 400_000
    g = soma.Graph.somatize(Spin(0).named("a") | Spin(1_000_000).named("b"))
    expected = sum(i % 7 for i in range(n))
    assert g.forward(n) == {"a": expected, "b": 1_000_000 + expected}


def test_two_branches_can_keep_the_driver_busy_at_the_same_time() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)

    class Meeting:
        """Serves a request only once the other branch's request is in flight too."""

        def perform(self, requests: list[Any]) -> list[Any]:
            barrier.wait()
            return [r * 10 for r in requests]

    class Ask(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return soma.Await([x]) if ctx.turn == 0 else ctx.results[0]

    g = soma.Graph.somatize(Ask().named("p") | Ask().named("q"))
    assert g.forward(4, driver=Meeting()) == {"p": 40, "q": 40}


# ---------------------------------------------------------------------------------------------
# Threads and real order


def test_a_whole_branch_runs_on_one_thread_and_two_branches_on_two() -> None:
    log = Log()
    barrier = threading.Barrier(2, timeout=DEADLINE)  # Both alive at once: idents can't repeat.
    left = Meet(barrier, log).named("a1") >> Record(log).named("a2") >> Record(log).named("a3")
    right = Meet(barrier, log).named("b1") >> Record(log).named("b2")
    soma.Graph.somatize(Pass() >> (left | right) >> Pass()).forward(0)
    left_threads = set().union(*(log.threads(n) for n in ("a1", "a2", "a3")))
    right_threads = set().union(*(log.threads(n) for n in ("b1", "b2")))
    assert len(left_threads) == 1
    assert len(right_threads) == 1
    assert left_threads != right_threads


def test_the_real_order_respects_every_edge() -> None:
    log = Log()
    ids = "a b b2 b3 c c2 d"
    a, b, b2, b3, c, c2, d = (Record(log).named(i) for i in ids.split())
    g = soma.Graph.somatize(a >> ((b >> b2 >> b3) | (c >> c2)) >> d)
    for _ in range(20):
        log.calls.clear()
        g.forward(0)
        order = log.order()
        assert sorted(order) == sorted(ids.split())
        for src, dst in g.edges():
            assert order.index(src) < order.index(dst), (src, dst, order)


def test_what_a_branch_produces_reaches_whoever_reads_it() -> None:
    g = soma.Graph.somatize(
        Add(1).named("s") >> ((Add(10) >> Double().named("l")) | Add(100).named("r")) >> Pass()
    )
    assert g.forward(0) == {"l": 22, "r": 101}


class Fn2(soma.Node):
    """The diamond's two sides and join, computed in a row by one node."""

    def forward(self, x: int) -> int:
        return x * 2 + (x + 5)


def test_a_diamonds_result_is_the_same_spread_out_as_in_a_row() -> None:
    spread = soma.Graph.somatize(Add(1) >> (Double().named("l") | Add(5).named("r")) >> SumValues())
    row = soma.Graph.somatize(Add(1) >> Fn2())
    for x in range(-3, 4):
        assert spread.forward(x) == row.forward(x)


def test_a_wave_that_is_the_whole_plan_returns_the_map_of_its_leaves() -> None:
    g = soma.Graph.somatize(Add(1).named("x") | Double().named("y") | Add(3).named("z"))
    out = g.forward(10)
    assert out == {"x": 11, "y": 20, "z": 13}
    assert list(out) == ["x", "y", "z"]


# ---------------------------------------------------------------------------------------------
# Failures in branches


class Branch(Exception):
    pass


class FailAfter(soma.Node):
    """Waits for `gate` (if any), raises its own error, then opens `opens` (if any)."""

    def __init__(
        self, error: Exception, gate: threading.Event | None, opens: threading.Event | None
    ) -> None:
        self.raised = error
        self.gate = gate
        self.opens = opens

    def forward(self, x: Any) -> Any:
        if self.gate is not None:
            assert self.gate.wait(DEADLINE), "the other branch never failed"
        if self.opens is not None:
            self.opens.set()
        raise self.raised


def test_the_first_declared_branch_error_wins_when_it_fails_first() -> None:
    first_failed = threading.Event()
    first = FailAfter(Branch("first"), gate=None, opens=first_failed).named("first")
    second = FailAfter(Branch("second"), gate=first_failed, opens=None).named("second")
    g = soma.Graph.somatize(Pass() >> (first | second))
    with pytest.raises(Branch) as excinfo:
        g.forward(0)
    assert excinfo.value is first.raised


def test_the_first_declared_branch_error_wins_even_when_it_fails_last() -> None:
    second_failed = threading.Event()
    first = FailAfter(Branch("first"), gate=second_failed, opens=None).named("first")
    second = FailAfter(Branch("second"), gate=None, opens=second_failed).named("second")
    g = soma.Graph.somatize(Pass() >> (first | second))
    with pytest.raises(Branch) as excinfo:
        g.forward(0)
    assert excinfo.value is first.raised
    assert any("`first`" in note for note in excinfo.value.__notes__)


def test_a_branch_that_succeeds_does_not_hide_a_later_branchs_error() -> None:
    failing = FailAfter(Branch("late"), gate=None, opens=None).named("late")
    g = soma.Graph.somatize(Pass() >> ((Add(1) >> Double()) | failing))
    with pytest.raises(Branch) as excinfo:
        g.forward(0)
    assert excinfo.value is failing.raised


def test_a_rust_panic_in_a_branch_is_panic_error_and_the_process_survives() -> None:
    g = soma.Graph.somatize(Pass() >> ((Add(1) >> Double()) | soma.native.Panic("in a branch")))
    with pytest.raises(soma.PanicError, match="in a branch"):
        g.forward(0)
    barrier = threading.Barrier(2, timeout=DEADLINE)
    after = soma.Graph.somatize(Meet(barrier).named("x") | Meet(barrier).named("y"))
    assert after.forward(1) == {"x": 1, "y": 1}


# ---------------------------------------------------------------------------------------------
# Ctrl-C


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import signal
    import time
    import soma

    # Whatever the parent did with SIGINT, this child turns it into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    ran = []

    class Nap(soma.Node):
        def forward(self, x, ctx):
            ran.append(ctx.node)
            if len(ran) == 1:
                print("started", flush=True)
            time.sleep(0.05)
            return x

    def chain(prefix, n):
        expr = Nap().named(prefix + "0")
        for i in range(1, n):
            expr = expr >> Nap().named(prefix + str(i))
        return expr

    class Quick(soma.Node):
        def forward(self, x):
            return x

    shape = "{shape}"
    if shape == "chain":
        expr = chain("n", 400)
    elif shape == "wave":
        expr = chain("l", 400) | chain("r", 400)
    else:
        # The calling thread's own branch ends at once; it only waits on the other, on its own
        # thread, where Python never runs signal handlers: only the engine can notice Ctrl-C.
        expr = Quick() | chain("r", 400)
    g = soma.Graph.somatize(expr)
    try:
        g.forward(0)
    except KeyboardInterrupt:
        print("caught KeyboardInterrupt after", len(ran), "nodes", flush=True)
    else:
        print("finished without interruption", flush=True)
    """
)


@pytest.mark.parametrize("shape", ["chain", "wave", "waiting"])
def test_ctrl_c_stops_a_long_forward_with_keyboard_interrupt(shape: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_SCRIPT.format(shape=shape)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killer = threading.Timer(SUBPROCESS_DEADLINE, child.kill)
    killer.start()
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        if first.strip() != "started":
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the child never started: {first!r}\n{err}")
        os.kill(child.pid, signal.SIGINT)
        out, err = child.communicate()
    finally:
        killer.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()
    assert "caught KeyboardInterrupt" in out, (out, err)
    nodes_ran = int(out.split("after")[1].split()[0])
    # Each node naps 50 ms and the whole run would take 20 s: stopping within 100 nodes (5 s)
    # is stopping at a node boundary soon after the signal, with room for a slow machine.
    assert nodes_ran < (200 if shape == "wave" else 100), out


# ---------------------------------------------------------------------------------------------
# Several Python threads calling forward on one graph


def test_concurrent_forward_calls_on_one_graph_each_get_their_own_answer() -> None:
    g = soma.Graph.somatize(Add(1) >> (Double().named("l") | Add(10).named("r")) >> SumValues())
    inputs = list(range(64))
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(g.forward, inputs))
    assert results == [(x + 1) * 2 + (x + 11) for x in inputs]


def test_concurrent_forward_calls_on_one_graph_are_in_flight_at_once() -> None:
    callers = 4
    barrier = threading.Barrier(callers, timeout=DEADLINE)
    g = soma.Graph.somatize(Add(1) >> Meet(barrier) >> Double())
    with ThreadPoolExecutor(max_workers=callers) as pool:
        results = list(pool.map(g.forward, range(callers)))
    assert results == [(x + 1) * 2 for x in range(callers)]


def test_concurrent_forward_calls_with_a_driver_each_get_their_own_answers() -> None:
    class Ask(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return soma.Await([x, -x]) if ctx.turn == 0 else tuple(ctx.results)

    g = soma.Graph.somatize(Ask())
    driver = Answer(lambda r: r * 3)
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda x: g.forward(x, driver=driver), range(32)))
    assert results == [(3 * x, -3 * x) for x in range(32)]


# ---------------------------------------------------------------------------------------------
# Threads kept from one forward to the next: each branch its own, never another's


class Where(soma.Node):
    """Records the thread it ran on and what it found in a `threading.local`, then marks it."""

    def __init__(self, local: threading.local, seen: dict[str, list[tuple[int, Any]]]) -> None:
        self.local, self.seen = local, seen

    def forward(self, x: Any, ctx: soma.Ctx) -> Any:
        found = getattr(self.local, "mark", None)
        self.seen.setdefault(ctx.node, []).append((threading.get_ident(), found))
        self.local.mark = ctx.node
        return x


def test_each_branch_runs_on_the_same_thread_in_every_forward_and_no_two_share_one() -> None:
    local, seen = threading.local(), {}
    g = soma.Graph.somatize(
        Where(local, seen).named("a")
        >> (Where(local, seen).named("b") | Where(local, seen).named("c"))
        >> Where(local, seen).named("z")
    )
    for _ in range(3):
        g.forward(0)
    threads = {node: {ident for ident, _ in visits} for node, visits in seen.items()}
    assert len(threads["b"]) == 1, threads
    assert len(threads["c"]) == 1, threads
    assert threads["a"] == threads["z"] == {threading.get_ident()}
    assert len(threads["a"] | threads["b"] | threads["c"]) == 3, threads


def test_a_threading_local_set_in_a_branch_is_seen_again_by_that_branch_and_by_no_other() -> None:
    # The branch's thread keeps its interpreter state from one forward to the next.
    local, seen = threading.local(), {}
    g = soma.Graph.somatize(Where(local, seen).named("b") | Where(local, seen).named("c"))
    for _ in range(3):
        g.forward(0)
    assert [found for _, found in seen["b"]] == [None, "b", "b"]
    assert [found for _, found in seen["c"]] == [None, "c", "c"]
    assert getattr(local, "mark", None) is None


def test_two_forwards_of_one_graph_at_once_run_all_four_branches_at_the_same_time() -> None:
    # The second forward cannot wait for the first one's branch threads: all four must meet.
    barrier = threading.Barrier(4, timeout=DEADLINE)
    g = soma.Graph.somatize(Meet(barrier).named("b") | Meet(barrier).named("c"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(g.forward, [1, 2]))
    assert results == [{"b": 1, "c": 1}, {"b": 2, "c": 2}]


def test_a_wave_of_a_thousand_python_branches_meets_and_runs_again() -> None:
    width = 1000
    barrier = threading.Barrier(width, timeout=DEADLINE)
    branches: Any = Meet(barrier).named("m0")
    for i in range(1, width):
        branches = branches | Meet(barrier).named(f"m{i}")
    g = soma.Graph.somatize(Pass() >> branches >> SumValues())
    assert g.forward(1) == width
    assert g.forward(2) == 2 * width


FORK_SCRIPT = """
import multiprocessing, sys
sys.path.insert(0, {tests!r})
import soma
from conftest import Add, Double, SumValues

def build():
    return soma.Graph.somatize(Add(1) >> (Double().named("l") | Add(10).named("r")) >> SumValues())

def child(graph, out):
    out.put(graph.forward(5))

if __name__ == "__main__":
    graph = build()
    assert graph.forward(1) == 2 * 2 + 12
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    process = context.Process(target=child, args=(graph, out))
    process.start()
    print("child", out.get(timeout={deadline}))
    process.join({deadline})
    print("exit", process.exitcode)
"""


def test_a_child_forked_after_a_forward_runs_the_graph_on_threads_of_its_own() -> None:
    # The child inherits the graph and its kept threads' bookkeeping, but not the threads.
    tests = os.path.dirname(os.path.abspath(__file__))
    done = run_script(FORK_SCRIPT.format(tests=tests, deadline=DEADLINE))
    assert done.returncode == 0, done.stderr
    assert "child 28" in done.stdout, done.stdout
    assert "exit 0" in done.stdout, done.stdout


def interpreter_thread_states() -> int:
    """How many thread states the interpreter holds, counted through CPython's C API."""
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    count, state = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
    while state:
        count, state = count + 1, api.PyThreadState_Next(state)
    return count


def settled_thread_states() -> int:
    """The count once it stops moving: threads of graphs collected earlier end on their own
    time, each giving its state back as it goes."""
    gc.collect()
    deadline = time.monotonic() + DEADLINE
    count = interpreter_thread_states()
    while time.monotonic() < deadline:
        time.sleep(0.05)  # lets ending threads take the GIL to delete their states
        count, previous = interpreter_thread_states(), count
        if count == previous:
            break
    return count


def test_a_collected_graphs_branch_threads_give_their_interpreter_states_back() -> None:
    before = settled_thread_states()
    g = soma.Graph.somatize(Add(1) >> (Double().named("l") | Add(10).named("r") | Pass()))
    for _ in range(3):
        g.forward(1)
    # One state per branch thread, kept between forwards rather than made for each.
    assert interpreter_thread_states() == before + 3
    del g
    gc.collect()
    deadline = time.monotonic() + DEADLINE
    while interpreter_thread_states() > before and time.monotonic() < deadline:
        time.sleep(0.01)  # lets the ending threads take the GIL to delete their states
    assert interpreter_thread_states() == before


EXIT_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import soma
from conftest import Add, Double, Pass

kept = soma.Graph.somatize(Add(1) >> (Double().named("l") | Add(10).named("r") | Pass()))
for _ in range(3):
    kept.forward(1)
print("ran", flush=True)
# The interpreter now exits with the graph, its branch threads and their states still alive.
"""


def test_the_interpreter_exits_cleanly_while_branch_threads_keep_their_states() -> None:
    tests = os.path.dirname(os.path.abspath(__file__))
    done = run_script(EXIT_SCRIPT.format(tests=tests))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n", done.stdout
    assert done.stderr == "", done.stderr
