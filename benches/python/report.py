"""The Python benchmark's figures as markdown: the machine, the targets, then every table.

Only formatting: it reads a :class:`figures.Figures` and the targets judged from it, and times
nothing, so its output can be checked on made-up figures.
"""

from __future__ import annotations

from figures import (
    CONTEXT_VARIABLES,
    NESTED_DASK,
    NESTED_LOOP,
    NESTED_SOMA,
    NESTED_WAVES,
    PAUSE_S,
    TRACE_OFF,
    Building,
    Figures,
    Row,
    Scale,
    median,
)
from targets import Target
from timing import OtherLoad, Timing


def _duration(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _disturbed(load: OtherLoad, when: str = "this was timed") -> str:
    if load.share is None:
        return f"_Other processes' load while {when}: unknown (no /proc/stat)._"
    return (
        f"_While {when}, other processes kept {load.share * 100:.0f}% of the machine's cores busy._"
    )


def _ratio(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    align = ["---"] + ["---:"] * (len(header) - 1)
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(align) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def overhead_table(rows: list[Row], nodes: int) -> list[str]:
    """Trivial nodes: the time per node is the runner's overhead, the loop its floor."""
    by_name = {row.runner: row for row in rows}
    soma_s = by_name["Soma"].timing.median_s  # type: ignore[union-attr]
    loop_s = by_name["plain loop"].timing.median_s  # type: ignore[union-attr]
    body = []
    for row in rows:
        if row.timing is None:
            body.append([row.runner, row.note, "", "", "", "", ""])
            continue
        t = row.timing.median_s
        body.append(
            [
                row.runner + (f" ({row.note})" if row.note else ""),
                _duration(t),
                f"{t / nodes * 1e6:.3f}",
                f"{(t - loop_s) / nodes * 1e6:.3f}",
                _ratio(t / soma_s),
                f"±{row.timing.spread * 50:.0f}%",
                _duration(row.setup_s) if row.setup_s is not None else "—",
            ]
        )
    header = [
        "runner",
        "median per run",
        "µs/node",
        "over the loop, µs/node",
        "time / Soma's",
        "spread",
        "one-off setup",
    ]
    return _table(header, body)


def parallel_table(rows: list[Row]) -> list[str]:
    """Heavy nodes: what matters is the speed-up over running them one after the other."""
    by_name = {row.runner: row for row in rows}
    soma_s = by_name["Soma"].timing.median_s  # type: ignore[union-attr]
    loop_s = by_name["plain loop"].timing.median_s  # type: ignore[union-attr]
    body = []
    for row in rows:
        if row.timing is None:
            body.append([row.runner, row.note, "", "", "", ""])
            continue
        t = row.timing.median_s
        body.append(
            [
                row.runner + (f" ({row.note})" if row.note else ""),
                _duration(t),
                f"{loop_s / t:.2f}x",
                _ratio(t / soma_s),
                f"±{row.timing.spread * 50:.0f}%",
                _duration(row.setup_s) if row.setup_s is not None else "—",
            ]
        )
    header = [
        "runner",
        "median per run",
        "speed-up over the loop",
        "time / Soma's",
        "spread",
        "one-off setup",
    ]
    return _table(header, body)


def tracing_table(timings: dict[str, Timing], nodes: int) -> list[str]:
    off_s = timings[TRACE_OFF].median_s
    body = [
        [
            name,
            _duration(t.median_s),
            f"{t.median_s / nodes * 1e6:.3f}",
            f"{(t.median_s - off_s) / nodes * 1e6:+.3f}",
            f"{t.median_s / off_s:.2f}x",
            f"±{t.spread * 50:.0f}%",
        ]
        for name, t in timings.items()
    ]
    header = [
        "run",
        "median per run",
        "µs/node",
        "added by the trace, µs/node",
        "time / untraced",
        "spread",
    ]
    return _table(header, body)


def _met(met: bool | None) -> str:
    if met is None:
        return "not measured"
    return "yes" if met else "**no**"


def building_table(sizes: list[Building]) -> list[str]:
    """Building a graph at each size: per call, and the DSL's loops and somatize in all."""

    def total(seconds: float | None) -> str:
        return "not run" if seconds is None else _duration(seconds)

    return _table(
        [
            "nodes",
            "`node()` per call",
            "`edge()` per call",
            "`>>` loop",
            "its `somatize`",
            "`\\|` loop",  # escaped: a bare `|` would end the cell
            "its `somatize`",
            "plain loop",
        ],
        [
            [
                f"{s.nodes:,}",
                f"{s.per_call_us(s.node_s):.2f} µs",
                f"{s.per_call_us(s.edge_s):.2f} µs",
                total(s.chain_s),
                total(s.chain_somatize_s),
                total(s.wave_s),
                total(s.wave_somatize_s),
                total(s.plain_loop_s),
            ]
            for s in sizes
        ],
    )


def nested_tables(scales: list[Scale]) -> list[str]:
    """The nested graph at each size: every runner per node, plan() and threads, then ratios."""
    body = []
    for scale in scales:
        soma = scale.timings[NESTED_SOMA]
        per_node = {
            runner: f"{scale.per_node_us(runner):.3f}" if runner in scale.timings else "not run"
            for runner in (NESTED_WAVES, NESTED_DASK, NESTED_LOOP)
        }
        body.append(
            [
                f"{scale.nodes:,}",
                f"{scale.per_node_us(NESTED_SOMA):.3f} ±{soma.spread * 50:.0f}%",
                f"{scale.first_forward_s / scale.nodes * 1e6:.3f}",
                per_node[NESTED_WAVES],
                per_node[NESTED_DASK],
                per_node[NESTED_LOOP],
                f"{scale.plan_first_s * 1e3:.2f}",
                f"{scale.plan_cached_s * 1e6:.2f} ({scale.plan_later_s * 1e6:.2f})",
                f"{scale.threads_held}",
                f"{scale.os_threads} ({scale.os_threads_at_start})",
            ]
        )
    out = _table(
        [
            "nodes",
            "Soma steady µs/node",
            "first forward, compile included, µs/node",
            "TPE waves µs/node",
            "Dask µs/node",
            "loop µs/node",
            "plan() first ms",
            "plan() cached µs: 2nd call (later)",
            "threads held",
            "OS threads (at start)",
        ],
        body,
    )
    if not scales:
        return out
    smallest = scales[0]
    ratios = []
    for below, scale in zip([None, *scales], scales, strict=False):
        soma_s = scale.timings[NESTED_SOMA].median_s
        over = {
            runner: _ratio(scale.timings[runner].median_s / soma_s)
            if runner in scale.timings
            else "—"
            for runner in (NESTED_WAVES, NESTED_DASK)
        }
        ratios.append(
            [
                f"{scale.nodes:,}",
                _ratio(soma_s / scale.timings[NESTED_LOOP].median_s),
                over[NESTED_WAVES],
                over[NESTED_DASK],
                f"{scale.first_forward_s / soma_s:.2f}",
                f"{scale.per_node_us(NESTED_SOMA) / smallest.per_node_us(NESTED_SOMA):.2f}",
                f"{scale.per_node_us(NESTED_LOOP) / smallest.per_node_us(NESTED_LOOP):.2f}",
                "—" if below is None else f"{scale.plan_first_s / below.plan_first_s:.1f}",
            ]
        )
    out += [""]
    out += _table(
        [
            "nodes",
            "Soma / loop",
            "TPE waves / Soma",
            "Dask / Soma",
            "first forward (compile included) / steady",
            f"Soma per node / at {smallest.nodes:,}",
            f"loop per node / at {smallest.nodes:,}",
            "plan() first / row above",
        ],
        ratios,
    )
    return out


def write(figures: Figures, targets: list[Target]) -> str:
    """The whole report, as the benchmark prints it and writes it to ``--out``."""
    config, load, mem = figures.config, figures.load, figures.memory
    chain, fan, pair = figures.chain, figures.fan, figures.pair
    small_t, paused_t = figures.small, figures.paused
    out: list[str] = ["## Python benchmarks", ""]
    out += _table(["", ""], [[k, v] for k, v in figures.machine])
    out += [
        "",
        f"Medians of {config.repeat} interleaved samples ({config.heavy_repeat} for the SVD "
        f"graph), each of calls adding up to about {config.sample_s * 1e3:.0f} ms, after "
        f"{config.warmup_s * 1e3:.0f} ms of warm-up per runner"
        + (" (`--quick`)" if figures.quick else "")
        + ". Spread: half the interquartile range, relative to the median. "
        "BLAS is limited to one thread per call.",
        "",
    ]

    out += ["### Targets", ""]
    out += _table(
        ["measure", "measured", "target", "met", "others' load"],
        [
            [
                t.what,
                t.measured,
                str(t.target),
                _met(t.met),
                "—" if t.load is None or t.load.share is None else f"{t.load.share * 100:.0f}%",
            ]
            for t in targets
        ],
    )
    out += [
        "",
        "Others' load: the share of the machine's cores that other processes kept busy while "
        "the figure was timed (this benchmark's own threads excluded). On two cores, a wave "
        "cannot overlap its branches when another process holds a core.",
    ]

    out += ["", "### Soma from Python, beside the plain loop", ""]
    native_ns = small_t["Rust chain"].median_s / config.chain * 1e9
    body = [
        [
            f"chain of {config.chain:,} Rust nodes (`soma.native.Add(1)`)",
            _duration(small_t["Rust chain"].median_s),
            f"{native_ns:.1f} ns/node",
            "—",
        ]
    ]
    for width in config.waves:
        soma_t, loop_t = small_t[f"wave {width}"], small_t[f"loop {width}"]
        body.append(
            [
                f"wave of {width} trivial Python branches",
                _duration(soma_t.median_s),
                f"{soma_t.median_s / width * 1e6:.2f} µs/branch",
                f"{loop_t.median_s / width * 1e6:.3f} µs/branch",
            ]
        )
    for width in config.waves:
        bare_t = small_t[f"wave {width} without carry"]
        body.append(
            [
                f"the same wave of {width}, context carry switched off (branches run in what"
                " their threads hold; timed in the same rounds, for the cost of carrying it)",
                _duration(bare_t.median_s),
                f"{bare_t.median_s / width * 1e6:.2f} µs/branch",
                "—",
            ]
        )
    for width in config.waves:
        rich_t = small_t[f"wave {width} in context"]
        body.append(
            [
                f"the same wave of {width}, called with {CONTEXT_VARIABLES} context variables set"
                " (each branch enters a copy of the caller's context)",
                _duration(rich_t.median_s),
                f"{rich_t.median_s / width * 1e6:.2f} µs/branch",
                "—",
            ]
        )
    for width in config.waves:
        paused_s = paused_t[f"wave {width}"].median_s
        body.append(
            [
                f"the same wave of {width}, each call after a {PAUSE_S * 1e3:.0f} ms pause",
                _duration(paused_s),
                f"{paused_s / width * 1e6:.2f} µs/branch",
                "—",
            ]
        )
    out += _table(["graph", "Soma, per run", "Soma, per unit", "plain loop, per unit"], body)
    out += [
        "",
        "Calls in a batch find a wave's threads awake (a thread stays awake 50 µs after its "
        "branch); after a pause they have gone to sleep, and the wave wakes them.",
        "",
        _disturbed(load["small"], "the batches were timed"),
        _disturbed(load["paused"], "the calls after a pause were timed"),
    ]

    out += ["", f"### Tracing: the {chain.name} trivial Python nodes", ""]
    out += tracing_table(figures.traced, len(chain.nodes))
    batch_us = median(figures.chain_rows, "Soma") / config.chain * 1e6
    out += [
        "",
        "Each call timed on its own, so that emptying the trace between calls is left out of "
        "the time; the three runs are interleaved. The untraced run is the Soma row of the "
        f"chain in the peers table below, timed there in batches of calls: {batch_us:.3f} "
        "µs/node.",
        "",
        _disturbed(load["trace"]),
    ]

    out += ["", "### Memory (fresh processes)", ""]
    out += _table(
        ["check", "before", "after", "added"],
        [
            [
                f"{config.memory_mib} MiB array, {config.memory_nodes} nodes, {who}: peak RSS",
                f"{mem[who]['peak_after_array_kib'] / 1024:.1f} MiB",
                f"{mem[who]['peak_after_forward_kib'] / 1024:.1f} MiB",
                f"{mem[who]['added_kib']:,} KiB",
            ]
            for who in ("soma", "loop")
        ]
        + [
            [
                f"waved graph, RSS at forward {config.leak_checkpoint:,} and {config.forwards:,}",
                f"{mem['leak']['resident_at_checkpoint_kib'] / 1024:.1f} MiB",
                f"{mem['leak']['resident_at_end_kib'] / 1024:.1f} MiB",
                f"{mem['leak']['growth'] * 100:+.2f}%",
            ]
        ],
    )

    out += ["", "### The nested graph at scale (a fresh process per size)", ""]
    out += [
        "Blocks `a >> ((b >> c) | d | (e >> (f | g))) >> h` of trivial Python nodes, chained "
        "(the `h` of each block feeds the `a` of the next; `h` passes the largest of its four "
        "inputs on), built with `node()`/`edge()`: four wide, waves nested two deep.",
        "",
    ]
    out += nested_tables(figures.nested)
    dask_notes = [
        f"{scale.nodes:,} nodes: {scale.dask_note}" for scale in figures.nested if scale.dask_note
    ]
    setup_names = {NESTED_WAVES: "the plan read into tuples", NESTED_DASK: "Dask's delayed graph"}
    setups = [
        f"{scale.nodes:,} nodes: Soma's graph {_duration(scale.build_s)}"
        + "".join(
            f", {setup_names.get(runner, runner)} {_duration(seconds)}"
            for runner, seconds in scale.setup_s.items()
        )
        for scale in figures.nested
    ]
    out += [
        "",
        "Per size, in this order in one process: the graph built and its first forward timed "
        "once, as a user's first forward is: compile included, its program not yet resolved, "
        "the graph holding no thread yet, its nodes never called; then a second graph built "
        "the same way and never run, its `plan()` called twice (the second call timed on its "
        "own; in brackets the median of 101 more; its first call after the first graph's "
        "compile), Soma run alone for a while and the threads counted "
        "(`graph.threads()`; the process's, from `/proc/self/task`, main thread and the thread "
        "Soma keeps in reserve included, before any peer started one), then Soma's "
        "steady forwards, the loop, the waves run by hand and Dask timed side by side, "
        "interleaved. Threads held: the most `graph.threads()` showed after the forwards. "
        "TPE waves: Soma's own plan walked by hand, a Sequence's children in order, a Wave's "
        "branches submitted to a `ThreadPoolExecutor(8)` and waited on, values in a dict. "
        "Dask: `dask.compute` of a delayed graph built beforehand, threaded scheduler.",
        *(["", "Dask not run: " + "; ".join(dask_notes) + "."] if dask_notes else []),
        "",
        "One-off setup, untimed: " + "; ".join(setups) + ".",
        "",
        *(
            _disturbed(scale.load, f"the {scale.nodes:,} nodes were measured")
            for scale in figures.nested
        ),
    ]

    out += ["", "### Building a graph (a fresh process per size)", ""]
    out += building_table(figures.building)
    out += [
        "",
        "Per size, each figure the best of three fresh builds of trivial Python nodes, their "
        "objects made beforehand: a chain added with `g.node(id, obj)`, then its edges with "
        "`g.edge(a, b)`; the chain written `e = e >> k` in a loop, and a wave written "
        "`e = e \\| k`, each then turned into a graph with `soma.Graph.somatize(e)`; and a plain "
        "loop linking one small object per node to the one before (what `>>` in a loop does at "
        "the least: the interpreter's and the machine's own growth with size). The largest "
        "size times `node()`/`edge()` alone.",
        "",
        *(
            _disturbed(size.load, f"the {size.nodes:,} nodes were built")
            for size in figures.building
        ),
    ]

    out += ["", "### Against the peers", ""]
    out += [f"#### {chain.name} trivial Python nodes (`x + 1`)", ""]
    out += overhead_table(figures.chain_rows, len(chain.nodes))
    out += ["", _disturbed(load["chain"])]
    out += ["", f"#### {fan.name} (trivial nodes; the join sums a dict of 1,000)", ""]
    out += overhead_table(figures.fan_rows, len(fan.nodes))
    out += ["", _disturbed(load["fan"])]
    out += ["", f"#### {pair.name}: a wave of two", ""]
    out += parallel_table(figures.pair_rows)
    out += ["", _disturbed(load["pair"])]
    ray_init = figures.ray.get("init_s")
    out += [
        "",
        "Notes: Soma's setup is building the graph and compiling its plan. Dask is timed on "
        "`dask.compute` of a delayed graph built beforehand (`pure=False`); building it is the "
        "setup column; a join's inputs are passed to it as arguments of their own and the "
        "dict made when it runs (a dict of delayed values has Dask optimise the whole past of "
        "each as the graph is built). ThreadPoolExecutor: a driver loop submits each node once "
        "it holds the results of its inputs, waiting on their futures; the pool has the default "
        "min(32, cores + 4) threads. Ray runs in a process of its own after the others "
        "(not interleaved with them): one actor holds every node of the chain and the "
        "fan-out, two actors hold one SVD branch each; its setup is `experimental_compile`"
        + (f", after {ray_init:.1f} s of `ray.init`" if ray_init else "")
        + ". Ray's plain calls: the same two actors called with `.remote()`, no compiled graph.",
        "",
        f"Load average at the end: {' '.join(f'{x:.2f}' for x in figures.load_average_at_end)}.",
        "",
    ]
    return "\n".join(out)
