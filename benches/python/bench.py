"""Soma from Python, against a plain loop and its peers, on one machine in one run.

    .venv/bin/python benches/python/bench.py [--quick] [--out PATH]

Prints markdown tables (and writes them to PATH): the machine, the targets and whether each
is met, memory, and per graph every runner's median with its ratio to Soma. Progress goes to
stderr. Timings are medians of interleaved repeats (see timing.py); nothing here asserts on a
time — a missed target is a row that says so.

This file measures and fills a ``figures.Figures``; targets.py judges it against the targets,
each bound stated once there, and report.py writes it as markdown.
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
import contextlib
import functools
import json
import math
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import peers
import report
import soma
import targets
import workloads
from figures import (
    CONTEXT_VARIABLES,
    DASK_BUDGET_S,
    FULL,
    NESTED_DASK,
    PAUSE_S,
    QUICK,
    TRACE_CLEARED,
    TRACE_OFF,
    TRACE_ON,
    Building,
    Config,
    Figures,
    Row,
    Scale,
)
from timing import OtherLoad, Setting, Timing, compare, once
from workloads import Workload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


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


def _dask_too_long(below: Scale | None, nodes: int) -> str:
    """Why Dask is left out at ``nodes``, or "" to run it: left out when at the size below it
    took more than its share of DASK_BUDGET_S, since ten times the nodes take at least ten
    times as long (its delayed graph takes longer still to build). Nothing is extrapolated
    into the tables: the size is reported as not run, with this reason."""
    if below is None:
        return ""
    if NESTED_DASK not in below.timings:
        return below.dask_note  # not installed, or too long already
    run = below.timings[NESTED_DASK]
    # Its timed calls: the samples, and at least two of warm-up.
    calls = run.samples * run.calls_per_sample + 2
    took_s = below.setup_s[NESTED_DASK] + calls * run.median_s
    growth = nodes / below.nodes
    if took_s * growth <= DASK_BUDGET_S:
        return ""
    return (
        f"at {below.nodes:,} nodes Dask took {took_s:.0f} s (its delayed graph built in "
        f"{below.setup_s[NESTED_DASK]:.0f} s, then {calls} runs); {growth:g}x the nodes would "
        f"take at least {growth:g}x as long, over the {DASK_BUDGET_S:.0f} s allowed"
    )


def nested_at_scale(config: Config) -> list[Scale]:
    """The nested graph at each size, each in a fresh process (see scale.py)."""
    scales: list[Scale] = []
    for nodes in config.nested:
        skip_dask = _dask_too_long(scales[-1] if scales else None, nodes)
        log(f"the nested graph of {nodes:,} nodes, in a fresh process ...")
        argv = [
            sys.executable,
            str(HERE / "scale.py"),
            f"--nodes={nodes}",
            f"--repeat={config.repeat}",
            f"--sample-s={config.sample_s}",
            f"--warmup-s={config.warmup_s}",
            f"--skip-dask={skip_dask}",
        ]
        # The child's time is this process's own (os.times counts waited-for children), so the
        # load is other processes' alone.
        with OtherLoad() as load:
            done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"scale.py --nodes={nodes} exited {done.returncode}:\n{done.stderr}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        timings = {name: Timing(**fields) for name, fields in got.pop("timings").items()}
        scales.append(Scale(timings=timings, load=load, **got))
    return scales


def building_at_scale(config: Config) -> list[Building]:
    """Building a graph at each size, each in a fresh process (see building.py)."""
    sizes = [(nodes, False) for nodes in config.building]
    if config.building_calls_only is not None:
        sizes.append((config.building_calls_only, True))
    built: list[Building] = []
    for nodes, only_calls in sizes:
        log(f"building graphs of {nodes:,} nodes, in a fresh process ...")
        argv = [sys.executable, str(HERE / "building.py"), f"--nodes={nodes}"]
        if only_calls:
            argv.append("--only-calls")
        with OtherLoad() as load:
            done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(
                f"building.py --nodes={nodes} exited {done.returncode}:\n{done.stderr}"
            )
        got = json.loads(done.stdout.strip().splitlines()[-1])
        built.append(
            Building(
                nodes=got["nodes"],
                node_s=got["node_s"],
                edge_s=got["edge_s"],
                chain_s=got.get("chain_s"),
                chain_somatize_s=got.get("chain_somatize_s"),
                wave_s=got.get("wave_s"),
                wave_somatize_s=got.get("wave_somatize_s"),
                plain_loop_s=got.get("plain_loop_s"),
                load=load,
            )
        )
    return built


def _pause() -> None:
    """The step before each call of a wave timed after a pause: long enough for every thread
    that stays awake after a wave to have gone to sleep."""
    time.sleep(PAUSE_S)


def _nothing() -> None:
    """The step before each call of an untraced contender: timed the same way, nothing done."""


def _cleared_then_traced(graph: soma.Graph, trace: soma.Trace) -> Any:
    trace.clear()
    return graph.forward(0, trace=trace)


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


@contextlib.contextmanager
def _without_context_carry() -> Iterator[None]:
    """Runs with no context carried into branches (an internal switch, not API: branches then
    see whatever their threads hold), to time what carrying it costs."""
    was = soma._soma._carry_context(False)
    try:
        yield
    finally:
        soma._soma._carry_context(was)


# --- the run -----------------------------------------------------------------------------------


def measure(config: Config, *, quick: bool, skip_ray: bool) -> Figures:
    """Every figure of the report: the machine, the peers, the waves, tracing, memory, the
    nested graph at scale, Ray."""
    about = machine()
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
    settings: dict[str, Setting] = {}
    paused: dict[str, Callable[[], Any]] = {}
    for width in config.waves:
        graph, loop = workloads.wave(width)
        assert graph.plan().kind == "Wave", graph.plan()
        small[f"wave {width}"] = functools.partial(graph.forward, 0)
        # The same wave, in the same round of samples, with context carry switched off around
        # each of its samples: the difference is what entering a branch's context costs.
        small[f"wave {width} without carry"] = small[f"wave {width}"]
        settings[f"wave {width} without carry"] = _without_context_carry
        small[f"wave {width} in context"] = functools.partial(
            workloads.in_a_rich_context(graph, CONTEXT_VARIABLES), 0
        )
        small[f"loop {width}"] = functools.partial(loop, 0)
        paused[f"wave {width}"] = small[f"wave {width}"]
    assert native.forward(0) == config.chain
    with load["small"]:
        small_t = compare(
            small,
            repeat=config.repeat,
            sample_s=config.sample_s,
            warmup_s=config.warmup_s,
            settings=settings,
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

    nested = nested_at_scale(config)
    building = building_at_scale(config)

    ray_report: dict[str, Any] = {"error": "skipped with --skip-ray"}
    if not skip_ray:
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

    return Figures(
        config=config,
        quick=quick,
        machine=about,
        chain=chain,
        fan=fan,
        pair=pair,
        chain_rows=chain_rows,
        fan_rows=fan_rows,
        pair_rows=pair_rows,
        small=small_t,
        paused=paused_t,
        traced=trace_t,
        memory=mem,
        nested=nested,
        building=building,
        ray=ray_report,
        load=load,
        load_average_at_end=os.getloadavg(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats: a smoke run")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    parser.add_argument("--skip-ray", action="store_true", help="leave Ray out (it is slow)")
    args = parser.parse_args()
    figures = measure(QUICK if args.quick else FULL, quick=args.quick, skip_ray=args.skip_ray)
    text = report.write(figures, targets.judge(figures))
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        log(f"written to {args.out}")


if __name__ == "__main__":
    main()
