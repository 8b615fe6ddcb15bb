"""Async nodes: ``aforward`` beside ``asyncio.gather`` and hand-written code, in one run.

    .venv/bin/python benches/python/aio.py [--quick] [--out PATH]

Prints a markdown table (and writes it to PATH). Timings only, never assertions: a missed target
is a row that says so. The rows are issue 23's targets:

1. a wave of 10,000 async nodes each awaiting ``asyncio.sleep(0.1)``, against ``asyncio.gather``
   of the same coroutines (the floor), and the process's threads it added (at most 4);
2. 1,000 ``aforward`` calls in flight on one loop, each of a 3-node graph with one async sleep of
   50 ms (at most 0.25 s in all);
3. the loop's longest wait between ticks of a 1 ms ticker while ``aforward`` runs sync nodes that
   each hold a thread for 50 ms (at most 5 ms);
4. ``aforward`` of 3 trivial async nodes against the same awaits written by hand in the
   ``asyncio.gather`` style, each through ``asyncio.gather`` (at most 3x); and, for scale,
   against the three awaits in one coroutine, which no task-based runner can approach: a run
   of ``aforward`` is one task (its own copy of the caller's context), about 6 µs by itself.

Each figure is the median of interleaved repeats (a Soma run, then its floor). That ``forward``
of a graph without async nodes is as fast as before is the chain and trivial-wave rows of
``bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import soma
from deadline import log, table

SLEEP_S = 0.1
WAVE = 10_000
CALLS = 1_000
CALL_SLEEP_S = 0.05
HOLD_S = 0.05
TICK_S = 0.001


class Sleep(soma.Node):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def forward(self, x: Any) -> Any:
        await asyncio.sleep(self.seconds)
        return x


class AsyncPass(soma.Node):
    async def forward(self, x: Any) -> Any:
        return x


class Hold(soma.Node):
    """A sync node that holds its thread (a blocking client, a native call)."""

    def forward(self, x: Any) -> Any:
        time.sleep(HOLD_S)
        return x


async def elapsed(run: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await run()
    return time.perf_counter() - start


def wave_graph(width: int) -> soma.Graph:
    g = soma.Graph()
    for i in range(width):
        g.node(f"s{i}", Sleep(SLEEP_S))
    return g


async def wave_rows(repeat: int) -> list[list[str]]:
    g = wave_graph(WAVE)
    await g.aforward(0)  # Prepared once per version of the graph: not timed.
    soma_s, gather_s, added = [], [], []
    for _ in range(repeat):
        before = threading.active_count()
        most = before

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, threading.active_count())
                await asyncio.sleep(SLEEP_S / 4)

        watcher = asyncio.create_task(watch())
        soma_s.append(await elapsed(lambda: g.aforward(0)))
        watcher.cancel()
        added.append(most - before)
        gather_s.append(
            await elapsed(lambda: asyncio.gather(*(asyncio.sleep(SLEEP_S) for _ in range(WAVE))))
        )
    ours, floor = statistics.median(soma_s), statistics.median(gather_s)
    log(f"wave: soma {ours:.3f} s, gather {floor:.3f} s, threads +{max(added)}")
    ratio = ours / floor
    return [
        [
            f"1. wave of {WAVE:,} async sleeps of {SLEEP_S} s",
            f"{ours:.3f} s",
            f"gather {floor:.3f} s",
            f"{ratio:.2f}x, threads +{max(added)}",
            f"≤ 1.5x, threads ≤ +4: {'met' if ratio <= 1.5 and max(added) <= 4 else 'MISSED'}",
        ]
    ]


async def calls_rows(repeat: int) -> list[list[str]]:
    rows = []
    shapes = {
        "async pass >> sleep >> async pass": AsyncPass() >> Sleep(CALL_SLEEP_S) >> AsyncPass(),
        "sync pass >> sleep >> sync pass": _SyncPass() >> Sleep(CALL_SLEEP_S) >> _SyncPass(),
    }
    for label, expr in shapes.items():
        g = soma.Graph.somatize(expr)
        await g.aforward(0)
        times = [
            await elapsed(lambda g=g: asyncio.gather(*(g.aforward(i) for i in range(CALLS))))
            for _ in range(repeat)
        ]
        floor = statistics.median(
            [
                await elapsed(
                    lambda: asyncio.gather(*(asyncio.sleep(CALL_SLEEP_S) for _ in range(CALLS)))
                )
                for _ in range(repeat)
            ]
        )
        ours = statistics.median(times)
        log(f"calls ({label}): {ours:.3f} s, gather {floor:.3f} s")
        rows.append(
            [
                f"2. {CALLS:,} `aforward` calls in flight, {label}",
                f"{ours:.3f} s",
                f"gather {floor:.3f} s",
                f"{ours / floor:.2f}x",
                f"≤ 0.25 s: {'met' if ours <= 0.25 else 'MISSED'}",
            ]
        )
    return rows


class _SyncPass(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


async def _longest_wait(done: asyncio.Event) -> float:
    """Ticks every ``TICK_S`` until ``done``; the longest it waited beyond a tick."""
    worst = 0.0
    last = time.perf_counter()
    while not done.is_set():
        await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        worst = max(worst, now - last - TICK_S)
        last = now
    return worst


async def responsive_rows(repeat: int) -> list[list[str]]:
    g = soma.Graph.somatize(
        Hold() >> (Hold() | Hold() | Hold()) >> AsyncPass() >> Hold() >> (Hold() | Hold())
    )
    await g.aforward(0)
    gaps = []
    for _ in range(repeat):
        done = asyncio.Event()
        ticker = asyncio.create_task(_longest_wait(done))
        await asyncio.sleep(0)
        await g.aforward(0)
        done.set()
        gaps.append(await ticker)
    gap = statistics.median(gaps) * 1e3
    log(f"responsive: longest extra wait between ticks {gap:.2f} ms")
    return [
        [
            f"3. ticker beside `aforward` of sync nodes holding threads {HOLD_S * 1e3:.0f} ms",
            f"{gap:.2f} ms",
            "",
            "longest extra wait between 1 ms ticks",
            f"≤ 5 ms: {'met' if gap <= 5 else 'MISSED'}",
        ]
    ]


async def overhead_rows(repeat: int) -> list[list[str]]:
    g = soma.Graph.somatize(AsyncPass() >> AsyncPass() >> AsyncPass())
    nodes = [AsyncPass(), AsyncPass(), AsyncPass()]

    async def awaits(x: Any) -> Any:
        for node in nodes:
            x = await node.forward(x)
        return x

    async def gathered(x: Any) -> Any:
        for node in nodes:
            (x,) = await asyncio.gather(node.forward(x))
        return x

    async def per_call(run: Callable[[], Awaitable[Any]], number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            await run()
        return (time.perf_counter() - start) / number

    number = 2_000
    contenders = {
        "soma": lambda: g.aforward(0),
        "gather": lambda: gathered(0),
        "awaits": lambda: awaits(0),
    }
    for run in contenders.values():
        await per_call(run, number)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, run in contenders.items():
            samples[name].append(await per_call(run, number))
    us = {name: statistics.median(times) * 1e6 for name, times in samples.items()}
    log(", ".join(f"{name} {value:.2f} µs" for name, value in us.items()))
    # A graph forwarded from no loop: on Soma's kept loop, the caller waiting.
    forward_us = statistics.median(
        [_forward_per_call(g, number // 4) for _ in range(max(1, repeat // 2))]
    )
    ratio = us["soma"] / us["gather"]
    return [
        [
            "4. `aforward` of 3 trivial async nodes",
            f"{us['soma']:.2f} µs",
            f"gather-style {us['gather']:.2f} µs",
            f"{ratio:.2f}x",
            f"≤ 3x: {'met' if ratio <= 3 else 'MISSED'}",
        ],
        [
            "   beside the three awaits in one coroutine (no task)",
            "",
            f"{us['awaits']:.2f} µs",
            f"{us['soma'] / us['awaits']:.2f}x",
            "",
        ],
        [
            "   the same graph, `forward` from no loop (Soma's kept loop)",
            f"{forward_us:.2f} µs",
            "",
            "",
            "",
        ],
    ]


def _forward_per_call(g: soma.Graph, number: int) -> float:
    result: list[float] = []

    def timed() -> None:
        start = time.perf_counter()
        for _ in range(number):
            g.forward(0)
        result.append((time.perf_counter() - start) / number * 1e6)

    thread = threading.Thread(target=timed)  # No running loop on it: `forward` may run.
    thread.start()
    thread.join()
    return result[0]


async def rows(repeat: int) -> list[list[str]]:
    return [
        *(await wave_rows(repeat)),
        *(await calls_rows(repeat)),
        *(await responsive_rows(repeat)),
        *(await overhead_rows(repeat)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    repeat = 3 if args.quick else 7
    lines = [
        "## Async nodes",
        "",
        "`aforward` on one event loop (medians of interleaved repeats), beside `asyncio.gather` "
        "of the same awaits or the same awaits written by hand:",
        "",
        *table(["row", "Soma", "floor", "ratio", "target"], asyncio.run(rows(repeat))),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
