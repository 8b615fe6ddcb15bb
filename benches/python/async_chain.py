"""An async node's call: a chain of 1,000 trivial ``async def`` nodes through ``aforward``, in
µs a node, under one or more builds, interleaved in one run.

    python benches/python/async_chain.py PYTHON [PYTHON ...] [--rounds N]

For each Python (a venv's, with a build of Soma installed), a child builds the chain, warms it
up and times ``aforward`` ``CALLS`` times; the children of the builds take turns, round after
round, so that the machine's load falls on each alike. Prints a markdown table: each build's
best and median round, in µs a node, and its best beside the first build's. Issue 44's target is
at most 0.3 µs a node. Timings only, never assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
from pathlib import Path

CHAIN = 1_000
CALLS = 50

CHILD = f"""
import asyncio
import time

import soma

class Pass(soma.Node):
    async def forward(self, x):
        return x

async def main():
    e = Pass()
    for _ in range({CHAIN - 1}):
        e = e >> Pass()
    g = soma.Graph.somatize(e)
    for _ in range(5):
        await g.aforward(1)
    best = float("inf")
    for _ in range({CALLS}):
        start = time.perf_counter()
        await g.aforward(1)
        best = min(best, time.perf_counter() - start)
    print(best / {CHAIN} * 1e6)

asyncio.run(main())
"""


def timed(python: str) -> float:
    """The best call of one child, in µs a node."""
    done = subprocess.run(
        [python, "-c", CHILD], capture_output=True, text=True, check=True, timeout=600
    )
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pythons", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds: dict[str, list[float]] = {python: [] for python in args.pythons}
    for _ in range(args.rounds):
        for python in args.pythons:
            rounds[python].append(timed(python))
    first = min(rounds[args.pythons[0]])
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(
        f"| build | chain of {CHAIN:,} async nodes, best (µs a node) | median of rounds "
        "| best against the first |"
    )
    print("|---|---:|---:|---:|")
    for python, times in rounds.items():
        best = min(times)
        print(
            f"| `{Path(python).parent.parent}` | {best:.3f} | {statistics.median(times):.3f} "
            f"| {best / first:.3f}x |"
        )


if __name__ == "__main__":
    main()
