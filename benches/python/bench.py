"""Soma from Python, against a plain loop and its peers, on one machine in one run.

    .venv/bin/python benches/python/bench.py [--quick] [--out PATH]

Prints markdown tables (and writes them to PATH): the machine, the targets and whether each
is met, memory, and per graph every runner's median with its ratio to Soma. Progress goes to
stderr. Timings are medians of interleaved repeats (see timing.py); nothing here asserts on a
time — a missed target is a row that says so.
"""

from __future__ import annotations

import os

# Before numpy is first imported (workloads imports it): OpenBLAS sizes its thread pool then,
# and a pool per branch would have the two branches of a wave fight over both cores, hiding
# what running them side by side gains. Each branch is one thread; the wave is the parallelism.
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import functools
import json
import math
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import peers
import soma
import workloads
from timing import OtherLoad, Timing, compare, once
from workloads import Workload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# How long a wave timed "after a pause" waits before each call: twenty times as long as a
# thread stays awake after its branch, so that every thread of the wave has gone to sleep.
PAUSE_S = 0.001


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


FULL = Config(repeat=21, heavy_repeat=11, sample_s=0.05, warmup_s=0.3)
QUICK = Config(repeat=5, heavy_repeat=3, sample_s=0.01, warmup_s=0.05)


@dataclass(frozen=True)
class Row:
    """One runner on one graph: its timing, or why it has none."""

    runner: str
    timing: Timing | None = None
    setup_s: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Target:
    what: str
    measured: str
    target: str
    met: bool
    load: OtherLoad | None = None  # what else ran meanwhile, for the timed targets


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _check(name: str, fn: Callable[[], Any], expected: Any) -> None:
    """A runner that computes something else than the plain loop is a bug, not a figure."""
    got = workloads.canonical(fn())
    if not _same(got, expected):
        raise AssertionError(f"{name} computed {got!r:.80}, the loop {expected!r:.80}")


# --- the machine -------------------------------------------------------------------------------


def _first_line(path: str, key: str) -> str:
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip() if ":" in line else line.strip()
    except OSError:
        pass
    return "unknown"


def _command(*argv: str) -> str:
    # Without the thread variables set above: GNU nproc would report OMP_NUM_THREADS.
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return done.stdout.strip()


def machine() -> list[tuple[str, str]]:
    os_name = _first_line("/etc/os-release", "PRETTY_NAME=").removeprefix("PRETTY_NAME=")
    mem_kib = _first_line("/proc/meminfo", "MemTotal").split()[0]
    dirty = " (with uncommitted changes)" if _command("git", "status", "--porcelain") else ""
    versions = ", ".join(f"{package} {_version(package)}" for package in ("numpy", "dask", "ray"))
    return [
        ("date", f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}"),
        ("cores (`nproc`)", _command("nproc")),
        ("CPU", _first_line("/proc/cpuinfo", "model name")),
        ("memory", f"{int(mem_kib) / 1024**2:.1f} GiB" if mem_kib.isdigit() else "unknown"),
        ("OS", f"{os_name.strip(chr(34))}, Linux {platform.release()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("rustc", _command("rustc", "--version")),
        ("packages", versions),
        ("commit", _command("git", "rev-parse", "--short", "HEAD") + dirty),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
    ]


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


# --- measuring ---------------------------------------------------------------------------------


def _dask_rows(workload: Workload) -> tuple[dict[str, Callable[[], Any]], dict[str, float], str]:
    try:
        import dask  # noqa: F401 -- only whether it is there
    except ImportError:
        return {}, {}, "not run: dask is not installed (`make bench` installs it)"
    runners, setups = {}, {}
    for scheduler in ("threads", "synchronous"):
        run, built_s = peers.dask_runner(workload, scheduler)
        runners[f"Dask, scheduler={scheduler}"] = run
        setups[f"Dask, scheduler={scheduler}"] = built_s
    return runners, setups, ""


def run_graph(
    workload: Workload,
    config: Config,
    pool: ThreadPoolExecutor,
    *,
    repeat: int,
    extra: dict[str, Callable[[], Any]] | None = None,
) -> list[Row]:
    """Soma, the loop, the pool and Dask on ``workload``, timed side by side."""
    expected = workloads.canonical(workload.loop(workload.input))
    soma_setup = once(lambda: workload.soma_graph().plan())
    graph = workload.soma_graph()
    graph.plan()
    runners: dict[str, Callable[[], Any]] = {
        "Soma": lambda: graph.forward(workload.input),
        "plain loop": lambda: workload.loop(workload.input),
        "ThreadPoolExecutor": peers.threadpool_runner(workload, pool),
    }
    setups = {"Soma": soma_setup}
    dask_runners, dask_setups, dask_note = _dask_rows(workload)
    runners |= dask_runners
    setups |= dask_setups
    for name, fn in runners.items():
        _check(name, fn, expected)
    runners |= extra or {}
    timings = compare(runners, repeat=repeat, sample_s=config.sample_s, warmup_s=config.warmup_s)
    rows = [Row(name, timings[name], setups.get(name)) for name in runners]
    if dask_note:
        rows.append(Row("Dask", note=dask_note))
    return rows


def run_ray(config: Config) -> dict[str, Any]:
    """Ray's figures, from a process of its own (see ray_peer.py)."""
    argv = [
        sys.executable,
        str(HERE / "ray_peer.py"),
        f"--repeat={config.repeat}",
        f"--heavy-repeat={config.heavy_repeat}",
        f"--sample-s={config.sample_s}",
        f"--warmup-s={config.warmup_s}",
        f"--chain={config.chain}",
        f"--fan={config.fan}",
        f"--matrix={config.matrix}",
    ]
    # Ray would otherwise write an authentication token under the home directory.
    env = os.environ | {"RAY_AUTH_MODE": "disabled"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "did not finish within 20 minutes"}
    lines = done.stdout.strip().splitlines()
    try:
        report: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exited {done.returncode}: {tail[:160]}"}
    return report


def _ray_row(report: dict[str, Any], key: str, expected: Any, what: str = "compiled graph") -> Row:
    name = f"Ray {report.get('version', '')} {what}".replace("  ", " ")
    if "error" in report:
        return Row(name, note=f"not run: {report['error']}")
    result = report["results"].get(key, {"error": "no result"})
    if "error" in result:
        return Row(name, note=f"not run: {result['error']}")
    if not _same(result["result"], expected):
        return Row(name, note=f"wrong result: {result['result']!r:.60}")
    fields = {field: result[field] for field in Timing.__dataclass_fields__}
    return Row(name, Timing(**fields), result["setup_s"] or None, "separate process, see notes")


def memory(config: Config) -> dict[str, dict[str, Any]]:
    reports = {}
    checks = {
        "soma": ["peak", "--runner=soma"],
        "loop": ["peak", "--runner=loop"],
        "leak": ["leak"],
    }
    sizes = {
        "peak": [f"--nodes={config.memory_nodes}", f"--mib={config.memory_mib}"],
        "leak": [f"--forwards={config.forwards}", f"--checkpoint={config.leak_checkpoint}"],
    }
    for key, argv in checks.items():
        done = subprocess.run(
            [sys.executable, str(HERE / "memory.py"), *argv, *sizes[argv[0]]],
            capture_output=True,
            text=True,
            check=True,
        )
        reports[key] = json.loads(done.stdout.strip().splitlines()[-1])
    return reports


# --- formatting --------------------------------------------------------------------------------


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


def _pause() -> None:
    """The step before each call of a wave timed after a pause: long enough for every thread
    that stays awake after a wave to have gone to sleep."""
    time.sleep(PAUSE_S)


def _nothing() -> None:
    """The step before each call of an untraced contender: timed the same way, nothing done."""


def _cleared_then_traced(graph: soma.Graph, trace: soma.Trace) -> Any:
    trace.clear()
    return graph.forward(0, trace=trace)


TRACE_OFF = "`forward(0)`, no trace"
TRACE_ON = "`forward(0, trace=trace)`, `trace.clear()` before each call, untimed"
TRACE_CLEARED = "the same, `trace.clear()` inside the timed call (as criterion's)"


def tracing_contenders(
    workload: Workload,
) -> tuple[dict[str, Callable[[], Any]], dict[str, Callable[[], object]]]:
    """The chain run without a trace, with one emptied between calls outside the time, and
    with one emptied inside the timed call; all three timed call by call."""
    graph = workload.soma_graph()
    graph.plan()
    trace, cleared_inside = soma.Trace(), soma.Trace()
    expected = workload.loop(workload.input)
    assert graph.forward(0) == expected
    assert graph.forward(0, trace=trace) == expected
    assert len(trace) == len(workload.nodes)
    contenders: dict[str, Callable[[], Any]] = {
        TRACE_OFF: lambda: graph.forward(0),
        TRACE_ON: lambda: graph.forward(0, trace=trace),
        TRACE_CLEARED: functools.partial(_cleared_then_traced, graph, cleared_inside),
    }
    prepare: dict[str, Callable[[], object]] = {
        TRACE_OFF: _nothing,
        TRACE_ON: trace.clear,
        TRACE_CLEARED: _nothing,
    }
    return contenders, prepare


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


# --- the run -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats: a smoke run")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    parser.add_argument("--skip-ray", action="store_true", help="leave Ray out (it is slow)")
    args = parser.parse_args()
    config = QUICK if args.quick else FULL
    about = machine()
    out: list[str] = ["## Python benchmarks", ""]
    out += _table(["", ""], [[k, v] for k, v in about])
    out += [
        "",
        f"Medians of {config.repeat} interleaved samples ({config.heavy_repeat} for the SVD "
        f"graph), each of calls adding up to about {config.sample_s * 1e3:.0f} ms, after "
        f"{config.warmup_s * 1e3:.0f} ms of warm-up per runner"
        + (" (`--quick`)" if args.quick else "")
        + ". Spread: half the interquartile range, relative to the median. "
        "BLAS is limited to one thread per call.",
        "",
    ]

    chain, fan, pair = (
        workloads.chain(config.chain),
        workloads.fan_out(config.fan),
        workloads.numpy_pair(config.matrix),
    )
    load = {name: OtherLoad() for name in ("chain", "fan", "pair", "small", "paused", "trace")}
    pool = ThreadPoolExecutor()  # default size: min(32, cores + 4) threads
    try:
        log(f"timing the {chain.name} ...")
        with load["chain"]:
            chain_rows = run_graph(chain, config, pool, repeat=config.repeat)
        log(f"timing the {fan.name} ...")
        with load["fan"]:
            fan_rows = run_graph(fan, config, pool, repeat=config.repeat)
        log(f"timing the {pair.name} ...")
        in_series = workloads.numpy_pair_in_series(config.matrix)
        with load["pair"]:
            pair_rows = run_graph(
                pair,
                config,
                pool,
                repeat=config.heavy_repeat,
                extra={"Soma, the same nodes in series": lambda: in_series.forward(0)},
            )
    finally:
        pool.shutdown()

    log("timing Rust nodes and waves from Python ...")
    native = workloads.native_chain(config.chain)
    native.plan()
    small: dict[str, Callable[[], Any]] = {"Rust chain": lambda: native.forward(0)}
    paused: dict[str, Callable[[], Any]] = {}
    for width in config.waves:
        graph, loop = workloads.wave(width)
        assert graph.plan().kind == "Wave", graph.plan()
        small[f"wave {width}"] = functools.partial(graph.forward, 0)
        small[f"loop {width}"] = functools.partial(loop, 0)
        paused[f"wave {width}"] = small[f"wave {width}"]
    assert native.forward(0) == config.chain
    with load["small"]:
        small_t = compare(
            small, repeat=config.repeat, sample_s=config.sample_s, warmup_s=config.warmup_s
        )
    # The same waves, each call after a pause in which their threads, and this one, go to
    # sleep: what a wave costs when nothing ran just before it. Samples a tenth as long, since
    # every call also sleeps.
    with load["paused"]:
        paused_t = compare(
            paused,
            repeat=config.repeat,
            sample_s=config.sample_s / 10,
            warmup_s=config.warmup_s / 10,
            prepare={name: _pause for name in paused},
        )

    log("timing the chain with and without a trace ...")
    traced, prepare = tracing_contenders(chain)
    with load["trace"]:
        trace_t = compare(
            traced,
            repeat=config.repeat,
            sample_s=config.sample_s,
            warmup_s=config.warmup_s,
            prepare=prepare,
        )

    log("memory, in fresh processes ...")
    mem = memory(config)

    ray_report: dict[str, Any] = {"error": "skipped with --skip-ray"}
    if not args.skip_ray:
        log("Ray, in a process of its own ...")
        ray_report = run_ray(config)
    for rows, workload, key in (
        (chain_rows, chain, "chain"),
        (fan_rows, fan, "fan_out"),
        (pair_rows, pair, "numpy_pair"),
    ):
        expected = workloads.canonical(workload.loop(workload.input))
        rows.append(_ray_row(ray_report, key, expected))
        if key == "numpy_pair" and "numpy_pair_calls" in ray_report.get("results", {}):
            rows.append(_ray_row(ray_report, "numpy_pair_calls", expected, "actors, plain calls"))

    # --- targets ---
    def median(rows: list[Row], name: str) -> float:
        timing = next(row.timing for row in rows if row.runner == name)
        assert timing is not None
        return timing.median_s

    soma_chain, loop_chain = median(chain_rows, "Soma"), median(chain_rows, "plain loop")
    chain_ratio = soma_chain / loop_chain
    speedup = median(pair_rows, "Soma, the same nodes in series") / median(pair_rows, "Soma")
    pool_speedup = median(pair_rows, "plain loop") / median(pair_rows, "ThreadPoolExecutor")
    peak_added_mb = mem["soma"]["added_kib"] * 1024 / 1e6
    loop_added_mb = mem["loop"]["added_kib"] * 1024 / 1e6
    targets = [
        Target(
            f"chain of {config.chain:,} Python nodes: Soma / plain loop",
            f"{soma_chain / config.chain * 1e6:.3f} vs {loop_chain / config.chain * 1e6:.3f} "
            f"µs/node = {chain_ratio:.2f}x",
            "≤ 3x (goal 2x)",
            chain_ratio <= 3,
            load["chain"],
        )
    ]
    for width in config.waves:
        per_branch = small_t[f"wave {width}"].median_s / width * 1e6
        loop_branch = small_t[f"loop {width}"].median_s / width * 1e6
        targets.append(
            Target(
                f"wave of {width} trivial Python branches, per branch",
                f"{per_branch:.1f} µs (loop: {loop_branch:.3f} µs)",
                "< 30 µs",
                per_branch < 30,
                load["small"],
            )
        )
    targets += [
        Target(
            "two SVD branches: in series / as a wave",
            f"{speedup:.2f}x (ThreadPoolExecutor over the loop: {pool_speedup:.2f}x)",
            "≥ 1.8x",
            speedup >= 1.8,
            load["pair"],
        ),
        Target(
            f"{config.memory_mib} MiB array through {config.memory_nodes} nodes: peak RSS added",
            f"{peak_added_mb:.2f} MB (plain loop: {loop_added_mb:.2f} MB)",
            "< 5 MB",
            peak_added_mb < 5 and bool(mem["soma"]["same_object"]),
        ),
        Target(
            f"{config.forwards:,} forwards of a waved graph: RSS from forward "
            f"{config.leak_checkpoint:,} to {config.forwards:,}",
            f"{mem['leak']['resident_at_checkpoint_kib'] / 1024:.1f} -> "
            f"{mem['leak']['resident_at_end_kib'] / 1024:.1f} MiB "
            f"({mem['leak']['growth'] * 100:+.1f}%)",
            "within 5%",
            abs(mem["leak"]["growth"]) <= 0.05,
        ),
    ]
    out += ["### Targets", ""]
    out += _table(
        ["measure", "measured", "target", "met", "others' load"],
        [
            [
                t.what,
                t.measured,
                t.target,
                "yes" if t.met else "**no**",
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
    out += tracing_table(trace_t, len(chain.nodes))
    batch_us = median(chain_rows, "Soma") / config.chain * 1e6
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

    out += ["", "### Against the peers", ""]
    out += [f"#### {chain.name} trivial Python nodes (`x + 1`)", ""]
    out += overhead_table(chain_rows, len(chain.nodes))
    out += ["", _disturbed(load["chain"])]
    out += ["", f"#### {fan.name} (trivial nodes; the join sums a dict of 1,000)", ""]
    out += overhead_table(fan_rows, len(fan.nodes))
    out += ["", _disturbed(load["fan"])]
    out += ["", f"#### {pair.name}: a wave of two", ""]
    out += parallel_table(pair_rows)
    out += ["", _disturbed(load["pair"])]
    ray_init = ray_report.get("init_s")
    out += [
        "",
        "Notes: Soma's setup is building the graph and compiling its plan. Dask is timed on "
        "`dask.compute` of a delayed graph built beforehand (`pure=False`); building it is the "
        "setup column. ThreadPoolExecutor: a driver loop submits each node once it holds the "
        "results of its inputs, waiting on their futures; the pool has the default "
        "min(32, cores + 4) threads. Ray runs in a process of its own after the others "
        "(not interleaved with them): one actor holds every node of the chain and the "
        "fan-out, two actors hold one SVD branch each; its setup is `experimental_compile`"
        + (f", after {ray_init:.1f} s of `ray.init`" if ray_init else "")
        + ". Ray's plain calls: the same two actors called with `.remote()`, no compiled graph.",
        "",
        f"Load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
    ]
    text = "\n".join(out)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        log(f"written to {args.out}")


if __name__ == "__main__":
    main()
