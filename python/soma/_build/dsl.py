"""The DSL: ``>>`` in series, ``|`` side by side, and nothing but nodes and edges.

An :class:`Expr` reads as the nodes in declaration order, the edges between them, its heads and
its terminals; it keeps the tree its operators wrote and reads those off it when asked, so that
writing one costs the same at every step however large it grows. ``a >> b`` connects every
terminal of ``a`` to every head of ``b``; ``a | b`` is a disjoint union. ``>>`` binds tighter
than ``|``, as Python's operators do. The expression is an oracle, never the source of a plan:
:meth:`soma.Graph.somatize` turns it into plain
``node()``/``edge()`` calls, and the plan is recovered from the graph alone.

:class:`Composable` is where ``>>`` and ``|`` start: ``soma.Node`` subclasses it, so the node
module imports the DSL and the DSL never needs to know what a node is. What stands in an
expression without being a node — a function, a torch module — is made one by the rule
:func:`wrap_with` hands the DSL (``soma._build.function``'s, set when ``soma`` is imported).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable
from typing import Any, Union

from soma import _soma
from soma._build.policy import checked_concurrency, checked_retry, checked_time_limit


class Composable:
    """Anything that stands as a one-node expression on either side of ``>>`` and ``|``."""

    __slots__ = ()

    def __rshift__(self, other: object) -> Expr:
        return Expr(None, self, _part(other, ">>"), True)

    def __rrshift__(self, other: object) -> Expr:
        return Expr(None, _part(other, ">>"), self, True)

    def __or__(self, other: object) -> Expr:
        return Expr(None, self, _part(other, "|"), False)

    def __ror__(self, other: object) -> Expr:
        return Expr(None, _part(other, "|"), self, False)


def _no_node(item: object) -> Composable | None:
    return None


# What makes a node of an object that is none, or answers `None`: see `wrap_with`.
_wrap: Callable[[object], Composable | None] = _no_node


def wrap_with(wrap: Callable[[object], Composable | None]) -> None:
    """Makes ``wrap`` the rule that turns what stands in an expression without being a node
    (a function, a torch module) into one, or answers ``None`` for what cannot be. Set once, by
    the module that knows what a node is, which this one does not import."""
    global _wrap
    _wrap = wrap


# A part of an expression's tree: an expression, or a node standing for itself (one object
# fewer per node than an expression around it, for the garbage collector to walk).
_Part = Union["Expr", Composable]


def _part(item: object, operator: str) -> _Part:
    """``item`` as a part of an expression; a ``TypeError`` that says what to do else."""
    if isinstance(item, (Expr, Composable)):
        return item
    return Expr.of(item, operator)  # Raises, saying why.


class Expr:
    """Nodes, edges (as index pairs), heads and terminals of an expression.

    An expression is kept as the tree its operators wrote — a node, or two expressions in series
    or side by side — so ``e >> k`` and ``e | k`` cost the same however large ``e`` is, and a
    chain built by a loop costs time linear in its length. ``nodes``, ``edges``, ``heads`` and
    ``terminals`` are read off that tree on first use, by a walk with a stack of its own rather
    than by recursion, so an expression nested 100,000 deep reads as well as a flat one.

    Made by ``>>`` and ``|`` (and :meth:`of`), never by hand: ``node`` is the one node of a
    leaf, ``left`` and ``right`` the two sides of an operator, ``series`` whether it is ``>>``.
    """

    __slots__ = ("_flat", "_left", "_node", "_right", "_series")

    def __init__(self, node: object, left: _Part | None, right: _Part | None, series: bool) -> None:
        # One of: a node (`left` and `right` None), or `left` and `right` in series or side by
        # side. Built by `of`, `>>` and `|`, never by hand.
        self._node = node
        self._left = left
        self._right = right
        self._series = series
        self._flat: _Flat | None = None

    @staticmethod
    def of(item: object, operator: str) -> Expr:
        """The expression of ``item``, a node or an expression (a function or a torch module
        made a node).

        Args:
            item: what to compose.
            operator: how it is being composed (``">>"``, ``"|"``, a step's name), for the
                message of a refusal.

        Raises:
            TypeError: ``item`` composes as none of these; the message says what to do.
        """
        if isinstance(item, Expr):
            return item
        if isinstance(item, Composable):
            return Expr(item, None, None, False)
        refuse_class(item, verb="compose", where=f" in `{operator}`")
        node = _wrap(item)
        if node is not None:  # A function, a torch module.
            return Expr(node, None, None, False)
        raise TypeError(
            f"cannot compose an object of type `{type(item).__name__}` with `{operator}`: "
            "only nodes (soma.Node instances, functions, torch modules) and expressions of "
            "them compose\n"
            "hint: subclass soma.Node and define `forward(self, x)`, or decorate a function "
            "with `@soma.node`; an object with a `forward` of its own registers with "
            "Graph.node() and connects with Graph.edge()"
        )

    @property
    def nodes(self) -> tuple[Any, ...]:
        """The nodes, in the order they are written."""
        return self._flattened().nodes

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """The edges, as pairs of indices into ``nodes``: those of ``a``, then those of ``b``,
        then, for ``a >> b``, every terminal of ``a`` to every head of ``b``."""
        return self._flattened().edges

    @property
    def heads(self) -> tuple[int, ...]:
        """The indices of the nodes that receive the expression's input."""
        return self._flattened().heads

    @property
    def terminals(self) -> tuple[int, ...]:
        """The indices of the nodes whose outputs are the expression's output."""
        return self._flattened().terminals

    def _flattened(self) -> _Flat:
        if self._flat is None:
            self._flat = _flatten(self)
        return self._flat

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled, copied and deep-copied as what it reads as, never as its tree: a tree
        100,000 deep would take ``copy`` and ``pickle`` as deep into recursion."""
        flat = self._flattened()
        return (_read, (flat.nodes, flat.edges, flat.heads, flat.terminals))

    def __rshift__(self, other: object) -> Expr:
        return Expr(None, self, _part(other, ">>"), True)

    def __rrshift__(self, other: object) -> Expr:
        return Expr(None, _part(other, ">>"), self, True)

    def __or__(self, other: object) -> Expr:
        return Expr(None, self, _part(other, "|"), False)

    def __ror__(self, other: object) -> Expr:
        return Expr(None, _part(other, "|"), self, False)

    def on(self, device: str) -> Expr:
        """Places every node of the expression on ``device`` that is not placed already (by its
        own ``.on``, or an inner expression's): the innermost ``.on`` wins, as with ``.named``.
        Read now, so a device that cannot be is a ``soma.DeviceError`` here."""
        device = _soma.parse_device(device)
        for node in self.nodes:
            if getattr(node, "_soma_device", None) is None:
                node._soma_device = device
        return self

    def at(self, host: str) -> Expr:
        """Runs every node of the expression on ``host`` that is not placed on one already (by
        its own ``.at``, or an inner expression's): the innermost ``.at`` wins, as with
        ``.named``. Read now, so a name that cannot be is a ``soma.HostError`` here."""
        host = _soma.parse_host(host)
        for node in self.nodes:
            if getattr(node, "_soma_host", None) is None:
                node._soma_host = host
        return self

    def retry(
        self,
        times: int,
        backoff: float = 0.5,
        on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    ) -> Expr:
        """Gives every node of the expression that has none yet (by its own ``.retry``, or an
        inner expression's) these retries: see ``soma.Node.retry``. Each node is retried on its
        own; the expression is not run again as a whole. Returns the expression.

        Args:
            times: how many more attempts after the first, an int of at least 0.
            backoff: seconds before the first retry (0.5 unless given), at least 0; each next
                pause is doubled.
            on: the exception class, or a tuple of them, that a retry is made for (any
                ``Exception`` unless given); another one fails the call at once.

        Raises:
            ValueError: ``times`` or ``backoff`` is not a number it can be.
            TypeError: ``on`` holds something that is no exception class.
        """
        policy = checked_retry(times, backoff, on)
        for node in self.nodes:
            if getattr(node, "_soma_retry", None) is None:
                node._soma_retry = policy
        return self

    def time_limit(self, seconds: float) -> Expr:
        """Gives every node of the expression that has none yet this time limit per call: see
        ``soma.Node.time_limit``. The limit is each node's, not the expression's as a whole.
        Returns the expression.

        Args:
            seconds: the limit, a number of seconds above 0.

        Raises:
            ValueError: ``seconds`` is not a finite number above 0.
        """
        limit = checked_time_limit(seconds)
        for node in self.nodes:
            if getattr(node, "_soma_time_limit", None) is None:
                node._soma_time_limit = limit
        return self

    def concurrency(self, workers: int) -> Expr:
        """Lets a stream run every node of the expression that has no concurrency yet (by its
        own ``.concurrency``, or an inner expression's) on up to ``workers`` items at once: see
        ``soma.Node.concurrency``. The count is each node's, not the expression's as a whole."""
        count = checked_concurrency(workers)
        for node in self.nodes:
            if getattr(node, "_soma_concurrency", None) is None:
                node._soma_concurrency = count
        return self

    def __repr__(self) -> str:
        names = ", ".join(type(n).__name__ for n in self.nodes)
        return f"Expr([{names}], {len(self.edges)} edges)"


# The `_node` of an expression made from what another read as (see `_read`): no node of its own,
# its `_flat` holds all of it.
_READ = object()


def _read(
    nodes: tuple[Any, ...],
    edges: tuple[tuple[int, int], ...],
    heads: tuple[int, ...],
    terminals: tuple[int, ...],
) -> Expr:
    """The expression that reads as ``nodes``, ``edges``, ``heads`` and ``terminals``."""
    expr = Expr(_READ, None, None, False)
    expr._flat = _Flat(
        nodes,
        array("q", (a for a, _ in edges)),
        array("q", (b for _, b in edges)),
        heads,
        terminals,
    )
    return expr


class _Flat:
    """An expression read off its tree. Its edges are kept as two arrays of plain numbers, the
    sources and the targets, rather than a pair object each: as many fewer objects for the
    garbage collector to walk while a large graph is built. ``edges`` pairs them on demand."""

    __slots__ = ("_edges", "heads", "nodes", "sources", "targets", "terminals")

    def __init__(
        self,
        nodes: tuple[Any, ...],
        sources: array[int],
        targets: array[int],
        heads: tuple[int, ...],
        terminals: tuple[int, ...],
    ) -> None:
        self.nodes = nodes
        self.sources = sources
        self.targets = targets
        self.heads = heads
        self.terminals = terminals
        self._edges: tuple[tuple[int, int], ...] | None = None

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        if self._edges is None:
            self._edges = tuple(zip(self.sources, self.targets, strict=True))
        return self._edges


# The heads or the terminals of a part of an expression: one node's index (most parts), or the
# indices of several, in order.
_Ends = int | deque[int]


def _flatten(root: Expr) -> _Flat:
    """``root``'s nodes, edges, heads and terminals, by one walk of its tree in the order it is
    written, children before their parent. Each finished part leaves its heads and terminals on
    two stacks, for its parent to take; ``to_visit`` holds the parts still to walk and, under
    their children, a ``bool`` that says how to join them (``True``: in series)."""
    nodes: list[Any] = []
    sources: array[int] = array("q")
    targets: array[int] = array("q")
    heads: list[_Ends] = []
    terminals: list[_Ends] = []
    to_visit: list[_Part | bool] = [root]
    while to_visit:
        item = to_visit.pop()
        if item is True:  # In series: the heads of the left part, the terminals of the right.
            right_heads = heads.pop()
            right_terminals = terminals.pop()
            left_terminals = terminals[-1]
            terminals[-1] = right_terminals
            if type(left_terminals) is int and type(right_heads) is int:
                sources.append(left_terminals)
                targets.append(right_heads)
            else:
                for t in _each(left_terminals):
                    for h in _each(right_heads):
                        sources.append(t)
                        targets.append(h)
        elif item is False:  # Side by side: the ends of both, left first.
            right_heads = heads.pop()
            heads[-1] = _joined(heads[-1], right_heads)
            right_terminals = terminals.pop()
            terminals[-1] = _joined(terminals[-1], right_terminals)
        elif not isinstance(item, Expr):  # A node, standing for itself.
            heads.append(len(nodes))
            terminals.append(len(nodes))
            nodes.append(item)
        elif item._left is not None and item._right is not None:
            to_visit.append(item._series)
            to_visit.append(item._right)
            to_visit.append(item._left)
        elif item._node is _READ and item._flat is not None:  # Read already: all of it.
            by, read = len(nodes), item._flat
            nodes.extend(read.nodes)
            sources.extend(a + by for a in read.sources)
            targets.extend(b + by for b in read.targets)
            heads.append(deque(h + by for h in read.heads))
            terminals.append(deque(t + by for t in read.terminals))
        else:  # An expression of one node.
            heads.append(len(nodes))
            terminals.append(len(nodes))
            nodes.append(item._node)
    return _Flat(tuple(nodes), sources, targets, tuple(_each(heads[0])), tuple(_each(terminals[0])))


def _each(ends: _Ends) -> deque[int] | tuple[int]:
    return (ends,) if isinstance(ends, int) else ends


def _joined(left: _Ends, right: _Ends) -> deque[int]:
    """``left`` then ``right``, made by growing the longer of the two: a wide wave written
    ``a | b | c | ...`` in either direction joins in time linear in its width."""
    lefts = deque((left,)) if isinstance(left, int) else left
    rights = deque((right,)) if isinstance(right, int) else right
    if len(lefts) >= len(rights):
        lefts.extend(rights)
        return lefts
    rights.extendleft(reversed(lefts))
    return rights


def refuse_class(obj: object, *, verb: str, call: str = "", where: str = "") -> None:
    """Refuses a class given where a node is expected, naming the instance to give instead: in
    the call that reads ``call`` up to it, or on its own. Accepted, a class would only fail at its
    first run (its ``forward`` is a plain function, missing ``self``), far from the mistake."""
    if not isinstance(obj, type):
        return
    name = obj.__name__
    hint = (
        f"{verb} an instance: `{call}{name}(){')' if call else ''}`"
        if callable(getattr(obj, "forward", None))
        else "a node is an instance of a class with `forward(self, x)`, such as a soma.Node "
        "subclass"
    )
    raise TypeError(f"`{name}` is a class, where a node instance is expected{where}\nhint: {hint}")
