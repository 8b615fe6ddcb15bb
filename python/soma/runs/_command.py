"""The command behind ``python -m soma.runs``: reads a journal and prints what it holds."""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from collections.abc import Sequence

from soma.errors import JournalError
from soma.journal._journal import Journal, JournalRun

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _duration(text: str) -> float:
    """``30d``, ``12h``, ``45m``, ``10s`` or a number of seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is no duration: a number and a unit, s, m, h, d or w (30d)"
        )
    return float(found[1]) * _UNITS[found[2] or "s"]


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return datetime.datetime.fromtimestamp(seconds).strftime("%Y-%m-%d %H:%M:%S")


def _line(run: JournalRun) -> str:
    error = "" if run.error is None else f"  {run.error.splitlines()[0][:80]}"
    asks = "" if not run.questions else f"  asks at {', '.join(run.questions)}"
    # A stream's items are its caller's: its nodes' calls are counted, not "done of total".
    done = f"{run.done:>6} calls" if run.stream else f"{run.done:>6}/{run.nodes}"
    return (
        f"{run.id:<24} {run.status:<9} {_when(run.started)}  {run.seconds:9.3f} s"
        f"  {done}{error}{asks}"
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m soma.runs", description="Lists, shows and prunes a journal's runs."
    )
    parser.add_argument("--journal", required=True, help="the journal: a file or a URL")
    commands = parser.add_subparsers(dest="command")
    listing = commands.add_parser("list", help="every run, the newest first (the default)")
    listing.add_argument("--status", help="only runs with this status")
    show = commands.add_parser("show", help="one run, node by node")
    show.add_argument("run", help="the run's id")
    prune = commands.add_parser("prune", help="removes runs that ended long ago")
    prune.add_argument("--older-than", type=_duration, required=True, help="30d, 12h, ...")
    asked = parser.parse_args(argv)
    journal = Journal(asked.journal)
    try:
        if asked.command == "show":
            run = journal.run(asked.run)
            print(f"run      {run.id}")
            print(f"graph    {run.graph}")
            print(f"status   {run.status}")
            print(f"started  {_when(run.started)}")
            print(f"ended    {_when(run.ended)}")
            print(f"seconds  {run.seconds:.3f}")
            print(f"done     {run.done} of {run.nodes} nodes")
            if run.holder:
                print(f"holder   {run.holder}")
            if run.error:
                print(f"error    {run.error}")
            for path, question in run.questions.items():
                print(f"asks     {path}: {question}")
            for node, seconds, size in journal.nodes(asked.run):
                print(f"  {node:<32} finished  {seconds:9.4f} s  output {size} B in the journal")
            return 0
        if asked.command == "prune":
            print(f"pruned {journal.prune(asked.older_than)} runs")
            return 0
        status = getattr(asked, "status", None)
        for run in journal.runs():
            if status is None or run.status == status:
                print(_line(run))
        return 0
    except JournalError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        journal.close()
