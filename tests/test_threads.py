"""The threads around a graph: callers and the threads a graph keeps.

Several Python threads may call ``forward`` on one graph at once, each getting its own answer.
A graph keeps one thread per branch from one forward to the next, its interpreter state
(``threading.local``) with it, never lent to another branch; the threads give their states back
when the graph is collected, and neither ``fork`` nor the interpreter's exit trips over them.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import soma
from conftest import DEADLINE, Add, Answer, Double, Meet, Pass, SumValues, run_script

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
