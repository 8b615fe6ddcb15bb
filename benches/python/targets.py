"""The Python benchmark's targets: each bound stated once, and whether a run's figures meet it.

A bound is both checked and printed from :data:`BOUNDS`, so the table can never say one limit
while the check applies another.
"""

from __future__ import annotations

from dataclasses import dataclass

from figures import (
    NESTED_DASK,
    NESTED_LOOP,
    NESTED_SOMA,
    NESTED_WAVES,
    Building,
    Figures,
    Scale,
    building_at,
    median,
    scale_at,
)
from timing import OtherLoad
from workloads import BLOCK_WIDTH


@dataclass(frozen=True)
class Bound:
    """A limit on one figure, written as the targets table shows it (``≤ 3x (goal 2x)``)."""

    relation: str  # "≤", "<", "≥", ">", or "within": the figure's size, whichever its sign
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
            case ">":
                return figure > self.limit
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
    # A wave of trivial Python branches: its time with each branch entering its caller's
    # context over its time with context carry switched off, timed in the same rounds.
    "context": Bound("≤", 1.10, "x"),
    # Two SVD branches: the same nodes in series over the wave, in time.
    "svd": Bound("≥", 1.8, "x"),
    # A large array passed through many nodes: the peak RSS Soma adds.
    "peak": Bound("<", 5, " MB"),
    # Many forwards of a waved graph: RSS growth after a checkpoint.
    "leak": Bound("within", 5, "%"),
    # The fan-out 1 -> 1,000 -> 1: the thread pool's time over Soma's (Soma faster).
    "fan": Bound(">", 1, "x"),
    # The nested graph, steady forwards: Soma's time per node, at 10,000 and at 100,000 nodes.
    "nested": Bound("≤", 2, " µs"),
    # The nested graph: Soma's time per node at 100,000 nodes over that at 1,000.
    "nested_growth": Bound("≤", 1.5, "x"),
    # The nested graph at 10,000 nodes: the waves run by hand on a ThreadPoolExecutor(8), in
    # time over Soma.
    "nested_waves": Bound("≥", 3, "x"),
    # The nested graph at 10,000 nodes: Dask's threaded scheduler, in time over Soma.
    "nested_dask": Bound("≥", 30, "x"),
    # The nested graph: a user's first forward (the graph just built, its plan compiled by that
    # forward) over a steady one, at every size.
    "first_forward": Bound("≤", 2, "x"),
    # The nested graph of 100,000 nodes: `plan()`, its first call.
    "plan": Bound("<", 30, " ms"),
    # The nested graph: `plan()`'s first call at 100,000 nodes over that at 10,000.
    "plan_growth": Bound("≤", 12, "x"),
    # The nested graph: the threads it holds after its forwards, at every size: its width, 4,
    # plus two.
    "threads": Bound("≤", BLOCK_WIDTH + 2, " threads"),
    # Building a chain with `g.node(id, obj)` and `g.edge(a, b)`: per call, at every size.
    "node_call": Bound("≤", 2, " µs"),
    "edge_call": Bound("≤", 2, " µs"),
    # A graph of 1,000,000 nodes built with node()/edge(): all the calls together.
    "build_million": Bound("<", 5, " s"),
    # `e = e >> k` or `e = e | k` in a loop, and `Graph.somatize(e)`: at 100,000 nodes over at
    # 10,000 (linear is 10x).
    "build_growth": Bound("≤", 12, "x"),
    # A chain or a flat wave of 100,000 nodes written in a loop and somatized.
    "build_dsl": Bound("<", 1, " s"),
}


@dataclass(frozen=True)
class Target:
    what: str
    measured: str
    target: Bound
    met: bool | None  # None: not measured in this run (a size left out, a peer not run)
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
    for width in config.waves:
        carried = figures.small[f"wave {width}"].median_s
        bare = figures.small[f"wave {width} without carry"].median_s
        targets.append(
            Target(
                f"wave of {width} trivial Python branches: with context carry / without",
                f"{carried * 1e6:.2f} vs {bare * 1e6:.2f} µs = {carried / bare:.3f}x",
                BOUNDS["context"],
                BOUNDS["context"].met(carried / bare),
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
    fan_soma = median(figures.fan_rows, "Soma")
    fan_pool = median(figures.fan_rows, "ThreadPoolExecutor")
    fan_nodes = len(figures.fan.nodes)
    targets.append(
        Target(
            f"{figures.fan.name}: ThreadPoolExecutor / Soma, in time",
            f"{fan_pool / fan_nodes * 1e6:.2f} vs {fan_soma / fan_nodes * 1e6:.3f} µs/node "
            f"= {fan_pool / fan_soma:.2f}x",
            BOUNDS["fan"],
            BOUNDS["fan"].met(fan_pool / fan_soma),
            load["fan"],
        )
    )
    return targets + nested_targets(figures.nested) + building_targets(figures.building)


def _not_run(what: str, bound: str, why: str) -> Target:
    return Target(what, why, BOUNDS[bound], None)


def nested_targets(scales: list[Scale]) -> list[Target]:
    """The nested graph's targets, from the sizes that were run; a size left out (``--quick``
    runs no 100,000) or a peer not run leaves its target unmeasured, not met."""
    small, mid, large = (scale_at(scales, n) for n in (1_000, 10_000, 100_000))
    run = ", ".join(f"{s.nodes:,}" for s in scales) or "none"

    def _missing(nodes: int) -> str:
        return f"not run at {nodes:,} nodes (sizes run: {run})"

    targets = []
    for nodes, scale in ((10_000, mid), (100_000, large)):
        what = f"nested graph of {nodes:,} Python nodes: Soma steady forward, per node"
        if scale is None:
            targets.append(_not_run(what, "nested", _missing(nodes)))
            continue
        soma, loop = scale.per_node_us(NESTED_SOMA), scale.per_node_us(NESTED_LOOP)
        targets.append(
            Target(
                what,
                f"{soma:.3f} µs (loop: {loop:.3f} µs)",
                BOUNDS["nested"],
                BOUNDS["nested"].met(soma),
                scale.load,
            )
        )
    what = "nested graph, Soma per node: 100,000 nodes / 1,000"
    if small is None or large is None:
        targets.append(_not_run(what, "nested_growth", _missing(100_000)))
    else:
        small_us, large_us = small.per_node_us(NESTED_SOMA), large.per_node_us(NESTED_SOMA)
        # The loop's own growth beside it: what more nodes cost in caches, whoever runs them.
        loop_growth = large.per_node_us(NESTED_LOOP) / small.per_node_us(NESTED_LOOP)
        targets.append(
            Target(
                what,
                f"{large_us:.3f} / {small_us:.3f} µs = {large_us / small_us:.2f}x "
                f"(loop: {loop_growth:.2f}x)",
                BOUNDS["nested_growth"],
                BOUNDS["nested_growth"].met(large_us / small_us),
                large.load,
            )
        )
    for runner, bound, peer in (
        (NESTED_WAVES, "nested_waves", "the waves run by hand on a ThreadPoolExecutor(8)"),
        (NESTED_DASK, "nested_dask", "Dask's threaded scheduler"),
    ):
        what = f"nested graph of 10,000 nodes: {peer} / Soma, in time"
        if mid is None or runner not in mid.timings:
            why = _missing(10_000) if mid is None else f"not run: {mid.dask_note}"
            targets.append(_not_run(what, bound, why))
            continue
        peer_us, soma_us = mid.per_node_us(runner), mid.per_node_us(NESTED_SOMA)
        targets.append(
            Target(
                what,
                f"{peer_us:.2f} vs {soma_us:.3f} µs/node = {peer_us / soma_us:.1f}x",
                BOUNDS[bound],
                BOUNDS[bound].met(peer_us / soma_us),
                mid.load,
            )
        )
    if scales:
        firsts = {s.nodes: s.first_forward_s / s.timings[NESTED_SOMA].median_s for s in scales}
        worst = max(firsts, key=firsts.__getitem__)
        targets.append(
            Target(
                "nested graph: a user's first forward (graph just built, compile included) / "
                "steady forward, at every size",
                ", ".join(f"{ratio:.2f}x at {nodes:,}" for nodes, ratio in firsts.items())
                + f" (worst: {firsts[worst]:.2f}x)",
                BOUNDS["first_forward"],
                BOUNDS["first_forward"].met(firsts[worst]),
                next(s.load for s in scales if s.nodes == worst),
            )
        )
    what = "nested graph of 100,000 nodes: `plan()`, first call"
    if large is None:
        targets.append(_not_run(what, "plan", _missing(100_000)))
    else:
        plan_ms = large.plan_first_s * 1e3
        targets.append(
            Target(
                what,
                f"{plan_ms:.1f} ms (cached: {large.plan_cached_s * 1e6:.1f} µs)",
                BOUNDS["plan"],
                BOUNDS["plan"].met(plan_ms),
                large.load,
            )
        )
    what = "nested graph, `plan()` first call: 100,000 nodes / 10,000"
    if mid is None or large is None:
        targets.append(_not_run(what, "plan_growth", _missing(100_000)))
    else:
        growth = large.plan_first_s / mid.plan_first_s
        targets.append(
            Target(
                what,
                f"{large.plan_first_s * 1e3:.1f} / {mid.plan_first_s * 1e3:.2f} ms = {growth:.1f}x",
                BOUNDS["plan_growth"],
                BOUNDS["plan_growth"].met(growth),
                large.load,
            )
        )
    if scales:
        most = max(s.threads_held for s in scales)
        targets.append(
            Target(
                f"nested graph ({BLOCK_WIDTH} wide): threads it holds after its forwards, "
                "at every size",
                ", ".join(f"{s.threads_held} at {s.nodes:,}" for s in scales),
                BOUNDS["threads"],
                BOUNDS["threads"].met(most),
            )
        )
    return targets


def building_targets(sizes: list[Building]) -> list[Target]:
    """Building a graph: node() and edge() per call at every size, a million nodes by calls,
    and the DSL's loops and somatize at 100,000 nodes, in time and in growth from 10,000."""
    targets = []
    run = ", ".join(f"{s.nodes:,}" for s in sizes) or "none"
    for call, bound in (("node", "node_call"), ("edge", "edge_call")):
        what = f"`g.{call}()` per call, at every size"
        if not sizes:
            targets.append(_not_run(what, bound, "not run"))
            continue
        per_call = {s.nodes: s.per_call_us(s.node_s if call == "node" else s.edge_s) for s in sizes}
        worst = max(per_call, key=per_call.__getitem__)
        targets.append(
            Target(
                what,
                ", ".join(f"{us:.2f} µs at {nodes:,}" for nodes, us in per_call.items()),
                BOUNDS[bound],
                BOUNDS[bound].met(per_call[worst]),
                next(s.load for s in sizes if s.nodes == worst),
            )
        )
    million = building_at(sizes, 1_000_000)
    what = "a graph of 1,000,000 nodes built with `node()`/`edge()`"
    if million is None:
        targets.append(_not_run(what, "build_million", f"not run (sizes run: {run})"))
    else:
        took = million.node_s + million.edge_s
        targets.append(
            Target(
                what,
                f"{took:.2f} s ({million.node_s:.2f} s nodes, {million.edge_s:.2f} s edges)",
                BOUNDS["build_million"],
                BOUNDS["build_million"].met(took),
                million.load,
            )
        )
    mid, large = building_at(sizes, 10_000), building_at(sizes, 100_000)
    for name, write, somatize in (
        ("`e = e >> k`", "chain_s", "chain_somatize_s"),
        # Escaped: a bare `|` would end the markdown table's cell.
        ("`e = e \\| k`", "wave_s", "wave_somatize_s"),
    ):
        for figure, said in ((write, f"{name} in a loop"), (somatize, f"`somatize` of {name}")):
            what = f"{said}: 100,000 nodes / 10,000"
            small_s = None if mid is None else getattr(mid, figure)
            large_s = None if large is None else getattr(large, figure)
            if small_s is None or large_s is None or large is None:
                targets.append(_not_run(what, "build_growth", f"not run (sizes run: {run})"))
                continue
            growth = large_s / small_s
            # The plain loop's own growth beside it: what more objects cost the interpreter and
            # the machine, whoever builds them.
            plain = (
                ""
                if mid is None or mid.plain_loop_s is None or large.plain_loop_s is None
                else f" (plain loop: {large.plain_loop_s / mid.plain_loop_s:.1f}x)"
            )
            targets.append(
                Target(
                    what,
                    f"{large_s * 1e3:.1f} / {small_s * 1e3:.2f} ms = {growth:.1f}x{plain}",
                    BOUNDS["build_growth"],
                    BOUNDS["build_growth"].met(growth),
                    large.load,
                )
            )
        what = f"{name} in a loop of 100,000 nodes, then `somatize`"
        written = None if large is None else getattr(large, write)
        somatized = None if large is None else getattr(large, somatize)
        if written is None or somatized is None or large is None:
            targets.append(_not_run(what, "build_dsl", f"not run (sizes run: {run})"))
            continue
        targets.append(
            Target(
                what,
                f"{written + somatized:.2f} s ({written:.2f} s written, "
                f"{somatized:.2f} s somatized)",
                BOUNDS["build_dsl"],
                BOUNDS["build_dsl"].met(written + somatized),
                large.load,
            )
        )
    return targets
