"""Nodes that ask the driver: Await, resume, the turn limit, and driver failures."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
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


# ---------------------------------------------------------------------------------------------
# An exception that asks the program to stop, raised by a driver


class Raises:
    """A driver that raises `error` instead of answering."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def perform(self, requests: list[Any]) -> list[Any]:
        raise self.error


class Stop(BaseException):
    """A `BaseException` of the user's own, not an `Exception`."""


STOPPING = [
    pytest.param(KeyboardInterrupt, id="KeyboardInterrupt"),
    pytest.param(SystemExit, id="SystemExit"),
    pytest.param(GeneratorExit, id="GeneratorExit"),
    pytest.param(Stop, id="own-BaseException"),
]


@pytest.mark.parametrize("kind", STOPPING)
def test_a_base_exception_from_a_driver_comes_out_of_forward_as_itself(
    kind: type[BaseException],
) -> None:
    driver = Raises(kind("stop"))
    with pytest.raises(kind) as excinfo:
        one(AskTwice(), "asker").forward(1, driver=driver)
    assert excinfo.value is driver.error
    assert excinfo.value.__notes__ == ["raised in the driver serving soma node `asker`"]


@pytest.mark.parametrize("kind", STOPPING)
def test_except_exception_never_swallows_a_base_exception_from_a_driver(
    kind: type[BaseException],
) -> None:
    driver = Raises(kind("stop"))
    caught: list[BaseException] = []

    def run_as_a_caller_would() -> None:
        try:
            one(AskTwice()).forward(1, driver=driver)
        except Exception as error:  # The handler a caller writes for ordinary failures.
            caught.append(error)

    with pytest.raises(kind):
        run_as_a_caller_would()
    assert caught == []


def test_a_base_exception_from_a_driver_in_a_wave_branch_comes_out_as_itself() -> None:
    driver = Raises(KeyboardInterrupt("stop"))
    g = soma.Graph.somatize(Add(1) >> (Add(2).named("quick") | AskTwice().named("asker")))
    with pytest.raises(KeyboardInterrupt) as excinfo:
        g.forward(1, driver=driver)
    assert excinfo.value is driver.error


def test_an_ordinary_exception_from_a_driver_stays_wrapped_in_driver_error() -> None:
    driver = Raises(LookupError("no such key"))
    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice(), "asker").forward(1, driver=driver)
    assert excinfo.value.__cause__ is driver.error
    assert excinfo.value.node == "asker"


def test_a_graph_runs_again_after_a_base_exception_from_a_driver() -> None:
    g = one(AskTwice())
    with pytest.raises(KeyboardInterrupt):
        g.forward(1, driver=Raises(KeyboardInterrupt()))
    assert g.forward(1, driver=Answer()) == 1 + 2


# ---------------------------------------------------------------------------------------------
# A driver's answer: a list or a tuple, one result per request


class Returns:
    """A driver whose `perform` returns `make()`, whatever it is."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def perform(self, requests: list[Any]) -> Any:
        return self.make()


class Pulled:
    """An endless iterator that counts the items taken from it."""

    def __init__(self) -> None:
        self.taken = 0

    def __iter__(self) -> Pulled:
        return self

    def __next__(self) -> int:
        self.taken += 1
        return self.taken


@pytest.mark.parametrize(
    ("answer", "returned"),
    [
        pytest.param(lambda: "ab", "str", id="str"),
        pytest.param(lambda: b"ab", "bytes", id="bytes"),
        pytest.param(lambda: {"a": 1, "b": 2}, "dict", id="dict"),
        pytest.param(lambda: {1, 2}, "set", id="set"),
        pytest.param(lambda: range(2), "range", id="range"),
        pytest.param(lambda: iter([1, 2]), "list_iterator", id="iterator"),
        pytest.param(lambda: (r for r in [1, 2]), "generator", id="generator"),
        pytest.param(lambda: None, "NoneType", id="None"),
    ],
)
def test_a_driver_answer_that_is_not_a_list_or_tuple_is_refused_with_type_error(
    answer: Callable[[], Any], returned: str
) -> None:
    # Every answer here would give AskTwice's two results if it were read as an iterable.
    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice(), "asker").forward(1, driver=Returns(answer))
    assert excinfo.value.node == "asker"
    cause = excinfo.value.__cause__
    assert isinstance(cause, TypeError)
    assert str(cause).startswith(f"`Returns.perform` returned a `{returned}`, not a list")
    assert "\nhint: " in str(cause)


def test_an_endless_iterator_from_a_driver_is_refused_at_once_unread() -> None:
    endless = Pulled()
    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice()).forward(1, driver=Returns(lambda: endless))
    assert isinstance(excinfo.value.__cause__, TypeError)
    assert endless.taken == 0


def test_an_endless_generator_from_a_driver_is_refused_at_once() -> None:
    def forever() -> Iterator[int]:
        yield from itertools.count()

    with pytest.raises(soma.DriverError) as excinfo:
        one(AskTwice()).forward(1, driver=Returns(forever))
    assert isinstance(excinfo.value.__cause__, TypeError)


class Results(list[Any]):
    """A list subclass whose own iteration must not be used."""

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("the engine reads a list by index, not through __iter__")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda: [10, 20], id="list"),
        pytest.param(lambda: (10, 20), id="tuple"),
        pytest.param(lambda: Results([10, 20]), id="list-subclass"),
    ],
)
def test_a_driver_may_answer_with_a_list_a_tuple_or_a_subclass_of_either(
    answer: Callable[[], Any],
) -> None:
    assert one(AskTwice()).forward(1, driver=Returns(answer)) == 10 + 20


def test_a_driver_answering_a_tuple_of_the_wrong_length_gives_the_wrong_count_error() -> None:
    with pytest.raises(soma.DriverError, match=r"answered 3 result\(s\) to the 2 request"):
        one(AskTwice()).forward(1, driver=Returns(lambda: (1, 2, 3)))


# ---------------------------------------------------------------------------------------------
# A turn limit of 0


def test_a_turn_limit_of_0_calls_no_node_and_names_none() -> None:
    forever = Forever()
    with pytest.raises(soma.TurnLimitError) as excinfo:
        one(forever, "stuck").forward(1, driver=Answer(), turn_limit=0)
    assert forever.calls == 0
    assert excinfo.value.limit == 0
    assert excinfo.value.node is None
    assert str(excinfo.value).startswith("a turn limit of 0 lets no node run")
    assert "`stuck`" not in str(excinfo.value)


def test_a_turn_limit_of_0_refuses_even_a_node_that_never_awaits() -> None:
    g = soma.Graph.somatize(Add(1) >> Double())
    with pytest.raises(soma.TurnLimitError, match="a turn limit of 0 lets no node run") as excinfo:
        g.forward(1, turn_limit=0)
    assert excinfo.value.limit == 0


def test_a_positive_turn_limit_error_names_the_node_that_awaited() -> None:
    g = soma.Graph.somatize(Add(1).named("first") >> Forever().named("stuck"))
    with pytest.raises(soma.TurnLimitError) as excinfo:
        g.forward(1, driver=Answer(), turn_limit=1)
    assert excinfo.value.node == "stuck"
    assert excinfo.value.limit == 1
    assert "node `stuck` was still awaiting after 1 turns" in str(excinfo.value)
