"""The sync rows under two builds, in one run: this checkout's and another's (``--base``, the
Python of a venv where another commit's Soma is installed, such as the commit before a change
to the walk).

    python benches/python/versus.py --base OTHER/.venv/bin/python [--rounds 4] [--quick]

Runs ``sync_rows.py`` under each build in turn, base then this one, ``--rounds`` times, and
prints a markdown table of each row's median over the rounds, both builds, and their ratio
(this build / base). Timings only, never assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from deadline import log, publish, table

WORKER = Path(__file__).parent / "sync_rows.py"


def timed(python: str, quick: bool) -> dict[str, float]:
    command = [python, str(WORKER), *(["--quick"] if quick else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the other build's Python")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    base: dict[str, list[float]] = {}
    ours: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        for python, into in ((args.base, base), (sys.executable, ours)):
            for row, seconds in timed(python, args.quick).items():
                into.setdefault(row, []).append(seconds)
        log(f"round {round_ + 1} of {args.rounds} done")
    lines = []
    for row, times in ours.items():
        mine, theirs = statistics.median(times), statistics.median(base[row])
        ratio = mine / theirs
        lines.append(
            [
                row,
                f"{theirs * 1e3:.3f} ms",
                f"{mine * 1e3:.3f} ms",
                f"{ratio:.3f}x",
                f"≤ 1.05x: {'met' if ratio <= 1.05 else 'MISSED'}",
            ]
        )
    publish(
        [
            f"The sync rows, {args.rounds} rounds alternating builds (medians of each build's"
            " rounds; each round the median of its own repeats).",
            "",
            *table(["row", "base build", "this build", "ratio", "target"], lines),
        ],
        args.out,
    )


if __name__ == "__main__":
    main()
