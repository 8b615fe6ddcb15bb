"""The graphs every contender runs: their nodes, their edges and a plain Python loop for each.

A :class:`Workload` holds the node objects themselves, so Soma, the loop, the thread pool, Dask
and Ray all call the very same ``forward`` methods; only the machinery around them changes.
Importing this module imports numpy: the caller sets the BLAS thread variables first.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

import soma


class Inc(soma.Node):
    """The trivial node: as little work as a node can do, so what is timed is the overhead."""

    def forward(self, x: int) -> int:
        return x + 1


class Total(soma.Node):
    """The join of the fan-out: receives the dict of its predecessors' outputs, keyed by id."""

    def forward(self, xs: Mapping[str, int]) -> int:
        return sum(xs.values())


class Largest(soma.Node):
    """The join of a nested block: receives the dict of its four inputs and passes the largest
    on, so that values stay small integers however many blocks are chained (a sum would grow
    them fourfold per block, into bignums whose arithmetic would be what is timed)."""

    def forward(self, xs: Mapping[str, int]) -> int:
        return max(xs.values())


class SingularValues(soma.Node):
    """LAPACK work on its own matrix; numpy releases the GIL for the whole decomposition.

    Plain matmul does not scale across this machine's two cores while SVD does (measured when
    the benchmark was written), hence a decomposition. The input is ignored so that the same
    node fits both a wave and a chain.
    """

    def __init__(self, size: int, seed: int) -> None:
        self._matrix: npt.NDArray[np.float64] = np.random.default_rng(seed).standard_normal(
            (size, size)
        )

    def forward(self, x: object) -> float:
        return float(np.linalg.svd(self._matrix, compute_uv=False)[0])


@dataclass(frozen=True)
class Workload:
    """A graph as plain data, in topological order, plus the hand-written loop that runs it."""

    name: str
    nodes: dict[str, soma.Node]
    predecessors: dict[str, tuple[str, ...]]
    loop: Callable[[Any], Any]
    input: Any = 0

    @property
    def leaves(self) -> list[str]:
        fed = {p for preds in self.predecessors.values() for p in preds}
        return [node_id for node_id in self.nodes if node_id not in fed]

    def soma_graph(self) -> soma.Graph:
        """The same graph in Soma, built with ``node()``/``edge()`` as a program would."""
        graph = soma.Graph()
        for node_id, node in self.nodes.items():
            graph.node(node_id, node)
        for node_id, preds in self.predecessors.items():
            for pred in preds:
                graph.edge(pred, node_id)
        return graph


def argument(preds: tuple[str, ...], values: Mapping[str, Any], graph_input: Any) -> Any:
    """What a node receives under Soma's rules, so that every contender feeds it the same way:
    the graph input for a root, the output itself for one predecessor, a dict keyed by id for
    several."""
    if not preds:
        return graph_input
    if len(preds) == 1:
        return values[preds[0]]
    return {pred: values[pred] for pred in preds}


def chain(length: int) -> Workload:
    """``length`` trivial nodes in a row."""
    nodes: dict[str, soma.Node] = {f"n{i}": Inc() for i in range(length)}
    ids = list(nodes)
    predecessors: dict[str, tuple[str, ...]] = {ids[0]: ()}
    predecessors |= {ids[i]: (ids[i - 1],) for i in range(1, length)}
    in_order = list(nodes.values())

    def loop(x: int) -> int:
        for node in in_order:
            x = node.forward(x)
        return x

    return Workload(f"chain of {length:,}", nodes, predecessors, loop)


def fan_out(width: int) -> Workload:
    """A source, ``width`` independent trivial nodes each reading it, and a join of them all."""
    source, join = Inc(), Total()
    middle: dict[str, soma.Node] = {f"m{i}": Inc() for i in range(width)}
    nodes: dict[str, soma.Node] = {"source": source, **middle, "join": join}
    predecessors = {"source": ()} | dict.fromkeys(middle, ("source",)) | {"join": tuple(middle)}

    def loop(x: int) -> int:
        shared = source.forward(x)
        return join.forward({node_id: node.forward(shared) for node_id, node in middle.items()})

    return Workload(f"fan-out 1 -> {width:,} -> 1", nodes, predecessors, loop)


# One block of the nested graph, `a >> ((b >> c) | d | (e >> (f | g))) >> h`, as edges between
# the letters; a block's `a` reads the previous block's `h`. Four nodes wide at `h`'s inputs.
BLOCK_EDGES = (
    ("a", "b"),
    ("b", "c"),
    ("a", "d"),
    ("a", "e"),
    ("e", "f"),
    ("e", "g"),
    ("c", "h"),
    ("d", "h"),
    ("f", "h"),
    ("g", "h"),
)
BLOCK_NODES = 8
BLOCK_WIDTH = 4


def nested(blocks: int) -> Workload:
    """``blocks`` blocks ``a >> ((b >> c) | d | (e >> (f | g))) >> h`` one after another, the
    ``h`` of each feeding the ``a`` of the next: waves nested two deep, repeated at any scale,
    ``8 * blocks`` trivial nodes. Node ids are the letter and the block's number (``c12``)."""
    nodes: dict[str, soma.Node] = {}
    predecessors: dict[str, tuple[str, ...]] = {}
    for k in range(blocks):
        for letter in "abcdefgh":
            nodes[f"{letter}{k}"] = Largest() if letter == "h" else Inc()
            predecessors[f"{letter}{k}"] = tuple(
                f"{source}{k}" for source, target in BLOCK_EDGES if target == letter
            )
        predecessors[f"a{k}"] = (f"h{k - 1}",) if k else ()
    # The loop's per-block work, resolved beforehand: the eight nodes and the keys of h's dict,
    # as the loop over a list of layers one would write by hand.
    in_blocks = [
        (
            tuple(nodes[f"{letter}{k}"] for letter in "abcdefgh"),
            (f"c{k}", f"d{k}", f"f{k}", f"g{k}"),
        )
        for k in range(blocks)
    ]

    def loop(x: int) -> int:
        for (a, b, c, d, e, f, g, h), (ck, dk, fk, gk) in in_blocks:
            av = a.forward(x)
            ev = e.forward(av)
            x = h.forward(
                {
                    ck: c.forward(b.forward(av)),
                    dk: d.forward(av),
                    fk: f.forward(ev),
                    gk: g.forward(ev),
                }
            )
        return x

    return Workload(f"nested blocks, {len(nodes):,} nodes", nodes, predecessors, loop)


def numpy_pair(size: int) -> Workload:
    """Two independent SVD nodes: a wave of two branches whose work releases the GIL."""
    nodes: dict[str, soma.Node] = {
        "left": SingularValues(size, seed=1),
        "right": SingularValues(size, seed=2),
    }

    def loop(x: object) -> dict[str, float]:
        return {node_id: node.forward(x) for node_id, node in nodes.items()}

    return Workload(f"two SVD branches ({size}x{size})", nodes, dict.fromkeys(nodes, ()), loop)


def numpy_pair_in_series(size: int) -> soma.Graph:
    """The nodes of :func:`numpy_pair` (same matrices) one after the other: the serial time."""
    return soma.Graph.somatize(SingularValues(size, seed=1) >> SingularValues(size, seed=2))


def wave(width: int) -> tuple[soma.Graph, Callable[[int], dict[int, int]]]:
    """``width`` trivial branches written with ``|``, and the loop calling the same nodes."""
    branches = [Inc() for _ in range(width)]
    expr: soma.Expr | soma.Node = branches[0]
    for branch in branches[1:]:
        expr = expr | branch

    def loop(x: int) -> dict[int, int]:
        return {at: node.forward(x) for at, node in enumerate(branches)}

    return soma.Graph.somatize(expr), loop


def in_a_rich_context(graph: soma.Graph, variables: int) -> Callable[[int], Any]:
    """``graph.forward``, called in a context where ``variables`` context variables are set:
    every branch enters a copy of it (``asyncio.to_thread``'s rule), the cost of which this
    shows beside the same wave called in an empty context."""
    context = contextvars.Context()
    for at in range(variables):
        context.run(contextvars.ContextVar(f"v{at}").set, at)
    return functools.partial(context.run, graph.forward)


def native_chain(length: int) -> soma.Graph:
    """``length`` Rust nodes (``soma.native.Add(1)``) in a row, driven from Python."""
    graph = soma.Graph()
    previous: str | None = None
    for i in range(length):
        node_id = graph.node(f"n{i}", soma.native.Add(1))
        if previous is not None:
            graph.edge(previous, node_id)
        previous = node_id
    return graph


def canonical(result: Any) -> Any:
    """A result in a form every contender can be compared on: Dask and Ray return tuples or
    lists where Soma returns a dict of leaves."""
    if isinstance(result, Mapping):
        return sorted(result.values())
    if isinstance(result, list | tuple):
        return sorted(result)
    return result
