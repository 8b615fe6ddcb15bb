"""Tracing: a span per node — when, on which thread, in which branch, how many turns, what
error — and the ways to look at a trace: Chrome JSON, a summary table, an SVG timeline."""

from __future__ import annotations

import json
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import soma

DEADLINE = 5.0


class Step(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class Join(soma.Node):
    def forward(self, x: dict[str, Any]) -> Any:
        return len(x)


class Meet(soma.Node):
    """Waits at a barrier: both branches must be in flight at once."""

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier

    def forward(self, x: Any) -> Any:
        self.barrier.wait(timeout=DEADLINE)
        return x


def seed_graph() -> soma.Graph:
    return soma.Graph.somatize(
        Step().named("source")
        >> ((Step().named("encoder") >> Step().named("bottleneck")) | Step().named("other"))
        >> Join().named("join")
    )


def test_a_traced_forward_records_one_span_per_node() -> None:
    trace = soma.Trace()
    assert seed_graph().forward(1, trace=trace) == 2
    assert sorted(span.node for span in trace.spans) == [
        "bottleneck",
        "encoder",
        "join",
        "other",
        "source",
    ]
    assert len(trace) == 5


def test_a_span_starts_after_its_predecessors_end() -> None:
    trace = soma.Trace()
    seed_graph().forward(1, trace=trace)
    at = {span.node: span for span in trace.spans}
    assert at["source"].end <= at["encoder"].start
    assert at["encoder"].end <= at["bottleneck"].start
    assert max(at["bottleneck"].end, at["other"].end) <= at["join"].start
    assert all(span.duration >= 0 for span in trace.spans)


def test_spans_name_the_thread_and_branch_of_each_node() -> None:
    barrier = threading.Barrier(2)
    g = soma.Graph.somatize(
        Step().named("a")
        >> ((Meet(barrier).named("b") >> Step().named("b2")) | Meet(barrier).named("c"))
        >> Join().named("d")
    )
    trace = soma.Trace()
    g.forward(0, trace=trace)
    at = {span.node: span for span in trace.spans}
    assert (at["a"].branch, at["b"].branch, at["b2"].branch, at["c"].branch) == (
        "main",
        "0",
        "0",
        "1",
    )
    assert at["b"].thread == at["b2"].thread
    assert at["b"].thread != at["c"].thread


def test_a_span_counts_the_turns_of_an_awaiting_node() -> None:
    class Asks(soma.Node):
        def forward(self, x: Any, ctx: soma.Ctx) -> Any:
            return soma.Await([x]) if ctx.turn < 2 else ctx.results[0]

    class Echo:
        def perform(self, requests: list[Any]) -> list[Any]:
            return requests

    trace = soma.Trace()
    soma.Graph.somatize(Asks()).forward(7, driver=Echo(), trace=trace)
    assert trace.spans[0].turns == 3


def test_a_failed_node_leaves_a_span_with_its_error_and_forward_still_raises() -> None:
    class Breaks(soma.Node):
        def forward(self, x: Any) -> Any:
            raise ValueError("broken on purpose")

    trace = soma.Trace()
    with pytest.raises(ValueError, match="broken on purpose"):
        soma.Graph.somatize(Step().named("ok") >> Breaks().named("bad")).forward(0, trace=trace)
    at = {span.node: span for span in trace.spans}
    assert at["ok"].error is None
    assert at["bad"].error is not None
    assert "broken on purpose" in at["bad"].error


def test_spans_of_several_forwards_accumulate_until_cleared() -> None:
    g, trace = seed_graph(), soma.Trace()
    g.forward(1, trace=trace)
    g.forward(2, trace=trace)
    assert len(trace.spans) == 10
    trace.clear()
    assert trace.spans == []


def test_a_forward_without_a_trace_records_into_none() -> None:
    # The trace the graph's last forward recorded into gains nothing from the next forward
    # without one, nor from a stream.
    g, trace = seed_graph(), soma.Trace()
    g.forward(1, trace=trace)
    assert len(trace) == 5, "the traced forward recorded into the trace"
    g.forward(1)
    g.forward(2)
    assert list(g.map([1, 2])) == [g.forward(1), g.forward(2)]
    assert len(trace) == 5, trace.spans


def test_the_chrome_trace_opens_as_json_with_a_named_track_per_thread(tmp_path: Path) -> None:
    barrier = threading.Barrier(2)
    g = soma.Graph.somatize(Meet(barrier).named("left") | Meet(barrier).named("right"))
    trace = soma.Trace()
    g.forward(0, trace=trace)
    path = tmp_path / "run.json"
    trace.write_chrome(path)
    events = json.loads(path.read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    names = [e for e in events if e["ph"] == "M" and e["name"] == "thread_name"]
    assert sorted(e["name"] for e in complete) == ["left", "right"]
    assert len({e["tid"] for e in complete}) == 2
    assert {e["tid"] for e in names} == {e["tid"] for e in complete}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    assert json.loads(trace.to_chrome()) == json.loads(path.read_text())


def test_the_summary_lists_the_slowest_node_first() -> None:
    trace = soma.Trace()

    class Slow(soma.Node):
        """Runs for twice as long as the longest span before it: the slowest by construction,
        however fast or loaded the machine."""

        def forward(self, x: Any) -> Any:
            start = time.perf_counter()
            longest = max(span.duration for span in trace.spans)
            while time.perf_counter() - start <= 2 * longest:
                time.sleep(0.001)
            return x

    soma.Graph.somatize(Step().named("quick") >> Slow().named("slow")).forward(0, trace=trace)
    rows = trace.summary().splitlines()
    assert rows[0].split()[:2] == ["node", "total"]
    assert rows[1].startswith("slow")
    assert trace.summary(top=1).splitlines()[-1] == "... and 1 more"


def test_the_timeline_is_an_svg_with_one_bar_per_span() -> None:
    trace = soma.Trace()
    seed_graph().forward(1, trace=trace)
    root = ET.fromstring(trace._repr_svg_())
    assert root.tag.endswith("svg")
    spans = [g for g in root.iter() if g.tag.endswith("g") and g.get("class") == "span"]
    assert len(spans) == 5
