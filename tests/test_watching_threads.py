"""Watching a run from the code users write: ``aevents`` holding its bound behind a reader that
holds the loop, ``ctx.emit`` from threads a node starts, and telemetry that never changes a run's
outcome (a ``repr`` that raises, a value too large to show whole).

Bounds are shown by counting what was buffered, never by timing; what could hang waits with a
deadline (``DEADLINE``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import soma
from conftest import DEADLINE

EMITS = 5_000
BUFFER = 100


class Flood(soma.Node):
    """Emits ``EMITS`` values, then sets ``done``."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def forward(self, x: Any, ctx: Any) -> Any:
        for i in range(EMITS):
            ctx.emit(i)
        self.done.set()
        return x


# ---------------------------------------------------------------------------------------------
# The bound


def test_events_keeps_at_most_its_buffer_behind_a_reader_that_waits() -> None:
    flood = Flood()
    g = soma.Graph.somatize(flood)
    events = g.events(1, buffer=BUFFER)
    first = next(events)
    assert flood.done.wait(DEADLINE)
    told = [first, *events]
    emitted = [e for e in told if e.kind == "emitted"]
    assert len(emitted) <= BUFFER
    # Every event but the last is `started`, `finished` or an emit: what was not told was counted.
    assert told[-1].dropped == EMITS + 2 - (len(told) - 1)


def test_aevents_keeps_at_most_its_buffer_behind_a_reader_that_holds_the_loop() -> None:
    flood = Flood()
    g = soma.Graph.somatize(flood)

    async def main() -> list[soma.Event]:
        events = aiter(g.aevents(1, buffer=BUFFER))
        first = await anext(events)
        # The reader holds the loop while the sync node, on a lent thread, emits everything.
        assert flood.done.wait(DEADLINE)
        return [first, *[e async for e in events]]

    events = asyncio.run(main())
    emitted = [e for e in events if e.kind == "emitted"]
    assert len(emitted) <= BUFFER
    assert events[-1].kind == "result"
    assert events[-1].dropped == EMITS + 2 - (len(events) - 1)


# ---------------------------------------------------------------------------------------------
# Emits from threads a node starts


class ThreadEmits(soma.Node):
    """Emits 0..3 from threads it starts, as ``how`` says, and waits for them."""

    def __init__(self, how: str) -> None:
        self.how = how

    def forward(self, x: Any, ctx: Any) -> Any:
        if self.how == "pool":
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                list(pool.map(ctx.emit, range(4)))
        else:
            threads = [threading.Thread(target=ctx.emit, args=(i,)) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(DEADLINE)
        return x


class AsyncThreadEmits(soma.Node):
    """Emits 0..3 through ``loop.run_in_executor``, and awaits them."""

    async def forward(self, x: Any, ctx: Any) -> Any:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, ctx.emit, i) for i in range(4)))
        return x


def emitted_values(events: list[soma.Event]) -> list[Any]:
    return sorted(e.value for e in events if e.kind == "emitted")


@pytest.mark.parametrize("how", ["pool", "thread"])
def test_an_emit_from_a_thread_a_sync_node_started_reaches_the_events(how: str) -> None:
    g = soma.Graph.somatize(ThreadEmits(how).named("n"))
    events = list(g.events(1))
    assert emitted_values(events) == [0, 1, 2, 3]
    assert {e.node for e in events if e.kind == "emitted"} == {"n"}
    assert events[-1].dropped == 0


@pytest.mark.parametrize("how", ["pool", "thread"])
def test_an_emit_from_a_thread_a_node_started_reaches_aevents(how: str) -> None:
    g = soma.Graph.somatize(ThreadEmits(how))

    async def main() -> list[soma.Event]:
        return [e async for e in g.aevents(1)]

    assert emitted_values(asyncio.run(main())) == [0, 1, 2, 3]


def test_an_emit_from_run_in_executor_in_an_async_node_reaches_the_events() -> None:
    g = soma.Graph.somatize(AsyncThreadEmits())

    async def main() -> list[soma.Event]:
        return [e async for e in g.aevents(1)]

    assert emitted_values(asyncio.run(main())) == [0, 1, 2, 3]
    assert emitted_values(list(g.events(1))) == [0, 1, 2, 3]


def test_an_emit_from_a_thread_keeps_its_streamed_items_index() -> None:
    g = soma.Graph.somatize(ThreadEmits("pool"))
    events = list(g.map_events([10, 20]))
    assert sorted((e.item, e.value) for e in events if e.kind == "emitted") == [
        (i, v) for i in (0, 1) for v in range(4)
    ]


class Late(soma.Node):
    """Starts a thread that emits once ``release`` is set: after this node has returned."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.thread: threading.Thread | None = None

    def forward(self, x: Any, ctx: Any) -> Any:
        def later() -> None:
            self.release.wait(DEADLINE)
            ctx.emit("late")

        self.thread = threading.Thread(target=later)
        self.thread.start()
        return x


class Release(soma.Node):
    """Lets ``late``'s thread emit, and waits for it: the run is still going on."""

    def __init__(self, late: Late) -> None:
        self.late = late

    def forward(self, x: Any) -> Any:
        self.late.release.set()
        assert self.late.thread is not None
        self.late.thread.join(DEADLINE)
        return x


def test_an_emit_after_its_node_returned_is_counted_as_dropped() -> None:
    late = Late()
    g = soma.Graph.somatize(late >> Release(late))
    events = list(g.events(1))
    assert [e for e in events if e.kind == "emitted"] == []
    assert events[-1].dropped == 1


# ---------------------------------------------------------------------------------------------
# Telemetry never changes a run's outcome


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    soma.telemetry.enable(provider)
    try:
        yield exporter
    finally:
        soma.telemetry.disable()


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Emit(soma.Node):
    def __init__(self, value: Any) -> None:
        self.value = value

    def forward(self, x: Any, ctx: Any) -> Any:
        ctx.emit(self.value)
        return x


class AsyncEmit(soma.Node):
    def __init__(self, value: Any) -> None:
        self.value = value

    async def forward(self, x: Any, ctx: Any) -> Any:
        ctx.emit(self.value)
        return x


def emitted_attributes(exporter: InMemorySpanExporter) -> list[Any]:
    return [
        event.attributes
        for span in exporter.get_finished_spans()
        for event in span.events
        if event.name == "soma.emitted"
    ]


@pytest.mark.parametrize("node", [Emit, AsyncEmit])
def test_an_emitted_value_whose_repr_raises_fails_no_node(
    spans: InMemorySpanExporter, node: type[soma.Node]
) -> None:
    g = soma.Graph.somatize(node(BadRepr()))  # type: ignore[call-arg]
    assert g.forward(3) == 3
    (attributes,) = emitted_attributes(spans)
    assert "BadRepr" in attributes["soma.value"]


def test_a_large_emitted_value_is_shown_cut_without_its_whole_repr_built(
    spans: InMemorySpanExporter,
) -> None:
    built: list[int] = []

    class Item:
        def __repr__(self) -> str:
            built.append(1)
            return "item"

    g = soma.Graph.somatize(Emit([Item() for _ in range(100_000)]))
    g.forward(0)
    (attributes,) = emitted_attributes(spans)
    assert len(attributes["soma.value"]) <= 1003
    assert len(built) < 1_000  # The items shown, not all 100,000.


def test_ctx_emit_from_a_thread_is_an_event_on_the_nodes_span(
    spans: InMemorySpanExporter,
) -> None:
    soma.Graph.somatize(ThreadEmits("pool").named("n")).forward(1)
    (node,) = [span for span in spans.get_finished_spans() if span.name == "n"]
    assert sorted(event.attributes["soma.value"] for event in node.events) == ["0", "1", "2", "3"]
