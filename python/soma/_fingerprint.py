"""What a cache key covers, as BLAKE3 digests: a Python value's content, and a node's code and
state.

A digest must be the same in every process and on every machine that holds the same value,
so nothing here reads an ``id()``, a ``hash()`` (salted per process for ``str``) or an order
Python does not fix: a dict's entries and a set's members are fed in the order of their own
digests. Values are fed as a prefix-free encoding (a tag per kind, every length before what it
counts), numpy arrays and torch tensors by the BLAKE3 digest of their bytes, read in place by
the Rust hasher (on several threads for a large one).

A node's fingerprint is its class's source (each class of its MRO that has one, so editing
``forward`` or a helper method changes it; compiled code where the source cannot be read) and
its state (``__dict__``, ``__slots__``), digested like any value. What cannot be read this way
(a lock, an open file, a generator) raises :class:`Unkeyable`, naming where it was found.

A node's fingerprint is remembered, by the node, only while its state is made of values that
cannot change in place (``None``, numbers, strings, bytes, classes, and tuples and frozensets of
those): a later run then checks that each attribute is still the very object it was (``is``),
which is as sound as digesting it again, and costs a fraction of it. A node holding a list, an
array or an object is digested on every run, since what it holds may have changed in place.

The walk uses a stack of its own, so that a value nested deeper than Python's recursion limit
is digested like any other; a container met twice (a cycle, or one object held in two places)
is fed as a reference to its first place, which is the same wherever the same structure is.
"""

from __future__ import annotations

import inspect
import struct
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

from soma import _soma


class Unkeyable(Exception):
    """A value, or a node's state, that a cache key cannot be made of; ``where`` says which
    part, as a path from the value (``.weights[2]``)."""

    def __init__(self, kind: str, where: str) -> None:
        super().__init__(f"a `{kind}` at `{where or '(the value itself)'}` cannot be digested")
        self.kind = kind
        self.where = where


def _length(n: int) -> bytes:
    return struct.pack("<Q", n)


def _text(tag: bytes, text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return tag + _length(len(data)) + data


_SCALARS: dict[type, Callable[[Any], bytes]] = {
    type(None): lambda _: b"N",
    bool: lambda b: b"T" if b else b"F",
    int: lambda i: _text(b"i", str(i)),
    float: lambda x: b"f" + struct.pack("<d", x),
    complex: lambda z: b"z" + struct.pack("<dd", z.real, z.imag),
    str: lambda s: _text(b"s", s),
    bytes: lambda b: b"b" + _length(len(b)) + b,
}

# Classes whose source was read once: a class edited in a notebook is a new class object.
_CLASS_DIGESTS: weakref.WeakKeyDictionary[type, bytes] = weakref.WeakKeyDictionary()


def digest(value: object) -> bytes:
    """The 32-byte digest of ``value``'s content.

    Raises :class:`Unkeyable` for what has no content to read.
    """
    out = bytearray()
    _feed(value, "", out)
    return _soma.blake3(out)


def class_digest(cls: type) -> bytes:
    """The digest of a class's code: its source where it can be read, else the compiled code
    of the functions it defines."""
    known = _CLASS_DIGESTS.get(cls)
    if known is not None:
        return known
    out = bytearray(_text(b"C", f"{cls.__module__}.{cls.__qualname__}"))
    try:
        out += _text(b"S", inspect.getsource(cls))
    except (OSError, TypeError):  # Defined in a REPL or by `exec`: no file to read.
        for name, member in sorted(vars(cls).items()):
            function = getattr(member, "__func__", member)
            code = getattr(function, "__code__", None)
            if isinstance(code, types.CodeType):
                out += _text(b"M", name)
                _feed_code(out, code)
    known = _soma.blake3(bytes(out))
    _CLASS_DIGESTS[cls] = known
    return known


def fingerprint(node: object) -> bytes:
    """The digest of what ``node``'s output depends on besides its input: the source of each
    class of its MRO that has one (``object`` and Soma's bases aside), and its state.

    Raises :class:`Unkeyable` when its state cannot be read, naming the attribute.
    """
    remembered = _REMEMBERED.get(id(node))
    if remembered is not None and remembered.still(node):
        return remembered.fingerprint
    cls = type(node)
    code, slots = _class_parts(cls)
    out = bytearray(code)
    native = getattr(node, "_soma_native", None)
    if native is not None:  # A Rust node: what it was made with is in its description.
        out += _text(b"R", repr(native))
    state = _state(node)
    out += _length(len(state))
    for name, attribute in sorted(state.items()):
        out += _text(b"", name)
        _feed(attribute, f".{name}", out)
    digest = _soma.blake3(out)
    if native is None and all(map(_unchangeable, state.values())):
        _remember(node, cls, slots, digest)
    elif remembered is not None and remembered.node() is node:
        del _REMEMBERED[id(node)]  # Its state can now change in place: checked no more.
    return digest


class _Remembered:
    """A node's fingerprint, and what its state was made of when it was taken: its class, and
    each attribute's object (held, so that no other object can take its place unseen)."""

    __slots__ = ("attributes", "cls", "fingerprint", "node", "slots")

    def __init__(
        self,
        node: weakref.ref[Any],
        cls: type,
        attributes: tuple[tuple[str, object], ...] | None,
        slots: tuple[tuple[str, object], ...],
        fingerprint: bytes,
    ) -> None:
        self.node = node
        self.cls = cls
        self.attributes = attributes
        self.slots = slots
        self.fingerprint = fingerprint

    def still(self, node: object) -> bool:
        """Whether ``node`` is the node this was taken of, with every attribute the same
        object: its fingerprint then is what it was."""
        if self.node() is not node or type(node) is not self.cls:
            return False
        attributes = getattr(node, "__dict__", None)
        if self.attributes is None:
            if attributes is not None:
                return False
        elif attributes is None or len(attributes) != len(self.attributes):
            return False
        else:
            for name, value in self.attributes:
                if attributes.get(name, _ABSENT) is not value:
                    return False
        for name, value in self.slots:  # noqa: SIM110 (a loop reads as the check above)
            if getattr(node, name, _ABSENT) is not value:
                return False
        return True


# Fingerprints of nodes whose state cannot change in place, by the id of the node: each entry
# holds its node weakly and leaves when the node goes (before its id can be anyone else's).
_REMEMBERED: dict[int, _Remembered] = {}
_ABSENT = object()
_UNCHANGEABLE = frozenset({type(None), bool, int, float, complex, str, bytes})


def _unchangeable(value: object) -> bool:
    """Whether ``value`` and all it holds cannot change in place."""
    pending = [value]
    while pending:
        value = pending.pop()
        kind = type(value)
        if kind in _UNCHANGEABLE or isinstance(value, type):
            continue
        if isinstance(value, (tuple, frozenset)) and (kind is tuple or kind is frozenset):
            pending.extend(value)
            continue
        return False
    return True


def _remember(node: object, cls: type, slots: tuple[str, ...], fingerprint: bytes) -> None:
    key = id(node)

    def forget(gone: weakref.ref[Any]) -> None:
        if (entry := _REMEMBERED.get(key)) is not None and entry.node is gone:
            del _REMEMBERED[key]

    try:
        held = weakref.ref(node, forget)
    except TypeError:  # Slots without `__weakref__`: it is digested on every run instead.
        return
    attributes = getattr(node, "__dict__", None)
    _REMEMBERED[key] = _Remembered(
        held,
        cls,
        None if attributes is None else tuple(attributes.items()),
        tuple((name, getattr(node, name, _ABSENT)) for name in slots),
        fingerprint,
    )


# Modules of the bases every node has, whose code is not the node's.
_BASES = frozenset({"abc", "soma._node", "soma._dsl"})

# By class, read once: the digests of the code of its MRO, and the names of its slots.
_CLASS_PARTS: weakref.WeakKeyDictionary[type, tuple[bytes, tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def _class_parts(cls: type) -> tuple[bytes, tuple[str, ...]]:
    known = _CLASS_PARTS.get(cls)
    if known is not None:
        return known
    code = b"".join(
        class_digest(c) for c in cls.__mro__ if c is not object and c.__module__ not in _BASES
    )
    slots: list[str] = []
    for c in cls.__mro__:
        declared = c.__dict__.get("__slots__", ())
        for name in [declared] if isinstance(declared, str) else declared:
            if name not in ("__dict__", "__weakref__"):
                slots.append(name)
    known = (code, tuple(slots))
    _CLASS_PARTS[cls] = known
    return known


def _state(obj: object) -> dict[str, object]:
    """An object's attributes: its ``__dict__`` and its ``__slots__``, Soma's own left out."""
    _, slots = _class_parts(type(obj))
    state: dict[str, object] = {name: getattr(obj, name) for name in slots if hasattr(obj, name)}
    state.update(getattr(obj, "__dict__", {}))
    return {name: value for name, value in state.items() if not name.startswith("_soma_")}


def _feed_code(out: bytearray, code: types.CodeType) -> None:
    """Compiled code, its constants and nested functions included, without its line numbers."""
    pending = [code]
    while pending:
        code = pending.pop()
        out += _length(len(code.co_code)) + code.co_code
        out += _text(b"n", " ".join(code.co_names))
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                pending.append(constant)
            else:
                out += _text(b"k", repr(constant))


def _numpy_array(array: Any, where: str, pending: list[Any], out: bytearray) -> None:
    numpy = sys.modules["numpy"]
    if array.dtype.hasobject:  # Pointers, not content: walked as the nested lists they hold.
        out += b"A" + _text(b"d", array.dtype.str) + _text(b"h", repr(array.shape))
        pending.append((array.tolist(), where))
        return
    out += b"a" + _text(b"d", array.dtype.str) + _text(b"h", repr(array.shape))
    # Its own digest, made on several threads when it is large, stands for its bytes.
    out += _soma.blake3(numpy.ascontiguousarray(array).reshape(-1).view(numpy.uint8))


def _torch_tensor(tensor: Any, where: str, out: bytearray) -> None:
    torch = sys.modules["torch"]
    if tensor.layout is not torch.strided:
        raise Unkeyable(f"{tensor.layout} tensor", where)
    out += (
        b"t"
        + _text(b"d", str(tensor.dtype))
        + _text(b"h", repr(tuple(tensor.shape)))
        + _text(b"v", tensor.device.type)
    )
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    out += _soma.blake3(flat.view(torch.uint8).numpy())


def _feed(root: object, where: str, out: bytearray) -> None:
    """Writes ``root``'s encoding into ``out``, the bytes to be hashed; a buffer (an array's, a
    tensor's) is written as its own BLAKE3 digest, made where it lies, so it is never copied."""
    # Each entry: a value and where it lies, or raw bytes to feed as they are.
    pending: list[Any] = [(root, where)]
    # Containers met so far, by identity, with the order they were met in; held, so that no
    # id is reused while the walk lasts.
    seen: dict[int, tuple[int, object]] = {}
    while pending:
        item = pending.pop()
        if isinstance(item, bytes):
            out += item
            continue
        value: Any = item[0]
        where = item[1]
        kind = type(value)
        scalar = _SCALARS.get(kind)
        if scalar is not None:
            out += scalar(value)
            continue
        if kind is tuple:
            out += b"(" + _length(len(value))
            pending.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(value))))
            continue
        if kind is bytearray or kind is memoryview:
            out += b"B" + _length(len(value)) + bytes(value)
            continue
        mark = seen.get(id(value))
        if mark is not None:
            out += b"@" + _length(mark[0])
            continue
        seen[id(value)] = (len(seen), value)
        if kind is list:
            out += b"[" + _length(len(value))
            pending.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, dict):
            # In the order of the keys' own digests: the same whatever order they were set in.
            out += _text(b"{", _qualified(kind)) + _length(len(value))
            entries = sorted(((digest(k), k, v) for k, v in value.items()), key=_first)
            for key_digest, key, item_value in reversed(entries):
                pending.append((item_value, f"{where}[{key!r}]"))
                pending.append(key_digest)
        elif isinstance(value, (set, frozenset)):
            members = sorted(digest(member) for member in value)
            out += _text(b"<", _qualified(kind)) + _length(len(members))
            out += b"".join(members)
        elif _is(value, "numpy", "ndarray"):
            _numpy_array(value, where, pending, out)
        elif _is(value, "numpy", "generic"):
            out += _text(b"g", value.dtype.str) + value.tobytes()
        elif _is(value, "torch", "Tensor"):
            _torch_tensor(value, where, out)
        elif isinstance(value, type):
            out += b"c" + class_digest(value)
        elif isinstance(value, (types.FunctionType, types.MethodType)):
            function = getattr(value, "__func__", value)
            out += _text(b"F", _qualified(function))
            _feed_code(out, function.__code__)
            if isinstance(value, types.MethodType):
                pending.append((value.__self__, f"{where}.__self__"))
        elif isinstance(value, (types.BuiltinFunctionType, types.ModuleType)):
            out += _text(b"R", _qualified(value))
        elif hasattr(value, "__dict__") or hasattr(type(value), "__slots__"):
            state = _state(value)
            out += _text(b"o", _qualified(kind)) + _length(len(state))
            for name, attribute in sorted(state.items(), reverse=True):
                pending.append((attribute, f"{where}.{name}"))
                pending.append(_text(b"", name))
        else:
            # What pickle would save of it (a `datetime`, a `Decimal`, a `Path`): how to make
            # it again, and from what. What pickle refuses (a lock, a generator) has no key.
            try:
                reduced = value.__reduce_ex__(4)
            except Exception:
                raise Unkeyable(_qualified(kind), where) from None
            if not isinstance(reduced, tuple):
                raise Unkeyable(_qualified(kind), where)
            out += _text(b"r", _qualified(kind))
            # Its list and dict items come as iterators: read them into lists.
            parts = [list(p) if hasattr(p, "__next__") else p for p in reduced[1:]]
            pending.append((tuple(parts), where))


def _first(entry: tuple[bytes, object, object]) -> bytes:
    return entry[0]


def _qualified(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{getattr(obj, '__module__', None) or ''}.{name}"


def _is(value: object, module: str, name: str) -> bool:
    """Whether ``value`` is a ``module.name``, without importing ``module``: a value of a
    module nobody imported cannot be one."""
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(cls, type) and isinstance(value, cls)
