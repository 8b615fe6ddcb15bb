"""The DSL: ``>>`` in series, ``|`` side by side, and nothing but nodes and edges.

An :class:`Expr` records the nodes in declaration order, the edges between them, its heads and
its terminals. ``a >> b`` connects every terminal of ``a`` to every head of ``b``; ``a | b`` is
a disjoint union. ``>>`` binds tighter than ``|``, as Python's operators do. The expression is
an oracle, never the source of a plan: :meth:`soma.Graph.somatize` turns it into plain
``node()``/``edge()`` calls, and the plan is recovered from the graph alone.

:class:`Composable` is where ``>>`` and ``|`` start: ``soma.Node`` subclasses it, so the node
module imports the DSL and the DSL never needs to know what a node is.
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple

from soma import _soma


class Composable:
    """Anything that stands as a one-node expression on either side of ``>>`` and ``|``."""

    __slots__ = ()

    def __rshift__(self, other: object) -> Expr:
        return Expr.of(self, ">>") >> other

    def __rrshift__(self, other: object) -> Expr:
        return Expr.of(other, ">>") >> self

    def __or__(self, other: object) -> Expr:
        return Expr.of(self, "|") | other

    def __ror__(self, other: object) -> Expr:
        return Expr.of(other, "|") | self


class Expr:
    """Nodes, edges (as index pairs), heads and terminals of an expression.

    An expression is kept as the tree its operators wrote — a node, or two expressions in series
    or side by side — so ``e >> k`` and ``e | k`` cost the same however large ``e`` is, and a
    chain built by a loop costs time linear in its length. ``nodes``, ``edges``, ``heads`` and
    ``terminals`` are read off that tree on first use, by a walk with a stack of its own rather
    than by recursion, so an expression nested 100,000 deep reads as well as a flat one.
    """

    __slots__ = ("_flat", "_left", "_node", "_right", "_series")

    def __init__(self, node: object, left: Expr | None, right: Expr | None, series: bool) -> None:
        # One of: a node (`left` and `right` None), or `left` and `right` in series or side by
        # side. Built by `of`, `>>` and `|`, never by hand.
        self._node = node
        self._left = left
        self._right = right
        self._series = series
        self._flat: _Flat | None = None

    @staticmethod
    def of(item: object, operator: str) -> Expr:
        """The expression of a node or an expression; a ``TypeError`` that says what to do else."""
        if isinstance(item, Expr):
            return item
        if isinstance(item, Composable):
            return Expr(item, None, None, False)
        refuse_class(item, verb="compose", where=f" in `{operator}`")
        raise TypeError(
            f"cannot compose an object of type `{type(item).__name__}` with `{operator}`: "
            "only soma.Node instances and expressions of them compose\n"
            "hint: subclass soma.Node and define `forward(self, x)`, or register the object "
            "with Graph.node() and connect it with Graph.edge()"
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
        return (_read, tuple(self._flattened()))

    def __rshift__(self, other: object) -> Expr:
        return Expr(None, self, Expr.of(other, ">>"), True)

    def __rrshift__(self, other: object) -> Expr:
        return Expr(None, Expr.of(other, ">>"), self, True)

    def __or__(self, other: object) -> Expr:
        return Expr(None, self, Expr.of(other, "|"), False)

    def __ror__(self, other: object) -> Expr:
        return Expr(None, Expr.of(other, "|"), self, False)

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
    expr._flat = _Flat(nodes, edges, heads, terminals)
    return expr


class _Flat(NamedTuple):
    """An expression read off its tree."""

    nodes: tuple[Any, ...]
    edges: tuple[tuple[int, int], ...]
    heads: tuple[int, ...]
    terminals: tuple[int, ...]


# The heads or the terminals of a part of an expression: one node's index (most parts), or the
# indices of several, in order.
_Ends = int | deque[int]


def _flatten(root: Expr) -> _Flat:
    """``root``'s nodes, edges, heads and terminals, by one walk of its tree in the order it is
    written, children before their parent. Each finished part leaves its heads and terminals on
    two stacks, for its parent to take; ``to_visit`` holds the parts still to walk and, under
    their children, a ``bool`` that says how to join them (``True``: in series)."""
    nodes: list[Any] = []
    edges: list[tuple[int, int]] = []
    heads: list[_Ends] = []
    terminals: list[_Ends] = []
    to_visit: list[Expr | bool] = [root]
    while to_visit:
        item = to_visit.pop()
        if item is True:  # In series: the heads of the left part, the terminals of the right.
            right_heads = heads.pop()
            right_terminals = terminals.pop()
            left_terminals = terminals[-1]
            terminals[-1] = right_terminals
            if type(left_terminals) is int and type(right_heads) is int:
                edges.append((left_terminals, right_heads))
            else:
                edges.extend((t, h) for t in _each(left_terminals) for h in _each(right_heads))
        elif item is False:  # Side by side: the ends of both, left first.
            right_heads = heads.pop()
            heads[-1] = _joined(heads[-1], right_heads)
            right_terminals = terminals.pop()
            terminals[-1] = _joined(terminals[-1], right_terminals)
        elif isinstance(item, Expr):
            left, right = item._left, item._right
            if item._node is _READ and item._flat is not None:  # Read already: all of it.
                by = len(nodes)
                read = item._flat
                nodes.extend(read.nodes)
                edges.extend((a + by, b + by) for a, b in read.edges)
                heads.append(deque(h + by for h in read.heads))
                terminals.append(deque(t + by for t in read.terminals))
            elif left is None or right is None:  # A node.
                at = len(nodes)
                nodes.append(item._node)
                heads.append(at)
                terminals.append(at)
            else:
                to_visit.append(item._series)
                to_visit.append(right)
                to_visit.append(left)
    return _Flat(tuple(nodes), tuple(edges), tuple(_each(heads[0])), tuple(_each(terminals[0])))


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
