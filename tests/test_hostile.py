"""Hostile and careless calls: does Soma refuse each one where it is made, clearly, and leave
everything as it was?

Each test is one row of the guarantee "nothing a user does crashes, hangs or leaks": a class
given where a node instance belongs, ids that are not text (a lone surrogate, an int, a node
object), integers that a Rust node's 64 bits cannot hold, and ``copy.copy``/``copy.deepcopy``
of a graph, a plan and a trace. A refusal is the right exception type, naming the offending
thing and carrying a ``hint:`` line, and the graph it was made on is unchanged.

The other rows of that guarantee live beside what they exercise: deep values crossing into Rust
nodes in ``test_deep_values.py``; a node's C-level recursion on a lent thread's stack in
``test_threads.py``; a node calling a graph's ``forward`` in ``test_reentry.py``; a driver's
``BaseException``, its answers that are not lists and a turn limit of 0 in ``test_await.py``;
all of them in any order, from several threads, in ``test_hostile_sequences.py``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

import soma
from conftest import Add, Pass, build
from soma import native

BAD = "x\ud800"  # A lone surrogate: a valid Python `str`, but not text that UTF-8 can hold.


def unchanged(g: soma.Graph, action: Callable[[], object], error: type[BaseException]) -> str:
    """Runs `action`, which must raise `error`; checks the graph is as before; returns the
    message."""
    before = (g.nodes(), g.edges())
    with pytest.raises(error) as raised:
        action()
    assert (g.nodes(), g.edges()) == before
    message = str(raised.value)
    assert "\nhint: " in message
    return message


# ---------------------------------------------------------------------------------------------
# A class where a node instance belongs


def test_a_node_class_given_with_an_id_is_refused_at_insertion_with_the_instance_as_hint() -> None:
    g = build(["a"], [])
    message = unchanged(g, lambda: g.node("x", Pass), TypeError)
    assert message.startswith("`Pass` is a class, where a node instance is expected\n")
    assert 'hint: register an instance: `g.node("x", Pass())`' in message


def test_a_node_class_given_alone_is_refused_at_insertion_with_the_instance_as_hint() -> None:
    g = build(["a"], [])
    message = unchanged(g, lambda: g.node(Pass), TypeError)
    assert "`Pass` is a class" in message
    assert "`g.node(Pass())`" in message


def test_a_native_node_class_is_refused_at_insertion() -> None:
    g = soma.Graph()
    assert "`g.node(Sum())`" in unchanged(g, lambda: g.node(native.Sum), TypeError)


def test_a_class_without_forward_is_refused_as_a_class() -> None:
    g = soma.Graph()
    message = unchanged(g, lambda: g.node("x", dict), TypeError)
    assert message.startswith("`dict` is a class, where a node instance is expected\n")
    assert "forward(self, x)" in message


def test_a_hint_keeps_an_id_with_quotes_a_valid_literal() -> None:
    g = soma.Graph()
    assert "`g.node('say\"hi', Pass())`" in unchanged(g, lambda: g.node('say"hi', Pass), TypeError)


def test_somatize_refuses_a_class_and_a_union_of_classes_naming_the_instances() -> None:
    with pytest.raises(TypeError, match=r"`Pass` is a class") as raised:
        soma.Graph.somatize(Pass)  # type: ignore[arg-type]
    assert "`soma.Graph.somatize(Pass())`" in str(raised.value)
    # `A | B` of two classes is a typing union, not an expression.
    with pytest.raises(TypeError, match=r"joins classes") as raised:
        soma.Graph.somatize(Pass | Add)  # type: ignore[arg-type]
    assert "`soma.Graph.somatize(Pass() | Add())`" in str(raised.value)


@pytest.mark.parametrize(
    "compose",
    [lambda: Pass() >> Pass, lambda: Pass >> Pass(), lambda: Pass() | Pass, lambda: Pass | Pass()],
    ids=["node >> class", "class >> node", "node | class", "class | node"],
)
def test_a_class_inside_an_expression_is_refused_when_the_expression_is_written(
    compose: Callable[[], object],
) -> None:
    with pytest.raises(
        TypeError, match=r"`Pass` is a class, where a node instance is expected"
    ) as raised:
        compose()
    assert "hint: compose an instance: `Pass()`" in str(raised.value)


# ---------------------------------------------------------------------------------------------
# Ids that are not text


def test_an_id_holding_a_lone_surrogate_is_refused_as_invalid_at_node() -> None:
    g = build(["a"], [])
    message = unchanged(g, lambda: g.node(BAD, Pass()), soma.InvalidIdError)
    assert message.startswith(f"invalid node id `{BAD!r}`: `'\\ud800'` at index 1 is a lone")
    with pytest.raises(soma.InvalidIdError) as raised:
        g.node(BAD, Pass())
    assert raised.value.node == BAD
    assert isinstance(raised.value, soma.GraphError)
    assert isinstance(raised.value, ValueError)


def test_an_id_holding_a_lone_surrogate_given_with_named_is_refused_as_invalid() -> None:
    g = soma.Graph()
    unchanged(g, lambda: g.node(Pass().named(BAD)), soma.InvalidIdError)


@pytest.mark.parametrize("end", ["source", "target"])
def test_an_edge_end_holding_a_lone_surrogate_is_refused_as_invalid(end: str) -> None:
    g = build(["a", "b"], [("a", "b")])
    ends = (BAD, "a") if end == "source" else ("a", BAD)
    message = unchanged(g, lambda: g.edge(*ends), soma.InvalidIdError)
    assert message.startswith(f"invalid edge {end} `{BAD!r}`")


@pytest.mark.parametrize("bad", [3, None, b"a", Pass()], ids=["int", "None", "bytes", "node"])
def test_an_id_that_is_not_a_str_is_refused_with_a_type_error(bad: Any) -> None:
    g = build(["a", "b"], [])
    assert "not an object of type" in unchanged(g, lambda: g.node(bad, Pass()), TypeError)
    assert "`node()` returned" in unchanged(g, lambda: g.edge(bad, "b"), TypeError)
    assert "`node()` returned" in unchanged(g, lambda: g.edge("a", bad), TypeError)
    if bad is not None:  # `.named(None)` is no name: the id is derived from the class.
        unchanged(g, lambda: g.node(Pass().named(bad)), TypeError)


def test_lookups_refuse_an_id_that_is_not_text_and_membership_is_false() -> None:
    g = build(["a"], [])
    for lookup in (g.predecessors, g.successors, g.implementation):
        unchanged(g, lambda lookup=lookup: lookup(BAD), soma.InvalidIdError)  # type: ignore[misc]
        unchanged(g, lambda lookup=lookup: lookup(3), TypeError)  # type: ignore[misc]
    assert BAD not in g
    assert 3 not in g


# ---------------------------------------------------------------------------------------------
# Integers a Rust node cannot hold


def test_native_add_past_the_64_bit_range_raises_overflow_error_naming_the_node() -> None:
    g = soma.Graph.somatize(native.Add(1).named("inc"))
    with pytest.raises(OverflowError, match=r"^`inc` overflowed: 9223372036854775807 \+ 1 ") as e:
        g.forward(2**63 - 1)
    assert e.value.__notes__ == ["raised in soma node `inc`"]
    assert "\nhint: " in str(e.value)
    assert g.forward(2**63 - 2) == 2**63 - 1  # The last int that fits is exact.
    with pytest.raises(OverflowError, match=r"`Add\(-1\)` overflowed"):
        native.Add(-1).forward(-(2**63))


def test_native_add_refuses_a_k_past_the_64_bit_range_with_overflow_error() -> None:
    with pytest.raises(OverflowError, match=r"^`Add\(9223372036854775808\)`: `k` is outside"):
        native.Add(2**63)


def test_native_sum_of_ints_past_the_64_bit_range_raises_overflow_error_naming_the_node() -> None:
    both = native.Identity().named("a") | native.Identity().named("b")
    g = soma.Graph.somatize(both >> native.Sum().named("total"))
    with pytest.raises(OverflowError, match=r"^`total` overflowed: the sum 9223372036854775808 "):
        g.forward(2**62)
    with pytest.raises(OverflowError, match=r"the sum -9223372036854775809 "):
        native.Sum().forward([-(2**63), -1])


def test_native_sum_is_exact_where_python_is() -> None:
    total = native.Sum().forward
    # A running sum that strays past 64 bits and comes back is no overflow: Python's is exact.
    assert total([2**62, 2**62, -(2**62)]) == 2**62
    assert total([-(2**63)]) == -(2**63)
    # From the first float on, floats, as Python's `sum`.
    assert total([2**62, 2**62, 1.5]) == sum([2**62, 2**62, 1.5])
    assert total([1, 2.5, 3]) == 6.5


# ---------------------------------------------------------------------------------------------
# Copies


class Box(soma.Node):
    def __init__(self, items: list[int]) -> None:
        self.items = items

    def forward(self, x: Any) -> Any:
        return [*self.items, x]


def graph_of_boxes() -> tuple[soma.Graph, list[int]]:
    shared = [1]
    g = soma.Graph()
    g.node("b", Box(shared))
    g.node("a", Box(shared))
    g.node("n", native.Identity())
    g.edge("b", "n")
    g.edge("a", "n")
    g.idle_threads = 3
    return g, shared


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copied_graph_is_independent_with_the_same_nodes_and_edges(
    how: Callable[[soma.Graph], soma.Graph],
) -> None:
    g, _ = graph_of_boxes()
    twin = how(g)
    assert twin is not g
    assert type(twin) is soma.Graph
    assert (twin.nodes(), twin.edges()) == (g.nodes(), g.edges())
    assert twin.idle_threads == 3
    assert twin.plan() == g.plan()
    assert twin.forward(0) == g.forward(0)
    twin.node("c", Pass())
    twin.edge("c", "n")
    assert "c" not in g
    assert g.edges() == [("b", "n"), ("a", "n")]
    g.node("d", Pass())
    assert "d" not in twin


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copied_graph_keeps_a_node_unplaced_whose_own_on_was_undone(
    how: Callable[[soma.Graph], soma.Graph],
) -> None:
    g = soma.Graph()
    g.node("a", Pass().on("meta").at("gpu-box"))
    g.place("a", None)
    g.place_at("a", None)
    twin = how(g)
    assert (twin.devices(), twin.hosts()) == ({}, {})


def test_copy_copy_of_a_graph_shares_its_node_objects() -> None:
    g, _ = graph_of_boxes()
    twin = copy.copy(g)
    assert all(twin.implementation(n) is g.implementation(n) for n in g.nodes())


def test_copy_deepcopy_of_a_graph_copies_its_node_objects_keeping_what_they_share() -> None:
    g, shared = graph_of_boxes()
    twin = copy.deepcopy(g)
    a, b = twin.implementation("a"), twin.implementation("b")
    assert a is not g.implementation("a")
    assert a.items is b.items  # Shared in the original, shared in the copy.
    assert a.items is not shared
    a.items.append(2)
    assert g.forward(0) == {"b": [1, 0], "a": [1, 0]}
    assert shared == [1]


def test_copy_deepcopy_of_a_graph_points_a_node_that_holds_the_graph_at_the_copy() -> None:
    g = soma.Graph()
    keeper = Box([])
    keeper.graph = g  # type: ignore[attr-defined]
    g.node("k", keeper)
    twin = copy.deepcopy(g)
    assert twin.implementation("k").graph is twin


def test_a_plan_and_a_span_are_their_own_copies() -> None:
    g = build(["a", "b"], [("a", "b")])
    trace = soma.Trace()
    g.forward(1, trace=trace)
    plan, child, span = g.plan(), g.plan().children[0], trace.spans[0]
    for how in (copy.copy, copy.deepcopy):
        assert how(plan) is plan
        assert how(child) is child
        assert how(span) is span


def test_a_native_node_deep_copies() -> None:
    node = native.Add(2)
    twin = copy.deepcopy(node)
    assert twin.forward(1) == 3
    assert twin._soma_native is node._soma_native  # Immutable: shared, not duplicated.


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_copying_a_trace_is_refused_with_how_to_keep_its_spans(
    how: Callable[[soma.Trace], soma.Trace],
) -> None:
    trace = soma.Trace()
    build(["a"], []).forward(1, trace=trace)
    with pytest.raises(TypeError, match=r"cannot copy a `soma.Trace`") as raised:
        how(trace)
    assert "\nhint: " in str(raised.value)
    assert "trace.spans" in str(raised.value)
    assert len(trace) == 1
