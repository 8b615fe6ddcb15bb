"""Running again with ``soma.Cache``: what keys and hits cost, beside ``joblib``.

    .venv/bin/python benches/python/cache.py [--quick] [--out PATH]

Prints markdown tables (and writes them to PATH). Timings only, never assertions; the targets
of the cache issue are stated beside each figure:

1. **Hashing.** A 400 MB float64 array keyed by Soma (BLAKE3 over its buffer, in place) against
   ``joblib.hash`` and ``arr.copy()`` (target: at least 5x joblib, no slower than a copy).
2. **Hits.** A fully cached rerun of a 100-node chain of small values, per node, from memory
   and from a folder (targets: 10 µs and 100 µs), beside a ``joblib.Memory`` hit on a small
   argument; and a cached rerun of the 1,000-node nested graph against its uncached trivial run
   (target: at most 5x).
3. **Edits.** One node in the middle of a 100-node chain of 10 ms nodes edited: the rerun
   against the time of the nodes that really changed (target: at most 1.1x), beside the same
   chain of functions each wrapped in ``joblib.Memory``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import soma
from soma import _fingerprint
from timing import compare

try:
    import joblib
except ImportError:  # `make bench` installs it; a bare .venv may not have it.
    joblib = None


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def best_of(fn: Callable[[], object], times: int) -> float:
    best = float("inf")
    for _ in range(times):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def hashing(quick: bool) -> str:
    array = np.random.default_rng(0).random(50_000_000 // (10 if quick else 1))
    megabytes = array.nbytes / 1e6
    times = 3
    contenders: dict[str, Callable[[], object]] = {
        "soma (BLAKE3, in place)": lambda: _fingerprint.digest(array),
        "arr.copy()": array.copy,
    }
    if joblib is not None:
        contenders["joblib.hash"] = lambda: joblib.hash(array)
    figures = {name: best_of(fn, times) for name, fn in contenders.items()}
    soma_s = figures["soma (BLAKE3, in place)"]
    rows = [
        [name, f"{seconds:.3f}", f"{seconds / soma_s:.1f}x", f"{megabytes / seconds:,.0f}"]
        for name, seconds in figures.items()
    ]
    return table(
        f"Keying a {megabytes:,.0f} MB float64 array (best of {times})",
        ["how", "seconds", "against soma", "MB/s"],
        rows,
    )


class Inc(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        return x + self.k


def chain_of(nodes: list[soma.Node]) -> Any:
    expr: Any = nodes[0]
    for node in nodes[1:]:
        expr = expr >> node
    return expr


def nested(levels: int) -> Any:
    """The 1,000-node nested graph of the scale benchmark: a node, then a wave of the rest."""
    expr: Any = Inc(1)
    for _ in range(levels):
        expr = Inc(1) >> (expr | Inc(1)) >> Join()
    return expr


class Join(soma.Node):
    def forward(self, x: dict[str, int]) -> int:
        return sum(x.values())


def hits(quick: bool) -> str:
    repeat = 3 if quick else 9
    g = soma.Graph.somatize(chain_of([Inc(i) for i in range(100)]))
    memory, folder = soma.Cache(), soma.Cache(tempfile.mkdtemp())
    g.forward(1, cache=memory)
    g.forward(1, cache=folder)
    contenders: dict[str, Callable[[], object]] = {
        "uncached": lambda: g.forward(1),
        "from memory": lambda: g.forward(1, cache=memory),
        "from a folder": lambda: g.forward(1, cache=folder),
    }
    rows = []
    timings = compare(contenders, repeat=repeat, sample_s=0.2, warmup_s=0.05)
    targets = {"from memory": "≤ 10 µs", "from a folder": "≤ 100 µs", "uncached": ""}
    for name, timing in timings.items():
        rows.append(
            [f"100-node chain, {name}", f"{timing.median_s / 100 * 1e6:.2f}", targets[name]]
        )
    if joblib is not None:
        memory_dir = joblib.Memory(tempfile.mkdtemp(), verbose=0)

        def add(x: int, k: int) -> int:
            return x + k

        cached_add = memory_dir.cache(add)
        cached_add(1, 1)
        joblib_hit = compare(
            {"joblib": lambda: cached_add(1, 1)}, repeat=repeat, sample_s=0.2, warmup_s=0.05
        )["joblib"]
        rows.append(["a joblib.Memory hit, small argument", f"{joblib_hit.median_s * 1e6:.2f}", ""])
    big = soma.Graph.somatize(nested(333))
    big_cache = soma.Cache()
    big.forward(1, cache=big_cache)
    nested_timings = compare(
        {"uncached": lambda: big.forward(1), "cached": lambda: big.forward(1, cache=big_cache)},
        repeat=repeat,
        sample_s=0.2,
        warmup_s=0.05,
    )
    ratio = nested_timings["cached"].median_s / nested_timings["uncached"].median_s
    rows.append(
        [
            f"{len(big)}-node nested graph, cached rerun against uncached",
            f"{ratio:.1f}x",
            "≤ 5x",
        ]
    )
    return table("Fully cached reruns (µs a node)", ["run", "µs a node", "target"], rows)


class Slow(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        time.sleep(0.010)
        return x + self.k


def edits(quick: bool) -> str:
    length = 20 if quick else 100
    middle = length // 2
    nodes = [Slow(i) for i in range(length)]
    g = soma.Graph.somatize(chain_of(nodes))
    cache = soma.Cache(tempfile.mkdtemp())
    g.forward(0, cache=cache)
    nodes[middle].k += 1000
    start = time.perf_counter()
    g.forward(0, cache=cache)
    rerun = time.perf_counter() - start
    changed = length - middle
    # What the changed nodes alone take, uncached.
    tail = soma.Graph.somatize(chain_of([Slow(i) for i in range(changed)]))
    alone = best_of(lambda: tail.forward(0), 1)
    rows = [
        [
            f"soma, {length}-node chain, node {middle} edited",
            f"{rerun:.3f}",
            f"{rerun / alone:.2f}x",
        ]
    ]
    if joblib is not None:
        store = joblib.Memory(tempfile.mkdtemp(), verbose=0)

        def step(x: int, k: int) -> int:
            time.sleep(0.010)
            return x + k

        cached_step = store.cache(step)
        ks = list(range(length))

        def run() -> int:
            x = 0
            for k in ks:
                x = cached_step(x, k)
            return x

        run()
        ks[middle] += 1000
        start = time.perf_counter()
        run()
        joblib_rerun = time.perf_counter() - start
        rows.append(
            [
                f"joblib.Memory around each function, node {middle} edited",
                f"{joblib_rerun:.3f}",
                f"{joblib_rerun / alone:.2f}x",
            ]
        )
    return table(
        f"Rerun after an edit, 10 ms nodes ({changed} changed: {alone:.3f} s alone)",
        ["run", "seconds", "against the changed nodes alone (target ≤ 1.1x)"],
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    parts = []
    for name, section in (("hashing", hashing), ("hits", hits), ("edits", edits)):
        log(f"cache: {name}")
        parts.append(section(options.quick))
    report = "## Cache\n\n" + "\n".join(parts)
    print(report)
    if options.out is not None:
        options.out.write_text(report)


if __name__ == "__main__":
    main()
