"""The same workloads on other machinery: a thread pool and Dask, each written the plain way.

Every runner is built once (pool started, delayed graph constructed) and returned as a
zero-argument callable; only that call is timed. What building cost is returned beside it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from workloads import Workload, argument


def threadpool_runner(workload: Workload, pool: ThreadPoolExecutor) -> Callable[[], Any]:
    """A driver loop over the nodes in topological order: each node is submitted as soon as
    the driver holds its inputs, which it gets by waiting on their futures.

    Independent nodes are therefore in flight together (the fan-out's middle, both SVDs), and a
    chain is a sequence of submit-then-wait hops, as one would write it without a scheduler.
    """
    leaves = workload.leaves

    def run() -> Any:
        futures: dict[str, Future[Any]] = {}
        for node_id, node in workload.nodes.items():
            preds = workload.predecessors[node_id]
            ready = {pred: futures[pred].result() for pred in preds}
            futures[node_id] = pool.submit(node.forward, argument(preds, ready, workload.input))
        if len(leaves) == 1:
            return futures[leaves[0]].result()
        return {leaf: futures[leaf].result() for leaf in leaves}

    return run


def dask_runner(workload: Workload, scheduler: str) -> tuple[Callable[[], Any], float]:
    """``dask.compute`` of a delayed graph built beforehand; returns the runner and the
    seconds that building the delayed graph took (not part of the timed call)."""
    # Imported here: dask is an optional peer, installed by `make bench` only.
    from dask.base import compute as untyped_compute
    from dask.delayed import delayed

    compute: Callable[..., tuple[Any, ...]] = untyped_compute

    start = time.perf_counter()
    built: dict[str, Any] = {}
    for node_id, node in workload.nodes.items():
        preds = workload.predecessors[node_id]
        # pure=False: keys are then random, not a hash of the bound method and its arguments,
        # which is what a graph of stateful node objects calls for.
        built[node_id] = delayed(node.forward, pure=False)(argument(preds, built, workload.input))
    finals = [built[leaf] for leaf in workload.leaves]
    built_s = time.perf_counter() - start

    def run() -> Any:
        results = compute(*finals, scheduler=scheduler)
        return results[0] if len(results) == 1 else results

    return run, built_s
