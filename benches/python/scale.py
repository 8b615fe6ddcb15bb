"""The nested graph at one size, in a fresh process; prints one JSON object.

    .venv/bin/python benches/python/scale.py --nodes=10000 [--repeat=5 ...] [--skip-dask=WHY]

bench.py runs it once per size. A fresh process because two of its figures only exist once per
process: a user's first forward (the graph just built, its plan not compiled, no thread of its
own yet, its nodes never called) and the threads the process holds, which any graph or peer run
before would have added to.

In order: the graph is built, and its first forward timed on its own, compile included, as a
user who builds a graph and calls it pays; a second graph, built the same way and never run, has
``plan()`` timed, first and cached (its first call comes after the first graph's compile, so
the compiler's code is warm); Soma then runs alone for a while and the threads are counted,
before any peer has started one of its own; last, Soma's steady forwards, the plain loop, the
waves run by hand on a ``ThreadPoolExecutor(8)`` and Dask's threaded scheduler are timed side by
side.
"""

from __future__ import annotations

import os

# Before numpy is first imported (workloads imports it), as in bench.py: one thread per BLAS
# call, and no idle BLAS threads in the thread count.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import peers
import workloads
from figures import NESTED_DASK as DASK
from figures import NESTED_LOOP as LOOP
from figures import NESTED_SOMA as SOMA
from figures import NESTED_WAVES as WAVES
from timing import compare

# The pool the waves are run on by hand: wider than the graph (4) and its nesting need.
POOL_THREADS = 8


def os_threads() -> int:
    """Every thread of this process, whoever started it: Soma's, Python's and the main one."""
    return len(os.listdir("/proc/self/task"))


def measure(
    nodes: int, *, repeat: int, sample_s: float, warmup_s: float, skip_dask: str
) -> dict[str, Any]:
    threads_at_start = os_threads()
    workload = workloads.nested(nodes // workloads.BLOCK_NODES)
    start = time.perf_counter()
    graph = workload.soma_graph()
    build_s = time.perf_counter() - start

    # A user's first forward: the graph just built, its plan not yet compiled. It compiles the
    # plan, resolves the program, its first wave takes the thread Soma keeps in reserve, and
    # nothing has called the nodes yet, not even the loop.
    start = time.perf_counter()
    first = graph.forward(workload.input)
    first_forward_s = time.perf_counter() - start
    expected = workload.loop(workload.input)
    assert first == expected, f"Soma computed {first!r}, the loop {expected!r}"
    plan = graph.plan()

    # `plan()` on a graph of its own, built the same way and never run: the first call compiles.
    planned = workload.soma_graph()
    start = time.perf_counter()
    planned_plan = planned.plan()
    plan_first_s = time.perf_counter() - start
    # The second call of the same graph: what asking for the plan again costs once compiled.
    start = time.perf_counter()
    again = planned.plan()
    plan_cached_s = time.perf_counter() - start
    assert again == planned_plan == plan
    # Later calls, each timed on its own: the second one above pays for something the rest do
    # not (by a few µs, measured when this was written).
    later = []
    for _ in range(101):
        start = time.perf_counter()
        planned.plan()
        later.append(time.perf_counter() - start)
    del planned, planned_plan, again  # Never run: it holds no thread.

    # Soma alone for a while, so that the threads counted are its own (and the main thread):
    # the pool and Dask below start threads of their own.
    deadline = time.perf_counter() + warmup_s
    forwards = 0
    while forwards < 3 or time.perf_counter() < deadline:
        graph.forward(workload.input)
        forwards += 1
    held_after_soma = graph.threads()
    threads_after_soma = os_threads()

    pool = ThreadPoolExecutor(POOL_THREADS)
    waves, waves_setup_s = peers.wave_runner(workload, plan, pool)
    runners: dict[str, Callable[[], Any]] = {
        SOMA: lambda: graph.forward(workload.input),
        LOOP: lambda: workload.loop(workload.input),
        WAVES: waves,
    }
    setups = {WAVES: waves_setup_s}
    dask_note = skip_dask
    if not dask_note:
        try:
            import dask  # noqa: F401 -- only whether it is there
        except ImportError:
            dask_note = "dask is not installed (`make bench` installs it)"
    if not dask_note:
        runners[DASK], setups[DASK] = peers.dask_runner(workload, "threads")
    for name, fn in runners.items():
        got = workloads.canonical(fn())
        assert got == expected, f"{name} computed {got!r}, the loop {expected!r}"
    try:
        timings = compare(runners, repeat=repeat, sample_s=sample_s, warmup_s=warmup_s)
    finally:
        pool.shutdown()
    return {
        "nodes": nodes,
        "timings": {name: dataclasses.asdict(t) for name, t in timings.items()},
        "setup_s": setups,
        "dask_note": dask_note,
        "build_s": build_s,
        "plan_first_s": plan_first_s,
        "plan_cached_s": plan_cached_s,
        "plan_later_s": statistics.median(later),
        "first_forward_s": first_forward_s,
        # The most the graph held: after Soma's forwards alone, and after the timed ones.
        "threads_held": max(held_after_soma, graph.threads()),
        "os_threads_at_start": threads_at_start,
        "os_threads": threads_after_soma,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True, help="a multiple of 8")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sample-s", type=float, default=0.01)
    parser.add_argument("--warmup-s", type=float, default=0.05)
    parser.add_argument("--skip-dask", default="", help="leave Dask out, for this reason")
    args = parser.parse_args()
    if args.nodes <= 0 or args.nodes % workloads.BLOCK_NODES:
        parser.error(f"--nodes must be a positive multiple of {workloads.BLOCK_NODES}")
    report = measure(
        args.nodes,
        repeat=args.repeat,
        sample_s=args.sample_s,
        warmup_s=args.warmup_s,
        skip_dask=args.skip_dask,
    )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
