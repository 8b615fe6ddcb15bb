"""Settings written by id on a built graph's steps and on the nodes inside them: each either
holds or is refused at the call, with an error naming the id and why (the engine's one rule,
``Decisions::refusal``), and a refused one changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

import soma
from conftest import DEADLINE, Double


def each_graph() -> soma.Graph:
    return soma.Graph.somatize(soma.each(Double()).named("items"))


SETTINGS: dict[str, Callable[[soma.Graph, str], None]] = {
    "retry": lambda g, node_id: g.retry(node_id, 2),
    "time limit": lambda g, node_id: g.time_limit(node_id, 0.5),
    "device": lambda g, node_id: g.place(node_id, "cpu"),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_retry_a_time_limit_or_a_device_on_an_each_steps_id_is_refused_naming_it(
    setting: str,
) -> None:
    g = each_graph()
    with pytest.raises(soma.GraphError, match=f"`items` is an `each` step.*a {setting} has") as e:
        SETTINGS[setting](g, "items")
    assert e.value.node == "items"  # type: ignore[attr-defined]
    assert (g.retries(), g.time_limits(), g.devices()) == ({}, {}, {})
    assert g.forward([1, 2]) == [2, 4]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_the_same_setting_on_a_node_inside_an_each_step_holds(setting: str) -> None:
    g = each_graph()
    SETTINGS[setting](g, "items/double")
    written = {"retry": g.retries(), "time limit": g.time_limits(), "device": g.devices()}
    assert list(written[setting]) == ["items/double"]
    assert g.forward([1, 2]) == [2, 4]


def test_taking_a_setting_off_an_each_steps_id_is_accepted_as_there_is_none() -> None:
    g = each_graph()
    g.retry("items", None)
    g.time_limit("items", None)
    g.place("items", None)
    assert (g.retries(), g.time_limits(), g.devices()) == ({}, {}, {})


def test_a_retry_on_a_switch_steps_id_retries_its_selector() -> None:
    calls: list[int] = []

    def flaky(x: int) -> str:
        calls.append(x)
        if len(calls) == 1:
            raise ValueError("the first call fails")
        return "double"

    g = soma.Graph.somatize(soma.switch(flaky, {"double": Double()}).named("pick"))
    g.retry("pick", 1, backoff=0.001)
    assert g.forward(3) == 6
    assert calls == [3, 3]


def test_a_time_limit_on_a_loop_steps_id_limits_its_predicate() -> None:
    release = threading.Event()

    def stuck(output: int) -> bool:
        # Held until the test ends: only the time limit lets the run go on.
        return release.wait(DEADLINE)

    g = soma.Graph.somatize(soma.loop(Double(), until=stuck, max_iterations=3).named("again"))
    g.time_limit("again", 0.05)
    try:
        with pytest.raises(soma.TimeLimitError, match="`again` ran past its time limit"):
            g.forward(1)
    finally:
        release.set()


def build_each() -> soma.Graph:
    return each_graph()


def build_switch() -> soma.Graph:
    return soma.Graph.somatize(soma.switch(lambda x: "d", {"d": Double()}).named("items"))


def build_loop() -> soma.Graph:
    loop = soma.loop(Double(), until=lambda output: True, max_iterations=2).named("items")
    return soma.Graph.somatize(loop)


@pytest.mark.parametrize(
    ("build", "kind"),
    [(build_each, "an `each`"), (build_switch, "a `switch`"), (build_loop, "a `loop`")],
)
def test_placing_a_step_on_a_host_is_refused_at_the_call(
    build: Callable[[], soma.Graph], kind: str
) -> None:
    g = build()
    with pytest.raises(soma.HostError, match=f"`items` is {kind} step, which runs in this process"):
        g.place_at("items", "gpu-box")
    assert g.hosts() == {}


def test_placing_a_node_inside_a_step_on_a_host_is_refused_at_the_call() -> None:
    g = each_graph()
    with pytest.raises(soma.HostError, match="`items/double` is in an `each` step") as e:
        g.place_at("items/double", "gpu-box")
    assert e.value.host is None  # type: ignore[attr-defined]
    assert g.hosts() == {}


def test_a_node_inside_nested_steps_names_the_innermost_steps_kind() -> None:
    inner = soma.switch(lambda x: "d", {"d": Double()}).named("pick")
    g = soma.Graph.somatize(soma.each(inner).named("items"))
    with pytest.raises(soma.HostError, match="`items/pick/d/double` is in a `switch` step"):
        g.place_at("items/pick/d/double", "gpu-box")
    with pytest.raises(soma.HostError, match="`items/pick` is a `switch` step"):
        g.place_at("items/pick", "gpu-box")


def test_an_unknown_id_is_still_an_unknown_node_error_for_a_host() -> None:
    g = each_graph()
    with pytest.raises(soma.UnknownNodeError):
        g.place_at("nowhere", "gpu-box")


def test_a_concurrency_on_a_node_inside_a_step_is_refused_naming_it_and_the_step() -> None:
    g = each_graph()
    with pytest.raises(
        soma.GraphError, match="`items/double` is inside the `each` step `items`: a stream limits"
    ) as e:
        g.concurrency("items/double", 2)
    assert e.value.node == "items/double"  # type: ignore[attr-defined]
    assert g.concurrencies() == {}
    g.concurrency("items/double", None)  # Taking off what is not there is accepted.


def test_a_concurrency_on_an_each_steps_id_lets_a_stream_run_that_many_items_at_once() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)

    def meet(x: int) -> int:
        if x < 2:
            barrier.wait()  # Items 0 and 1 each hold one: both must be in flight at once.
        return x

    g = soma.Graph.somatize(soma.each(meet).named("items"))
    g.concurrency("items", 2)
    assert g.concurrencies() == {"items": 2}
    assert list(g.map([[0], [1], [2]])) == [[0], [1], [2]]
