"""Instructions a node and a wave cost, counted by callgrind, under one or more builds: what
does not move when the machine is noisy.

    python benches/python/instructions.py PYTHON [PYTHON ...]

For each Python (a venv's, with a build of Soma installed), runs ``valgrind --tool=callgrind``
on a child that builds a chain of 1,000 trivial nodes and forwards it ``few`` then ``many``
times, the same for a wave of 2 (one node, then two branches) and for an ``each`` step over 100
items: the difference, divided by the extra forwards (and by 1,000 for the chain), is what one
forward costs without the start-up.
Prints a markdown table, each build's count and its ratio to the first's. Needs valgrind.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CHILD = """
import sys
import soma
class Pass(soma.Node):
    def forward(self, x):
        return x
shape, times = sys.argv[1], int(sys.argv[2])
value = 1
if shape == "chain":
    e = Pass()
    for _ in range(999):
        e = e >> Pass()
elif shape == "wave":
    e = Pass() >> (Pass() | Pass())
else:
    e, value = soma.each(Pass()), list(range(100))
g = soma.Graph.somatize(e)
for _ in range(times):
    g.forward(value)
"""

# (shape, few, many, per): forwards counted, and what one forward is divided by.
SHAPES = (("chain", 20, 120, 1000), ("wave", 2000, 12000, 1), ("each", 20, 120, 1))


def counted(python: str, shape: str, times: int) -> int:
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            python,
            "-c",
            CHILD,
            shape,
            str(times),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"refs:\s+([\d,]+)", done.stderr)
    assert found is not None, done.stderr
    return int(found.group(1).replace(",", ""))


def main() -> None:
    pythons = sys.argv[1:]
    if not pythons:
        sys.exit(__doc__)
    rows = []
    first: dict[str, float] = {}
    for python in pythons:
        cells = [f"`{Path(python).parent.parent}`"]
        for shape, few, many, per in SHAPES:
            cost = (counted(python, shape, many) - counted(python, shape, few)) / (many - few) / per
            base = first.setdefault(shape, cost)
            cells.append(f"{cost:,.1f} ({cost / base:.3f}x)")
        rows.append(cells)
    print(
        "| build | instructions a node, chain of 1,000 | instructions a forward, wave of 2 "
        "| instructions a forward, each of 100 |"
    )
    print("|---|---:|---:|---:|")
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
