"""Properties over random graphs (hypothesis; profile "ci" is deterministic, see conftest.py).

Random DAGs built with node()/edge() check the plan's invariants — every node once, edges
respected, inputs exact, waves disjoint, compilation deterministic — and that a run computes
what the graph says. Random `>>`/`|` expression trees check the oracle: the plan is the tree
that was written, nested series flattened into one Sequence and nested parallels into one Wave.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import soma
from conftest import Log, Pass, walk

# ---------------------------------------------------------------------------------------------
# Random DAGs


@dataclass(frozen=True)
class Dag:
    nodes: list[str]  # insertion order
    edges: list[tuple[str, str]]  # declaration order

    def predecessors(self, node: str) -> list[str]:
        return [src for src, dst in self.edges if dst == node]

    def successors(self, node: str) -> list[str]:
        return [dst for src, dst in self.edges if src == node]

    def topological(self) -> list[str]:
        done: list[str] = []
        while len(done) < len(self.nodes):
            for node in self.nodes:
                if node not in done and all(p in done for p in self.predecessors(node)):
                    done.append(node)
                    break
        return done


@st.composite
def dags(draw: st.DrawFn, max_nodes: int = 10) -> Dag:
    n = draw(st.integers(min_value=0, max_value=max_nodes))
    nodes = draw(st.permutations([f"n{i}" for i in range(n)]))
    # A hidden topological rank, independent of insertion order: edges only go up in rank.
    rank = dict(zip(nodes, draw(st.permutations(range(n))), strict=True))
    pairs = [(u, v) for u in nodes for v in nodes if rank[u] < rank[v]]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    return Dag(list(nodes), edges)


class Traced(soma.Node):
    """Logs the call, then returns `(id, input)` — a fan-in as its ordered items — so the run's
    output spells out the whole data flow."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def forward(self, x: Any, ctx: Any) -> Any:
        self.log.add(ctx.node, x)
        if isinstance(x, dict):
            return (ctx.node, list(x.items()))
        return (ctx.node, x)


def graph_of(dag: Dag, log: Log | None = None) -> soma.Graph:
    g = soma.Graph()
    for node in dag.nodes:
        g.node(node, Pass() if log is None else Traced(log))
    for src, dst in dag.edges:
        g.edge(src, dst)
    return g


def expected_run(dag: Dag, x: Any) -> Any:
    """What a run must return, computed by hand in a topological order."""
    out: dict[str, Any] = {}
    for node in dag.topological():
        preds = dag.predecessors(node)
        if not preds:
            out[node] = (node, x)
        elif len(preds) == 1:
            out[node] = (node, out[preds[0]])
        else:
            out[node] = (node, [(p, out[p]) for p in preds])
    leaves = [node for node in dag.nodes if not dag.successors(node)]
    if not leaves:
        return x
    if len(leaves) == 1:
        return out[leaves[0]]
    return {leaf: out[leaf] for leaf in leaves}


def positions(plan: Any, path: tuple[tuple[str, int], ...] = ()) -> dict[str, Any]:
    """Each Execute's node, mapped to its path from the root: (container kind, child index)."""
    if plan.kind == "Execute":
        return {plan.node: path}
    found: dict[str, Any] = {}
    for i, child in enumerate(plan.children):
        found.update(positions(child, (*path, (plan.kind, i))))
    return found


def executes(plan: Any) -> list[str]:
    return [p.node for p in walk(plan) if p.kind == "Execute"]


@given(dags())
def test_the_plan_executes_every_node_exactly_once(dag: Dag) -> None:
    steps = executes(graph_of(dag).plan())
    assert Counter(steps) == Counter(dag.nodes)


@given(dags())
def test_a_run_calls_every_node_exactly_once(dag: Dag) -> None:
    log = Log()
    graph_of(dag, log).forward(0)
    assert Counter(log.order()) == Counter(dag.nodes)


@given(dags())
def test_the_plan_orders_every_edge_in_a_sequence_never_across_a_wave(dag: Dag) -> None:
    where = positions(graph_of(dag).plan())
    for src, dst in dag.edges:
        a, b = where[src], where[dst]
        common = 0
        while a[common] == b[common]:
            common += 1
        # Where the two paths part, the same container holds both: it must run them in a row,
        # the source's step first.
        (kind_a, index_a), (kind_b, index_b) = a[common], b[common]
        assert kind_a == kind_b == "Sequence", (src, dst, a, b)
        assert index_a < index_b, (src, dst, a, b)


@given(dags())
def test_the_real_order_of_a_run_respects_every_edge(dag: Dag) -> None:
    log = Log()
    graph_of(dag, log).forward(0)
    order = log.order()
    for src, dst in dag.edges:
        assert order.index(src) < order.index(dst)


@given(dags())
def test_every_execute_reads_exactly_its_predecessors_in_edge_order(dag: Dag) -> None:
    g = graph_of(dag)
    for step in walk(g.plan()):
        if step.kind == "Execute":
            assert step.inputs == dag.predecessors(step.node)
            assert step.inputs == g.predecessors(step.node)


@given(dags())
def test_a_waves_branches_share_no_node(dag: Dag) -> None:
    for step in walk(graph_of(dag).plan()):
        if step.kind == "Wave":
            seen: set[str] = set()
            for branch in step.children:
                mine = set(executes(branch))
                assert not seen & mine
                seen |= mine


@given(dags())
def test_the_same_graph_always_compiles_the_same(dag: Dag) -> None:
    first, second = graph_of(dag), graph_of(dag)
    assert first.plan() == second.plan()
    assert repr(first.plan()) == repr(second.plan())
    assert first.plan() == first.plan()


@given(dags(), st.integers())
def test_a_run_returns_what_the_graph_computes_by_hand(dag: Dag, x: int) -> None:
    assert graph_of(dag, Log()).forward(x) == expected_run(dag, x)


# ---------------------------------------------------------------------------------------------
# Random expression trees: the oracle

Tree = Any  # "leaf" | (op, [Tree, ...]) with op ">>" or "|"

trees = st.recursive(
    st.just("leaf"),
    lambda kids: st.tuples(st.sampled_from([">>", "|"]), st.lists(kids, min_size=2, max_size=3)),
    max_leaves=12,
)


def label(tree: Tree, counter: list[int] | None = None) -> Tree:
    """The same tree with each leaf named `n0`, `n1`, ... left to right."""
    counter = [0] if counter is None else counter
    if tree == "leaf":
        name = f"n{counter[0]}"
        counter[0] += 1
        return name
    op, kids = tree
    return (op, [label(kid, counter) for kid in kids])


def expression(tree: Tree) -> Any:
    if isinstance(tree, str):
        return Pass().named(tree)
    op, kids = tree
    combine = operator.rshift if op == ">>" else operator.or_
    return functools.reduce(combine, [expression(kid) for kid in kids])


def written(tree: Tree) -> str:
    """The plan the tree spells, nested series flattened into one Sequence and nested
    parallels into one Wave."""
    if isinstance(tree, str):
        return f"Execute({tree})"
    op, kids = tree
    flat: list[Tree] = []
    for kid in kids:
        if not isinstance(kid, str) and kid[0] == op:
            flat.extend(flatten_same(kid, op))
        else:
            flat.append(kid)
    kind = "Sequence" if op == ">>" else "Wave"
    return f"{kind}([{', '.join(written(kid) for kid in flat)}])"


def flatten_same(tree: Tree, op: str) -> list[Tree]:
    if isinstance(tree, str) or tree[0] != op:
        return [tree]
    return [leaf for kid in tree[1] for leaf in flatten_same(kid, op)]


def wiring(tree: Tree) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """Heads, terminals and edges of a tree, computed by hand."""
    if isinstance(tree, str):
        return [tree], [tree], []
    op, kids = tree
    parts = [wiring(kid) for kid in kids]
    if op == "|":
        return (
            [h for heads, _, _ in parts for h in heads],
            [t for _, terms, _ in parts for t in terms],
            [e for _, _, edges in parts for e in edges],
        )
    edges = [e for _, _, kid_edges in parts for e in kid_edges]
    for (_, terms, _), (heads, _, _) in itertools.pairwise(parts):
        edges += [(t, h) for t in terms for h in heads]
    return parts[0][0], parts[-1][1], edges


def leaves_of(tree: Tree) -> list[str]:
    if isinstance(tree, str):
        return [tree]
    return [leaf for kid in tree[1] for leaf in leaves_of(kid)]


@given(trees)
def test_the_plan_of_an_expression_is_the_tree_that_was_written(tree: Tree) -> None:
    tree = label(tree)
    assert repr(soma.Graph.somatize(expression(tree)).plan()) == written(tree)


@given(trees)
def test_an_expression_declares_its_nodes_in_written_order(tree: Tree) -> None:
    tree = label(tree)
    assert soma.Graph.somatize(expression(tree)).nodes() == leaves_of(tree)


@given(trees)
def test_an_expression_draws_the_same_graph_and_plan_as_node_and_edge(tree: Tree) -> None:
    tree = label(tree)
    from_dsl = soma.Graph.somatize(expression(tree))
    _, _, edges = wiring(tree)
    by_hand = graph_of(Dag(leaves_of(tree), edges))
    assert sorted(from_dsl.edges()) == sorted(edges)
    assert from_dsl.plan() == by_hand.plan()
