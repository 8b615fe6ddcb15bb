"""Async nodes: a graph fans out HTTP requests to a server, all in flight on one event loop.

    Cities >> (Weather("paris") | Weather("tokyo") | ... ) >> Report

The example starts a tiny HTTP server on 127.0.0.1 (the standard library's asyncio, on a port
the system picks) that answers `GET /weather/<city>` with a temperature. Each `Weather` node is
async: it opens a connection, sends the request and awaits the answer, holding no thread while
it waits. The nodes are the branches of one wave, so `aforward` has every request in flight at
once; the server proves it without a clock: it answers only once all the requests have arrived
(a rendezvous with a deadline), so requests sent one after another would fail the run. Then
`amap` streams a few days through the same graph, and `forward` runs it from a thread with no
loop, on the loop Soma keeps.
Run it with `.venv/bin/python examples/fan_out_http.py` after `make demo`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import soma

CITIES = ["paris", "tokyo", "lima", "oslo", "cairo", "perth", "quito", "dakar"]
DEADLINE = 10.0  # seconds the server waits for every request of a fan-out before it gives up

BASE = {"paris": 14, "tokyo": 18, "lima": 19, "oslo": 6, "cairo": 25, "perth": 21, "quito": 13}


class Server:
    """Answers `GET /weather/<city>?day=<n>`; holds each answer until `expected` requests are in
    flight together, and counts the most it saw at once."""

    def __init__(self) -> None:
        self.expected = 1
        self.waiting = 0
        self.most = 0
        self.everyone = asyncio.Event()

    def expect(self, count: int) -> None:
        self.expected, self.waiting, self.most = count, 0, 0
        self.everyone = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = (await reader.readline()).decode()
        while (await reader.readline()) not in (b"\r\n", b""):  # The headers: not needed.
            pass
        path = request.split()[1]
        city, _, day = path.removeprefix("/weather/").partition("?day=")
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        if self.waiting >= self.expected:
            self.everyone.set()
        try:
            await asyncio.wait_for(self.everyone.wait(), DEADLINE)
            body, status = str(BASE.get(city, 10) + int(day or 0)), "200 OK"
        except TimeoutError:
            body, status = "the requests did not overlap", "503 Service Unavailable"
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            f"{body}".encode()
        )
        await writer.drain()
        writer.close()


async def get(port: int, path: str) -> str:
    """A minimal HTTP/1.1 GET: the body, or the error of a status other than 200."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    status = (await reader.readline()).decode().split(" ", 1)[1].strip()
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    body = (await reader.read()).decode()
    writer.close()
    await writer.wait_closed()
    if not status.startswith("200"):
        raise RuntimeError(f"{status}: {body}")
    return body


class Day(soma.Node):
    """The day to ask about: the graph's input."""

    def forward(self, day: int) -> int:
        return day


class Weather(soma.Node):
    """One city's temperature on a day, from the server."""

    def __init__(self, city: str, port: int) -> None:
        self.city = city
        self.port = port

    async def forward(self, day: int) -> int:
        return int(await get(self.port, f"/weather/{self.city}?day={day}"))


class Report(soma.Node):
    """The warmest city, from every city's answer."""

    def forward(self, temperatures: dict[str, int]) -> str:
        city, degrees = max(temperatures.items(), key=lambda item: item[1])
        return f"warmest: {city} at {degrees} C of {len(temperatures)} cities"


def graph(port: int) -> soma.Graph:
    wave = Weather(CITIES[0], port).named(CITIES[0])
    for city in CITIES[1:]:
        wave = wave | Weather(city, port).named(city)
    return soma.Graph.somatize(Day() >> wave >> Report())


async def main() -> None:
    server = Server()
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    g = graph(port)
    print(g.plan().shape())

    server.expect(len(CITIES))
    print(await g.aforward(0))
    print(f"requests in flight at once: {server.most} of {len(CITIES)}")

    # A stream of days, one day at a time: each day's fan-out still meets at the server.
    server.expect(len(CITIES))
    day = 1
    async for report in g.amap([1, 2], in_flight=1):
        server.expect(len(CITIES))
        print(f"day {day}: {report}")
        day += 1

    # `forward` from a thread without a loop: the nodes run on Soma's own loop, while this loop
    # keeps serving.
    server.expect(len(CITIES))
    answer: list[Any] = []
    thread = threading.Thread(target=lambda: answer.append(g.forward(3)))
    thread.start()
    await asyncio.to_thread(thread.join)
    print(f"from forward: {answer[0]}")

    listening.close()
    await listening.wait_closed()


if __name__ == "__main__":
    asyncio.run(main())
