"""``soma.Graph``: build a graph, look at its plan, run it.

Topology, implementations, the cached plan and every setting written on a node by its id
(device, host, retries, time limit, concurrency) live in the Rust core (``_soma.GraphCore``),
which also says which runner a call takes (``GraphCore.route``); this class adds what is
naturally Python: ids derived from class names, reading the DSL, deciding at registration (once
per class) whether ``forward`` wants a ``ctx``, the runners that are Python's (hosts, streams),
and copying and pickling a graph as its nodes, edges, placements and settings.
"""

from __future__ import annotations

import copy
import functools
import inspect
import io
import pickle
import re
import types
import weakref
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from typing import IO, Any, NamedTuple, SupportsIndex, cast

from soma import _soma
from soma import remote as _remote
from soma._build import module as _module
from soma._build.decide import AsyncLoop, AsyncSwitch, Decision, Each, Loop, Switch
from soma._build.dsl import Composable, Expr, refuse_class
from soma._build.function import as_node
from soma._build.node import Node
from soma._build.policy import (
    RetryPolicy,
    checked_concurrency,
    checked_retry,
    checked_time_limit,
)
from soma._run import events as _events
from soma._run import stream as _stream
from soma.cache import _cache
from soma.errors import DuplicateNodeError, InvalidIdError, NodePicklingError
from soma.journal import _journal

# The steps that decide as they run, each registered with its sub-graphs.
_DECISIONS = frozenset((Each, Switch, Loop, AsyncSwitch, AsyncLoop))

_WORD_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


@functools.lru_cache(maxsize=4096)
def snake_case(name: str) -> str:
    """``Encoder`` -> ``encoder``, ``Other2`` -> ``other2``, ``HTTPServer`` -> ``http_server``.

    Kept per name: a graph of a million nodes of a few classes asks for a few names."""
    return _WORD_BOUNDARY.sub("_", name).lower()


# How a class's `forward` is called, per function: whether it takes a `ctx`, and whether it is
# a coroutine function (an async node). Kept by id, checked against a weak reference to the
# function (an id a collected function leaves may be reused by another), whose callback forgets
# the answer once the function is gone. `inspect.signature` costs tens of µs, and a graph of a
# million nodes of a few classes asks the same question a million times.
_SHAPE_BY_FUNCTION: dict[int, tuple[weakref.ref[types.FunctionType], tuple[bool, bool]]] = {}


def _forward_shape(obj: object) -> tuple[bool, bool]:
    """Whether ``obj.forward`` accepts a second positional argument, the ``ctx``, and whether
    it is a coroutine function (``async def``).

    The answer is kept for a ``forward`` that is a plain function of ``obj``'s class, read the
    ordinary way: ``obj.forward`` is then that function bound to ``obj``, whatever ``obj`` is.
    A ``forward`` of the instance's own (an attribute set on it), or one a class computes
    (``__getattribute__``, a descriptor, a ``staticmethod``) is looked at every time."""
    cls = type(obj)
    function = getattr(cls, "forward", None)
    if (
        type(function) is types.FunctionType
        and cls.__getattribute__ is _OBJECT_GETATTRIBUTE
        and "forward" not in getattr(obj, "__dict__", ())
    ):
        known = _SHAPE_BY_FUNCTION.get(id(function))
        if known is not None and known[0]() is function:
            return known[1]
        decision = _read_shape(obj)
        key = id(function)
        _SHAPE_BY_FUNCTION[key] = (
            weakref.ref(function, functools.partial(_forget, key)),
            decision,
        )
        return decision
    return _read_shape(obj)


_OBJECT_GETATTRIBUTE = object.__getattribute__


def _forget(key: int, _: object) -> None:
    """Forgets the answer for a function that is being collected."""
    entry = _SHAPE_BY_FUNCTION.get(key)
    if entry is not None and entry[0]() is None:  # Not a later function's answer.
        del _SHAPE_BY_FUNCTION[key]


def _read_shape(obj: object) -> tuple[bool, bool]:
    """What ``_forward_shape`` answers, found from ``obj.forward`` itself — or declared by its
    class as ``_soma_forward_shape``, as the class made for a function's nodes declares it
    (``soma._build.function``: a function with a defaulted second parameter takes no ``ctx``)."""
    declared = getattr(type(obj), "_soma_forward_shape", None)
    if declared is not None:
        return cast(tuple[bool, bool], declared)
    forward = getattr(obj, "forward", None)
    if not callable(forward):
        return False, False
    is_async = inspect.iscoroutinefunction(forward)
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):  # A builtin without a signature: call it with x alone.
        return False, is_async
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    takes_ctx = len(positional) >= 2 or any(
        p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters
    )
    return takes_ctx, is_async


# What an object that is no soma.Node reads as its `_soma_id`: every node has one, `None` unless
# `.named()` set it, so that the common case tells the two apart with the read it makes anyway.
_NOT_SOMAS = object()


def _registered(obj: object) -> object:
    """What ``Graph.node`` registers for ``obj``, which is no ``soma.Node``: a node of it for a
    function or a torch module, else ``obj`` itself (which the core refuses if it has no
    callable ``forward``)."""
    node = as_node(obj)
    return obj if node is None else node


def _checked_id(value: object, what: str, hint: str) -> str:
    """``value`` if it can be an id; otherwise the error that says why, raised here, where the
    mistake is, rather than deep in the glue (a lone surrogate would surface there as a raw
    ``UnicodeEncodeError``: an id crosses into Rust as UTF-8, which cannot hold one)."""
    if not isinstance(value, str):
        raise TypeError(
            f"{'an' if what[0] in 'aeiou' else 'a'} {what} is a `str`, "
            f"not an object of type `{type(value).__name__}`\nhint: {hint}"
        )
    if not value.isascii():  # The common case skips the encoding below.
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as failure:
            error = InvalidIdError(
                f"invalid {what} `{value!r}`: `{value[failure.start]!r}` at index "
                f"{failure.start} is a lone surrogate, not a character\n"
                "hint: an id is a non-empty name without spaces or control characters; a lone "
                "surrogate usually comes from bytes decoded with errors='surrogateescape': "
                "decode them strictly, or choose another id"
            )
            error.node = value
            raise error from None
    return value


def _literal(text: str) -> str:
    """``text`` as a Python literal in a hint, in double quotes where that is faithful."""
    return f'"{text}"' if text.isprintable() and not {'"', "\\"} & set(text) else repr(text)


_EDGE_HINT = "name the nodes by the ids `node()` returned: `a = g.node(A())`, then `g.edge(a, b)`"
_LOOKUP_HINT = "name the node by the id `node()` returned"


class Graph:
    """A directed acyclic graph of nodes, compiled once into a plan and run with ``forward``."""

    # `__weakref__`: a journal remembers the graph a run ran with (to resume it from a view)
    # without keeping it alive.
    __slots__ = ("__weakref__", "_core", "_remote")

    def __init__(self) -> None:
        self._core = _soma.GraphCore()
        # What the core hands `soma.remote` when it routes a run there.
        self._remote = _remote.Hosted(self._core, type(self))

    @classmethod
    def somatize(cls, expr: Expr | Node) -> Graph:
        """The graph that ``expr``, an expression of ``>>`` and ``|`` (or one node), describes,
        its nodes registered in declaration order.

        Raises:
            soma.DuplicateNodeError: one node instance appears twice in the expression.
            soma.InvalidIdError: a node's ``.named()`` id cannot be an id.
            TypeError: ``expr`` is a class, or classes joined by ``|``, where instances are
                expected, or something that does not compose.
        """
        refuse_class(expr, verb="register", call="soma.Graph.somatize(")
        if isinstance(expr, types.UnionType):  # `A | B` of classes is a typing union.
            raise TypeError(
                f"`{expr}` joins classes, where node instances are expected\n"
                "hint: compose instances: "
                f"`soma.Graph.somatize({' | '.join(f'{c.__name__}()' for c in expr.__args__)})`"
            )
        flat = Expr.of(expr, ">>")._flattened()
        seen: dict[int, int] = {}
        for at, obj in enumerate(flat.nodes):
            if id(obj) in seen:
                name = obj._soma_id or snake_case(type(obj).__name__)
                error = DuplicateNodeError(
                    f"node `{name}` appears twice in the expression\n"
                    "hint: a node instance is one node; create another instance to use it again"
                )
                error.node = name
                raise error
            seen[id(obj)] = at
        graph = cls()
        ids = [graph.node(obj) for obj in flat.nodes]
        edge = graph.edge
        for source, target in zip(flat.sources, flat.targets, strict=True):
            edge(ids[source], ids[target])
        return graph

    @classmethod
    def _core_of(cls, expr: Expr) -> _soma.GraphCore:
        """The core of the graph of this class that ``expr`` describes: how a step registered
        in one makes its sub-graphs (``soma._build.decide``)."""
        return cls.somatize(expr)._core

    def node(self, id_or_obj: str | object, obj: object = None, /) -> str:
        """Registers ``obj`` (anything with a callable ``forward``, a function, a torch module)
        and returns its id.

        ``node(obj)`` uses the id given with ``.named()``, else the snake_case of the class
        name (a function's name, for a function), made unique with ``_2``, ``_3``;
        ``node("id", obj)`` uses ``"id"``. A function or a ``soma.node`` function is registered
        as a new node of it, and a torch module as a node calling it (see ``soma.node``).

        Args:
            id_or_obj: the object to register, or its id when ``obj`` follows.
            obj: the object to register under the id ``id_or_obj``.

        Raises:
            soma.DuplicateNodeError: the id is taken (the graph is unchanged).
            soma.InvalidIdError: the id is empty, or holds whitespace, control characters or
                a ``/``.
            TypeError: the id is not a ``str``; a class is given where an instance is
                expected, or an object with no callable ``forward``.
        """
        # The common case stays on the fast path: a `str` id of ASCII, an object that is no
        # class; `_checked_id` and `refuse_class` say what is wrong otherwise.
        if obj is None:
            obj = id_or_obj
            if isinstance(obj, type):
                refuse_class(obj, verb="register", call="g.node(")
            named = getattr(obj, "_soma_id", _NOT_SOMAS)
            if named is _NOT_SOMAS:  # No soma.Node: a function, a module, an object of its own.
                obj = _registered(obj)
                named = getattr(obj, "_soma_id", None)
            if named is None:
                node_id = self._core.free_id(snake_case(type(obj).__name__))
            elif type(named) is str and named.isascii():
                node_id = named
            else:
                node_id = _checked_id(named, "node id", "give `.named()` a `str`")
        else:
            if type(id_or_obj) is str and id_or_obj.isascii():
                node_id = id_or_obj
            else:
                node_id = _checked_id(
                    id_or_obj, "node id", 'call `g.node(obj)` or `g.node("id", obj)`'
                )
            if isinstance(obj, type):
                refuse_class(obj, verb="register", call=f"g.node({_literal(node_id)}, ")
            if not isinstance(obj, Composable):
                obj = _registered(obj)
        native = getattr(obj, "_soma_native", None)
        if native is not None and isinstance(native, _soma.NativeNode):
            self._core.add_native(node_id, obj, native)
        elif type(obj) in _DECISIONS:
            # It registers itself with its sub-graphs, which take its settings.
            cast(Decision, obj)._register(self._core, node_id, type(self)._core_of)
            workers = cast(Decision, obj)._soma_concurrency
            if workers is not None:  # Set by `.concurrency()`, which checked it already.
                self._core.set_concurrency(node_id, workers)
            return node_id
        else:
            takes_ctx, is_async = _forward_shape(obj)
            self._core.add_python(node_id, obj, takes_ctx, is_async)
        device = getattr(obj, "_soma_device", None)
        if device is not None:  # Set by `.on()`, which read it already.
            self._core.place(node_id, device)
        host = getattr(obj, "_soma_host", None)
        if host is not None:  # Set by `.at()`, which read it already.
            self._core.place_at(node_id, host)
        retry = getattr(obj, "_soma_retry", None)
        if retry is not None:  # Set by `.retry()`, which checked it already.
            self._core.set_retry(node_id, *retry)
        limit = getattr(obj, "_soma_time_limit", None)
        if limit is not None:  # Set by `.time_limit()`, which checked it already.
            self._core.set_time_limit(node_id, limit)
        workers = getattr(obj, "_soma_concurrency", None)
        if workers is not None:  # Set by `.concurrency()`, which checked it already.
            self._core.set_concurrency(node_id, workers)
        return node_id

    def retry(
        self,
        node_id: str,
        times: int | None,
        backoff: float = 0.5,
        on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    ) -> None:
        """Retries a failing call of node ``node_id`` up to ``times`` more times, the first
        after ``backoff`` seconds, each next pause twice the last (at most 128 s) and up to a
        quarter longer at random, only for exceptions of the types in ``on``; ``times=None``
        removes its retries. The error of a call that failed every attempt is the last
        attempt's, with a note saying how many were made; each attempt is a span of the trace.
        A pause ends at once on Ctrl-C or the run's deadline. What ``node.retry(...)`` sets
        before the node is registered. The plan does not change. On a ``switch`` or ``loop``
        step's id it retries the selector or the predicate; an ``each`` step calls no node of
        its own, and a retry on its id is a ``soma.GraphError`` (set it on the nodes inside).

        Raises:
            soma.UnknownNodeError: no node has the id ``node_id``.
            soma.GraphError: ``node_id`` is an ``each`` step's.
            ValueError: ``times`` or ``backoff`` is not a number it can be.
            TypeError: ``on`` holds something that is no exception class.
        """
        node_id = _checked_id(node_id, "node id", _LOOKUP_HINT)
        if times is None:
            self._core.set_retry(node_id, None)
            return
        self._core.set_retry(node_id, *checked_retry(times, backoff, on))

    def retries(self) -> dict[str, RetryPolicy]:
        """The nodes with retries and their ``(times, backoff, on)``, in the order the nodes
        were added."""
        return {node_id: RetryPolicy(*policy) for node_id, policy in self._core.retries()}

    def time_limit(self, node_id: str, seconds: float | None) -> None:
        """Fails a call of node ``node_id`` still running after ``seconds`` with a
        ``soma.TimeLimitError`` (a ``TimeoutError``) naming it, which ``retry(on=(TimeoutError,))``
        retries; ``None`` removes the limit. The call runs on a thread of the graph's while
        the branch waits for it, and one past its limit is left to finish in the background,
        its result dropped. What ``node.time_limit(...)`` sets before the node is registered.
        The plan does not change. On a step's id it holds as a retry does (see ``retry``).

        Raises:
            soma.UnknownNodeError: no node has the id ``node_id``.
            soma.GraphError: ``node_id`` is an ``each`` step's.
            ValueError: ``seconds`` is not a finite number above 0.
        """
        node_id = _checked_id(node_id, "node id", _LOOKUP_HINT)
        limit = None if seconds is None else checked_time_limit(seconds)
        self._core.set_time_limit(node_id, limit)

    def time_limits(self) -> dict[str, float]:
        """The nodes with a time limit and its seconds, in the order the nodes were added."""
        return dict(self._core.time_limits())

    def place(self, node_id: str, device: str | None) -> None:
        """Places node ``node_id`` on ``device`` (``"cuda:1"``, ``"cpu"``, ``"meta"``, spelled as
        torch spells it), replacing where it was; ``None`` unplaces it. While the node runs,
        ``device`` is current on its thread (see :mod:`soma.devices`), ``ctx.device`` says it,
        and what it returns must be there. The plan does not change.

        A device that cannot be read is a ``soma.DeviceError``, a bare ``"cuda"`` included (it
        would mean whichever device is current on the thread a branch is lent); an unknown id
        is a ``soma.UnknownNodeError``. On a step's id it holds as a retry does (see
        ``retry``)."""
        self._core.place(_checked_id(node_id, "node id", _LOOKUP_HINT), device)

    def devices(self) -> dict[str, str]:
        """The placed nodes and their devices, in the order the nodes were added."""
        return dict(self._core.devices())

    def place_at(self, node_id: str, host: str | None) -> None:
        """Runs node ``node_id`` on ``host``, a name (``"gpu-box"``), replacing where it ran;
        ``None`` brings it back to this process. The plan does not change; ``distributed_plan``
        shows the slices it makes, and ``forward`` runs each slice on its host, on Ray (the
        guide's "Hosts and Ray"). A name that cannot be is a ``soma.HostError``, and so is a
        step (``each``, ``switch``, ``loop``) or a node inside one: a step runs in this process,
        with what it runs. An unknown id is a ``soma.UnknownNodeError``."""
        self._core.place_at(_checked_id(node_id, "node id", _LOOKUP_HINT), host)

    def hosts(self) -> dict[str, str]:
        """The nodes placed on hosts and their hosts, in the order the nodes were added."""
        return dict(self._core.hosts())

    def concurrency(self, node_id: str, workers: int | None) -> None:
        """Lets a stream (:meth:`map`, :meth:`amap`, ``forward(micro_batches=)``) run node
        ``node_id`` on up to ``workers`` items at once, for a node that keeps no state between
        items (I/O, a remote call); ``None`` gives it back its default: one item at a time for a
        sync node, as many as the stream's ``in_flight`` for an async node (1 holds an async
        node to one at a time). Results keep their order. What ``node.concurrency(n)`` sets
        before the node is registered; a stream's ``concurrency={"node": n}`` overrides it for
        that stream. The plan does not change. On a step's id it holds for the step, as on a
        node; a node inside a step is a ``soma.GraphError`` naming it (a stream limits the
        graph's own steps, not what they run), and an unknown id a ``soma.UnknownNodeError``.

        Raises:
            soma.UnknownNodeError: no node has the id ``node_id``.
            soma.GraphError: ``node_id`` is a node inside a step.
            ValueError: ``workers`` is not an int of at least 1, or ``None``.
        """
        node_id = _checked_id(node_id, "node id", _LOOKUP_HINT)
        if workers is not None:
            checked_concurrency(workers)
        self._core.set_concurrency(node_id, workers)

    def concurrencies(self) -> dict[str, int]:
        """The nodes given a concurrency (by ``Graph.concurrency`` or ``node.concurrency``), and
        how many items at once, in the order the nodes were added; the others take their
        default (see :meth:`concurrency`)."""
        return dict(self._core.concurrencies())

    def distributed_plan(self) -> _soma.Plan:
        """The plan cut into remote slices: every largest subtree whose nodes all run on one
        host is one ``Remote`` step, and consecutive steps of a sequence on one host are one
        trip. The plan itself when no node is placed on a host."""
        return self._core.distributed_plan()

    def edge(self, source: str, target: str) -> None:
        """Adds the edge ``source -> target``, two node ids; refused (and nothing changes) if it
        would close a cycle, repeats an edge or names an unknown node.

        Raises:
            soma.CycleError: the edge would close a cycle (``.path`` is that cycle).
            soma.DuplicateEdgeError: the edge is already there.
            soma.UnknownNodeError: ``source`` or ``target`` names no node.
            soma.InvalidIdError: ``source`` or ``target`` cannot be an id (a ``TypeError`` if
                it is not a ``str``).
        """
        # The common case, two `str` ids of ASCII, goes straight to the core.
        if not (type(source) is str and source.isascii()):
            source = _checked_id(source, "edge source", _EDGE_HINT)
        if not (type(target) is str and target.isascii()):
            target = _checked_id(target, "edge target", _EDGE_HINT)
        self._core.add_edge(source, target)

    def nodes(self) -> list[str]:
        """Node ids, in insertion order."""
        return self._core.nodes()

    def edges(self) -> list[tuple[str, str]]:
        """Edges, in declaration order."""
        return self._core.edges()

    def roots(self) -> list[str]:
        """Nodes without predecessors, in insertion order; each receives the graph's input."""
        return self._core.roots()

    def leaves(self) -> list[str]:
        """Nodes without successors, in insertion order; their outputs are the result."""
        return self._core.leaves()

    def predecessors(self, node_id: str) -> list[str]:
        """Sources of the edges into ``node_id``, in edge-declaration order."""
        return self._core.predecessors(_checked_id(node_id, "node id", _LOOKUP_HINT))

    def successors(self, node_id: str) -> list[str]:
        """Targets of the edges out of ``node_id``, in edge-declaration order."""
        return self._core.successors(_checked_id(node_id, "node id", _LOOKUP_HINT))

    def topological_sort(self) -> list[str]:
        """Every node after its predecessors; ties broken by insertion order."""
        return self._core.topological_sort()

    def implementation(self, node_id: str) -> Any:
        """The object registered under ``node_id``."""
        return self._core.implementation(_checked_id(node_id, "node id", _LOOKUP_HINT))

    def plan(self, *, cache: _cache.Cache | None = None, input: Any = None) -> _soma.Plan:
        """The plan: compiled on first use, reused until the graph changes.

        With ``cache``, its drawings (``str``, ``to_mermaid``, ``to_dot``, ``to_svg``) mark
        each node that ``forward(input, cache=cache)`` would find there — ``(cached)`` after its
        id, filled green — as :meth:`soma.Cache.would_hit` says, and ``plan.cached`` lists
        them; no node runs. The plan itself is the same either way (it compares equal).

        Args:
            cache: the :class:`soma.Cache` a run would be given; ``None`` (the default) marks
                nothing.
            input: the input that run would be given (``None`` unless given), keyed as
                ``forward`` keys it.

        Raises:
            TypeError: ``cache`` is no :class:`soma.Cache`.
        """
        if cache is None:
            return self._core.plan()
        if not isinstance(cache, _cache.Cache):
            raise TypeError(
                f"cache is a soma.Cache, not an object of type `{type(cache).__name__}`\n"
                "hint: pass the `soma.Cache` the run would be given"
            )
        hits = cache.would_hit(self, input)
        return self._core.plan([node for node, hit in hits.items() if hit])

    def module(self) -> _module.GraphModule:
        """The graph as a torch ``nn.Module`` (a ``soma.GraphModule``), for training it as one
        model: its submodules are the modules of the graph's nodes, each under its node's id —
        a module node's module, a ``soma.Node`` that is a module, the modules a node holds in
        its attributes (directly, or in a list, tuple or dict), the nodes inside steps included —
        so ``parameters()``, ``state_dict()``, ``train()``/``eval()`` and ``to()`` reach them all.
        Its ``forward`` runs the graph, as ``forward`` here does (``micro_batches`` included), so
        ``loss.backward()`` reaches every module that ran. ``to(device)`` leaves a node placed
        with ``.on`` on its own device, with a ``soma.PlacementWarning``; a state_dict that does
        not fit is a ``soma.StateDictError`` naming the nodes.

        The modules are read now: call it again after adding nodes. Imports torch, which must
        be installed; a node whose id cannot name a submodule (it holds a ``.``, or is
        ``nn.Module``'s own, such as ``forward``) is a ``soma.ModuleError``. See the guide's
        "The graph as a model"."""
        return _module.graph_module(self)

    def to_svg(self) -> str:
        """The graph drawn as an SVG document by Soma itself (no graphviz): laid out with its
        plan, series left to right and the branches of a wave stacked, a box per node (``id @
        device`` for a placed node) and an arrow per edge."""
        return self._core.to_svg()

    def _repr_svg_(self) -> str:
        """What a notebook shows: the drawing of ``to_svg``."""
        return self._core.to_svg()

    def to_mermaid(self) -> str:
        """The graph as a Mermaid ``flowchart LR``, drawn with its plan (a subgraph per wave)."""
        return self.plan().to_mermaid()

    def to_dot(self) -> str:
        """The graph as a graphviz ``digraph``, drawn with its plan (a cluster per wave)."""
        return self.plan().to_dot()

    def forward(
        self,
        input: Any = None,
        *,
        driver: Any = None,
        turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
        trace: _soma.Trace | None = None,
        timeout: float | None = None,
        micro_batches: int | None = None,
        join: Callable[[list[Any]], Any] | None = None,
        cache: _cache.Cache | None = None,
        run: str | None = None,
        journal: _journal.Journal | None = None,
    ) -> Any:
        """Runs the graph on ``input`` and returns the leaf's output (a dict keyed by leaf id
        when there are several).

        With ``run`` and ``journal``, the run is recorded in the journal as its nodes return,
        under that id: after a crash, a Ctrl-C or a pause, :meth:`resume` finishes it, in this
        process or another, calling only the nodes whose outputs were not recorded. A node's
        ``ctx.effect(...)`` runs once per run, and ``ctx.ask(question)`` pauses the run:
        ``forward`` raises :class:`soma.Paused`. ``forward`` with the id of a run the journal
        holds, on the same input, takes it up as :meth:`resume` does. See the guide's "Runs
        that survive".

        With ``cache``, a :class:`soma.Cache`, a node whose key is in the cache is not called:
        its output is read from there, and each output a node computes is kept there as soon as
        the node returns, so a run that fails keeps what it completed. A node's key covers its
        class's source, its state (attributes, arrays and tensors by content), and what it
        reads: the graph's input and each predecessor's output by content (an output's digest
        is taken once, when it is computed, and kept beside it).
        A class with ``cacheable = False`` always runs. With ``micro_batches`` each slice is
        looked up on its own. The nodes on hosts are keyed there, in the same folder for a
        folder cache; with a cache in memory they run uncached, with one warning. See the
        guide's "Running again".

        With ``micro_batches=k``, ``input`` is cut along its first axis into ``k`` slices,
        streamed through the graph with its stages overlapped (see :meth:`map`), and the
        outputs joined back by type, or by ``join(outputs)``; see the guide's "Streams". Each
        slice runs in a context copy of its own, as ``forward`` runs in one, and ``timeout``
        bounds them all.

        Each branch of a wave runs start to finish on one thread, and the branches of a wave are
        launched together: the calling thread runs the first branch itself, and the graph lends
        threads to the others — as many as are in flight at once, not one per branch — so
        branches that wait for each other all run. A thread that finishes a branch may take a
        sibling nobody has started yet; what a node leaves in thread-local state (a
        ``threading.local``, a library's per-thread setting) may therefore be seen by a later
        branch on the same thread, as with any thread pool. The GIL is never held while the
        engine waits (for a wave's branches, for the driver) or while a Rust node runs; a
        thread keeps it from one Python node to the next. Every branch runs in a copy of its
        caller's context — ``contextvars``, and torch's grad mode, inference mode and autocast
        when torch is loaded — and what a node sets there never reaches the caller (the guide's
        "Devices and context"). ``driver``
        serves awaiting nodes: any object with ``perform(requests) -> list``. ``trace``, a
        :class:`soma.Trace`, records a span per node (start, end, thread, branch, turns, error).

        ``timeout``, in seconds, bounds the whole run: when it passes, every branch stops at its
        next node boundary and ``forward`` raises :class:`TimeoutError` naming the nodes still
        running. With a timeout no node runs on the calling thread — the plan runs on lent threads
        while the caller waits — so ``forward`` returns at the deadline, plus the grace below,
        wherever the slow node stands, and a run that ends past its deadline raises
        :class:`TimeoutError` rather than return a late result. Ctrl-C stops a run the same way and
        raises :class:`KeyboardInterrupt`. Either way, a node that does not return within a
        twentieth of a second — it waits for an event that will not come, say — is left to finish in
        the background on its thread, its result dropped, and ``forward`` returns at once; the graph
        can run again right away. Without a timeout, a node running on the calling thread is not cut
        short by Ctrl-C beyond what Python's signal delivery does.

        A graph with async nodes (``async def forward``) runs them on one event loop Soma keeps
        for the process, the caller waiting, as :meth:`aforward` would run them — with
        ``micro_batches``, each slice as a task there, as :meth:`map` runs an item; inside a
        running event loop it refuses with a ``RuntimeError`` pointing to :meth:`aforward`.

        Args:
            input: what the graph's roots receive (``None`` unless given).
            driver: serves the nodes that return ``soma.Await``; ``None``, the default, is no
                driver (a node that awaits then fails with ``soma.DriverError``).
            turn_limit: how many calls a node that awaits gets
                (``soma.DEFAULT_TURN_LIMIT``, 64, unless given).
            trace: a :class:`soma.Trace` to record a span per node into; ``None`` records
                nothing.
            timeout: seconds the whole run may take; ``None``, the default, is no deadline.
            micro_batches: how many slices to cut ``input`` into and stream; ``None`` runs it
                whole.
            join: how the outputs of the slices are joined back (with ``micro_batches``);
                ``None`` joins them by type.
            cache: a :class:`soma.Cache` to read outputs from and keep them in; ``None`` runs
                every node.
            run: the run's id in ``journal``.
            journal: a :class:`soma.Journal` to record the run in (with ``run``).

        Raises:
            TimeoutError: ``timeout`` passed (it names the nodes still running).
            KeyboardInterrupt: Ctrl-C, once every branch stopped at a node boundary.
            soma.Paused: a node asked a question (``ctx.ask``) the run has no answer to.
            soma.errors.RunHeldError: another process is running run ``run`` now.
            soma.TurnLimitError: a node was still awaiting on its last turn.
            soma.DriverError: a node awaited and the driver could not serve it.
            soma.TimeLimitError: a node's call ran past its ``.time_limit``.
            ValueError: ``timeout`` is not a number of seconds it can be.
            TypeError: ``cache`` is no :class:`soma.Cache`.
            RuntimeError: the graph has async nodes and an event loop is running here.

        A node's own exception comes out as itself, with a note naming the node; the
        exceptions of the engine are in ``soma.errors``.
        """
        if cache is not None:
            self._refuse_cache(cache)
        if run is not None or journal is not None:
            named, kept = _journal.checked_run(run, journal)
            with kept._running(named, self, "forward", input, cache, resumed=False) as rec:
                return self._forward(
                    input, driver, turn_limit, trace, timeout, micro_batches, join, rec
                )
        return self._forward(input, driver, turn_limit, trace, timeout, micro_batches, join, cache)

    def _forward(
        self,
        input: Any,
        driver: Any,
        turn_limit: int,
        trace: _soma.Trace | None,
        timeout: float | None,
        micro_batches: int | None,
        join: Callable[[list[Any]], Any] | None,
        cache: _cache.RunCacheSource | None,
    ) -> Any:
        """:meth:`forward`, its arguments checked, with ``cache`` a :class:`soma.Cache` or a
        journal's recording."""
        if micro_batches is None:
            # The core routes one run (`soma_core::Route`): on its engine, or through
            # `soma.remote` with this graph when a node is on a host; a graph without hosts never
            # reaches a transport, nor Ray.
            return self._core.forward(
                input, driver, turn_limit, trace, timeout, None, cache, self._remote
            )
        # A stream of micro-batches, routed by the core too: of a graph with hosts, refused.
        return _stream.forward_in_micro_batches(
            self._core,
            self._core.route(True),
            input,
            micro_batches,
            join,
            driver=driver,
            turn_limit=turn_limit,
            trace=trace,
            timeout=timeout,
            cache=cache,
        )

    async def aforward(
        self,
        input: Any = None,
        *,
        driver: Any = None,
        turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
        trace: _soma.Trace | None = None,
        timeout: float | None = None,
        cache: _cache.Cache | None = None,
        run: str | None = None,
        journal: _journal.Journal | None = None,
    ) -> Any:
        """Runs the graph on ``input`` from a running event loop without blocking it, and
        returns what ``forward`` would.

        Async nodes (``async def forward``) run as tasks on this loop; every largest part of
        the plan without one runs on Soma's engine as ``forward`` runs it, on a thread the
        graph lends, while the loop goes on. The branches of a wave run side by side; the
        first declared failing branch's error wins, with the node's own exception and note;
        branches declared after it stop at their next node boundary. The run has a copy of
        the caller's context; what a node sets reaches the later nodes of its branch, never
        the caller. Many calls may be in flight at once on one loop.

        ``timeout``, in seconds, bounds the run: when it passes, the async nodes in flight are
        cancelled, the rest stop at their next node boundary, and :class:`TimeoutError` names
        the nodes that were running. Cancelling the task that awaits ``aforward`` (or
        ``asyncio.timeout`` around it) does the same and raises ``asyncio.CancelledError``;
        the cancelled nodes' ``finally`` blocks have run by then. See the guide's "Async
        nodes".

        With ``cache``, a :class:`soma.Cache`, an async node is keyed as ``forward`` keys a
        node — its class's source, its state, and what it reads by content — and not awaited
        when its key is there; each part of the plan without async nodes is keyed by the
        engine on what it reads. The keys differ from those of a graph with no async node, so
        the two do not share entries.

        Args:
            input: what the graph's roots receive (``None`` unless given).
            driver: serves the nodes that return ``soma.Await``, as in :meth:`forward`.
            turn_limit: how many calls a node that awaits gets, as in :meth:`forward`.
            trace: a :class:`soma.Trace` to record a span per node into, as in :meth:`forward`.
            timeout: seconds the whole run may take; ``None``, the default, is no deadline.
            cache: a :class:`soma.Cache`, as above; ``None`` runs every node.
            run: the run's id in ``journal``, as in :meth:`forward`.
            journal: a :class:`soma.Journal` to record the run in, as in :meth:`forward`.

        Raises:
            TimeoutError: ``timeout`` passed (it names the nodes that were running).
            soma.Paused: a node asked a question the run has no answer to, as in
                :meth:`forward`.
            asyncio.CancelledError: the awaiting task was cancelled.
            TypeError: ``cache`` is no :class:`soma.Cache`.

        A node's own exception comes out as itself, with a note naming the node, as from
        :meth:`forward`.
        """
        if cache is not None:
            self._refuse_cache(cache)
        if run is not None or journal is not None:
            named, kept = _journal.checked_run(run, journal)
            with kept._running(named, self, "aforward", input, cache, resumed=False) as rec:
                return await self._core.aforward(
                    input, driver, turn_limit, trace, timeout, rec, self._remote
                )
        # Routed by the core as `forward` is.
        return await self._core.aforward(
            input, driver, turn_limit, trace, timeout, cache, self._remote
        )

    def resume(
        self,
        run: str,
        *,
        journal: _journal.Journal,
        answers: dict[str, Any] | None = None,
        driver: Any = None,
        turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
        trace: _soma.Trace | None = None,
        timeout: float | None = None,
        cache: _cache.Cache | None = None,
    ) -> Any:
        """Finishes run ``run`` of ``journal`` — cut off by a crash, a Ctrl-C, an error, or
        paused for answers — and returns what an uninterrupted ``forward`` would have: on the
        input it was begun with, calling exactly the nodes whose outputs were not recorded
        (and any node edited since, and what depends on it). Effects recorded are not made
        again; ``answers``, by the path :class:`soma.Paused` gave each question at, answer the
        open questions first. Any process may resume a run; one running it now holds it.

        Args:
            run: the run's id.
            journal: the :class:`soma.Journal` it was recorded in.
            answers: answers to its open questions, by path.
            driver: as in :meth:`forward`.
            turn_limit: as in :meth:`forward`.
            trace: as in :meth:`forward`.
            timeout: seconds this resume may take (a pause does not count); ``None`` is none.
            cache: a :class:`soma.Cache` to ask for what the journal does not hold.

        Raises:
            soma.Paused: it asks again, or a question is still open.
            soma.errors.JournalError: the journal holds no run ``run``, or no question is open
                at a path of ``answers``.
            soma.errors.RunHeldError: another process is running it now.
            soma.errors.SignatureError: its input does not verify under the journal's key.
        """
        run, kept = _journal.checked_run(run, journal)
        if cache is not None:
            self._refuse_cache(cache)
        input = kept._resumable(run, answers)
        with kept._running(run, self, "forward", input, cache, resumed=True) as rec:
            return self._forward(input, driver, turn_limit, trace, timeout, None, None, rec)

    async def aresume(
        self,
        run: str,
        *,
        journal: _journal.Journal,
        answers: dict[str, Any] | None = None,
        driver: Any = None,
        turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
        trace: _soma.Trace | None = None,
        timeout: float | None = None,
        cache: _cache.Cache | None = None,
    ) -> Any:
        """:meth:`resume` from a running event loop, as :meth:`aforward` runs.

        Args:
            run: the run's id.
            journal: the :class:`soma.Journal` it was recorded in.
            answers: answers to its open questions, by path.
            driver: as in :meth:`forward`.
            turn_limit: as in :meth:`forward`.
            trace: as in :meth:`forward`.
            timeout: seconds this resume may take; ``None`` is none.
            cache: a :class:`soma.Cache` to ask for what the journal does not hold.

        Raises:
            soma.Paused: it asks again, or a question is still open.
            soma.errors.JournalError: as in :meth:`resume`.
            soma.errors.RunHeldError: another process is running it now.
        """
        run, kept = _journal.checked_run(run, journal)
        if cache is not None:
            self._refuse_cache(cache)
        input = kept._resumable(run, answers)
        with kept._running(run, self, "aforward", input, cache, resumed=True) as rec:
            return await self._core.aforward(
                input, driver, turn_limit, trace, timeout, rec, self._remote
            )

    def events(
        self, input: Any = None, *, buffer: int = _events.DEFAULT_BUFFER, **forward: Any
    ) -> Iterator[_events.Event]:
        """Runs the graph on ``input`` as :meth:`forward` would (``forward``'s keywords are
        passed to it) and yields its events as they happen: a node ``"started"``,
        ``"finished"``, ``"failed"``, ``"retried"``, ``"timed_out"``, ``"paused"`` (it asked a
        question, ``ctx.ask``), what a node sends with ``ctx.emit(value)`` (``"emitted"``), and
        last the run's ``"result"``, ``"paused"`` (its :class:`soma.Paused`) or ``"error"`` —
        a run's error is that last event, never raised by the iterator. A run with ``run=``
        and ``journal=`` that takes up a run the journal holds begins with ``"resumed"``. Each
        a :class:`soma.Event`.

        The run goes on a thread of its own while the caller reads; the events of one branch
        come in the order it made them, branches interleaved as they ran. A slow reader never
        holds the run up: at most ``buffer`` events wait, newer ones are dropped and counted
        in the last event's ``dropped``. Leaving the loop early leaves the run to finish on
        its thread, its events dropped. See the guide's "Watching a run".

        Args:
            input: what the graph's roots receive, as in :meth:`forward`.
            buffer: how many events may wait for the reader (10,000 unless given).
            **forward: the keywords of :meth:`forward` (``timeout=``, ``cache=``, ...).
        """
        return _events.events(self.forward, input, buffer, forward)

    def aevents(
        self, input: Any = None, *, buffer: int = _events.DEFAULT_BUFFER, **aforward: Any
    ) -> AsyncIterator[_events.Event]:
        """:meth:`events` from a running event loop: ``async for event in g.aevents(x)``, the
        run awaited as :meth:`aforward` in a task of this loop. Leaving the loop early cancels
        the run.

        Args:
            input: what the graph's roots receive, as in :meth:`aforward`.
            buffer: how many events may wait for the reader (10,000 unless given).
            **aforward: the keywords of :meth:`aforward` (``timeout=``, ``cache=``, ...).
        """
        return _events.aevents(self.aforward, input, buffer, aforward)

    def map_events(
        self, inputs: Iterable[Any], *, buffer: int = _events.DEFAULT_BUFFER, **map: Any
    ) -> Iterator[_events.Event]:
        """:meth:`events` for a stream: runs :meth:`map` over ``inputs`` (its keywords passed
        to it) and yields its items' events as they happen, each with its item's index in
        ``.item``; each item's result is a ``"result"`` event with its index, in input order,
        and an error (the first failing item's, or the stream's own) the last event. Results
        are never dropped: once 64 wait for the reader, the stream waits for it, as ``map``
        waits for its reader. Leaving the loop early stops the stream.

        Args:
            inputs: the items, as in :meth:`map`.
            buffer: how many events other than results may wait for the reader (10,000 unless
                given).
            **map: the keywords of :meth:`map` (``in_flight=``, ``timeout=``, ...).
        """
        return _events.map_events(self.map, inputs, buffer, map)

    def amap_events(
        self,
        inputs: Iterable[Any] | AsyncIterable[Any],
        *,
        buffer: int = _events.DEFAULT_BUFFER,
        **amap: Any,
    ) -> AsyncIterator[_events.Event]:
        """:meth:`map_events` from a running event loop, the stream run as :meth:`amap`.

        Args:
            inputs: the items, an iterable or an async iterable, as in :meth:`amap`.
            buffer: how many events other than results may wait for the reader (10,000 unless
                given).
            **amap: the keywords of :meth:`amap` (``in_flight=``, ``timeout=``, ...).
        """
        return _events.amap_events(self.amap, inputs, buffer, amap)

    def amap(
        self,
        inputs: Iterable[Any] | AsyncIterable[Any],
        *,
        in_flight: int = _stream.DEFAULT_IN_FLIGHT,
        ordered: bool = True,
        on_error: _stream.OnError = "raise",
        concurrency: Mapping[str, int] | None = None,
        driver: Any = None,
        turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
        trace: _soma.Trace | None = None,
        timeout: float | None = None,
        cache: _cache.Cache | None = None,
        run: str | None = None,
        journal: _journal.Journal | None = None,
        answers: dict[str, Any] | None = None,
    ) -> _stream.AsyncStream:
        """Runs the graph on each of ``inputs`` (an iterable or an async iterable, read lazily)
        from a running event loop: ``async for y in g.amap(xs)`` gives the results in input
        order, with at most ``in_flight`` items in flight. An async node works on as many items
        at once as ``in_flight`` allows, a sync node on one, unless ``node.concurrency(n)`` (or
        ``concurrency={"node": n}``) says ``n``. A part of the plan without async nodes runs
        on as many items at once as the least concurrent of its nodes. ``ordered`` and
        ``on_error`` are :meth:`map`'s: by default the first failing item's exception is raised
        at its position, and the items after it are cancelled; ``"skip"`` keeps the records in
        the returned stream's ``failures``. An ordinary exception the inputs raise comes out
        once the items read before it are out, as in :meth:`map`.

        ``timeout``, in seconds, bounds the whole stream, from this call to its last result,
        as in :meth:`map`: once it passes, the items in flight are cancelled and the next result
        asked for raises :class:`TimeoutError` naming the nodes that were running. With
        ``cache``, a :class:`soma.Cache`, each item is looked up as ``aforward(item,
        cache=cache)`` would look it up. ``run``, ``journal`` and ``answers`` record the stream
        as :meth:`map` records it.

        Args:
            inputs: the items, an iterable or an async iterable, read lazily.
            in_flight: how many items may be read and not yet handed back (64 unless given).
            concurrency: items at once per node id for this stream, beside the graph's own
                ``g.concurrency`` settings; ``None`` keeps those.
            driver: serves the nodes that return ``soma.Await``, as in :meth:`forward`.
            turn_limit: how many calls a node that awaits gets, as in :meth:`forward`.
            trace: a :class:`soma.Trace` to record every item's spans into.
            timeout: seconds the whole stream may take; ``None``, the default, is no deadline.
            cache: a :class:`soma.Cache`, as above; ``None`` runs every node.
            run: the stream's run id in ``journal``, as in :meth:`map`.
            journal: a :class:`soma.Journal` to record the stream in, as in :meth:`map`.
            answers: answers to the run's open questions, by path, as in :meth:`map`.

        Raises:
            ValueError: ``in_flight`` is not an int of at least 1, or ``timeout`` is not a
                number of seconds it can be.
            TypeError: ``cache`` is no :class:`soma.Cache`.
            soma.errors.RunHeldError: another process is running stream ``run`` now.
            soma.errors.JournalError: as in :meth:`map`.

        While iterating, the first failing item's exception comes out as itself (with a note
        naming its node), :class:`TimeoutError` once ``timeout`` passed, and
        :class:`soma.Paused` at an item whose node asked a question (with ``journal``).
        """
        if timeout is not None:
            _soma.checked_timeout(timeout)
        if isinstance(in_flight, bool) or not isinstance(in_flight, int) or in_flight < 1:
            raise ValueError(f"in_flight takes an int of at least 1, not {in_flight!r}")
        _stream.checked_on_error(on_error)
        if cache is not None:
            self._refuse_cache(cache)
        counts = _stream.concurrency_of(self._core, concurrency)
        held = self._stream_run(run, journal, "amap", cache, answers)
        try:
            return _stream.stream_amap(
                self._core,
                inputs,
                in_flight=in_flight,
                ordered=ordered,
                on_error=on_error,
                concurrency=counts,
                driver=driver,
                turn_limit=turn_limit,
                trace=trace,
                timeout=timeout,
                cache=cache if held is None else held.recording,
                held=held,
            )
        except BaseException as raised:
            if held is not None:
                held.ended(raised, 0, None)
            raise

    def _stream_run(
        self,
        run: str | None,
        journal: _journal.Journal | None,
        kind: str,
        cache: _cache.Cache | None,
        answers: dict[str, Any] | None,
    ) -> _journal.StreamRun | None:
        """The run a stream is recorded as, held until it ends, when it has an id; ``None``
        without one (``answers`` then refused: there is no run to answer)."""
        if run is None and journal is None:
            if answers is not None:
                raise ValueError(
                    "answers are for a run's open questions, and a stream without run= and "
                    "journal= has none"
                )
            return None
        named, kept = _journal.checked_run(run, journal)
        return kept._stream(named, self._core, kind, cache, answers)

    def _refuse_cache(self, cache: object) -> None:
        """Refuses a ``cache=`` that is no :class:`soma.Cache`."""
        if not isinstance(cache, _cache.Cache):
            raise TypeError(
                f"cache is a soma.Cache, not an object of type `{type(cache).__name__}`\n"
                "hint: pass `soma.Cache()` (in memory) or `soma.Cache(path)` (a folder)"
            )

    def map(
        self,
        inputs: Iterable[Any],
        *,
        in_flight: int = _stream.DEFAULT_IN_FLIGHT,
        ordered: bool = True,
        on_error: _stream.OnError = "raise",
        concurrency: Mapping[str, int] | None = None,
        progress: bool | Callable[[_stream.Progress], object] = False,
        driver: Any = None,
        turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
        trace: _soma.Trace | None = None,
        timeout: float | None = None,
        cache: _cache.Cache | None = None,
        run: str | None = None,
        journal: _journal.Journal | None = None,
        answers: dict[str, Any] | None = None,
    ) -> _stream.Stream:
        """Streams ``inputs`` through the graph and returns an iterator of its results, in input
        order (``Graph.map``).

        ``inputs`` is any iterable, read lazily on the thread that iterates, never more than
        ``in_flight`` items ahead of the results taken: a generator of a million items runs in flat
        memory, and a slow reader slows the stream. The graph is cut into stages (the steps of its
        plan's top-level sequence: a node, or a whole wave), each on a thread lent by the graph, so
        stage *k* works on item *i* while stage *k+1* is on item *i-1*; every node still takes
        items one at a time and in order, so a stateful node needs no lock, and a wave inside a
        stage runs its branches side by side for each item. ``concurrency={"node": n}`` (or
        ``node.concurrency(n)``) lets a stateless node work on ``n`` items at once.

        ``ordered=False`` yields ``(index, result)`` pairs as items finish. ``on_error="raise"``:
        the first failing item's exception (its own type, traceback and node note, as in
        ``forward``) is raised at its position, after the items before it, and the stream stops;
        ``"collect"`` yields a :class:`soma.Failed` in its place and goes on; ``"skip"`` leaves it
        out and goes on (the records are kept in ``stream.failures``). ``progress=True`` draws a bar
        (tqdm when installed, else a line on stderr); a callable receives :class:`soma.Progress`
        events instead. ``driver``, ``turn_limit`` and ``trace`` are as in ``forward``.

        Each item runs in a copy of the caller's context of its own (``contextvars``, and torch's
        grad mode, inference mode and autocast when torch is loaded), copied when the item is read
        and carried with it from stage to stage: a node sees what the nodes before it set for the
        same item, as in ``forward``, and never what another item's nodes set; the caller sees
        none of it.

        ``timeout``, in seconds, bounds the whole stream, from this call to its last result (not
        each item): once it passes, every stage stops at its next node boundary and the next
        result asked for raises :class:`TimeoutError` naming the nodes still running, even while a
        node never returns; such a node is left to finish on its thread, its item dropped, and the
        graph can run again at once. Results not taken by the deadline are not handed back.

        With ``cache``, a :class:`soma.Cache`, each item is looked up as ``forward(item,
        cache=cache)`` would look it up: keyed on its own content, its hits not called.

        With ``run`` and ``journal``, the stream is one run of the journal, recorded as its
        items' nodes return, each item keyed on its own content as ``cache`` keys it; it is held
        from this call until the stream ends. Calling ``map`` again with the same items and id
        (after a crash, in any process) takes it up: every node an item recorded is answered
        from the journal without being called, so the stream resumes at its first unfinished
        item — an item finished out of order (``ordered=False``, or a later stage ahead) is
        answered from the journal too, and an item partly done calls only its unrecorded nodes.
        The journal keeps no items (they are the caller's, read lazily), so :meth:`resume`
        refuses a stream's id, pointing here. A node's ``ctx.ask`` pauses the stream: at that
        item, whatever ``on_error`` says, the iterator raises :class:`soma.Paused` and stops;
        ``map`` again with ``answers={path: answer}`` goes on. The run ends ``finished`` when
        the stream runs out with every item done, ``failed`` when an item's error ends it,
        when ``on_error`` skipped or collected failed items (they run again next time), or when
        the stream is closed or dropped before its end, and ``paused`` at a question.

        A graph with async nodes streams each item as ``aforward`` runs it, as a task on the event
        loop ``forward`` uses (the engine's ``Flow``), with no stages: the items in flight overlap
        on the loop, those cut short are cancelled, and :meth:`Stream.figures` lists no stage.
        Inside a running event loop it refuses, pointing to ``aforward``.

        Args:
            inputs: the items, any iterable, read lazily.
            in_flight: how many items may be read and not yet handed back (64 unless given).
            ordered: results in input order; ``False`` yields ``(index, result)`` as they come.
            on_error: ``"raise"``, ``"collect"`` or ``"skip"``, as above.
            concurrency: items at once per node id for this stream, as above.
            progress: ``True`` draws a bar; a callable receives :class:`soma.Progress`.
            driver: as in :meth:`forward`.
            turn_limit: as in :meth:`forward`.
            trace: a :class:`soma.Trace` to record every item's spans into.
            timeout: seconds the whole stream may take; ``None``, the default, is no deadline.
            cache: a :class:`soma.Cache`, as above; ``None`` runs every node.
            run: the stream's run id in ``journal``.
            journal: a :class:`soma.Journal` to record the stream in (with ``run``).
            answers: answers to the run's open questions, by the path :class:`soma.Paused`
                gave each at, recorded before the stream starts.

        Raises:
            soma.errors.RunHeldError: another process is running stream ``run`` now.
            soma.errors.JournalError: ``run`` is a run on one input (``forward``'s), or no
                question is open at a path of ``answers``.

        While iterating, :class:`soma.Paused` at an item whose node asked a question (with
        ``journal``), besides what ``on_error`` raises.
        """
        route = self._core.route(True)
        if cache is not None:
            self._refuse_cache(cache)
        held = self._stream_run(run, journal, "map", cache, answers)
        try:
            return _stream.stream_map(
                self._core,
                route,
                inputs,
                in_flight=in_flight,
                ordered=ordered,
                on_error=on_error,
                concurrency=concurrency,
                progress=progress,
                driver=driver,
                turn_limit=turn_limit,
                trace=trace,
                timeout=timeout,
                cache=cache if held is None else held.recording,
                held=held,
            )
        except BaseException as raised:
            if held is not None:
                held.ended(raised, 0, None)
            raise

    def threads(self) -> int:
        """The threads the graph holds right now for its waves, busy or idle."""
        return self._core.threads()

    @property
    def idle_threads(self) -> int:
        """How many idle threads the graph keeps for its next waves (64 unless set); idle
        threads beyond it end. Every thread ends when the graph is dropped or collected."""
        return self._core.idle_threads

    @idle_threads.setter
    def idle_threads(self, limit: int) -> None:
        self._core.idle_threads = limit

    def __len__(self) -> int:
        return len(self._core)

    def __contains__(self, node_id: object) -> bool:
        try:
            return isinstance(node_id, str) and node_id in self._core
        except UnicodeEncodeError:  # A lone surrogate: no id holds one.
            return False

    def __copy__(self) -> Graph:
        """An independent graph with the same node objects under the same ids, the same edges
        in the same order and the same ``idle_threads``; it holds threads of its own.

        Without this ``copy.copy`` would copy the slot, and the "copy" would be the very same
        graph: a node added to one would appear in the other.
        """
        return self._copied(lambda obj: obj)

    def __deepcopy__(self, memo: dict[int, Any]) -> Graph:
        """As ``__copy__``, but each node object is ``copy.deepcopy``'d; objects that several
        nodes share stay shared in the copy, and a node that refers to this graph refers to the
        copy. A Rust node is immutable, and is its own deep copy."""
        return self._copied(lambda obj: copy.deepcopy(obj, memo), memo)

    def _copied(self, copy_node: Callable[[Any], Any], memo: dict[int, Any] | None = None) -> Graph:
        graph = type(self)()
        if memo is not None:  # Before the nodes: one of them may refer back to this graph.
            memo[id(self)] = graph
        graph._fill(
            ((node_id, copy_node(self.implementation(node_id))) for node_id in self.nodes()),
            self._settings(),
        )
        return graph

    def _settings(self) -> _Settings:
        """Everything a graph is, beside its nodes: edges, placements, settings. Nothing of a
        run: no thread, no program, no connection to hosts."""
        return _Settings(
            self.edges(),
            self.devices(),
            self.hosts(),
            self.idle_threads,
            self.retries(),
            self.time_limits(),
            self.concurrencies(),
        )

    def _fill(self, nodes: Iterable[tuple[str, Any]], settings: _Settings) -> None:
        """Makes this new, empty graph hold ``nodes`` under their ids, and ``settings``."""
        for node_id, obj in nodes:
            self.node(node_id, obj)
        for source, target in settings.edges:
            self.edge(source, target)
        # Where each node runs is what was set on the graph, and not what the node's own `.on`
        # or `.at` said when it was registered: `place(id, None)` may have undone it since.
        for node_id in self.devices():
            if node_id not in settings.devices:
                self.place(node_id, None)
        for node_id, device in settings.devices.items():
            self.place(node_id, device)
        for node_id in self.hosts():
            if node_id not in settings.hosts:
                self.place_at(node_id, None)
        for node_id, host in settings.hosts.items():
            self.place_at(node_id, host)
        self.idle_threads = settings.idle_threads
        # As for devices: what was set on the graph, not what the node said when registered.
        for node_id in self.retries():
            if node_id not in settings.retries:
                self.retry(node_id, None)
        for node_id, policy in settings.retries.items():
            self.retry(node_id, *policy)
        for node_id in self.time_limits():
            if node_id not in settings.time_limits:
                self.time_limit(node_id, None)
        for node_id, seconds in settings.time_limits.items():
            self.time_limit(node_id, seconds)
        if settings.concurrencies is not None:  # A pickle of before they were a setting: none.
            for node_id in self.concurrencies():
                if node_id not in settings.concurrencies:
                    self.concurrency(node_id, None)
            for node_id, workers in settings.concurrencies.items():
                self.concurrency(node_id, workers)

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        """How ``pickle`` saves a graph: its nodes under their ids, its edges, where its nodes
        run (devices, hosts) and its ``idle_threads``; nothing of a run (threads, a program,
        a connection to hosts). The nodes are pickled together, in a pickle of their own
        inside this one: objects they share stay shared, and a node that refers to its graph
        refers to the unpickled one. A node that cannot be pickled is a
        ``soma.NodePicklingError`` naming it, its own error the cause."""
        ids = self.nodes()
        saved = io.BytesIO()
        pickler = _node_pickler()(saved, int(protocol), self)
        for node_id in ids:
            obj = self.implementation(node_id)
            try:
                pickler.dump(obj)
            except Exception as failure:
                raise _unpicklable(node_id, obj, failure) from failure
        return (_unpickled, (type(self), ids, saved.getvalue(), self._settings()))

    def __repr__(self) -> str:
        nodes = self.nodes()
        edges = _counted([f"{a} -> {b}" for a, b in self.edges()], "edge")
        # A semicolon only where a list of nodes needs setting apart from what follows it.
        return f"Graph({_counted(nodes, 'node')}{'; ' if nodes else ', '}{edges})"


class _Settings(NamedTuple):
    """What a copy or a pickle of a graph carries beside its nodes."""

    edges: list[tuple[str, str]]
    devices: dict[str, str]
    hosts: dict[str, str]
    idle_threads: int
    retries: dict[str, RetryPolicy]
    time_limits: dict[str, float]
    # `None` in a pickle made before concurrency was a graph's setting: the nodes' own, then.
    concurrencies: dict[str, int] | None = None


# What stands for the graph itself among its pickled nodes.
_THIS_GRAPH = "soma.Graph: the graph being pickled"


@functools.cache
def _node_pickler() -> Callable[[IO[bytes], int, Graph], pickle.Pickler]:
    """The pickler of a graph's nodes, made on first use: a ``multiprocessing`` pickler, so a
    node that holds what only ``multiprocessing`` knows how to send (a queue, a connection)
    pickles when the graph is sent to a process; imported only then, as ``multiprocessing``
    costs an import of Soma tens of milliseconds."""
    from multiprocessing.reduction import ForkingPickler

    class NodePickler(ForkingPickler):
        """Pickles a graph's nodes, one ``dump`` each, with one memo: writes the graph itself,
        should a node refer to it, as a reference that ``_unpickled`` resolves."""

        def __init__(self, file: IO[bytes], protocol: int, graph: Graph) -> None:
            super().__init__(file, protocol)
            self._graph = graph
            # torch registers with this pickler reductions that send a tensor as a handle to
            # shared memory, valid only while this process lives; a graph's pickle may be a
            # checkpoint loaded after it has exited, so a tensor pickles by value, as torch
            # pickles it anywhere else.
            self.dispatch_table = {
                cls: reduce
                for cls, reduce in self.dispatch_table.items()
                if not getattr(reduce, "__module__", "").startswith("torch.multiprocessing")
            }

        def persistent_id(self, obj: Any) -> str | None:
            return _THIS_GRAPH if obj is self._graph else None

    return NodePickler


class _NodeUnpickler(pickle.Unpickler):
    """Reads what ``_NodePickler`` wrote, the graph's references resolved to ``graph``."""

    def __init__(self, file: IO[bytes], graph: Graph) -> None:
        super().__init__(file)
        self._graph = graph

    def persistent_load(self, pid: Any) -> Any:
        if pid == _THIS_GRAPH:
            return self._graph
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r} among a graph's nodes")


def _unpickled(cls: type[Graph], ids: list[str], nodes: bytes, settings: _Settings) -> Graph:
    """The graph ``Graph.__reduce_ex__`` saved. A node that cannot be loaded (its class is
    not importable here, say) raises its own error, with a note naming the node."""
    graph = cls()
    loaded = _NodeUnpickler(io.BytesIO(nodes), graph)

    def each() -> Iterator[tuple[str, Any]]:
        for node_id in ids:
            try:
                obj = loaded.load()
            except Exception as failure:
                failure.add_note(
                    f"while loading node `{node_id}` of a pickled soma.Graph\n"
                    "hint: a node loads where its class can be imported: define it at the top "
                    "level of a module that this process can import"
                )
                raise
            yield node_id, obj

    graph._fill(each(), settings)
    return graph


def _unpicklable(node_id: str, obj: object, failure: Exception) -> NodePicklingError:
    cls = type(obj)
    error = NodePicklingError(
        f"node `{node_id}` (`{cls.__module__}.{cls.__qualname__}`) cannot be pickled: "
        f"{type(failure).__name__}: {failure}\n"
        "hint: a graph pickles when each of its nodes does: keep what cannot be pickled (a "
        "lock, an open file, a thread, a lambda) out of what the node pickles, with "
        "`__getstate__`/`__setstate__`, and define its class at the top level of a module"
    )
    error.node = node_id
    return error


def _counted(items: list[str], noun: str) -> str:
    """``3 nodes: a, b, c``, ``1 edge: a -> b`` or ``0 edges``: at most eight listed, so a large
    graph's repr stays one readable line."""
    count = f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
    if not items:
        return count
    return f"{count}: " + ", ".join(items[:8]) + (", ..." if len(items) > 8 else "")
