"""``soma.remote``: slices of a graph run on other hosts, behind one narrow interface.

A node placed on a host (``.at("gpu-box")``, ``g.place_at``) runs there. The core cuts the
plan into slices (``g.distributed_plan()``: every largest subtree on one host is one
``Remote`` step); this module runs them. It rewrites the graph once per change into a local
graph where each slice is one node — it sends the values the slice reads, waits for the values
later steps read, and hands each to a stand-in node under the remote node's own id — and lets
Soma's engine run that graph as any other: the branches of a wave, slices on different hosts
among them, run at the same time. On the host, a slice runs on Soma's engine too
(:class:`SliceRunner`: a ``soma.Graph`` of the slice's nodes).

What a host *is* stays behind :class:`Transport` and :class:`RemoteHost`: the Ray one
(:class:`RayHosts`) is the default, and imports Ray only when it first serves a host; a graph
without hosts never reaches a transport, so it never imports or starts Ray.
"""

from __future__ import annotations

import contextvars
import threading
import uuid
import weakref
from typing import Any

from soma._ray_hosts import RESOURCE_PREFIX, RayHosts, resource_of
from soma._slices import INPUT, PassThrough, RemoteHost, Slice, SliceRunner, Transport, fresh_id

# A `soma.Graph` is written `Any` here: `soma._graph` imports this module, and the layout
# keeps imports one way (tests/test_layout.py).
Graph = Any

__all__ = [
    "INPUT",
    "RESOURCE_PREFIX",
    "RayHosts",
    "RemoteHost",
    "Slice",
    "SliceRunner",
    "Transport",
    "resource_of",
    "transport",
    "use",
]

_transport: Transport | None = None
_transport_lock = threading.Lock()


def use(serving: Transport | None) -> None:
    """Runs slices through ``serving`` from now on; ``None`` goes back to the default, a
    :class:`RayHosts` made on first use."""
    global _transport
    _transport = serving


def transport() -> Transport:
    """The transport slices run through: the one given to :func:`use`, else Ray's."""
    global _transport
    with _transport_lock:  # Branches on two hosts may ask first at the same time.
        if _transport is None:
            _transport = RayHosts()
        return _transport


#: The timeout of the run in progress, seen by its slices on the threads of its branches
#: (each runs in a copy of the caller's context).
_timeout: contextvars.ContextVar[float | None] = contextvars.ContextVar("soma_remote_timeout")


class _SliceCall:
    """Locally: a slice, as one node. Sends what the slice reads, returns what it returns."""

    def __init__(self, owner: Distributed, index: int, carrier: str | None) -> None:
        self._owner = weakref.ref(owner)  # The local graph holds this node; no cycle.
        self.index = index
        self.carrier = carrier

    def forward(self, x: Any) -> dict[str, Any]:
        owner = self._owner()
        assert owner is not None, "a slice runs only while its graph's distribution lives"
        reads = owner.slices[self.index].reads
        if len(reads) == 1:
            inputs = {reads[0]: x}
        else:
            inputs = {read: x[self.carrier if read == INPUT else read] for read in reads}
        return owner.run(self.index, inputs, _timeout.get(None))


class _Pick:
    """Locally: a remote node's output, under its own id, out of its slice's returns."""

    def __init__(self, node: str) -> None:
        self.node = node

    def forward(self, returns: dict[str, Any]) -> Any:
        return returns[self.node]


class Distributed:
    """A graph with hosts, rewritten for running: its slices, and the local graph that runs
    each as one node. Valid while the graph's nodes, edges, hosts and devices stay."""

    def __init__(self, graph: Graph) -> None:
        self.key = uuid.uuid4().hex
        self.fingerprint = _fingerprint(graph)
        self.slices = _slices(graph)
        slice_of = {node: piece.index for piece in self.slices for node in piece.names()}
        taken = set(graph.nodes())
        self.slice_ids = [fresh_id(f"{piece.host}#{piece.index}", taken) for piece in self.slices]
        carriers = [
            fresh_id(INPUT, taken) if INPUT in piece.reads and len(piece.reads) > 1 else None
            for piece in self.slices
        ]
        local = type(graph)()
        devices = graph.devices()
        added: set[int] = set()
        for node in graph.nodes():
            index = slice_of.get(node)
            if index is None:
                local.node(node, graph.implementation(node))
                if node in devices:
                    local.place(node, devices[node])
                continue
            if index not in added:
                added.add(index)
                carrier = carriers[index]
                if carrier is not None:
                    local.node(carrier, PassThrough())
                local.node(self.slice_ids[index], _SliceCall(self, index, carrier))
            if node in self.slices[index].returns:
                local.node(node, _Pick(node))
        local._hosts.clear()  # Stand-ins run here; their slices are where the hosts are.
        local.idle_threads = graph.idle_threads
        for node in graph.nodes():
            index = slice_of.get(node)
            if index is None:
                for source in graph.predecessors(node):
                    local.edge(source, node)
            elif node in self.slices[index].returns:
                local.edge(self.slice_ids[index], node)
        for piece, carrier in zip(self.slices, carriers, strict=True):
            call = self.slice_ids[piece.index]
            if carrier is not None:
                local.edge(carrier, call)
            for read in piece.reads:
                if read != INPUT:
                    local.edge(read, call)
        self.local = local
        self._hosts: dict[str, RemoteHost] = {}
        # Two branches' slices for one host, run first at the same time, load it once.
        self._loading = threading.Lock()
        weakref.finalize(self, _unload, self._hosts, self.key)

    def run(self, index: int, inputs: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Slice ``index`` on its host, loading this graph's slices there first if that host
        has not got them (first run, or a host that came back)."""
        name = self.slices[index].host
        host = transport().host(name)
        if self._hosts.get(name) is not host:
            with self._loading:
                if self._hosts.get(name) is not host:
                    host.load(self.key, [piece for piece in self.slices if piece.host == name])
                    self._hosts[name] = host
        return host.run(self.key, index, inputs, timeout)


def _unload(hosts: dict[str, RemoteHost], key: str) -> None:
    for host in hosts.values():
        host.unload(key)


def _fingerprint(graph: Graph) -> tuple[Any, ...]:
    # Nodes and edges are only ever added: their counts say whether either changed.
    return (
        len(graph),
        len(graph.edges()),
        tuple(graph.hosts().items()),
        tuple(graph.devices().items()),
    )


def _slices(graph: Graph) -> list[Slice]:
    """The slices of ``graph``'s distributed plan, in plan order."""
    plan = graph.distributed_plan()
    found: list[tuple[str, Any]] = []
    stack = [plan]
    while stack:  # Plan order, without recursion: a plan nests as deep as its graph.
        at = stack.pop()
        if at.kind == "Remote":
            assert at.host is not None
            found.append((at.host, at.children[0]))
        else:
            stack.extend(reversed(at.children))
    leaves = set(graph.leaves())
    devices = graph.devices()
    slices = []
    for index, (host, inner) in enumerate(found):
        steps: list[tuple[str, tuple[str, ...]]] = []
        stack = [inner]
        while stack:
            at = stack.pop()
            if at.kind == "Execute":
                assert at.node is not None
                steps.append((at.node, tuple(at.inputs)))
            stack.extend(reversed(at.children))
        inside = {node for node, _ in steps}
        reads = list(dict.fromkeys(s for _, inputs in steps for s in inputs or (INPUT,)))
        returns = [
            node
            for node, _ in steps
            if node in leaves or any(t not in inside for t in graph.successors(node))
        ]
        slices.append(
            Slice(
                host=host,
                index=index,
                nodes=tuple((node, graph.implementation(node)) for node, _ in steps),
                steps=tuple(steps),
                reads=tuple(s for s in reads if s not in inside),
                returns=tuple(returns),
                devices=tuple((n, devices[n]) for n, _ in steps if n in devices),
                engine=type(graph),
            )
        )
    return slices


def forward(
    graph: Graph,
    input: Any,
    driver: Any,
    turn_limit: int,
    trace: Any,
    timeout: float | None,
) -> Any:
    """``graph.forward`` for a graph with hosts: its slices run on them, the rest here."""
    distributed = graph._remote
    if distributed is None or distributed.fingerprint != _fingerprint(graph):
        distributed = graph._remote = Distributed(graph)
    token = _timeout.set(timeout)
    try:
        return distributed.local._core.forward(input, driver, turn_limit, trace, timeout)
    except BaseException as raised:
        _drop_stand_in_note(raised, distributed.slice_ids)
        raise
    finally:
        _timeout.reset(token)


def _drop_stand_in_note(raised: BaseException, slice_ids: list[str]) -> None:
    """Removes the note the local engine added naming a slice's stand-in node: the error
    names its own node and host already (see :class:`RemoteHost`)."""
    notes = getattr(raised, "__notes__", None)
    if notes and notes[-1] in {f"raised in soma node `{sid}`" for sid in slice_ids}:
        notes.pop()
