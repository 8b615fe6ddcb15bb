"""Awaiting nodes and a driver: two branches wait on the "network" at the same time.

    Query >> (Fetch("users") | Fetch("orders")) >> Report

Each `Fetch` does not block for its data: it returns `soma.Await([...])`, and the run's driver
answers. The driver here simulates the network: every call to `perform` sleeps for LATENCY
seconds, as a round trip would, and `time.sleep` releases the GIL. The two `Fetch` nodes sit in
two branches of one wave, on two threads, and the one driver serves both at once — so their
waits overlap and the run takes about one latency, not two. The driver proves it without a
clock: it sends a batch only once the other branch's batch is on the wire too (a rendezvous
with a deadline), so were the waits one after another, the first would wait alone and the run
would fail. The script prints the plan, the report, and the time against the two latencies the
same requests would cost in a row.
Run it with `.venv/bin/python examples/awaiting.py` after `make demo`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import soma

LATENCY = 0.2  # seconds per round trip
REPEATS = 3
DEADLINE = 10.0  # seconds a batch waits for the other branch's before the run fails

TABLES: dict[str, dict[str, Any]] = {
    "users": {"ada": "Ada Lovelace", "alan": "Alan Turing"},
    "orders": {"ada": 3, "alan": 5},
}


class Query(soma.Node):
    """The keys every branch looks up."""

    def forward(self, keys: list[str]) -> list[str]:
        return keys


class Fetch(soma.Node):
    """Asks the driver for its table's row of each key, in one batch; then returns the rows."""

    def __init__(self, table: str) -> None:
        self.table = table

    def forward(self, keys: list[str], ctx: soma.Ctx) -> Any:
        if ctx.turn == 0:
            return soma.Await([(self.table, key) for key in keys])
        return dict(zip(keys, ctx.results, strict=True))


class Report(soma.Node):
    def forward(self, fetched: dict[str, dict[str, Any]]) -> list[str]:
        users, orders = fetched["users"], fetched["orders"]
        return [f"{users[key]}: {orders[key]} orders" for key in users]


class NotOverlapped(RuntimeError):
    """The two branches' batches were not on the wire at the same time."""


class SlowNetwork:
    """A driver: one round trip of LATENCY seconds per batch, whoever asks.

    It holds no lock while it waits, so batches from two branches are in flight together; and it
    sends each batch only once the other branch's is there too (a forward asks for two), so
    that a run whose waits do not overlap fails instead of merely taking longer.
    """

    def __init__(self, deadline: float = DEADLINE) -> None:
        self.lock = threading.Lock()
        self.round_trips = 0
        self.both_on_the_wire = threading.Barrier(2, timeout=deadline)

    def perform(self, requests: list[tuple[str, str]]) -> list[Any]:
        try:
            self.both_on_the_wire.wait()
        except threading.BrokenBarrierError:
            raise NotOverlapped(
                "the other branch's batch never reached the driver while this one waited: "
                "the two branches' waits did not overlap"
            ) from None
        time.sleep(LATENCY)  # The wire. Releases the GIL, like a socket would.
        with self.lock:
            self.round_trips += 1
        return [TABLES[table][key] for table, key in requests]


def main() -> None:
    g = soma.Graph.somatize(
        Query() >> (Fetch("users").named("users") | Fetch("orders").named("orders")) >> Report()
    )
    print("plan:")
    print(g.plan())

    network = SlowNetwork()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        report = g.forward(["ada", "alan"], driver=network)
        times.append(time.perf_counter() - start)
    best = min(times)

    for line in report:
        print(" ", line)
    # The time is reported, not asserted: a loaded machine may stretch it. That the waits
    # overlap is proven by the driver's rendezvous, in every forward above.
    print(
        f"{network.round_trips // REPEATS} round trips of {LATENCY:.2f} s each took {best:.2f} s "
        f"(one latency is {LATENCY:.2f} s; two in a row would be {2 * LATENCY:.2f} s)"
    )


if __name__ == "__main__":
    main()
