"""Steps that decide as they run: what ``each``, ``switch`` and ``loop`` cost beyond their nodes.

    .venv/bin/python benches/python/decide.py [--quick] [--out PATH]

Prints a markdown table (and writes it to PATH). Timings only, never assertions; each graph's
result is checked once, untimed. The rows, each against its target (issue 24):

- ``each`` over 10,000 items of a chain of 3 trivial Python nodes, per item, beside a forward of
  that chain (target: at most 2x), and the threads the graph held after it (target: at most 8);
- ``each`` over 1,000 items of a node sleeping 10 ms with ``in_flight=100``, beside the bound of
  10 rounds of 10 ms (target: at most 1.2x), ``ThreadPoolExecutor(100).map`` of the same sleep,
  LangGraph's ``Send`` to 1,000 sync nodes sleeping 10 ms with ``max_concurrency=100``, and
  Hamilton's ``Parallelizable``/``Collect`` over the same sleep with its multithreading executor
  at 100 tasks (both installed by ``make bench`` from requirements.txt; a row says "not run"
  without its peer);
- a ``switch`` step, and one ``loop`` iteration, beside a chain of the same nodes (the selector
  or the predicate as a node of its own): what the step costs beyond them (target: 2 µs);
- ``each`` over 10,000 items of a node that takes a lock every item shares — a logger's handler
  (writing to a buffer), a module-level ``threading.Lock`` — with every item in flight and with
  ``in_flight=1``, beside a plain loop and ``ThreadPoolExecutor(8).map`` of the same function,
  and the OS threads the process had after each (no target: threads that take turns at a lock
  and at the GIL queue behind one another, which the guide tells a user to bound).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import logging
import operator
import os
import sys
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

import soma
from deadline import Pass, log, publish, table
from timing import compare

ITEMS = 10_000
SLEEPERS = 1_000
SLEEP_S = 0.010
IN_FLIGHT = 100
ITERATIONS = 10


class Sleep(soma.Node):
    def forward(self, x: Any) -> Any:
        time.sleep(SLEEP_S)
        return x


def sleep(x: Any) -> Any:
    time.sleep(SLEEP_S)
    return x


class Select(soma.Node):
    """What a switch's selector does, as a node of a chain."""

    def forward(self, x: Any) -> str:
        return "a"


class Done(soma.Node):
    """What a loop's predicate does, as a node of a chain."""

    def forward(self, x: Any) -> bool:
        return True


class _Fan(TypedDict):
    n: int
    done: Annotated[int, operator.add]


def langgraph_fan_out() -> Any:
    """LangGraph's ``Send`` to a sync node sleeping 10 ms, once per item; or why it cannot run."""
    try:
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send
    except ImportError:
        return "not run: langgraph is not installed (`make bench` installs it)"

    def sleeper(state: dict[str, Any]) -> dict[str, int]:
        time.sleep(SLEEP_S)
        return {"done": 1}

    def fan(state: _Fan) -> list[Any]:
        return [Send("sleeper", {"i": i}) for i in range(state["n"])]

    fan_out = StateGraph(_Fan)
    fan_out.add_node("sleeper", sleeper)
    fan_out.add_conditional_edges(START, fan, ["sleeper"])
    fan_out.add_edge("sleeper", END)
    return fan_out.compile()


def hamilton_fan_out() -> Any:
    """Hamilton's ``Parallelizable``/``Collect`` of a function sleeping 10 ms, run by its
    multithreading executor at ``IN_FLIGHT`` tasks: a driver whose ``execute`` gives the count
    of items done; or why it cannot run."""
    os.environ.setdefault("HAMILTON_TELEMETRY_ENABLED", "false")  # Nothing leaves the machine.
    try:
        from hamilton import driver
        from hamilton.execution import executors
        from hamilton.htypes import Collect, Parallelizable
    except ImportError:
        return "not run: hamilton is not installed (`make bench` installs it)"

    # Hamilton reads its functions off a module: one made here, holding the three.
    module = types.ModuleType("soma_bench_hamilton")

    def item(n: int) -> Parallelizable[int]:
        yield from range(n)

    def slept(item: int) -> int:
        time.sleep(SLEEP_S)
        return item

    def total(slept: Collect[int]) -> int:
        return len(list(slept))

    # Hamilton reads types from annotations, which this file's `from __future__ import
    # annotations` leaves as text it cannot resolve here: given as the types themselves.
    item.__annotations__ = {"n": int, "return": Parallelizable[int]}
    slept.__annotations__ = {"item": int, "return": int}
    total.__annotations__ = {"slept": Collect[int], "return": int}
    for function in (item, slept, total):
        function.__module__ = module.__name__
        setattr(module, function.__name__, function)
    sys.modules[module.__name__] = module
    return (
        driver.Builder()
        .with_modules(module)
        .enable_dynamic_execution(allow_experimental_mode=True)
        .with_local_executor(executors.SynchronousLocalTaskExecutor())
        .with_remote_executor(executors.MultiThreadingExecutor(max_tasks=IN_FLIGHT))
        .build()
    )


def chain() -> soma.Expr:
    return Pass() >> Pass() >> Pass()


def items_rows(repeat: int) -> list[list[str]]:
    body = soma.Graph.somatize(chain())
    mapped = soma.Graph.somatize(soma.each(chain()))
    items = list(range(ITEMS))
    assert mapped.forward(items) == items  # Checked, not timed.
    timings = compare(
        {"body": lambda: body.forward(1), "each": lambda: mapped.forward(items)},
        repeat=repeat,
        sample_s=0.2,
        warmup_s=0.1,
    )
    forward_us = timings["body"].median_s * 1e6
    item_us = timings["each"].median_s * 1e6 / ITEMS
    log(f"each: {item_us:.2f} µs an item, forward {forward_us:.2f} µs, {mapped.threads()} threads")
    return [
        [
            f"`each` over {ITEMS:,} items, chain of 3 each",
            f"{item_us:.2f} µs an item",
            f"forward of the chain: {forward_us:.2f} µs",
            f"{item_us / forward_us:.2f}x (target ≤ 2x)",
        ],
        [
            "threads the graph held after it",
            f"{mapped.threads()}",
            "",
            "target ≤ 8",
        ],
    ]


def sleepers_rows(repeat: int) -> list[list[str]]:
    mapped = soma.Graph.somatize(soma.each(Sleep(), in_flight=IN_FLIGHT))
    items = list(range(SLEEPERS))
    pool = ThreadPoolExecutor(IN_FLIGHT)
    contenders = {
        "each": lambda: mapped.forward(items),
        "pool": lambda: list(pool.map(sleep, items)),
    }
    peer = langgraph_fan_out()
    if not isinstance(peer, str):
        limit = {"max_concurrency": IN_FLIGHT}
        assert peer.invoke({"n": 10, "done": 0}, config=limit)["done"] == 10
        contenders["langgraph"] = lambda: peer.invoke({"n": SLEEPERS, "done": 0}, config=limit)
    hamilton = hamilton_fan_out()
    if not isinstance(hamilton, str):
        assert hamilton.execute(["total"], inputs={"n": 10})["total"] == 10
        contenders["hamilton"] = lambda: hamilton.execute(["total"], inputs={"n": SLEEPERS})
    timings = compare(contenders, repeat=repeat, sample_s=0.05, warmup_s=0.0)
    pool.shutdown()
    bound = SLEEPERS / IN_FLIGHT * SLEEP_S
    each_s, pool_s = timings["each"].median_s, timings["pool"].median_s
    log(f"sleepers: each {each_s:.3f} s, pool {pool_s:.3f} s, bound {bound:.3f} s")
    return [
        [
            f"`each` over {SLEEPERS:,} items sleeping 10 ms, in_flight={IN_FLIGHT}",
            f"{each_s * 1e3:.1f} ms",
            f"bound {bound * 1e3:.0f} ms",
            f"{each_s / bound:.2f}x (target ≤ 1.2x)",
        ],
        [
            f"`ThreadPoolExecutor({IN_FLIGHT}).map` of the sleep",
            f"{pool_s * 1e3:.1f} ms",
            f"bound {bound * 1e3:.0f} ms",
            f"{pool_s / bound:.2f}x",
        ],
        langgraph_row(peer, timings, bound),
        hamilton_row(hamilton, timings, bound),
    ]


def hamilton_row(peer: Any, timings: dict[str, Any], bound: float) -> list[str]:
    """Hamilton's row of the sleepers, or the row that says why it did not run."""
    label = (
        f"Hamilton `Parallelizable`/`Collect` over {SLEEPERS:,} sleeping items, "
        f"multithreading executor at {IN_FLIGHT} tasks"
    )
    if isinstance(peer, str):
        return [label, peer, "", ""]
    seconds = timings["hamilton"].median_s
    log(f"sleepers: hamilton {seconds:.3f} s")
    return [
        f"{label} ({importlib.metadata.version('sf-hamilton')})",
        f"{seconds * 1e3:.1f} ms",
        f"bound {bound * 1e3:.0f} ms",
        f"{seconds / bound:.2f}x",
    ]


def langgraph_row(peer: Any, timings: dict[str, Any], bound: float) -> list[str]:
    """LangGraph's row of the sleepers, or the row that says why it did not run."""
    label = f"LangGraph `Send` to {SLEEPERS:,} sync sleeping nodes, max_concurrency={IN_FLIGHT}"
    if isinstance(peer, str):
        return [label, peer, "", ""]
    seconds = timings["langgraph"].median_s
    log(f"sleepers: langgraph {seconds:.3f} s")
    return [
        f"{label} ({importlib.metadata.version('langgraph')})",
        f"{seconds * 1e3:.1f} ms",
        f"bound {bound * 1e3:.0f} ms",
        f"{seconds / bound:.2f}x",
    ]


def step_rows(repeat: int) -> list[list[str]]:
    switched = soma.Graph.somatize(soma.switch(lambda x: "a", {"a": Pass()}))
    by_hand = soma.Graph.somatize(Select() >> Pass())
    looped = soma.Graph.somatize(
        soma.loop(Pass(), until=lambda x: False, max_iterations=ITERATIONS)
    )
    unrolled = Pass() >> Done()
    for _ in range(ITERATIONS - 1):
        unrolled = unrolled >> Pass() >> Done()
    chained = soma.Graph.somatize(unrolled)

    def loop_once() -> None:
        # Runs all its iterations, then fails at its bound, as it is told to.
        with contextlib.suppress(soma.RunError):
            looped.forward(1)

    assert switched.forward(1) == 1
    timings = compare(
        {
            "switch": lambda: switched.forward(1),
            "select": lambda: by_hand.forward(1),
            "loop": loop_once,
            "chain": lambda: chained.forward(1),
        },
        repeat=repeat,
        sample_s=0.05,
        warmup_s=0.05,
    )
    us = {name: timing.median_s * 1e6 for name, timing in timings.items()}
    switch_step = us["switch"] - us["select"]
    iteration = (us["loop"] - us["chain"]) / ITERATIONS
    log(f"switch step {switch_step:.2f} µs, loop iteration {iteration:.2f} µs")
    return [
        [
            "a `switch` step (selector and one case of 1 node)",
            f"{us['switch']:.2f} µs",
            f"the 2 nodes chained: {us['select']:.2f} µs",
            f"{switch_step:+.2f} µs a step (target ≤ 2 µs)",
        ],
        [
            f"a `loop` of {ITERATIONS} iterations (body 1 node, predicate)",
            f"{us['loop']:.2f} µs",
            f"the {2 * ITERATIONS} nodes chained: {us['chain']:.2f} µs",
            f"{iteration:+.2f} µs an iteration (target ≤ 2 µs)",
        ],
    ]


SHARED_LOCK = threading.Lock()
SHARED_TOTAL = [0]
LOGGER = logging.getLogger("soma.bench.decide")


def logs(x: int) -> int:
    LOGGER.info("item %s", x)
    return x


def locks(x: int) -> int:
    with SHARED_LOCK:
        SHARED_TOTAL[0] += x
    return x


def os_threads() -> str:
    tasks = Path("/proc/self/task")
    return str(len(list(tasks.iterdir()))) if tasks.exists() else ""


def shared_lock_rows(repeat: int) -> list[list[str]]:
    """An `each` of items that share a lock, all in flight and one at a time, beside a loop
    and a thread pool; each timed `repeat` times (the best and the worst: threads that queue
    behind one another at a lock do so in some runs and not others), the OS threads counted
    after."""
    LOGGER.addHandler(logging.StreamHandler(io.StringIO()))
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
    items = list(range(ITEMS))
    rows = []
    for name, function in (("logs each item", logs), ("takes a module-level lock", locks)):
        ran: dict[str, tuple[float, float, str]] = {}
        contenders: dict[str, Any] = {
            "each, every item in flight": soma.Graph.somatize(
                soma.each(soma.node(function).named("body"))
            ).forward,
            "each, in_flight=1": soma.Graph.somatize(
                soma.each(soma.node(function).named("body"), in_flight=1)
            ).forward,
            "a loop": lambda items, function=function: [function(x) for x in items],
        }
        with ThreadPoolExecutor(8) as pool:
            contenders["ThreadPoolExecutor(8).map"] = lambda items, function=function: list(
                pool.map(function, items)
            )
            for contender, run in contenders.items():
                assert run(items) == items  # Checked, not timed.
                took = []
                for _ in range(repeat):
                    start = time.perf_counter()
                    run(items)
                    took.append(time.perf_counter() - start)
                ran[contender] = (min(took), max(took), os_threads())
        loop = ran["a loop"][0]
        for contender, (best, worst, threads) in ran.items():
            rows.append(
                [
                    f"`each` over {ITEMS:,} items whose node {name}: {contender}",
                    f"best {best * 1e3:.1f} ms, worst {worst * 1e3:.1f} ms",
                    f"OS threads after: {threads}",
                    f"best {best / loop:.1f}x, worst {worst / loop:.1f}x the loop's best",
                ]
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    repeat = 3 if args.quick else 9
    rows = [
        *items_rows(repeat),
        *sleepers_rows(repeat),
        *step_rows(repeat),
        *shared_lock_rows(repeat),
    ]
    lines = [
        "## Steps that decide as they run",
        "",
        "Medians of interleaved samples; each row beside what it is measured against:",
        "",
        *table(["what", "time", "beside", "ratio"], rows),
        "",
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
