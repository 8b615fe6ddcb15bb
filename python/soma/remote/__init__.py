"""``soma.remote``: slices of a graph run on other hosts, behind one narrow interface.

A node placed on a host (``.at("gpu-box")``, ``g.place_at``) runs there. The core cuts the
plan into slices (``g.distributed_plan()``: every largest subtree on one host is one
``Remote`` step); this module runs them. It rewrites the graph once per change into a local
graph where each slice is one node — it sends the values the slice reads, waits for the values
later steps read, and hands each to a stand-in node under the remote node's own id — and lets
Soma's engine run that graph as any other: the branches of a wave, slices on different hosts
among them, run at the same time. On the host, a slice runs on Soma's engine too
(:class:`SliceRunner`: a ``soma.Graph`` of the slice's nodes). A run that is given up (Ctrl-C,
its timeout, a failed slice) cancels its slices still running on hosts (:class:`_Run`).

A host keeps copies of its slices' nodes, so a node edited here must be sent again: before each
run of a slice, its nodes' fingerprints (``soma.cache._fingerprint``: code and state, remembered
for a node whose state cannot change in place) are compared with those they had when it was
sent, and the slice alone is sent again if one differs (:meth:`Distributed._send`).

With a cache, the local graph runs with it, its stand-ins kept out (they stand for nodes keyed
where they run); a folder cache is sent to each slice, whose host opens the same folder and
keys the slice's nodes there, and what it did there is added to the cache's counts here. A
cache in memory cannot be reached from a host: the slices run uncached, with one warning.

A run with a journal (``run=``, ``journal=``) runs the local graph with the journal's recording
as its cache (``soma.journal``), the user's cache, if any, behind it: the journal records a
slice here, in the caller, when the slice returns — its stand-in under a key of the run that
covers the slice's nodes' code and state (:meth:`_SliceCall.cache_key`) and what it reads, and
each node it returns under its own id — so a resume answers a finished slice from the journal
and never sends it again, and runs a slice again once one of its nodes was edited.

What a host *is* stays behind :class:`Transport` and :class:`RemoteHost`: the Ray one
(:class:`RayHosts`) is the default, and imports Ray only when it first serves a host; a graph
without hosts never reaches a transport, so it never imports or starts Ray.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from soma import _soma
from soma._run import observe as _observe
from soma.cache import _fingerprint
from soma.cache._cache import Cache
from soma.errors import CancelledError, RemoteError
from soma.journal._recording import Recording
from soma.remote._ray_hosts import RESOURCE_PREFIX, RayHosts, resource_of
from soma.remote._slices import (
    CANCEL_WAIT,
    DEADLINE_GRACE,
    INPUT,
    FolderCache,
    PassThrough,
    RemoteHost,
    Settings,
    Slice,
    SliceRunner,
    Transport,
    cut,
    fresh_id,
)

if TYPE_CHECKING:
    from soma.cache._cache import RunCacheSource

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


class _Run:
    """One ``forward`` of a graph with hosts, as its slices see it: its deadline, its trace, and
    the slice runs in flight on hosts, to cancel there once the run is given up — by the caller
    (Ctrl-C, its timeout, an error here) or by a slice's failure."""

    def __init__(self, timeout: float | None, trace: Any, cache: Cache | None = None) -> None:
        self.timeout = timeout
        #: The run's cache, which counts what hosts did in the folder it sent them, if any.
        self.cache = cache
        self.folder: FolderCache | None = None if cache is None else cache._folder()
        #: The run's ``soma.Trace``, if it has one: its slices' spans join it.
        self.trace = trace
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self._lock = threading.Lock()
        #: By token: the host and the slice's index, in plan order.
        self._in_flight: dict[str, tuple[RemoteHost, int]] = {}
        #: Slices past this index are cancelled, and none starts: ``None`` while none is.
        self._stop_after: int | None = None
        #: The failure of the earliest slice that failed, and that slice's index: what
        #: ``forward`` raises when the error it meets first is only a slice cancelled for it.
        self.failure: BaseException | None = None
        self._failed_at: int | None = None
        #: The ``TimeoutError`` of a slice whose wait ended with the run's deadline, if one did.
        self.timed_out: TimeoutError | None = None

    def time_left(self) -> float | None:
        """Seconds until the run's deadline, if it has one."""
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def ran_out(self, piece: Slice, state: str) -> TimeoutError:
        """The run's ``TimeoutError``, its time having run out while ``piece`` was ``state``
        on its host; kept as the one to raise (see :func:`forward`)."""
        self.timed_out = _soma.hosts_past_timeout(
            self.timeout, f"; still running: {piece.listed()} on host `{piece.host}`, {state}"
        )
        return self.timed_out

    def cancel_wait(self) -> float:
        """Seconds a cancel may wait for its host to confirm: :data:`CANCEL_WAIT`, and never
        past the run's deadline by more than :data:`DEADLINE_GRACE`."""
        if self.deadline is None:
            return CANCEL_WAIT
        return min(CANCEL_WAIT, max(self.deadline + DEADLINE_GRACE - time.monotonic(), 0.0))

    def begin(self, host: RemoteHost, index: int) -> str | None:
        """A token for a run of slice ``index`` about to start on ``host``; ``None`` once that
        slice is cancelled."""
        with self._lock:
            if self._stop_after is not None and index > self._stop_after:
                return None
            token = uuid.uuid4().hex
            self._in_flight[token] = (host, index)
            return token

    def end(self, token: str) -> None:
        """The slice run ``token`` was answered, or its transport cancelled it itself."""
        with self._lock:
            self._in_flight.pop(token, None)

    def abandon(self) -> None:
        """Cancels every slice run still in flight, host by host; none starts after this."""
        self._cancel_after(-1)

    def failed(self, index: int, failure: BaseException) -> None:
        """Slice ``index`` failed with ``failure``: the slices after it in plan order — the
        branches declared after its own, whose errors could not win over it — are cancelled;
        those before it run on, since their own errors would."""
        with self._lock:
            if self._failed_at is None or index < self._failed_at:
                self.failure, self._failed_at = failure, index
        self._cancel_after(index)

    def _cancel_after(self, index: int) -> None:
        with self._lock:
            if self._stop_after is None or index < self._stop_after:
                self._stop_after = index
            stop = self._stop_after
            cancelled = [t for t, (_, at) in self._in_flight.items() if at > stop]
            by_host: dict[int, tuple[RemoteHost, list[str]]] = {}
            for token in cancelled:
                host, _ = self._in_flight.pop(token)
                by_host.setdefault(id(host), (host, []))[1].append(token)
        for host, tokens in by_host.values():
            host.cancel(tokens, self.cancel_wait())


#: The run in progress, seen by its slices on the threads of its branches (each runs in a copy
#: of the caller's context).
_current: contextvars.ContextVar[_Run] = contextvars.ContextVar("soma_remote_run")


class _SliceCall:
    """Locally: a slice, as one node. Sends what the slice reads, returns what it returns.
    Kept out of a cache: it stands for nodes that are keyed on their host."""

    cacheable = False

    def __init__(self, owner: Distributed, index: int, carrier: str | None) -> None:
        self._owner = weakref.ref(owner)  # The local graph holds this node; no cycle.
        self.index = index
        self.carrier = carrier

    def cache_key(self) -> object:
        """The slice's nodes' fingerprints (code and state), which a journal keys the slice
        by, so that a resume runs a slice again once one of its nodes was edited; a key that
        matches none (a fresh id) when one cannot be taken."""
        owner = self._owner()
        state = None if owner is None else _state(owner.slices[self.index])
        return uuid.uuid4().bytes if state is None else state

    def forward(self, x: Any) -> dict[str, Any]:
        owner = self._owner()
        assert owner is not None, "a slice runs only while its graph's distribution lives"
        reads = owner.slices[self.index].reads
        if len(reads) == 1:
            inputs = {reads[0]: x}
        else:
            inputs = {read: x[self.carrier if read == INPUT else read] for read in reads}
        return owner.run(self.index, inputs, _current.get())


class _Pick:
    """Locally: a remote node's output, under its own id, out of its slice's returns. Kept out
    of a cache, which would keep a second copy of what the host keeps."""

    cacheable = False

    def __init__(self, node: str) -> None:
        self.node = node

    def forward(self, returns: dict[str, Any]) -> Any:
        return returns[self.node]


class Hosted:
    """A graph, as its runs with nodes on hosts take it from ``soma.Graph`` (which hands it to
    its core, to pass on to :func:`forward` when a run is routed here): its core, its class,
    which makes the graphs that run its slices (:attr:`Slice.engine`), and what a run made of it
    last (:class:`Distributed`), kept while it stays the same."""

    __slots__ = ("core", "distributed", "engine")

    def __init__(self, core: _soma.GraphCore, engine: type[Any]) -> None:
        self.core = core
        self.engine = engine
        self.distributed: Distributed | None = None


class Distributed:
    """A graph with hosts, rewritten for running: its slices, and the local graph that runs
    each as one node. Valid while the graph's nodes, edges, hosts and devices stay."""

    def __init__(self, core: _soma.GraphCore, engine: type[Any]) -> None:
        """Made of the graph of ``core``, of the class ``engine``, which makes the local graph
        as it makes the graphs that run the slices."""
        self.key = uuid.uuid4().hex
        self.fingerprint = _graph_fingerprint(core)
        self.slices = _slices(core, engine)
        slice_of = {node: piece.index for piece in self.slices for node in piece.names()}
        taken = set(core.nodes())
        self.slice_ids = [fresh_id(f"{piece.host}#{piece.index}", taken) for piece in self.slices]
        carriers = [
            fresh_id(INPUT, taken) if INPUT in piece.reads and len(piece.reads) > 1 else None
            for piece in self.slices
        ]
        local = engine()
        devices = dict(core.devices())
        retries, time_limits = dict(core.retries()), dict(core.time_limits())
        added: set[int] = set()
        picks: set[str] = set()
        for node in core.nodes():
            index = slice_of.get(node)
            if index is None:
                local.node(node, core.implementation(node))
                if node in devices:
                    local.place(node, devices[node])
                # What the graph holds, not what the node said: `retry(id, None)` may undo it.
                if node in retries:
                    local.retry(node, *retries[node])
                else:
                    local.retry(node, None)
                local.time_limit(node, time_limits.get(node))
                continue
            if index not in added:
                added.add(index)
                carrier = carriers[index]
                if carrier is not None:
                    local.node(carrier, PassThrough())
                local.node(self.slice_ids[index], _SliceCall(self, index, carrier))
            if node in self.slices[index].returns:
                local.node(node, _Pick(node))
                picks.add(node)
        #: The local nodes that stand for nothing of the user's, which a watched run does not
        #: tell of (`soma._run.observe.hidden`): the picks (a host's node is told of by its host)
        #: and the carriers of the input.
        self.stand_ins = frozenset(picks) | {carrier for carrier in carriers if carrier}
        for node in local.hosts():  # Stand-ins run here; their slices are where the hosts are.
            local.place_at(node, None)
        local.idle_threads = core.idle_threads
        for node in core.nodes():
            index = slice_of.get(node)
            if index is None:
                for source in core.predecessors(node):
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
        #: By host name: the host that holds this graph's slices there.
        self._hosts: dict[str, RemoteHost] = {}
        #: By slice index: the state of its nodes when it was last sent (see :func:`_state`).
        self._sent: dict[int, tuple[bytes, ...] | None] = {}
        # By host: two runs of its slices at the same time send it what it lacks once; the
        # slices of two hosts are sent at the same time.
        self._sending = {piece.host: threading.Lock() for piece in self.slices}
        weakref.finalize(self, _unload, self._hosts, self.key)

    def _send(self, piece: Slice, host: RemoteHost, run: _Run) -> None:
        """Sends ``host`` what it lacks to run ``piece`` as its nodes are now: every slice of
        this graph for a host that has none of them (first run, or a host that came back), else
        ``piece`` alone if a node of it changed since it was sent; nothing otherwise."""
        # Taken before the nodes are pickled: an edit made meanwhile is sent again next run.
        state = _state(piece)
        held = self._hosts.get(piece.host) is host
        if held and state is not None and self._sent.get(piece.index) == state:
            return  # The common case: one fingerprint per node, no lock, nothing sent.
        with self._sending[piece.host]:
            if self._hosts.get(piece.host) is not host:
                slices = [other for other in self.slices if other.host == piece.host]
                states = {other.index: _state(other) for other in slices if other is not piece}
                states[piece.index] = state
            elif state is None or self._sent.get(piece.index) != state:
                slices, states = [piece], {piece.index: state}
            else:
                return  # Sent by a run of the same slice meanwhile.
            try:
                host.load(self.key, slices, run.time_left())
            except RemoteError as failed:
                # A load the run's time left cut short may end a hair before the deadline (a
                # transport's timer fires early): within the grace, it is the deadline's doing.
                left = run.time_left()
                if left is None or left > DEADLINE_GRACE:
                    raise
                raise run.ran_out(piece, "its nodes still on their way there") from failed
            self._hosts[piece.host] = host
            self._sent.update(states)

    def run(self, index: int, inputs: dict[str, Any], run: _Run) -> dict[str, Any]:
        """Slice ``index`` on its host, sending the host first what it lacks to run the slice
        as its nodes are now (see :meth:`_send`)."""
        piece = self.slices[index]
        host = transport().host(piece.host)
        self._send(piece, host, run)
        token = run.begin(host, index)
        if token is None:  # A branch that started as the run was given up: its result is dropped.
            raise CancelledError(
                f"the run was abandoned before the slice of {piece.listed()} started"
            )
        trace = run.trace
        sent = 0.0 if trace is None else trace._now()
        # A watched run (telemetry, an event stream) asks for the spans too, to tell of them.
        watched = _observe.watched()
        sent_ns = time.time_ns()
        # Only with a folder to send: a transport that runs no cached slice need not know.
        folder = {} if run.folder is None else {"cache": run.folder}
        try:
            out, spans, *counted = host.run(
                self.key,
                index,
                inputs,
                run.time_left(),
                token,
                traced=trace is not None or watched,
                **folder,
            )
        except BaseException as failed:
            run.end(token)
            raised = failed
            if isinstance(failed, RemoteError) and run.time_left() == 0.0:
                # The run's own time ran out while the host worked: a timeout, as for a local
                # node.
                raised = run.ran_out(piece, "stopped there at its next node boundary")
                raised.__cause__ = failed
            # A failed slice fails the run: the slices of later branches stop on their hosts
            # now, rather than run to their end while the engine waits for them. (A slice
            # cancelled here has not failed: what cancelled it did.)
            if not isinstance(failed, CancelledError):
                run.failed(index, raised)
            if raised is failed:
                raise
            raise raised from failed
        run.end(token)
        if trace is not None:
            trace._adopt(spans, piece.host, sent)
        if watched:
            _observe.adopt(spans, piece.host, sent_ns)
        if run.cache is not None and counted and counted[0]:
            run.cache._counts.add(**counted[0])
        return out


def _unload(hosts: dict[str, RemoteHost], key: str) -> None:
    for host in hosts.values():
        host.unload(key)


def _graph_fingerprint(core: _soma.GraphCore) -> tuple[Any, ...]:
    # Nodes and edges are only ever added: their counts say whether either changed.
    return (
        len(core),
        len(core.edges()),
        tuple(core.hosts()),
        tuple(core.devices()),
        tuple(core.retries()),
        tuple(core.time_limits()),
    )


def _state(piece: Slice) -> tuple[bytes, ...] | None:
    """The fingerprint of each of ``piece``'s nodes (their code and state, see
    :mod:`soma.cache._fingerprint`): what a run compares with what was sent. ``None`` when one
    cannot be taken: such a slice is sent again before every run, since no edit to it could be
    seen."""
    try:
        return tuple(_fingerprint.fingerprint(node) for _, node in piece.nodes)
    # Not only `Unkeyable`: what a node holds may fail to be read in its own way (a tensor on
    # `meta` has no bytes), and a run must not fail for a check it can do without.
    except Exception:
        return None


def _slices(core: _soma.GraphCore, engine: type[Any]) -> list[Slice]:
    """The slices of the distributed plan of the graph of ``core``, of the class ``engine``, in
    plan order."""
    plan = core.distributed_plan()
    found: list[tuple[str, Any]] = []
    stack = [plan]
    while stack:  # Plan order, without recursion: a plan nests as deep as its graph.
        at = stack.pop()
        if at.kind == "Remote":
            assert at.host is not None
            found.append((at.host, at.children[0]))
        else:
            stack.extend(reversed(at.children))
    settings = Settings.of(core)
    return [
        cut(core, engine, host, index, inner, settings) for index, (host, inner) in enumerate(found)
    ]


def _users_cache(cache: RunCacheSource | None) -> Cache | None:
    """The :class:`soma.Cache` a run was given: ``cache`` itself, or the one behind a
    journal's recording (``soma.journal``), which is what hosts may share."""
    if isinstance(cache, Recording):
        return cache.cache
    assert cache is None or isinstance(cache, Cache)
    return cache


def _started(
    graph: Hosted, timeout: float | None, trace: Any, given: RunCacheSource | None
) -> tuple[_Run, Distributed]:
    """A run of ``graph``'s slices, and the graph that runs them (:class:`Distributed`), made
    again if ``graph`` changed."""
    distributed = graph.distributed
    if distributed is None or distributed.fingerprint != _graph_fingerprint(graph.core):
        distributed = graph.distributed = Distributed(graph.core, graph.engine)
    cache = _users_cache(given)
    run = _Run(timeout, trace, cache)
    if cache is not None and run.folder is None:
        hosts = ", ".join(f"`{host}`" for host in dict.fromkeys(p.host for p in distributed.slices))
        cache._warn_once(
            "hosts",
            f"the nodes on hosts {hosts} run uncached: a cache in memory cannot be reached from "
            "another host\nhint: give the run a folder cache, `soma.Cache(path)`, at a path "
            "the hosts share",
        )
    return run, distributed


def _given_up(raised: BaseException, run: _Run, distributed: Distributed) -> BaseException:
    """What a run of a graph with hosts raises when the local graph raised ``raised``: the run
    is given up, and its slices still running on hosts stop there too."""
    run.abandon()
    if isinstance(raised, CancelledError) and run.failure is not None:
        # The branch whose error won was only stopped for another's: as a local branch
        # stopped at a node boundary, it has no error of its own, and the other's wins.
        return run.failure
    _drop_stand_in_note(raised, distributed.slice_ids)
    if isinstance(raised, TimeoutError):
        ours = run.timed_out
        if ours is not None and raised is not ours and str(ours) in str(raised):
            # The engine's deadline met a slice's: the slice's says it all, once.
            return ours
        _name_slices(raised, distributed)
    return raised


@contextlib.contextmanager
def _running(
    graph: Hosted, timeout: float | None, trace: Any, cache: RunCacheSource | None
) -> Iterator[Any]:
    """A run of ``graph``'s local graph, its slices on their hosts: yields the local graph's
    core, seen by the slices' stand-ins as the run in progress; what the local graph raises
    comes out as the run with hosts raises it (see :func:`_given_up`)."""
    run, distributed = _started(graph, timeout, trace, cache)
    token = _current.set(run)
    hiding = _observe.hidden.set(distributed.stand_ins)
    try:
        yield distributed.local._core
    except BaseException as raised:
        raised_instead = _given_up(raised, run, distributed)
        if raised_instead is raised:
            raise
        raise raised_instead from raised_instead.__cause__
    finally:
        _observe.hidden.reset(hiding)
        _current.reset(token)


def forward(
    graph: Hosted,
    input: Any,
    driver: Any,
    turn_limit: int,
    trace: Any,
    timeout: float | None,
    cache: RunCacheSource | None = None,
) -> Any:
    """``graph.forward`` for a graph with hosts: its slices run on them, the rest here;
    ``cache`` a :class:`soma.Cache` or a journal's recording."""
    with _running(graph, timeout, trace, cache) as local:
        return local.forward(input, driver, turn_limit, trace, timeout, cache=cache)


async def aforward(
    graph: Hosted,
    input: Any,
    driver: Any,
    turn_limit: int,
    trace: Any,
    timeout: float | None,
    cache: RunCacheSource | None = None,
) -> Any:
    """``graph.aforward`` for a graph with hosts: as :func:`forward`, the local graph awaited
    on the running loop, its slices' stand-ins sync nodes that wait for their hosts on lent
    threads."""
    with _running(graph, timeout, trace, cache) as local:
        return await local.aforward(input, driver, turn_limit, trace, timeout, cache=cache)


def _name_slices(raised: TimeoutError, distributed: Distributed) -> None:
    """Names the nodes of each slice the engine's ``TimeoutError`` names by its stand-in."""
    message = str(raised)
    for piece, stand_in in zip(distributed.slices, distributed.slice_ids, strict=True):
        message = message.replace(f"`{stand_in}`", f"{piece.listed()} on host `{piece.host}`")
    if message != str(raised):
        raised.args = (message,)


def _drop_stand_in_note(raised: BaseException, slice_ids: list[str]) -> None:
    """Removes the note the local engine added naming a slice's stand-in node: the error
    names its own node and host already (see :class:`RemoteHost`)."""
    notes = getattr(raised, "__notes__", None)
    if notes and notes[-1] in {f"raised in soma node `{sid}`" for sid in slice_ids}:
        notes.pop()
