"""The same workloads on other machinery: a thread pool (as a driver loop, and as a scheduler of
Soma's own waves) and Dask, each written the plain way.

Every runner is built once (pool started, delayed graph constructed) and returned as a
zero-argument callable; only that call is timed. What building cost is returned beside it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import soma
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


# A plan turned into plain tuples once, so that the timed run pays for the scheduling, not for
# reading the tree through its Python wrappers: ("Execute", node, its id, its inputs), or
# ("Sequence" | "Wave", children).
Step = tuple[Any, ...]


def _steps(plan: soma.Plan, workload: Workload) -> Step:
    if plan.kind == "Execute":
        assert plan.node is not None
        return ("Execute", workload.nodes[plan.node], plan.node, tuple(plan.inputs))
    return (plan.kind, tuple(_steps(child, workload) for child in plan.children))


def wave_runner(
    workload: Workload, plan: soma.Plan, pool: ThreadPoolExecutor
) -> tuple[Callable[[], Any], float]:
    """Soma's own plan run by hand: a Sequence's children in order, a Wave's branches as futures
    on ``pool``, each branch walking its own subtree and the wave waiting on all of them; values
    in one dict. What Soma does, written the plain way — the scheduler Soma replaces.

    A branch that holds a nested wave blocks its pool thread while it waits, so the pool must
    have more threads than the waves in flight at once; eight is ample for the nested blocks
    (three branches, one of which waits on two more). Returns the runner and the seconds that
    turning the plan into tuples took.
    """
    start = time.perf_counter()
    root = _steps(plan, workload)
    built_s = time.perf_counter() - start
    graph_input = workload.input
    leaves = workload.leaves

    def walk(step: Step, values: dict[str, Any]) -> None:
        kind = step[0]
        if kind == "Execute":
            _, node, node_id, inputs = step
            values[node_id] = node.forward(argument(inputs, values, graph_input))
        elif kind == "Sequence":
            for child in step[1]:
                walk(child, values)
        elif kind == "Wave":
            branches = [pool.submit(walk, child, values) for child in step[1]]
            for branch in branches:
                branch.result()
        # "Empty": nothing to run.

    def run() -> Any:
        values: dict[str, Any] = {}
        walk(root, values)
        if len(leaves) == 1:
            return values[leaves[0]]
        return {leaf: values[leaf] for leaf in leaves}

    return run, built_s


def _join(forward: Callable[[Any], Any], preds: tuple[str, ...], *values: Any) -> Any:
    return forward(dict(zip(preds, values, strict=True)))


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
        if len(preds) > 1:
            # A join's inputs go in as arguments of their own, the dict made when it runs: a
            # dict of delayed values would have Dask optimise and cull every one's whole past
            # as it is built, quadratic in a chain of joins (minutes for 10,000 nested nodes),
            # and carry those copies into every compute.
            join = functools.partial(_join, node.forward, preds)
            built[node_id] = delayed(join, pure=False)(*(built[pred] for pred in preds))
        else:
            built[node_id] = delayed(node.forward, pure=False)(
                argument(preds, built, workload.input)
            )
    finals = [built[leaf] for leaf in workload.leaves]
    built_s = time.perf_counter() - start

    def run() -> Any:
        results = compute(*finals, scheduler=scheduler)
        return results[0] if len(results) == 1 else results

    return run, built_s
