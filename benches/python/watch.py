"""Watching a run: what OpenTelemetry spans cost a node, and how fast ``ctx.emit`` reaches the
reader of ``g.events`` / ``g.aevents``.

    python benches/python/watch.py [--quick] [--out PATH]

1. A chain of 1,000 trivial nodes, ``forward`` with the telemetry on (the SDK's
   ``BatchSpanProcessor`` and an in-memory exporter) beside the same with it off, interleaved:
   the cost a node (target ≤ 10 µs).
2. From ``ctx.emit`` to the reader seeing the event: an async node emitting 2,000 tokens, each
   after an ``await asyncio.sleep(0)``, read with ``aevents`` on the same loop; and a sync node
   emitting 2,000 values, each before a wait of 0.2 ms (an I/O wait, the GIL given up), read
   with ``events`` on the caller's thread (target ≤ 20 µs, the median).
3. Events sustained: 8 branches of a wave emitting as fast as they can for about a second,
   read with ``events``: the events a second the reader received, how many the buffer dropped,
   and the process's peak memory across three such runs (target 100,000 a second, memory not
   growing run to run).

Timings only, never assertions; the third row's "from 8 branches" holds the GIL in turns, as
Python code does.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import soma
from deadline import log, publish, table
from timing import compare

CHAIN = 1_000
TOKENS = 2_000


class Pass(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


def chain_rows(quick: bool) -> list[list[str]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = BatchSpanProcessor(exporter, max_queue_size=1_000_000, max_export_batch_size=4096)
    provider.add_span_processor(processor)
    expr: Any = Pass()
    for _ in range(CHAIN - 1):
        expr = expr >> Pass()
    g = soma.Graph.somatize(expr)

    class Enabled:
        def __enter__(self) -> None:
            soma.telemetry.enable(provider)

        def __exit__(self, *_: object) -> None:
            soma.telemetry.disable()
            processor.force_flush()
            exporter.clear()

    from opentelemetry import context, trace

    tracer = provider.get_tracer("floor")

    def sdk_alone() -> None:
        # What any mapping onto the SDK pays for a node's span: started with the attributes
        # Soma sets on a call, made current and back, ended with its outcome.
        for _ in range(CHAIN):
            span = tracer.start_span(
                "node",
                attributes={
                    "thread.id": threading.get_ident(),
                    "soma.node": "node",
                    "soma.branch": "main",
                    "soma.attempt": 0,
                    "code.function": "module.Pass.forward",
                },
            )
            token = context.attach(trace.set_span_in_context(span))
            context.detach(token)
            span.set_attribute("soma.outcome", "returned")
            span.end()

    timings = compare(
        {"off": lambda: g.forward(1), "on": lambda: g.forward(1), "sdk": sdk_alone},
        repeat=5 if quick else 15,
        sample_s=0.05 if quick else 0.2,
        warmup_s=0.1 if quick else 0.3,
        settings={"on": Enabled, "sdk": Enabled},
    )
    provider.shutdown()
    off, on = timings["off"].median_s, timings["on"].median_s
    per_node = (on - off) / CHAIN
    sdk = timings["sdk"].median_s / CHAIN
    return [
        [
            f"chain of {CHAIN:,} trivial nodes, telemetry on "
            "(BatchSpanProcessor, in-memory exporter)",
            f"{on * 1e3:.2f} ms",
            f"off: {off * 1e3:.3f} ms",
            f"+{per_node * 1e6:.2f} µs a node (target ≤ 10 µs): "
            f"{'met' if per_node <= 10e-6 else 'MISSED'}",
        ],
        [
            "the SDK alone: a span with a call's attributes, started, made current, ended",
            f"{sdk * 1e6:.2f} µs a span",
            "",
            f"Soma's own part of a node's cost: {(per_node - sdk) * 1e6:.2f} µs",
        ],
    ]


def async_latency() -> list[float]:
    class Tokens(soma.Node):
        async def forward(self, n: int, ctx: soma.Ctx) -> int:
            for _ in range(n):
                await asyncio.sleep(0)
                ctx.emit(time.perf_counter())
            return n

    g = soma.Graph.somatize(Tokens().named("llm"))

    async def main() -> list[float]:
        seen = []
        async for event in g.aevents(TOKENS):
            if event.kind == "emitted":
                seen.append(time.perf_counter() - event.value)
        return seen

    return asyncio.run(main())


def sync_latency() -> list[float]:
    pause = threading.Event()

    class Values(soma.Node):
        def forward(self, n: int, ctx: soma.Ctx) -> int:
            for _ in range(n):
                ctx.emit(time.perf_counter())
                pause.wait(0.0002)
            return n

    g = soma.Graph.somatize(Values().named("loss"))
    seen = []
    for event in g.events(TOKENS):
        if event.kind == "emitted":
            seen.append(time.perf_counter() - event.value)
    return seen


def latency_rows() -> list[list[str]]:
    rows = []
    for name, taken in (
        (
            f"`ctx.emit` to an `aevents` reader on the same loop ({TOKENS:,} tokens, "
            "an `await` between)",
            async_latency(),
        ),
        (
            f"`ctx.emit` to an `events` reader thread ({TOKENS:,} values, a 0.2 ms wait between)",
            sync_latency(),
        ),
    ):
        median = statistics.median(taken)
        p99 = statistics.quantiles(taken, n=100)[98]
        rows.append(
            [
                name,
                f"median {median * 1e6:.1f} µs",
                f"99th percentile {p99 * 1e6:.1f} µs",
                f"target ≤ 20 µs (median): {'met' if median <= 20e-6 else 'MISSED'}",
            ]
        )
    return rows


def sustained_rows(quick: bool) -> list[list[str]]:
    seconds = 0.3 if quick else 1.0

    class Burst(soma.Node):
        def forward(self, until: float, ctx: soma.Ctx) -> int:
            sent = 0
            while time.perf_counter() < until:
                for _ in range(100):
                    ctx.emit(sent)
                    sent += 1
            return sent

    g = soma.Graph.somatize(_wave_of(Burst, 8))
    peaks = []
    rates = []
    dropped = []
    sent_total = []
    for _ in range(3):
        received = 0
        start = time.perf_counter()
        last = None
        for event in g.events(start + seconds):
            if event.kind == "emitted":
                received += 1
            last = event
        took = time.perf_counter() - start
        assert last is not None
        assert last.kind == "result", last
        rates.append(received / took)
        dropped.append(last.dropped)
        sent_total.append(sum(last.value.values()))
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    rate = statistics.median(rates)
    return [
        [
            "8 branches emitting as fast as they can, read with `events`",
            f"{rate:,.0f} events a second received",
            f"sent {statistics.median(sent_total) / seconds:,.0f} a second, dropped "
            f"{statistics.median(dropped):,.0f} a run; peak memory {peaks[0]:.0f} / "
            f"{peaks[1]:.0f} / {peaks[2]:.0f} MB over three runs",
            f"target 100,000 a second: {'met' if rate >= 100_000 else 'MISSED'}",
        ]
    ]


def _wave_of(node: type[soma.Node], width: int) -> Any:
    expr: Any = node()
    for _ in range(width - 1):
        expr = expr | node()
    return expr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    log("telemetry: the chain, on and off")
    rows += chain_rows(args.quick)
    log("events: from emit to the reader")
    rows += latency_rows()
    log("events: sustained from 8 branches")
    rows += sustained_rows(args.quick)
    publish(
        [
            "Watching a run: OpenTelemetry spans and `ctx.emit` to an event reader "
            "(medians of interleaved samples):",
            "",
            *table(["what", "Soma", "beside", "target"], rows),
        ],
        args.out,
    )


if __name__ == "__main__":
    main()
