"""Deadlines: what ``forward(timeout=...)`` costs, and how soon after its deadline it returns.

    .venv/bin/python benches/python/deadline.py [--quick] [--out PATH]

Prints markdown tables (and writes them to PATH). Timings only, never assertions; the targets
of the deadlines issue are stated beside each figure:

1. **Cost.** With a timeout the caller only waits and the plan runs on a lent thread. A forward
   of trivial Python nodes with ``timeout=60`` against the same forward without one, interleaved
   in one run (target: at most 5 µs more a forward), beside what a user would write by hand
   for a deadline around one call: ``ThreadPoolExecutor.submit(f).result(timeout=60)``.
2. **Lateness.** A node that never returns (``threading.Event().wait()``) in each place it can
   stand, each in a fresh process: seconds from the deadline to the ``TimeoutError`` (target:
   at most 100 ms), and the threads the process started for it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import soma
from timing import compare

TIMEOUT_S = 60.0
COST_BOUND_US = 5.0
LATE_BOUND_S = 0.100


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Pass(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


def pass_through(x: Any) -> Any:
    return x


GRAPHS = {
    "one node": lambda: Pass(),
    "a chain of 3": lambda: Pass() >> Pass() >> Pass(),
    "a diamond of 4": lambda: Pass() >> (Pass() | Pass()) >> Pass(),
}


def cost(repeat: int) -> list[list[str]]:
    rows = []
    pool = ThreadPoolExecutor(1)
    for name, build in GRAPHS.items():
        g = soma.Graph.somatize(build())
        expected = g.forward(1)
        assert g.forward(1, timeout=TIMEOUT_S) == expected, name
        timings = compare(
            {
                "without": lambda g=g: g.forward(1),
                "with": lambda g=g: g.forward(1, timeout=TIMEOUT_S),
                "pool": lambda: pool.submit(pass_through, 1).result(timeout=TIMEOUT_S),
            },
            repeat=repeat,
            sample_s=0.05,
            warmup_s=0.05,
        )
        without, with_ = timings["without"].median_s * 1e6, timings["with"].median_s * 1e6
        extra = with_ - without
        rows.append(
            [
                name,
                f"{without:.2f} µs",
                f"{with_:.2f} µs",
                f"{extra:+.2f} µs",
                f"{timings['pool'].median_s * 1e6:.2f} µs",
                f"≤ {COST_BOUND_US:g} µs: {'met' if extra <= COST_BOUND_US else 'MISSED'}",
            ]
        )
        log(f"cost {name}: {without:.2f} -> {with_:.2f} µs")
    pool.shutdown()
    return rows


STUCK_SCRIPT = textwrap.dedent(
    """
    import functools, json, os, threading, time
    import soma

    never = threading.Event()

    class N(soma.Node):
        def __init__(self, stuck=False):
            self.stuck = stuck

        def forward(self, x):
            if self.stuck:
                never.wait()
            return x

    def n(name, stuck=False):
        return N(stuck).named(name)

    def wide(count):
        return functools.reduce(lambda a, b: a | b, [n(f"w{i}", True) for i in range(count)])

    places = {
        "the only node": lambda: n("stuck", True),
        "mid-chain": lambda: n("a") >> n("stuck", True) >> n("c"),
        "the last node of a chain": lambda: n("a") >> n("b") >> n("stuck", True),
        "the first branch of a wave": lambda: n("a") >> (n("stuck", True) | n("c")) >> n("d"),
        "the second branch of a wave": lambda: n("a") >> (n("b") | n("stuck", True)) >> n("d"),
        "a nested wave": lambda: n("a")
        >> (n("c") | (n("x") >> (n("y") | n("stuck", True))))
        >> n("d"),
        "a wave of 10,000 stuck branches": lambda: wide(10_000),
    }
    g = soma.Graph.somatize(places[PLACE]())
    threads = len(os.listdir("/proc/self/task"))
    start = time.perf_counter()
    try:
        g.forward(0, timeout=TIMEOUT)
        outcome = "returned"
    except TimeoutError as error:
        outcome = str(error).splitlines()[0]
    late = time.perf_counter() - start - TIMEOUT
    print(json.dumps({
        "late": late,
        "outcome": outcome,
        "threads": len(os.listdir("/proc/self/task")) - threads,
    }))
    """
)

PLACES = [
    ("the only node", 0.5),
    ("mid-chain", 0.5),
    ("the last node of a chain", 0.5),
    ("the first branch of a wave", 0.5),
    ("the second branch of a wave", 0.5),
    ("a nested wave", 0.5),
    ("a wave of 10,000 stuck branches", 1.0),
]


def lateness(repeat: int) -> list[list[str]]:
    rows = []
    for place, timeout in PLACES:
        script = STUCK_SCRIPT.replace("PLACE", repr(place)).replace("TIMEOUT", repr(timeout))
        runs = []
        for _ in range(repeat):
            child = subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
            )
            if child.returncode != 0:
                raise RuntimeError(f"{place}: the child failed\n{child.stderr}")
            runs.append(json.loads(child.stdout.splitlines()[-1]))
        for run in runs:
            # Checked, not timed: each run must have raised, naming what was still running.
            assert run["outcome"].startswith("forward did not finish within its timeout"), run
            assert "still running: `" in run["outcome"], run
        worst = max(run["late"] for run in runs)
        rows.append(
            [
                place,
                f"{timeout:g} s",
                f"{min(run['late'] for run in runs) * 1e3:.0f} to {worst * 1e3:.0f} ms",
                str(max(run["threads"] for run in runs)),
                f"≤ {LATE_BOUND_S * 1e3:.0f} ms: {'met' if worst <= LATE_BOUND_S else 'MISSED'}",
            ]
        )
        log(f"late {place}: {worst * 1e3:.0f} ms")
    return rows


def publish(lines: list[str], out: Path | None) -> None:
    """Prints a benchmark's markdown, and writes it to ``out`` when one is given (``--out``):
    the file ``make bench`` gathers into BENCHMARKS.md."""
    text = "\n".join(lines)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args()
    lines = [
        "## Deadlines",
        "",
        "What `forward(timeout=60)` costs a forward of trivial Python nodes (medians of "
        "interleaved samples), beside a deadline written by hand around one call "
        "(`ThreadPoolExecutor.submit(f).result(timeout=60)`):",
        "",
        *table(
            ["graph", "without", "with a timeout", "cost", "by hand (pool)", "target"],
            cost(5 if args.quick else 15),
        ),
        "",
        "How long after its deadline `forward` raises `TimeoutError` with a node that never "
        "returns, in a fresh process per run (the fastest and slowest of the runs), and the "
        "threads the process started for the run:",
        "",
        *table(
            ["the stuck node is", "timeout", "late by", "threads started", "target"],
            lateness(1 if args.quick else 3),
        ),
        "",
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
