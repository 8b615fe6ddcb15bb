"""The DSL: `>>` in series, `|` side by side, `.named`, auto ids, and what it refuses."""

from __future__ import annotations

import copy
import itertools
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import soma
from conftest import Add, Double, Encoder, HTTPServer, Other2, Pass, Source, build, named

# ---------------------------------------------------------------------------------------------
# The graph an expression draws


def test_series_connects_each_node_to_the_next() -> None:
    a, b, c = named("a b c")
    g = soma.Graph.somatize(a >> b >> c)
    assert g.nodes() == ["a", "b", "c"]
    assert g.edges() == [("a", "b"), ("b", "c")]


def test_parallel_is_a_disjoint_union() -> None:
    a, b = named("a b")
    g = soma.Graph.somatize(a | b)
    assert g.nodes() == ["a", "b"]
    assert g.edges() == []


def test_series_connects_every_terminal_to_every_head() -> None:
    a, b, c, d = named("a b c d")
    g = soma.Graph.somatize((a | b) >> (c | d))
    assert sorted(g.edges()) == [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")]


def test_nodes_are_declared_in_the_order_they_are_written() -> None:
    s, e, b, o, o2, j = named("s e b o o2 j")
    g = soma.Graph.somatize(s >> ((e >> b) | (o >> o2)) >> j)
    assert g.nodes() == ["s", "e", "b", "o", "o2", "j"]


def test_an_expression_gives_the_same_graph_and_plan_as_node_and_edge() -> None:
    a, b, c, d = named("a b c d")
    from_dsl = soma.Graph.somatize(a >> (b | c) >> d)
    by_hand = build(["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert from_dsl.nodes() == by_hand.nodes()
    assert sorted(from_dsl.edges()) == sorted(by_hand.edges())
    assert from_dsl.plan() == by_hand.plan()
    assert repr(from_dsl.plan()) == repr(by_hand.plan())


def test_an_expression_and_node_edge_give_the_same_result() -> None:
    from_dsl = soma.Graph.somatize(Add(1).named("a") >> Double().named("b"))
    by_hand = soma.Graph()
    by_hand.node("a", Add(1))
    by_hand.node("b", Double())
    by_hand.edge("a", "b")
    assert from_dsl.forward(5) == by_hand.forward(5) == 12


def test_somatize_accepts_a_single_node() -> None:
    node = Double().named("only")
    g = soma.Graph.somatize(node)
    assert g.nodes() == ["only"]
    assert repr(g.plan()) == "Execute(only)"
    assert g.forward(4) == 8


def test_somatize_registers_the_node_objects_themselves() -> None:
    a, b = named("a b")
    g = soma.Graph.somatize(a >> b)
    assert g.implementation("a") is a
    assert g.implementation("b") is b


def test_somatize_returns_a_graph() -> None:
    a, b = named("a b")
    assert isinstance(soma.Graph.somatize(a >> b), soma.Graph)


def test_rust_nodes_take_part_in_expressions() -> None:
    g = soma.Graph.somatize(Add(1) >> soma.native.Add(2) >> Double())
    assert len(g) == 3
    assert g.forward(0) == 6


# ---------------------------------------------------------------------------------------------
# Precedence: `>>` binds tighter than `|`


def test_series_binds_tighter_than_parallel_on_the_left() -> None:
    a, b, c = named("a b c")
    g = soma.Graph.somatize(a >> b | c)
    assert g.edges() == [("a", "b")]
    assert repr(g.plan()) == "Wave([Sequence([Execute(a), Execute(b)]), Execute(c)])"


def test_series_binds_tighter_than_parallel_on_the_right() -> None:
    a, b, c = named("a b c")
    g = soma.Graph.somatize(a | b >> c)
    assert g.edges() == [("b", "c")]
    assert repr(g.plan()) == "Wave([Execute(a), Sequence([Execute(b), Execute(c)])])"


def test_parentheses_override_precedence() -> None:
    a, b, c = named("a b c")
    g = soma.Graph.somatize(a >> (b | c))
    assert g.edges() == [("a", "b"), ("a", "c")]


# ---------------------------------------------------------------------------------------------
# What an expression refuses


@pytest.mark.parametrize(
    "build_expression",
    [
        lambda n: n >> 3,
        lambda n: 3 >> n,
        lambda n: n | "text",
        lambda n: "text" | n,
        lambda n: n >> {"not": "callable"},
        lambda n: n >> None,
        lambda n: (n >> Pass()) | object(),
    ],
    ids=[
        "node>>int",
        "int>>node",
        "node|str",
        "str|node",
        "node>>dict",
        "node>>None",
        "expr|obj",
    ],
)
def test_a_non_node_in_an_expression_raises_type_error(build_expression: Any) -> None:
    with pytest.raises(TypeError):
        build_expression(Pass())


def test_the_type_error_for_a_non_node_says_what_to_do() -> None:
    with pytest.raises(TypeError) as excinfo:
        Pass() >> 3  # type: ignore[operator]
    message = str(excinfo.value)
    assert "int" in message
    assert "Node" in message
    assert "forward" in message


def test_the_same_node_twice_in_one_expression_is_a_duplicate_node_error() -> None:
    a = Pass().named("a")
    expression = a >> Double() >> a
    with pytest.raises(soma.DuplicateNodeError) as excinfo:
        soma.Graph.somatize(expression)
    assert excinfo.value.node == "a"


def test_the_same_node_in_two_branches_is_a_duplicate_node_error() -> None:
    shared = Double()
    expression = Pass() >> (shared | shared)
    with pytest.raises(soma.DuplicateNodeError):
        soma.Graph.somatize(expression)


# ---------------------------------------------------------------------------------------------
# Ids


def test_named_returns_the_node_itself() -> None:
    node = Pass()
    assert node.named("x") is node


def test_named_sets_the_id_the_graph_uses() -> None:
    g = soma.Graph.somatize(Pass().named("first") >> Double().named("second"))
    assert g.nodes() == ["first", "second"]


@pytest.mark.parametrize(
    ("cls", "expected"),
    [(Source, "source"), (Encoder, "encoder"), (Other2, "other2"), (HTTPServer, "http_server")],
)
def test_an_unnamed_node_gets_the_snake_case_of_its_class_name(cls: type, expected: str) -> None:
    assert soma.Graph.somatize(cls()).nodes() == [expected]


def test_unnamed_nodes_of_one_class_get_numbered_suffixes() -> None:
    g = soma.Graph.somatize(Add(1) >> Add(2) >> Add(3))
    assert g.nodes() == ["add", "add_2", "add_3"]
    assert g.forward(0) == 6


def test_an_auto_id_steps_around_an_explicit_name() -> None:
    g = soma.Graph.somatize(Pass().named("add") >> Add(1))
    assert g.nodes() == ["add", "add_2"]


def test_rust_nodes_get_auto_ids_too() -> None:
    g = soma.Graph.somatize(soma.native.Add(1) >> soma.native.Add(2))
    assert len(set(g.nodes())) == 2
    assert g.forward(0) == 3


def test_an_invalid_name_is_refused_with_invalid_id_error() -> None:
    with pytest.raises(soma.InvalidIdError):
        soma.Graph.somatize(Pass().named("has space") >> Double())


# ---------------------------------------------------------------------------------------------
# Expressions of any size and depth


_Read = tuple[tuple[Any, ...], tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]


def _reference(expr: Any) -> _Read:
    """What an expression reads as, by the rules the DSL states, written recursively: the oracle
    for small trees only."""
    if not isinstance(expr, soma.Expr):  # A node, standing for itself in a tree.
        return (expr,), (), (0,), (0,)
    if expr._left is None:
        return (expr._node,), (), (0,), (0,)
    left, right = _reference(expr._left), _reference(expr._right)
    by = len(left[0])
    edges = left[1] + tuple((a + by, b + by) for a, b in right[1])
    if expr._series:
        crossing = tuple((t, h + by) for t in left[3] for h in right[2])
        return left[0] + right[0], edges + crossing, left[2], tuple(t + by for t in right[3])
    heads = left[2] + tuple(h + by for h in right[2])
    return left[0] + right[0], edges, heads, left[3] + tuple(t + by for t in right[3])


@given(st.recursive(st.just("node"), lambda inner: st.tuples(st.sampled_from(">|"), inner, inner)))
def test_an_expression_reads_as_its_rules_say_whatever_its_shape(shape: Any) -> None:
    def made(shape: Any) -> Any:
        if shape == "node":
            return Pass()
        op, left, right = shape
        return made(left) >> made(right) if op == ">" else made(left) | made(right)

    expr = soma.Expr.of(made(shape), ">>")
    assert (expr.nodes, expr.edges, expr.heads, expr.terminals) == _reference(expr)


def test_a_chain_built_by_a_loop_gives_the_graph_node_and_edge_give() -> None:
    expr = Pass()
    for _ in range(999):
        expr = expr >> Pass()
    from_dsl = soma.Graph.somatize(expr)
    ids = ["pass"] + [f"pass_{n}" for n in range(2, 1001)]
    by_hand = build(ids, list(itertools.pairwise(ids)))
    assert from_dsl.nodes() == by_hand.nodes()
    assert from_dsl.edges() == by_hand.edges()
    assert from_dsl.plan() == by_hand.plan()


def test_a_wave_built_by_a_loop_in_either_direction_lists_its_branches_in_written_order() -> None:
    nodes = named(" ".join(f"n{i}" for i in range(1000)))
    leftwards: Any = nodes[0]
    for node in nodes[1:]:
        leftwards = leftwards | node
    rightwards: Any = nodes[-1]
    for node in reversed(nodes[:-1]):
        rightwards = node | rightwards
    for expr in (leftwards, rightwards):
        assert expr.nodes == tuple(nodes)
        assert expr.heads == expr.terminals == tuple(range(1000))
        assert expr.edges == ()


@pytest.mark.parametrize("operator", [">>", "|"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_an_expression_nested_100_000_deep_builds_reads_and_goes_without_recursion_error(
    operator: str, side: str
) -> None:
    expr: Any = Pass()
    for _ in range(100_000 - 1):
        node = Pass()
        if operator == ">>":
            expr = expr >> node if side == "left" else node >> expr
        else:
            expr = expr | node if side == "left" else node | expr
    assert len(expr.nodes) == 100_000
    assert len(expr.edges) == (100_000 - 1 if operator == ">>" else 0)
    g = soma.Graph.somatize(expr)
    assert len(g) == 100_000
    del expr, g  # Freed as deep as it was built: no recursion there either.


def test_a_loop_of_chains_wired_into_one_join_connects_every_end() -> None:
    branches: Any = Pass().named("b0") >> Pass()
    for n in range(1, 100):
        branches = branches | (Pass().named(f"b{n}") >> Pass())
    expr = Pass().named("start") >> branches >> Pass().named("join")
    g = soma.Graph.somatize(expr)
    assert len(g.successors("start")) == 100
    assert len(g.predecessors("join")) == 100
    assert repr(g.plan()).startswith("Sequence([Execute(start), Wave([")


def test_an_expression_100_000_deep_copies_and_pickles_as_what_it_reads_as() -> None:
    expr: Any = Pass()
    for _ in range(100_000 - 1):
        expr = expr >> Pass()
    for twin in (copy.copy(expr), copy.deepcopy(expr), pickle.loads(pickle.dumps(expr))):
        assert len(twin.nodes) == 100_000
        assert twin.edges == expr.edges
        assert (twin.heads, twin.terminals) == (expr.heads, expr.terminals)
    shallow = copy.copy(expr)
    assert shallow.nodes == expr.nodes  # The very nodes.
    joined = soma.Graph.somatize(Pass().named("first") >> shallow >> Pass().named("last"))
    assert len(joined) == 100_002
    assert joined.successors("first") == ["pass"]
    assert joined.predecessors("last") == ["pass_100000"]
