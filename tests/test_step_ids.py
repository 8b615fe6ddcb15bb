"""The ids of the nodes inside steps: `/` separates a step's id from the ids inside it
(``chunks/clean``, ``route/ocr/parse``) and is in no id a user gives, so a path reads back one
way; what is set on such an id reaches the node inside, however deep."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import soma
from conftest import Add, Pass


class Flaky(soma.Node):
    """Fails its first call, then adds one."""

    def __init__(self) -> None:
        self.calls = 0

    def forward(self, x: int) -> int:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("once")
        return x + 1


@pytest.mark.parametrize("bad", ["a/b", "/a", "a/", "m/a/b"])
def test_an_id_holding_a_slash_is_refused_naming_it_and_the_graph_is_unchanged(bad: str) -> None:
    g = soma.Graph.somatize(Add(1).named("a"))
    with pytest.raises(soma.GraphError, match="`/` separates a step's id") as raised:
        g.node(bad, Add(2))
    assert isinstance(raised.value, soma.InvalidIdError)
    assert raised.value.node == bad
    assert f"`{bad}`" in str(raised.value)
    assert "hint: use another character" in str(raised.value)
    assert g.nodes() == ["a"]
    assert g.forward(1) == 2


def test_a_slash_given_with_named_is_refused_where_the_node_is_registered() -> None:
    with pytest.raises(soma.InvalidIdError, match="`load/parse`") as raised:
        soma.Graph.somatize(Add(1).named("load/parse") >> Add(2))
    assert raised.value.node == "load/parse"


def test_a_step_whose_id_holds_a_slash_is_refused_and_nothing_of_it_is_kept() -> None:
    g = soma.Graph()
    with pytest.raises(soma.InvalidIdError, match="`a/b`") as raised:
        g.node("a/b", soma.each(Add(1).named("x").retry(2, backoff=0.0)))
    assert raised.value.node == "a/b"
    assert g.nodes() == []
    assert g.retries() == {}
    with pytest.raises(soma.UnknownNodeError):
        g.implementation("a/b/x")


def test_a_switch_key_holding_a_slash_is_refused_naming_the_step_and_the_key() -> None:
    route = soma.switch(str, {"ok": Add(1), "a/b": Add(2)}).named("route")
    with pytest.raises(soma.InvalidIdError, match="key `a/b` of switch step `route`") as raised:
        soma.Graph.somatize(route)
    assert raised.value.node == "route"


def test_a_step_refused_at_its_second_case_keeps_nothing_of_its_first() -> None:
    g = soma.Graph()
    # The second case's ids would hold a space: refused after the first case was made.
    with pytest.raises(soma.InvalidIdError, match="`s/a b`"):
        g.node("s", soma.switch(lambda x: "ok", {"ok": Add(1).named("x"), "a b": Add(2)}))
    assert g.nodes() == []
    g.node("s", soma.switch(lambda x: "ok", {"ok": Add(1).named("x")}))
    assert g.forward(1) == 2
    assert g.implementation("s/ok/x").k == 1


def test_settings_on_a_path_reach_the_node_inside_however_deep() -> None:
    flaky = Flaky().named("fetch")
    route = soma.switch(lambda x: "net", {"net": flaky, "disk": Pass()}).named("route")
    g = soma.Graph.somatize(soma.each(route).named("items"))
    inner = "items/route/net/fetch"
    assert g.implementation(inner) is flaky
    g.retry(inner, 1, backoff=0.0, on=(ConnectionError,))
    g.time_limit(inner, 5.0)
    g.place(inner, "cpu")
    assert g.retries()[inner] == (1, 0.0, (ConnectionError,))
    assert g.time_limits() == {inner: 5.0}
    assert g.devices() == {inner: "cpu"}
    assert g.forward([1]) == [2]
    assert flaky.calls == 2


def test_settings_written_on_a_node_inside_are_kept_under_its_path_at_every_level() -> None:
    flaky = Flaky().named("fetch").retry(1, backoff=0.0, on=(ConnectionError,))
    flaky.time_limit(5.0).on("cpu")
    route = soma.switch(lambda x: "net", {"net": flaky, "disk": Pass()}).named("route")
    g = soma.Graph.somatize(soma.each(route).named("items"))
    inner = "items/route/net/fetch"
    assert g.retries() == {inner: (1, 0.0, (ConnectionError,))}
    assert g.time_limits() == {inner: 5.0}
    assert g.devices() == {inner: "cpu"}
    assert g.forward([1]) == [2]
    assert flaky.calls == 2


def test_an_async_node_inside_a_case_is_known_by_its_path() -> None:
    class Later(soma.Node):
        async def forward(self, x: int) -> int:
            return x + 1

    route = soma.switch(lambda x: "a", {"a": Later().named("later")}).named("route")
    g = soma.Graph.somatize(soma.each(route).named("items"))
    trace = soma.Trace()
    assert g.forward([1, 2], trace=trace) == [2, 3]
    awaited = [span.node for span in trace.spans if span.node.endswith("later")]
    assert awaited == ["items/route/a/later"] * 2


@given(st.text(alphabet="ab/", min_size=1, max_size=6))
def test_an_id_is_refused_exactly_when_it_holds_a_slash(text: str) -> None:
    g = soma.Graph()
    refused: Any = None
    try:
        g.node(text, Pass())
    except soma.InvalidIdError as error:
        refused = error
    assert (refused is not None) == ("/" in text)
    if refused is not None:
        assert refused.node == text
        assert g.nodes() == []
    else:
        assert g.nodes() == [text]
