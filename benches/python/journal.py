"""Runs that survive (issue 45): what a journal costs a run, a pause and a resume, what paused
runs hold, and resuming a run killed at a random node.

    .venv/bin/python benches/python/journal.py [--quick] [--out PATH] [--only TABLES]

Prints markdown tables (and writes them to PATH). Timings only, never assertions: a missed
target is a row that says so. The issue's targets, each stated beside its figure:

1. **The journal on a chain.** A chain of 1,000 trivial nodes (``x + 1``), run with a journal in
   an SQLite file (``g.forward(i, run=..., journal=j)``, a new run and a new input each time,
   so that every output is new) against the same run without one: at most 20 µs a node more;
   at most 200 bytes a node in the journal's file, measured as the file's growth over a run,
   after ``VACUUM``; and ``forward`` without the keywords against ``forward`` with
   ``run=None, journal=None``, the journal's code on the path of a run that does not use it
   (within 1%). Beside it LangGraph's ``SqliteSaver`` on the same chain (a ``StateGraph`` of
   1,000 nodes holding one int), where ``langgraph-checkpoint-sqlite`` is installed
   (``benches/python/requirements.txt``); otherwise its cells say "not run".
2. **Kill and resume.** A chain of 10,000 nodes run with a journal in a child process that a
   node kills with ``SIGKILL`` at a random place; a second child resumes it, started once the
   dead holder's lease has lapsed (a lease of 1 s here: until it lapses a resumer is refused
   with ``RunHeldError``, 30 s after the kill with the default lease). Every resume must
   return the uninterrupted result, call exactly the nodes the journal had not recorded (a
   chain's recorded nodes are its first ones: the resumer must call the rest, each once), and
   reach its first node call within 0.5 s of its process starting.
3. **Pause and resume.** A 3-node run whose middle node asks (``ctx.ask``): ``forward`` until
   ``soma.Paused``, then ``g.resume(..., answers=...)`` to the end, each at most 0.5 ms; then
   10,000 runs paused in one process: threads left running (none beyond those before) and the
   memory each holds (at most 1 KB, by ``tracemalloc`` and by the process's RSS).

Beside the targets, **at the sizes users reach** (``--only sizes``): chains of 1,000, 10,000 and
100,000 trivial nodes, each size in a process of its own, run once with a fresh in-memory cache
(so that every node's key is made: the journal keys nodes as the cache does) and then with a
journal: the journal's µs a node over the cached run's, the file's bytes a node, and the
process's peak memory. A journal's cost a node should not grow with the run: the largest
size's within 1.5x the smallest's.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import itertools
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import soma
from deadline import log, publish, table
from timing import compare

CHAIN = 1_000
KILLED_CHAIN = 10_000
PAUSED_RUNS = 10_000
NODE_BOUND_US = 20.0
BYTES_BOUND = 200.0
OFF_BOUND = 0.01
PAUSE_BOUND_MS = 0.5
PAUSED_BOUND_BYTES = 1024.0
START_BOUND_S = 0.5
#: The sizes table's chains, and how much more a node may cost at the largest than the smallest.
SIZES = (1_000, 10_000, 100_000)
SIZES_BOUND = 1.5
#: The killed runs' lease: a run whose holder died is refused to a resumer until its lease lapses
#: (30 s unless told), so the resumer is started once this has passed since the kill.
KILLED_LEASE_S = 1.0


class Inc(soma.Node):
    def forward(self, x: int) -> int:
        return x + 1


class Start(soma.Node):
    def forward(self, x: int) -> int:
        return x


class Approve(soma.Node):
    def forward(self, x: int, ctx: soma.Ctx) -> int:
        answer = ctx.ask(f"approve {x}?")
        return x if answer == "yes" else -x


class Finish(soma.Node):
    def forward(self, x: int) -> int:
        return x * 2


class Counted(soma.Node):
    """A node of the killed chain: says each call on stderr (its input and the time), and
    kills its process at the input ``SOMA_BENCH_KILL_AT`` names. Both are read from outside the
    node's key (stderr, the environment), so the run and its resume share their keys."""

    def forward(self, x: int) -> int:
        if os.environ.get("SOMA_BENCH_KILL_AT") == str(x):
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stderr.write(f"{x} {time.time()}\n")
        return x + 1


def chain(n: int, node: type[soma.Node] = Inc) -> soma.Graph:
    built: Any = node()
    for _ in range(n - 1):
        built = built >> node()
    return soma.Graph.somatize(built)


def verdict(met: bool) -> str:
    return "met" if met else "**MISSED**"


# ----- target 1: the journal on a chain ---------------------------------------------------


def file_bytes(path: Path) -> int:
    """The SQLite file's size once vacuumed and checkpointed: what it holds, free pages out."""
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.execute("VACUUM")
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        size = connection.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)


def journal_bytes_per_node(folder: Path, g: soma.Graph) -> tuple[float, float]:
    """Bytes a node adds to a journal's file: over the first run in a fresh file (its outputs
    new), and over a second run of other outputs in the same file."""
    path = folder / "sized.db"
    journal = soma.Journal(path)
    g.forward(0, run="warm", journal=journal)  # The schema and the names, once a journal.
    before = file_bytes(path)
    g.forward(10_000, run="first", journal=journal)
    first = file_bytes(path)
    g.forward(20_000, run="second", journal=journal)
    second = file_bytes(path)
    journal.close()
    return (first - before) / CHAIN, (second - first) / CHAIN


def langgraph_chain(n: int) -> tuple[Any, Any, Path] | str:
    """LangGraph's chain of ``n`` nodes holding one int, without and with a ``SqliteSaver``."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return "not run: langgraph-checkpoint-sqlite is not installed"
    from typing import TypedDict

    class State(TypedDict):
        x: int

    def inc(state: State) -> dict[str, int]:
        return {"x": state["x"] + 1}

    builder = StateGraph(State)
    names = [f"n{i}" for i in range(n)]
    for name in names:
        builder.add_node(name, inc)
    builder.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        builder.add_edge(a, b)
    builder.add_edge(names[-1], END)
    folder = Path(tempfile.mkdtemp(prefix="bench-langgraph-"))
    path = folder / "checkpoints.db"
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    return builder.compile(), builder.compile(checkpointer=saver), path


def langgraph_rows(repeat: int) -> tuple[list[str], str]:
    graphs = langgraph_chain(CHAIN)
    if isinstance(graphs, str):
        return [graphs, graphs], "LangGraph"
    plain, saved, path = graphs
    threads = itertools.count()
    limit = {"recursion_limit": CHAIN + 10}

    def without() -> None:
        assert plain.invoke({"x": 0}, config=limit)["x"] == CHAIN

    def with_saver() -> None:
        config = {**limit, "configurable": {"thread_id": f"t{next(threads)}"}}
        assert saved.invoke({"x": 0}, config=config)["x"] == CHAIN

    timings = compare(
        {"without": without, "with": with_saver}, repeat=repeat, sample_s=0.5, warmup_s=0.5
    )
    before = file_bytes(path)
    with_saver()
    grown = (file_bytes(path) - before) / CHAIN
    extra = (timings["with"].median_s - timings["without"].median_s) / CHAIN * 1e6
    version = importlib.metadata.version("langgraph")
    log(f"langgraph: {extra:.1f} us a node more, {grown:.0f} bytes a node")
    return [f"+{extra:,.1f} µs", f"{grown:,.0f} B"], f"LangGraph {version} `SqliteSaver`"


def chain_rows(repeat: int) -> list[list[str]]:
    g = chain(CHAIN)
    folder = Path(tempfile.mkdtemp(prefix="bench-journal-"))
    journal = soma.Journal(folder / "runs.db")
    runs = itertools.count()

    def on() -> None:
        n = next(runs)
        assert g.forward(n * CHAIN, run=f"run-{n}", journal=journal) == (n + 1) * CHAIN

    timings = compare(
        {
            "without": lambda: g.forward(0),
            "off": lambda: g.forward(0, run=None, journal=None),
            "on": on,
        },
        repeat=repeat,
        sample_s=0.2,
        warmup_s=0.2,
    )
    journal.close()
    without = timings["without"].median_s / CHAIN * 1e6
    off = timings["off"].median_s / CHAIN * 1e6
    on_us = timings["on"].median_s / CHAIN * 1e6
    on_q1 = timings["on"].q1_s / CHAIN * 1e6
    on_q3 = timings["on"].q3_s / CHAIN * 1e6
    extra = on_us - off
    first, second = journal_bytes_per_node(folder, g)
    log(f"chain: without {without:.3f} off {off:.3f} on {on_us:.2f} us a node")
    peer, peer_name = langgraph_rows(max(3, repeat // 5))
    return [
        [
            "a node's time, journal on (µs): median (quartiles)",
            f"{on_us:,.2f} ({on_q1:,.2f} to {on_q3:,.2f}; off {off:.2f})",
            f"+{extra:,.2f} µs",
            peer[0],
            f"≤ +{NODE_BOUND_US:.0f} µs: {verdict(extra <= NODE_BOUND_US)}",
        ],
        [
            "bytes a node in the journal's file (first run; a second)",
            f"{first:,.0f}; {second:,.0f}",
            "",
            peer[1],
            f"≤ {BYTES_BOUND:.0f} B: {verdict(max(first, second) <= BYTES_BOUND)}",
        ],
        [
            "off: `forward(x, run=None, journal=None)` / `forward(x)`",
            f"{off:.3f} / {without:.3f} µs a node",
            f"{off / without - 1:+.1%}",
            "",
            f"within {OFF_BOUND:.0%}: {verdict(abs(off / without - 1) <= OFF_BOUND)}",
        ],
        ["(peer)", "", "", peer_name, ""],
    ]


# ----- target 3: pause and resume -------------------------------------------------------------


def pause_rows(count: int) -> list[list[str]]:
    g = soma.Graph.somatize(Start() >> Approve() >> Finish())
    folder = Path(tempfile.mkdtemp(prefix="bench-pause-"))
    journal = soma.Journal(folder / "runs.db")
    pauses: list[float] = []
    resumes: list[float] = []
    for round_ in range(count + 20):
        name = f"ask-{round_}"
        gc.collect()
        started = time.perf_counter()
        try:
            g.forward(round_, run=name, journal=journal)
        except soma.Paused as paused:
            pause_s = time.perf_counter() - started
            (where,) = paused.questions
        else:
            raise AssertionError("the run did not pause")
        started = time.perf_counter()
        result = g.resume(name, journal=journal, answers={where: "yes"})
        resume_s = time.perf_counter() - started
        assert result == 2 * round_, result
        if round_ >= 20:  # The first ones warm the journal's statements up.
            pauses.append(pause_s)
            resumes.append(resume_s)
    journal.close()
    pause_ms = statistics.median(pauses) * 1e3
    resume_ms = statistics.median(resumes) * 1e3
    log(f"pause {pause_ms:.3f} ms, resume {resume_ms:.3f} ms")
    return [
        [
            "pause: `forward` until `soma.Paused` (3 nodes)",
            f"{pause_ms:.3f} ms",
            f"≤ {PAUSE_BOUND_MS} ms: {verdict(pause_ms <= PAUSE_BOUND_MS)}",
        ],
        [
            "resume: `g.resume(..., answers=...)` to the end",
            f"{resume_ms:.3f} ms",
            f"≤ {PAUSE_BOUND_MS} ms: {verdict(resume_ms <= PAUSE_BOUND_MS)}",
        ],
    ]


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def paused_runs_rows(count: int) -> list[list[str]]:
    g = soma.Graph.somatize(Start() >> Approve() >> Finish())
    folder = Path(tempfile.mkdtemp(prefix="bench-paused-"))
    journal = soma.Journal(folder / "runs.db")
    for warm in range(50):  # Statements, names and the keeper thread's first start, once.
        with contextlib.suppress(soma.Paused):
            g.forward(warm, run=f"warm-{warm}", journal=journal)
    gc.collect()
    threads_before = threading.active_count()
    tasks_before = len(os.listdir("/proc/self/task"))
    rss_before = rss_bytes()
    tracemalloc.start()
    traced_before = tracemalloc.get_traced_memory()[0]
    paused = 0
    for n in range(count):
        try:
            g.forward(n, run=f"paused-{n}", journal=journal)
        except soma.Paused:
            paused += 1
    gc.collect()
    deadline = time.monotonic() + 5.0  # The keeper thread ends once no run is held.
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    traced = (tracemalloc.get_traced_memory()[0] - traced_before) / count
    tracemalloc.stop()
    rss = (rss_bytes() - rss_before) / count
    threads = threading.active_count() - threads_before
    tasks = len(os.listdir("/proc/self/task")) - tasks_before
    journal.close()
    assert paused == count, paused
    log(f"{count} paused: threads {threads:+d} ({tasks:+d} tasks), {traced:.0f} B, {rss:.0f} B")
    return [
        [
            f"{count:,} paused runs: threads left running",
            f"{threads:+d} (Python), {tasks:+d} (the process's tasks)",
            f"none: {verdict(threads <= 0 and tasks <= 0)}",
        ],
        [
            f"{count:,} paused runs: memory each (tracemalloc; RSS)",
            f"{traced:,.0f} B; {rss:,.0f} B",
            f"≤ 1 KB: {verdict(max(traced, rss) <= PAUSED_BOUND_BYTES)}",
        ],
    ]


# ----- target 2: kill and resume --------------------------------------------------------------


def child(argv: list[str]) -> None:
    """A child process: ``run DB NAME`` runs the killed chain (killed by a node), ``resume DB
    NAME`` resumes it and prints its result and when it was called and started; ``size DB N``
    prints a chain of N nodes' seconds cached, then journaled, the file's size and the peak RSS."""
    if argv[0] == "size":
        size_child(Path(argv[1]), int(argv[2]))
        return
    mode, path, name = argv
    g = chain(KILLED_CHAIN, Counted)
    journal = soma.Journal(path, lease=KILLED_LEASE_S)
    if mode == "run":
        g.forward(0, run=name, journal=journal)
        print("not killed")
        return
    done = journal.run(name).done
    called = time.time()
    result = g.resume(name, journal=journal)
    print(f"{result} {done} {called}")


def size_child(path: Path, n: int) -> None:
    import resource

    g = chain(n)
    g.forward(0, cache=soma.Cache())  # Every node's code read once, as any first run does.
    started = time.perf_counter()
    assert g.forward(1, cache=soma.Cache()) == n + 1
    cached = time.perf_counter() - started
    journal = soma.Journal(path)
    started = time.perf_counter()
    assert g.forward(1, run="sized", journal=journal) == n + 1
    journaled = time.perf_counter() - started
    journal.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"{cached} {journaled} {file_bytes(path)} {peak}")


def size_rows(repeat: int) -> list[list[str]]:
    """Each size's best of ``repeat`` processes."""
    rows, extras = [], []
    for n in SIZES:
        best: tuple[float, float, int, int] | None = None
        for _ in range(repeat):
            path = Path(tempfile.mkdtemp(prefix="bench-sizes-")) / "runs.db"
            out = subprocess.run(
                [sys.executable, __file__, "--child", "size", str(path), str(n)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            cached, journaled, size, peak = float(out[0]), float(out[1]), int(out[2]), int(out[3])
            if best is None or journaled - cached < best[1] - best[0]:
                best = (cached, journaled, size, peak)
        assert best is not None
        cached, journaled, size, peak = best
        extra = (journaled - cached) / n * 1e6
        extras.append(extra)
        log(f"sizes: {n} nodes, +{extra:.1f} us a node")
        rows.append(
            [
                f"a chain of {n:,} nodes",
                f"{cached / n * 1e6:,.1f} µs",
                f"{journaled / n * 1e6:,.1f} µs (+{extra:,.1f})",
                f"{size / n:,.0f} B",
                f"{peak / 2**20:,.0f} MB",
            ]
        )
    growth = extras[-1] / extras[0]
    rows.append(
        [
            f"the journal's µs a node, {SIZES[-1]:,} against {SIZES[0]:,}",
            "",
            f"{growth:.2f}x",
            "",
            f"≤ {SIZES_BOUND}x: {verdict(growth <= SIZES_BOUND)}",
        ]
    )
    return rows


def kill_rows(trials: int) -> list[list[str]]:
    folder = Path(tempfile.mkdtemp(prefix="bench-killed-"))
    rng = random.Random(45)
    wrong: list[str] = []
    starts: list[float] = []
    from_resume: list[float] = []
    recorded: list[int] = []
    for trial in range(trials):
        path = str(folder / f"trial-{trial}.db")
        kill_at = rng.randrange(KILLED_CHAIN)
        killed = subprocess.run(
            [sys.executable, __file__, "--child", "run", path, "killed"],
            env={**os.environ, "SOMA_BENCH_KILL_AT": str(kill_at)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if killed.returncode != -signal.SIGKILL:
            wrong.append(f"trial {trial}: the run exited {killed.returncode}, not killed")
            continue
        time.sleep(KILLED_LEASE_S)  # The dead holder's lease lapses.
        spawned = time.time()
        resumed = subprocess.run(
            [sys.executable, __file__, "--child", "resume", path, "killed"],
            env={k: v for k, v in os.environ.items() if k != "SOMA_BENCH_KILL_AT"},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if resumed.returncode != 0:
            wrong.append(f"trial {trial}: the resume exited {resumed.returncode}")
            log(resumed.stderr[-2000:])
            continue
        result, done, called = resumed.stdout.split()
        calls = [line.split() for line in resumed.stderr.splitlines() if line[:1].isdigit()]
        inputs = [int(x) for x, _ in calls]
        if int(result) != KILLED_CHAIN:
            wrong.append(f"trial {trial}: resumed to {result}, not {KILLED_CHAIN}")
        if inputs != list(range(int(done), KILLED_CHAIN)):
            wrong.append(
                f"trial {trial}: {int(done)} recorded, killed at {kill_at}, the resume called "
                f"{len(inputs)} nodes from input {inputs[:1]}"
            )
        if int(done) > kill_at:
            wrong.append(f"trial {trial}: {done} recorded, past the node killed at {kill_at}")
        first_call = float(calls[0][1]) if calls else float("nan")
        starts.append(first_call - spawned)
        from_resume.append(first_call - float(called))
        recorded.append(kill_at - int(done))
        log(
            f"trial {trial}: killed at {kill_at}, {done} recorded, first call "
            f"{first_call - spawned:.3f} s after the resumer's start"
        )
    for line in wrong:
        log(line)
    slowest = max(starts) if starts else float("nan")
    return [
        [
            f"{trials} runs of {KILLED_CHAIN:,} nodes killed (SIGKILL) at a random node, "
            "each resumed in a new process",
            f"{trials - len(wrong)} of {trials} right (the result, exactly the nodes "
            "unrecorded, each once)",
            f"all: {verdict(not wrong)}",
        ],
        [
            "nodes lost at the kill (called before it, unrecorded): median, most",
            f"{statistics.median(recorded):,.0f}, {max(recorded):,}" if recorded else "-",
            "",
        ],
        [
            "`g.resume` called to its first node call: median, slowest",
            f"{statistics.median(from_resume):.3f} s, {max(from_resume):.3f} s"
            if from_resume
            else "-",
            f"≤ {START_BOUND_S} s: "
            f"{verdict(bool(from_resume) and max(from_resume) <= START_BOUND_S)}",
        ],
        [
            "the resumer's process start to its first node call (the interpreter, `import "
            "soma`, building the 10,000-node graph, then the above): median, slowest",
            f"{statistics.median(starts):.3f} s, {slowest:.3f} s" if starts else "-",
            f"≤ {START_BOUND_S} s: {verdict(slowest <= START_BOUND_S)}",
        ],
    ]


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and trials")
    parser.add_argument("--out", type=Path, help="also write the tables here")
    parser.add_argument(
        "--only",
        default="chain,pause,kill,sizes",
        help="which tables, comma-separated: chain, pause, kill, sizes (all unless told)",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    lines = ["## Runs that survive (issue 45)", ""]
    if "chain" in only:
        lines += [
            f"A chain of {CHAIN:,} trivial nodes with a journal in an SQLite file (medians of "
            "interleaved samples; a new run and a new input each time), and the same chain "
            "beside it in LangGraph:",
            "",
            *table(
                ["row", "Soma", "journal on, less off", "beside it", "target"],
                chain_rows(5 if args.quick else 15),
            ),
            "",
        ]
    if "pause" in only:
        lines += [
            "A 3-node run whose middle node asks (medians), and runs left paused in one process:",
            "",
            *table(
                ["row", "Soma", "target"],
                pause_rows(100 if args.quick else 500)
                + paused_runs_rows(1_000 if args.quick else PAUSED_RUNS),
            ),
            "",
        ]
    if "kill" in only:
        lines += [
            "Runs killed and resumed, each in a process of its own:",
            "",
            *table(["row", "Soma", "target"], kill_rows(5 if args.quick else 50)),
            "",
        ]
    if "sizes" in only:
        lines += [
            "Chains at the sizes users reach, each size in a process of its own (best of the "
            "processes): a run with a fresh in-memory cache, then with a journal in an SQLite "
            "file:",
            "",
            *table(
                ["row", "cached run, a node", "journaled run, a node", "file, a node", "peak RSS"],
                size_rows(1 if args.quick else 3),
            ),
            "",
        ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
