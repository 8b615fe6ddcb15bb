"""What building for CPython's stable ABI costs: bench.py's chain and wave rows timed with two
builds of the same source, one for the stable ABI (``abi3-py311``, what ``make wheel`` builds) and
one for the running interpreter's own ABI, in one run.

    .venv/bin/python benches/python/abi3.py ABI3_PYTHON OWN_PYTHON [--rounds N] [--out PATH]

Each PYTHON is the interpreter of a venv holding one build and numpy (``make`` makes neither;
BENCHMARKS.md gives the commands). The builds cannot share a process (both are ``soma._soma``),
so the two are timed in turns: each round runs one child process per build, in alternating
order, that times every row for a short while; a row's figure is the median over the rounds,
so that a burst of load from elsewhere lands on both builds. Timings only, never assertions.
"""

from __future__ import annotations

import os

# As bench.py: one BLAS thread, so that nothing but the wave's branches runs side by side.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import functools
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROWS = ("chain of 1000 Python nodes", "wave 2", "wave 8")


def child() -> None:
    """Times the rows with whichever build this interpreter has; prints them as JSON."""
    import soma
    import timing
    import workloads
    from figures import FULL

    chain = workloads.chain(FULL.chain)
    graph = chain.soma_graph()
    graph.plan()
    rows: dict[str, Callable[[], Any]] = {ROWS[0]: lambda: graph.forward(chain.input)}
    for width, name in zip(FULL.waves, ROWS[1:], strict=True):
        wave, _ = workloads.wave(width)
        rows[name] = functools.partial(wave.forward, 0)
    timings = timing.compare(rows, repeat=5, sample_s=FULL.sample_s, warmup_s=FULL.warmup_s)
    built = Path(soma._soma.__file__).name
    print(json.dumps({"module": built, **{name: t.median_s for name, t in timings.items()}}))


def spread(values: list[float]) -> float:
    """Half the interquartile range of ``values``, as a fraction of their median."""
    quartiles = statistics.quantiles(values, n=4)
    return (quartiles[2] - quartiles[0]) / 2 / statistics.median(values)


def timed_by(python: str) -> dict[str, Any]:
    done = subprocess.run(
        [python, __file__, "--child"],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("abi3_python", nargs="?")
    parser.add_argument("own_python", nargs="?")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child()
        return
    if not (args.abi3_python and args.own_python):
        parser.error("give the interpreters of both builds")
    builds = {"abi3": args.abi3_python, "own ABI": args.own_python}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in builds}
    for round_ in range(args.rounds):
        order = list(builds) if round_ % 2 == 0 else list(reversed(builds))
        for name in order:
            rounds[name].append(timed_by(builds[name]))
            print(f"round {round_ + 1}/{args.rounds}: {name} timed", file=sys.stderr, flush=True)
    modules = {name: runs[0]["module"] for name, runs in rounds.items()}
    columns = " | ".join(f"{name} (`{modules[name]}`)" for name in builds)
    lines = [
        f"| row | {columns} | abi3 / own |",
        "|---|" + "---:|" * (len(builds) + 1),
    ]
    for row in ROWS:
        medians = {name: statistics.median(run[row] for run in rounds[name]) for name in builds}
        cells = " | ".join(
            f"{medians[name] * 1e6:,.1f} µs ± {spread([run[row] for run in rounds[name]]):.0%}"
            for name in builds
        )
        lines.append(f"| {row} | {cells} | {medians['abi3'] / medians['own ABI']:.3f} |")
    lines.append("")
    lines.append(
        f"Medians of {args.rounds} rounds, each the median of 5 interleaved samples; ± half the "
        "interquartile range of the rounds, as a fraction of the median."
    )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
