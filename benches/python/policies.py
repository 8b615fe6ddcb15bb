"""Policies: what ``.retry()`` and ``.time_limit()`` cost a call that needs neither.

    .venv/bin/python benches/python/policies.py [--quick] [--out PATH]

Prints a markdown table (and writes it to PATH). Timings only, never assertions. A chain of
three trivial Python nodes, forwarded as it is, with ``.retry(3)`` on every node (each call
succeeds: what a retry costs when it is not used), and with ``.time_limit(60)`` on every node
(each call handed to a lent thread while the branch waits), interleaved in one run; beside what a
user writes by hand for a limit around one call, ``ThreadPoolExecutor.submit(f).result(60)``.
A graph with no policy runs the path it ran before policies existed: its row is the baseline.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import soma
from deadline import Pass, log, pass_through, publish, table
from timing import compare


def chain() -> soma.Expr:
    return Pass() >> Pass() >> Pass()


def rows(repeat: int) -> list[list[str]]:
    plain = soma.Graph.somatize(chain())
    retried = soma.Graph.somatize(chain().retry(3))
    limited = soma.Graph.somatize(chain().time_limit(60))
    for graph in (plain, retried, limited):
        assert graph.forward(1) == 1  # Checked, not timed: each computes the same.
    pool = ThreadPoolExecutor(1)
    timings = compare(
        {
            "plain": lambda: plain.forward(1),
            "retry": lambda: retried.forward(1),
            "time_limit": lambda: limited.forward(1),
            "pool": lambda: pool.submit(pass_through, 1).result(timeout=60),
        },
        repeat=repeat,
        sample_s=0.05,
        warmup_s=0.05,
    )
    pool.shutdown()
    base = timings["plain"].median_s * 1e6
    out = []
    for name, label in [
        ("plain", "no policy"),
        ("retry", "`.retry(3)` on each node"),
        ("time_limit", "`.time_limit(60)` on each node"),
    ]:
        us = timings[name].median_s * 1e6
        out.append([label, f"{us:.2f} µs", f"{(us - base) / 3:+.2f} µs"])
        log(f"{name}: {us:.2f} µs")
    out.append(["by hand, one call (pool)", f"{timings['pool'].median_s * 1e6:.2f} µs", ""])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    lines = [
        "## Policies",
        "",
        "A forward of a chain of 3 trivial Python nodes (medians of interleaved samples), and "
        "what each policy adds a node when the call succeeds in time:",
        "",
        *table(["chain of 3", "forward", "per node"], rows(5 if args.quick else 15)),
        "",
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
