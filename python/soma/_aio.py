"""Async nodes on an event loop: ``aforward``, ``amap``, and ``forward`` of a graph with them.

A node whose ``forward`` is a coroutine function is *async*; the graph notes it once, when the
node is registered, so a graph without one pays nothing for this module. ``aforward`` walks the
graph's plan on the caller's running loop: an async node is awaited there, the branches of a
wave run as tasks side by side, and every largest subtree of the plan with no async node in it —
a *piece* — runs on Soma's own engine as one run, on a thread the graph lends
(``GraphCore._lend``), which tells the loop when it is done (``loop.call_soon_threadsafe``). So
the loop never waits on a thread, a branch that awaits holds no thread, and no thread pool is
added. The walk is prepared once per version of the graph (``Graph._aio``) and reused.

``forward`` of a graph with async nodes runs ``aforward`` on one event loop Soma keeps for the
process, on a daemon thread of its own started on first use: one loop, so what async clients
keep between calls (connection pools) survives from one ``forward`` to the next.

A ``Map``, ``Switch`` or ``Loop`` step with an async node inside is walked here too, its
sub-plans prepared as walks of their own (sub-graphs namespaced as the engine names them): a
``Map``'s items run as tasks, as a wave's branches do; a ``Switch``'s case and a ``Loop``'s
iterations run in the task that reached the step, in its context, as the engine runs them in
the step's. A step with no async node inside stays in a piece, run by the engine whole.

A plan nests as deep as its graph: the walk never recurses on it. A branch is a flat list of
steps run by one task; a wave or a ``Map`` starts a task per branch or item, a task's stack
does not grow with the tasks it waits for, and the cases and iterations a task runs are parts
on a stack of its own (``_inline``). Preparing the walk takes the sub-graphs off a list.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import os
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from typing import Any, Protocol, assert_never

from soma import _loop, _soma, devices
from soma._cache import Cache
from soma._policy import RetryPolicy
from soma._slices import INPUT, Settings, SliceRunner, cut
from soma.errors import RunError, TimeLimitError


class Graph(Protocol):
    """What the walk needs of ``soma.Graph`` (named here, not imported: ``_graph`` imports this
    module)."""

    _core: _soma.GraphCore
    _async: dict[str, bool]
    _hosts: dict[str, str]

    def __init__(self) -> None: ...
    def node(self, id_or_obj: str | object, obj: object = None, /) -> str: ...
    def edge(self, source: str, target: str) -> None: ...
    def edges(self) -> list[tuple[str, str]]: ...
    def nodes(self) -> list[str]: ...
    def leaves(self) -> list[str]: ...
    def successors(self, node_id: str) -> list[str]: ...
    def plan(self) -> _soma.Plan: ...
    def implementation(self, node_id: str) -> Any: ...
    def devices(self) -> dict[str, str]: ...
    def retries(self) -> dict[str, RetryPolicy]: ...
    def time_limits(self) -> dict[str, float]: ...
    def _prepared(self) -> Prepared: ...
    def __contains__(self, node_id: object) -> bool: ...


#: The host name pieces are cut for (``_soma.distribute``): never a real host, as a graph with
#: nodes on hosts refuses async nodes.
_PIECE = "soma-engine-piece"

#: Matches the engine's retries: the longest pause, and how much longer a pause may be at random.
_MAX_BACKOFF = 128.0
_JITTER = 0.25

#: Nodes a message about a run stopped early names, at most.
_NAMED = 8


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class _Call:
    """An async node, as the walk calls it."""

    node: str
    obj: Any
    inputs: tuple[str, ...]
    takes_ctx: bool
    device: str | None
    retry: RetryPolicy | None
    limit: float | None
    #: Neither retries, a time limit nor a device: the node is awaited as it is.
    plain: bool


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class _Piece:
    """A largest subtree of the plan without async nodes, run by the engine as one run."""

    runner: SliceRunner
    reads: tuple[str, ...]
    #: The outputs of other steps it reads (``reads`` without the graph's input).
    sources: tuple[str, ...]
    #: The tap of each returned node in the piece's own graph, and the node.
    taps: tuple[tuple[str, str], ...]
    nodes: frozenset[str]
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class _Wave:
    """A wave with an async node in it: its branches, each a flat list of steps."""

    branches: tuple[list[_Step], ...]


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class _Map:
    """A ``Map`` step with an async node inside: its body, a walk of its own, on every item."""

    node: str
    inputs: tuple[str, ...]
    body: Prepared
    #: The most items in flight at once; ``None``: all of them.
    bound: int | None


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class _Switch:
    """A ``Switch`` step with an async node inside: the step's object names the case to run."""

    node: str
    inputs: tuple[str, ...]
    obj: Any
    cases: dict[str, Prepared]


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class _Loop:
    """A ``Loop`` step with an async node inside: its body, until the step's object says done."""

    node: str
    inputs: tuple[str, ...]
    obj: Any
    body: Prepared
    max_iterations: int


_Decided = _Map | _Switch | _Loop
_Step = _Call | _Piece | _Wave | _Decided


@dataclasses.dataclass(frozen=True, slots=True)
class Prepared:
    """A graph's plan as the walk runs it: built once per version of the graph."""

    steps: list[_Step]
    leaves: tuple[str, ...]
    #: The async nodes, the pieces and the steps that decide, for ``amap``'s limits.
    calls: list[_Call | _Piece | _Decided]
    #: How many steps read each output: a run drops an output once that many have read it, as
    #: the engine drops a value after its last reader. A leaf is read by none: the run's result.
    readers: dict[str, int]


def prepare(graph: Graph) -> Prepared:
    """The walk of ``graph``'s plan: its pieces cut and made ready to run, and the sub-plans of
    the steps that decide with an async node inside prepared as walks of their own."""
    if graph._hosts:
        raise ValueError(
            f"async nodes ({_listed(graph._async)}) cannot run in a graph with nodes on hosts yet\n"
            "hint: run the graph with every node in this process, or make those nodes sync"
        )
    # The settings of the nodes inside steps are the graph's, by namespaced id: what
    # `g.retry("chunks/embed", ...)` set after the step was registered holds in the walk too.
    settings = Settings.of(graph)
    top = Prepared([], tuple(graph.leaves()), [], {})
    todo: list[tuple[Graph, Prepared]] = [(graph, top)]
    while todo:  # A sub-graph's walk is prepared once its step's is: no recursion.
        at, into = todo.pop()
        _fill(at, into, settings, todo)
    return top


def _fill(
    graph: Graph, prepared: Prepared, given: Settings, todo: list[tuple[Graph, Prepared]]
) -> None:
    """Fills ``prepared`` with the walk of ``graph``'s plan, adding to ``todo`` the sub-graphs
    of its steps that decide with an async node inside."""
    holders = _holders(graph._async)
    synced = [
        (node, _PIECE) for node in graph.nodes() if node not in graph._async and node not in holders
    ]
    plan = _soma.distribute(graph.plan(), synced)
    settings = Settings(frozenset(prepared.leaves), given.devices, given.retries, given.time_limits)
    devices, retries, limits = settings.devices, settings.retries, settings.time_limits
    calls = prepared.calls
    stack: list[tuple[_soma.Plan, list[_Step]]] = [(plan, prepared.steps)]
    while stack:  # Children pushed in reverse: each list fills in plan order.
        at, into = stack.pop()
        kind = at.kind
        if kind == "Execute":
            node = at.node
            assert node is not None
            obj = graph.implementation(node)
            retry, limit = retries.get(node), limits.get(node)
            call = _Call(
                node,
                obj,
                tuple(at.inputs),
                graph._async[node],
                devices.get(node),
                retry,
                limit,
                retry is None and limit is None and node not in devices,
            )
            into.append(call)
            calls.append(call)
        elif kind == "Remote":
            piece = cut(graph, _PIECE, len(calls), at.children[0], settings)
            runner = SliceRunner(piece)
            taps = tuple(runner._taps.items())
            piece_step = _Piece(
                runner,
                piece.reads,
                tuple(read for read in piece.reads if read != INPUT),
                taps,
                frozenset(runner.nodes),
                tuple(runner.nodes),
            )
            into.append(piece_step)
            calls.append(piece_step)
        elif kind == "Sequence":
            stack.extend((child, into) for child in reversed(at.children))
        elif kind == "Wave":
            wave = _Wave(tuple([] for _ in at.children))
            into.append(wave)
            stack.extend(zip(reversed(at.children), reversed(wave.branches), strict=True))
        elif kind == "Map" or kind == "Switch" or kind == "Loop":
            decided = _decided(graph, at, todo)
            into.append(decided)
            calls.append(decided)
        elif kind == "Empty":
            pass
        else:  # The plan's kinds are a closed set: a new one must be handled above.
            raise AssertionError(f"a plan step of kind {kind!r} the async walk does not know")
    readers = prepared.readers
    for step in calls:
        for source in step.sources if isinstance(step, _Piece) else step.inputs:
            readers[source] = readers.get(source, 0) + 1


def _holders(async_nodes: Iterable[str]) -> set[str]:
    """The steps that hold the async nodes ``async_nodes`` (by namespaced id), at any depth:
    ``chunks`` and ``chunks/inner`` for ``chunks/inner/embed``."""
    holders: set[str] = set()
    for node in async_nodes:
        at = node.rfind("/")
        while at > 0:
            node = node[:at]
            holders.add(node)
            at = node.rfind("/")
    return holders


def _decided(graph: Graph, at: _soma.Plan, todo: list[tuple[Graph, Prepared]]) -> _Decided:
    """Step ``at`` (a ``Map``, ``Switch`` or ``Loop`` holding an async node), its sub-graphs
    made with the ids the engine gives them and put on ``todo`` to be prepared."""
    node = at.node
    assert node is not None
    obj = graph.implementation(node)
    walks: dict[str, Prepared] = {}
    for key, prefix, body in obj._bodies(node):
        sub = _namespaced(type(graph), prefix, obj._sub(type(graph), body, at.kind.lower()))
        walk = Prepared([], tuple(sub.leaves()), [], {})
        todo.append((sub, walk))
        walks[key] = walk
    inputs = tuple(at.inputs)
    kind = at.kind
    if kind == "Map":
        return _Map(node, inputs, walks[""], at.bound)
    if kind == "Loop":
        assert at.bound is not None
        return _Loop(node, inputs, obj, walks[""], at.bound)
    return _Switch(node, inputs, obj, walks)


def _namespaced(kind: type[Graph], prefix: str, sub: Graph | None) -> Graph:
    """``sub`` again, its ids under ``prefix`` as the engine embeds them (``chunks/embed``):
    what the walk's traces, errors and settings name. A step inside registers itself again, its
    own sub-graphs namespaced under its new id."""
    graph = kind()
    if sub is None:
        return graph
    for node in sub.nodes():
        graph.node(f"{prefix}/{node}", sub.implementation(node))
    for source, target in sub.edges():
        graph.edge(f"{prefix}/{source}", f"{prefix}/{target}")
    return graph


def _listed(nodes: Iterable[str]) -> str:
    """``nodes`` named as messages name them: a few, and how many more."""
    names = list(nodes)
    shown = ", ".join(f"`{n}`" for n in names[:_NAMED])
    return shown + (f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")


class _Stopped(Exception):
    """A branch stopped at a node boundary: a sibling declared before it failed."""


class _Stop:
    """Whether a branch (and the waves inside it) must stop at its next node boundary, and the
    stop flags of the pieces it runs now, set with it."""

    __slots__ = ("children", "flags", "stopped")

    def __init__(self) -> None:
        self.stopped = False
        self.children: set[_Stop] = set()
        self.flags: set[_soma.StopFlag] = set()

    def child(self) -> _Stop:
        child = _Stop()
        child.stopped = self.stopped
        self.children.add(child)
        return child

    def set(self) -> None:
        """Stops this branch and every branch inside it; no recursion."""
        todo = [self]
        while todo:
            at = todo.pop()
            at.stopped = True
            for flag in at.flags:
                flag.set()
            todo.extend(at.children)


class _Keys:
    """A run's cache, as the walk asks it: an async node is keyed on its fingerprint (its
    class's source and its state, as the engine keys a node) and the digests of what it reads,
    each output's digest taken once, when it is computed or found. A piece is keyed by the
    engine that runs it, on the digest of what it reads."""

    __slots__ = ("asked", "cache", "digests", "input", "input_digest")

    def __init__(self, cache: Cache, core: _soma.GraphCore, input: Any) -> None:
        self.cache = cache
        self.asked = cache._run(core)
        self.input = input
        self.input_digest: bytes | None = None
        #: The digest of each output computed or found so far; `None`: it has none.
        self.digests: dict[str, bytes | None] = {}

    def key(self, step: _Call) -> bytes | None:
        """``step``'s key, or ``None`` when it runs uncached (a class with ``cacheable =
        False``, state that cannot be read, an input without a digest)."""
        fingerprint = self.asked.fingerprint(step.node)
        if fingerprint is None:
            return None
        parts = [b"soma.aio.key", fingerprint]
        if not step.inputs:
            if self.input_digest is None:
                self.input_digest = self.asked.digest(self.input)
            if self.input_digest is None:
                return None
            parts.append(self.input_digest)
        for source in step.inputs:
            digest = self.digests.get(source)
            if digest is None:
                return None
            name = source.encode()
            parts += [len(name).to_bytes(4, "little"), name, digest]
        return _soma.blake3(b"".join(parts))


class _Run:
    """One run of a prepared walk: the values computed so far, and what it was called with."""

    __slots__ = (
        "core",
        "driver",
        "input",
        "keys",
        "left",
        "limits",
        "loop",
        "running",
        "trace",
        "turn_limit",
        "values",
    )

    def __init__(
        self,
        core: _soma.GraphCore,
        input: Any,
        driver: Any,
        turn_limit: int,
        trace: _soma.Trace | None,
        limits: dict[int, asyncio.Semaphore] | None,
        readers: dict[str, int],
        cache: Cache | None = None,
        running: dict[str, int] | None = None,
    ) -> None:
        self.core = core
        self.keys = None if cache is None else _Keys(cache, core, input)
        self.input = input
        self.driver = driver
        self.turn_limit = turn_limit
        self.trace = trace
        self.limits = limits
        self.loop = asyncio.get_running_loop()
        self.values: dict[str, Any] = {}
        #: How many steps are still to read each output.
        self.left = dict(readers)
        #: The nodes in flight now (a piece's all), for the message of a timeout; shared by the
        #: runs of a stream, whose timeout names them all.
        self.running: dict[str, int] = {} if running is None else running

    def read(self, inputs: tuple[str, ...]) -> Any:
        """A step's input, as ``forward`` gives it: the graph's input, one predecessor's
        output, or several keyed by predecessor in the order the edges were declared. Each
        output read for the last time is dropped from the run: the step holds it from here."""
        if not inputs:
            return self.input
        values = self.values
        x = values[inputs[0]] if len(inputs) == 1 else {s: values[s] for s in inputs}
        self.release(inputs)
        return x

    def inner(self, input: Any, body: Prepared) -> _Run:
        """A run of ``body`` — an item, a case or an iteration of a step that decides — on
        ``input``, with values of its own, in this run: its driver, trace and nodes in flight.
        Not held to ``amap``'s limits, as the engine runs what a step runs: the step itself
        is. Not looked up in the cache either, for now: the engine keys the nodes inside a step
        it runs, this walk does not (the guide's limits say so)."""
        run = _Run.__new__(_Run)
        run.core, run.keys, run.input = self.core, None, input
        run.driver, run.turn_limit, run.trace = self.driver, self.turn_limit, self.trace
        run.limits, run.loop, run.running = None, self.loop, self.running
        run.values = {}
        run.left = dict(body.readers)
        return run

    def release(self, sources: tuple[str, ...]) -> None:
        """Notes that a step has read ``sources``: those it was the last to read are dropped."""
        left, values = self.left, self.values
        for source in sources:
            count = left[source] - 1
            if count:
                left[source] = count
            else:
                del values[source]

    def begin(self, names: Iterable[str]) -> None:
        for name in names:
            self.running[name] = self.running.get(name, 0) + 1

    def end(self, names: Iterable[str]) -> None:
        for name in names:
            left = self.running.pop(name) - 1
            if left:
                self.running[name] = left


async def _branch(steps: list[_Step], run: _Run, stop: _Stop, path: tuple[int, ...]) -> None:
    """Runs ``steps`` one after the other, stopping at a node boundary once ``stop`` is set."""
    # Without a trace, limits or a cache, an async node with no policy is awaited right here:
    # the most common step, for which the layers of `_call` would cost more than the call.
    # `_plain_item` awaits an item the same way; calling it here would add a coroutine a node,
    # a tenth more on a chain of trivial async nodes, so the lines are written in both.
    direct = run.trace is None and run.limits is None and run.keys is None
    for step in steps:
        if stop.stopped:
            raise _Stopped
        if isinstance(step, _Call):
            if direct and step.plain:
                node = step.node
                running = run.running
                running[node] = running.get(node, 0) + 1
                try:
                    x = run.read(step.inputs)
                    if step.takes_ctx:
                        out = await step.obj.forward(x, _soma.Ctx._for_async(node, step.device))
                    else:
                        out = await step.obj.forward(x)
                except Exception as failure:
                    failure.add_note(f"raised in soma node `{node}`")
                    raise
                finally:
                    run.end((node,))
                if type(out) is _soma.Done or type(out) is _soma.Await:
                    out = _unwrapped(node, out)
                run.values[node] = out
                # Held here no longer: an output lives in the run until its last reader only.
                x = out = None
            else:
                run.values[step.node] = await _call(step, run, path)
        elif isinstance(step, _Piece):
            run.values.update(await _piece(step, run, stop, path))
        elif isinstance(step, _Wave):
            await _wave(step, run, stop, path)
        elif isinstance(step, (_Map, _Switch, _Loop)):
            await _decision(step, run, stop, path)
        else:
            assert_never(step)


async def _wave(wave: _Wave, run: _Run, stop: _Stop, path: tuple[int, ...]) -> None:
    """Runs the branches of ``wave`` side by side, each a task in a copy of this one's context;
    raises the error of the first declared branch that failed, once every branch is done.
    Branches declared after a failed one stop at their next node boundary; those before it
    run on, as their error would win."""
    stops = [stop.child() for _ in wave.branches]
    create = run.loop.create_task
    tasks = [
        create(_branch(steps, run, stops[i], (*path, i))) for i, steps in enumerate(wave.branches)
    ]
    index = {task: i for i, task in enumerate(tasks)}
    failed = len(tasks)
    pending: set[asyncio.Task[None]] = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and task.exception() is not None and index[task] < failed:
                    failed = index[task]
                    for later in stops[failed + 1 :]:
                        later.set()
    except BaseException:
        # Cancelled (the caller, a timeout): the async nodes in flight are cancelled, the
        # pieces stop at their next node boundary, and this waits for the branches to end, so
        # that the nodes' `finally` blocks have run before the caller sees the cancellation.
        for task in tasks:
            task.cancel()
        for branch in stops:
            branch.set()
        await asyncio.wait(tasks)
        raise
    finally:
        stop.children.difference_update(stops)
    if failed < len(tasks):
        error = tasks[failed].exception()
        assert error is not None
        raise error


async def _decision(step: _Decided, run: _Run, stop: _Stop, path: tuple[int, ...]) -> None:
    """Runs step ``step``, in its ``amap`` limit: a ``Map``'s items as tasks, a ``Switch`` or a
    ``Loop`` in this task."""
    limits = run.limits
    if limits is None:
        await _decide(step, run, stop, path)
        return
    async with limits[id(step)]:
        await _decide(step, run, stop, path)


async def _decide(step: _Decided, run: _Run, stop: _Stop, path: tuple[int, ...]) -> None:
    if isinstance(step, _Map):
        _settle(step, run, await _map(step, run, stop, path))
    else:
        await _inline(step, run, stop, path)


def _settle(step: _Decided, run: _Run, out: Any) -> None:
    """Writes ``out`` as ``step``'s output; with a cache, its digest is what readers key on (a
    step is never looked up itself: what it runs is not in its key)."""
    run.values[step.node] = out
    keys = run.keys
    if keys is not None:
        keys.digests[step.node] = keys.asked.digest(out)


def _items(step: _Map, x: Any) -> list[Any]:
    """What ``step`` reads, as its items: any sized sequence but text, bytes and mappings,
    refused as the engine refuses them."""
    if isinstance(x, (str, bytes, bytearray)) or hasattr(x, "keys") or not hasattr(x, "__len__"):
        raise _not_a_list(step.node, x)
    try:
        return list(x)
    except TypeError:
        raise _not_a_list(step.node, x) from None


def _not_a_list(node: str, x: Any) -> RunError:
    error = RunError(
        f"`each` step `{node}` read a `{type(x).__qualname__}`, not a list of items\n"
        "hint: the step before it returns the items, a list (any sized sequence); wrap a single "
        "item in one"
    )
    error.node = node
    return error


def _part_span(
    run: _Run, name: str, start: float, path: tuple[int, ...], failure: BaseException | None
) -> None:
    """Records the span of an item, a case or an iteration, named as the engine names it."""
    trace = run.trace
    if trace is None:
        return
    error = None
    if failure is not None and not isinstance(failure, (asyncio.CancelledError, _Stopped)):
        error = f"{type(failure).__name__}: {failure}"
    span = (name, start, trace._now(), _soma.Trace._thread(), list(path), 0, error, None, False)
    trace._record([span], 0.0, [])


async def _map(step: _Map, run: _Run, stop: _Stop, path: tuple[int, ...]) -> list[Any]:
    """Runs ``step``'s body on each item, each a task in a copy of this one's context, at most
    ``step.bound`` at once; their results in input order, or the error of the first failing
    item by index: the items after it stop at their next node boundary (those not started never
    start, their async nodes in flight are cancelled), the items before it run on."""
    items = _items(step, run.read(step.inputs))
    count = len(items)
    if not count:
        return []
    bound = count if step.bound is None else min(step.bound, count)
    create = run.loop.create_task
    body = step.body
    # The most common body, one async node with no policy, untraced: each item awaits it
    # right in its task, as `_branch` would, without a walk of its own. No boundary follows
    # the node, so the item needs no stop of its own either: cancelling it is what stops it.
    only = body.steps[0] if len(body.steps) == 1 else None
    plain = (
        only
        if isinstance(only, _Call) and only.plain and run.trace is None and run.keys is None
        else None
    )
    tasks: list[asyncio.Task[Any]] = []
    stops: list[_Stop] = []
    index: dict[asyncio.Task[Any], int] = {}
    pending: set[asyncio.Task[Any]] = set()
    # All at once, only a failure wakes this; bounded, each item done starts the next.
    until = asyncio.FIRST_EXCEPTION if bound == count else asyncio.FIRST_COMPLETED
    failed = count
    try:
        while True:
            while len(tasks) < min(failed, count) and len(pending) < bound and not stop.stopped:
                at = len(tasks)
                if plain is not None:
                    task = create(_plain_item(plain, items[at], run))
                else:
                    child = stop.child()
                    task = create(_item(step, items[at], at, run, child, (*path, at)))
                    stops.append(child)
                items[at] = None  # Held by its task from here.
                tasks.append(task)
                index[task] = at
                pending.add(task)
            if not pending:
                break
            done, pending = await asyncio.wait(pending, return_when=until)
            for task in done:
                if not task.cancelled() and task.exception() is not None and index[task] < failed:
                    failed = index[task]
                    for later in stops[failed + 1 :]:  # Empty for plain items.
                        later.set()
                    for later_task in tasks[failed + 1 :]:
                        later_task.cancel()
    except BaseException:
        # Cancelled: as a wave is, the items in flight are cancelled and awaited.
        for task in tasks:
            task.cancel()
        for item in stops:
            item.set()
        if tasks:
            await asyncio.wait(tasks)
        raise
    finally:
        stop.children.difference_update(stops)
    if failed < count:
        error = tasks[failed].exception()
        assert error is not None
        raise error
    if len(tasks) < count:  # Stopped at this boundary: the items not started never start.
        raise _Stopped
    return [task.result() for task in tasks]


async def _plain_item(call: _Call, x: Any, run: _Run) -> Any:
    """An item whose body is plain async node ``call``, awaited as ``_branch`` awaits one."""
    node = call.node
    running = run.running
    running[node] = running.get(node, 0) + 1
    try:
        if call.takes_ctx:
            out = await call.obj.forward(x, _soma.Ctx._for_async(node, call.device))
        else:
            out = await call.obj.forward(x)
    except Exception as failure:
        failure.add_note(f"raised in soma node `{node}`")
        raise
    finally:
        run.end((node,))
    if type(out) is _soma.Done or type(out) is _soma.Await:
        out = _unwrapped(node, out)
    return out


async def _item(step: _Map, x: Any, at: int, run: _Run, stop: _Stop, path: tuple[int, ...]) -> Any:
    """Item ``at`` of ``step``: its body's walk, with values of its own; a span ``node[at]``."""
    body = step.body
    inner = run.inner(x, body)
    del x
    start = 0.0 if run.trace is None else run.trace._now()
    try:
        await _branch(body.steps, inner, stop, path)
    except BaseException as failure:
        _part_span(run, f"{step.node}[{at}]", start, path, failure)
        raise
    _part_span(run, f"{step.node}[{at}]", start, path, None)
    return _result(body, inner)


class _Part:
    """A case or an iteration in flight in ``_inline``: the steps of its walk left to run."""

    __slots__ = ("iteration", "label", "outer", "run", "start", "step", "steps", "walk")

    def __init__(
        self, step: _Switch | _Loop, outer: _Run, walk: Prepared, x: Any, label: str, at: int
    ) -> None:
        self.step = step
        self.outer = outer
        self.walk = walk
        self.run = outer.inner(x, walk)
        self.steps = iter(walk.steps)
        self.label = label
        self.iteration = at
        trace = outer.trace
        self.start = 0.0 if trace is None else trace._now()


def _ask(step: _Switch | _Loop, x: Any, run: _Run, path: tuple[int, ...]) -> Any:
    """The step's own node on ``x`` — a switch's selector, a loop's predicate — called on the
    loop, as quick as the callable it wraps; a span of the step's id, as the engine's."""
    node = step.node
    trace = run.trace
    start = 0.0 if trace is None else trace._now()
    error = None
    try:
        return step.obj.forward(x, _soma.Ctx._for_async(node, None))
    except Exception as failure:
        error = f"{type(failure).__name__}: {failure}"
        failure.add_note(f"raised in soma node `{node}`")
        raise
    finally:
        if trace is not None:
            span = (node, start, trace._now(), _soma.Trace._thread(), list(path), 1, error)
            trace._record([(*span, None, False)], 0.0, [])


async def _inline(first: _Switch | _Loop, run: _Run, stop: _Stop, path: tuple[int, ...]) -> None:
    """Runs ``first`` in this task, in its context, as the engine runs a case or an iteration
    in the step's: the parts in flight — its case or iteration, and those of the switches and
    loops inside — are a stack, so a step nested in another adds a part, never a frame."""
    parts: list[_Part] = []

    def enter(step: _Switch | _Loop, outer: _Run) -> None:
        x = outer.read(step.inputs)
        if isinstance(step, _Switch):
            label = _ask(step, x, outer, path)
            parts.append(_Part(step, outer, step.cases[label], x, label, 0))
        else:
            parts.append(_Part(step, outer, step.body, x, "0", 0))

    try:
        enter(first, run)
        while parts:
            part = parts[-1]
            inner = part.run
            step = next(part.steps, None)
            if step is None:
                parts.pop()
                owner = part.step
                out = _result(part.walk, inner)
                _part_span(part.outer, f"{owner.node}[{part.label}]", part.start, path, None)
                if isinstance(owner, _Loop) and not _ask(owner, out, part.outer, path):
                    at = part.iteration + 1
                    if at >= owner.max_iterations:
                        raise _loop_limit(owner, out)
                    parts.append(_Part(owner, part.outer, owner.body, out, str(at), at))
                    continue
                _settle(owner, part.outer, out)
                continue
            if stop.stopped:
                raise _Stopped
            if isinstance(step, _Call):
                inner.values[step.node] = await _call(step, inner, path)
            elif isinstance(step, _Piece):
                inner.values.update(await _piece(step, inner, stop, path))
            elif isinstance(step, _Wave):
                await _wave(step, inner, stop, path)
            elif isinstance(step, _Map):
                _settle(step, inner, await _map(step, inner, stop, path))
            elif isinstance(step, (_Switch, _Loop)):
                enter(step, inner)
            else:
                assert_never(step)
    except BaseException as failure:
        while parts:
            part = parts.pop()
            name = f"{part.step.node}[{part.label}]"
            _part_span(part.outer, name, part.start, path, failure)
        raise


def _loop_limit(step: _Loop, last: Any) -> RunError:
    error = RunError(
        f"`loop` step `{step.node}` ran its body {step.max_iterations} times and `until` still "
        f"said not done; the last output was a `{type(last).__qualname__}`\n"
        "hint: raise `max_iterations`, or check that `until` can become true"
    )
    error.node = step.node
    return error


async def _call(step: _Call, run: _Run, path: tuple[int, ...]) -> Any:
    """Awaits async node ``step`` on its input: with its retries and time limit, in its
    ``amap`` limit, traced; its exception keeps its type, noting the node as ``forward`` does."""
    x = run.read(step.inputs)
    keys = run.keys
    if keys is not None:
        return await _cached(step, run, x, path, keys)
    limits = run.limits
    if limits is None:
        return await _attempts(step, run, x, path)
    async with limits[id(step)]:
        return await _attempts(step, run, x, path)


async def _cached(step: _Call, run: _Run, x: Any, path: tuple[int, ...], keys: _Keys) -> Any:
    """``_attempts``, unless the cache holds the output: then that, the node not called. What
    the node computes is kept as soon as it returns."""
    node = step.node
    key = keys.key(step)
    if key is not None:
        hit, out, digest = keys.cache._load(key)
        if hit:
            keys.digests[node] = digest if digest is not None else keys.asked.digest(out)
            trace = run.trace
            if trace is not None:
                now = trace._now()
                thread = _soma.Trace._thread()
                span = (node, now, now, thread, list(path), 0, None, step.device, True)
                trace._record([span], 0.0, [])
            return out
    started = time.perf_counter()
    out = await _attempts(step, run, x, path)
    digest = keys.asked.digest(out)
    keys.digests[node] = digest
    if key is not None:
        keys.cache._store(node, key, out, digest, time.perf_counter() - started)
    return out


async def _attempts(step: _Call, run: _Run, x: Any, path: tuple[int, ...]) -> Any:
    node, retry = step.node, step.retry
    forward = step.obj.forward
    attempt = 0
    trace = run.trace
    running = run.running
    running[node] = running.get(node, 0) + 1
    try:
        while True:
            start = 0.0 if trace is None else trace._now()
            error: str | None = None
            try:
                device = step.device
                if step.takes_ctx:
                    coroutine = forward(x, _soma.Ctx._for_async(node, device))
                else:
                    coroutine = forward(x)
                if device is not None:
                    coroutine = _OnDevice(coroutine, device)
                if step.limit is None:
                    out = _unwrapped(node, await coroutine)
                else:
                    out = _unwrapped(node, await _limited(step, coroutine))
                if device is not None:
                    _soma._check_device(node, device, out)
                return out
            except Exception as failure:
                error = f"{type(failure).__name__}: {failure}"
                if retry is None or attempt >= retry.times or not isinstance(failure, retry.on):
                    if attempt:
                        failure.add_note(
                            f"soma node `{node}` failed on each of its {attempt + 1} attempts"
                        )
                    failure.add_note(f"raised in soma node `{node}`")
                    raise
            finally:
                if trace is not None:
                    span = (node, start, trace._now(), _soma.Trace._thread(), list(path), 1)
                    trace._record([(*span, error, step.device, False)], 0.0, [])
            pause = min(retry.backoff * 2**attempt, _MAX_BACKOFF)
            await asyncio.sleep(pause * (1 + random.random() * _JITTER))
            attempt += 1
    finally:
        run.end((node,))


class _OnDevice:
    """A placed async node's coroutine, driven one step at a time with its device current on
    the loop's thread around each step (``soma.devices._enter``) and the device current before
    put back after it. Tasks interleave on the loop between steps, never inside one, so each
    node sees its own device at every step, and whatever else runs on the loop sees the
    thread's own."""

    __slots__ = ("coroutine", "device")

    def __init__(self, coroutine: Any, device: str) -> None:
        self.coroutine = coroutine
        self.device = device

    def __await__(self) -> Any:
        coroutine, device = self.coroutine, self.device
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            restore = devices._enter(device)
            try:
                yielded = coroutine.send(sent) if thrown is None else coroutine.throw(thrown)
            except StopIteration as returned:
                return returned.value
            finally:
                thrown = None
                if restore is not None:
                    restore()
            try:
                sent = yield yielded
            except GeneratorExit:  # Closed unfinished: the node's `finally` runs on its device.
                restore = devices._enter(device)
                try:
                    coroutine.close()
                finally:
                    if restore is not None:
                        restore()
                raise
            except BaseException as raised:  # Cancelled, mostly: passed on to the node.
                sent, thrown = None, raised


async def _limited(step: _Call, coroutine: Any) -> Any:
    """Awaits ``coroutine`` for ``step.limit`` seconds at most: past it, it is cancelled and
    the call fails with a :class:`soma.TimeLimitError` naming the node."""
    assert step.limit is not None
    try:
        async with asyncio.timeout(step.limit) as limit:
            return await coroutine
    except TimeoutError:
        if not limit.expired():
            raise  # The node's own TimeoutError.
        error = TimeLimitError(
            f"node `{step.node}` ran past its time limit of {step.limit} s\n"
            "hint: an async call past its limit is cancelled; raise the limit, or let "
            "`.retry(on=(TimeoutError,))` try it again"
        )
        error.node = step.node
        error.limit = step.limit
        raise error from None


def _unwrapped(node: str, out: Any) -> Any:
    """What an async node returned, as its output: a ``soma.Done`` unwrapped; a
    ``soma.Await`` refused, as an async node awaits what it needs itself."""
    if type(out) is _soma.Done:
        return out.value
    if type(out) is _soma.Await:
        raise TypeError(
            f"async node `{node}` returned soma.Await: a driver serves sync nodes only\n"
            "hint: await the call in the node itself, or make the node sync to batch its "
            "requests with a driver"
        )
    return out


async def _piece(step: _Piece, run: _Run, stop: _Stop, path: tuple[int, ...]) -> dict[str, Any]:
    """Runs piece ``step`` on the engine, on a thread the graph lends, in a copy of this
    branch's context, while the loop goes on; its returned nodes' outputs, by node."""
    limits = run.limits
    if limits is None:
        return await _lent(step, run, stop, path)
    async with limits[id(step)]:
        return await _lent(step, run, stop, path)


async def _lent(step: _Piece, run: _Run, stop: _Stop, path: tuple[int, ...]) -> dict[str, Any]:
    values = run.values
    # Handed over, not kept: the lent thread may hold `work` a while after it has run, and an
    # input read for the last time must go when the piece is done with it.
    inputs = {read: run.input if read == INPUT else values[read] for read in step.reads}
    handed = [step.runner.argument(inputs)]
    del inputs
    run.release(step.sources)
    loop = run.loop
    future: asyncio.Future[Any] = loop.create_future()
    flag = _soma.StopFlag()
    context = contextvars.copy_context()
    trace, driver, turn_limit, keys = run.trace, run.driver, run.turn_limit, run.keys
    at = 0.0 if trace is None else trace._now()
    core = step.runner.graph._core
    forward = core.forward
    cache = None if keys is None else keys.cache._run(core)
    taps = step.taps

    def settle(outcome: Any, failure: BaseException | None, spans: list[Any]) -> None:
        if trace is not None and spans:
            trace._record(spans, at, list(path))
        if future.done():  # Cancelled: nobody waits for it any more.
            return
        if failure is None:
            future.set_result(outcome)
        else:
            future.set_exception(failure)

    def work() -> None:
        own = None if trace is None else _soma.Trace()
        outcome: Any = None
        failure: BaseException | None = None
        try:
            out = context.run(forward, handed.pop(), driver, turn_limit, own, None, flag, cache)
            if len(taps) == 1:
                outcome = {taps[0][1]: out}
            else:
                outcome = {node: out[tap] for tap, node in taps}
            if keys is not None:  # Here, off the loop: a digest of a large array takes time.
                digested = {node: keys.asked.digest(value) for node, value in outcome.items()}
                outcome = (outcome, digested)
        except BaseException as raised:
            failure = raised
        spans = [] if own is None else own._ship(set(step.nodes))
        # A closed loop raises `RuntimeError`: the run it belonged to is over, nobody waits.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome, failure, spans)

    stop.flags.add(flag)
    run.begin(step.names)
    try:
        run.core._lend(work)
        out = await future
    except asyncio.CancelledError:
        flag.set()  # Stops the piece at its next node boundary; its result is dropped.
        raise
    finally:
        stop.flags.discard(flag)
        run.end(step.names)
    if keys is None:
        returned: dict[str, Any] = out
        return returned
    returned, digested = out
    keys.digests.update(digested)
    return returned


def start(
    graph: Graph,
    input: Any,
    *,
    driver: Any,
    turn_limit: int,
    trace: _soma.Trace | None,
    timeout: float | None,
    limits: dict[int, asyncio.Semaphore] | None = None,
    prepared: Prepared | None = None,
    cache: Cache | None = None,
    running: dict[str, int] | None = None,
) -> asyncio.Task[Any]:
    """What ``Graph.aforward`` awaits: the walk, as a task of its own, so that the run has a
    copy of the caller's context (what nodes set never reaches the caller) and cancelling the
    caller cancels the run."""
    if timeout is not None:
        timeout = _checked_timeout(timeout)
    if prepared is None:
        prepared = graph._prepared()
    run = _Run(
        graph._core, input, driver, turn_limit, trace, limits, prepared.readers, cache, running
    )
    return run.loop.create_task(_walk(prepared, run, timeout))


async def aforward(
    graph: Graph,
    input: Any,
    *,
    driver: Any,
    turn_limit: int,
    trace: _soma.Trace | None,
    timeout: float | None,
    limits: dict[int, asyncio.Semaphore] | None = None,
    prepared: Prepared | None = None,
    cache: Cache | None = None,
) -> Any:
    """``start``, awaited: for a caller that wants a coroutine."""
    return await start(
        graph,
        input,
        driver=driver,
        turn_limit=turn_limit,
        trace=trace,
        timeout=timeout,
        limits=limits,
        prepared=prepared,
        cache=cache,
    )


def _checked_timeout(seconds: object) -> float:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 <= seconds < float("inf")
    ):
        raise ValueError(f"timeout must be a finite number of seconds, 0 or more, not {seconds}")
    return float(seconds)


async def _walk(prepared: Prepared, run: _Run, timeout: float | None) -> Any:
    stop = _Stop()
    if timeout is None:
        try:
            await _branch(prepared.steps, run, stop, ())
        except asyncio.CancelledError:
            stop.set()
            raise
        return _result(prepared, run)
    task = asyncio.current_task()
    assert task is not None
    late: list[str] | None = None

    def deadline() -> None:
        nonlocal late
        late = list(run.running)
        stop.set()  # Even a node that swallows its cancellation is the last one to start.
        task.cancel()

    handle = run.loop.call_later(timeout, deadline)
    try:
        await _branch(prepared.steps, run, stop, ())
    except (asyncio.CancelledError, _Stopped):
        stop.set()
        if late is None:
            raise
        task.uncancel()
        raise _timed_out(timeout, late) from None
    finally:
        handle.cancel()
    if late is not None:  # A node swallowed its cancellation: the result is late all the same.
        task.uncancel()
        raise _timed_out(timeout, late)
    return _result(prepared, run)


def _timed_out(timeout: float, late: list[str]) -> TimeoutError:
    still = f"; still running: {_listed(late)} (cancelled)" if late else ""
    return TimeoutError(
        f"aforward did not finish within its timeout of {timeout} s{still}\n"
        "hint: the graph can run again at once; a node that waits for something that may "
        "not come should wait with a timeout of its own"
    )


def _result(prepared: Prepared, run: _Run) -> Any:
    """What the run returns, as ``forward`` returns it: the leaf's output, the leaves' by id,
    or the input of a graph without nodes."""
    values, leaves = run.values, prepared.leaves
    if len(leaves) == 1:
        return values[leaves[0]]
    if not leaves:
        return run.input
    return {leaf: values[leaf] for leaf in leaves}


def refuse_inside_loop(graph: Graph, what: str) -> None:
    """Refuses a blocking call on a thread whose event loop is running: it would block the
    loop, and the graph's async nodes could never run on it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what} of a graph with async nodes ({_listed(graph._async)}) was called inside a "
        "running event loop, which it would block\n"
        "hint: `await g.aforward(x)` runs the graph on this loop without blocking it"
    )


def forward(
    graph: Graph,
    input: Any,
    *,
    driver: Any,
    turn_limit: int,
    trace: _soma.Trace | None,
    timeout: float | None,
    cache: Cache | None = None,
) -> Any:
    """``Graph.forward`` of a graph with async nodes: ``aforward`` on the loop Soma keeps, in a
    copy of the caller's context, while the caller waits. Ctrl-C cancels the run and raises
    :class:`KeyboardInterrupt` once the cancelled nodes have ended, or after a twentieth of a
    second, whichever is first."""
    refuse_inside_loop(graph, "forward")
    prepared = graph._prepared()
    loop = kept_loop()
    context = contextvars.copy_context()
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    started: list[asyncio.Task[Any]] = []
    abandoned: list[bool] = []

    def start() -> None:
        if abandoned:
            return
        task = loop.create_task(
            aforward(
                graph,
                input,
                driver=driver,
                turn_limit=turn_limit,
                trace=trace,
                timeout=timeout,
                prepared=prepared,
                cache=cache,
            ),
            context=context,
        )
        started.append(task)
        task.add_done_callback(lambda ended: _chain(ended, done))

    loop.call_soon_threadsafe(start)
    try:
        concurrent.futures.wait([done])
    except BaseException:  # Ctrl-C: the run is cancelled, as `aforward` would be.
        abandoned.append(True)
        loop.call_soon_threadsafe(_cancel_all, started)
        concurrent.futures.wait([done], timeout=_GRACE)
        raise
    return done.result()


#: Seconds ``forward`` waits, after Ctrl-C, for the cancelled nodes to end.
_GRACE = 0.05


def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()


def _chain(task: asyncio.Task[Any], done: concurrent.futures.Future[Any]) -> None:
    if task.cancelled():
        done.set_exception(asyncio.CancelledError())
    elif (failure := task.exception()) is not None:
        done.set_exception(failure)
    else:
        done.set_result(task.result())


kept_loop = _loop.kept_loop


def checked_timeout(seconds: float | None) -> float | None:
    """``timeout=`` as given, checked: ``None``, or a finite number of seconds, 0 or more."""
    return None if seconds is None else _checked_timeout(seconds)


def limits_for(
    graph: Graph, prepared: Prepared, concurrency: Mapping[str, int] | None
) -> dict[int, asyncio.Semaphore]:
    """A stream's limit on each async node, step that decides and piece of ``prepared``: a
    node's or step's concurrency as asked now, by ``concurrency=``, else its own; a piece's, its
    least concurrent node's."""
    wanted = dict(concurrency or {})
    for node, count in wanted.items():
        if node not in graph:
            graph.implementation(node)  # Raises the error that names it.
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"concurrency takes an int of at least 1, not {count!r}")

    def concurrency_of(node: str) -> int:
        asked = wanted.get(node)
        return (
            asked
            if asked is not None
            else getattr(graph.implementation(node), "_soma_concurrency", 1)
        )

    limits: dict[int, asyncio.Semaphore] = {}
    for call in prepared.calls:
        # A step that decides is limited as a node, as it is a stage of `g.map`: what it
        # runs is not.
        names = call.names if isinstance(call, _Piece) else (call.node,)
        limits[id(call)] = asyncio.Semaphore(min(concurrency_of(node) for node in names))
    return limits


def stream_timed_out(timeout: float, late: Iterable[str]) -> TimeoutError:
    """The error of a stream of a graph with async nodes past its ``timeout``."""
    names = list(late)
    still = f"; still running: {_listed(names)} (cancelled)" if names else ""
    return TimeoutError(
        f"the stream did not finish within its timeout of {timeout:g} s{still}\n"
        "hint: the graph can run again at once; a node that waits for something that may "
        "not come should wait with a timeout of its own"
    )


async def amap(
    graph: Graph,
    inputs: Iterable[Any] | AsyncIterable[Any],
    *,
    in_flight: int,
    concurrency: Mapping[str, int] | None,
    driver: Any,
    turn_limit: int,
    trace: _soma.Trace | None,
    timeout: float | None = None,
    deadline: float | None = None,
    cache: Cache | None = None,
) -> AsyncIterator[Any]:
    """``Graph.amap``: the results of ``inputs`` through the graph, in order, with up to
    ``in_flight`` items in flight; each node (or piece of sync nodes) on as many items at once
    as its concurrency allows. Past ``deadline`` (``time.monotonic()``, ``timeout`` seconds
    after the call), the items in flight are cancelled and :class:`TimeoutError` raised."""
    if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
        raise ValueError(f"in_flight takes an int of at least 1, not {in_flight!r}")
    prepared = graph._prepared()
    limits = limits_for(graph, prepared, concurrency)
    pending: deque[asyncio.Task[Any]] = deque()
    running: dict[str, int] = {}

    def launch(x: Any) -> None:
        pending.append(
            start(
                graph,
                x,
                driver=driver,
                turn_limit=turn_limit,
                trace=trace,
                timeout=None,
                limits=limits,
                prepared=prepared,
                cache=cache,
                running=running,
            )
        )

    def late() -> TimeoutError:
        assert timeout is not None
        return stream_timed_out(timeout, running)

    async def taken() -> Any:
        """The first pending item's result, unless the deadline passes first; the item stays
        pending until then, so that it is cancelled with the rest if it fails or is late."""
        task = pending[0]
        if deadline is None:
            out = await task
        else:
            left = deadline - time.monotonic()
            if left > 0:
                await asyncio.wait((task,), timeout=left)
            if not task.done() or time.monotonic() > deadline:
                raise late()
            out = task.result()
        pending.popleft()
        return out

    async def read(source: AsyncIterator[Any]) -> Any:
        """The next input of ``source``, unless the deadline passes first."""
        if deadline is None:
            return await anext(source)
        try:
            return await asyncio.wait_for(anext(source), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            raise late() from None

    try:
        if isinstance(inputs, AsyncIterable):
            source = aiter(inputs)
            while True:
                try:
                    x = await read(source)
                except StopAsyncIteration:
                    break
                launch(x)
                if len(pending) >= in_flight:
                    yield await taken()
        else:
            for x in inputs:
                if deadline is not None and time.monotonic() > deadline:
                    raise late()
                launch(x)
                if len(pending) >= in_flight:
                    yield await taken()
        while pending:
            yield await taken()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
