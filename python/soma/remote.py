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
(:class:`RayHosts`) is the default, and the only module that imports Ray; a graph without
hosts never reaches this module's transport, so it never imports or starts Ray.
"""

from __future__ import annotations

import contextvars
import dataclasses
import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from soma.errors import RemoteError

if TYPE_CHECKING:
    from soma._graph import Graph

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

#: The key under which a slice receives the graph's own input, for the steps that read it.
INPUT = "(input)"

#: The Ray rule: the Ray node(s) of host ``name`` offer the custom resource
#: ``soma-host:<name>`` (``ray start --resources='{"soma-host:gpu-box": 1}'``).
RESOURCE_PREFIX = "soma-host:"


def resource_of(host: str) -> str:
    """The Ray custom resource that marks the node(s) of ``host``: ``soma-host:<host>``."""
    return RESOURCE_PREFIX + host


@dataclasses.dataclass(frozen=True)
class Slice:
    """One remote slice: what a host needs to run it, sent once per graph.

    ``nodes`` are the slice's ``(id, implementation)`` pairs, ``steps`` its ``(node, inputs)``
    in plan order (no inputs: the graph's input), ``reads`` what it reads from outside it
    (:data:`INPUT` for the graph's input), ``returns`` the nodes whose outputs later steps read
    or the run returns, ``devices`` the slice's placed nodes and their devices."""

    host: str
    index: int
    nodes: tuple[tuple[str, Any], ...]
    steps: tuple[tuple[str, tuple[str, ...]], ...]
    reads: tuple[str, ...]
    returns: tuple[str, ...]
    devices: tuple[tuple[str, str], ...] = ()

    def names(self) -> list[str]:
        """The slice's nodes, in plan order."""
        return [node for node, _ in self.steps]


class RemoteHost(Protocol):
    """One host, as a transport serves it."""

    def load(self, key: str, slices: list[Slice]) -> None:
        """Keeps ``slices`` under ``key`` (one graph's) on the host, replacing what was there."""

    def run(
        self, key: str, index: int, inputs: dict[str, Any], timeout: float | None
    ) -> dict[str, Any]:
        """Runs slice ``index`` of ``key`` on ``inputs`` (by source id) and returns its
        ``returns`` by id. A node's exception comes out as itself; a host that cannot answer
        within ``timeout`` seconds, or at all, is a :class:`soma.RemoteError`."""

    def unload(self, key: str) -> None:
        """Forgets ``key``'s slices; never raises."""


class Transport(Protocol):
    """Where hosts come from: the one thing to implement to run slices on another engine."""

    def host(self, name: str) -> RemoteHost:
        """The host named ``name``: the same object while it lives, a new one once it died.
        A :class:`soma.RemoteError` naming the host and the fix if there is none."""


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
            from soma._ray_hosts import RayHosts

            _transport = RayHosts()
        return _transport


def __getattr__(name: str) -> Any:
    # `RayHosts` lives with Ray's imports, loaded only when asked for.
    if name == "RayHosts":
        from soma._ray_hosts import RayHosts

        return RayHosts
    raise AttributeError(f"module 'soma.remote' has no attribute {name!r}")


if TYPE_CHECKING:
    from soma._ray_hosts import RayHosts


class _Take:
    """On a host: a slice's source, what the slice reads from ``source``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def forward(self, inputs: dict[str, Any]) -> Any:
        return inputs[self.source]


class _Pass:
    """Its input, as it is: a slice's output tap, the local carrier of the graph's input."""

    def forward(self, x: Any) -> Any:
        return x


class SliceRunner:
    """A slice, ready to run on its host: a ``soma.Graph`` of its nodes, read from a root per
    source (:data:`INPUT` included) and tapped once per returned node, built once."""

    def __init__(self, piece: Slice) -> None:
        from soma._graph import Graph

        graph = Graph()
        taken = {node for node, _ in piece.nodes} | set(piece.reads) - {INPUT}
        sources: dict[str, str] = {}
        for read in piece.reads:
            source = _fresh(read, taken) if read == INPUT else read
            graph.node(source, _Take(read))
            sources[read] = source
        for node, implementation in piece.nodes:
            graph.node(node, implementation)
        graph._hosts.clear()  # Here is where they run: no host is remote to itself.
        for node, device in piece.devices:
            graph.place(node, device)
        for node, inputs in piece.steps:
            for source in inputs or (INPUT,):
                graph.edge(sources.get(source, source), node)
        self._taps: dict[str, str] = {}
        for node in piece.returns:
            tap = _fresh(f"{node}(out)", taken)
            graph.node(tap, _Pass())
            graph.edge(node, tap)
            self._taps[tap] = node
        self.graph = graph

    def run(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """The slice's returns, by node id, run on ``inputs``."""
        out = self.graph.forward(inputs)
        if len(self._taps) == 1:
            return {node: out for node in self._taps.values()}
        return {self._taps[tap]: value for tap, value in out.items()}


def _fresh(base: str, taken: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3``…: the first not in ``taken``, which it joins."""
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


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
        from soma._graph import Graph

        self.key = uuid.uuid4().hex
        self.fingerprint = _fingerprint(graph)
        self.slices = _slices(graph)
        slice_of = {node: piece.index for piece in self.slices for node in piece.names()}
        taken = set(graph.nodes())
        self.slice_ids = [_fresh(f"{piece.host}#{piece.index}", taken) for piece in self.slices]
        carriers = [
            _fresh(INPUT, taken) if INPUT in piece.reads and len(piece.reads) > 1 else None
            for piece in self.slices
        ]
        local = Graph()
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
                    local.node(carrier, _Pass())
                local.node(self.slice_ids[index], _SliceCall(self, index, carrier))
            if node in self.slices[index].returns:
                local.node(node, _Pick(node))
        local._hosts.clear()  # Stand-ins run here; their slices are where the hosts are.
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
        weakref.finalize(self, _unload, self._hosts, self.key)

    def run(self, index: int, inputs: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Slice ``index`` on its host, loading this graph's slices there first if that host
        has not got them (first run, or a host that came back)."""
        name = self.slices[index].host
        host = transport().host(name)
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


def remote_error(host: str, piece: Slice, message: str, hint: str) -> RemoteError:
    """A :class:`soma.RemoteError` about ``piece`` on ``host``."""
    nodes = ", ".join(f"`{node}`" for node in piece.names())
    error = RemoteError(f"host `{host}` {message} (slice of {nodes})\nhint: {hint}")
    error.host = host
    error.slice = piece.names()
    error.node = piece.names()[0]
    return error
