"""Slices on hosts: a graph's slices run on a local Ray cluster against Ray's own calls.

    .venv/bin/python benches/python/remote.py [--repeat N] [--out PATH]

Starts a local cluster (a head, and a Ray node per host offering ``soma-host:<name>``), prints
a markdown table (and writes it to PATH), and shuts the cluster down. Timings only, never
assertions on time; the targets of the hosts issue are stated beside each figure. Every timed
call's result is checked against the expected one, outside the timed region: a figure of a run
that computed something else is no figure.

1. **Round trip.** A slice of one trivial node (median of ``forward``) against a bare call of a
   Ray actor method with the same payload (target: at most 1.5x). A slice of 100 trivial nodes
   on one host against one round trip plus the local cost of 100 nodes (target: about that, not
   100 round trips), beside 100 ordinary actor calls and Ray's compiled graph of the same chain
   on one actor, when it compiles here.
2. **Two hosts at once.** Two branches of 100 ms that release the GIL, on two hosts, against the
   same two nodes in series on one host (target: at least 1.8x).
3. **No second copy** of a 200 MB array sent to a slice on the same node: how much the peak
   resident memory (``VmHWM``, reset through ``/proc/<pid>/clear_refs`` before each call) of
   the driver and of the host's worker process grows over one call that sums the array, through
   a Soma slice against a bare actor method on the same Ray node (target: the slice's growth at
   most the bare call's plus 20 MB, a tenth of the array, in each process). Object-store pages
   a process touches count in its resident memory, so each side shows one copy of the array.

4. **The edit check.** Before each run of a slice, its nodes' fingerprints are compared with
   those they had when it was sent (a node edited since is sent again): what that check costs a
   run whose slice is unchanged (median, timed inside each run, nothing sent), for a slice of 5
   nodes holding numbers (fingerprints remembered: target, at most 5% of the bare actor call),
   of 5 nodes each holding a list of 100 numbers, and of one node holding an 8 MB numpy array
   (both digested on every run: figures, no target).

5. **A deadline on a host.** ``forward(1, timeout=0.2)`` of a graph whose slice on a host is
   stuck forever (``threading.Event().wait()``): how long past its deadline the
   ``TimeoutError`` comes out, median and worst of the runs (target: within 100 ms). Each run
   leaves a thread stuck on the host's actor; they end with the cluster.

``--quick`` runs a tenth of the repeats, for a look rather than a figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.cluster_utils import Cluster

import soma
from soma.remote import RayHosts, resource_of

HOSTS = ("one", "two")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def met(target: bool) -> str:
    return "yes" if target else "**no**"


def checked(out: object, expected: object) -> None:
    """Stops the benchmark if a timed call computed something other than ``expected``."""
    if out != expected:
        raise AssertionError(f"a timed call returned {out!r}, where {expected!r} was expected")


def median_s(run: Callable[[], object], repeat: int, expected: object) -> float:
    """The median seconds of ``run()``, each result checked against ``expected`` once its
    time is taken."""
    checked(run(), expected)  # Warm: actors started, slices loaded, code paths taken once.
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = run()
        samples.append(time.perf_counter() - start)
        checked(out, expected)
    return statistics.median(samples)


class Inc(soma.Node):
    def forward(self, x: int) -> int:
        return x + 1


class Nap(soma.Node):
    def forward(self, x: int) -> int:
        time.sleep(0.1)
        return x


class Total(soma.Node):
    def forward(self, x: Any) -> float:
        return float(x.sum())


class Stuck(soma.Node):
    """Waits forever on its first call with a true input: only a deadline ends its run."""

    def forward(self, x: int) -> int:
        if x:
            threading.Event().wait()
        return x


#: The deadline of the fifth target, its runs, and how far past it the error may come.
STUCK_TIMEOUT_S = 0.2
STUCK_RUNS = 8
OVERSHOOT_TARGET_S = 0.1


def deadline_overshoot(host: str) -> list[str]:
    """The row of the fifth target: how long past its deadline a run stuck on ``host`` ends."""
    stuck = soma.Graph.somatize(Inc().named("here") >> Stuck().named("stuck").at(host))
    checked(stuck.forward(-1), 0)  # The host's actor started and its slice loaded.
    past = []
    for _ in range(STUCK_RUNS):
        start = time.perf_counter()
        try:
            stuck.forward(1, timeout=STUCK_TIMEOUT_S)
        except TimeoutError as error:
            past.append(time.perf_counter() - start - STUCK_TIMEOUT_S)
            checked("still running: `stuck` on host" in str(error), True)
        else:
            raise AssertionError("a run stuck on a host returned")
    worst = max(past)
    return [
        f"node stuck on a host, timeout={STUCK_TIMEOUT_S} s",
        f"TimeoutError {statistics.median(past) * 1e3:.1f} ms past it (median), "
        f"{worst * 1e3:.1f} ms (worst of {STUCK_RUNS})",
        "",
        f"target ≤ {OVERSHOOT_TARGET_S * 1e3:.0f} ms: " + met(worst <= OVERSHOOT_TARGET_S),
    ]


class Scale(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        return x * self.k


class Listed(soma.Node):
    def __init__(self) -> None:
        self.xs = list(range(100))

    def forward(self, x: int) -> int:
        return x + len(self.xs)


class Weighed(soma.Node):
    def __init__(self) -> None:
        self.w = np.ones(2**20)  # 8 MB of float64.

    def forward(self, x: int) -> int:
        return x + int(self.w[0])


#: The check's share of a bare round trip, at most, for a slice of a few nodes holding numbers.
CHECK_SHARE = 0.05


def edit_check(nodes: list[soma.Node], host: str, repeat: int) -> float:
    """The median seconds of the check made before each run of the one slice of ``nodes`` on
    ``host``, timed inside ``repeat`` runs of it, once the slice was sent and nothing changed
    since (so nothing is sent): as a run pays it, between two round trips."""
    expr: Any = nodes[0]
    for node in nodes[1:]:
        expr = expr >> node
    g = soma.Graph.somatize(expr.at(host))
    expected = g.forward(0)  # Sent, and its fingerprints taken.
    distributed = g._remote
    assert distributed is not None
    send = distributed._send
    samples: list[float] = []

    def timed(*args: Any) -> None:
        start = time.perf_counter()
        send(*args)
        samples.append(time.perf_counter() - start)

    distributed._send = timed  # type: ignore[method-assign]
    for _ in range(repeat):
        checked(g.forward(0), expected)
    return statistics.median(samples)


def edit_check_rows(bare_s: float, repeat: int) -> list[list[str]]:
    """The rows of the fourth target: the edit check, against the bare round trip."""
    numbers_s = edit_check([Scale(2) for _ in range(5)], "one", repeat)
    listed_s = edit_check([Listed() for _ in range(5)], "one", repeat)
    array_s = edit_check([Weighed()], "one", repeat)
    return [
        [
            "edit check, slice of 5 nodes holding numbers",
            f"{numbers_s * 1e6:.1f} µs",
            f"bare actor call {bare_s * 1e6:.0f} µs",
            f"{numbers_s / bare_s:.1%} of it (target ≤ {CHECK_SHARE:.0%}): "
            + met(numbers_s <= CHECK_SHARE * bare_s),
        ],
        [
            "edit check, 5 nodes holding a list of 100 numbers",
            f"{listed_s * 1e6:.0f} µs",
            "",
            f"{listed_s / bare_s:.1%} of the bare call",
        ],
        [
            "edit check, a node holding an 8 MB array",
            f"{array_s * 1e6:.0f} µs",
            "",
            f"{array_s / bare_s:.1%} of the bare call",
        ],
    ]


class Pid(soma.Node):
    def forward(self, x: Any) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class Bare:
    """What a slice is measured against: one actor method, doing what the node does."""

    def call(self, x: int) -> int:
        return x + 1

    def total(self, x: Any) -> float:
        return float(x.sum())

    def pid(self) -> int:
        return os.getpid()


#: The array of the third target, and the slack over the bare call: a tenth of it.
ARRAY_MB = 200
SLACK_MB = 20


def status_kib(pid: int, field: str) -> int:
    """A ``kB`` figure of ``/proc/<pid>/status``: ``VmRSS``, ``VmHWM``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_growth_mb(pids: list[int], run: Callable[[], object]) -> list[float]:
    """How far each process's peak resident memory rose above its resident memory while
    ``run()`` ran, in MB; ``run()`` returns whether it computed what it should."""
    before = []
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # The peak, back to what is resident.
        before.append(status_kib(pid, "VmRSS"))
    checked(run(), True)
    return [(status_kib(pid, "VmHWM") - kib) / 1024 for pid, kib in zip(pids, before, strict=True)]


def no_second_copy(bare: Any, host: str) -> list[str]:
    """The row of the third target: a 200 MB array summed on ``host`` by a bare actor method and
    by a Soma slice, the peak growth of the driver and of the host's process for each."""
    array = np.ones(ARRAY_MB * 2**20 // 8)
    summed = soma.Graph.somatize(Total().named("total").at(host))
    summed.forward(np.ones(1))  # Its slice loaded on the host's actor, the array's code warm.
    ray.get(bare.total.remote(np.ones(1)))
    host_pid = soma.Graph.somatize(Pid().named("pid").at(host)).forward(0)
    bare_pid = ray.get(bare.pid.remote())
    driver = os.getpid()
    expected = float(array.size)
    bare_driver, bare_host = peak_growth_mb(
        [driver, bare_pid], lambda: ray.get(bare.total.remote(array)) == expected
    )
    slice_driver, slice_host = peak_growth_mb(
        [driver, host_pid], lambda: summed.forward(array) == expected
    )
    within = slice_driver <= bare_driver + SLACK_MB and slice_host <= bare_host + SLACK_MB
    return [
        f"{ARRAY_MB} MB array to a same-node slice",
        f"peak +{slice_driver:.0f} MB driver, +{slice_host:.0f} MB host",
        f"bare actor call +{bare_driver:.0f} MB driver, +{bare_host:.0f} MB host",
        f"{slice_host - bare_host:+.0f} MB host (target: no second copy, ≤ +{SLACK_MB} MB): "
        + met(within),
    ]


def chain(length: int, host: str) -> soma.Graph:
    expr: Any = Inc().named("n0")
    for at in range(1, length):
        expr = expr >> Inc().named(f"n{at}")
    return soma.Graph.somatize(expr.at(host))


def compiled_chain(length: int, repeat: int) -> float | None:
    """Ray's compiled graph of the same chain on one actor, per run; None if it does not
    compile or run (a wrong result is no such case: it stops the benchmark)."""
    try:
        from ray.dag import InputNode

        actor = Bare.options(resources={resource_of("one"): 0.001}).remote()  # type: ignore[attr-defined]
        with InputNode() as given:
            dag = given
            for _ in range(length):
                dag = actor.call.bind(dag)
        compiled = dag.experimental_compile()
        try:
            return median_s(lambda: ray.get(compiled.execute(0)), repeat, length)
        finally:
            compiled.teardown()
    except AssertionError:
        raise
    except Exception as failure:  # Reported as not run, with why.
        log(f"Ray's compiled graph did not run: {type(failure).__name__}: {failure}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="a tenth of the repeats")
    args = parser.parse_args()
    if args.quick:
        args.repeat = max(args.repeat // 10, 8)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    rows: list[list[str]] = []
    try:
        for host in HOSTS:
            cluster.add_node(num_cpus=1, resources={resource_of(host): 1})
        ray.init(address=cluster.address, log_to_driver=False)
        soma.remote.use(RayHosts(timeout=120.0))

        one = chain(1, "one")
        bare = Bare.options(resources={resource_of("one"): 0.001}).remote()  # type: ignore[attr-defined]
        slice_s = median_s(lambda: one.forward(0), args.repeat, 1)
        bare_s = median_s(lambda: ray.get(bare.call.remote(0)), args.repeat, 1)
        rows.append(
            [
                "slice of 1 trivial node",
                f"{slice_s * 1e6:.0f} µs",
                f"bare actor call {bare_s * 1e6:.0f} µs",
                f"{slice_s / bare_s:.2f}x (target ≤ 1.5x): " + met(slice_s <= 1.5 * bare_s),
            ]
        )

        hundred = chain(100, "one")
        local = chain(100, "one")
        for node in local.nodes():
            local.place_at(node, None)
        hundred_s = median_s(lambda: hundred.forward(0), args.repeat // 4, 100)
        local_s = median_s(lambda: local.forward(0), args.repeat, 100)
        calls_s = median_s(
            lambda: [ray.get(bare.call.remote(0)) for _ in range(100)],
            max(args.repeat // 20, 3),
            [1] * 100,
        )
        rows.append(
            [
                "slice of 100 trivial nodes",
                f"{hundred_s * 1e6:.0f} µs",
                f"1 round trip + 100 local nodes {(slice_s + local_s) * 1e6:.0f} µs",
                f"{hundred_s / (slice_s + local_s):.2f}x (target ≈ 1x)",
            ]
        )
        rows.append(
            [
                "",
                "",
                f"100 ordinary actor calls {calls_s * 1e6:.0f} µs",
                f"{calls_s / hundred_s:.1f}x slower than the slice",
            ]
        )
        compiled_s = compiled_chain(100, args.repeat // 4)
        rows.append(
            [
                "",
                "",
                "Ray compiled graph, 100-node chain on one actor: "
                + ("not run" if compiled_s is None else f"{compiled_s * 1e6:.0f} µs"),
                "" if compiled_s is None else f"slice {hundred_s / compiled_s:.2f}x of it",
            ]
        )

        apart = soma.Graph.somatize(Nap().named("left").at("one") | Nap().named("right").at("two"))
        series = soma.Graph.somatize((Nap().named("left") >> Nap().named("right")).at("one"))
        apart_s = median_s(lambda: apart.forward(0), 10, {"left": 0, "right": 0})
        series_s = median_s(lambda: series.forward(0), 10, 0)
        rows.append(
            [
                "2 branches of 100 ms on 2 hosts",
                f"{apart_s * 1e3:.0f} ms",
                f"in series {series_s * 1e3:.0f} ms",
                f"{series_s / apart_s:.2f}x (target ≥ 1.8x): " + met(series_s >= 1.8 * apart_s),
            ]
        )
        rows.append(no_second_copy(bare, "one"))
        rows.extend(edit_check_rows(bare_s, args.repeat))
        rows.append(deadline_overshoot("two"))
    finally:
        soma.remote.use(None)
        ray.shutdown()
        cluster.shutdown()
    table = ["| what | Soma | against | ratio |", "|---|---|---|---|"]
    table += ["| " + " | ".join(row) + " |" for row in rows]
    text = "\n".join(table) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
