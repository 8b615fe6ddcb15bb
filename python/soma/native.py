"""Nodes implemented in Rust.

They compose like any node. A Rust node reads native values: a Python object reaching one is
converted there (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, lists and tuples of
those, dicts with ``str`` keys) or refused with a ``TypeError`` naming its type.
"""

from __future__ import annotations

from typing import Any

from soma import _soma
from soma._node import Node


class NativeNode(Node):
    """Base of the Rust-implemented nodes; ``forward`` runs the Rust code once, outside a graph."""

    _soma_native: _soma.NativeNode

    def forward(self, x: Any) -> Any:
        return self._soma_native.forward(x)

    def __repr__(self) -> str:
        return repr(self._soma_native)


class Add(NativeNode):
    """Adds ``k`` to an int or a float."""

    def __init__(self, k: int) -> None:
        self._soma_native = _soma.NativeNode.add(k)


class Identity(NativeNode):
    """Returns its input, as native values."""

    def __init__(self) -> None:
        self._soma_native = _soma.NativeNode.identity()


class Sum(NativeNode):
    """Sums the numbers of a dict (a fan-in), of a list, or a single number."""

    def __init__(self) -> None:
        self._soma_native = _soma.NativeNode.sum()


class Panic(NativeNode):
    """Panics with ``message``: a Rust bug on demand, to see a panic become ``PanicError``."""

    def __init__(self, message: str) -> None:
        self._soma_native = _soma.NativeNode.panic(message)


__all__ = ["Add", "Identity", "NativeNode", "Panic", "Sum"]
