"""Nodes implemented in Rust.

They compose like any node. A Rust node reads native values: a Python object reaching one is
converted there (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, lists and tuples of
those, dicts with ``str`` keys) or refused with a ``TypeError`` naming its type. Values of any
depth convert; a list or dict that contains itself is refused with a ``ValueError``, and one
held in several places converts once and comes back as one object held in those places.

Their integers are 64-bit, and their arithmetic is checked: an int result outside
``-2**63 .. 2**63 - 1`` raises ``OverflowError`` naming the node, never a number wrapped around
to the opposite sign. In a graph that ``OverflowError`` comes out of ``forward`` as itself, with
a note naming the node; integers that large belong in Python nodes.
"""

from __future__ import annotations

from typing import Any

from soma import _soma
from soma._build.node import Node


class NativeNode(Node):
    """Base of the Rust-implemented nodes; ``forward`` runs the Rust code once, outside a graph."""

    _soma_native: _soma.NativeNode

    def forward(self, x: Any) -> Any:
        """Runs the Rust node once on ``x``, outside a graph, and returns its output.

        Raises:
            TypeError: ``x`` holds a value a Rust node cannot read (it says which type).
            soma.PanicError: the Rust code panicked (``Panic`` always does).
        """
        return self._soma_native.forward(x)

    def __repr__(self) -> str:
        return repr(self._soma_native)


_INT64 = range(-(2**63), 2**63)


class Add(NativeNode):
    """Adds ``k`` to an int or a float. ``k`` and an int input are 64-bit, as is their sum:
    one outside that range raises ``OverflowError`` naming the node."""

    def __init__(self, k: int) -> None:
        # Checked here, so the message names the node and says what to do, where PyO3 would
        # say only "Python int too large to convert to C long".
        if isinstance(k, int) and k not in _INT64:
            raise OverflowError(
                f"`Add({k})`: `k` is outside the 64-bit range of a Rust node's ints\n"
                "hint: add integers this large in a Python node"
            )
        self._soma_native = _soma.NativeNode.add(k)


class Identity(NativeNode):
    """Returns its input, as native values."""

    def __init__(self) -> None:
        self._soma_native = _soma.NativeNode.identity()


class Sum(NativeNode):
    """Sums the numbers of a dict (a fan-in), of a list, or a single number, in order, as Python's
    ``sum`` does: ints exactly, floats from the first float on. A total of ints outside 64 bits
    raises ``OverflowError`` naming the node; a running sum that strays outside and comes back
    does not."""

    def __init__(self) -> None:
        self._soma_native = _soma.NativeNode.sum()


class Panic(NativeNode):
    """Panics with ``message``: a Rust bug on demand, to see a panic become ``PanicError``."""

    def __init__(self, message: str) -> None:
        self._soma_native = _soma.NativeNode.panic(message)


__all__ = ["Add", "Identity", "NativeNode", "Panic", "Sum"]
