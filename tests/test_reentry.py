"""Forwards inside forwards: may a node call its own graph's ``forward``, or another graph's,
and get the right answer — on the caller's thread and on a thread a wave lends? Does nesting
without end stop with ``RecursionError`` at ``soma.MAX_NESTED_FORWARDS``, with the process
healthy, every graph usable and the lent threads given back?

Unbounded nesting runs in a subprocess with a deadline: a regression there overflows a thread's
stack (a crash) or never ends.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import soma
from conftest import DEADLINE, run_script

TESTS = os.path.dirname(os.path.abspath(__file__))


class Countdown(soma.Node):
    """``n + forward(n - 1)`` of the graph it is given, down to 0: the triangular number."""

    graph: soma.Graph

    def forward(self, n: int) -> int:
        return n if n == 0 else n + self.graph.forward(n - 1)


def test_a_node_calls_its_own_graphs_forward_200_levels_deep_for_the_right_answer() -> None:
    down = Countdown()
    g = soma.Graph.somatize(down.named("down"))
    down.graph = g
    assert g.forward(200) == 200 * 201 // 2
    assert g.forward(3) == 6  # And the graph runs on as before.


def test_two_graphs_call_each_others_forward_for_the_right_answer() -> None:
    even, odd = Countdown(), Countdown()
    g_even = soma.Graph.somatize(even.named("even"))
    g_odd = soma.Graph.somatize(odd.named("odd"))
    even.graph, odd.graph = g_odd, g_even
    assert g_even.forward(150) == 150 * 151 // 2


class Side(soma.Node):
    def forward(self, n: int) -> int:
        return -1


def test_a_node_in_a_wave_branch_calls_its_own_graphs_forward_for_the_right_answer() -> None:
    down = Countdown()
    g = soma.Graph.somatize(Side().named("side") | down.named("down") >> soma.native.Identity())
    down.graph = soma.Graph.somatize(down.named("down"))
    assert g.forward(100) == {"side": -1, "identity": 100 * 101 // 2}

    class Wave(soma.Node):
        def forward(self, n: int) -> int:
            return n if n == 0 else n + wave.forward(n - 1)["wave"]

    wave = soma.Graph.somatize(Side().named("side") | Wave().named("wave"))
    assert wave.forward(100) == {"side": -1, "wave": 100 * 101 // 2}


class Levels:
    """One event per level: set when that level's recursing branch has started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[int, threading.Event] = {}

    def __getitem__(self, level: int) -> threading.Event:
        with self._lock:
            return self._events.setdefault(level, threading.Event())


def recursion_on_lent_threads(levels: Levels) -> soma.Graph:
    """``hold | down``: at each level, ``hold`` keeps the thread that runs the level until
    ``down`` has started, so ``down`` — which recurses — runs on a thread the wave lends."""

    class Hold(soma.Node):
        def forward(self, n: int) -> int:
            assert levels[n].wait(DEADLINE), f"level {n}: `down` never started"
            return 0

    class Down(soma.Node):
        def forward(self, n: int) -> Any:
            levels[n].set()
            return (
                [threading.get_ident()]
                if n == 0
                else [threading.get_ident(), *g.forward(n - 1)["pick"]]
            )

    g = soma.Graph.somatize(Hold().named("hold") | Down().named("down") >> Pick())
    return g


class Pick(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


def test_a_branch_on_a_lent_thread_recurses_through_forward_each_level_on_a_thread_of_its_own() -> (
    None
):
    g = recursion_on_lent_threads(Levels())
    out = g.forward(20)
    assert out["hold"] == 0
    threads = out["pick"]
    assert len(threads) == 21
    assert len(set(threads)) == 21  # Every level held its thread while the next one ran.
    assert threading.get_ident() not in threads


UNBOUNDED = """
import sys, threading, time
sys.path.insert(0, {tests!r})
import soma
{setup}
try:
    g.forward(0)
except RecursionError as error:
    print(str(error).splitlines()[0], flush=True)
    assert "\\nhint: " in str(error)
    assert set(error.__notes__) == {{"raised in soma node `down`"}}, error.__notes__[:3]
# The graph runs again, and every thread it lent ends once it keeps none idle.
{again}
g.idle_threads = 0
deadline = time.monotonic() + 30
while g.threads() and time.monotonic() < deadline:
    time.sleep(0.01)
print("threads", g.threads(), flush=True)
"""


def test_unbounded_reentry_on_one_thread_raises_recursion_error_at_the_documented_depth() -> None:
    # Python's own limit raised far beyond the stack: Soma's is what stops the recursion.
    setup = """
sys.setrecursionlimit(10**6)


class Down(soma.Node):
    def forward(self, n):
        return g.forward(n + 1)


g = soma.Graph.somatize(Down().named("down"))
"""
    again = "assert soma.Graph.somatize(soma.native.Add(1)).forward(1) == 2"
    done = run_script(UNBOUNDED.format(tests=TESTS, setup=setup, again=again))
    assert done.returncode == 0, done.stderr[-2000:]
    first = f"`forward` nested {soma.MAX_NESTED_FORWARDS + 1} deep: a node calls a graph's"
    assert done.stdout.startswith(first), done.stdout
    assert done.stdout.endswith("\nthreads 0\n"), done.stdout


def test_unbounded_reentry_across_lent_threads_raises_recursion_error_and_gives_threads_back() -> (
    None
):
    # Each level on a fresh thread, where Python's recursion count starts again at 0: only the
    # depth the run carries from thread to thread can stop it.
    setup = """
threading.stack_size(512 << 10)
events = {{}}
lock = threading.Lock()


def event(n):
    with lock:
        return events.setdefault(n, threading.Event())


class Hold(soma.Node):
    def forward(self, n):
        assert event(n).wait(30), n
        return 0


class Down(soma.Node):
    recurse = True

    def forward(self, n):
        event(n).set()
        return g.forward(n + 1) if self.recurse else n


g = soma.Graph.somatize(Hold().named("hold") | Down().named("down"))
"""
    again = """
events.clear()
Down.recurse = False
assert g.forward(5) == {"hold": 0, "down": 5}
"""
    done = run_script(UNBOUNDED.format(tests=TESTS, setup=setup.format(), again=again))
    assert done.returncode == 0, done.stderr[-2000:]
    first = f"`forward` nested {soma.MAX_NESTED_FORWARDS + 1} deep: a node calls a graph's"
    assert done.stdout.startswith(first), done.stdout
    assert done.stdout.endswith("\nthreads 0\n"), done.stdout
