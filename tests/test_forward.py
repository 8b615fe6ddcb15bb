"""Running a graph: what each node reads, what a run returns, and values crossing the engine."""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pytest

import soma
from conftest import Add, Const, Double, Fn, Log, Pass, Record, SumValues, build, named, series

# ---------------------------------------------------------------------------------------------
# Shapes


def test_a_chain_applies_its_nodes_in_order() -> None:
    g = soma.Graph.somatize(Add(1) >> Double() >> Add(10))
    assert g.forward(3) == (3 + 1) * 2 + 10


def test_a_single_node_graph_returns_that_nodes_output() -> None:
    g = soma.Graph.somatize(Double())
    assert g.forward(21) == 42


def test_a_fan_out_returns_a_dict_keyed_by_leaf_id() -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> (Double().named("b") | Add(100).named("c")))
    out = g.forward(1)
    assert type(out) is dict
    assert out == {"b": 4, "c": 102}


def test_a_fan_in_node_reads_a_dict_keyed_by_source_id() -> None:
    log = Log()
    g = soma.Graph()
    g.node("a", Const(1))
    g.node("b", Const(2))
    g.node("j", Record(log))
    g.edge("a", "j")
    g.edge("b", "j")
    g.forward(None)
    (seen,) = log.inputs("j")
    assert type(seen) is dict
    assert seen == {"a": 1, "b": 2}


def test_a_fan_in_dict_is_ordered_by_edge_declaration_not_insertion() -> None:
    log = Log()
    g = soma.Graph()
    for name, value in [("a", 1), ("b", 2), ("c", 3)]:
        g.node(name, Const(value))
    g.node("j", Record(log))
    for src in ("c", "a", "b"):
        g.edge(src, "j")
    g.forward(None)
    (seen,) = log.inputs("j")
    assert list(seen) == ["c", "a", "b"]


def test_a_diamond_joins_both_sides_of_one_source() -> None:
    g = soma.Graph.somatize(Add(1) >> (Double() | Add(10)) >> SumValues())
    assert g.forward(1) == (1 + 1) * 2 + (1 + 1 + 10)


def test_several_leaves_return_a_dict_keyed_by_leaf_id() -> None:
    g = build(["a", "b", "c"], [("a", "b")], factory=Double)
    assert g.forward(1) == {"b": 4, "c": 2}


def test_the_empty_graph_returns_its_input_itself() -> None:
    payload = object()
    assert soma.Graph().forward(payload) is payload


def test_forward_without_input_gives_roots_none() -> None:
    log = Log()
    g = soma.Graph()
    g.node("a", Record(log))
    assert g.forward() is None
    assert log.inputs("a") == [None]


def test_every_root_receives_the_graph_input() -> None:
    log = Log()
    payload = object()
    g = soma.Graph()
    for name in ("r1", "r2", "r3"):
        g.node(name, Record(log))
    g.node("j", Pass())
    for name in ("r1", "r2", "r3"):
        g.edge(name, "j")
    g.forward(payload)
    for name in ("r1", "r2", "r3"):
        (seen,) = log.inputs(name)
        assert seen is payload


def test_a_node_runs_once_per_forward_even_with_several_readers() -> None:
    log = Log()
    g = soma.Graph.somatize(Record(log).named("src") >> (Pass().named("x") | Pass().named("y")))
    g.forward(0)
    assert log.order() == ["src"]


def test_a_graph_can_be_run_many_times() -> None:
    g = soma.Graph.somatize(Add(1) >> Double())
    assert [g.forward(i) for i in range(5)] == [2, 4, 6, 8, 10]


# ---------------------------------------------------------------------------------------------
# Values keep their type and identity between Python nodes


def test_a_python_object_passes_through_three_nodes_as_the_same_object() -> None:
    payload = object()
    g = soma.Graph.somatize(series(*named("a b c")))
    assert g.forward(payload) is payload


@pytest.mark.parametrize(
    "value",
    [7, 2**100, -1, 2.5, True, False, None, "text", b"bytes", (1, "two"), frozenset({3})],
    ids=repr,
)
def test_a_value_keeps_its_exact_type_and_value_between_python_nodes(value: Any) -> None:
    g = soma.Graph.somatize(series(*named("a b c")))
    out = g.forward(value)
    assert type(out) is type(value)
    assert out == value


def test_an_int_produced_by_a_node_reaches_the_next_as_an_int_not_a_bool() -> None:
    log = Log()
    g = soma.Graph.somatize(Const(1) >> Record(log))
    g.forward(None)
    (seen,) = log.inputs("record")
    assert type(seen) is int


def test_a_bool_produced_by_a_node_reaches_the_next_as_a_bool() -> None:
    log = Log()
    g = soma.Graph.somatize(Const(True) >> Record(log))
    g.forward(None)
    (seen,) = log.inputs("record")
    assert seen is True


def test_a_list_reaches_the_next_node_as_the_same_list() -> None:
    items = [1, 2, 3]
    log = Log()
    g = soma.Graph.somatize(Const(items) >> Record(log))
    g.forward(None)
    (seen,) = log.inputs("record")
    assert seen is items


def test_a_dict_reaches_the_next_node_as_the_same_dict() -> None:
    mapping = {"k": [1]}
    g = soma.Graph.somatize(series(*named("a b")))
    assert g.forward(mapping) is mapping


def test_a_numpy_array_passes_through_as_the_same_array() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    g = soma.Graph.somatize(series(*named("a b c")))
    assert g.forward(array) is array


def test_a_numpy_array_is_what_a_node_reads_and_returns() -> None:
    array = np.ones(4, dtype=np.int16)
    g = soma.Graph.somatize(Fn(lambda a: a * 3) >> Fn(lambda a: a.sum()))
    out = g.forward(array)
    assert out == 12
    assert isinstance(out, np.integer)


def test_fan_in_values_are_the_same_objects_the_sources_returned() -> None:
    left, right = object(), object()
    log = Log()
    g = soma.Graph.somatize((Const(left).named("l") | Const(right).named("r")) >> Record(log))
    g.forward(None)
    (seen,) = log.inputs("record")
    assert seen["l"] is left
    assert seen["r"] is right


def test_leaf_values_are_the_same_objects_the_leaves_returned() -> None:
    left, right = object(), object()
    g = soma.Graph.somatize(Const(left).named("l") | Const(right).named("r"))
    out = g.forward(None)
    assert out["l"] is left
    assert out["r"] is right


def test_a_mutation_by_one_node_is_seen_by_the_next() -> None:
    items: list[int] = []
    g = soma.Graph.somatize(Fn(lambda xs: xs.append(1) or xs) >> Fn(len))
    assert g.forward(items) == 1
    assert items == [1]


class Box:
    """An object a weak reference can follow, as a user's own class is."""


def test_what_a_node_read_last_is_let_go_by_the_time_the_next_node_runs() -> None:
    """The engine may keep the next node's output where the input it was the last to read was
    kept: the input must be let go on the way, never kept with it."""
    seen: list[Any] = []

    def third(out: Any) -> Any:
        seen.append(first_made[0]())
        return out

    first_made: list[Any] = []

    def first(x: Any) -> Box:
        made = Box()
        first_made.append(weakref.ref(made))
        return made

    g = soma.Graph.somatize(Fn(first) >> Fn(lambda box: Box()) >> Fn(third))
    assert type(g.forward(1)) is Box
    assert seen == [None]


def test_an_object_two_nodes_read_reaches_the_second_itself_after_the_first_returned_another() -> (
    None
):
    made = Box()
    g = soma.Graph.somatize(
        Fn(lambda x: made).named("a")
        >> (Fn(lambda box: Box()).named("b") | Fn(lambda box: box).named("c"))
    )
    out = g.forward(1)
    assert out["c"] is made
    assert out["b"] is not made


def test_a_node_returning_its_input_returns_the_object_itself() -> None:
    made = Box()
    g = soma.Graph.somatize(Pass() >> Pass() >> Fn(lambda box: box))
    assert g.forward(made) is made


# ---------------------------------------------------------------------------------------------
# Rust nodes


def test_a_rust_node_computes_in_a_graph() -> None:
    g = soma.Graph.somatize(soma.native.Add(5))
    out = g.forward(3)
    assert out == 8
    assert type(out) is int


def test_rust_nodes_compose_in_a_chain() -> None:
    g = soma.Graph.somatize(soma.native.Add(1) >> soma.native.Add(2) >> soma.native.Identity())
    assert g.forward(10) == 13


def test_a_rust_sum_joins_a_fan_in() -> None:
    g = soma.Graph.somatize((soma.native.Add(1) | soma.native.Add(2)) >> soma.native.Sum())
    assert g.forward(10) == 11 + 12


def test_a_rust_node_registers_with_node_and_is_its_implementation() -> None:
    inc = soma.native.Add(1)
    g = soma.Graph()
    g.node("inc", inc)
    assert g.implementation("inc") is inc
    assert g.forward(1) == 2


def test_python_and_rust_nodes_mix_in_one_chain() -> None:
    log = Log()
    g = soma.Graph.somatize(Add(1) >> soma.native.Add(10) >> Record(log) >> Double())
    assert g.forward(1) == 24
    (seen,) = log.inputs("record")
    assert type(seen) is int


@pytest.mark.parametrize(
    "value",
    [3, -7, 2.5, "text", [1, 2.5, "x"], {"k": [1, 2], "j": {"n": 1.5}}, []],
    ids=repr,
)
def test_a_native_value_comes_back_from_a_rust_node_as_the_same_python_type(value: Any) -> None:
    g = soma.Graph.somatize(soma.native.Identity())
    out = g.forward(value)
    assert type(out) is type(value)
    assert out == value


def test_a_bool_comes_back_from_a_rust_node_as_a_bool() -> None:
    g = soma.Graph.somatize(soma.native.Identity())
    assert g.forward(True) is True


def test_a_rust_fan_out_returns_a_python_dict() -> None:
    g = soma.Graph.somatize(soma.native.Add(1).named("x") | soma.native.Add(2).named("y"))
    out = g.forward(1)
    assert type(out) is dict
    assert out == {"x": 2, "y": 3}


def test_a_value_a_rust_node_cannot_read_raises_type_error_naming_the_python_type() -> None:
    g = soma.Graph()
    g.node("inc", soma.native.Add(1))
    with pytest.raises(TypeError, match="object"):
        g.forward(object())


def test_a_conversion_error_carries_a_note_naming_the_rust_node() -> None:
    g = soma.Graph()
    g.node("maker", Const(object()))
    g.node("inc", soma.native.Add(1))
    g.edge("maker", "inc")
    with pytest.raises(TypeError) as excinfo:
        g.forward(None)
    notes = getattr(excinfo.value, "__notes__", [])
    assert any("`inc`" in note for note in notes), notes


def test_a_conversion_error_names_the_python_type_and_hints_at_the_fix() -> None:
    g = soma.Graph()
    g.node("inc", soma.native.Add(1))
    with pytest.raises(TypeError) as excinfo:
        g.forward(object())
    message = str(excinfo.value)
    assert "`object`" in message
    assert "hint:" in message


def test_an_int_beyond_64_bits_is_refused_by_a_rust_node_with_type_error() -> None:
    g = soma.Graph()
    g.node("inc", soma.native.Add(1))
    with pytest.raises(TypeError, match="int"):
        g.forward(2**64)


def test_an_int_beyond_64_bits_is_fine_between_python_nodes() -> None:
    g = soma.Graph.somatize(Add(1) >> Double())
    assert g.forward(2**64) == (2**64 + 1) * 2


# ---------------------------------------------------------------------------------------------
# However `forward` is defined, a node is called as Python would call `obj.forward(x)`


class _Scaled(soma.Node):
    factor = 3

    @classmethod
    def forward(cls, x: int) -> int:  # type: ignore[override]
        return x * cls.factor


class _Shifted(soma.Node):
    @staticmethod
    def forward(x: int) -> int:  # type: ignore[override]
        return x - 1


class _Tagged(soma.Node):
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def forward(self, x: str) -> str:
        return f"{x}{self.tag}"


def test_forward_as_a_classmethod_a_staticmethod_or_an_attribute_is_called_as_python_calls_it() -> (
    None
):
    other = _Tagged("!")
    replaced = _Tagged("unused")
    replaced.forward = other.forward  # type: ignore[method-assign]  # bound to `other`
    g = soma.Graph.somatize(
        _Scaled().named("scaled") >> _Shifted().named("shifted") >> Fn(str).named("text")
    )
    assert g.forward(5) == "14"
    h = soma.Graph.somatize(_Tagged("?").named("own") >> replaced.named("theirs"))
    assert h.forward("x") == "x?!"


def test_a_method_that_raises_keeps_its_own_frame_in_the_traceback() -> None:
    class Fails(soma.Node):
        def forward(self, x: int) -> int:
            raise LookupError(f"no {x}")

    g = soma.Graph.somatize(Fails().named("fails"))
    with pytest.raises(LookupError, match="no 7") as raised:
        g.forward(7)
    assert any(entry.name == "forward" for entry in raised.traceback)
