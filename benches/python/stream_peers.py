"""One runner of the streams benchmark's peer tables, alone in this process.

    .venv/bin/python benches/python/stream_peers.py RUNNER WORKLOAD ITEMS REPEATS

Runs ITEMS items through the 4 stages of WORKLOAD with RUNNER, REPEATS times, and prints one
line of JSON: the best time (what each runner sets up before its first item — a graph, a pool,
a cluster and Ray Data's actors — left out), the resident memory of this process and every
process it started when the stages were ready (``start_kib``) and at its highest while they ran
(``peak_kib``, sampled every 5 ms), or ``error`` saying why the runner did not run. A process of
its own per runner, so that one's peak is not another's, and so that Ray's processes (a cluster
started here, with an actor per stage) are counted and then gone.

Runners: ``loop`` (a loop of ``forward``), ``thread_pool`` (``ThreadPoolExecutor.map`` over
``forward``, a thread per stage), ``dask`` (``dask.bag``, one ``map`` per stage, a partition
per item, threaded), ``ray_data`` (Ray Data, one ``map_batches`` per stage on an actor of its
own, a block per item, batches of one), ``map`` (``g.map``, its default bound) and ``map_8``
(``g.map`` holding 8 items at most).

Ray Data starts its stages' actor pools each time a dataset runs, and there is no pool to keep
from one run to the next: each of its runs streams one item more than ITEMS, and is timed from
its first item out (every pool started by then) to its last. That leaves out, besides the
pools' start, the first item's trip through the stages, which the other runners' times include
(about 3 stage-times of the ITEMS + 3 a pipeline takes).

Workloads: ``sleep`` (10 ms that release the GIL a stage), ``numpy`` (BLAS products at one BLAS
thread), ``payload`` (the first stage makes a 1 MiB array from the item, the next two make new
arrays from it, the last sums it: what is held in flight shows in the memory).
"""

from __future__ import annotations

import os

# One BLAS thread per stage: the stages are the parallelism being measured.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import soma

STAGES = 4
STAGE_S = 0.010
PAYLOAD_ROWS = 131_072  # float64: 1 MiB
MATRIX = np.random.default_rng(0).standard_normal((160, 160)) / 16


def sleep_stage(x: Any) -> Any:
    time.sleep(STAGE_S)
    return x


def numpy_stage(x: Any) -> Any:
    m = MATRIX
    for _ in range(6):
        m = m @ MATRIX
    return x


def make(x: Any) -> Any:
    return np.full(PAYLOAD_ROWS, float(x))


def scale(a: Any) -> Any:
    return a * 1.5


def shift(a: Any) -> Any:
    return a + 1.0


def total(a: Any) -> Any:
    return float(a.sum())


WORKLOADS: dict[str, list[Callable[[Any], Any]]] = {
    "sleep": [sleep_stage] * STAGES,
    "numpy": [numpy_stage] * STAGES,
    "payload": [make, scale, shift, total],
}


class Stage(soma.Node):
    def __init__(self, body: Callable[[Any], Any]) -> None:
        self.body = body

    def forward(self, x: Any) -> Any:
        return self.body(x)


def graph(stages: list[Callable[[Any], Any]]) -> soma.Graph:
    expr: Any = Stage(stages[0]).named("s0")
    for at, body in enumerate(stages[1:], start=1):
        expr = expr >> Stage(body).named(f"s{at}")
    return soma.Graph.somatize(expr)


def tree_rss_kib(root: int) -> int:
    """Resident memory of `root` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            statm = (entry / "statm").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name may hold spaces and parentheses: the fields follow the last ')'.
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        pid = int(entry.name)
        children.setdefault(parent, []).append(pid)
        rss[pid] = int(statm.split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    total_kib, pending = 0, [root]
    while pending:
        pid = pending.pop()
        total_kib += rss.get(pid, 0)
        pending.extend(children.get(pid, []))
    return total_kib


class Peak:
    """The highest resident memory of this process tree while it is open."""

    def __init__(self) -> None:
        self.kib = tree_rss_kib(os.getpid())
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.kib = max(self.kib, tree_rss_kib(os.getpid()))

    def close(self) -> int:
        self._done.set()
        self._thread.join()
        return max(self.kib, tree_rss_kib(os.getpid()))


def prepare(runner: str, stages: list[Callable[[Any], Any]], items: int) -> Callable[[], Any]:
    """What runs the items once, its setup (a graph, a pool, a cluster) done; Ray Data's
    returns the seconds it took, its pools' start left out."""
    if runner == "loop":
        g = graph(stages)
        return lambda: sum(1 for x in range(items) if g.forward(x) is not None)
    if runner == "thread_pool":
        g = graph(stages)
        pool = ThreadPoolExecutor(max_workers=STAGES)
        return lambda: sum(1 for out in pool.map(g.forward, range(items)) if out is not None)
    if runner == "map":
        g = graph(stages)
        return lambda: sum(1 for out in g.map(range(items)) if out is not None)
    if runner == "map_8":
        g = graph(stages)
        return lambda: sum(1 for out in g.map(range(items), in_flight=8) if out is not None)
    if runner == "dask":
        import dask.bag

        def run_dask() -> int:
            bag = dask.bag.from_sequence(range(items), npartitions=items)
            for stage in stages:
                bag = bag.map(stage)
            return len(bag.compute(scheduler="threads", num_workers=STAGES))

        return run_dask
    if runner == "ray_data":
        return prepare_ray(stages, items)
    raise ValueError(f"unknown runner {runner!r}")


class Timed(float):
    """The seconds a run took by its own clock, setup it cannot keep between runs left out."""


def prepare_ray(stages: list[Callable[[Any], Any]], items: int) -> Callable[[], Any]:
    import logging

    import ray
    import ray.data

    # A cluster of its own ("local"), never one another process left running on this machine;
    # logical CPUs for the stages' actors (a quarter each), whatever the cores.
    ray.init(
        address="local",
        num_cpus=STAGES,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
    )
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)

    def actor_of(body: Callable[[Any], Any]) -> type:
        class Apply:
            """One stage on an actor of its own: a batch of one item in, one out."""

            def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
                out = [body(x) for x in batch["item"]]
                return {"item": np.stack(out) if isinstance(out[0], np.ndarray) else out}

        return Apply

    def run_ray() -> Timed:
        # One item more than timed: its coming out says every stage's pool has started.
        data = ray.data.from_items(list(range(items + 1)), override_num_blocks=items + 1)
        for body in stages:
            data = data.map_batches(
                actor_of(body),
                batch_size=1,
                compute=ray.data.ActorPoolStrategy(size=1),
                num_cpus=1 / STAGES,
                zero_copy_batch=True,
            )
        batches = iter(data.iter_batches(batch_size=None))
        first = len(next(batches)["item"])
        started = time.perf_counter()
        # Rows, not batches: Ray may hand several items back in one batch.
        rest = sum(len(batch["item"]) for batch in batches)
        seconds = time.perf_counter() - started
        if first + rest != items + 1:
            raise SystemExit(f"ray_data handed back {first + rest} of {items + 1} items")
        return Timed(seconds)

    return run_ray


def main() -> None:
    runner, workload, items, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    try:
        run = prepare(runner, WORKLOADS[workload], items)
    except ImportError as missing:
        print(json.dumps({"error": f"not installed ({missing.name})"}))
        return
    peak = Peak()
    start_kib = peak.kib
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        out = run()
        seconds = time.perf_counter() - started
        best = min(best, out if isinstance(out, Timed) else seconds)
        # Checked after the clock stopped: every runner counts the items it handed back (Ray
        # Data checks its own, its first item left out of the time).
        if not isinstance(out, Timed) and out != items:
            raise SystemExit(f"{runner} handed back {out} of {items} items")
    print(json.dumps({"seconds": best, "start_kib": start_kib, "peak_kib": peak.close()}))
    if "ray" in sys.modules:
        # Its cluster's processes would outlive this one for a while, and skew what runs next.
        sys.modules["ray"].shutdown()


if __name__ == "__main__":
    main()
