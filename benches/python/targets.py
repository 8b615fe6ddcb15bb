"""The Python benchmark's targets: each bound stated once, and whether a run's figures meet it.

A bound is both checked and printed from :data:`BOUNDS`, so the table can never say one limit
while the check applies another.
"""

from __future__ import annotations

from dataclasses import dataclass

from figures import Figures, median
from timing import OtherLoad


@dataclass(frozen=True)
class Bound:
    """A limit on one figure, written as the targets table shows it (``≤ 3x (goal 2x)``)."""

    relation: str  # "≤", "<", "≥", or "within": the figure's size, whichever its sign
    limit: float
    unit: str  # written right after the number: "x", " µs", " MB", "%"
    goal: float | None = None  # said beside the bound, never checked

    def met(self, figure: float) -> bool:
        match self.relation:
            case "≤":
                return figure <= self.limit
            case "<":
                return figure < self.limit
            case "≥":
                return figure >= self.limit
            case "within":
                return abs(figure) <= self.limit
        raise ValueError(f"unknown relation `{self.relation}`")

    def __str__(self) -> str:
        bound = f"{self.relation} {self.limit:g}{self.unit}"
        return bound if self.goal is None else f"{bound} (goal {self.goal:g}{self.unit})"


BOUNDS = {
    # A chain of trivial Python nodes: Soma's time over the plain loop's.
    "chain": Bound("≤", 3, "x", goal=2),
    # A wave of trivial Python branches: Soma's time per branch.
    "wave": Bound("<", 30, " µs"),
    # Two SVD branches: the same nodes in series over the wave, in time.
    "svd": Bound("≥", 1.8, "x"),
    # A large array passed through many nodes: the peak RSS Soma adds.
    "peak": Bound("<", 5, " MB"),
    # Many forwards of a waved graph: RSS growth after a checkpoint.
    "leak": Bound("within", 5, "%"),
}


@dataclass(frozen=True)
class Target:
    what: str
    measured: str
    target: Bound
    met: bool
    load: OtherLoad | None = None  # what else ran meanwhile, for the timed targets


def judge(figures: Figures) -> list[Target]:
    """Every target, in the order the table lists them, with what was measured for it."""
    config, load, mem = figures.config, figures.load, figures.memory
    soma_chain = median(figures.chain_rows, "Soma")
    loop_chain = median(figures.chain_rows, "plain loop")
    chain_ratio = soma_chain / loop_chain
    targets = [
        Target(
            f"chain of {config.chain:,} Python nodes: Soma / plain loop",
            f"{soma_chain / config.chain * 1e6:.3f} vs {loop_chain / config.chain * 1e6:.3f} "
            f"µs/node = {chain_ratio:.2f}x",
            BOUNDS["chain"],
            BOUNDS["chain"].met(chain_ratio),
            load["chain"],
        )
    ]
    for width in config.waves:
        per_branch = figures.small[f"wave {width}"].median_s / width * 1e6
        loop_branch = figures.small[f"loop {width}"].median_s / width * 1e6
        targets.append(
            Target(
                f"wave of {width} trivial Python branches, per branch",
                f"{per_branch:.1f} µs (loop: {loop_branch:.3f} µs)",
                BOUNDS["wave"],
                BOUNDS["wave"].met(per_branch),
                load["small"],
            )
        )
    pair = figures.pair_rows
    speedup = median(pair, "Soma, the same nodes in series") / median(pair, "Soma")
    pool_speedup = median(pair, "plain loop") / median(pair, "ThreadPoolExecutor")
    peak_added_mb = mem["soma"]["added_kib"] * 1024 / 1e6
    loop_added_mb = mem["loop"]["added_kib"] * 1024 / 1e6
    leak = mem["leak"]
    targets += [
        Target(
            "two SVD branches: in series / as a wave",
            f"{speedup:.2f}x (ThreadPoolExecutor over the loop: {pool_speedup:.2f}x)",
            BOUNDS["svd"],
            BOUNDS["svd"].met(speedup),
            load["pair"],
        ),
        Target(
            f"{config.memory_mib} MiB array through {config.memory_nodes} nodes: peak RSS added",
            f"{peak_added_mb:.2f} MB (plain loop: {loop_added_mb:.2f} MB)",
            BOUNDS["peak"],
            # A copy made on the way would be a miss whatever the peak says.
            BOUNDS["peak"].met(peak_added_mb) and bool(mem["soma"]["same_object"]),
        ),
        Target(
            f"{config.forwards:,} forwards of a waved graph: RSS from forward "
            f"{config.leak_checkpoint:,} to {config.forwards:,}",
            f"{leak['resident_at_checkpoint_kib'] / 1024:.1f} -> "
            f"{leak['resident_at_end_kib'] / 1024:.1f} MiB "
            f"({leak['growth'] * 100:+.1f}%)",
            BOUNDS["leak"],
            BOUNDS["leak"].met(leak["growth"] * 100),
        ),
    ]
    return targets
