"""A trace's tracks are named after their threads — the caller's, the crew's, the event loop's —
never after the first branch that ran there; its summary's share is each node's part of the
node-seconds (the nodes' shares add up to 100%), and a step's items make one row."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import soma
from conftest import DEADLINE


class Meet(soma.Node):
    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier

    def forward(self, x: Any) -> Any:
        self.barrier.wait(DEADLINE)
        return x


class Later(soma.Node):
    async def forward(self, x: Any) -> Any:
        await asyncio.sleep(0)
        return x


def track_names(trace: soma.Trace) -> dict[int, str]:
    events = json.loads(trace.to_chrome())["traceEvents"]
    return {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}


def test_tracks_are_named_by_thread_the_caller_the_crew_and_the_event_loop() -> None:
    barrier = threading.Barrier(3)
    wave = Meet(barrier).named("a") | Meet(barrier).named("b") | Meet(barrier).named("c")
    trace = soma.Trace()
    soma.Graph.somatize(wave).forward(1, trace=trace)
    # With an async node, `forward` runs the graph on the loop Soma keeps.
    soma.Graph.somatize(Later().named("d")).forward(1, trace=trace)
    names = track_names(trace)
    by_node = {span.node: span.thread for span in trace.spans}
    caller = soma.Trace._thread()
    assert names[caller] == f"thread {caller} (caller)"
    crew = {names[by_node[n]] for n in "abc" if by_node[n] != caller}
    assert len(crew) == 2
    assert all(re.fullmatch(r"crew thread \d+", name) for name in crew)
    assert re.fullmatch(r"event loop \(thread \d+\)", names[by_node["d"]])
    assert not any(name.startswith("branch") for name in names.values())


def test_a_thread_that_ran_an_async_task_and_then_a_sync_node_keeps_its_callers_track() -> None:
    async def main() -> None:
        await soma.Graph.somatize(Later().named("d")).aforward(1, trace=trace)

    trace = soma.Trace()
    asyncio.run(main())  # This thread is the loop's while the task is polled...
    soma.Graph.somatize(Meet(threading.Barrier(1)).named("s")).forward(1, trace=trace)
    here = soma.Trace._thread()
    # ... and its track was named by its first span, the async node's, on this thread.
    assert track_names(trace)[here] == f"event loop (thread {here})"
    other = soma.Trace()
    soma.Graph.somatize(Meet(threading.Barrier(1)).named("s")).forward(1, trace=other)
    assert track_names(other)[here] == f"thread {here} (caller)"


def shares(summary: str) -> dict[str, str]:
    rows = [line.split() for line in summary.splitlines()[1:] if not line.startswith("...")]
    return {row[0]: row[-1] for row in rows}


def test_the_summarys_shares_of_the_nodes_add_up_to_a_hundred_percent_in_a_wave() -> None:
    barrier = threading.Barrier(4)
    g = soma.Graph.somatize(
        Meet(barrier).named("a")
        | Meet(barrier).named("b")
        | Meet(barrier).named("c")
        | Meet(barrier).named("d")
    )
    trace = soma.Trace()
    g.forward(1, trace=trace)
    found = shares(trace.summary())
    assert set(found) == set("abcd")
    percents = [float(share.rstrip("%")) for share in found.values()]
    assert all(0 <= p <= 100 for p in percents)
    assert abs(sum(percents) - 100) < 0.5


def test_the_summary_gives_a_steps_items_one_row_and_leaves_room_for_the_nodes() -> None:
    g = soma.Graph.somatize(soma.each(Later().named("embed")).named("chunks") >> Later())
    trace = soma.Trace()
    g.forward(list(range(50)), trace=trace)
    found = shares(trace.summary(top=10))
    assert found["chunks[…]"] == "-"
    assert {"chunks/embed", "later"} <= set(found)
    row = next(line for line in trace.summary().splitlines() if line.startswith("chunks[…]"))
    assert row.split()[3] == "50"  # runs
