"""The DSL: `>>` in series, `|` side by side, `.named`, auto ids, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

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
        lambda n: n >> (lambda x: x),
        lambda n: n >> None,
        lambda n: (n >> Pass()) | object(),
    ],
    ids=[
        "node>>int",
        "int>>node",
        "node|str",
        "str|node",
        "node>>lambda",
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
