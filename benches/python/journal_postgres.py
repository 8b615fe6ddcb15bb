"""Issue 45, target 4: a journal in PostgreSQL shared by 8 processes that run and resume 1,000
runs between them loses none and runs none twice.

    .venv/bin/python benches/python/journal_postgres.py [--processes 8] [--runs 1000]
        [--url postgresql://...] [--json] [--out PATH]

Each run is ``prepare >> send >> approve >> finish`` on the run's id: ``send`` makes an effect
(``ctx.effect``), ``approve`` asks a question (``ctx.ask``), so every run is begun, pauses, and
is resumed with its answer. The processes start together (each opens the journal, says "ready"
and waits for "go") and each walks every run in the same order, taking up whatever it finds:
a run not begun it begins (``forward``, which pauses it), a paused one it answers and resumes,
one another process holds it passes over (``RunHeldError``), until every run is finished.
Every node notes each of its calls, and the effect its one call, in a file of its process's
(appended, outside the journal); the tally reads them:

- **finished**: runs the journal holds as finished, whose ``finish`` was called;
- **lost**: runs not finished when every process has stopped (target: none);
- **twice**: runs whose ``prepare``, effect or ``finish`` was called more than once (target:
  none; ``approve`` is called twice by design: it asks, and on resume it reads the answer);
- **refused**: times a process was refused a run another held: the processes met.

Without ``--url`` it starts a server of its own from Debian's binaries, as the tests do
(``tests/_postgres.py``), with ``fsync`` on. A count is asserted nowhere but in the test that
runs this at a smaller scale (``tests/test_journal_postgres.py``); the seconds are a timing.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import soma
from soma.errors import JournalError, RunHeldError

#: The folder the nodes note their calls in, a file for each process (set in a worker).
CALLS = os.environ.get("SOMA_BENCH_CALLS", "")


def note(run: str, what: str) -> str:
    with open(os.path.join(CALLS, str(os.getpid())), "a") as calls:
        calls.write(f"{run} {what}\n")
    return what


class Prepare(soma.Node):
    def forward(self, run: str) -> str:
        note(run, "prepare")
        return run


class Send(soma.Node):
    def forward(self, run: str, ctx: soma.Ctx) -> str:
        ctx.effect(note, run, "effect")
        return run


class Approve(soma.Node):
    def forward(self, run: str, ctx: soma.Ctx) -> tuple[str, Any]:
        note(run, "approve")
        return run, ctx.ask(f"approve {run}?")


class Finish(soma.Node):
    def forward(self, approved: tuple[str, Any]) -> str:
        run, answer = approved
        note(run, "finish")
        return f"{run}: {answer}"


def names(runs: int) -> list[str]:
    return [f"run-{number:04d}" for number in range(runs)]


def work(url: str, runs: int) -> dict[str, int]:
    """One process's part: takes up every run it can until all are finished."""
    journal = soma.Journal(url)
    graph = soma.Graph.somatize(
        Prepare().named("prepare")
        >> Send().named("send")
        >> Approve().named("approve")
        >> Finish().named("finish")
    )
    print("ready", flush=True)
    sys.stdin.readline()
    refused = passes = 0
    left = names(runs)
    while left:
        passes += 1
        still = []
        for name in left:
            try:
                if not _took_up(journal, graph, name):
                    still.append(name)
            except RunHeldError:
                refused += 1
                still.append(name)
        if len(still) == len(left):  # Every run left is held by another: let them run.
            time.sleep(0.002)
        left = still
    journal.close()
    return {"refused": refused, "passes": passes}


def _took_up(journal: soma.Journal, graph: soma.Graph, name: str) -> bool:
    """Takes run ``name`` one step on (begins it, or resumes it); whether it is finished."""
    try:
        status = journal.run(name).status
    except JournalError:  # Not begun yet.
        status = None
    if status == "finished":
        return True
    if status == "running":  # Held by another process.
        return False
    try:
        if status is None:
            graph.forward(name, run=name, journal=journal)
        elif status == "paused":
            try:
                graph.resume(name, journal=journal, answers={"approve": "yes"})
            except RunHeldError:
                raise
            except JournalError:  # Answered by another process since we looked.
                graph.resume(name, journal=journal)
        else:  # Failed, or abandoned by a process that died: neither happens here.
            graph.resume(name, journal=journal)
    except soma.Paused:
        return False
    return True


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """``url``, or a server started for this run (Debian's binaries, as the tests start one)."""
    if url is not None:
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import _postgres

    reason = _postgres.missing()
    if reason is not None:
        raise SystemExit(f"not run: {reason}")
    with _postgres.cluster(durable=True) as cluster:
        yield cluster.create_database("journal_bench")


def tally(url: str, runs: int, folder: str, workers: dict[int, int]) -> dict[str, Any]:
    calls: collections.Counter[tuple[str, str]] = collections.Counter()
    finished_by: collections.Counter[int] = collections.Counter()
    for file in os.listdir(folder):
        for line in Path(folder, file).read_text().splitlines():
            run, what = line.split()
            calls[run, what] += 1
            if what == "finish":
                finished_by[workers[int(file)]] += 1
    statuses = {run.id: run.status for run in soma.runs(soma.Journal(url))}
    every = names(runs)
    lost = [run for run in every if statuses.get(run) != "finished" or not calls[run, "finish"]]
    twice = [
        run
        for run in every
        if any(calls[run, what] > 1 for what in ("prepare", "effect", "finish"))
    ]
    return {
        "runs": runs,
        "finished": sum(
            1 for run in every if statuses.get(run) == "finished" and calls[run, "finish"]
        ),
        "lost": lost,
        "twice": twice,
        "finished_by": {str(worker): count for worker, count in sorted(finished_by.items())},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--url", help="a database to use (made empty by the caller)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    parser.add_argument("--out", help="also write the markdown report here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    asked = parser.parse_args()
    if asked.worker:
        print(json.dumps(work(asked.url, asked.runs)), flush=True)
        return 0
    with database(asked.url) as url, tempfile.TemporaryDirectory() as folder:
        soma.Journal(url).close()  # The tables, made before the workers race to.
        environment = {**os.environ, "SOMA_BENCH_CALLS": folder}
        command = [sys.executable, __file__, "--worker", "--url", url, "--runs", str(asked.runs)]
        workers = [
            subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
            )
            for _ in range(asked.processes)
        ]
        for worker in workers:
            assert worker.stdout is not None
            if worker.stdout.readline().strip() != "ready":
                raise SystemExit("a worker did not start")
        started = time.perf_counter()
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        parts = []
        for worker in workers:
            out, _ = worker.communicate()
            if worker.returncode != 0:
                for other in workers:  # Not left running past the folder they write in.
                    other.kill()
                    other.wait()
                raise SystemExit(f"a worker failed ({worker.returncode})")
            parts.append(json.loads(out.splitlines()[-1]))
        seconds = time.perf_counter() - started
        report = tally(
            url, asked.runs, folder, {worker.pid: index for index, worker in enumerate(workers)}
        )
    report["processes"] = asked.processes
    report["refused"] = sum(part["refused"] for part in parts)
    report["seconds"] = round(seconds, 3)
    if asked.json:
        print(json.dumps(report))
    else:
        text = markdown(report)
        print(text)
        if asked.out:
            Path(asked.out).write_text(text + "\n")
    return 0


def markdown(report: dict[str, Any]) -> str:
    met = not report["lost"] and not report["twice"]
    return "\n".join(
        [
            "| processes | runs | finished | lost | run twice | refused (met) | seconds | target |",
            "|---|---|---|---|---|---|---|---|",
            f"| {report['processes']} | {report['runs']} | {report['finished']} "
            f"| {len(report['lost'])} | {len(report['twice'])} | {report['refused']} "
            f"| {report['seconds']:.1f} | {'met' if met else '**no**'} |",
            "",
            "Runs finished by each process: "
            + ", ".join(f"{worker}: {count}" for worker, count in report["finished_by"].items()),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
