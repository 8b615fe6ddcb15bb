"""The sync rows a change to the walk must leave as they were, timed in this process: the
worker of ``versus.py``, which runs it under two builds in turn.

    python benches/python/sync_rows.py [--quick]

Prints one JSON object: each row's median seconds per run (a graph without async nodes, so the
sync walk alone): the chain of 1,000 Python nodes, waves of 2 and 8 trivial branches, the nested
graph at 1k, 10k and 100k nodes (and 1M unless ``--quick``), ``each`` of 10,000 items and
``g.map`` of 10,000 items.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import soma
from workloads import Inc, chain, nested, wave


def per_run(run: Callable[[], Any], seconds: float, at_least: int = 3) -> float:
    """The median of repeated runs' seconds, repeating for about ``seconds``."""
    run()  # Warm: plans compiled, threads started.
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < at_least or time.perf_counter() - began < seconds:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rows(quick: bool) -> dict[str, float]:
    budget = 0.3 if quick else 1.0
    out: dict[str, float] = {}
    g = chain(1_000).soma_graph()
    out["chain of 1,000 Python nodes"] = per_run(lambda: g.forward(0), budget)
    for width in (2, 8):
        w, _ = wave(width)
        out[f"wave of {width}"] = per_run(lambda w=w: w.forward(0), budget)
    scales = (1_000, 10_000, 100_000) if quick else (1_000, 10_000, 100_000, 1_000_000)
    for nodes in scales:
        n = nested(nodes // 8).soma_graph()
        gc.collect()
        out[f"nested, {nodes:,} nodes"] = per_run(
            lambda n=n: n.forward(0), budget, at_least=1 if nodes >= 1_000_000 else 3
        )
        del n
    items = list(range(10_000))
    each = soma.Graph.somatize(soma.each(Inc()))
    out["each of 10,000 items"] = per_run(lambda: each.forward(items), budget)
    mapped = soma.Graph.somatize(Inc() >> Inc())
    out["g.map of 10,000 items"] = per_run(lambda: list(mapped.map(items)), budget)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(rows(args.quick)))


if __name__ == "__main__":
    main()
