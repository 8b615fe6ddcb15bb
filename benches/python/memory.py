"""Memory checks, each run by bench.py in a fresh process; prints one JSON object.

``peak``: a large numpy array through a chain of nodes that return it (half of them after an
in-place update). ``ru_maxrss`` is a high-water mark, so it is read after creating the array
and again after the forward: any copy of the array, even one freed right away, raises the
second. A fresh process is needed because the mark never comes down.

``leak``: many forwards of a waved graph whose source makes a 64 KiB object per run. Resident
memory, from /proc/self/statm, is compared between forward 1,000 (allocators warmed up, arenas
sized) and the last; a leaked reference to each run's object would add 64 KiB per forward.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

import soma

Array = npt.NDArray[np.float64]


class PassThrough(soma.Node):
    def forward(self, x: Array) -> Array:
        return x


class AddOneInPlace(soma.Node):
    def forward(self, x: Array) -> Array:
        x += 1.0
        return x


class Bytes(soma.Node):
    def forward(self, x: int) -> bytes:
        return bytes(64 * 1024)


class Length(soma.Node):
    def forward(self, x: bytes) -> int:
        return len(x)


class Sum(soma.Node):
    def forward(self, xs: dict[str, int]) -> int:
        return sum(xs.values())


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def _resident_kib() -> int:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024


def peak(runner: str, nodes: int, mib: int) -> dict[str, Any]:
    chain = [AddOneInPlace() if at % 2 else PassThrough() for at in range(nodes)]
    run: Callable[[Array], Array]
    if runner == "soma":
        graph = soma.Graph()
        for at, node in enumerate(chain):
            graph.node(f"n{at}", node)
            if at:
                graph.edge(f"n{at - 1}", f"n{at}")
        graph.plan()  # Compiled before the mark is read: the plan is not what is measured.
        run = graph.forward
    else:

        def run(x: Array) -> Array:
            for node in chain:
                x = node.forward(x)
            return x

    gc.collect()
    # np.ones writes every page (np.zeros would map them lazily and hide the array's size).
    array = np.ones(mib * 1024 * 1024 // 8)
    before = _peak_kib()
    start = time.perf_counter()
    out = run(array)
    seconds = time.perf_counter() - start
    after = _peak_kib()
    return {
        "runner": runner,
        "same_object": out is array,
        "peak_after_array_kib": before,
        "peak_after_forward_kib": after,
        "added_kib": after - before,
        "forward_s": seconds,
    }


def leak(forwards: int, checkpoint: int) -> dict[str, Any]:
    graph = soma.Graph.somatize(Bytes() >> (Length() | Length()) >> Sum())
    assert [step.kind for step in graph.plan().children] == ["Execute", "Wave", "Execute"]
    resident: dict[int, int] = {}
    for done in range(1, forwards + 1):
        graph.forward(0)
        if done in (checkpoint, forwards):
            resident[done] = _resident_kib()
    first, last = resident[checkpoint], resident[forwards]
    return {
        "forwards": forwards,
        "checkpoint": checkpoint,
        "resident_at_checkpoint_kib": first,
        "resident_at_end_kib": last,
        "growth": (last - first) / first,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="check", required=True)
    peak_parser = sub.add_parser("peak")
    peak_parser.add_argument("--runner", choices=["soma", "loop"], required=True)
    peak_parser.add_argument("--nodes", type=int, default=100)
    peak_parser.add_argument("--mib", type=int, default=200)
    leak_parser = sub.add_parser("leak")
    leak_parser.add_argument("--forwards", type=int, default=10_000)
    leak_parser.add_argument("--checkpoint", type=int, default=1_000)
    args = parser.parse_args()
    if args.check == "peak":
        report = peak(args.runner, args.nodes, args.mib)
    else:
        report = leak(args.forwards, args.checkpoint)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
