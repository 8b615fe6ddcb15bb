"""The threads around a graph: callers and the threads a graph lends its waves.

Several Python threads may call ``forward`` on one graph at once, each getting its own answer.
The calling thread runs the first branch of a wave itself; the graph lends threads to the
others, as many as are in flight at once, keeps a few idle ones, and lets them all go — their
interpreter states with them — when it is dropped or collected, even from a reference cycle.
A refused thread is an error, not a crash; neither ``fork`` nor the interpreter's exit trips
over the threads.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import soma
from conftest import (
    DEADLINE,
    SUBPROCESS_DEADLINE,
    Add,
    Answer,
    Double,
    Meet,
    Pass,
    SumValues,
    reserve_settled,
    run_script,
)

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
# Threads lent to branches: as many as are in flight, never one per branch


class Where(soma.Node):
    """Records the thread it ran on."""

    def __init__(self, seen: dict[str, list[int]]) -> None:
        self.seen = seen

    def forward(self, x: Any, ctx: soma.Ctx) -> Any:
        self.seen.setdefault(ctx.node, []).append(threading.get_ident())
        return x


class MeetWhere(Where):
    """Records its thread, then meets the other parties of a barrier."""

    def __init__(self, seen: dict[str, list[int]], barrier: threading.Barrier) -> None:
        super().__init__(seen)
        self.barrier = barrier

    def forward(self, x: Any, ctx: soma.Ctx) -> Any:
        super().forward(x, ctx)
        self.barrier.wait()
        return x


def soma_threads() -> set[int]:
    """Soma's own threads in this process, by native id: those whose name the system gives as
    ``soma-…`` (lent threads and the reserve's are ``soma-worker``). Counting these, not every
    thread, leaves out what else the process runs; comparing sets, not counts, leaves out the
    threads of graphs dropped earlier, which end on their own time."""
    found = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                name = comm.read().strip()
        except FileNotFoundError:  # It ended meanwhile.
            continue
        if name.startswith("soma-"):
            found.add(int(task))
    return found


def soma_threads_now() -> set[int]:
    """:func:`soma_threads` once a thread waits in Soma's reserve: a reserve taken by an earlier
    graph is refilled when its thread has nothing left to do, which may be later."""
    gc.collect()
    reserve_settled()
    return soma_threads()


class First(soma.Node):
    """Passes on the first of several inputs."""

    def forward(self, x: dict[str, Any]) -> Any:
        return next(iter(x.values()))


def nested_blocks(blocks: int) -> soma.Graph:
    """``a >> ((b >> c) | d | (e >> (f | g))) >> h``, chained ``blocks`` times."""
    expr: Any = None
    for k in range(blocks):
        p = Pass
        block = (
            p().named(f"a{k}")
            >> (
                (p().named(f"b{k}") >> p().named(f"c{k}"))
                | p().named(f"d{k}")
                | (p().named(f"e{k}") >> (p().named(f"f{k}") | p().named(f"g{k}")))
            )
            >> First().named(f"h{k}")
        )
        expr = block if expr is None else expr >> block
    return soma.Graph.somatize(expr)


def meeting_wave(width: int, deadline: float = DEADLINE) -> Any:
    """``width`` branches that all meet, so that the graph needs a thread for each."""
    barrier = threading.Barrier(width, timeout=deadline)
    branches: Any = Meet(barrier).named("m0")
    for i in range(1, width):
        branches = branches | Meet(barrier).named(f"m{i}")
    return branches


def test_the_calling_thread_runs_the_first_branch_of_a_wave_itself() -> None:
    seen: dict[str, list[int]] = {}
    g = soma.Graph.somatize(
        Where(seen).named("a") >> (Where(seen).named("b") | Where(seen).named("c"))
    )
    g.forward(0)
    assert seen["a"] == seen["b"] == [threading.get_ident()]


def test_branches_in_flight_at_once_run_on_different_threads() -> None:
    seen: dict[str, list[int]] = {}
    barrier = threading.Barrier(3, timeout=DEADLINE)
    g = soma.Graph.somatize(
        MeetWhere(seen, barrier).named("b")
        | MeetWhere(seen, barrier).named("c")
        | MeetWhere(seen, barrier).named("d")
    )
    g.forward(0)
    assert len({seen[n][0] for n in "bcd"}) == 3, seen


def test_a_graph_of_a_thousand_waves_holds_threads_for_what_runs_at_once_not_per_branch() -> None:
    before = soma_threads_now()
    g = nested_blocks(250)  # 2,000 nodes, 500 waves, 1,250 branches
    assert g.forward(1) == 1
    assert g.forward(2) == 2
    # The widest point of this graph is four branches at once.
    assert g.threads() <= 4, g.threads()
    # What the process started since: the graph's threads, and the reserve's next one if the
    # graph took the thread waiting there.
    assert len(soma_threads_now() - before) <= g.threads() + 1


def test_a_wave_of_ten_thousand_branches_runs_on_a_handful_of_threads() -> None:
    g = soma.Graph()
    g.node("source", Pass())
    for i in range(10_000):
        g.node(f"b{i}", Add(i))
        g.edge("source", f"b{i}")
    # Quick branches under the GIL: one thread runs at a time. A thread the interpreter
    # preempts in the middle of a branch would count as busy, and a claim would send for more
    # (8 seen once, at a load average of 4): how many, the machine's load would say. With no
    # preemption, what this counts is the engine's alone: the calling thread and a couple of
    # helpers, as the guide says.
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1_000)
    try:
        out = g.forward(0)
    finally:
        sys.setswitchinterval(switching)
    assert len(out) == 10_000
    assert out["b9999"] == 9_999
    assert g.threads() <= 4, g.threads()


def test_idle_threads_beyond_the_graphs_limit_end() -> None:
    g = soma.Graph.somatize(meeting_wave(32))
    assert g.idle_threads == 64
    g.idle_threads = 3
    g.forward(1)
    deadline = time.monotonic() + DEADLINE
    while g.threads() > 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert g.threads() <= 3, g.threads()


def test_two_forwards_of_one_graph_at_once_run_all_four_branches_at_the_same_time() -> None:
    # The second forward cannot wait for the first one's branch threads: all four must meet.
    barrier = threading.Barrier(4, timeout=DEADLINE)
    g = soma.Graph.somatize(Meet(barrier).named("b") | Meet(barrier).named("c"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(g.forward, [1, 2]))
    assert results == [{"b": 1, "c": 1}, {"b": 2, "c": 2}]


def test_a_wave_of_a_thousand_python_branches_meets_and_runs_again() -> None:
    width = 1000
    # A thousand threads started on a loaded 2-core machine: a deadline, not a time to meet.
    g = soma.Graph.somatize(Pass() >> meeting_wave(width, SUBPROCESS_DEADLINE) >> SumValues())
    assert g.forward(1) == width
    assert g.forward(2) == 2 * width


FORK_SCRIPT = """
import multiprocessing, sys, threading
sys.path.insert(0, {tests!r})
import soma
from conftest import Add, Double, Meet, SumValues

# Both branches meet before they answer: a run needs a second thread, in the child too, where
# the parent's threads are counted but absent.
both_in = threading.Barrier(2, timeout={deadline})

def build():
    return soma.Graph.somatize(
        Add(1)
        >> ((Meet(both_in) >> Double()) | (Meet(both_in) >> Add(10)))
        >> SumValues()
    )

def child(graph, out):
    both_in.reset()
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


STATES_SCRIPT = """
import ctypes, gc, sys, threading, time
sys.path.insert(0, {tests!r})
import soma
from conftest import Add, Meet

def thread_states():
    # How many thread states the interpreter holds, counted through CPython's C API.
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

def eventually(check):
    deadline = time.monotonic() + {deadline}
    while not check():
        assert time.monotonic() < deadline, thread_states()
        time.sleep(0.005)

# A fresh interpreter: no graph ran here before, so no thread of one ends meanwhile.
eventually(soma._soma._thread_in_reserve)
before = thread_states()
barrier = threading.Barrier(3, timeout={deadline})
g = soma.Graph.somatize(Add(1) >> (Meet(barrier).named("a") | Meet(barrier).named("b")
                                   | Meet(barrier).named("c")))
for _ in range(3):
    g.forward(1)
eventually(soma._soma._thread_in_reserve)
print("held", thread_states() - before, g.threads(), flush=True)
del g
gc.collect()
eventually(lambda: thread_states() <= before)
print("left", thread_states() - before, flush=True)
"""


def test_a_collected_graphs_threads_give_their_interpreter_states_back() -> None:
    tests = os.path.dirname(os.path.abspath(__file__))
    done = run_script(STATES_SCRIPT.format(tests=tests, deadline=DEADLINE))
    assert done.returncode == 0, done.stderr
    # One state per lent thread, kept between forwards rather than made for each; none left
    # once the graph is collected.
    assert done.stdout.splitlines() == ["held 2 2", "left 0"], done.stdout


class KeepsItsGraph(soma.Node):
    """A node that keeps the graph it is in, as a model that calls itself would."""

    graph: soma.Graph | None = None

    def forward(self, x: Any) -> Any:
        return x


def test_graphs_kept_by_their_own_nodes_are_collected_threads_and_all() -> None:
    before = soma_threads_now()
    for _ in range(20):
        keeper = KeepsItsGraph()
        g = soma.Graph.somatize(keeper >> meeting_wave(3))
        keeper.graph = g
        g.forward(1)
        assert g.threads() == 2
    del g, keeper
    gc.collect()
    # Every thread the twenty graphs started ends, but the reserve's next one, if the first
    # graph took the thread waiting there.
    deadline = time.monotonic() + DEADLINE
    while len(soma_threads() - before) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(soma_threads() - before) <= 1, soma_threads() - before


DROP_SCRIPT = """
import ctypes, sys, threading, time
sys.path.insert(0, {tests!r})
import soma
from conftest import Meet

def thread_states():
    # Through ctypes.pythonapi, which keeps the GIL: counting lets no thread end meanwhile.
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

barrier = threading.Barrier(200, timeout={deadline})
branches = Meet(barrier).named("m0")
for i in range(1, 200):
    branches = branches | Meet(barrier).named(f"m{{i}}")
before = thread_states()
g = soma.Graph.somatize(branches)
g.idle_threads = 1000
g.forward(1)
held = thread_states()
print("lent", held - before, flush=True)
# From here to the count, this thread keeps the GIL: a lent thread needs it to delete its
# thread state and end, so none can end before the count. A drop that waited for its threads
# would wait forever (with the GIL) or let them all end (without it).
sys.setswitchinterval(1000)
del g
left = thread_states()
sys.setswitchinterval(0.005)
print("left when the drop returned", held - left, flush=True)
deadline = time.monotonic() + {deadline}
while thread_states() > before and time.monotonic() < deadline:
    time.sleep(0.01)  # lets the ending threads take the GIL to delete their states
print("ended", thread_states() == before, flush=True)
"""


def test_dropping_a_graph_with_many_threads_returns_before_they_end_and_they_end() -> None:
    # In a subprocess: a drop that joined its threads while holding the GIL would hang.
    tests = os.path.dirname(os.path.abspath(__file__))
    done = run_script(DROP_SCRIPT.format(tests=tests, deadline=DEADLINE))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [
        "lent 199",
        "left when the drop returned 0",
        "ended True",
    ], done.stdout + done.stderr[-2000:]


def test_a_thread_the_system_refuses_is_a_runtime_error_and_the_graph_stays_usable() -> None:
    g = soma.Graph.somatize(Add(1) >> (Double().named("l") | Add(10).named("r")) >> SumValues())
    g._core._refuse_next_threads(1)
    with pytest.raises(soma.ThreadError, match="refused") as raised:
        g.forward(1)
    assert isinstance(raised.value, RuntimeError)
    assert g.forward(1) == 2 * 2 + 12


RESERVE_SCRIPT = """
import os, sys, threading, time
import soma

def threads():
    return {{int(task) for task in os.listdir("/proc/self/task")}}

def eventually(check):
    deadline = time.monotonic() + {deadline}
    while not check():
        assert time.monotonic() < deadline, sorted(threads())
        time.sleep(0.005)

main = threading.get_native_id()
eventually(lambda: len(threads()) == 2)
(reserve,) = threads() - {{main}}
barrier = threading.Barrier(2, timeout={deadline})
ran_on = {{}}

class Meet(soma.Node):
    def forward(self, x, ctx):
        ran_on[ctx.node] = threading.get_native_id()
        barrier.wait()
        return x

g = soma.Graph.somatize(Meet().named("a") | Meet().named("b"))
g.forward(0)
print(sorted(ran_on.values()) == sorted([main, reserve]), flush=True)
eventually(lambda: len(threads() - {{main, reserve}}) == 1)
print("refilled", g.threads(), flush=True)
"""


def test_importing_soma_keeps_a_thread_in_reserve_that_the_first_wave_takes() -> None:
    # In a fresh interpreter: the reserve is one per process, and this suite's graphs take it.
    done = run_script(RESERVE_SCRIPT.format(deadline=DEADLINE))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True\nrefilled 1\n", done.stdout


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


STACK_SCRIPT = """
import ctypes, json, pickle, sys, threading
sys.path.insert(0, {tests!r})
import soma

sys.setrecursionlimit(1_000_000)
if {asked}:
    threading.stack_size({asked})


def pickles(depth):
    # C-level recursion as deep as the structure: it needs a real thread's stack.
    deep = []
    for _ in range(depth):
        deep = [deep]
    try:
        return len(pickle.dumps(deep)) > 0
    except RecursionError:
        return False


def deepest_pickled(most):
    # `most` where only the stack bounds C recursion (3.11); fewer where CPython raises
    # RecursionError at a fixed count of C calls on every thread (3.12, 3.13), found by halving.
    if pickles(most):
        return most
    low, high = 0, most - 1
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if pickles(middle) else (low, middle - 1)
    return low


def stack_bytes():
    # The calling thread's stack, as the C library allocated it (glibc's pthread_getattr_np).
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_ulong
    attr = ctypes.create_string_buffer(256)
    assert libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) == 0
    size = ctypes.c_size_t()
    assert libc.pthread_attr_getstacksize(attr, ctypes.byref(size)) == 0
    libc.pthread_attr_destroy(attr)
    return size.value


python_thread = {{}}
measure = lambda: python_thread.update(depth=deepest_pickled({most}), stack=stack_bytes())
thread = threading.Thread(target=measure)
thread.start()
thread.join()
meet = threading.Barrier(2, timeout=30)


class Wait(soma.Node):
    def forward(self, x):
        meet.wait()
        return threading.get_ident()


class Pickle(soma.Node):
    def forward(self, x):
        meet.wait()
        depth = python_thread["depth"]
        return dict(depth=depth, pickled=pickles(depth), stack=stack_bytes()), threading.get_ident()


# `Wait` holds the calling thread, so `Pickle` runs on a thread the graph lends.
g = soma.Graph.somatize(Wait().named("wait") | Pickle().named("pickle"))
out = g.forward(0)
assert out["pickle"][1] != out["wait"] == threading.get_ident()
print(json.dumps(dict(python_thread=python_thread, lent=out["pickle"][0])), flush=True)
"""


def stacks(asked: int, most: int) -> tuple[dict[str, int], dict[str, int]]:
    """What a `threading.Thread` and then a lent thread measured, in a child, with
    `threading.stack_size(asked)` (0: not called): the deepest structure of at most `most`
    levels the first pickles and each one's stack in bytes; whether the lent thread pickled it."""
    tests = os.path.dirname(os.path.abspath(__file__))
    done = run_script(STACK_SCRIPT.format(tests=tests, asked=asked, most=most))
    assert done.returncode == 0, done.stderr[-2000:]
    measured = json.loads(done.stdout)
    return measured["python_thread"], measured["lent"]


# How deep C code may recurse depends on the version. On 3.11 only the stack bounds it (with the
# recursion limit raised): 20,000 levels of pickling overflow a 2 MiB stack and fit in 8 MiB, and
# 50,000 need more than 8 MiB. From 3.12 on CPython raises RecursionError at a fixed count of C
# calls, the same on every thread whatever its stack (about 5,000 levels of this pickling on 3.13),
# so there both threads stop at that count; the stacks themselves are then compared directly.


def test_a_lent_thread_has_the_stack_a_python_thread_has() -> None:
    python_thread, lent = stacks(asked=0, most=20_000)
    assert lent["stack"] >= python_thread["stack"], (lent, python_thread)
    assert lent["pickled"], (lent, python_thread)
    if sys.version_info < (3, 12):
        assert python_thread["depth"] == 20_000, python_thread


def test_a_lent_thread_honours_threading_stack_size() -> None:
    python_thread, lent = stacks(asked=128 << 20, most=50_000)
    assert lent["stack"] >= 128 << 20, lent
    assert lent["pickled"], (lent, python_thread)
    if sys.version_info < (3, 12):
        assert python_thread["depth"] == 50_000, python_thread
