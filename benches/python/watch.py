"""Watching a run: what OpenTelemetry spans cost a node, and how fast ``ctx.emit`` reaches the
reader of ``g.events`` / ``g.aevents``.

    python benches/python/watch.py [--quick] [--view] [--out PATH]

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

4. The browser's view (``soma.view``): the chain of 1,000 trivial nodes and the wave of 10,000
   trivial branches, each with no view, with a view recording it and no page open, with the
   runs page open (its event stream read over loopback), and with the page open and the
   recorder called at each node's beginning and end as before the board, interleaved (target:
   with a page, within 2% of none); the same in instructions a node under callgrind, which a
   busy machine does not move (no view, the recorder called at each node as before the board,
   a view recording, and its row read after each run as the runs page's stream reads it); a
   node's state change to an
   open run page's event stream (target ≤ 100 ms, p99 ≤ 250 ms); and 8 branches emitting as fast
   as they can with the run's page open: the events a second they emit, what the page receives,
   and the process's peak memory across three runs (nothing grows without bound). Then a
   chain of 10,000 nodes: its run's page loaded in Debian's headless Chromium until it shows
   every node's state (target ≤ 2 s), its offline report's size and opening until its plan is
   drawn (≤ 5 MB, ≤ 2 s); and a 10,000-node graph whose last 8 nodes emit flat out once a gate
   opens: its page loaded before, and its frames counted for a second while they emit (stays
   responsive). And a ``map`` of two trivial nodes over a million items, each item's run
   listed by the view: with no view, a view recording and the runs page open, alternated.
   ``--view`` runs these rows only.

Timings only, never assertions; the third row's "from 8 branches" holds the GIL in turns, as
Python code does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import socket
import statistics
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import soma
from deadline import log, publish, table
from timing import compare

CHAIN = 1_000
# The wave of issue 46's target 3: as many trivial branches side by side.
WAVE = 10_000
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


class PageReader:
    """An open page's event stream over loopback, read on a thread of its own: what a browser
    tab does, without the drawing. ``on_event`` is called with each event's name and data."""

    def __init__(self, port: int, path: str, on_event: Any = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        self.on_event = on_event
        self.received = 0
        self.messages = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            self.received += len(chunk)
            pending += chunk
            *whole, pending = pending.split(b"\n\n")
            for block in whole:
                self.messages += 1
                if self.on_event is None:
                    continue
                kind, data = "", None
                for line in block.split(b"\n"):
                    if line.startswith(b"event: "):
                        kind = line[7:].decode()
                    elif line.startswith(b"data: "):
                        data = json.loads(line[6:])
                if data is not None:
                    self.on_event(kind, data)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


def view_rows(quick: bool) -> list[list[str]]:
    from soma._run import observe

    view = soma.view(port=0, quiet=True)
    recorder = observe.dispatch.watcher
    observe.set_watcher(None)
    expr: Any = Pass()
    for _ in range(CHAIN - 1):
        expr = expr >> Pass()
    g = soma.Graph.somatize(expr)

    class Recording:
        def __enter__(self) -> None:
            observe.set_watcher(recorder)

        def __exit__(self, *_: object) -> None:
            observe.set_watcher(None)

    class PageOpen(Recording):
        def __enter__(self) -> None:
            super().__enter__()
            self.page = PageReader(view.port, "/api/runs/events")

        def __exit__(self, *_: object) -> None:
            self.page.close()
            super().__exit__()

    class PageOpenCalled(PageOpen):
        """As before the board: the engine calls the recorder at each node's beginning and
        end."""

        def __enter__(self) -> None:
            super().__enter__()
            soma._soma.observe(recorder.alone)

    wide: Any = Pass()
    for _ in range(WAVE - 1):
        wide = wide | Pass()
    wave = soma.Graph.somatize(wide)
    rows = []
    for name, graph, nodes in (
        (f"chain of {CHAIN:,} trivial nodes", g, CHAIN),
        (f"wave of {WAVE:,} trivial branches", wave, WAVE),
    ):
        timings = compare(
            {
                "none": partial(graph.forward, 1),
                "view": partial(graph.forward, 1),
                "page": partial(graph.forward, 1),
                "called": partial(graph.forward, 1),
            },
            repeat=5 if quick else 15,
            sample_s=0.05 if quick else 0.2,
            warmup_s=0.1 if quick else 0.3,
            settings={"view": Recording, "page": PageOpen, "called": PageOpenCalled},
        )
        none, recorded, paged, called = (
            timings[name].median_s for name in ("none", "view", "page", "called")
        )
        rows.append(
            [
                f"{name}: a view recording it, the runs page open",
                f"page: {paged * 1e3:.2f} ms; view, no page: {recorded * 1e3:.2f} ms; "
                f"page, the recorder called at each node (before the board): "
                f"{called * 1e3:.2f} ms",
                f"no view: {none * 1e3:.3f} ms",
                f"page {(paged / none - 1) * 100:+.1f}%, "
                f"{(paged - none) / nodes * 1e9:+.0f} ns a node "
                f"(target within 2%): {'met' if paged <= none * 1.02 else 'MISSED'}",
            ]
        )
    rows += _least_rows(recorder, Recording, g, quick)
    rows += _stream_rows(view, recorder, quick)
    observe.set_watcher(recorder)
    rows += _state_change_rows(view, 10 if quick else 50)
    rows += _flood_rows(view, quick)
    view.close()
    return rows


def _least_rows(recorder: Any, recording: Any, chain: soma.Graph, quick: bool) -> list[list[str]]:
    """What a view recording a run costs it, apart: once a run (a chain of one node, where the
    node's share is a few nanoseconds) and once a node (a chain of 10,000, its run's share taken
    out), no view against a view recording, interleaved; beside the 1% and 2% of the chain of
    1,000 that target 3 allows, and what the chain would cost if a node's record were one
    store (1 ns) and its run's what it is now."""
    from soma._run import observe

    def chain_of(nodes: int) -> soma.Graph:
        expr: Any = Pass()
        for _ in range(nodes - 1):
            expr = expr >> Pass()
        return soma.Graph.somatize(expr)

    observe.set_watcher(None)
    graphs = {"one": chain_of(1), "thousand": chain, "ten thousand": chain_of(10_000)}
    contenders: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for name, graph in graphs.items():
        contenders[f"{name}: none"] = partial(graph.forward, 1)
        contenders[f"{name}: view"] = partial(graph.forward, 1)
        settings[f"{name}: view"] = recording
    timings = compare(
        contenders,
        repeat=5 if quick else 15,
        sample_s=0.05 if quick else 0.2,
        warmup_s=0.1 if quick else 0.3,
        settings=settings,
    )
    added = {
        name: timings[f"{name}: view"].median_s - timings[f"{name}: none"].median_s
        for name in graphs
    }
    run = added["one"]
    node = (added["ten thousand"] - run) / 9_999
    thousand = timings["thousand: none"].median_s
    one_store = run + CHAIN * 1e-9
    return [
        [
            "a view recording, no page: what a run costs apart (a chain of one node) and "
            f"what a node does (a chain of 10,000, its run's {run * 1e6:.2f} µs out)",
            f"a run {run * 1e6:+.2f} µs; a node {node * 1e9:+.1f} ns",
            f"chain of {CHAIN:,}: no view {thousand * 1e6:.1f} µs, a view "
            f"{added['thousand'] * 1e6:+.1f} µs",
            f"target 3 allows it {thousand * 0.01 * 1e6:.2f} µs (1%) or "
            f"{thousand * 0.02 * 1e6:.2f} µs (2%); a run as now and a node of one store "
            f"(1 ns): {one_store * 1e6:.2f} µs ({one_store / thousand * 100:.1f}%)",
        ]
    ]


class PlusOne(soma.Node):
    def forward(self, x: int) -> int:
        return x + 1


class Twice(soma.Node):
    def forward(self, x: int) -> int:
        return 2 * x


def _stream_rows(view: Any, recorder: Any, quick: bool) -> list[list[str]]:
    """A `map` of a two-node graph over a million items with no view, with a view recording it
    (no page open) and with the runs page open, alternated: seconds, and the OS threads after."""
    from soma._run import observe

    items = 100_000 if quick else 1_000_000
    g = soma.Graph.somatize(PlusOne() >> Twice())
    taken: dict[str, list[float]] = {"none": [], "view": [], "page": []}
    for _ in range(1 if quick else 3):
        for mode in taken:
            page = PageReader(view.port, "/api/runs/events") if mode == "page" else None
            observe.set_watcher(None if mode == "none" else recorder)
            start = time.perf_counter()
            total = sum(g.map(range(items)))
            taken[mode].append(time.perf_counter() - start)
            observe.set_watcher(None)
            if page is not None:
                page.close()
            assert total == items * (items + 1)
    none, recorded, paged = (statistics.median(taken[mode]) for mode in taken)
    return [
        [
            f"a map of 2 trivial nodes over {items:,} items, each item's run on the view",
            f"view, no page: {recorded:.2f} s; page: {paged:.2f} s",
            f"no view: {none:.2f} s",
            f"view {recorded / none:.2f}x, page {paged / none:.2f}x",
        ]
    ]


def _state_change(view: Any, phase: float) -> float:
    """Seconds from a node beginning to an open run page's stream telling it is running."""
    gate, began, seen, snapshot = (threading.Event() for _ in range(4))
    begun_at: list[float] = []
    seen_at: list[float] = []

    def first(x: int) -> int:
        began.set()
        gate.wait(10)
        return x

    def second(x: int) -> int:
        begun_at.append(time.perf_counter())
        seen.wait(10)
        return x

    def on_event(kind: str, data: Any) -> None:
        if kind == "snapshot":
            snapshot.set()
        for node in data.get("nodes", []):
            if node["id"] == "second" and node["state"] == "running" and not seen_at:
                seen_at.append(time.perf_counter())
                seen.set()

    g = soma.Graph.somatize(soma.node(first).named("first") >> soma.node(second).named("second"))
    worker = threading.Thread(target=g.forward, args=(1,))
    worker.start()
    began.wait(10)
    page = PageReader(view.port, f"/api/runs/{view.runs()[0].id}/events", on_event)
    snapshot.wait(10)
    # A change comes at any moment of the page's tick, not just after a message: the gate opens
    # after a wait drawn anew each time.
    time.sleep(phase)
    gate.set()
    seen.wait(10)
    worker.join(10)
    page.close()
    return seen_at[0] - begun_at[0]


def _state_change_rows(view: Any, times: int) -> list[list[str]]:
    draw = random.Random(46)
    taken = [_state_change(view, draw.uniform(0.0, 0.1)) for _ in range(times)]
    median = statistics.median(taken)
    p99 = statistics.quantiles(taken, n=100)[98]
    return [
        [
            f"a node's state change to an open run page's event stream ({times} runs)",
            f"median {median * 1e3:.1f} ms",
            f"99th percentile {p99 * 1e3:.1f} ms",
            f"target ≤ 100 ms, p99 ≤ 250 ms: "
            f"{'met' if median <= 0.1 and p99 <= 0.25 else 'MISSED'}",
        ]
    ]


def _append_forward(g: soma.Graph, x: Any, results: list[Any]) -> None:
    results.append(g.forward(x))


def _flood_rows(view: Any, quick: bool) -> list[list[str]]:
    """8 branches emitting flat out, the run's page open."""
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
    rates, alone, peaks, messages, received = [], [], [], [], []
    # With the page and without, in turns: the run emits as much either way if the page's
    # stream never holds it up.
    for page_open in (True, False) * 3:
        start = time.perf_counter()
        results: list[Any] = []
        worker = threading.Thread(target=_append_forward, args=(g, start + seconds, results))
        worker.start()
        page = None
        if page_open:
            while not view.runs() or view.runs()[0].status.value != "running":
                time.sleep(0.001)
            page = PageReader(view.port, f"/api/runs/{view.runs()[0].id}/events")
        worker.join()
        took = time.perf_counter() - start
        if page is None:
            alone.append(sum(results[0].values()) / took)
            continue
        page.close()
        rates.append(sum(results[0].values()) / took)
        messages.append(page.messages / took)
        received.append(page.received / took)
        peaks.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return [
        [
            "8 branches emitting as fast as they can, the run's page open",
            f"{statistics.median(rates):,.0f} events a second emitted",
            f"no page: {statistics.median(alone):,.0f} a second; the page: "
            f"{statistics.median(messages):,.0f} messages, "
            f"{statistics.median(received) / 1e3:,.0f} kB a second; peak memory "
            f"{peaks[0]:.0f} / {peaks[1]:.0f} / {peaks[2]:.0f} MB over three runs",
            "target 100,000 a second, the page coalesced: "
            f"{'met' if statistics.median(rates) >= 100_000 else 'MISSED'}",
        ]
    ]


RECORDED = """
import sys
import soma
from soma._run import observe
from soma.view import record
class Pass(soma.Node):
    def forward(self, x):
        return x
mode, times, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3]
e = Pass()
for _ in range(999 if shape == "chain" else 9_999):
    e = (e >> Pass()) if shape == "chain" else (e | Pass())
g = soma.Graph.somatize(e)
recorder = record.Recorder()
if mode != "none":
    observe.set_watcher(recorder)
if mode == "called":
    # As before the board: the engine calls the recorder at each node's beginning and end.
    soma._soma.observe(recorder.alone)
for _ in range(times):
    g.forward(1)
    if mode == "read":
        # What the runs page's stream reads of a run that changed: its row.
        recorder.runs()[0].as_json()
"""


def instruction_rows() -> list[list[str]]:
    """The chain's and the wave's instructions a node, counted by callgrind, with the view's
    recorder and without: what does not move when the machine is busy."""
    import os
    import re
    import shutil
    import subprocess
    import sys

    if shutil.which("valgrind") is None:
        return [["chain of 1,000, instructions a node", "not run", "no valgrind", ""]]

    def counted(mode: str, times: int, shape: str) -> int:
        done = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                "-c",
                RECORDED,
                mode,
                str(times),
                shape,
            ],
            # One hash seed for every count: what imports cost moves with it, by more than
            # what a node costs.
            env={**os.environ, "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"refs:\s+([\d,]+)", done.stderr)
        assert found is not None, done.stderr
        return int(found.group(1).replace(",", ""))

    def per_node(mode: str, shape: str, nodes: int) -> float:
        return (counted(mode, 12, shape) - counted(mode, 2, shape)) / 10 / nodes

    rows = []
    for shape, nodes, name in (
        ("chain", CHAIN, f"chain of {CHAIN:,} trivial nodes"),
        ("wave", WAVE, f"wave of {WAVE:,} trivial branches"),
    ):
        bare, called, recorded, read = (
            per_node(mode, shape, nodes) for mode in ("none", "called", "view", "read")
        )
        rows.append(
            [
                f"{name}, instructions a node (callgrind): a view recording; "
                "and its row read after each run, as the runs page's stream reads it",
                f"recorded {recorded:,.0f} (+{recorded - bare:,.0f}); read {read:,.0f} "
                f"(+{read - bare:,.0f})",
                f"no view: {bare:,.0f}; the recorder called at each node's beginning and end "
                f"(before the board): {called:,.0f}",
                f"recorded {(recorded / bare - 1) * 100:+.1f}%, "
                f"read {(read / bare - 1) * 100:+.1f}% "
                f"(target within 2%): {'met' if read <= bare * 1.02 else 'MISSED'}",
            ]
        )
    return rows


BIG = 10_000
# A page has loaded once it knows every node's state (done, for the nodes counted) and each box
# it has drawn shows its node's (no box left waiting):
# a page that draws a large plan a tile at a time (`static/tiles.js`) draws the boxes in view,
# one that draws it whole every box. The same test for both, so that the rows compare.
LOADED = """
const told = Number(document.body.dataset.nodes || 0);
const finished = document.querySelectorAll('#plan g.state-finished').length;
const other = document.querySelectorAll(
  '#plan g.node:not([class*="state-"]), #plan g.node.state-waiting').length;
return (told >= arguments[0] || finished >= arguments[0]) && other === 0 && finished > 0;
"""
# A report is open once its plan is drawn and nothing it shows at once is still to inflate
# (what it puts in the page only when a section is opened, not counted).
OPENED = """
return document.readyState === 'complete'
  && document.querySelectorAll('[data-gzip]:not([data-draw=open])').length === 0
  && document.querySelectorAll('#plan g.node').length > 0;
"""
# The page's frames for a second from the first emitted value it lists, counted by the page
# itself (the benchmark's own thread is starved while the run's threads emit, so the page keeps
# the count until asked): how many, the longest gap between two (a page that keeps up draws 60
# a second, each within 17 ms or so), and how many emitted values it listed meanwhile.
FRAMES = """
window.somaFrames = null;
const gaps = [];
let listed = 0, last = 0, end = 0;
function frame(now) {
  gaps.push(now - last);
  last = now;
  if (now < end) requestAnimationFrame(frame);
  else { watching.disconnect(); window.somaFrames = [gaps.length, Math.max(...gaps), listed]; }
}
const watching = new MutationObserver((changes) => {
  for (const change of changes) listed += change.addedNodes.length;
  if (end === 0) { last = performance.now(); end = last + 1000; requestAnimationFrame(frame); }
});
watching.observe(document.getElementById('emits'), { childList: true });
"""


def _chromium() -> Any:
    import shutil

    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    # A page nobody looks at would draw its frames when it pleases: this one is looked at.
    for argument in (
        "--disable-renderer-backgrounding",
        "--disable-background-timer-throttling",
        "--disable-backgrounding-occluded-windows",
    ):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,900")
    return webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))


def big_rows() -> list[list[str]]:
    """A chain of 10,000 nodes: its run's page loaded in Debian's headless Chromium until it
    shows every node's state, and its offline report's size and opening there until its plan is
    drawn; then a 10,000-node graph whose last 8 nodes emit, its page loaded before they do and
    its frames counted meanwhile: three times with the nodes emitting as fast as they can, three
    times at the rate target 2 names (100,000 values a second)."""
    import os
    import tempfile

    from selenium.webdriver.support.ui import WebDriverWait

    driver = _chromium()
    if driver is None:
        return [[f"a {BIG:,}-node run's page in Chromium", "not run", "no Chromium", ""]]
    expr: Any = Pass()
    for _ in range(BIG - 1):
        expr = expr >> Pass()
    g = soma.Graph.somatize(expr)
    view = soma.view(port=0, quiet=True)
    g.forward(1)
    run = view.runs()[0]
    path = Path(tempfile.mkdtemp()) / "run.html"
    start = time.perf_counter()
    soma.report(run, path)
    written = time.perf_counter() - start
    size = os.path.getsize(path)
    loads, opens = [], []
    try:
        for _ in range(3):
            start = time.perf_counter()
            driver.get(view.url + f"runs/{run.id}")
            WebDriverWait(driver, 60, 0.01).until(lambda d: d.execute_script(LOADED, BIG))
            loads.append(time.perf_counter() - start)
            start = time.perf_counter()
            driver.get(path.as_uri())
            WebDriverWait(driver, 60, 0.01).until(lambda d: d.execute_script(OPENED))
            opens.append(time.perf_counter() - start)
        emitting = [_emitting_page(driver, view) for _ in range(3)]
        paced = [_emitting_page(driver, view, PACED_RATE) for _ in range(3)]
    finally:
        driver.quit()
        view.close()
    load, opened = statistics.median(loads), statistics.median(opens)
    return [
        [
            f"a {BIG:,}-node chain's run page in headless Chromium, every node's state shown",
            f"{load:.2f} s",
            f"median of 3 ({', '.join(f'{t:.2f}' for t in loads)})",
            f"target ≤ 2 s: {'met' if load <= 2 else 'MISSED'}",
        ],
        [
            "the offline report of that run: its size, and opening it in headless Chromium",
            f"{size / 1e6:.1f} MB, opens in {opened:.2f} s",
            f"median of 3 ({', '.join(f'{t:.2f}' for t in opens)}); written in {written:.2f} s",
            f"target ≤ 5 MB and ≤ 2 s: {'met' if size <= 5e6 and opened <= 2 else 'MISSED'}",
        ],
        *emitting,
        *paced,
    ]


EMITTERS = 8
# The rate target 2 names: the page stays responsive while the run emits this many a second.
PACED_RATE = 100_000
# A paced emitter sends its share of the rate in a burst every this many seconds.
PACED_PERIOD = 0.01


def _emitting_page(driver: Any, view: Any, rate: int | None = None) -> list[str]:
    """A 10,000-node graph whose last 8 nodes emit for 6 s once a gate opens — flat out, or
    `rate` values a second among them, a burst each every 10 ms — its page loaded before they
    begin, and its frames counted for a second while they emit."""
    from selenium.webdriver.support.ui import WebDriverWait

    gate = threading.Event()
    burst = 100 if rate is None else max(1, round(rate * PACED_PERIOD / EMITTERS))

    class Burst(soma.Node):
        def forward(self, seconds: float, ctx: soma.Ctx) -> int:
            gate.wait(60)
            start = time.perf_counter()
            until = start + seconds
            sent = 0
            bursts = 0
            while time.perf_counter() < until:
                for _ in range(burst):
                    ctx.emit(sent)
                    sent += 1
                bursts += 1
                if rate is not None:
                    time.sleep(max(0.0, start + bursts * PACED_PERIOD - time.perf_counter()))
            return sent

    expr: Any = Pass()
    for _ in range(BIG - 9):
        expr = expr >> Pass()
    g = soma.Graph.somatize(expr >> _wave_of(Burst, EMITTERS))
    results: list[Any] = []
    worker = threading.Thread(target=_append_forward, args=(g, 6.0, results))
    worker.start()
    while not view.runs() or view.runs()[0].status.value != "running":
        time.sleep(0.001)
    page = view.url + f"runs/{view.runs()[0].id}"
    start = time.perf_counter()
    driver.get(page)
    # Loaded once it knows the nodes before the emitting ones, and shows the drawn ones done.
    WebDriverWait(driver, 60, 0.01).until(lambda d: d.execute_script(LOADED, BIG - 8))
    loaded = time.perf_counter() - start
    driver.execute_script(FRAMES)
    gate.set()
    worker.join()
    frames, longest, listed = WebDriverWait(driver, 60, 0.05).until(
        lambda d: d.execute_script("return window.somaFrames")
    )
    emitted = sum(results[0].values()) / 6.0
    how = "flat out" if rate is None else f"{rate:,} values a second among them"
    return [
        f"the page of a {BIG:,}-node graph whose 8 last nodes emit {how}",
        f"loads in {loaded:.2f} s before they emit; while they emit, {frames} frames in a second, "
        f"the longest {longest:.0f} ms",
        f"{emitted:,.0f} events a second emitted; {listed:,} values listed by the page in that "
        "second",
        f"target ≤ 2 s and responsive: {'met' if loaded <= 2 and longest <= 100 else 'MISSED'}",
    ]


def _wave_of(node: type[soma.Node], width: int) -> Any:
    expr: Any = node()
    for _ in range(width - 1):
        expr = expr | node()
    return expr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--view", action="store_true", help="the browser's view's rows only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    if args.view:
        rows += view_rows(args.quick)
        rows += instruction_rows()
        rows += big_rows()
        publish(
            ["The browser's view:", "", *table(["what", "Soma", "beside", "target"], rows)],
            args.out,
        )
        return
    log("telemetry: the chain, on and off")
    rows += chain_rows(args.quick)
    log("events: from emit to the reader")
    rows += latency_rows()
    log("events: sustained from 8 branches")
    rows += sustained_rows(args.quick)
    log("view: the chain with a page open, a state change to the page, a flood")
    rows += view_rows(args.quick)
    log("view: the chain's instructions a node, recorded and not")
    rows += instruction_rows()
    log("view: a 10,000-node run's page and report in Chromium")
    rows += big_rows()
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
