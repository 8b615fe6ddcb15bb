"""The figures of ``cargo bench -p soma-core`` as markdown tables, read from criterion's files.

criterion keeps one ``estimates.json`` per benchmark under ``target/criterion``; this reads the
median of each (the figure BENCHMARKS.md quotes), divides by the nodes or branches it ran, sets
the waves at scale beside themselves at a tenth of the size, and the compile times beside the
naive baseline's. Run after ``cargo bench``, as ``make bench`` does: the modification times
printed with the tables show that the figures come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Estimate:
    median_ns: float
    written: datetime
    # The nodes or branches one run went through, where the benchmark declared a throughput
    # (scale.rs does: a nested graph's parameter is its nominal size, not its exact count).
    elements: int | None = None


def _read(directory: Path) -> dict[str, Estimate]:
    """Every benchmark under ``directory``, keyed by its id (``group/function/parameter``)."""
    found = {}
    for path in sorted(directory.glob("**/new/estimates.json")):
        bench = json.loads((path.parent / "benchmark.json").read_text())
        median = json.loads(path.read_text())["median"]["point_estimate"]
        written = datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
        elements = (bench.get("throughput") or {}).get("Elements")
        found[bench["full_id"]] = Estimate(float(median), written, elements)
    return found


def _order(key: str) -> tuple[str, str, int]:
    """``group/function/parameter`` with the parameter compared as a number."""
    head, _, parameter = key.rpartition("/")
    group, _, function = head.partition("/")
    return (group, function, int(parameter) if parameter.isdigit() else 0)


def _duration(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


# Compilation targets: at most this long for 100,000 nodes, and at most this growth from
# 10,000 to 100,000 (linear would be 10x).
COMPILE_BOUND_NS = 100e6
COMPILE_GROWTH = 15.0


def _traced(estimates: dict[str, Estimate]) -> list[str]:
    """Every ``group/name-traced/n`` beside its untraced ``group/name/n``: what tracing adds."""
    lines = []
    for key in sorted(estimates, key=_order):
        head, _, count = key.rpartition("/")
        if not head.endswith("-traced") or not count.isdigit():
            continue
        plain = estimates.get(f"{head.removesuffix('-traced')}/{count}")
        if plain is None:
            continue
        traced = estimates[key]
        lines.append(
            f"Tracing: `{key}` takes {traced.median_ns / plain.median_ns:.2f}x "
            f"`{head.removesuffix('-traced')}/{count}`, "
            f"{(traced.median_ns - plain.median_ns) / int(count):+.1f} ns per unit."
        )
    return ["", *lines] if lines else []


def _handoff(estimates: dict[str, Estimate]) -> list[str]:
    """The wave of two, awake and after a pause, beside one round trip to a parked thread."""
    floor = estimates.get("handoff/round-trip/1")
    awake = estimates.get("wave/trivial-branches/2")
    asleep = estimates.get("wave/after-a-pause/2")
    if floor is None or awake is None or asleep is None:
        return []
    return [
        "",
        f"Waking: one round trip to a sleeping thread (`handoff/round-trip/1`) takes "
        f"{_duration(floor.median_ns)}. A wave of two takes {_duration(awake.median_ns)} run back "
        f"to back, its threads still awake ({awake.median_ns / floor.median_ns:.2f}x the round "
        f"trip), and {_duration(asleep.median_ns)} after a 1 ms pause, once they have gone to "
        f"sleep ({asleep.median_ns / floor.median_ns:.2f}x).",
    ]


def _scale(estimates: dict[str, Estimate]) -> list[str]:
    """scale.rs's benchmarks, each per unit beside itself at a tenth of the size: a run that
    grows with its graph and no faster keeps the last column at 1."""
    rows = []
    for function, unit, sizes in (
        ("wide-wave/trivial-branches", "branch", (1_000, 10_000)),
        ("nested/blocks", "node", (10_000, 100_000)),
        ("nested/tree", "node", (10_000, 100_000)),
    ):
        small, large = (estimates.get(f"{function}/{size}") for size in sizes)
        if small is None or large is None:
            continue
        small_ns, large_ns = _per_unit_ns(small, sizes[0]), _per_unit_ns(large, sizes[1])
        rows.append(
            f"| `{function}` | {small_ns:.1f} ns/{unit} at {sizes[0]:,} "
            f"| {large_ns:.1f} ns/{unit} at {sizes[1]:,} | {large_ns / small_ns:.2f}x |"
        )
    if not rows:
        return []
    return [
        "",
        "### Waves at scale (criterion medians, trivial Rust nodes)",
        "",
        "| benchmark | per unit | ten times the size | per unit, larger / smaller |",
        "|---|---:|---:|---:|",
        *rows,
    ]


def _per_unit_ns(estimate: Estimate, count: int) -> float:
    return estimate.median_ns / (estimate.elements or count)


def _compile_targets(estimates: dict[str, Estimate]) -> list[str]:
    rows = []
    for shape in ("chain", "nested"):
        small = estimates.get(f"compile/{shape}/10000")
        large = estimates.get(f"compile/{shape}/100000")
        if large is not None:
            met = large.median_ns < COMPILE_BOUND_NS
            rows.append(
                f"| {shape} of 100,000 nodes: compile time | {_duration(large.median_ns)} "
                f"| < {_duration(COMPILE_BOUND_NS)} | {'yes' if met else '**no**'} |"
            )
        if small is not None and large is not None:
            growth = large.median_ns / small.median_ns
            met = growth <= COMPILE_GROWTH
            rows.append(
                f"| {shape}, 10,000 -> 100,000 nodes: growth | {growth:.1f}x "
                f"({_duration(small.median_ns)} -> {_duration(large.median_ns)}) "
                f"| ≤ {COMPILE_GROWTH:g}x | {'yes' if met else '**no**'} |"
            )
    if not rows:
        return []
    return [
        "",
        "### Compilation targets",
        "",
        "| target | measured | bound | met |",
        "|---|---:|---:|---:|",
        *rows,
    ]


def tables(estimates: dict[str, Estimate]) -> str:
    lines = ["### Execution (criterion medians)", ""]
    lines += ["| benchmark | median per run | per unit |", "|---|---:|---:|"]
    # A chain's parameter counts nodes, a wave's counts branches (or the throughput declared,
    # where there is one); other groups print as is.
    units = {
        "chain": ("node", 1e0, ".1f", "ns"),
        "wave": ("branch", 1e3, ".2f", "µs"),
        "wide-wave": ("branch", 1e0, ".1f", "ns"),
        "nested": ("node", 1e0, ".1f", "ns"),
    }
    for key, estimate in sorted(estimates.items(), key=lambda item: _order(item[0])):
        group, _, count = _order(key)
        if group == "compile":
            continue
        per_unit = ""
        if group in units and count > 0:
            unit, scale, spec, suffix = units[group]
            per_ns = _per_unit_ns(estimate, count)
            per_unit = f"{per_ns / scale:{spec}} {suffix}/{unit}"
        lines.append(f"| `{key}` | {_duration(estimate.median_ns)} | {per_unit} |")

    lines += _traced(estimates)
    lines += _handoff(estimates)
    lines += _scale(estimates)

    lines += ["", "### Compilation (criterion medians)", ""]
    lines += [
        "| shape | nodes | ours | growth over the size above | naive | ours / naive |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for shape in ("chain", "nested", "ladder"):
        sizes = sorted(
            {
                int(key.rsplit("/", 1)[1])
                for key in estimates
                if key.startswith((f"compile/{shape}/", f"compile/naive-{shape}/"))
            }
        )
        previous: tuple[int, Estimate] | None = None
        for size in sizes:
            ours = estimates.get(f"compile/{shape}/{size}")
            naive = estimates.get(f"compile/naive-{shape}/{size}")
            ratio = "—"
            if ours and naive:
                share = ours.median_ns / naive.median_ns
                ratio = f"{share:.2g} (naive {1 / share:,.0f}x slower)"
            growth = "—"
            if ours and previous:
                growth = (
                    f"{ours.median_ns / previous[1].median_ns:.1f}x "
                    f"for {size / previous[0]:g}x the nodes"
                )
            if ours:
                previous = (size, ours)
            lines.append(
                f"| {shape} | {size:,} | {_duration(ours.median_ns) if ours else 'not run'} "
                f"| {growth} | {_duration(naive.median_ns) if naive else 'not run'} | {ratio} |"
            )
    lines += _compile_targets(estimates)
    written = [e.written for e in estimates.values()]
    lines += [
        "",
        f"{len(estimates)} criterion estimates, written between "
        f"{min(written):%Y-%m-%d %H:%M:%S} and {max(written):%H:%M:%S} UTC.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    parser.add_argument("--criterion-dir", type=Path, default=target / "criterion")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    args = parser.parse_args()
    estimates = _read(args.criterion_dir)
    if not estimates:
        sys.exit(f"no criterion results under {args.criterion_dir}: run `cargo bench` first")
    text = tables(estimates)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
