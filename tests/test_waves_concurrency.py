"""CU9's Python questionnaire: a wave's branches run at the same time.

The engine releases the GIL (proven in a subprocess, where a hang is caught by a deadline),
branches really are in flight together (proven by rendezvous, never by sleeping and
measuring), a whole branch runs on one thread, and the real order respects every edge.
"""

from __future__ import annotations

import textwrap
import threading
from typing import Any

import soma
from conftest import DEADLINE, Add, Double, Log, Meet, Pass, Record, SumValues, run_script

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
