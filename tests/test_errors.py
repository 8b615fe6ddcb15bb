"""An exception raised in a node comes out of `forward` as itself: same type, same object, same
traceback, plus one PEP 678 note naming the node."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

import soma
from conftest import Add, Answer, Double, Pass, Raise, build


class Refused(Exception):
    """An exception type of the test's own, unknown to Soma."""


class Fails(soma.Node):
    """Raises a fresh `Refused` from its own frame, keeping it to compare identity."""

    def __init__(self) -> None:
        self.raised: list[BaseException] = []

    def forward(self, x: Any) -> Any:
        error = Refused(f"refused {x!r}")
        self.raised.append(error)
        raise error


class FailsAfterAwait(soma.Node):
    def __init__(self) -> None:
        self.raised = Refused("after the driver answered")

    def forward(self, x: Any, ctx: Any) -> Any:
        if ctx.turn == 0:
            return soma.Await(["q"])
        raise self.raised


def notes(error: BaseException) -> list[str]:
    return list(getattr(error, "__notes__", []))


def test_an_exception_from_a_node_keeps_its_own_type() -> None:
    g = soma.Graph.somatize(Add(1) >> Fails())
    with pytest.raises(Refused, match="refused 2"):
        g.forward(1)


def test_an_exception_from_a_node_is_the_very_object_it_raised() -> None:
    fails = Fails()
    g = soma.Graph.somatize(Add(1) >> fails >> Double())
    with pytest.raises(Refused) as excinfo:
        g.forward(1)
    assert excinfo.value is fails.raised[0]


@pytest.mark.parametrize(
    "exc",
    [ValueError("v"), KeyError("k"), ZeroDivisionError("z"), StopIteration(), RecursionError()],
    ids=lambda e: type(e).__name__,
)
def test_a_builtin_exception_from_a_node_comes_out_unwrapped(exc: BaseException) -> None:
    g = soma.Graph()
    g.node("n", Raise(exc))
    with pytest.raises(type(exc)) as excinfo:
        g.forward(None)
    assert excinfo.value is exc
    assert not isinstance(excinfo.value, soma.SomaError)


def test_an_exception_from_a_node_keeps_the_nodes_own_frame_in_its_traceback() -> None:
    g = soma.Graph()
    g.node("n", Fails())
    with pytest.raises(Refused) as excinfo:
        g.forward(None)
    frames = traceback.extract_tb(excinfo.value.__traceback__)
    raising = [f for f in frames if f.name == "forward" and f.filename == __file__]
    assert raising, [(f.filename, f.name) for f in frames]
    assert raising[-1].line == "raise error"


def test_an_exception_from_a_node_keeps_its_cause() -> None:
    class Chained(soma.Node):
        def forward(self, x: Any) -> Any:
            try:
                return {}[x]
            except KeyError as missing:
                raise Refused("no such key") from missing

    g = soma.Graph()
    g.node("n", Chained())
    with pytest.raises(Refused) as excinfo:
        g.forward("k")
    assert isinstance(excinfo.value.__cause__, KeyError)


def test_an_exception_from_a_node_has_a_note_naming_the_node_in_backticks() -> None:
    g = soma.Graph()
    g.node("validator", Fails())
    with pytest.raises(Refused) as excinfo:
        g.forward(None)
    assert any("`validator`" in note for note in notes(excinfo.value)), notes(excinfo.value)


def test_the_note_names_the_failing_node_and_no_other() -> None:
    g = soma.Graph.somatize(
        Pass().named("before") >> Fails().named("culprit") >> Pass().named("after")
    )
    with pytest.raises(Refused) as excinfo:
        g.forward(None)
    text = "\n".join(notes(excinfo.value))
    assert "`culprit`" in text
    assert "`before`" not in text
    assert "`after`" not in text


def test_a_node_error_gets_exactly_one_note_per_run() -> None:
    g = soma.Graph()
    g.node("n", Fails())
    with pytest.raises(Refused) as excinfo:
        g.forward(None)
    assert len([n for n in notes(excinfo.value) if "`n`" in n]) == 1


def test_the_note_is_shown_when_the_exception_is_printed() -> None:
    g = soma.Graph()
    g.node("printed_node", Fails())
    with pytest.raises(Refused) as excinfo:
        g.forward(None)
    shown = "".join(traceback.format_exception(excinfo.value))
    assert "`printed_node`" in shown


def test_an_exception_after_an_await_also_comes_out_as_itself_with_the_note() -> None:
    node = FailsAfterAwait()
    g = soma.Graph()
    g.node("asker", node)
    with pytest.raises(Refused) as excinfo:
        g.forward(None, driver=Answer())
    assert excinfo.value is node.raised
    assert any("`asker`" in note for note in notes(excinfo.value))


def test_an_exception_from_a_node_in_a_wave_branch_comes_out_as_itself() -> None:
    fails = Fails()
    g = soma.Graph.somatize(Pass() >> ((Pass() >> Pass()) | (Pass() >> fails.named("deep"))))
    with pytest.raises(Refused) as excinfo:
        g.forward(None)
    assert excinfo.value is fails.raised[0]
    assert any("`deep`" in note for note in notes(excinfo.value))


def test_a_node_after_the_failing_one_does_not_run() -> None:
    ran: list[Any] = []

    class Witness(soma.Node):
        def forward(self, x: Any) -> Any:
            ran.append(x)
            return x

    g = soma.Graph.somatize(Fails() >> Witness())
    with pytest.raises(Refused):
        g.forward(None)
    assert ran == []


def test_a_graph_runs_again_after_a_node_error() -> None:
    calls = {"n": 0}

    class FailsOnce(soma.Node):
        def forward(self, x: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise Refused("first time")
            return x * 2

    g = soma.Graph.somatize(Add(1) >> FailsOnce())
    with pytest.raises(Refused):
        g.forward(1)
    assert g.forward(1) == 4


def test_a_rust_panic_raises_panic_error_with_its_message() -> None:
    g = soma.Graph()
    g.node("bomb", soma.native.Panic("kaboom"))
    with pytest.raises(soma.PanicError, match="kaboom"):
        g.forward(1)


def test_the_process_survives_a_rust_panic_and_runs_on() -> None:
    g = soma.Graph.somatize(Add(1) >> soma.native.Panic("kaboom"))
    with pytest.raises(soma.PanicError):
        g.forward(1)
    with pytest.raises(soma.PanicError):
        g.forward(1)
    assert build(["a"], [], factory=Double).forward(21) == 42
