"""Nodes that ask the driver: Await, resume, the turn limit, and driver failures."""

from __future__ import annotations

from typing import Any

import pytest

import soma
from conftest import Add, Answer, Double


class AskTwice(soma.Node):
    """Asks for `x` and `x + 1`; done with the sum of the answers."""

    def forward(self, x: Any, ctx: Any) -> Any:
        if ctx.turn == 0:
            return soma.Await([x, x + 1])
        return sum(ctx.results)


class Diary(soma.Node):
    """Awaits `rounds` times, asking for `(turn, 'a')` and `(turn, 'b')`; writes down every call."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.seen: list[tuple[str, int, list[Any]]] = []

    def forward(self, x: Any, ctx: Any) -> Any:
        self.seen.append((ctx.node, ctx.turn, list(ctx.results)))
        if ctx.turn < self.rounds:
            return soma.Await([(ctx.turn, "a"), (ctx.turn, "b")])
        return soma.Done("finished")


class Forever(soma.Node):
    """Never done; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, x: Any, ctx: Any) -> Any:
        self.calls += 1
        return soma.Await([ctx.turn])


class Cached(soma.Node):
    """Answers at once what it knows; asks the driver for the rest."""

    def __init__(self, known: dict[Any, Any]) -> None:
        self.known = known

    def forward(self, x: Any, ctx: Any) -> Any:
        if x in self.known:
            return self.known[x]
        if ctx.turn == 0:
            return soma.Await([x])
        return ctx.results[0]


def one(node: soma.Node, name: str = "n") -> soma.Graph:
    g = soma.Graph()
    g.node(name, node)
    return g


# ---------------------------------------------------------------------------------------------
# Await and resume


def test_a_node_that_awaits_is_resumed_with_the_drivers_answers() -> None:
    driver = Answer(lambda r: r * 10)
    assert one(AskTwice()).forward(3, driver=driver) == 30 + 40
    assert driver.asked == [[3, 4]]


def test_a_driver_need_not_subclass_anything() -> None:
    class Plain:
        def perform(self, requests: list[Any]) -> list[Any]:
            return [r * 2 for r in requests]

    assert one(AskTwice()).forward(1, driver=Plain()) == 2 + 4


def test_turn_zero_has_no_results() -> None:
    diary = Diary(rounds=0)
    one(diary).forward(None)
    assert diary.seen == [("n", 0, [])]


def test_each_turn_gets_the_answers_to_the_previous_await() -> None:
    diary = Diary(rounds=3)
    out = one(diary).forward(None, driver=Answer(lambda r: f"{r[0]}{r[1]}"))
    assert out == "finished"
    assert diary.seen == [
        ("n", 0, []),
        ("n", 1, ["0a", "0b"]),
        ("n", 2, ["1a", "1b"]),
        ("n", 3, ["2a", "2b"]),
    ]


def test_ctx_node_is_the_id_of_the_node_being_called() -> None:
    diary = Diary(rounds=1)
    one(diary, "the_asker").forward(None, driver=Answer())
    assert {node for node, _, _ in diary.seen} == {"the_asker"}


def test_the_driver_receives_the_request_objects_themselves() -> None:
    token = object()

    class AskFor(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return soma.Await([token]) if ctx.turn == 0 else None

    driver = Answer()
    one(AskFor()).forward(None, driver=driver)
    assert driver.asked[0][0] is token


def test_a_drivers_answer_reaches_the_node_as_the_same_object() -> None:
    answer = object()

    class Ask(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return soma.Await(["q"]) if ctx.turn == 0 else ctx.results[0]

    assert one(Ask()).forward(None, driver=Answer(lambda _: answer)) is answer


def test_done_wraps_a_nodes_output_explicitly() -> None:
    payload = object()

    class Explicit(soma.Node):
        def forward(self, x: Any) -> Any:
            return soma.Done(payload)

    assert one(Explicit()).forward(None) is payload


def test_an_awaiting_node_feeds_its_answer_to_the_next_node() -> None:
    g = soma.Graph.somatize(Add(1) >> AskTwice() >> Double())
    assert g.forward(1, driver=Answer()) == (2 + 3) * 2


def test_a_node_answers_at_once_on_some_inputs_and_awaits_on_others() -> None:
    g = one(Cached({"known": "from cache"}))
    driver = Answer(lambda r: f"driver says {r}")
    assert g.forward("known", driver=driver) == "from cache"
    assert driver.asked == []
    assert g.forward("other", driver=driver) == "driver says other"
    assert driver.asked == [["other"]]


def test_a_node_that_answers_at_once_needs_no_driver() -> None:
    assert one(Cached({1: "one"})).forward(1) == "one"


# ---------------------------------------------------------------------------------------------
# The turn limit


def test_a_node_still_awaiting_at_the_turn_limit_raises_turn_limit_error() -> None:
    with pytest.raises(soma.TurnLimitError) as excinfo:
        one(Forever(), "stuck").forward(None, driver=Answer(), turn_limit=5)
    assert excinfo.value.node == "stuck"
    assert excinfo.value.limit == 5


def test_the_turn_limit_is_the_number_of_calls_a_node_gets() -> None:
    forever = Forever()
    with pytest.raises(soma.TurnLimitError):
        one(forever).forward(None, driver=Answer(), turn_limit=5)
    assert forever.calls == 5


def test_a_node_done_on_its_last_allowed_turn_succeeds() -> None:
    diary = Diary(rounds=4)
    assert one(diary).forward(None, driver=Answer(), turn_limit=5) == "finished"
    assert len(diary.seen) == 5


def test_the_default_turn_limit_is_64() -> None:
    with pytest.raises(soma.TurnLimitError) as excinfo:
        one(Forever()).forward(None, driver=Answer())
    assert excinfo.value.limit == 64


def test_a_turn_limit_error_is_a_run_error() -> None:
    with pytest.raises(soma.RunError):
        one(Forever()).forward(None, driver=Answer(), turn_limit=2)


# ---------------------------------------------------------------------------------------------
# Driver failures, each attributed to the node that asked


def test_awaiting_without_a_driver_raises_driver_error_naming_the_node() -> None:
    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice(), "asker").forward(1)
    assert excinfo.value.node == "asker"
    assert "`asker`" in str(excinfo.value)


def test_a_driver_that_raises_gives_driver_error_naming_the_node() -> None:
    class Broken:
        def perform(self, requests: list[Any]) -> list[Any]:
            raise ConnectionError("down")

    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice(), "asker").forward(1, driver=Broken())
    assert excinfo.value.node == "asker"


def test_the_drivers_own_exception_is_the_driver_errors_cause() -> None:
    class Broken:
        def __init__(self) -> None:
            self.raised = ConnectionError("down")

        def perform(self, requests: list[Any]) -> list[Any]:
            raise self.raised

    broken = Broken()
    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice()).forward(1, driver=broken)
    assert excinfo.value.__cause__ is broken.raised


def test_a_driver_answering_too_few_results_gives_driver_error_naming_the_node() -> None:
    class Short:
        def perform(self, requests: list[Any]) -> list[Any]:
            return list(requests)[:-1]

    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice(), "asker").forward(1, driver=Short())
    assert excinfo.value.node == "asker"


def test_a_driver_answering_too_many_results_gives_driver_error_naming_the_node() -> None:
    class Long:
        def perform(self, requests: list[Any]) -> list[Any]:
            return [*requests, "extra"]

    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice(), "asker").forward(1, driver=Long())
    assert excinfo.value.node == "asker"


def test_a_driver_failure_is_attributed_to_the_node_that_asked_not_its_neighbours() -> None:
    class Broken:
        def perform(self, requests: list[Any]) -> list[Any]:
            raise RuntimeError("down")

    g = soma.Graph.somatize(Add(1).named("before") >> AskTwice().named("asker") >> Double())
    with pytest.raises(soma.DriverError) as excinfo:
        g.forward(1, driver=Broken())
    assert excinfo.value.node == "asker"


def test_a_graph_runs_again_after_a_driver_failure() -> None:
    g = one(AskTwice())
    with pytest.raises(soma.DriverError):
        g.forward(1)
    assert g.forward(1, driver=Answer()) == 1 + 2
