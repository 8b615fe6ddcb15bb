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

from typing import Any

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
    """Nodes, edges (as index pairs), heads and terminals of an expression."""

    __slots__ = ("edges", "heads", "nodes", "terminals")

    def __init__(
        self,
        nodes: tuple[Any, ...],
        edges: tuple[tuple[int, int], ...],
        heads: tuple[int, ...],
        terminals: tuple[int, ...],
    ) -> None:
        self.nodes = nodes
        self.edges = edges
        self.heads = heads
        self.terminals = terminals

    @staticmethod
    def of(item: object, operator: str) -> Expr:
        """The expression of a node or an expression; a ``TypeError`` that says what to do else."""
        if isinstance(item, Expr):
            return item
        if isinstance(item, Composable):
            return Expr((item,), (), (0,), (0,))
        refuse_class(item, verb="compose", where=f" in `{operator}`")
        raise TypeError(
            f"cannot compose an object of type `{type(item).__name__}` with `{operator}`: "
            "only soma.Node instances and expressions of them compose\n"
            "hint: subclass soma.Node and define `forward(self, x)`, or register the object "
            "with Graph.node() and connect it with Graph.edge()"
        )

    def __rshift__(self, other: object) -> Expr:
        return _series(self, Expr.of(other, ">>"))

    def __rrshift__(self, other: object) -> Expr:
        return _series(Expr.of(other, ">>"), self)

    def __or__(self, other: object) -> Expr:
        return _parallel(self, Expr.of(other, "|"))

    def __ror__(self, other: object) -> Expr:
        return _parallel(Expr.of(other, "|"), self)

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


def _shifted(pairs: tuple[tuple[int, int], ...], by: int) -> tuple[tuple[int, int], ...]:
    return tuple((a + by, b + by) for a, b in pairs)


def _series(left: Expr, right: Expr) -> Expr:
    by = len(left.nodes)
    crossing = tuple((t, h + by) for t in left.terminals for h in right.heads)
    return Expr(
        left.nodes + right.nodes,
        left.edges + _shifted(right.edges, by) + crossing,
        left.heads,
        tuple(t + by for t in right.terminals),
    )


def _parallel(left: Expr, right: Expr) -> Expr:
    by = len(left.nodes)
    return Expr(
        left.nodes + right.nodes,
        left.edges + _shifted(right.edges, by),
        left.heads + tuple(h + by for h in right.heads),
        left.terminals + tuple(t + by for t in right.terminals),
    )


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
