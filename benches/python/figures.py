"""What one run of the Python benchmark measured, as plain data.

bench.py measures and fills a :class:`Figures`; targets.py judges it against the targets and
report.py writes it as markdown. Neither of those two runs anything, so either can be tried on
made-up figures without timing a thing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from timing import OtherLoad, Timing
from workloads import Workload

# How long a wave timed "after a pause" waits before each call: twenty times as long as a
# thread stays awake after its branch, so that every thread of the wave has gone to sleep.
PAUSE_S = 0.001

# How many context variables the caller has set for "wave N in context": each branch enters a
# copy of the caller's context, whatever it holds.
CONTEXT_VARIABLES = 16

# The three ways the chain is timed for tracing: the keys of `Figures.traced`.
TRACE_OFF = "`forward(0)`, no trace"
TRACE_ON = "`forward(0, trace=trace)`, `trace.clear()` before each call, untimed"
TRACE_CLEARED = "the same, `trace.clear()` inside the timed call (as criterion's)"


# The runners of the nested graph at scale (scale.py): the keys of `Scale.timings`.
NESTED_SOMA = "Soma"
NESTED_LOOP = "plain loop"
NESTED_WAVES = "ThreadPoolExecutor(8) waves"
NESTED_DASK = "Dask, scheduler=threads"

# Dask is left out at a size where it would take longer than this, building and timed calls
# together, judged from the size below: its delayed graph alone takes seconds at 10,000 nodes
# and grows faster than the nodes.
DASK_BUDGET_S = 60.0


@dataclass(frozen=True)
class Config:
    repeat: int
    heavy_repeat: int  # for the SVD graph, whose single run takes a few hundred ms
    sample_s: float
    warmup_s: float
    chain: int = 1_000
    fan: int = 1_000
    matrix: int = 800
    waves: tuple[int, ...] = (2, 8)
    memory_nodes: int = 100
    memory_mib: int = 200
    forwards: int = 10_000
    leak_checkpoint: int = 1_000
    # The nested graph's sizes, in nodes: each a multiple of its block of 8.
    nested: tuple[int, ...] = (1_000, 10_000, 100_000)
    # Building a graph (building.py): the sizes timed with node()/edge(), `>>`, `|` and
    # somatize, then the size timed with node()/edge() alone.
    building: tuple[int, ...] = (10_000, 100_000)
    building_calls_only: int | None = 1_000_000


FULL = Config(repeat=21, heavy_repeat=11, sample_s=0.05, warmup_s=0.3)
QUICK = Config(
    repeat=5,
    heavy_repeat=3,
    sample_s=0.01,
    warmup_s=0.05,
    nested=(1_000, 10_000),
    building_calls_only=None,
)


@dataclass(frozen=True)
class Row:
    """One runner on one graph: its timing, or why it has none."""

    runner: str
    timing: Timing | None = None
    setup_s: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Scale:
    """The nested graph at one size, as scale.py measured it in a process of its own."""

    nodes: int
    # Seconds per run of each runner that was timed, keyed by the NESTED_* names.
    timings: dict[str, Timing]
    # One-off setup, outside the time: the waves' plan read into tuples, Dask's delayed graph.
    setup_s: dict[str, float]
    dask_note: str  # why Dask was not run, or ""
    build_s: float  # the Soma graph, built with node()/edge()
    plan_first_s: float
    plan_cached_s: float  # the second call
    plan_later_s: float  # the median of the calls after it
    # A user's first forward: the graph just built, compile included, first in its process.
    first_forward_s: float
    threads_held: int  # `graph.threads()`, the most seen after the forwards
    os_threads_at_start: int
    os_threads: int  # the process's, after Soma's forwards and before any peer ran
    load: OtherLoad

    def per_node_us(self, runner: str) -> float:
        """Microseconds per node of a runner that was timed (Soma and the loop always are)."""
        return self.timings[runner].median_s / self.nodes * 1e6


@dataclass(frozen=True)
class Building:
    """Building a graph at one size, as building.py measured it in a process of its own: each
    figure the best of a few fresh builds, in seconds for all ``nodes``."""

    nodes: int
    node_s: float  # `g.node(id, obj)`, once per node
    edge_s: float  # `g.edge(a, b)`, once per edge of the chain: nodes - 1 calls
    # `e = e >> k` and `e = e | k` in a loop, then `Graph.somatize(e)`; None where only
    # node()/edge() were timed.
    chain_s: float | None
    chain_somatize_s: float | None
    wave_s: float | None
    wave_somatize_s: float | None
    # A plain Python loop linking one small object per node: the interpreter's own growth.
    plain_loop_s: float | None
    load: OtherLoad

    def per_call_us(self, figure: float) -> float:
        return figure / self.nodes * 1e6


@dataclass(frozen=True)
class Figures:
    """Everything one run measured, keyed as bench.py timed it."""

    config: Config
    quick: bool
    machine: list[tuple[str, str]]
    chain: Workload
    fan: Workload
    pair: Workload
    # Per graph, every runner against the peers (Ray's rows included).
    chain_rows: list[Row]
    fan_rows: list[Row]
    pair_rows: list[Row]
    # "Rust chain", "wave N", "wave N without carry", "wave N in context" and "loop N", timed in
    # batches of calls.
    small: dict[str, Timing]
    # "wave N" again, each call after a pause of PAUSE_S.
    paused: dict[str, Timing]
    # The chain without and with a trace, keyed by TRACE_OFF, TRACE_ON and TRACE_CLEARED.
    traced: dict[str, Timing]
    # memory.py's reports: "soma" and "loop" (peak RSS), "leak" (RSS over many forwards).
    memory: dict[str, dict[str, Any]]
    # The nested graph, one Scale per size of config.nested, smallest first.
    nested: list[Scale]
    # Building a graph, one Building per size, smallest first.
    building: list[Building]
    # ray_peer.py's report, or {"error": why it has none}.
    ray: dict[str, Any]
    # What other processes did while each group of figures was timed.
    load: dict[str, OtherLoad]
    load_average_at_end: tuple[float, float, float]


def median(rows: list[Row], runner: str) -> float:
    """The median time of ``runner``'s row, which must have been timed."""
    timing = next(row.timing for row in rows if row.runner == runner)
    assert timing is not None
    return timing.median_s


def building_at(sizes: list[Building], nodes: int) -> Building | None:
    """The building figures at ``nodes``, or None where that size was not run."""
    return next((size for size in sizes if size.nodes == nodes), None)


def scale_at(scales: list[Scale], nodes: int) -> Scale | None:
    """The nested graph's figures at ``nodes``, or None where that size was not run."""
    return next((scale for scale in scales if scale.nodes == nodes), None)
