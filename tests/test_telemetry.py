"""OpenTelemetry: once ``soma.telemetry.enable()`` is called, each run, node call, step part and
streamed item is a span, parented under what is current where its work starts, across lent
threads, async tasks and streams — checked with the SDK's in-memory exporter, and once with a
real OTLP/HTTP exporter sending to a receiver started here on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import soma
from conftest import DEADLINE, Meet, Pass, Raise, run_script
from test_one_walk import outcome, random_runs, twin
from test_policies import Flaky
from test_properties import Dag

# The global provider, as an application sets it once: `enable()` with no argument uses it, and
# so do the spans the tests and their nodes make themselves.
EXPORTER = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(PROVIDER)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    soma.telemetry.enable()
    try:
        yield EXPORTER
    finally:
        soma.telemetry.disable()
        EXPORTER.clear()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    found: dict[str, ReadableSpan] = {}
    for span in exporter.get_finished_spans():
        assert span.name not in found, f"two spans named {span.name}"
        found[span.name] = span
    return found


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


class Thread(soma.Node):
    def forward(self, x: Any) -> Any:
        return threading.get_ident()


class Emits(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        ctx.emit(f"token {x}")
        return x


class OwnSpan(soma.Node):
    def forward(self, x: Any) -> Any:
        with trace.get_tracer("user").start_as_current_span("inside"):
            return x


class APass(soma.Node):
    async def forward(self, x: Any) -> Any:
        await asyncio.sleep(0)
        return x


def test_a_run_is_a_span_under_the_callers_current_span_and_each_node_call_one_under_it(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Pass().named("b"))
    with trace.get_tracer("user").start_as_current_span("caller") as caller:
        assert g.forward(1) == 1
    found = by_name(spans)
    assert set(found) == {"caller", "soma.run", "a", "b"}
    assert parent_of(found["soma.run"]) == caller.get_span_context().span_id
    assert parent_of(found["a"]) == span_id(found["soma.run"])
    assert parent_of(found["b"]) == span_id(found["soma.run"])
    assert found["a"].attributes is not None
    assert found["a"].attributes["soma.node"] == "a"
    assert found["a"].attributes["soma.outcome"] == "returned"
    assert found["a"].attributes["code.function"] == "conftest.Pass.forward"
    assert found["soma.run"].attributes is not None
    assert found["soma.run"].attributes["soma.nodes"] == 2


def test_the_branches_of_a_wave_are_spans_under_the_run_on_the_threads_they_ran_on(
    spans: InMemorySpanExporter,
) -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Pass().named("s")
        >> (
            (Meet(barrier).named("m1") >> Thread().named("t1"))
            | (Meet(barrier).named("m2") >> Thread().named("t2"))
        )
    )
    out = g.forward(0)
    found = by_name(spans)
    run = span_id(found["soma.run"])
    for node in ("s", "m1", "t1", "m2", "t2"):
        assert parent_of(found[node]) == run, node
    assert found["t1"].attributes is not None
    assert found["t2"].attributes is not None
    assert found["t1"].attributes["thread.id"] == out["t1"]
    assert found["t2"].attributes["thread.id"] == out["t2"]
    assert out["t1"] != out["t2"]
    assert found["m2"].attributes is not None
    assert found["m2"].attributes["soma.branch"] == "1"


def test_each_item_switch_case_and_loop_iteration_are_spans_parenting_their_nodes(
    spans: InMemorySpanExporter,
) -> None:
    items = soma.each(Pass().named("inner"), in_flight=2).named("items")
    chosen = soma.switch(
        lambda x: "big" if len(x) > 1 else "small",
        {"big": Pass().named("big"), "small": Pass().named("small")},
    ).named("pick")
    g = soma.Graph.somatize(items >> chosen)
    assert g.forward([1, 2]) == [1, 2]
    finished = spans.get_finished_spans()
    names = sorted(span.name for span in finished)
    # The switch's selector is the step's own call (`pick`); a case's nodes are named by the
    # step and the case (`pick/big/big`).
    assert names == sorted(
        [
            "soma.run",
            "items[0]",
            "items[1]",
            "items/inner",
            "items/inner",
            "pick",
            "pick[big]",
            "pick/big/big",
        ]
    )
    run = next(span for span in finished if span.name == "soma.run")
    parts = {span.name: span for span in finished if "[" in span.name}
    for part in parts.values():
        assert parent_of(part) == span_id(run)
    inner = [span for span in finished if span.name == "items/inner"]
    assert {parent_of(span) for span in inner} == {
        span_id(parts["items[0]"]),
        span_id(parts["items[1]"]),
    }
    big = next(span for span in finished if span.name == "pick/big/big")
    assert parent_of(big) == span_id(parts["pick[big]"])
    selector = next(span for span in finished if span.name == "pick")
    assert parent_of(selector) == span_id(run)
    assert parts["items[1]"].attributes is not None
    assert parts["items[1]"].attributes["soma.item"] == 1


def test_a_loop_iteration_is_a_span_parenting_its_body(spans: InMemorySpanExporter) -> None:
    class Up(soma.Node):
        def forward(self, x: int) -> int:
            return x + 1

    g = soma.Graph.somatize(
        soma.loop(Up().named("up"), until=lambda x: x >= 2, max_iterations=5).named("count")
    )
    assert g.forward(0) == 2
    finished = spans.get_finished_spans()
    iterations = {span.name: span for span in finished if span.name.startswith("count[")}
    assert set(iterations) == {"count[0]", "count[1]"}
    ups = [span for span in finished if span.name == "count/up"]
    assert {parent_of(span) for span in ups} == {span_id(span) for span in iterations.values()}


def test_a_failed_node_records_its_exception_and_sets_its_span_and_the_runs_to_error(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Raise(ValueError("bad input")).named("bad"))
    with pytest.raises(ValueError, match="bad input"):
        g.forward(1)
    found = by_name(spans)
    for name in ("bad", "soma.run"):
        assert found[name].status.status_code is StatusCode.ERROR, name
        assert found[name].attributes is not None
        assert found[name].attributes["soma.outcome"] == "failed"
    (event,) = found["bad"].events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == "bad input"
    assert found["a"].status.status_code is StatusCode.UNSET


def test_a_retried_call_is_a_span_per_attempt_the_failed_ones_marked_retrying(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(Flaky(2).named("flaky").retry(times=3, backoff=0.001))
    assert g.forward(5) == 6
    attempts = sorted(
        (span for span in spans.get_finished_spans() if span.name == "flaky"),
        key=lambda span: span.attributes["soma.attempt"] if span.attributes else -1,
    )
    assert [span.attributes["soma.attempt"] for span in attempts if span.attributes] == [0, 1, 2]
    assert [span.attributes["soma.outcome"] for span in attempts if span.attributes] == [
        "retrying",
        "retrying",
        "returned",
    ]
    assert attempts[0].status.status_code is StatusCode.ERROR


def test_a_time_limited_node_and_a_run_with_a_timeout_parent_their_spans_across_the_lent_thread(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> OwnSpan().named("limited").time_limit(5.0))
    assert g.forward(1, timeout=10.0) == 1
    found = by_name(spans)
    assert parent_of(found["a"]) == span_id(found["soma.run"])
    assert parent_of(found["limited"]) == span_id(found["soma.run"])
    assert parent_of(found["inside"]) == span_id(found["limited"])


def test_a_span_a_node_makes_itself_is_a_child_of_its_calls_span(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> OwnSpan().named("own"))
    g.forward(1)
    found = by_name(spans)
    assert parent_of(found["inside"]) == span_id(found["own"])


def test_async_branches_are_spans_under_the_run_on_the_callers_loop(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(
        APass().named("a") >> (APass().named("b") | (APass().named("c") >> OwnSpan().named("sync")))
    )

    async def main() -> Any:
        with trace.get_tracer("user").start_as_current_span("caller"):
            return await g.aforward(1)

    assert asyncio.run(main()) == {"b": 1, "sync": 1}
    found = by_name(spans)
    run = span_id(found["soma.run"])
    assert parent_of(found["soma.run"]) == span_id(found["caller"])
    for node in ("a", "b", "c", "sync"):
        assert parent_of(found[node]) == run, node
    assert parent_of(found["inside"]) == span_id(found["sync"])
    assert found["b"].attributes is not None
    assert found["b"].attributes["soma.async"] is True
    # Outside the run, the caller's context is as it was: nothing Soma attached is left.
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_forward_of_an_async_graph_parents_its_spans_under_the_callers_span(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(APass().named("a") >> (APass().named("b") | APass().named("c")))
    with trace.get_tracer("user").start_as_current_span("caller"):
        g.forward(1)
    found = by_name(spans)
    assert parent_of(found["soma.run"]) == span_id(found["caller"])
    for node in ("a", "b", "c"):
        assert parent_of(found[node]) == span_id(found["soma.run"]), node


def test_a_node_the_cache_answers_is_a_span_marked_cached(spans: InMemorySpanExporter) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Pass().named("b"))
    cache = soma.Cache()
    g.forward(1, cache=cache)
    spans.clear()
    g.forward(1, cache=cache)
    found = by_name(spans)
    for node in ("a", "b"):
        assert found[node].attributes is not None
        assert found[node].attributes["soma.cached"] is True
        assert parent_of(found[node]) == span_id(found["soma.run"])


def test_each_streamed_item_is_a_span_parenting_its_nodes_through_its_stages(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Pass().named("b"))
    with trace.get_tracer("user").start_as_current_span("caller") as caller:
        assert list(g.map(range(3))) == [0, 1, 2]
    finished = spans.get_finished_spans()
    items = {
        span.attributes["soma.item"]: span
        for span in finished
        if span.name == "soma.item" and span.attributes
    }
    assert set(items) == {0, 1, 2}
    for item in items.values():
        assert parent_of(item) == caller.get_span_context().span_id
    nodes = [span for span in finished if span.name in ("a", "b")]
    assert len(nodes) == 6
    assert {parent_of(span) for span in nodes} == {span_id(item) for item in items.values()}


def test_each_item_of_an_async_stream_is_a_span_parenting_its_nodes(
    spans: InMemorySpanExporter,
) -> None:
    g = soma.Graph.somatize(APass().named("a") >> APass().named("b"))

    async def main() -> list[Any]:
        return [y async for y in g.amap(range(3))]

    assert asyncio.run(main()) == [0, 1, 2]
    finished = spans.get_finished_spans()
    items = {span_id(span) for span in finished if span.name == "soma.item"}
    assert len(items) == 3
    nodes = [span for span in finished if span.name in ("a", "b")]
    assert len(nodes) == 6
    assert {parent_of(span) for span in nodes} == items


def test_ctx_emit_is_an_event_on_the_nodes_span(spans: InMemorySpanExporter) -> None:
    soma.Graph.somatize(Emits().named("llm")).forward(7)
    found = by_name(spans)
    (event,) = found["llm"].events
    assert event.name == "soma.emitted"
    assert event.attributes is not None
    assert event.attributes["soma.value"] == "'token 7'"


def test_after_disable_a_run_emits_no_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    soma.telemetry.enable(provider)
    assert soma.telemetry.enabled()
    soma.telemetry.disable()
    assert not soma.telemetry.enabled()
    soma.Graph.somatize(Pass().named("a")).forward(1)
    assert exporter.get_finished_spans() == ()


def test_soma_imports_opentelemetry_only_once_telemetry_is_enabled() -> None:
    done = run_script(
        "import sys, soma\n"
        "class P(soma.Node):\n"
        "    def forward(self, x): return x\n"
        "soma.Graph.somatize(P()).forward(1)\n"
        "print('before', any(m.startswith('opentelemetry') for m in sys.modules))\n"
        "soma.telemetry.enable()\n"
        "print('after', 'opentelemetry.trace' in sys.modules)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["before", "False", "after", "True"]


class Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: keeps the body of each export request."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        Receiver.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_an_otlp_http_exporter_delivers_every_span_to_a_receiver_on_localhost() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    Receiver.bodies.clear()
    try:
        provider = TracerProvider()
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        soma.telemetry.enable(provider)
        try:
            g = soma.Graph.somatize(Pass().named("a") >> (Pass().named("b") | Pass().named("c")))
            g.forward(1)
        finally:
            soma.telemetry.disable()
        assert provider.force_flush(int(DEADLINE * 1000))
        provider.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    received: dict[str, bytes] = {}
    parents: dict[str, bytes] = {}
    for body in Receiver.bodies:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                assert scope.scope.name == "soma"
                for span in scope.spans:
                    received[span.name] = span.span_id
                    parents[span.name] = span.parent_span_id
    assert set(received) == {"soma.run", "a", "b", "c"}
    for node in ("a", "b", "c"):
        assert parents[node] == received["soma.run"]


@soma.node
def clean(x: int) -> int:
    return x


def test_a_function_nodes_span_names_its_function_as_code_function(
    spans: InMemorySpanExporter,
) -> None:
    soma.Graph.somatize(clean >> Pass().named("after")).forward(1)
    found = by_name(spans)
    assert found["clean"].attributes is not None
    assert found["clean"].attributes["code.function"] == "test_telemetry.clean"


@settings(max_examples=30, deadline=None)
@given(random_runs(), st.integers(min_value=0, max_value=20), st.booleans(), st.booleans())
def test_every_span_of_a_random_run_is_in_its_runs_trace_under_a_parent_of_that_run(
    run_of: tuple[Dag, dict[str, tuple[int, int, int | None]], set[str]],
    x: int,
    cached: bool,
    asynchronously: bool,
) -> None:
    dag, shapes, asynced = run_of
    g = twin(dag, shapes, asynced)
    cache = soma.Cache() if cached else None
    EXPORTER.clear()
    soma.telemetry.enable()
    try:
        for _ in range(2 if cached else 1):
            if asynchronously:
                outcome(lambda: asyncio.run(g.aforward(x, cache=cache)))
            else:
                outcome(lambda: g.forward(x, cache=cache, timeout=30))
    finally:
        soma.telemetry.disable()
    finished = EXPORTER.get_finished_spans()
    runs = [span for span in finished if span.name == "soma.run"]
    assert len(runs) == (2 if cached else 1)
    ids = {span_id(span) for span in finished}
    for span in finished:
        if span.name == "soma.run":
            assert span.parent is None
            continue
        assert span.parent is not None, span.name
        assert span.parent.span_id in ids, span.name
        assert span.context is not None
        assert span.context.trace_id in {run.context.trace_id for run in runs if run.context}
    # Each node's attempts are numbered from 0, one after another, in each run.
    for run in runs:
        assert run.context is not None
        attempts: dict[str, list[int]] = {}
        for span in finished:
            in_run = span.context is not None and span.context.trace_id == run.context.trace_id
            attempt = span.attributes.get("soma.attempt") if span.attributes else None
            if in_run and isinstance(attempt, int):
                attempts.setdefault(span.name, []).append(attempt)
        for node, numbers in attempts.items():
            assert sorted(numbers) == list(range(len(numbers))), node


def test_a_graph_run_inside_a_node_is_a_run_span_under_that_nodes_call(
    spans: InMemorySpanExporter,
) -> None:
    inner = soma.Graph.somatize(Pass().named("inner_a"))

    class Outer(soma.Node):
        def forward(self, x: Any) -> Any:
            return inner.forward(x)

    soma.Graph.somatize(Outer().named("outer")).forward(1)
    finished = spans.get_finished_spans()
    runs = [span for span in finished if span.name == "soma.run"]
    outer = next(span for span in finished if span.name == "outer")
    inner_run = next(span for span in runs if parent_of(span) is not None)
    assert parent_of(inner_run) == span_id(outer)
    inner_a = next(span for span in finished if span.name == "inner_a")
    assert parent_of(inner_a) == span_id(inner_run)


def test_micro_batches_are_item_spans_parenting_their_nodes(spans: InMemorySpanExporter) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Pass().named("b"))
    assert g.forward([1, 2, 3, 4], micro_batches=2) == [1, 2, 3, 4]
    finished = spans.get_finished_spans()
    items = {span_id(span) for span in finished if span.name == "soma.item"}
    assert len(items) == 2
    nodes = [span for span in finished if span.name in ("a", "b")]
    assert len(nodes) == 4
    assert {parent_of(span) for span in nodes} == items


def test_a_run_past_its_timeout_is_a_failed_run_span(spans: InMemorySpanExporter) -> None:
    release = threading.Event()

    class Stuck(soma.Node):
        def forward(self, x: Any) -> Any:
            release.wait(DEADLINE)
            return x

    g = soma.Graph.somatize(Pass().named("a") >> Stuck().named("stuck"))
    try:
        with pytest.raises(TimeoutError):
            g.forward(1, timeout=0.2)
    finally:
        release.set()
    found = {span.name: span for span in spans.get_finished_spans()}
    assert found["soma.run"].status.status_code is StatusCode.ERROR
    assert parent_of(found["a"]) == span_id(found["soma.run"])


def test_a_stream_closed_with_items_in_flight_ends_their_spans_as_stopped(
    spans: InMemorySpanExporter,
) -> None:
    gate = threading.Event()
    running = threading.Event()

    class Gated(soma.Node):
        def forward(self, x: int) -> int:
            if x > 0:
                running.set()
                gate.wait(DEADLINE)
            return x

    g = soma.Graph.somatize(Gated().named("gated"))
    stream = g.map(range(4), in_flight=4)
    assert next(iter(stream)) == 0
    assert running.wait(DEADLINE), "item 1 never reached its node"
    # Item 1 is held in its node, the others behind it, when the stream is closed. `close`
    # holds the stream's lock from before it marks the stream closed until it has waited for
    # its stages, and lets the GIL go only in that wait: once `figures()` (which answers `None`
    # while another thread holds that lock) answers `None` here, the stream is marked closed,
    # and only then is item 1 let go.
    closer = threading.Thread(target=stream.close)
    closer.start()
    until = time.monotonic() + DEADLINE
    while stream.figures() is not None:
        assert time.monotonic() < until, "close never began"
        time.sleep(0.001)
    gate.set()
    closer.join(DEADLINE)
    assert not closer.is_alive()
    items = {
        span.attributes["soma.item"]: str(span.attributes["soma.outcome"])
        for span in spans.get_finished_spans()
        if span.name == "soma.item" and span.attributes
    }
    # Every item that began has ended, none left open; the first was handed back, and each
    # one in flight at the close, item 1 at least, was stopped.
    assert items[0] == "returned", items
    assert 1 in items, items
    assert {outcome for index, outcome in items.items() if index > 0} == {"stopped"}, items
