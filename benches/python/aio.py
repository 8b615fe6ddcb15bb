"""Async nodes: ``aforward`` beside ``asyncio.gather`` and hand-written code, in one run.

    .venv/bin/python benches/python/aio.py [--quick] [--out PATH]

Prints a markdown table (and writes it to PATH). Timings only, never assertions: a missed target
is a row that says so. The rows are issue 27's targets for the one walk (the engine walks every
run, async nodes included):

1. a wave of 10,000 async nodes each awaiting ``asyncio.sleep(0.1)``, against ``asyncio.gather``
   of the same coroutines (the floor, at most 1.2x), and the process's threads it added (none);
   and the same 10,000 sleeps as the items of one ``soma.each`` step of an async node (row 1b);
2. a chain of 100 trivial async nodes through ``aforward``, per node (at most 0.4 µs), beside the
   same coroutines awaited by hand; and ``aforward`` of 3 trivial async nodes against the same
   three awaits in one coroutine (at most 5x), with the ``asyncio.gather`` style beside them;
3. 1,000 ``aforward`` calls in flight on one loop, each of a 3-node graph with one async sleep of
   50 ms (at most 0.25 s in all);
4. the loop's longest wait between ticks of a 1 ms ticker while ``aforward`` runs sync nodes that
   each hold a thread for 50 ms (at most 5 ms); and a chain of 100,000 trivial nodes with every
   hundredth async (awaiting ``asyncio.sleep(0.001)``, a fast network call) through
   ``aforward``, against the same chain all sync through ``forward`` plus the same thousand
   awaits one after another (at most 1.2x).

Each figure is the median of interleaved repeats (a Soma run, then its floor). That ``forward``
of a graph without async nodes is as fast as before is ``versus.py``'s, which times the sync rows
under two builds in one run.

A second table sets LangGraph (``benches/python/requirements.txt`` pins it; ``make bench``
installs it) beside Soma and ``asyncio.gather`` on target 1's shape: a ``Send`` fan-out of 1,000
and of 10,000 nodes each awaiting ``asyncio.sleep(0.1)`` (Soma: a wave of as many async nodes),
and a chain of 100 trivial async nodes, per node (the floor: the same awaits by hand, each
through ``asyncio.gather``). Without LangGraph its column says "not run".

Last, ``amap.py``'s table: ``g.amap`` of 200 requests to a local HTTP server with its defaults
only, beside ``asyncio.gather`` under a ``Semaphore`` and LangGraph's ``abatch``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import operator
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import amap
import soma
from deadline import log, publish, table

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
            f"≤ 1.2x, threads +0: {'met' if ratio <= 1.2 and max(added) == 0 else 'MISSED'}",
        ]
    ]


async def each_rows(repeat: int) -> list[list[str]]:
    """Target 1's shape through one step: ``soma.each`` of an async node over 10,000 items."""
    g = soma.Graph.somatize(soma.each(Sleep(SLEEP_S)))
    items = list(range(WAVE))
    await g.aforward([0])  # Prepared once per version of the graph: not timed.
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
        soma_s.append(await elapsed(lambda: g.aforward(items)))
        watcher.cancel()
        added.append(most - before)
        gather_s.append(
            await elapsed(lambda: asyncio.gather(*(asyncio.sleep(SLEEP_S) for _ in range(WAVE))))
        )
    ours, floor = statistics.median(soma_s), statistics.median(gather_s)
    log(f"each: soma {ours:.3f} s, gather {floor:.3f} s, threads +{max(added)}")
    ratio = ours / floor
    return [
        [
            f"1b. each over {WAVE:,} items of an async sleep of {SLEEP_S} s",
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
                f"3. {CALLS:,} `aforward` calls in flight, {label}",
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
            f"4. ticker beside `aforward` of sync nodes holding threads {HOLD_S * 1e3:.0f} ms",
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
    ratio = us["soma"] / us["awaits"]
    return [
        [
            "2b. `aforward` of 3 trivial async nodes, beside the three awaits in one coroutine",
            f"{us['soma']:.2f} µs",
            f"awaits {us['awaits']:.2f} µs",
            f"{ratio:.2f}x",
            f"≤ 5x: {'met' if ratio <= 5 else 'MISSED'}",
        ],
        [
            "   beside the same awaits in the `asyncio.gather` style",
            "",
            f"gather-style {us['gather']:.2f} µs",
            f"{us['soma'] / us['gather']:.2f}x",
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


async def chain_rows(repeat: int) -> list[list[str]]:
    """Target 2: a chain of ``CHAIN`` trivial async nodes, per node, beside the same awaits."""
    nodes = [AsyncPass() for _ in range(CHAIN)]
    expr: Any = nodes[0]
    for node in nodes[1:]:
        expr = expr >> node
    g = soma.Graph.somatize(expr)

    async def awaits(x: Any) -> Any:
        for node in nodes:
            x = await node.forward(x)
        return x

    async def per_node(run: Callable[[], Awaitable[Any]], number: int) -> float:
        start = time.perf_counter()
        for _ in range(number):
            await run()
        return (time.perf_counter() - start) / number / CHAIN * 1e6

    number = 200
    await per_node(lambda: g.aforward(0), number)  # warm-up
    ours, floor = [], []
    for _ in range(repeat):
        ours.append(await per_node(lambda: g.aforward(0), number))
        floor.append(await per_node(lambda: awaits(0), number))
    soma_us, floor_us = statistics.median(ours), statistics.median(floor)
    log(f"chain of {CHAIN} async nodes: {soma_us:.3f} µs a node, awaits {floor_us:.3f} µs")
    return [
        [
            f"2. a chain of {CHAIN} trivial async nodes through `aforward`, a node",
            f"{soma_us:.3f} µs",
            f"awaits {floor_us:.3f} µs",
            f"{soma_us / floor_us:.1f}x",
            f"≤ 0.4 µs: {'met' if soma_us <= 0.4 else 'MISSED'}",
        ]
    ]


MIXED = 100_000
EVERY = 100
MIXED_SLEEP_S = 0.001


class AwaitsBriefly(soma.Node):
    """An async node waiting about a millisecond, as a fast network call does."""

    async def forward(self, x: Any) -> Any:
        await asyncio.sleep(MIXED_SLEEP_S)
        return x


async def mixed_rows(repeat: int) -> list[list[str]]:
    """Target 4b: a long chain, every ``EVERY``-th node async, against the same chain all sync
    plus the awaits its async nodes make."""
    mixed, sync = soma.Graph(), soma.Graph()
    for at in range(MIXED):
        mixed.node(f"n{at}", AwaitsBriefly() if at % EVERY == EVERY - 1 else _SyncPass())
        sync.node(f"n{at}", _SyncPass())
        if at:
            mixed.edge(f"n{at - 1}", f"n{at}")
            sync.edge(f"n{at - 1}", f"n{at}")
    await mixed.aforward(0)
    sync_forward = _on_a_thread(lambda: sync.forward(0))

    async def awaits() -> None:
        for _ in range(MIXED // EVERY):
            await asyncio.sleep(MIXED_SLEEP_S)

    ours, floor = [], []
    for _ in range(max(1, repeat // 2)):
        ours.append(await elapsed(lambda: mixed.aforward(0)))
        floor.append(sync_forward() + await elapsed(awaits))
    soma_s, floor_s = statistics.median(ours), statistics.median(floor)
    log(f"mixed chain: soma {soma_s:.3f} s, sync chain plus its awaits {floor_s:.3f} s")
    return [
        [
            f"4b. a chain of {MIXED:,} nodes, every {EVERY}th async (a {MIXED_SLEEP_S * 1e3:.0f} ms"
            " await)",
            f"{soma_s:.3f} s",
            f"all sync plus the awaits {floor_s:.3f} s",
            f"{soma_s / floor_s:.2f}x",
            f"≤ 1.2x: {'met' if soma_s / floor_s <= 1.2 else 'MISSED'}",
        ]
    ]


def _on_a_thread(run: Callable[[], Any]) -> Callable[[], float]:
    """``run``'s seconds, timed on a thread with no running loop (where ``forward`` may run)."""

    def timed() -> float:
        result: list[float] = []

        def body() -> None:
            start = time.perf_counter()
            run()
            result.append(time.perf_counter() - start)

        thread = threading.Thread(target=body)
        thread.start()
        thread.join()
        return result[0]

    timed()  # warm-up
    return timed


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


# ---------------------------------------------------------------------------------------------
# LangGraph beside Soma

FAN_OUTS = (1_000, 10_000)
CHAIN = 100


class AsyncIncrement(soma.Node):
    async def forward(self, x: int) -> int:
        return x + 1


class _Fan(TypedDict):
    n: int
    done: Annotated[int, operator.add]


class _Chain(TypedDict):
    x: int


def langgraph_graphs() -> tuple[Any, Any] | str:
    """LangGraph's fan-out and chain, compiled; or why it cannot run."""
    try:
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send
    except ImportError:
        return "not run: langgraph is not installed (`make bench` installs it)"

    async def sleeper(state: dict[str, Any]) -> dict[str, int]:
        await asyncio.sleep(SLEEP_S)
        return {"done": 1}

    def fan(state: _Fan) -> list[Any]:
        return [Send("sleeper", {"i": i}) for i in range(state["n"])]

    fan_out = StateGraph(_Fan)
    fan_out.add_node("sleeper", sleeper)
    fan_out.add_conditional_edges(START, fan, ["sleeper"])
    fan_out.add_edge("sleeper", END)

    async def increment(state: _Chain) -> dict[str, int]:
        return {"x": state["x"] + 1}

    chain = StateGraph(_Chain)
    before = START
    for i in range(CHAIN):
        chain.add_node(f"n{i}", increment)
        chain.add_edge(before, f"n{i}")
        before = f"n{i}"
    chain.add_edge(before, END)
    return fan_out.compile(), chain.compile()


async def peer_rows(repeat: int) -> tuple[str, list[list[str]]]:
    """The peer table's header for LangGraph, and its rows."""
    graphs = langgraph_graphs()
    fan_out: Any = None
    chain: Any = None
    if isinstance(graphs, str):
        peer, why = "LangGraph", graphs
    else:
        peer, why = f"LangGraph {importlib.metadata.version('langgraph')}", ""
        fan_out, chain = graphs
    rows = []
    for width in FAN_OUTS:
        g = wave_graph(width)
        await g.aforward(0)
        # LangGraph's 10,000 take seconds each: fewer repeats of the widest.
        times = max(1, repeat // 3) if width > 1_000 else repeat
        soma_s, peer_s, gather_s = [], [], []
        for _ in range(times):
            soma_s.append(await elapsed(lambda g=g: g.aforward(0)))
            if not why:
                peer_s.append(
                    await elapsed(lambda width=width: fan_out.ainvoke({"n": width, "done": 0}))
                )
            gather_s.append(
                await elapsed(
                    lambda width=width: asyncio.gather(
                        *(asyncio.sleep(SLEEP_S) for _ in range(width))
                    )
                )
            )
        ours, floor = statistics.median(soma_s), statistics.median(gather_s)
        theirs = statistics.median(peer_s) if peer_s else None
        log(f"fan-out {width}: soma {ours:.3f} s, {peer} {theirs}, gather {floor:.3f} s")
        rows.append(
            [
                f"1. fan-out of {width:,} async sleeps of {SLEEP_S} s",
                f"{ours:.3f} s",
                why or f"{theirs:.3f} s",
                f"{floor:.3f} s",
                "" if theirs is None else f"{theirs / ours:.1f}x",
            ]
        )
    g = soma.Graph.somatize(_chain_expr())
    await g.aforward(0)
    nodes = [AsyncIncrement() for _ in range(CHAIN)]

    async def gathered(x: int) -> int:
        for node in nodes:
            (x,) = await asyncio.gather(node.forward(x))
        return x

    number = 50
    contenders: dict[str, Callable[[], Awaitable[Any]]] = {
        "soma": lambda: g.aforward(0),
        "gather": lambda: gathered(0),
    }
    if not why:
        contenders["peer"] = lambda: chain.ainvoke({"x": 0}, {"recursion_limit": CHAIN + 10})
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for name, run in contenders.items():  # Warm-up, and the same answer from each.
        out = await run()
        assert (out["x"] if isinstance(out, dict) else out) == CHAIN, (name, out)
    for _ in range(repeat):
        for name, run in contenders.items():
            start = time.perf_counter()
            for _ in range(number):
                await run()
            samples[name].append((time.perf_counter() - start) / number / CHAIN)
    us = {name: statistics.median(times) * 1e6 for name, times in samples.items()}
    log("chain per node: " + ", ".join(f"{name} {value:.2f} µs" for name, value in us.items()))
    rows.append(
        [
            f"chain of {CHAIN} trivial async nodes, per node",
            f"{us['soma']:.2f} µs",
            why or f"{us['peer']:.1f} µs",
            f"gather-style {us['gather']:.2f} µs",
            "" if why else f"{us['peer'] / us['soma']:.1f}x",
        ]
    )
    return peer, rows


def _chain_expr() -> Any:
    expr: Any = AsyncIncrement()
    for _ in range(CHAIN - 1):
        expr = expr >> AsyncIncrement()
    return expr


async def rows(repeat: int) -> list[list[str]]:
    return [
        *(await wave_rows(repeat)),
        *(await each_rows(repeat)),
        *(await calls_rows(repeat)),
        *(await chain_rows(repeat)),
        *(await overhead_rows(repeat)),
        *(await responsive_rows(repeat)),
        *(await mixed_rows(repeat)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    repeat = 3 if args.quick else 7
    ours = asyncio.run(rows(repeat))
    # After Soma's own rows: LangGraph's 10,000-node runs leave the collector much to walk.
    peer, peers = asyncio.run(peer_rows(repeat))
    # `g.amap` of requests to a local server beside gather and LangGraph's abatch (amap.py).
    requests = amap.lines(5 if args.quick else 15)
    lines = [
        "## Async nodes",
        "",
        "`aforward` on one event loop (medians of interleaved repeats), beside `asyncio.gather` "
        "of the same awaits or the same awaits written by hand:",
        "",
        *table(["row", "Soma", "floor", "ratio", "target"], ours),
        "",
        f"Beside {peer}, on an event loop of their own (medians of interleaved repeats; "
        "LangGraph's fan-out is a `Send` per node, Soma's a wave of async nodes):",
        "",
        *table(["row", "Soma", peer, "asyncio.gather", f"{peer} / Soma"], peers),
        "",
        *requests,
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
