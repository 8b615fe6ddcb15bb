"""CU9's Python questionnaire, the plans: what a wave groups.

Series, fan-outs, fan-ins, branches of unequal length, nested waves and the "N" that is not
series-parallel; the same plan from the DSL as from ``node()`` and ``edge()``.
"""

from __future__ import annotations

from typing import Any

import soma
from conftest import Log, Record, build, executed, named, series


def plan_of(expression: Any) -> str:
    return repr(soma.Graph.somatize(expression).plan())


# ---------------------------------------------------------------------------------------------
# Decomposition: what a wave groups


def test_the_empty_graph_plans_as_empty() -> None:
    assert repr(soma.Graph().plan()) == "Empty"


def test_one_node_plans_as_one_execute() -> None:
    (a,) = named("a")
    assert plan_of(a) == "Execute(a)"


def test_a_linear_chain_plans_as_one_flat_sequence_with_no_wave() -> None:
    assert plan_of(series(*named("a b c d"))) == (
        "Sequence([Execute(a), Execute(b), Execute(c), Execute(d)])"
    )


def test_a_fan_out_plans_as_a_wave_after_its_source() -> None:
    a, b, c = named("a b c")
    assert plan_of(a >> (b | c)) == "Sequence([Execute(a), Wave([Execute(b), Execute(c)])])"


def test_a_fan_in_plans_as_a_wave_before_its_join() -> None:
    a, b, c = named("a b c")
    assert plan_of((a | b) >> c) == "Sequence([Wave([Execute(a), Execute(b)]), Execute(c)])"


def test_a_diamond_plans_as_a_wave_between_source_and_join() -> None:
    a, b, c, d = named("a b c d")
    assert plan_of(a >> (b | c) >> d) == (
        "Sequence([Execute(a), Wave([Execute(b), Execute(c)]), Execute(d)])"
    )


class Source(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class Encoder(soma.Node):
    def forward(self, x: Any) -> Any:
        return x + 1


class Bottleneck(soma.Node):
    def forward(self, x: Any) -> Any:
        return x * 10


class Other(soma.Node):
    def forward(self, x: Any) -> Any:
        return x - 1


class Other2(soma.Node):
    def forward(self, x: Any) -> Any:
        return x * 100


class Join(soma.Node):
    def forward(self, x: dict[str, Any]) -> Any:
        return x


def seed_expression() -> Any:
    return Source() >> ((Encoder() >> Bottleneck()) | (Other() >> Other2())) >> Join()


def test_the_seed_shape_plans_as_a_wave_of_two_sequences() -> None:
    plan = soma.Graph.somatize(seed_expression()).plan()
    assert plan.shape() == (
        "Sequence([Execute, Wave([Sequence([Execute, Execute]), Sequence([Execute, Execute])]), "
        "Execute])"
    )
    assert repr(plan) == (
        "Sequence([Execute(source), Wave([Sequence([Execute(encoder), Execute(bottleneck)]), "
        "Sequence([Execute(other), Execute(other2)])]), Execute(join)])"
    )


def test_the_seed_shape_runs_both_branches_into_the_join() -> None:
    out = soma.Graph.somatize(seed_expression()).forward(5)
    assert out == {"bottleneck": (5 + 1) * 10, "other2": (5 - 1) * 100}
    assert list(out) == ["bottleneck", "other2"]


def test_branches_of_unequal_length_are_one_wave_not_lockstep() -> None:
    a, b, b2, b3, c, c2, d = named("a b b2 b3 c c2 d")
    assert plan_of(a >> ((b >> b2 >> b3) | (c >> c2)) >> d) == (
        "Sequence([Execute(a), Wave([Sequence([Execute(b), Execute(b2), Execute(b3)]), "
        "Sequence([Execute(c), Execute(c2)])]), Execute(d)])"
    )


def test_the_barrier_counterexample_does_not_split_the_branch() -> None:
    a, a2, b, c, d = named("a a2 b c d")
    assert plan_of(((a >> a2) | b) >> (c | d)) == (
        "Sequence([Wave([Sequence([Execute(a), Execute(a2)]), Execute(b)]), "
        "Wave([Execute(c), Execute(d)])])"
    )


def test_parallel_into_parallel_is_two_waves_not_one_of_four() -> None:
    a, b, c, d = named("a b c d")
    assert plan_of((a | b) >> (c | d)) == (
        "Sequence([Wave([Execute(a), Execute(b)]), Wave([Execute(c), Execute(d)])])"
    )


def test_a_wave_nests_inside_another_waves_branch() -> None:
    a, b, c, d, e, f, g = named("a b c d e f g")
    assert plan_of(a >> ((b >> (c | d) >> e) | f) >> g) == (
        "Sequence([Execute(a), Wave([Sequence([Execute(b), Wave([Execute(c), Execute(d)]), "
        "Execute(e)]), Execute(f)]), Execute(g)])"
    )


def test_two_unrelated_long_chains_are_two_branches() -> None:
    left = series(*named("l1 l2 l3 l4 l5"))
    right = series(*named("r1 r2 r3 r4"))
    plan = soma.Graph.somatize(left | right).plan()
    assert plan.kind == "Wave"
    assert [executed(branch) for branch in plan.children] == [
        ["l1", "l2", "l3", "l4", "l5"],
        ["r1", "r2", "r3", "r4"],
    ]


def test_a_wave_lists_its_branches_in_declaration_order() -> None:
    z, a, m = named("z a m")
    assert plan_of(z | a | m) == "Wave([Execute(z), Execute(a), Execute(m)])"


N_NODES = ["a", "b", "c", "d"]
N_EDGES = [("a", "c"), ("a", "d"), ("b", "d")]


def test_the_n_is_walked_in_sequence() -> None:
    g = build(N_NODES, N_EDGES)
    assert repr(g.plan()) == "Sequence([Execute(a), Execute(b), Execute(c), Execute(d)])"


def test_the_n_does_not_spoil_the_parallelism_beside_it() -> None:
    g = build([*N_NODES, "x", "y"], [*N_EDGES, ("x", "y")])
    assert repr(g.plan()) == (
        "Wave([Sequence([Execute(a), Execute(b), Execute(c), Execute(d)]), "
        "Sequence([Execute(x), Execute(y)])])"
    )


def test_the_n_does_not_spoil_the_parallelism_after_it() -> None:
    nodes = [*N_NODES, "e", "f", "g"]
    edges = [*N_EDGES, ("c", "e"), ("d", "e"), ("e", "f"), ("e", "g")]
    assert repr(build(nodes, edges).plan()) == (
        "Sequence([Execute(a), Execute(b), Execute(c), Execute(d), Execute(e), "
        "Wave([Execute(f), Execute(g)])])"
    )


def test_the_n_runs_with_each_node_reading_its_own_predecessors() -> None:
    log = Log()
    g = build(N_NODES, N_EDGES, factory=lambda: Record(log, lambda x: 1 if x is None else x))
    out = g.forward(None)
    assert out == {"c": 1, "d": {"a": 1, "b": 1}}
    assert log.inputs("d") == [{"a": 1, "b": 1}]


def test_the_dsl_with_branches_gives_the_same_plan_as_node_and_edge() -> None:
    from_dsl = soma.Graph.somatize(seed_expression())
    nodes = ["source", "encoder", "bottleneck", "other", "other2", "join"]
    edges = [
        ("source", "encoder"),
        ("encoder", "bottleneck"),
        ("source", "other"),
        ("other", "other2"),
        ("bottleneck", "join"),
        ("other2", "join"),
    ]
    by_hand = build(nodes, edges)
    assert from_dsl.plan() == by_hand.plan()
    assert repr(from_dsl.plan()) == repr(by_hand.plan())


def test_the_barrier_counterexample_gives_the_same_plan_from_node_and_edge() -> None:
    a, a2, b, c, d = named("a a2 b c d")
    from_dsl = soma.Graph.somatize(((a >> a2) | b) >> (c | d))
    edges = [("a", "a2"), ("a2", "c"), ("a2", "d"), ("b", "c"), ("b", "d")]
    assert build(["a", "a2", "b", "c", "d"], edges).plan() == from_dsl.plan()
