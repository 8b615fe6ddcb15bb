"""Device queues per branch (what CUDA calls streams): two branches placed on one device put
their work on queues of their own; a value that passes from one queue to another is
synchronized by an event the reader's queue waits on, recorded by the writer's, never by a
device-wide synchronize; the caller's queues, and a lent thread's own, are back when a branch
ends — with threads lent again and again, and nested waves.

A fake backend stands in for a GPU runtime: it keeps a current device and a current queue per
device per thread (every thread starts on the device's default queue, as CUDA's do), and logs
every queue made, every event recorded and every wait, in order. Its ``synchronize`` (the
device-wide wait a runtime also has) fails the test if called. torch's own hooks are driven by a
fake ``torch`` module at the end: no GPU was lent to this work.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import soma
from conftest import DEADLINE, deep_graph, merged, registered, run_script


class Queue:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


class Event:
    def __init__(self, queue: Queue, number: int) -> None:
        self.queue = queue
        self.number = number

    def __repr__(self) -> str:
        return f"event {self.number} on {self.queue}"


class FakeGpu:
    """A backend for ``cuda`` with queues and events, and a log of what was asked of it."""

    kinds = ("cuda",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        self.defaults: dict[str, Queue] = {}
        # Per thread: the current device, and the current queue per device.
        self.devices: dict[int, str] = {}
        self.now: dict[tuple[int, str], Queue] = {}
        self.log: list[tuple[Any, ...]] = []

    def note(self, *entry: Any) -> None:
        with self._lock:
            self.log.append(entry)

    # The device hooks.
    def current_device(self) -> str:
        return self.devices.get(threading.get_ident(), "cuda:0")

    def current(self, kind: str) -> str | None:
        return self.current_device()

    def set(self, device: str) -> None:
        self.devices[threading.get_ident()] = device

    # The queue hooks.
    def queues(self, kind: str) -> FakeGpu:
        return self

    def default(self, device: str) -> Queue:
        with self._lock:
            return self.defaults.setdefault(device, Queue(f"{device} default"))

    def current_queue(self, device: str) -> Queue:
        return self.now.get((threading.get_ident(), device)) or self.default(device)

    def new_queue(self, device: str) -> Queue:
        queue = Queue(f"{device} queue {next(self._numbers)}")
        self.note("new", queue)
        return queue

    def set_queue(self, device: str, queue: Queue) -> None:
        self.now[threading.get_ident(), device] = queue

    def record(self, queue: Queue) -> Event:
        event = Event(queue, next(self._numbers))
        self.note("record", queue, event)
        return event

    def wait(self, queue: Queue, event: Event) -> None:
        self.note("wait", queue, event)

    def synchronize(self) -> None:
        self.note("synchronize")
        raise AssertionError("a device-wide synchronize")

    def waits(self) -> list[tuple[Queue, Queue]]:
        """Every wait, as (waiting queue, queue the event was recorded on)."""
        return [(entry[1], entry[2].queue) for entry in self.log if entry[0] == "wait"]


@pytest.fixture
def gpu() -> Iterator[FakeGpu]:
    with registered(FakeGpu()) as backend:
        yield backend


class Probe(soma.Node):
    """Meets the others at ``barrier`` (if given), then notes in the log that it ran, and
    answers, merged into its input's records, the queues current on ``cuda:0`` and ``cuda:1``
    while it runs, and its thread."""

    def __init__(self, gpu: FakeGpu, barrier: threading.Barrier | None = None) -> None:
        self.gpu = gpu
        self.barrier = barrier

    def forward(self, x: Any, ctx: Any) -> dict[str, Any]:
        if self.barrier is not None:
            self.barrier.wait()
        self.gpu.note("run", ctx.node)
        seen = merged(x) if isinstance(x, dict) else {}
        seen[ctx.node] = (
            self.gpu.current_queue("cuda:0"),
            self.gpu.current_queue("cuda:1"),
            threading.get_ident(),
        )
        return seen


def position(log: list[tuple[Any, ...]], *entry: Any) -> int:
    return log.index(entry)


def two_branches(gpu: FakeGpu) -> soma.Graph:
    """``pre`` on the caller's queue, ``a`` and ``b`` side by side on ``cuda:0``, ``join``."""
    barrier = threading.Barrier(2, timeout=DEADLINE)
    return soma.Graph.somatize(
        Probe(gpu).named("pre").on("cuda:0")
        >> (Probe(gpu, barrier).named("a") | Probe(gpu, barrier).named("b")).on("cuda:0")
        >> Probe(gpu).named("join").on("cuda:0")
    )


# ---------------------------------------------------------------------------------------------


def test_two_branches_placed_on_one_device_run_on_device_queues_of_their_own(gpu: FakeGpu) -> None:
    out = merged(two_branches(gpu).forward(None))
    default = gpu.default("cuda:0")
    assert out["a"][2] != out["b"][2], "the branches met, on two threads"
    assert out["a"][0] != out["b"][0]
    assert default not in (out["a"][0], out["b"][0])
    assert out["pre"][0] == out["join"][0] == default, "outside the wave: the caller's queue"


def test_each_branchs_queue_waits_on_an_event_recorded_on_the_callers_queue_before_the_wave(
    gpu: FakeGpu,
) -> None:
    out = merged(two_branches(gpu).forward(None))
    default = gpu.default("cuda:0")
    for branch in "ab":
        queue = out[branch][0]
        assert (queue, default) in gpu.waits(), f"`{branch}` reads what `pre` wrote"
        [event] = [entry[2] for entry in gpu.log if entry[:2] == ("wait", queue)]
        recorded = position(gpu.log, "record", default, event)
        assert position(gpu.log, "run", "pre") < recorded < position(gpu.log, "run", branch)


def test_the_callers_queue_waits_on_an_event_recorded_after_each_branch_before_the_join(
    gpu: FakeGpu,
) -> None:
    out = merged(two_branches(gpu).forward(None))
    default = gpu.default("cuda:0")
    for branch in "ab":
        queue = out[branch][0]
        [event] = [
            entry[2]
            for entry in gpu.log
            if entry[:2] == ("wait", default) and entry[2].queue is queue
        ]
        recorded = position(gpu.log, "record", queue, event)
        waited = position(gpu.log, "wait", default, event)
        assert (
            position(gpu.log, "run", branch) < recorded < waited < position(gpu.log, "run", "join")
        )


def test_values_pass_between_queues_only_by_events_never_a_device_wide_synchronize(
    gpu: FakeGpu,
) -> None:
    out = merged(two_branches(gpu).forward(None))
    default = gpu.default("cuda:0")
    a, b = out["a"][0], out["b"][0]
    assert sorted(gpu.waits(), key=repr) == sorted(
        [(a, default), (b, default), (default, a), (default, b)], key=repr
    ), "a wait for each crossing, and no other; the branches never wait on each other"
    assert ("synchronize",) not in gpu.log


def test_the_callers_queues_and_a_lent_threads_own_are_back_after_the_forward(
    gpu: FakeGpu,
) -> None:
    mine = Queue("the caller's own")
    gpu.set_queue("cuda:0", mine)
    out = merged(two_branches(gpu).forward(None))
    assert out["pre"][0] is out["join"][0] is mine
    assert gpu.current_queue("cuda:0") is mine
    for branch in "ab":
        thread = out[branch][2]
        if thread != threading.get_ident():
            assert gpu.now.get((thread, "cuda:0"), gpu.default("cuda:0")) == gpu.default(
                "cuda:0"
            ), "the crew thread has its own queue back"


def test_a_thread_lent_again_runs_each_branch_on_that_branchs_queue_and_its_own_between(
    gpu: FakeGpu,
) -> None:
    # `b >> c`: on a crew thread, placed `b`, unplaced `c` (its thread's own queue), placed `d`.
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Probe(gpu, barrier).named("a").on("cuda:0")
        | (
            Probe(gpu, barrier).named("b").on("cuda:0")
            >> Probe(gpu).named("c")
            >> Probe(gpu).named("d").on("cuda:0")
        )
    )
    threads, queues = set(), set()
    for _ in range(3):
        out = merged(g.forward(None))
        assert out["b"][0] is out["d"][0], "one queue for the whole branch"
        assert out["c"][0] is gpu.default("cuda:0"), "between its nodes, the thread's own"
        assert out["a"][0] is not out["b"][0]
        threads.add(out["b"][2])
        queues.add(out["b"][0])
    assert len(threads) == 1, "one crew thread was lent every time"
    assert len(queues) == 3, "each forward's branch had a queue of its own"
    assert gpu.now.get((threads.pop(), "cuda:0"), gpu.default("cuda:0")) is gpu.default("cuda:0")


def test_nested_waves_fork_from_and_join_into_the_enclosing_branchs_queue(gpu: FakeGpu) -> None:
    inner = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        (
            Probe(gpu).named("a").on("cuda:0")
            >> (
                Probe(gpu, inner).named("c").on("cuda:0")
                | Probe(gpu, inner).named("d").on("cuda:0")
            )
            >> Probe(gpu).named("e").on("cuda:0")
        )
        | Probe(gpu).named("b").on("cuda:0")
    )
    out = merged(g.forward(None))
    outer, c, d = out["a"][0], out["c"][0], out["d"][0]
    assert len({outer, c, d, out["b"][0], gpu.default("cuda:0")}) == 5
    assert out["e"][0] is outer, "after its inner wave, the branch is back on its queue"
    waits = gpu.waits()
    for queue in (c, d):
        assert (queue, outer) in waits, "the inner branch reads what `a` wrote"
        assert (outer, queue) in waits, "`e` reads what the inner branch wrote"


def test_a_branch_has_a_queue_per_device_and_all_of_them_current_in_its_nodes(
    gpu: FakeGpu,
) -> None:
    # `b` on cuda:1 may copy what `a` left on cuda:0: the copy must wait on the branch's cuda:0
    # queue, so that one is current too while `b` runs.
    g = soma.Graph.somatize(
        Probe(gpu).named("pre").on("cuda:1")
        >> (
            (Probe(gpu).named("a").on("cuda:0") >> Probe(gpu).named("b").on("cuda:1"))
            | Probe(gpu).named("z").on("cuda:0")
        )
    )
    out = merged(g.forward(None))
    on_0, on_1 = out["b"][0], out["b"][1]
    assert on_0 is out["a"][0] is not gpu.default("cuda:0")
    assert on_1 is not gpu.default("cuda:1")
    assert out["z"][0] is not on_0
    assert (on_1, gpu.default("cuda:1")) in gpu.waits(), "`b` reads what `pre` wrote"


def test_a_backend_without_queues_leaves_every_branch_on_its_threads_queue(
    gpu: FakeGpu,
) -> None:
    gpu.queues = lambda kind: None  # type: ignore[method-assign]
    out = merged(two_branches(gpu).forward(None))
    assert {out[node][0] for node in ("pre", "a", "b", "join")} == {gpu.default("cuda:0")}
    assert [entry for entry in gpu.log if entry[0] != "run"] == []


class StreamsItems(soma.Node):
    """Streams ``inputs`` through ``graph`` (``g.map``) and answers the results, in a list."""

    def __init__(self, graph: soma.Graph) -> None:
        self.graph = graph

    def forward(self, inputs: list[Any]) -> list[Any]:
        return list(self.graph.map(inputs))


def test_a_stream_of_items_runs_its_stages_on_their_threads_own_queues(gpu: FakeGpu) -> None:
    # Opened inside a forward with device queues: its stages hand items from thread to thread at any
    # time, not at a wave's join, so they fork nothing.
    inner = two_branches(gpu)
    inner.implementation("a").barrier = inner.implementation("b").barrier = None
    outer = soma.Graph.somatize(StreamsItems(inner).named("stream").on("cuda:0"))
    for out in outer.forward([None, None]):
        assert {record[0] for record in merged(out).values()} == {gpu.default("cuda:0")}
    assert [entry for entry in gpu.log if entry[0] in ("new", "wait")] == []


DEEP_SCRIPT = (
    """
import threading
import soma


class Gpu:
    kinds = ("cuda",)

    def __init__(self):
        self.local = threading.local()

    def current(self, kind):
        return getattr(self.local, "device", "cuda:0")

    def set(self, device):
        self.local.device = device

    def queues(self, kind):
        return self

    def current_queue(self, device):
        return getattr(self.local, "queue", "default")

    def new_queue(self, device):
        return object()

    def set_queue(self, device, queue):
        self.local.queue = queue

    def record(self, queue):
        return queue

    def wait(self, queue, event):
        pass


soma.devices.register(Gpu())


# A branch's scope in a wave's in a branch's, a hundred thousand levels deep, every node on
# cuda:0.
"""
    + deep_graph(100_000)
    + """
for level in range(100_000):
    g.place(f"n{level}", "cuda:0")
assert g.forward(3) == 3
print("done", flush=True)
"""
)


def test_a_graph_nested_a_hundred_thousand_levels_deep_runs_with_a_queue_per_branch() -> None:
    # In a subprocess: a regression here is a stack overflow.
    done = run_script(DEEP_SCRIPT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done" in done.stdout, done.stdout


# ---------------------------------------------------------------------------------------------
# torch's hooks, driven by a fake `torch`: which calls they make (no GPU here)


class FakeTorchStream:
    """A ``torch.cuda.Stream``: torch's word for a device queue."""

    def __init__(self, runtime: FakeCuda, device: int) -> None:
        self.runtime, self.device = runtime, device

    def record_event(self) -> tuple[str, FakeTorchStream]:
        self.runtime.calls.append("record_event")
        return ("event", self)

    def wait_event(self, event: Any) -> None:
        self.runtime.calls.append("wait_event")


class FakeCuda:
    """``torch.cuda`` as far as the queue hooks use it; ``synchronize`` fails the test."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.device = 0
        self.stream: Any = None

    def is_available(self) -> bool:
        return True

    def Stream(self, device: int) -> FakeTorchStream:
        return FakeTorchStream(self, device)

    def current_stream(self, device: int) -> Any:
        return self.stream

    def set_stream(self, stream: FakeTorchStream) -> None:
        # As torch's does: the stream's device becomes current too.
        self.stream, self.device = stream, stream.device

    def current_device(self) -> int:
        return self.device

    def set_device(self, device: int) -> None:
        self.device = device

    def synchronize(self, device: Any = None) -> None:
        raise AssertionError("a device-wide synchronize")


def test_torchs_hooks_use_events_and_leave_the_current_device_as_it_was() -> None:
    cuda = FakeCuda()
    backend = object.__new__(soma.devices._TorchBackend)
    backend._torch = SimpleNamespace(cuda=cuda)
    hooks = backend.queues("cuda")
    assert hooks is not None
    queue = hooks.new_queue("cuda:1")
    assert queue.device == 1
    hooks.set_queue("cuda:1", queue)
    assert cuda.stream is queue, "a device queue is a torch stream"
    assert cuda.device == 0, "setting a queue on cuda:1 left cuda:0 current"
    hooks.wait(queue, hooks.record(hooks.current_queue("cuda:0") or queue))
    assert cuda.calls == ["record_event", "wait_event"]


def test_torch_without_the_runtime_offers_no_queues() -> None:
    cuda = FakeCuda()
    cuda.is_available = lambda: False  # type: ignore[method-assign]
    backend = object.__new__(soma.devices._TorchBackend)
    backend._torch = SimpleNamespace(cuda=cuda)
    assert backend.queues("cuda") is None
