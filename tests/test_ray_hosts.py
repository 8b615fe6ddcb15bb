"""Hosts on a real local Ray cluster: one Ray node per host, each started with its host's
resource (``soma-host:<name>``), the cluster started once for the session. A node placed on a
host runs in a process of that host's Ray node; results equal the local run, on fixed graphs and
on random placements; branches on two hosts run at the same time; a node's exception comes out
as itself, noted with node and host; a killed host, a host that does not answer in time and a
host not in the cluster are ``soma.RemoteError``s naming the host, and the next run works;
Ctrl-C stops a run whose slice is running on a host (a child process, its own Ray driver), and
so does a deadline, by its time; what a host cannot run — a node of a module it cannot import, a
node, a value or an exception that does not pickle — is a ``soma.RemoteError`` naming the host,
the node, its class and the fix.

Kept small for CI (two cores): three Ray nodes of one CPU each, started once.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import soma
from conftest import interrupt_script, run_script
from soma.remote import RayHosts, resource_of

# Ray is optional (`pip install soma-graph[ray]`): where it is not installed, these tests are
# skipped, saying so. Where it is — `make test` installs it, pinned — it must import: a Ray that
# is there and fails to import fails the run, never skips it.
if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed (pip install soma-graph[ray])", allow_module_level=True)

import ray
from ray import cluster_utils

HOSTS = ("one", "two")
# Seconds a rendezvous across hosts waits for the other side.
DEADLINE = 20.0


@pytest.fixture(scope="session")
def cluster() -> Iterator[RayHosts]:
    """A head node with no host, and a node per host offering its resource; Ray connected to
    it and a transport of its own; all of it shut down at the end of the session."""
    # Nodes defined here are sent by value: the hosts' workers cannot import this test module.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    local = cluster_utils.Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        for host in HOSTS:
            local.add_node(num_cpus=1, resources={resource_of(host): 1})
        ray.init(address=local.address, include_dashboard=False, log_to_driver=False)
        hosts = RayHosts(timeout=60.0)
        soma.remote.use(hosts)
        yield hosts
    finally:
        soma.remote.use(None)
        ray.shutdown()
        local.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


class Add(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        return x + self.k


class Total(soma.Node):
    def forward(self, xs: dict[str, int]) -> int:
        return sum(xs.values())


class Where(soma.Node):
    """Its input, with the Ray node it ran on."""

    def forward(self, x: Any) -> tuple[Any, str]:
        return x, str(ray.get_runtime_context().get_node_id())


class Boom(soma.Node):
    def forward(self, x: int) -> int:
        raise KeyError(f"no such thing as {x}")


class Meet(soma.Node):
    """Announces itself in ``folder`` and waits for ``parties`` announcements, up to
    ``DEADLINE``: whether every party was in flight at once. A file, since the parties run in
    processes of different Ray nodes."""

    def __init__(self, folder: Path, parties: int) -> None:
        self.folder = folder
        self.parties = parties

    def forward(self, x: Any, ctx: Any) -> bool:
        (self.folder / str(ctx.node)).touch()
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            if len(list(self.folder.iterdir())) >= self.parties:
                return True
            time.sleep(0.01)
        return False


class Sleep(soma.Node):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def forward(self, x: int) -> int:
        time.sleep(self.seconds)
        return x


def node_of(host: str) -> str:
    """The id of the Ray node that offers ``host``'s resource."""
    (node,) = [
        n["NodeID"] for n in ray.nodes() if n["Alive"] and resource_of(host) in n["Resources"]
    ]
    return str(node)


def actor_died(actor: Any) -> bool:
    """Whether ``actor`` is seen dead within ``DEADLINE``: ``ray.kill`` only asks for it."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            ray.get(actor.node_id.remote(), timeout=DEADLINE)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.05)
    return False


def oracle_graphs() -> list[soma.Graph]:
    """A chain, a wave, a diamond with a fan-in and a branch of two, and the N."""
    chain = soma.Graph.somatize(Add(1).named("a") >> Add(2).named("b") >> Add(3).named("c"))
    wave = soma.Graph.somatize(Add(1).named("a") | Add(2).named("b") | Add(3).named("c"))
    diamond = soma.Graph.somatize(
        Add(1).named("a")
        >> (Add(10).named("b") | (Add(100).named("c") >> Add(1000).named("d")))
        >> Total().named("t")
    )
    n = soma.Graph()
    for name, k in (("a", 1), ("b", 2)):
        n.node(name, Add(k))
    n.node("c", Add(3))
    n.node("d", Total())
    n.edge("a", "c")
    n.edge("a", "d")
    n.edge("b", "d")
    return [chain, wave, diamond, n]


def test_a_node_placed_on_a_host_runs_in_a_process_of_that_hosts_ray_node(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(
        Where().named("first").at("one") >> Where().named("second").at("two") >> Where()
    )
    ((_, on_one), on_two), here = g.forward(0)
    assert on_one == node_of("one")
    assert on_two == node_of("two")
    assert here == str(ray.get_runtime_context().get_node_id())  # The unplaced node: here.


@pytest.mark.parametrize("placement", ["every node", "one node", "alternating"])
def test_results_equal_the_local_run_on_the_oracle_graphs(
    cluster: RayHosts, placement: str
) -> None:
    for g in oracle_graphs():
        # The same graph without hosts, on two inputs: the second run with hosts shows the
        # host's slices did not keep anything of the first.
        expected = [g.forward(1), g.forward(2)]
        for at, node in enumerate(g.nodes()):
            if placement == "every node" or (placement == "one node" and at == 1):
                g.place_at(node, "one")
            elif placement == "alternating":
                g.place_at(node, HOSTS[at % 2])
        assert [g.forward(1), g.forward(2)] == expected, repr(g.distributed_plan())


# 50 of the 243 placements, fresh ones each run (about 0.2 s each on two cores).
@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([None, "one", "two"]), min_size=5, max_size=5))
def test_results_equal_the_local_run_on_random_placements(
    cluster: RayHosts, hosts: list[str | None]
) -> None:
    g = oracle_graphs()[2]
    expected = g.forward(5)
    for node, host in zip(g.nodes(), hosts, strict=True):
        g.place_at(node, host)
    assert g.forward(5) == expected, repr(g.distributed_plan())


class AsyncWhere(soma.Node):
    """Where it ran, as `Where` says, after awaiting its loop: an async node."""

    async def forward(self, x: Any) -> Any:
        import asyncio

        await asyncio.sleep(0)
        return (x, str(ray.get_runtime_context().get_node_id()))


def test_an_async_node_runs_on_a_host_and_beside_a_slice_from_forward_and_aforward(
    cluster: RayHosts,
) -> None:
    import asyncio

    g = soma.Graph.somatize(
        AsyncWhere().named("far").at("one") >> Where().named("near") >> AsyncWhere()
    )
    for run in (lambda: g.forward(0), lambda: asyncio.run(g.aforward(0))):
        ((((_, on_one), near_node), here)) = run()
        assert on_one == node_of("one")
        assert near_node == here == str(ray.get_runtime_context().get_node_id())


class Split(soma.Node):
    def forward(self, n: int) -> list[int]:
        return list(range(n))


def test_an_each_step_runs_here_between_slices_on_hosts(cluster: RayHosts) -> None:
    g = soma.Graph.somatize(
        Add(1).named("before").at("one") >> Split() >> soma.each(Add(10)).named("items")
    )
    expected = [10, 11, 12]
    assert g.forward(2) == expected
    g.place_at("split", "two")
    assert g.forward(2) == expected, repr(g.distributed_plan())


def test_branches_of_a_wave_on_two_hosts_run_at_the_same_time(
    cluster: RayHosts, tmp_path: Path
) -> None:
    g = soma.Graph.somatize(
        Meet(tmp_path, 2).named("left").at("one") | Meet(tmp_path, 2).named("right").at("two")
    )
    assert g.forward(0) == {"left": True, "right": True}


def test_two_slices_for_one_host_run_at_the_same_time(cluster: RayHosts, tmp_path: Path) -> None:
    g = soma.Graph.somatize(
        Meet(tmp_path, 2).named("left").at("one") | Meet(tmp_path, 2).named("right").at("one")
    )
    assert repr(g.distributed_plan()) == "Remote@one(Wave([Execute(left), Execute(right)]))"
    assert g.forward(0) == {"left": True, "right": True}


def test_a_nodes_exception_keeps_its_type_and_message_and_a_note_names_node_and_host(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> Boom().named("boom").at("two") >> Add(1))
    with pytest.raises(KeyError, match="no such thing as 2") as raised:
        g.forward(1)
    assert type(raised.value) is KeyError
    assert raised.value.__notes__ == ["raised in soma node `boom` on host `two`"]
    g.place_at("boom", None)
    with pytest.raises(KeyError) as here:
        g.forward(1)
    assert str(here.value) == str(raised.value)


def test_a_nodes_exception_comes_out_caused_by_its_remote_traceback(cluster: RayHosts) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> Boom().named("boom").at("two"))
    with pytest.raises(KeyError) as raised:
        g.forward(1)
    remote = raised.value.__cause__
    assert isinstance(remote, soma.errors.RemoteTraceback), remote
    assert remote.host == "two"
    # The frame of the node's own code, as it ran on the host.
    assert 'raise KeyError(f"no such thing as {x}")' in str(remote), str(remote)
    printed = "".join(traceback.format_exception(raised.value))
    assert (
        printed.index("raise KeyError")
        < printed.index("direct cause")
        < printed.rindex("KeyError: 'no such thing as 2'")
    ), printed


class Flags(soma.Node):
    """Whether the array it got may be written, and whether it owns its memory."""

    def forward(self, x: Any) -> tuple[bool, bool]:
        return bool(x.flags.writeable), bool(x.flags.owndata)


def test_a_large_numpy_array_reaches_a_slice_on_the_same_node_without_a_copy(
    cluster: RayHosts,
) -> None:
    np = pytest.importorskip("numpy")
    big = np.ones(2**20)  # 8 MB: past what Ray sends inline, so through its object store.
    g = soma.Graph.somatize(Flags().named("flags").at("one"))
    # Read in place from the object store: a view, read-only; a copy would be its own.
    assert g.forward(big) == (False, False)
    assert np.ones(4).flags.writeable  # What an array of its own says, for contrast.


def test_a_traced_run_records_a_slices_nodes_on_a_track_of_their_own_marked_with_the_host(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> (Add(2).named("b") >> Add(3).named("c")).at("one"))
    trace = soma.Trace()
    assert g.forward(0, trace=trace) == 6
    there = {span.node: span for span in trace.spans if span.host is not None}
    here = {span.node: span for span in trace.spans if span.host is None}
    assert sorted(there) == ["b", "c"]
    assert {span.host for span in there.values()} == {"one"}
    assert there["b"].thread == there["c"].thread != here["a"].thread
    # On this trace's clock, inside the span of the slice's stand-in here.
    (stand_in,) = [span for span in trace.spans if span.node.startswith("one#")]
    assert stand_in.start <= there["b"].start <= there["c"].end <= stand_in.end
    chrome = trace.to_chrome()
    assert '"name":"host one, thread ' in chrome
    assert '"host":"one"' in chrome


def test_with_telemetry_a_slices_nodes_are_spans_under_its_call_marked_with_the_host(
    cluster: RayHosts,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    g = soma.Graph.somatize(Add(1).named("a") >> (Add(2).named("b") >> Add(3).named("c")).at("one"))
    soma.telemetry.enable(provider)
    try:
        assert g.forward(0) == 6
    finally:
        soma.telemetry.disable()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    (stand_in,) = [name for name in spans if name.startswith("one#")]
    run = spans["soma.run"]
    assert run.context is not None
    assert spans[stand_in].context is not None
    for name in ("a", stand_in):
        assert spans[name].parent is not None
        assert spans[name].parent.span_id == run.context.span_id
    for name in ("b", "c"):
        span = spans[name]
        assert span.attributes is not None
        assert span.attributes["soma.host"] == "one"
        assert span.parent is not None
        assert span.parent.span_id == spans[stand_in].context.span_id
        assert span.start_time is not None
        assert span.end_time is not None
        assert span.start_time <= span.end_time
    # On this process's clock, within the slice's call here.
    assert spans[stand_in].start_time is not None
    assert spans[stand_in].end_time is not None
    assert spans["b"].start_time is not None
    assert spans["c"].end_time is not None
    assert spans["b"].start_time >= spans[stand_in].start_time - 1_000_000_000


def test_the_events_of_a_run_with_hosts_tell_a_slices_nodes_once_it_is_back(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> (Add(2).named("b") >> Add(3).named("c")).at("one"))
    events = [(event.kind, event.node) for event in g.events(0)]
    (stand_in,) = {node for _, node in events if node is not None and node.startswith("one#")}
    assert events[:2] == [("started", "a"), ("finished", "a")]
    at = events.index(("started", stand_in))
    assert events[at + 1 : at + 3] == [("finished", "b"), ("finished", "c")]
    assert events[-1] == ("result", None)


class Fail(soma.Node):
    def __init__(self, message: str) -> None:
        self.message = message

    def forward(self, x: int) -> int:
        raise ValueError(self.message)


def test_the_first_declared_branchs_error_wins_across_hosts(cluster: RayHosts) -> None:
    g = soma.Graph.somatize(
        Fail("first").named("first").at("two") | Fail("second").named("second").at("one")
    )
    for _ in range(3):
        with pytest.raises(ValueError, match="first") as raised:
            g.forward(0)
        assert raised.value.args == ("first",)


def test_a_killed_host_is_a_remote_error_naming_host_and_slice_and_the_next_run_works(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> Add(2).named("b").at("one") >> Add(3))
    assert g.forward(0) == 6
    host = cluster.host("one")
    actor = host.actor  # type: ignore[attr-defined]
    ray.kill(actor)
    assert actor_died(actor), "the killed actor still answers"
    with pytest.raises(soma.RemoteError, match=r"host `one` died .*slice of `b`") as raised:
        g.forward(0)
    assert (raised.value.host, raised.value.slice) == ("one", ["b"])
    host.cancel(["a run there"])  # A cancel sent to a dead host returns, and raises nothing.
    assert g.forward(0) == 6
    assert cluster.host("one") is not host


def test_a_host_that_does_not_answer_in_time_is_a_remote_error(cluster: RayHosts) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> Sleep(3.0).named("slow").at("two"))
    impatient = RayHosts(timeout=0.5)
    soma.remote.use(impatient)
    try:
        with pytest.raises(soma.RemoteError, match=r"host `two` did not finish its slice within"):
            g.forward(0)
    finally:
        soma.remote.use(cluster)


def test_a_host_not_in_the_cluster_is_an_error_naming_the_host_and_the_fix(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Add(1).named("a").at("nowhere"))
    with pytest.raises(
        soma.RemoteError, match="host `nowhere` is not in the Ray cluster"
    ) as raised:
        g.forward(0)
    assert raised.value.host == "nowhere"
    assert "ray start --resources='{\"soma-host:nowhere\": 1}'" in str(raised.value)


class Gate(soma.Node):
    """Announces in ``folder`` that it started and, given a true input, waits until the file
    ``open`` is there (up to ``DEADLINE``): a node that holds its slice while a test gives up on
    the run."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def forward(self, x: int) -> int:
        (self.folder / "started").touch()
        deadline = time.monotonic() + DEADLINE
        while x and not (self.folder / "open").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return x


class Step(soma.Node):
    """Leaves a file ``ran-<id>`` in ``folder``: which nodes ran, seen from here."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def forward(self, x: int, ctx: Any) -> int:
        (self.folder / f"ran-{ctx.node}").touch()
        return x + 1


STEPS = 10


def gated(folder: Path) -> Any:
    """A gate, then ``STEPS`` steps, all on host ``one``: one slice."""
    expr: Any = Gate(folder).named("gate")
    for at in range(STEPS):
        expr = expr >> Step(folder).named(f"step{at}")
    return expr.at("one")


def wait_until(check: Any) -> bool:
    """Whether ``check()`` came true within ``DEADLINE``."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


def steps_after_the_gate_opens(cluster: RayHosts, folder: Path) -> list[str]:
    """Waits for the cancels sent to host ``one`` to reach it (a run with a deadline does not
    wait for them past it), opens the gate, waits for the host to have no slice running, and
    names the steps that ran."""
    actor = cluster.host("one").actor  # type: ignore[attr-defined]
    assert wait_until(lambda: ray.get(actor.unstopped.remote(), timeout=DEADLINE) == 0)
    (folder / "open").touch()
    assert wait_until(lambda: ray.get(actor.running.remote(), timeout=DEADLINE) == 0)
    return sorted(path.name for path in folder.glob("ran-*"))


class AfterGate(soma.Node):
    """Returns its input once the file ``started`` is in ``folder`` (up to ``DEADLINE``): a
    first branch that keeps the caller from taking the gate's branch itself."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def forward(self, x: int) -> int:
        assert wait_until((self.folder / "started").exists)
        return x


@pytest.mark.parametrize("waiting", ["the calling thread", "a branch's thread"])
def test_a_run_that_times_out_stops_its_slice_on_the_host_at_the_next_node_boundary(
    cluster: RayHosts, tmp_path: Path, waiting: str
) -> None:
    # The caller runs a wave's first branch itself, and waits for the others once it is done.
    expr = gated(tmp_path)
    g = soma.Graph.somatize(
        expr if waiting == "the calling thread" else AfterGate(tmp_path).named("after") | expr
    )
    g.forward(0)  # Its slice loaded; what it left is forgotten.
    for left in tmp_path.iterdir():
        left.unlink()
    with pytest.raises(TimeoutError):
        g.forward(1, timeout=0.5)
    assert steps_after_the_gate_opens(cluster, tmp_path) == []
    assert g.forward(1, timeout=DEADLINE) is not None
    assert len(list(tmp_path.glob("ran-*"))) == STEPS


class FailOnceStarted(soma.Node):
    """Raises once the file ``started`` is in ``folder`` (up to ``DEADLINE``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def forward(self, x: int) -> int:
        deadline = time.monotonic() + DEADLINE
        while not (self.folder / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError("failed once the gate had started")


def test_a_failed_slice_stops_the_slices_of_later_declared_branches_on_their_hosts(
    cluster: RayHosts, tmp_path: Path
) -> None:
    # The failing branch first (an earlier one runs on: its own error would win); the caller
    # runs it, and another thread waits for the gate.
    g = soma.Graph.somatize(FailOnceStarted(tmp_path).named("fail").at("two") | gated(tmp_path))
    with pytest.raises(ValueError, match="failed once the gate had started"):
        g.forward(1)
    assert (tmp_path / "started").exists()
    assert steps_after_the_gate_opens(cluster, tmp_path) == []


CTRL_C_SCRIPT = """
import time
import ray
import soma

class Announce(soma.Node):
    def forward(self, x):
        if x:
            print("started", flush=True)
        return x

class Sleep(soma.Node):
    def forward(self, x):
        if x:
            time.sleep(40)  # Far longer than the test waits: only Ctrl-C ends this run.
        return x

ray.init(address={address!r}, log_to_driver=False)
try:
    g = soma.Graph.somatize(Announce() >> Sleep().at("one"))
    assert g.forward(0) == 0  # The host's actor started and its slice loaded.
    try:
        g.forward(1, timeout={timeout})
    except KeyboardInterrupt:
        print("interrupted", flush=True)
finally:
    ray.shutdown()
print("shut down", flush=True)
"""


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_ctrl_c_during_a_run_with_a_slice_on_a_host_stops_it_and_ray_shuts_down(
    cluster: RayHosts, timeout: float | None
) -> None:
    # A driver of its own on the session's cluster, in a child process: Ctrl-C is sent to the
    # child alone, and its actors end with it. With a deadline far off, Ctrl-C still wins.
    address = ray.get_runtime_context().gcs_address
    child = interrupt_script(CTRL_C_SCRIPT.format(address=address, timeout=timeout), "started")
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["interrupted", "shut", "down"], child.stderr


CTRL_C_CANCEL_SCRIPT = """
import pathlib
import threading
import time
import ray
import soma

folder = pathlib.Path({folder!r})
DEADLINE = 20.0

def wait_until(check):
    deadline = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < deadline, "waited too long"
        time.sleep(0.01)

class Gate(soma.Node):
    def forward(self, x):
        (folder / "started").touch()
        deadline = time.monotonic() + DEADLINE
        while x and not (folder / "open").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return x

class Step(soma.Node):
    def forward(self, x, ctx):
        (folder / f"ran-{{ctx.node}}").touch()
        return x + 1

class AfterGate(soma.Node):
    def forward(self, x):
        wait_until(lambda: (folder / "started").exists())
        return x

def announce():
    wait_until(lambda: (folder / "started").exists())
    print("started", flush=True)

ray.init(address={address!r}, log_to_driver=False)
try:
    expr = Gate()
    for _ in range(10):
        expr = expr >> Step()
    expr = expr.at("one")
    # On a branch's thread: the caller runs the first branch, then waits for the gate's.
    g = soma.Graph.somatize(AfterGate() | expr if {in_a_wave} else expr)
    g.forward(0)  # The host's actor started and its slice loaded.
    for path in folder.iterdir():
        path.unlink()
    threading.Thread(target=announce, daemon=True).start()
    try:
        g.forward(1)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    (folder / "open").touch()
    actor = soma.remote.transport().host("one").actor
    wait_until(lambda: ray.get(actor.running.remote(), timeout=DEADLINE) == 0)
    print("steps", len(list(folder.glob("ran-*"))), flush=True)
    g.forward(1, timeout=DEADLINE)
    print("next", len(list(folder.glob("ran-*"))), flush=True)
finally:
    ray.shutdown()
"""


@pytest.mark.parametrize("waiting", ["the calling thread", "a branch's thread"])
def test_ctrl_c_stops_a_slice_running_on_a_host_at_its_next_node_boundary_and_the_next_run_works(
    cluster: RayHosts, tmp_path: Path, waiting: str
) -> None:
    address = ray.get_runtime_context().gcs_address
    script = CTRL_C_CANCEL_SCRIPT.format(
        address=address, folder=str(tmp_path), in_a_wave=waiting == "a branch's thread"
    )
    child = interrupt_script(script, "started")
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["interrupted", "steps", "0", "next", "10"], child.stderr


# What a host cannot run: each is a RemoteError naming host, node(s), class and fix, in plain
# text, and the graph runs again once the cause is gone.

ANSI = "\x1b["


def module_only_here(folder: Path, source: str) -> Any:
    """A module written to ``folder`` and imported here, under a name of its own: the hosts'
    workers cannot import it (``folder`` is on no path of theirs)."""
    name = f"only_here_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(source)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


FAR = """
import soma

class Far(soma.Node):
    def forward(self, x):
        return x + 1
"""


def printed(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


# Ray's worker logs the import that fails as it unpickles what it was sent, with a traceback,
# before the task fails: a user sees it beside the RemoteError, which names the fix.
_RAY_LOGS_THE_FAILED_IMPORT = pytest.mark.expected_errors(
    r"No module named '(only_here_|made_on_the_host)"
)


@_RAY_LOGS_THE_FAILED_IMPORT
def test_a_node_whose_module_a_host_cannot_import_is_a_remote_error_naming_class_module_and_fix(
    cluster: RayHosts, tmp_path: Path
) -> None:
    module = module_only_here(tmp_path, FAR)
    g = soma.Graph.somatize(Add(1).named("a") >> module.Far().named("far").at("one"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(1)
    error = raised.value
    assert (error.host, error.node, error.slice) == ("one", "far", ["far"])
    message = str(error)
    assert message.startswith(
        f"host `one` cannot import module `{module.__name__}`, which node `far` "
        f"(class `{module.__name__}.Far`) needs\nhint: "
    ), message
    assert f'ray.init(runtime_env={{"py_modules": ["{module.__file__}"]}})' in message
    assert ANSI not in printed(error)
    g.place_at("far", None)
    assert g.forward(1) == 3


@_RAY_LOGS_THE_FAILED_IMPORT
def test_a_node_holding_an_object_of_a_module_the_host_cannot_import_is_the_one_named(
    cluster: RayHosts, tmp_path: Path
) -> None:
    module = module_only_here(tmp_path, FAR)
    g = soma.Graph.somatize((Add(1).named("plain") >> Add(module.Far()).named("holder")).at("one"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(1)
    assert str(raised.value).startswith(
        f"host `one` cannot import module `{module.__name__}`, which node `holder` (class "
        f"`{__name__}.Add`) needs\nhint: "
    ), str(raised.value)
    assert (raised.value.node, raised.value.slice) == ("holder", ["plain", "holder"])


@_RAY_LOGS_THE_FAILED_IMPORT
def test_a_value_of_a_module_the_host_cannot_import_is_a_remote_error_naming_it(
    cluster: RayHosts, tmp_path: Path
) -> None:
    module = module_only_here(tmp_path, FAR)
    g = soma.Graph.somatize(Where().named("where").at("one"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(module.Far())
    message = str(raised.value)
    assert message.startswith(
        f"host `one` cannot import module `{module.__name__}`, which the graph's input (a "
        f"`{module.__name__}.Far`) sent to the slice of `where` needs\nhint: "
    ), message
    assert raised.value.host == "one"
    assert ANSI not in printed(raised.value)
    assert g.forward(1)[0] == 1


RUNTIME_ENV_SCRIPT = """
import importlib, sys
import ray
import soma

sys.path.insert(0, {folder!r})
module = importlib.import_module({name!r})
sys.path.remove({folder!r})
ray.init(address={address!r}, log_to_driver=False, runtime_env={{"py_modules": [module.__file__]}})
try:
    print(soma.Graph.somatize(module.Far().at("one")).forward(1), flush=True)
finally:
    ray.shutdown()
"""


def test_a_module_sent_with_rays_runtime_env_is_imported_on_the_host(
    cluster: RayHosts, tmp_path: Path
) -> None:
    # What the hint says, as a program does it: its own driver, with the job's runtime_env.
    module = module_only_here(tmp_path, FAR)
    address = ray.get_runtime_context().gcs_address
    child = run_script(
        RUNTIME_ENV_SCRIPT.format(folder=str(tmp_path), name=module.__name__, address=address)
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["2"], child.stderr


class HoldsLock(soma.Node):
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def forward(self, x: int) -> int:
        return x


def test_a_node_that_cannot_be_pickled_is_a_remote_error_naming_node_and_class(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Add(1).named("a").at("one") >> HoldsLock().named("holder").at("one"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(1)
    assert str(raised.value).startswith(
        f"node `holder` (class `{__name__}.HoldsLock`) cannot be pickled to be sent to host "
        "`one`: TypeError: cannot pickle '_thread.lock' object\nhint: "
    ), str(raised.value)
    assert (raised.value.host, raised.value.node) == ("one", "holder")
    assert ANSI not in printed(raised.value)
    g.place_at("holder", None)
    assert g.forward(1) == 2


def test_an_input_that_cannot_be_pickled_is_a_remote_error_naming_the_value_and_the_slice(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Where().named("where").at("one"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(threading.Lock())
    assert str(raised.value).startswith(
        "the graph's input (a `_thread.lock`), read by the slice of `where` on host `one`, "
        "cannot be pickled to be sent there: TypeError: cannot pickle '_thread.lock' object\n"
        "hint: "
    ), str(raised.value)
    assert ANSI not in printed(raised.value)
    assert g.forward(1)[0] == 1


class Generate(soma.Node):
    def forward(self, x: int) -> Any:
        return (x for _ in range(3))


def test_a_value_that_cannot_be_pickled_on_the_host_to_come_back_is_a_remote_error_naming_its_node(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> Generate().named("gen").at("two"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(1)
    assert str(raised.value).startswith(
        f"the value returned by `gen` (class `{__name__}.Generate`) on host `two` cannot be "
        "pickled to come back: TypeError: cannot pickle 'generator' object\nhint: "
    ), str(raised.value)
    assert (raised.value.host, raised.value.node) == ("two", "gen")
    assert ANSI not in printed(raised.value)
    g.place_at("gen", None)
    assert list(g.forward(1)) == [2, 2, 2]


def test_a_slice_whose_returned_values_do_not_pickle_together_names_every_node_it_returns(
    cluster: RayHosts,
) -> None:
    # Ray pickles a slice's returns in one go: which of them failed, it does not say.
    g = soma.Graph.somatize((Add(1).named("a") | Generate().named("gen")).at("two"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(1)
    assert str(raised.value).startswith(
        f"one of the values returned by `a` (class `{__name__}.Add`), `gen` (class "
        f"`{__name__}.Generate`) on host `two` cannot be pickled to come back: "
    ), str(raised.value)


class HostOnly(soma.Node):
    """Returns an instance of a class of a module that exists on the host alone, made there."""

    def forward(self, x: int) -> Any:
        import types

        module = sys.modules.get("made_on_the_host")
        if module is None:
            module = sys.modules["made_on_the_host"] = types.ModuleType("made_on_the_host")
            module.Thing = type("Thing", (), {"__module__": "made_on_the_host"})  # type: ignore[attr-defined]
        return module.Thing()


@_RAY_LOGS_THE_FAILED_IMPORT
def test_a_value_returned_on_a_host_that_cannot_be_unpickled_here_is_a_remote_error_naming_it(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(HostOnly().named("made").at("one"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(1)
    assert str(raised.value).startswith(
        f"the value returned by `made` (class `{__name__}.HostOnly`) on host `one` cannot be "
        "unpickled here: ModuleNotFoundError: No module named 'made_on_the_host'\nhint: make "
        "`made_on_the_host` importable here too"
    ), str(raised.value)
    assert (raised.value.host, raised.value.node) == ("one", "made")
    assert ANSI not in printed(raised.value)


class RaiseHostOnly(soma.Node):
    """Raises an exception of a class of a module that exists on the host alone, made there."""

    def forward(self, x: int) -> Any:
        import types

        module = sys.modules.get("raised_on_the_host")
        if module is None:
            module = sys.modules["raised_on_the_host"] = types.ModuleType("raised_on_the_host")
            module.Oops = type("Oops", (Exception,), {"__module__": "raised_on_the_host"})  # type: ignore[attr-defined]
        raise module.Oops(f"no {x}")


def test_an_exception_raised_on_a_host_that_cannot_be_unpickled_here_is_a_remote_error_naming_it(
    cluster: RayHosts,
) -> None:
    g = soma.Graph.somatize(RaiseHostOnly().named("oops").at("one"))
    with pytest.raises(soma.RemoteError) as raised:
        g.forward(1)
    assert str(raised.value).startswith(
        "node `oops` raised `raised_on_the_host.Oops: no 1` on host `one`, an exception that "
        "cannot be unpickled here\nhint: make the exception's class importable here too"
    ), str(raised.value)
    assert (raised.value.host, raised.value.node) == ("one", "oops")
    # The host's traceback, the node's own frame in it.
    assert "raise module.Oops" in str(raised.value.__cause__)
    assert ANSI not in printed(raised.value)


class TwoArguments(Exception):
    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


class Locked(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class RaiseTwoArguments(soma.Node):
    def forward(self, x: int) -> int:
        raise TwoArguments("bad", "input")


class RaiseLocked(soma.Node):
    def forward(self, x: int) -> int:
        raise Locked("held")


@pytest.mark.parametrize(
    ("node", "raised", "why"),
    [
        (
            RaiseTwoArguments,
            "TwoArguments: bad: input",
            "TypeError: TwoArguments.__init__() missing 1 required positional argument: 'why'",
        ),
        (RaiseLocked, "Locked: held", "TypeError: cannot pickle '_thread.lock' object"),
    ],
)
def test_an_exception_that_does_not_pickle_on_a_host_is_a_remote_error_with_its_type_and_message(
    cluster: RayHosts, node: type[soma.Node], raised: str, why: str
) -> None:
    g = soma.Graph.somatize(Add(1).named("a") >> node().named("fail").at("one"))
    with pytest.raises(soma.RemoteError) as caught:
        g.forward(1)
    assert str(caught.value) == (
        f"node `fail` raised `{__name__}.{raised}` on host `one`, an exception that cannot be "
        f"pickled to come back here ({why})\nhint: let the exception pickle: pass every "
        "argument of its `__init__` on to `super().__init__(...)` (or give it a `__reduce__`), "
        "and keep locks, files and connections out of its attributes"
    )
    assert (caught.value.host, caught.value.node) == ("one", "fail")
    # The host's traceback, the node's own frame in it, printed above the error.
    assert isinstance(caught.value.__cause__, soma.errors.RemoteTraceback)
    assert "raise " in str(caught.value.__cause__)
    assert ANSI not in printed(caught.value)


STUCK_SCRIPT = """
import threading, time
import ray
import soma

class Stuck(soma.Node):
    def forward(self, x):
        if x:
            threading.Event().wait()  # Forever: only the deadline ends this run.
        return x

class Pass(soma.Node):
    def forward(self, x):
        return x

class SlowToArrive(soma.Node):
    # Takes far longer to unpickle on the host than the test waits.
    def forward(self, x):
        return x

    def __setstate__(self, state):
        time.sleep(40)
        self.__dict__.update(state)

ray.init(address={address!r}, log_to_driver=False)
try:
    shapes = {{
        "only": Stuck().named("stuck").at("one"),
        "last": Pass().named("here") >> Stuck().named("stuck").at("one"),
        "first": Stuck().named("stuck").at("one") >> Pass().named("after"),
        "beside a local branch": Pass().named("here") | Stuck().named("stuck").at("one"),
        "before a local branch": Stuck().named("stuck").at("one") | Pass().named("here"),
    }}
    for shape, expr in shapes.items():
        g = soma.Graph.somatize(expr)
        g.forward(0)  # The host's actor started and its slice loaded.
        try:
            g.forward(1, timeout=0.5)
            print(shape, "returned", flush=True)
        except TimeoutError as error:
            print(shape, "|", str(error).splitlines()[0], flush=True)
        print(shape, "| next", g.forward(0) is not None, flush=True)
    # The first run of a graph sends the host its nodes: that trip keeps the deadline too.
    g = soma.Graph.somatize(Pass().named("here") >> SlowToArrive().named("slow").at("two"))
    try:
        g.forward(1, timeout=0.5)
        print("sending", "returned", flush=True)
    except TimeoutError as error:
        print("sending", "|", str(error).splitlines()[0], flush=True)
finally:
    ray.shutdown()
"""


def test_a_node_stuck_on_a_host_ends_its_run_at_the_deadline_naming_it_and_the_next_run_works(
    cluster: RayHosts,
) -> None:
    # A driver of its own, whose stuck threads on the hosts end with it; the child's deadline
    # fails the test should a run hang.
    child = run_script(STUCK_SCRIPT.format(address=ray.get_runtime_context().gcs_address))
    assert child.returncode == 0, child.stderr
    said = (
        "forward did not finish within its timeout of 0.5 s; still running: `stuck` on host "
        "`one`, stopped there at its next node boundary"
    )
    shapes = ["only", "last", "first", "beside a local branch", "before a local branch"]
    expected = [line for shape in shapes for line in (f"{shape} | {said}", f"{shape} | next True")]
    expected.append(
        "sending | forward did not finish within its timeout of 0.5 s; still running: `slow` "
        "on host `two`, its nodes still on their way there"
    )
    assert child.stdout.splitlines() == expected, child.stderr


class Counted(soma.Node):
    """Adds ``k``, and leaves a file ``ran-<id>`` in ``folder``: which nodes were called, seen
    from here, wherever they ran."""

    def __init__(self, folder: Path, k: int) -> None:
        self.folder = folder
        self.k = k

    def forward(self, x: int, ctx: Any) -> int:
        (self.folder / f"ran-{ctx.node}").touch()
        return x + self.k


def called(folder: Path) -> list[str]:
    """The nodes that left a file in ``folder`` since the last call, which clears them."""
    found = sorted(path.name.removeprefix("ran-") for path in folder.glob("ran-*"))
    for path in folder.glob("ran-*"):
        path.unlink()
    return found


def hosted_chain(folder: Path) -> tuple[soma.Graph, Counted]:
    """``a`` on host one (reading the graph's input), ``b`` here, ``c`` on host two, ``d``
    here; and ``c``, to edit."""
    c = Counted(folder, 3).named("c").at("two")
    g = soma.Graph.somatize(
        Counted(folder, 1).named("a").at("one")
        >> Counted(folder, 2).named("b")
        >> c
        >> Counted(folder, 4).named("d")
    )
    return g, c


def test_a_folder_cache_keeps_the_nodes_on_hosts_there_and_a_rerun_calls_none_of_them(
    cluster: RayHosts, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    ran.mkdir()
    g, _ = hosted_chain(ran)
    cache = soma.Cache(tmp_path / "cache")
    assert g.forward(0, cache=cache) == 10
    assert called(ran) == ["a", "b", "c", "d"]
    trace = soma.Trace()
    assert g.forward(0, cache=cache, trace=trace) == 10
    assert called(ran) == []
    # The hosts' hits are counted here, and marked in the trace on their hosts' tracks.
    assert cache.stats().hits == 4
    there = {(span.node, span.host, span.cached) for span in trace.spans if span.host is not None}
    assert there == {("a", "one", True), ("c", "two", True)}
    here = {span.node: span.cached for span in trace.spans if span.node in ("b", "d")}
    assert here == {"b": True, "d": True}


def test_a_rerun_with_hosts_after_an_edit_calls_the_edited_node_and_what_follows_it_only(
    cluster: RayHosts, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    ran.mkdir()
    g, c = hosted_chain(ran)
    cache = soma.Cache(tmp_path / "cache")
    g.forward(0, cache=cache)
    called(ran)
    c.k = 30
    assert g.forward(0, cache=cache) == 37
    assert called(ran) == ["c", "d"]
    assert g.forward(1, cache=cache) == 38
    assert called(ran) == ["a", "b", "c", "d"]


def test_nodes_on_hosts_of_a_class_the_hosts_import_are_keyed_there_as_here(
    cluster: RayHosts, tmp_path: Path
) -> None:
    # Rust nodes: their class is Soma's, which the hosts import from the same source.
    ran = tmp_path / "ran"
    ran.mkdir()
    last = Counted(ran, 4).named("d")
    g = soma.Graph.somatize(
        soma.native.Add(1).named("a").at("one")
        >> Counted(ran, 2).named("b")
        >> soma.native.Add(3).named("c").at("two")
        >> last
    )
    cache = soma.Cache(tmp_path / "cache")
    g.forward(0, cache=cache)
    last.k = 40
    assert cache.would_hit(g, 0) == {"a": True, "b": True, "c": True, "d": False}
    assert g.plan(cache=cache, input=0).cached == ["a", "b", "c"]
    trace = soma.Trace()
    assert g.forward(0, cache=cache, trace=trace) == 46
    there = {(span.node, span.cached) for span in trace.spans if span.host is not None}
    assert there == {("a", True), ("c", True)}


def test_nodes_on_hosts_of_a_class_sent_by_value_are_keyed_there_as_here(
    cluster: RayHosts, tmp_path: Path
) -> None:
    # This module's classes cannot be imported by the hosts' workers: Ray sends them by value,
    # and a host keys them by the code they arrive with, which is the code they have here.
    ran = tmp_path / "ran"
    ran.mkdir()
    g, c = hosted_chain(ran)
    cache = soma.Cache(tmp_path / "cache")
    g.forward(0, cache=cache)
    assert cache.would_hit(g, 0) == dict.fromkeys("abcd", True)
    c.k = 30
    assert cache.would_hit(g, 0) == {"a": True, "b": True, "c": False, "d": False}


def test_a_cache_in_memory_runs_the_nodes_on_hosts_uncached_with_one_warning_naming_the_hosts(
    cluster: RayHosts, tmp_path: Path
) -> None:
    ran = tmp_path / "ran"
    ran.mkdir()
    g, _ = hosted_chain(ran)
    cache = soma.Cache()
    with pytest.warns(soma.CacheWarning, match=r"nodes on hosts `one`, `two` run uncached"):
        assert g.forward(0, cache=cache) == 10
    assert called(ran) == ["a", "b", "c", "d"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g.forward(0, cache=cache) == 10
    assert called(ran) == ["a", "c"]


class CountedHost:
    """A host of the cluster's transport, counting what it is sent: the node ids of each slice,
    by load."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.loads: list[list[list[str]]] = []

    def load(self, key: str, slices: list[Any], timeout: float | None = None) -> None:
        self.host.load(key, slices, timeout)
        self.loads.append([piece.names() for piece in slices])

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.host.run(*args, **kwargs)

    def cancel(self, tokens: list[str], wait: float = 5.0) -> None:
        self.host.cancel(tokens, wait)

    def unload(self, key: str) -> None:
        self.host.unload(key)


class CountedHosts:
    """The cluster's transport, each host counting what it is sent (:class:`CountedHost`)."""

    def __init__(self, hosts: RayHosts) -> None:
        self.hosts = hosts
        self.counted: dict[str, CountedHost] = {}

    def host(self, name: str) -> CountedHost:
        real = self.hosts.host(name)
        counted = self.counted.get(name)
        if counted is None or counted.host is not real:  # The same object while the host lives.
            counted = self.counted[name] = CountedHost(real)
        return counted

    def loads(self, name: str) -> list[list[list[str]]]:
        return self.counted[name].loads


@pytest.fixture
def counted(cluster: RayHosts) -> Iterator[CountedHosts]:
    hosts = CountedHosts(cluster)
    soma.remote.use(hosts)  # type: ignore[arg-type]
    try:
        yield hosts
    finally:
        soma.remote.use(cluster)


class Holds(soma.Node):
    """Adds what it holds: a number, or the sum of a list or an array."""

    def __init__(self, held: Any) -> None:
        self.held = held

    def forward(self, x: int) -> int:
        return x + int(np.sum(self.held))


def rebind(node: Holds) -> None:
    node.held = 5


def set_second(node: Holds) -> None:
    node.held[1] = 4


#: By name: what the node holds first (made afresh for each test), and the edit.
EDITS: dict[str, tuple[Callable[[], Any], Callable[[Holds], None]]] = {
    "an attribute rebound": (lambda: 1, rebind),
    "a list mutated in place": (lambda: [1, 0], set_second),
    "a numpy array changed in place": (lambda: np.array([1, 0]), set_second),
}


@pytest.mark.parametrize("cached", [False, True], ids=["without a cache", "with a folder cache"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_a_node_on_a_host_edited_between_runs_runs_there_as_it_is_now(
    counted: CountedHosts, tmp_path: Path, edit: str, cached: bool
) -> None:
    held, change = EDITS[edit]
    far = Holds(held()).named("far").at("one")
    g = soma.Graph.somatize(Add(0).named("a") >> far >> Add(100).named("b").at("two"))
    cache = soma.Cache(tmp_path / "cache") if cached else None
    assert g.forward(10, cache=cache) == 111
    assert g.forward(10, cache=cache) == 111
    change(far)
    assert g.forward(10, cache=cache) == 115
    # Sent at the first run, not at the second, and again after the edit, alone: the other
    # host's slice was sent once.
    assert counted.loads("one") == [[["far"]], [["far"]]]
    assert counted.loads("two") == [[["b"]]]


class Tally(soma.Node):
    """Adds ``k``, leaving a file in ``folder`` per call: the calls of a node on a host, seen
    from the caller's process."""

    def __init__(self, folder: Path, k: int) -> None:
        self.folder = folder
        self.k = k

    def forward(self, x: int, ctx: Any) -> int:
        (self.folder / f"{ctx.node}-{uuid.uuid4().hex}").touch()
        return x + self.k


class FailsWhile(soma.Node):
    """Fails while the file ``flag`` exists: a run cut off after its slice returned."""

    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def forward(self, x: int) -> int:
        if self.flag.exists():
            raise ValueError("cut off after the slice")
        return x * 10


def test_a_journal_records_a_slice_when_it_returns_and_a_resume_never_runs_it_again(
    cluster: RayHosts, tmp_path: Path
) -> None:
    calls, flag = tmp_path / "calls", tmp_path / "broken"
    calls.mkdir()
    flag.touch()
    g = soma.Graph.somatize(
        Add(1).named("a")
        >> (Tally(calls, 10).named("b") >> Tally(calls, 100).named("c")).at("one")
        >> FailsWhile(flag).named("last")
    )
    journal = soma.Journal(tmp_path / "runs.db")
    with pytest.raises(ValueError, match="cut off after the slice"):
        g.forward(0, run="r", journal=journal)
    assert sorted(path.name.split("-")[0] for path in calls.iterdir()) == ["b", "c"]
    flag.unlink()
    assert g.resume("r", journal=journal) == 1110
    assert len(list(calls.iterdir())) == 2
    assert journal.run("r").status == "finished"
