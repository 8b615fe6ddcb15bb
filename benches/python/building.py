"""Building a graph at one size, in a fresh process; prints one JSON object.

    .venv/bin/python benches/python/building.py --nodes=100000 [--repeat=3] [--only-calls]

bench.py runs it once per size. What it times, each the best of ``--repeat`` fresh builds (a
build is one-off work, so its best run is the figure least disturbed by anything else):

- ``node()`` and ``edge()`` per call: a chain of ``nodes`` trivial Python nodes, each added
  with ``g.node("id", obj)``, then each edge with ``g.edge(a, b)``; the nodes' objects are made
  beforehand, outside the time;
- the same chain written ``e = e >> k`` in a loop, and a wave written ``e = e | k``, then
  ``Graph.somatize(e)`` of each (``--only-calls`` leaves these out, for the largest size); the
  nodes ``k`` are made beforehand too, so the loop times what the operators cost.

- beside them, a plain Python loop that links one small object per node to the one before
  (what ``>>`` in a loop does at the least): the interpreter's and the machine's own growth
  from one size to the next (caches, the garbage collector), which no DSL can go below.

Each build's graph is checked: its nodes, its edges, and its plan's shape at its ends.
A fresh process for each size, so that what an earlier size left behind (a heap grown large,
the garbage collector's generations) does not weigh on the next.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import soma


class K(soma.Node):
    """A trivial node: what building costs is the subject, not what a node does."""

    def forward(self, x: Any) -> Any:
        return x


def _best(repeat: int, build: Callable[[], tuple[float, ...]]) -> tuple[float, ...]:
    """Each figure of ``build`` at its best over ``repeat`` runs, collected between runs."""
    runs = []
    for _ in range(repeat):
        gc.collect()
        runs.append(build())
    return tuple(min(figure) for figure in zip(*runs, strict=True))


def by_calls(nodes: int) -> tuple[float, float]:
    """Seconds for ``nodes`` calls of ``node()``, then ``nodes - 1`` of ``edge()``."""
    objects = [K() for _ in range(nodes)]
    ids = [f"k{i}" for i in range(nodes)]
    g = soma.Graph()
    node, edge = g.node, g.edge
    start = time.perf_counter()
    for node_id, obj in zip(ids, objects, strict=True):
        node(node_id, obj)
    added = time.perf_counter()
    for source, target in itertools.pairwise(ids):
        edge(source, target)
    done = time.perf_counter()
    assert len(g) == nodes
    assert len(g.edges()) == nodes - 1
    assert g.roots() == ["k0"]
    assert g.leaves() == [f"k{nodes - 1}"]
    return added - start, done - added


def by_operators(nodes: int, operator: str) -> tuple[float, float]:
    """Seconds for writing ``nodes`` nodes ``e = e >> k`` (or ``|``) in a loop, then for
    ``Graph.somatize(e)``."""
    objects = [K() for _ in range(nodes)]
    start = time.perf_counter()
    expr: Any = objects[0]
    if operator == ">>":
        for obj in objects[1:]:
            expr = expr >> obj
    else:
        for obj in objects[1:]:
            expr = expr | obj
    written = time.perf_counter()
    g = soma.Graph.somatize(expr)
    done = time.perf_counter()
    assert len(g) == nodes
    assert len(g.edges()) == (nodes - 1 if operator == ">>" else 0)
    assert g.plan().kind == ("Sequence" if operator == ">>" else "Wave")
    return written - start, done - written


class Link:
    """One small object per node, holding the one before: the plain loop's expression."""

    __slots__ = ("before", "node")

    def __init__(self, before: object, node: object) -> None:
        self.before = before
        self.node = node


def plain_loop(nodes: int) -> tuple[float]:
    """Seconds for linking ``nodes`` objects made beforehand, one small object each."""
    objects = [K() for _ in range(nodes)]
    start = time.perf_counter()
    linked: object = objects[0]
    for obj in objects[1:]:
        linked = Link(linked, obj)
    done = time.perf_counter()
    assert isinstance(linked, Link)
    return (done - start,)


def measure(nodes: int, *, repeat: int, only_calls: bool) -> dict[str, Any]:
    node_s, edge_s = _best(repeat, lambda: by_calls(nodes))
    report: dict[str, Any] = {"nodes": nodes, "node_s": node_s, "edge_s": edge_s}
    if not only_calls:
        chain_s, chain_somatize_s = _best(repeat, lambda: by_operators(nodes, ">>"))
        wave_s, wave_somatize_s = _best(repeat, lambda: by_operators(nodes, "|"))
        (plain_s,) = _best(repeat, lambda: plain_loop(nodes))
        report |= {
            "plain_loop_s": plain_s,
            "chain_s": chain_s,
            "chain_somatize_s": chain_somatize_s,
            "wave_s": wave_s,
            "wave_somatize_s": wave_somatize_s,
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only-calls", action="store_true", help="node() and edge() alone")
    args = parser.parse_args()
    print(json.dumps(measure(args.nodes, repeat=args.repeat, only_calls=args.only_calls)))


if __name__ == "__main__":
    main()
