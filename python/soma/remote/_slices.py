"""Remote slices, as data and as something to run: what every transport shares.

A :class:`Slice` is what a host needs to run one slice of a graph; a :class:`SliceRunner` runs it
on the host with Soma's own engine. :class:`Transport` and :class:`RemoteHost` are the narrow
interface a transport implements (Ray's is ``soma.remote._ray_hosts``). Nothing here imports a
transport, or the graph: a slice carries the graph class it runs with.

A run with a folder cache (``soma.Cache(path)``) sends its folder along (:class:`FolderCache`):
the host opens the same folder — on a local Ray cluster, or any cluster sharing that path, it is
the same folder — and its slice's nodes are keyed there as the caller would key them, so a
rerun finds them without any of them being called, and the caller's ``would_hit`` sees them.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any, Protocol

from soma._soma import DEFAULT_TURN_LIMIT, GraphCore, Plan, StopFlag, Trace, step_and_rest
from soma.cache._cache import Cache, CacheWarning
from soma.errors import RemoteError

#: The kinds of plan steps that run sub-plans of their own, registered with their step.
DECIDING = frozenset(("Map", "Switch", "Loop"))

INPUT = "(input)"
"""The key under which a slice receives the graph's own input, for the steps that read it."""

#: A span as a host ships it back with its slice's result (``soma.Trace._ship``): node, start,
#: end, thread, branch path, turns, error, device, whether it was found in the cache.
Shipped = tuple[str, float, float, int, list[int], int, str | None, str | None, bool]

#: A folder cache as a host opens it: its path, its ``max_bytes`` and its ``key``.
FolderCache = tuple[str, int | None, bytes | None]

#: What a host's cache did for one slice run: ``soma.CacheStats``'s fields, by name, to be
#: added to the caller's.
CacheCounts = dict[str, float]

#: Seconds a cancel waits, at most, for its host to confirm: a host that does not by then has
#: died (nothing runs there any more) or is too busy to answer, and the caller, who gave up on
#: the run, must not wait for it.
CANCEL_WAIT = 5.0

#: Seconds past a run's deadline that its cancels may still wait for their hosts to confirm: a
#: deadline is kept to within a tenth of a second, so a run with one waits no longer than this.
DEADLINE_GRACE = 0.05


@dataclasses.dataclass(frozen=True)
class Slice:
    """One remote slice: what a host needs to run it, sent at a graph's first run, and again
    whenever one of its nodes changed since.

    ``host`` is the host it runs on, ``index`` its place among the graph's slices (the key a
    host keeps it under, with the graph's), ``nodes`` the slice's ``(id, implementation)``
    pairs, ``steps`` its ``(node, inputs)``
    in plan order (no inputs: the graph's input), ``reads`` what it reads from outside it
    (:data:`INPUT` for the graph's input), ``returns`` the nodes whose outputs later steps read
    or the run returns, ``devices`` the slice's placed nodes and their devices, ``retries``
    and ``time_limits`` its nodes' policies."""

    host: str
    index: int
    nodes: tuple[tuple[str, Any], ...]
    steps: tuple[tuple[str, tuple[str, ...]], ...]
    reads: tuple[str, ...]
    returns: tuple[str, ...]
    devices: tuple[tuple[str, str], ...] = ()
    retries: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """The slice's nodes with retries, and their ``(times, backoff, on)``."""
    time_limits: tuple[tuple[str, float], ...] = ()
    """The slice's nodes with a time limit, and its seconds."""
    engine: type[Any] = object
    """The graph class the host runs the slice with: ``soma.Graph``, or a subclass of it."""

    def names(self) -> list[str]:
        """The slice's nodes, in plan order."""
        return [node for node, _ in self.steps]

    def listed(self) -> str:
        """The slice's nodes, in plan order, named as messages name nodes."""
        return ", ".join(f"`{node}`" for node in self.names())


class RemoteHost(Protocol):
    """One host, as a transport serves it."""

    def load(self, key: str, slices: list[Slice], timeout: float | None = None) -> None:
        """Keeps ``slices`` under ``key`` (one graph's) on the host, each replacing the slice
        of its index there, if any, and leaving the others of ``key`` as they are (a slice whose
        nodes changed is sent again alone); a host that has not taken them within ``timeout``
        seconds (the transport's own limit if ``None``) is a :class:`soma.RemoteError`."""

    def run(
        self,
        key: str,
        index: int,
        inputs: dict[str, Any],
        timeout: float | None,
        token: str,
        traced: bool,
        cache: FolderCache | None = None,
    ) -> tuple[dict[str, Any], list[Shipped], CacheCounts]:
        """Runs slice ``index`` of ``key`` on ``inputs`` (by source id) and returns its
        ``returns`` by id, with its nodes' spans if ``traced`` (else none) and, with ``cache``
        (a folder the host opens, see :class:`SliceRunner`), what its cache did there (empty
        without). A transport that runs no cached slice may leave ``cache`` out and answer
        the first two alone; a run with a folder cache passes it by keyword. A node's exception
        comes out as itself; a host that cannot answer within ``timeout`` seconds, or at all, is
        a :class:`soma.RemoteError`. ``token`` names this run of the slice for :meth:`cancel`;
        when the wait here ends without an answer (no answer in time, Ctrl-C) the host cancels
        it itself."""

    def cancel(self, tokens: list[str], wait: float = CANCEL_WAIT) -> None:
        """Stops the slice runs named ``tokens`` on the host at their next node boundary (a node
        running there finishes its call, nothing after it runs); one not started yet stops
        before its first node. Waits for the host to confirm ``wait`` seconds at most (the
        cancel goes out either way); never raises."""

    def unload(self, key: str) -> None:
        """Forgets ``key``'s slices; never raises."""


class Transport(Protocol):
    """Where hosts come from: the one thing to implement to run slices on another engine."""

    def host(self, name: str) -> RemoteHost:
        """The host named ``name``: the same object while it lives, a new one once it died.
        A :class:`soma.RemoteError` naming the host and the fix if there is none."""


class _Take:
    """On a host: a slice's source, what the slice reads from ``source``; kept out of a cache,
    which would only keep a second copy of what the caller sent."""

    cacheable = False

    def __init__(self, source: str) -> None:
        self.source = source

    def forward(self, inputs: dict[str, Any]) -> Any:
        return inputs[self.source]


class PassThrough:
    """Its input, as it is: a slice's output tap, the local carrier of the graph's input; kept
    out of a cache, which would only keep a second copy of its input."""

    cacheable = False

    def forward(self, x: Any) -> Any:
        return x


class SliceRunner:
    """A slice, ready to run on its host: a ``soma.Graph`` of its nodes, read from a root per
    source (:data:`INPUT` included) and tapped once per returned node, built once.

    A slice that reads the graph's input alone reads it as its own input, with no root: its
    first nodes are then keyed in a cache exactly as in the caller's graph (on the input's
    content), as the nodes after a root are (on the content of what they read).

    Made on the host from ``piece``, the :class:`Slice` the caller sent; ``graph`` is the
    ``soma.Graph`` built from it."""

    def __init__(self, piece: Slice) -> None:
        graph = piece.engine()
        taken = {node for node, _ in piece.nodes} | set(piece.reads) - {INPUT}
        sources: dict[str, str] = {}
        #: Whether the slice's input is the graph's input itself, rather than its reads by id.
        self._input_alone = piece.reads == (INPUT,)
        for read in () if self._input_alone else piece.reads:
            source = fresh_id(read, taken) if read == INPUT else read
            graph.node(source, _Take(read))
            sources[read] = source
        for node, implementation in piece.nodes:
            graph.node(node, implementation)
        for node in graph.hosts():  # Here is where they run: no host is remote to itself.
            graph.place_at(node, None)
        for node, device in piece.devices:
            graph.place(node, device)
        # What the graph held, not what each node said: `retry(id, None)` may have undone it.
        # The nodes inside a step that decides included, which it registered again just now.
        for node in graph.retries():
            graph.retry(node, None)
        for node in graph.time_limits():
            graph.time_limit(node, None)
        for node, (times, backoff, on) in piece.retries:
            graph.retry(node, times, backoff, on)
        for node, seconds in piece.time_limits:
            graph.time_limit(node, seconds)
        for node, inputs in piece.steps:
            for source in inputs or (() if self._input_alone else (INPUT,)):
                graph.edge(sources.get(source, source), node)
        self.nodes = piece.names()
        """The slice's nodes, in plan order: what an error on the host names."""
        self._nodes = set(self.nodes)
        self._taps: dict[str, str] = {}
        for node in piece.returns:
            tap = fresh_id(f"{node}(out)", taken)
            graph.node(tap, PassThrough())
            graph.edge(node, tap)
            self._taps[tap] = node
        self.graph = graph

    def argument(self, inputs: dict[str, Any]) -> Any:
        """What the slice's graph runs on, from its ``inputs`` by source: the graph's input
        itself when that is all the slice reads, else the inputs as they are."""
        return inputs[INPUT] if self._input_alone else inputs

    def run(
        self,
        inputs: dict[str, Any],
        stop: StopFlag | None = None,
        traced: bool = False,
        driver: Any = None,
        turn_limit: int = DEFAULT_TURN_LIMIT,
        cache: FolderCache | None = None,
    ) -> tuple[dict[str, Any], list[Shipped], CacheCounts]:
        """The slice's returns, by node id, run on ``inputs``, its nodes' spans if ``traced``,
        and what ``cache``, a folder opened here, did (empty without one); once ``stop`` is
        set, the run stops at its next node boundary with a :class:`soma.CancelledError`.
        ``driver`` serves its awaiting nodes, each given ``turn_limit`` calls at most, as in
        ``Graph.forward``."""
        trace = Trace() if traced else None
        # Opened for this run alone, so that its counts are this run's.
        opened = None if cache is None else _open(cache)
        out = self.graph._core.forward(
            self.argument(inputs),
            driver=driver,
            turn_limit=turn_limit,
            trace=trace,
            stop=stop,
            cache=opened,
        )
        spans = [] if trace is None else trace._ship(self._nodes)
        counts = {} if opened is None else dataclasses.asdict(opened.stats())
        if len(self._taps) == 1:
            return {node: out for node in self._taps.values()}, spans, counts
        return {self._taps[tap]: value for tap, value in out.items()}, spans, counts


# The folders a host could not open, each warned about once.
_unopened: set[str] = set()
_unopened_lock = threading.Lock()


def _open(folder: FolderCache) -> Cache | None:
    """The caller's folder cache, opened here; ``None``, with one warning per folder, where
    this host cannot make or reach it: its slices then run uncached, as they would without."""
    path, max_bytes, key = folder
    try:
        return Cache(path, max_bytes=max_bytes, key=key)
    except OSError as error:
        with _unopened_lock:
            first = path not in _unopened
            _unopened.add(path)
        if first:
            warnings.warn(
                f"the cache folder `{path}` cannot be opened on this host "
                f"({error.strerror or error}): the slices run here uncached\n"
                "hint: give the run a folder at a path every host shares",
                CacheWarning,
                stacklevel=2,
            )
        return None


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every slice of one graph reads of it, read once for them all."""

    leaves: frozenset[str]
    devices: dict[str, str]
    retries: dict[str, Any]
    time_limits: dict[str, float]

    @classmethod
    def of(cls, core: GraphCore) -> Settings:
        return cls(
            frozenset(core.leaves()),
            dict(core.devices()),
            dict(core.retries()),
            dict(core.time_limits()),
        )


def cut(
    core: GraphCore, engine: type[Any], host: str, index: int, inner: Plan, settings: Settings
) -> Slice:
    """Slice ``index`` of the graph of ``core`` (whose ``settings`` these are, and whose class
    is ``engine``): the subtree ``inner`` of its plan, to run on ``host``, reading what it needs
    from the steps before it and returning what the steps after it (or the run) read."""
    steps: list[tuple[str, tuple[str, ...]]] = []
    stack = [inner]
    while stack:  # Plan order, without recursion: a plan nests as deep as its graph.
        at = stack.pop()
        if at.node is not None:  # A step: an `Execute`, or a `Map`, `Switch` or `Loop`.
            steps.append((at.node, tuple(at.inputs)))
        if at.kind in DECIDING:
            continue  # What it runs is its own: the step is registered with it.
        stack.extend(reversed(at.children))
    inside = {node for node, _ in steps}

    # The nodes inside its steps that decide, by namespaced id: the step registers them again
    # on the host, and what the graph set on them since must go along.
    def owned(node: str) -> bool:
        step = step_and_rest(node)
        return (node if step is None else step[0]) in inside

    leaves, devices = settings.leaves, settings.devices
    retries, time_limits = settings.retries, settings.time_limits
    reads = list(dict.fromkeys(s for _, inputs in steps for s in inputs or (INPUT,)))
    returns = [
        node
        for node, _ in steps
        if node in leaves or any(t not in inside for t in core.successors(node))
    ]
    return Slice(
        host=host,
        index=index,
        nodes=tuple((node, core.implementation(node)) for node, _ in steps),
        steps=tuple(steps),
        reads=tuple(s for s in reads if s not in inside),
        returns=tuple(returns),
        devices=tuple((n, d) for n, d in devices.items() if owned(n)),
        retries=tuple((n, tuple(r)) for n, r in retries.items() if owned(n)),
        time_limits=tuple((n, t) for n, t in time_limits.items() if owned(n)),
        engine=engine,
    )


def fresh_id(base: str, taken: set[str]) -> str:
    """``base``, or ``base_2``, ``base_3``…: the first not in ``taken``, which it joins."""
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def remote_error(host: str, piece: Slice, message: str, hint: str) -> RemoteError:
    """A :class:`soma.RemoteError` about ``piece`` on ``host``."""
    error = RemoteError(f"host `{host}` {message} (slice of {piece.listed()})\nhint: {hint}")
    error.host = host
    error.slice = piece.names()
    error.node = piece.names()[0]
    return error
