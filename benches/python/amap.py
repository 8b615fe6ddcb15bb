"""``g.amap`` of HTTP requests, with its defaults only, beside ``asyncio.gather`` under a
``Semaphore`` and LangGraph's ``abatch``: issue 41's target for a stream of async nodes.

    .venv/bin/python benches/python/amap.py [--quick] [--out PATH]

Prints a markdown table (and writes it to PATH); ``aio.py`` appends the same table to its own, so
``make bench`` runs it. Timings only, never assertions: a missed target is a row that says so.

The workload is what a new user writes for an LLM pipeline: 200 requests to a local HTTP server
(a raw asyncio server of the standard library on 127.0.0.1, in a process of its own, answering
each request after a 20 ms pause), at most 64 in flight. Each request is one
connection, made by the standard library's asyncio streams, the same coroutine for every
contender:

- Soma: a graph of one async node awaiting the request, ``g.amap(range(200), in_flight=64)``,
  defaults only (no ``.concurrency()``);
- the floor: ``asyncio.gather`` of the 200 requests, each under one ``asyncio.Semaphore(64)``;
- LangGraph (``benches/python/requirements.txt`` pins it): a graph of one async node,
  ``abatch`` of the 200 inputs with ``max_concurrency=64``. Without LangGraph its cell says "not
  run".

Each figure is the median of interleaved repeats, each run after a garbage collection. Target:
Soma at most 1.1x the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.metadata
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any, TypedDict

import soma
from deadline import log, publish, table

REQUESTS = 200
IN_FLIGHT = 64
DELAY_S = 0.02
TARGET = 1.1


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request: its head read, a pause of ``DELAY_S``, then the path echoed back."""
    head = await reader.readuntil(b"\r\n\r\n")
    path = head.split(b" ", 2)[1]
    await asyncio.sleep(DELAY_S)
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(path), path)
    )
    await writer.drain()
    writer.close()


def _serve(port_to: Connection, stop: EventType) -> None:
    """The server's process: serves on 127.0.0.1 until ``stop`` is set, its port sent first."""

    async def main() -> None:
        server = await asyncio.start_server(_answer, "127.0.0.1", 0, backlog=1024)
        port_to.send(server.sockets[0].getsockname()[1])
        async with server:
            while not stop.is_set():
                await asyncio.sleep(0.05)

    asyncio.run(main())


@contextmanager
def serving() -> Iterator[int]:
    """An HTTP server on 127.0.0.1, in a process of its own (as a server is: its work never
    takes the client's GIL): its port."""
    receive, send = multiprocessing.Pipe(duplex=False)
    stop = multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(send, stop), daemon=True)
    server.start()
    try:
        if not receive.poll(30):
            raise RuntimeError("the HTTP server did not start")
        yield receive.recv()
    finally:
        stop.set()
        server.join(10)


async def request(port: int, i: int) -> bytes:
    """``GET /i`` on a connection of its own: the answer's body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /%d HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" % i)
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer.split(b"\r\n\r\n", 1)[1]


class Request(soma.Node):
    """An async node awaiting one request: what a node calling an LLM's API is."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def forward(self, i: int) -> bytes:
        return await request(self.port, i)


class _Item(TypedDict, total=False):
    i: int
    body: bytes


def langgraph_batch(port: int) -> Callable[[], Awaitable[Any]] | str:
    """LangGraph's ``abatch`` of the requests; or why it cannot run."""
    try:
        from langgraph.graph import END, START, StateGraph
    except ImportError:
        return "not run: langgraph is not installed (`make bench` installs it)"

    async def fetch(state: _Item) -> dict[str, bytes]:
        return {"body": await request(port, state["i"])}

    graph = StateGraph(_Item)
    graph.add_node("fetch", fetch)
    graph.add_edge(START, "fetch")
    graph.add_edge("fetch", END)
    compiled = graph.compile()
    inputs = [{"i": i} for i in range(REQUESTS)]

    async def batch() -> list[bytes]:
        out = await compiled.abatch(inputs, {"max_concurrency": IN_FLIGHT})
        return [state["body"] for state in out]

    return batch


async def _rows(port: int, repeat: int) -> tuple[str, list[str]]:
    g = soma.Graph.somatize(Request(port))

    async def amap() -> list[bytes]:
        return [body async for body in g.amap(range(REQUESTS), in_flight=IN_FLIGHT)]

    async def gather() -> list[bytes]:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(i: int) -> bytes:
            async with gate:
                return await request(port, i)

        return await asyncio.gather(*(one(i) for i in range(REQUESTS)))

    contenders: dict[str, Callable[[], Awaitable[Any]]] = {"soma": amap, "gather": gather}
    peer = langgraph_batch(port)
    if isinstance(peer, str):
        name, why = "LangGraph", peer
    else:
        name, why = f"LangGraph {importlib.metadata.version('langgraph')}", ""
        contenders["peer"] = peer
    expected = [b"/%d" % i for i in range(REQUESTS)]
    for who, run in contenders.items():  # Warm-up, and the same answers from each.
        assert await run() == expected, who
    samples: dict[str, list[float]] = {who: [] for who in contenders}
    for _ in range(repeat):
        for who, run in contenders.items():
            # Each starts with no garbage of the one before (LangGraph's run leaves much).
            gc.collect()
            start = time.perf_counter()
            await run()
            samples[who].append(time.perf_counter() - start)
    s = {who: statistics.median(times) for who, times in samples.items()}
    log("amap: " + ", ".join(f"{who} {value * 1e3:.1f} ms" for who, value in s.items()))
    ratio = s["soma"] / s["gather"]
    return name, [
        f"`g.amap` of {REQUESTS} requests ({DELAY_S * 1e3:.0f} ms each), in_flight={IN_FLIGHT}, "
        "defaults only",
        f"{s['soma'] * 1e3:.1f} ms",
        f"{s['gather'] * 1e3:.1f} ms",
        why or f"{s['peer'] * 1e3:.1f} ms",
        f"{ratio:.2f}x",
        f"≤ {TARGET}x gather: {'met' if ratio <= TARGET else 'MISSED'}",
    ]


def lines(repeat: int) -> list[str]:
    """The table's markdown lines, measured now."""
    with serving() as port:
        peer, row = asyncio.run(_rows(port, repeat))
    return [
        "## amap against gather",
        "",
        f"Requests to a local HTTP server (medians of {repeat} interleaved repeats; each contender "
        f"at most {IN_FLIGHT} in flight: Soma by `in_flight`, gather by a `Semaphore`, "
        f"{peer} by `max_concurrency`):",
        "",
        *table(
            [
                "row",
                "Soma",
                "asyncio.gather + Semaphore",
                f"{peer} abatch",
                "Soma / gather",
                "target",
            ],
            [row],
        ),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    publish(lines(5 if args.quick else 15), args.out)


if __name__ == "__main__":
    main()
