"""Graph construction, queries, ids and the errors that refuse a call without changing anything."""

from __future__ import annotations

import gc
import itertools
import pickle
from collections.abc import Callable
from typing import Any

import pytest

import soma
from conftest import Add, Double, Encoder, HTTPServer, Other2, Pass, build

# ---------------------------------------------------------------------------------------------
# Construction and queries


def test_node_returns_the_id_it_registered_as_a_str() -> None:
    g = soma.Graph()
    assert g.node("a", Pass()) == "a"
    assert type(g.node(Double())) is str


def test_nodes_lists_ids_in_insertion_order() -> None:
    g = build(["z", "a", "m"], [])
    assert g.nodes() == ["z", "a", "m"]


def test_edges_lists_pairs_in_declaration_order() -> None:
    g = build(["a", "b", "c"], [("b", "c"), ("a", "c"), ("a", "b")])
    assert g.edges() == [("b", "c"), ("a", "c"), ("a", "b")]


def test_roots_are_the_nodes_without_predecessors_in_insertion_order() -> None:
    g = build(["x", "b", "a", "y"], [("x", "y"), ("a", "y")])
    assert g.roots() == ["x", "b", "a"]


def test_leaves_are_the_nodes_without_successors_in_insertion_order() -> None:
    g = build(["y", "x", "b", "a"], [("x", "y"), ("x", "a")])
    assert g.leaves() == ["y", "b", "a"]


def test_predecessors_follow_edge_declaration_order() -> None:
    g = build(["a", "b", "c", "j"], [("c", "j"), ("a", "j"), ("b", "j")])
    assert g.predecessors("j") == ["c", "a", "b"]


def test_successors_follow_edge_declaration_order() -> None:
    g = build(["s", "a", "b", "c"], [("s", "c"), ("s", "a"), ("s", "b")])
    assert g.successors("s") == ["c", "a", "b"]


def test_topological_sort_puts_every_node_after_its_predecessors() -> None:
    g = build(["d", "c", "b", "a"], [("a", "b"), ("b", "c"), ("c", "d")])
    assert g.topological_sort() == ["a", "b", "c", "d"]


def test_topological_sort_breaks_ties_by_insertion_order() -> None:
    g = build(["x", "y", "z"], [("z", "x")])
    assert g.topological_sort() == ["y", "z", "x"]


def test_implementation_is_the_registered_object_itself() -> None:
    g = soma.Graph()
    node = Add(1)
    g.node("inc", node)
    assert g.implementation("inc") is node


def test_len_counts_nodes() -> None:
    g = build(["a", "b", "c"], [("a", "b")])
    assert len(g) == 3
    assert len(soma.Graph()) == 0


def test_in_tells_whether_an_id_is_a_node() -> None:
    g = build(["a"], [])
    assert "a" in g
    assert "b" not in g


def test_repr_names_the_graphs_nodes() -> None:
    g = build(["alpha", "beta"], [("alpha", "beta")])
    text = repr(g)
    assert "alpha" in text
    assert "beta" in text


def test_repr_counts_and_lists_nodes_and_edges_and_says_nothing_of_what_is_absent() -> None:
    assert repr(soma.Graph()) == "Graph(0 nodes, 0 edges)"
    assert repr(build(["a"], [])) == "Graph(1 node: a; 0 edges)"
    assert repr(build(["a", "b"], [("a", "b")])) == "Graph(2 nodes: a, b; 1 edge: a -> b)"


def test_repr_lists_at_most_eight_of_each() -> None:
    ids = [f"n{i}" for i in range(10)]
    text = repr(build(ids, list(itertools.pairwise(ids))))
    assert text.startswith("Graph(10 nodes: n0, n1, n2, n3, n4, n5, n6, n7, ...; 9 edges: n0 -> n1")
    assert text.endswith("n7 -> n8, ...)")


def test_a_duck_typed_object_with_a_callable_forward_is_a_node() -> None:
    class Duck:
        def forward(self, x: Any) -> Any:
            return x + 1

    g = soma.Graph()
    assert g.node(Duck()) == "duck"
    assert g.forward(1) == 2


class _SaysWhetherCtx(soma.Node):
    def forward(self, x: Any) -> Any:
        return ("x alone", x)


def _with_ctx(x: Any, ctx: soma.Ctx) -> Any:
    return ("with ctx", ctx.node)


def test_an_instance_forward_of_its_own_is_called_as_it_is_written() -> None:
    g = soma.Graph()
    g.node("plain", _SaysWhetherCtx())  # Its class's forward, answered once for the class.
    own = _SaysWhetherCtx()
    own.forward = _with_ctx  # type: ignore[method-assign]
    g.node("own", own)
    assert g.forward(1) == {"plain": ("x alone", 1), "own": ("with ctx", "own")}


def test_a_forward_replaced_on_the_class_is_called_as_the_new_one_is_written() -> None:
    class Swapped(soma.Node):
        def forward(self, x: Any) -> Any:
            return ("x alone", x)

    first = soma.Graph()
    first.node("n", Swapped())
    assert first.forward(1) == ("x alone", 1)

    def forward(self: Any, x: Any, ctx: soma.Ctx) -> Any:
        return ("with ctx", ctx.node)

    Swapped.forward = forward  # type: ignore[method-assign]
    second = soma.Graph()
    second.node("m", Swapped())
    assert second.forward(1) == ("with ctx", "m")


def test_classes_made_and_dropped_one_after_another_are_each_called_as_written() -> None:
    # Each class's function is freed before the next is made, so the next may sit at the same
    # address: an answer kept for the first must not be taken for it.
    for n in range(40):
        if n % 2:

            class Made(soma.Node):
                def forward(self, x: Any, ctx: soma.Ctx) -> Any:
                    return ("with ctx", ctx.node)

        else:

            class Made(soma.Node):  # type: ignore[no-redef]
                def forward(self, x: Any) -> Any:
                    return ("x alone", x)

        g = soma.Graph()
        g.node("n", Made())
        assert g.forward(1) == (("with ctx", "n") if n % 2 else ("x alone", 1))
        del g, Made
        gc.collect()


def test_a_forward_that_a_class_computes_is_looked_at_for_each_object() -> None:
    class Chooses:
        def __init__(self, ctx: bool) -> None:
            self.ctx = ctx

        @property
        def forward(self) -> Any:
            return _with_ctx if self.ctx else (lambda x: ("x alone", x))

    g = soma.Graph()
    g.node("a", Chooses(ctx=False))
    g.node("b", Chooses(ctx=True))
    assert g.forward(1) == {"a": ("x alone", 1), "b": ("with ctx", "b")}


@pytest.mark.parametrize(
    "thing",
    [42, "text", object(), 3.5, type("NotCallable", (), {"forward": 3})()],
    ids=["int", "str", "object", "float", "non-callable-forward"],
)
def test_node_refuses_an_object_without_a_callable_forward_with_type_error(thing: Any) -> None:
    g = soma.Graph()
    with pytest.raises(TypeError):
        g.node("x", thing)
    assert g.nodes() == []


def test_node_refuses_a_non_node_even_without_an_explicit_id() -> None:
    g = soma.Graph()
    with pytest.raises(TypeError):
        g.node(object())
    assert len(g) == 0


# ---------------------------------------------------------------------------------------------
# Auto ids


@pytest.mark.parametrize(
    ("cls", "expected"),
    [(Encoder, "encoder"), (Other2, "other2"), (HTTPServer, "http_server")],
)
def test_an_auto_id_is_the_snake_case_of_the_class_name(cls: type, expected: str) -> None:
    assert soma.Graph().node(cls()) == expected


def test_a_taken_auto_id_gets_a_numbered_suffix() -> None:
    g = soma.Graph()
    assert [g.node(Encoder()) for _ in range(3)] == ["encoder", "encoder_2", "encoder_3"]


def test_an_auto_id_skips_a_suffix_taken_explicitly() -> None:
    g = soma.Graph()
    g.node("encoder", Encoder())
    g.node("encoder_2", Encoder())
    assert g.node(Encoder()) == "encoder_3"


# ---------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("bad", ["", "has space", "tab\there", "new\nline"])
def test_an_invalid_id_is_refused_with_invalid_id_error(bad: str) -> None:
    g = soma.Graph()
    with pytest.raises(soma.InvalidIdError):
        g.node(bad, Pass())
    assert g.nodes() == []


def test_a_duplicate_node_is_refused_naming_the_id() -> None:
    g = build(["a"], [])
    with pytest.raises(soma.DuplicateNodeError) as excinfo:
        g.node("a", Pass())
    assert excinfo.value.node == "a"


def test_a_refused_node_changes_nothing() -> None:
    g = soma.Graph()
    first = Pass()
    g.node("a", first)
    g.node("b", Pass())
    g.edge("a", "b")
    before = (g.nodes(), g.edges(), repr(g.plan()))
    with pytest.raises(soma.DuplicateNodeError):
        g.node("a", Double())
    assert (g.nodes(), g.edges(), repr(g.plan())) == before
    assert g.implementation("a") is first


def test_an_edge_to_an_unknown_node_is_refused_naming_it() -> None:
    g = build(["a"], [])
    with pytest.raises(soma.UnknownNodeError) as excinfo:
        g.edge("a", "ghost")
    assert excinfo.value.node == "ghost"


def test_an_edge_from_an_unknown_node_is_refused_naming_it() -> None:
    g = build(["a"], [])
    with pytest.raises(soma.UnknownNodeError) as excinfo:
        g.edge("ghost", "a")
    assert excinfo.value.node == "ghost"


def test_a_duplicate_edge_is_refused() -> None:
    g = build(["a", "b"], [("a", "b")])
    with pytest.raises(soma.DuplicateEdgeError):
        g.edge("a", "b")
    assert g.edges() == [("a", "b")]


def test_an_edge_closing_a_cycle_is_refused_with_the_cycle_as_path() -> None:
    g = build(["a", "b", "c"], [("a", "b"), ("b", "c")])
    with pytest.raises(soma.CycleError) as excinfo:
        g.edge("c", "a")
    assert excinfo.value.path == ["c", "a", "b", "c"]


def test_a_cycle_error_message_names_the_ids_in_backticks() -> None:
    g = build(["a", "b", "c"], [("a", "b"), ("b", "c")])
    with pytest.raises(soma.CycleError) as excinfo:
        g.edge("c", "a")
    message = str(excinfo.value)
    for node in ("`a`", "`b`", "`c`"):
        assert node in message


def test_a_self_loop_is_a_cycle_of_one_node() -> None:
    g = build(["a"], [])
    with pytest.raises(soma.CycleError) as excinfo:
        g.edge("a", "a")
    assert excinfo.value.path == ["a", "a"]


def test_a_refused_edge_changes_nothing() -> None:
    g = build(["a", "b", "c"], [("a", "b"), ("b", "c")])
    before = (g.nodes(), g.edges(), g.successors("c"), g.predecessors("a"), repr(g.plan()))
    with pytest.raises(soma.CycleError):
        g.edge("c", "a")
    after = (g.nodes(), g.edges(), g.successors("c"), g.predecessors("a"), repr(g.plan()))
    assert after == before
    assert g.forward(7) == 7


@pytest.mark.parametrize("query", ["predecessors", "successors"])
def test_a_neighbour_query_about_an_unknown_node_is_refused_naming_it(query: str) -> None:
    g = build(["a"], [])
    with pytest.raises(soma.UnknownNodeError) as excinfo:
        getattr(g, query)("ghost")
    assert excinfo.value.node == "ghost"


ERROR_BASES: list[tuple[type, tuple[type, ...]]] = [
    (soma.SomaError, (Exception,)),
    (soma.GraphError, (soma.SomaError, ValueError)),
    (soma.CycleError, (soma.GraphError,)),
    (soma.DuplicateNodeError, (soma.GraphError,)),
    (soma.UnknownNodeError, (soma.GraphError,)),
    (soma.DuplicateEdgeError, (soma.GraphError,)),
    (soma.InvalidIdError, (soma.GraphError,)),
    (soma.CompileError, (soma.SomaError,)),
    (soma.RunError, (soma.SomaError,)),
    (soma.TurnLimitError, (soma.RunError,)),
    (soma.DriverError, (soma.RunError,)),
    (soma.PanicError, (soma.SomaError,)),
    (soma.NodePicklingError, (soma.SomaError, pickle.PicklingError)),
]


@pytest.mark.parametrize(("error", "bases"), ERROR_BASES, ids=[e.__name__ for e, _ in ERROR_BASES])
def test_each_error_derives_from_its_documented_bases(error: type, bases: tuple[type, ...]) -> None:
    for base in bases:
        assert issubclass(error, base)


def test_a_graph_error_can_be_caught_as_value_error() -> None:
    g = build(["a"], [])
    with pytest.raises(ValueError, match="`a`"):
        g.node("a", Pass())


# ---------------------------------------------------------------------------------------------
# Plans as objects


def test_plan_returns_a_plan() -> None:
    assert isinstance(build(["a"], []).plan(), soma.Plan)


def test_the_empty_graphs_plan_is_empty() -> None:
    plan = soma.Graph().plan()
    assert plan.kind == "Empty"
    assert plan.children == []
    assert plan.node is None
    assert repr(plan) == "Empty"


def test_a_single_nodes_plan_executes_it_on_the_graph_input() -> None:
    plan = build(["a"], []).plan()
    assert plan.kind == "Execute"
    assert plan.node == "a"
    assert plan.inputs == []
    assert plan.children == []


def test_a_plan_exposes_kind_children_node_and_inputs() -> None:
    g = build(["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("c", "d"), ("b", "d")])
    plan = g.plan()
    assert plan.kind == "Sequence"
    assert plan.node is None
    assert [child.kind for child in plan.children] == ["Execute", "Wave", "Execute"]
    first, wave, join = plan.children
    assert (first.node, first.inputs) == ("a", [])
    assert [(b.node, b.inputs) for b in wave.children] == [("b", ["a"]), ("c", ["a"])]
    assert (join.node, join.inputs) == ("d", ["c", "b"])


def test_a_plans_repr_spells_the_tree_with_ids() -> None:
    g = build(["add", "double"], [("add", "double")])
    assert repr(g.plan()) == "Sequence([Execute(add), Execute(double)])"


def test_a_plans_shape_is_the_tree_without_ids() -> None:
    g = build(["add", "double"], [("add", "double")])
    assert g.plan().shape() == "Sequence([Execute, Execute])"


def test_plans_compare_by_structure() -> None:
    one = build(["a", "b"], [("a", "b")]).plan()
    same = build(["a", "b"], [("a", "b")], factory=Double).plan()
    other = build(["a", "b"], []).plan()
    assert one == same
    assert one != other


def test_a_graph_change_is_reflected_in_the_next_plan() -> None:
    g = build(["a"], [])
    assert repr(g.plan()) == "Execute(a)"
    g.node("b", Pass())
    assert repr(g.plan()) == "Wave([Execute(a), Execute(b)])"
    g.edge("a", "b")
    assert repr(g.plan()) == "Sequence([Execute(a), Execute(b)])"


def test_a_graph_change_is_reflected_in_the_next_forward() -> None:
    g = soma.Graph()
    g.node("inc", Add(1))
    assert g.forward(1) == 2
    g.node("double", Double())
    g.edge("inc", "double")
    assert g.forward(1) == 4


@pytest.mark.parametrize(
    "lookup",
    [
        lambda g: g.place("ghost", "cpu"),
        lambda g: g.place_at("ghost", "gpu-box"),
        lambda g: g.implementation("ghost"),
        lambda g: g.predecessors("ghost"),
        lambda g: g.successors("ghost"),
    ],
    ids=["place", "place_at", "implementation", "predecessors", "successors"],
)
def test_a_lookup_of_an_unknown_id_lists_the_ids_there_are(
    lookup: Callable[[soma.Graph], object],
) -> None:
    g = build(["a", "b"], [("a", "b")])
    with pytest.raises(soma.UnknownNodeError) as refused:
        lookup(g)
    assert refused.value.node == "ghost"
    assert str(refused.value) == (
        "no node `ghost` in the graph\n"
        "hint: name a node by the id `node()` returned; the graph has `a`, `b`"
    )
