"""Ray compiled graphs on the benchmark's workloads; run by bench.py in a process of its own.

Its own process because ``ray.init`` starts a cluster (GCS, raylet, workers) whose threads and
processes would otherwise keep running beside every later measurement, and because a failure
here must cost Ray's column only. Prints one JSON object on its last line of output.

Each node is a method call on an actor, and an actor is a process: the chain and the fan-out
put all their nodes on one actor, Ray's best case for trivial nodes (hops between two actors
were tried and cost ten times more per node); the SVD pair puts one branch on each of two
actors, since that graph is about running at the same time. Compiling a graph
(``experimental_compile``) is done once and reported, not timed per run.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import timing
import workloads

HERE = Path(__file__).resolve().parent


def _host_class() -> Any:
    import ray

    @ray.remote
    class Host:
        """One actor holding a workload's node objects and calling their ``forward``."""

        def __init__(self, factory: str, size: int) -> None:
            # The actor rebuilds the workload in its own process: nodes are not shipped in.
            self._nodes = getattr(workloads, factory)(size).nodes

        def pid(self) -> int:
            return os.getpid()

        def call(self, node_id: str, x: Any) -> Any:
            return self._nodes[node_id].forward(x)

        def gather(self, node_id: str, ids: list[str], *xs: Any) -> Any:
            return self._nodes[node_id].forward(dict(zip(ids, xs, strict=True)))

    return Host


def _dag(factory: str, size: int, hosts: list[Any]) -> tuple[Any, Any]:
    """The workload as a Ray DAG, nodes dealt to ``hosts`` in turn, and the workload's input."""
    from ray.dag import InputNode, MultiOutputNode

    workload: workloads.Workload = getattr(workloads, factory)(size)
    with InputNode() as graph_input:
        bound: dict[str, Any] = {}
        for at, (node_id, preds) in enumerate(workload.predecessors.items()):
            host = hosts[at % len(hosts)]
            if not preds:
                bound[node_id] = host.call.bind(node_id, graph_input)
            elif len(preds) == 1:
                bound[node_id] = host.call.bind(node_id, bound[preds[0]])
            else:
                args = [bound[pred] for pred in preds]
                bound[node_id] = host.gather.bind(node_id, list(preds), *args)
        leaves = [bound[leaf] for leaf in workload.leaves]
        dag = leaves[0] if len(leaves) == 1 else MultiOutputNode(leaves)
    return dag, workload.input


def _execute(ray: Any, compiled: Any, graph_input: Any) -> Any:
    return ray.get(compiled.execute(graph_input))


def _ordinary_calls(
    ray: Any, hosts: list[Any], graph_input: Any, repeat: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The SVD pair as two ordinary actor calls, not compiled: the contrast shows what the
    compiled graph's channels cost when the machine has no core to spare for them."""

    def run() -> list[Any]:
        left, right = hosts
        return list(
            ray.get(
                [left.call.remote("left", graph_input), right.call.remote("right", graph_input)]
            )
        )

    result = run()
    measured = timing.compare(
        {"calls": run}, repeat=repeat, sample_s=args.sample_s, warmup_s=args.warmup_s
    )["calls"]
    return {**measured.__dict__, "setup_s": 0.0, "result": workloads.canonical(result)}


def _shm_files() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _remove_leftover_semaphores(before: set[str], pids: set[int]) -> None:
    # Compiled graphs' channels leave named semaphores (sem.hdrPID-*, sem.objPID-*) behind in
    # /dev/shm; remove those of this run's processes only.
    for name in _shm_files() - before:
        if any(name.startswith((f"sem.hdr{pid}-", f"sem.obj{pid}-")) for pid in pids):
            Path("/dev/shm", name).unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, required=True)
    parser.add_argument("--heavy-repeat", type=int, required=True)
    parser.add_argument("--sample-s", type=float, required=True)
    parser.add_argument("--warmup-s", type=float, required=True)
    parser.add_argument("--chain", type=int, required=True)
    parser.add_argument("--fan", type=int, required=True)
    parser.add_argument("--matrix", type=int, required=True)
    args = parser.parse_args()

    try:
        import ray
    except ImportError as error:
        print(json.dumps({"error": f"ray is not installed ({error.name} missing)"}))
        return

    shm_before = _shm_files()
    pids = {os.getpid()}
    report: dict[str, Any] = {"version": ray.__version__, "results": {}}
    start = time.perf_counter()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        object_store_memory=256 * 1024 * 1024,
        # The workers import this folder's modules, and must use BLAS the way the parent does.
        runtime_env={
            "env_vars": {
                "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path[1:]]),
                **{
                    var: os.environ.get(var, "1")
                    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
                },
            }
        },
    )
    report["init_s"] = time.perf_counter() - start
    host_class = _host_class()
    try:
        for key, factory, size, actors, repeat in [
            ("chain", "chain", args.chain, 1, args.repeat),
            ("fan_out", "fan_out", args.fan, 1, args.repeat),
            ("numpy_pair", "numpy_pair", args.matrix, 2, args.heavy_repeat),
        ]:
            hosts = [host_class.remote(factory, size) for _ in range(actors)]
            pids.update(ray.get([host.pid.remote() for host in hosts]))
            try:
                start = time.perf_counter()
                dag, graph_input = _dag(factory, size, hosts)
                compiled = dag.experimental_compile()
                setup_s = time.perf_counter() - start
                try:
                    result = ray.get(compiled.execute(graph_input))
                    measured = timing.compare(
                        {"ray": functools.partial(_execute, ray, compiled, graph_input)},
                        repeat=repeat,
                        sample_s=args.sample_s,
                        warmup_s=args.warmup_s,
                    )["ray"]
                finally:
                    compiled.teardown()
                report["results"][key] = {
                    **measured.__dict__,
                    "setup_s": setup_s,
                    "result": workloads.canonical(result),
                }
                if key == "numpy_pair":
                    report["results"]["numpy_pair_calls"] = _ordinary_calls(
                        ray, hosts, graph_input, repeat, args
                    )
            except Exception as error:  # A peer's failure is reported in its cell, not raised.
                report["results"][key] = {"error": f"{type(error).__name__}: {error}"[:200]}
            finally:
                for host in hosts:
                    ray.kill(host)
    finally:
        ray.shutdown()
        _remove_leftover_semaphores(shm_before, pids)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
