"""What a cache key covers, as BLAKE3 digests: a Python value's whole content and type, and the
code and state of a node.

**A value** is fed as a prefix-free encoding (a tag per kind, every length before what it
counts), so two values that differ in content or type never feed the same bytes: builtins by
their content (a dict in its order, a set in the order of its members' digests, an int of any
size), numpy arrays by dtype, shape and bytes (read in place by the Rust hasher, on several
threads for a large one; an array of objects that are strings — a pandas text column — by
their UTF-8, read in Rust too; an Arrow array of text or bytes — pandas' ``string[pyarrow]``,
and ``str`` where pyarrow is installed — likewise from its buffers, whatever its chunks), a
subclass of ``ndarray`` with the state it adds (a masked array's mask), torch tensors likewise,
and every other object — a subclass of a builtin, a namedtuple, an ``OrderedDict``, a
dataclass, a pandas frame — by what pickle would keep of it (``__reduce_ex__``), beside its
class. A resource — what a node works with rather than
computes from: a lock, a socket, a client, a logger, an executor, an open file (:data:`RESOURCES`,
:data:`CLIENTS`, and the classes given to :func:`resource`) — by its type alone; a value given to
:func:`ignore` by a mark. What pickle refuses that is no resource (a generator), and an object
reduced more than :data:`DEEPEST_REDUCTION` levels deep, raises :class:`Unkeyable`, naming
where it was found: no key is better than a guess.

**Code** is keyed where it can be read, by ``soma._soma.reach``: a function by its compiled code
(constants included, line numbers not, so moving a function does not rerun it), its defaults,
its closure's cells, and what its instructions look up by name — the functions and classes of
the user's own modules (transitively: a helper's helpers), the module-level values it reads, a
module's attributes it reads (``helpers.scale``), the modules it imports in its body — but not
the globals it only writes to (a log it appends to, a counter), nor the code of installed
libraries, which is keyed by name. A class by its name, bases, methods, attributes and
annotations, wherever it was defined (a file, a notebook, ``exec``), never by its module's name,
which says where the code was run from; a value of a class of the user's by that class's digest
too, so that what reads it runs again when a method it may call is edited. A node's
fingerprint is its class's digest, its state's (``__dict__``, ``__slots__``, less what Soma's
own steps name in ``_soma_not_state``: a switch's cases) and its ``cache_key()``'s answer.

**Remembered, with a witness.** Reading a node's whole reach again on every run would cost tens
of microseconds a node. A class's digest, a function's, and a node's whose attributes cannot
change in place are remembered together with a :class:`soma._soma.Witness`: the bindings that
digest was read from (a global, a class attribute, a function's code and cells, a node's
attribute), checked by identity on the next run in a fraction of a microsecond. A binding
rebound (an edit reloaded, ``node.k = 3``, a function patched by an autoreloader) makes the
digest afresh. What can change in place without a rebinding (a list or an array a function
reads, a node's weights) is digested again on every run.

Nothing here reads an ``id()`` into a digest, a ``hash()`` (salted per process for ``str``) or
an order Python does not fix, so a digest is the same in every process that holds the same
value and runs the same code. The walks use stacks of their own, so a value nested deeper than
Python's recursion limit is digested like any other, in time linear in its size (where a value
lies is made into text only for a warning); a container met twice (a cycle, or one object held
in two places) is fed as a reference to its first place.
"""

from __future__ import annotations

import contextlib
import copyreg
import ctypes
import functools
import importlib
import importlib.util
import os
import site
import struct
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from soma import _soma

T = TypeVar("T")
V = TypeVar("V")


class Unkeyable(Exception):
    """A value, or a node's state or code, that a cache key cannot be made of; ``kind`` names
    its type and ``where`` says where it was found, as a path from the value (``.weights[2]``)
    or through the code that reads it (``Scale.forward > helpers.LOCK``)."""

    def __init__(self, kind: str, where: Where) -> None:
        text = _path(where)
        super().__init__(f"a `{kind}` at `{text or '(the value itself)'}` cannot be digested")
        self.kind = kind
        self.where = text


# Where a value lies, from the root a walk started at: text, or a link to where its container
# lies — `(parent, index)` for a sequence's item, `(parent, ".name")` for an attribute,
# `(parent, None, key)` for a dict's entry. Made into text only for a warning, so that a walk
# down a value nested a million deep costs no path a million long at each level.
Where = str | tuple[Any, ...]


def _path(where: Where) -> str:
    """The text of ``where``: ``Scale.forward > helpers.SETTINGS['k'][2]``."""
    parts: list[str] = []
    while not isinstance(where, str):
        if len(where) == 3:
            parts.append(f"[{where[2]!r}]")
        elif isinstance(where[1], int):
            parts.append(f"[{where[1]}]")
        else:
            parts.append(where[1])
        where = where[0]
    parts.append(where)
    parts.reverse()
    if len(parts) > 24:  # A path a thousand levels deep says no more than its ends.
        parts[12:-12] = [f"…({len(parts) - 24:,} more)…"]
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# The encoding's pieces


def _length(n: int) -> bytes:
    return struct.pack("<Q", n)


def _text(tag: bytes, text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return tag + _length(len(data)) + data


def _int(i: int) -> bytes:
    # Its two's-complement bytes: exact at any size, where `str(i)` refuses past 4,300 digits.
    data = i.to_bytes((i.bit_length() + 8) // 8, "little", signed=True)
    return b"i" + _length(len(data)) + data


_SCALARS: dict[type, Callable[[Any], bytes]] = {
    type(None): lambda _: b"N",
    bool: lambda b: b"1" if b else b"0",
    int: _int,
    float: lambda x: b"f" + struct.pack("<d", x),
    complex: lambda z: b"z" + struct.pack("<dd", z.real, z.imag),
    str: lambda s: _text(b"s", s),
    bytes: lambda b: b"b" + _length(len(b)) + b,
    type(Ellipsis): lambda _: b"e",
}

# What cannot change in place, and holds nothing that can: fed as it is, wherever it is met.
_UNCHANGEABLE = frozenset({*_SCALARS, types.CodeType})


def _unchangeable(value: object) -> bool:
    """Whether ``value`` and all it holds cannot change in place (``None``, numbers, strings,
    bytes, code, and tuples and frozensets of those)."""
    pending = [value]
    while pending:
        value = pending.pop()
        kind = type(value)
        if kind in _UNCHANGEABLE:
            continue
        if isinstance(value, (tuple, frozenset)) and (kind is tuple or kind is frozenset):
            pending.extend(value)
            continue
        return False
    return True


def _qualified(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if not isinstance(name, str):
        name = type(obj).__qualname__
    module = getattr(obj, "__module__", None)
    return f"{module if isinstance(module, str) else ''}.{name}"


def _is(value: object, module: str, name: str) -> bool:
    """Whether ``value`` is a ``module.name``, without importing ``module``: a value of a
    module nobody imported cannot be one."""
    loaded = sys.modules.get(module)
    cls = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(cls, type) and isinstance(value, cls)


# ---------------------------------------------------------------------------------------------
# Resources, and what the user keeps out


# Objects that are resources rather than data — what a node uses to do its work, not what its
# output is computed from — by a class in their type's MRO, as `(module, name)`: keyed by their
# type, never digested. Told by name, so that no library is imported to ask.
RESOURCES: frozenset[tuple[str, str]] = frozenset(
    {
        # Threads and what they synchronise with.
        ("_thread", "lock"),
        ("_thread", "RLock"),
        ("_thread", "_local"),
        ("threading", "_RLock"),
        ("threading", "Condition"),
        ("threading", "Semaphore"),
        ("threading", "Event"),
        ("threading", "Barrier"),
        ("threading", "Thread"),
        ("multiprocessing.synchronize", "SemLock"),
        ("multiprocessing.synchronize", "Condition"),
        ("multiprocessing.synchronize", "Event"),
        ("queue", "Queue"),
        ("_queue", "SimpleQueue"),
        ("concurrent.futures._base", "Executor"),
        ("subprocess", "Popen"),
        # asyncio's loops and what they synchronise with.
        ("asyncio.events", "AbstractEventLoop"),
        ("asyncio.locks", "Lock"),
        ("asyncio.locks", "Event"),
        ("asyncio.locks", "Condition"),
        ("asyncio.locks", "Semaphore"),
        ("asyncio.locks", "Barrier"),
        ("asyncio.queues", "Queue"),
        # Sockets, open files, connections.
        ("_socket", "socket"),
        ("socket", "socket"),
        ("ssl", "SSLContext"),
        ("selectors", "BaseSelector"),
        ("_io", "_IOBase"),
        ("io", "IOBase"),
        ("sqlite3", "Connection"),
        ("sqlite3", "Cursor"),
        # Loggers.
        ("logging", "Logger"),
        ("logging", "LoggerAdapter"),
        ("logging", "Handler"),
    }
)

# Clients and sessions of libraries, by the package their module is in (`httpx._client` is in
# `httpx`) and their class's name.
CLIENTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("httpx", "Client"),
        ("httpx", "AsyncClient"),
        ("requests", "Session"),
        ("aiohttp", "ClientSession"),
        ("aiohttp", "BaseConnector"),
        ("urllib3", "PoolManager"),
        ("urllib3", "HTTPConnectionPool"),
        ("openai", "BaseClient"),
        ("anthropic", "BaseClient"),
        ("botocore", "BaseClient"),
        ("redis", "Redis"),
        ("sqlalchemy", "Engine"),
        ("sqlalchemy", "Connection"),
        ("sqlalchemy", "Session"),
    }
)

# In-memory files hold their content, which a node may read: data, not resources.
_NOT_RESOURCES = frozenset({("_io", "BytesIO"), ("_io", "StringIO")})

# The classes the user said are resources (`soma.cache.resource`).
_USERS_RESOURCES: weakref.WeakSet[type] = weakref.WeakSet()

# By type: whether its values are resources, told once.
_RESOURCE_TYPES: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _is_resource(kind: type) -> bool:
    """Whether values of ``kind`` are resources (see :data:`RESOURCES` and :data:`CLIENTS`)."""
    known = _RESOURCE_TYPES.get(kind)
    if known is None:
        known = False
        for cls in kind.__mro__:
            module, name = getattr(cls, "__module__", None), cls.__name__
            if not isinstance(module, str):
                continue
            if cls in _USERS_RESOURCES or (module, name) in RESOURCES:
                known = True
                break
            if (module, name) in _NOT_RESOURCES:
                break
            package = module.partition(".")[0]
            if (package, name) in CLIENTS:
                known = True
                break
        with contextlib.suppress(TypeError):  # A type that cannot be referenced weakly.
            _RESOURCE_TYPES[kind] = known
    return known


def resource(cls: type[T]) -> type[T]:
    """Says that values of ``cls`` and its subclasses are resources rather than data (a client,
    a connection pool): a key holds their type, never their content. Returns ``cls``, so it may
    decorate a class."""
    if not isinstance(cls, type):
        raise TypeError(
            f"soma.cache.resource takes a class, not an object of type `{type(cls).__name__}`\n"
            "hint: `soma.cache.resource(type(client))`"
        )
    _USERS_RESOURCES.add(cls)
    _RESOURCE_TYPES.clear()
    return cls


# The values the user said are not part of any key (`soma.cache.ignore`), by id: each held, so
# that its id is no one else's while it is in here.
_IGNORED: dict[int, object] = {}


def ignore(value: V) -> V:
    """Says that ``value`` — a list a node logs into, a dict it memoizes in — is not part of
    any key, wherever a node reads it: a key holds a mark in its place. Returns ``value``."""
    if _unchangeable(value):
        raise TypeError(
            f"soma.cache.ignore takes a value that can change in place (a list, a dict, an "
            f"object), not a `{type(value).__name__}`: one of those is the same object wherever "
            "it is written, so it cannot be told apart\nhint: `LOG = soma.cache.ignore([])`"
        )
    _IGNORED[id(value)] = value
    return value


# ---------------------------------------------------------------------------------------------
# The user's code, and the libraries'


def _library_roots() -> tuple[str, ...]:
    """The folders installed code lives in: the standard library, site-packages, and Soma's
    own package (whose code is Soma's, not the node's) — each as written and with its links
    resolved, so that a file name is told apart without asking the file system."""
    # Soma's package, every subpackage in it: the folder the compiled module lies in.
    roots = {os.path.dirname(os.path.abspath(_soma.__file__))}
    paths = sysconfig.get_paths()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(name):
            roots.add(paths[name])
    try:
        roots.update(site.getsitepackages())
        roots.add(site.getusersitepackages())
    except AttributeError:  # An embedded interpreter without them.
        pass
    found = {
        os.path.join(path(root), "")
        for root in roots
        for path in (os.path.abspath, os.path.realpath)
    }
    return tuple(sorted(found))


_LIBRARY_ROOTS = _library_roots()

# By file name: whether the code in it is the user's own.
_USERS_FILES: dict[str, bool] = {}


def _users_file(filename: str) -> bool:
    """Whether code compiled from ``filename`` is the user's own: a file outside the standard
    library and site-packages, or code with no file (``exec``, a notebook cell, the REPL)."""
    known = _USERS_FILES.get(filename)
    if known is None:
        if filename.startswith("<frozen "):
            known = False
        elif filename.startswith("<") or not os.path.isabs(filename):
            known = True  # `<string>`, `<stdin>`, `<ipython-input-...>`
        else:
            known = not filename.startswith(_LIBRARY_ROOTS)
        _USERS_FILES[filename] = known
    return known


def _users_module(module: types.ModuleType) -> bool:
    filename = getattr(module, "__file__", None)
    if isinstance(filename, str):
        return _users_file(filename)
    folders = getattr(module, "__path__", None)  # A namespace package: by where it lies.
    if folders is not None:
        return all(_users_file(os.path.join(folder, "")) for folder in folders)
    # A module with no file: built into the interpreter, or made by the user (a notebook's
    # `__main__`, `types.ModuleType("cell")`).
    return module.__name__ not in sys.builtin_module_names and module.__name__ != "builtins"


# By the id of a class: the class, weakly, and whether it is the user's (a class never moves
# from one module to another). A dict by id, not a `WeakKeyDictionary`: that one makes a weak
# reference on every lookup, which a first key does a dozen times.
_USERS_CLASSES: dict[int, tuple[weakref.ref[type], bool]] = {}

_HEAP_TYPE = 1 << 9  # `Py_TPFLAGS_HEAPTYPE`: a class made by running Python code.


def _users_class(cls: type) -> bool:
    """Whether a class is the user's own: defined in a module of the user's, or by ``exec``, a
    notebook cell or the REPL — told by its methods' code, which says where it was compiled,
    where its ``__module__`` may name a module it was not written in (``exec`` into a dict of
    its own names it ``builtins``)."""
    entry = _USERS_CLASSES.get(id(cls))
    if entry is not None and entry[0]() is cls:
        return entry[1]
    files = set()
    for member in vars(cls).values():
        function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        function = member.fget if isinstance(member, property) else function
        if isinstance(function, types.FunctionType):
            files.add(function.__code__.co_filename)
    name = cls.__module__
    module = sys.modules.get(name) if isinstance(name, str) else None
    filename = getattr(module, "__file__", None)
    if any(_users_file(f) and not f.startswith("<") for f in files):
        known = True  # A method written in a file of the user's, whatever its module says.
    elif isinstance(filename, str) and _users_file(filename):
        known = True
    elif isinstance(filename, str):
        # A library's module: the library's, unless every method was compiled by `exec` (a
        # class made in a namespace that borrowed the module's name, as `__main__`).
        known = bool(files) and all(_users_file(f) for f in files)
    elif files:  # No file to tell by: its methods say.
        known = any(_users_file(f) for f in files)
    else:  # No method either: made by running Python code (`exec`), or written in C.
        known = bool(cls.__flags__ & _HEAP_TYPE)
    key = id(cls)

    def forget(gone: weakref.ref[type]) -> None:
        if (found := _USERS_CLASSES.get(key)) is not None and found[0] is gone:
            del _USERS_CLASSES[key]

    with contextlib.suppress(TypeError):  # A class that cannot be referenced weakly.
        _USERS_CLASSES[key] = (weakref.ref(cls, forget), known)
    return known


def _users_function(function: types.FunctionType) -> bool:
    return _users_file(function.__code__.co_filename)


# ---------------------------------------------------------------------------------------------
# Compiled code


def _code_digest(code: types.CodeType) -> bytes:
    """The digest of compiled code: its instructions, names, constants (nested code included),
    argument counts, flags and exception table, without its file name and line numbers (read,
    and remembered by the code object, by ``soma._soma.code_digest``)."""
    try:
        return _soma.code_digest(code)
    except TypeError:  # A constant no compiler makes (code built by hand).
        raise Unkeyable("code", code.co_qualname) from None


# ---------------------------------------------------------------------------------------------
# Values


class _SetEnd:
    """Where the members of a set or frozenset end: their digests, sorted, are fed then."""

    __slots__ = ("count", "set_id")

    def __init__(self, count: int, set_id: int) -> None:
        self.count = count
        self.set_id = set_id


# A tuple's head for the lengths most tuples have, made once.
_TUPLE_HEADS = tuple(b"(" + _length(n) for n in range(16))

_MEMBER_START = object()
_MEMBER_END = object()
_REDUCED_END = object()

# How many objects reduced by `__reduce_ex__` may hold one another, nested: ten times what
# `pickle` itself reads (it stops at Python's recursion limit), so that no value pickle keeps is
# refused, and an endless reduction (one that makes a new object of its class at each level)
# stops in a few milliseconds.
DEEPEST_REDUCTION = 10_000

_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)


def digest(value: object) -> bytes:
    """The 32-byte digest of ``value``'s content and type.

    Raises :class:`Unkeyable` for what has no content to read.
    """
    return _digest_at(value, "", frozenset())


def digest_items(value: object) -> tuple[bytes, list[bytes] | None]:
    """:func:`digest` of ``value``, and, when it is a list or a tuple, the digest of each of its
    items as :func:`digest` makes it: what the runs of an ``each`` over it are keyed on (the
    engine asks, for a value an ``each`` reads, and hands each item's run its digest).

    A buffer both walks meet — a numpy array's bytes, a text column's strings — is hashed once,
    by the first: the second finds it by the array's identity, in a table that lives for this
    call alone and holds each array it names (so that no identity is reused meanwhile), and
    nothing of the user's runs between the two walks but what pickling the values runs.

    Raises :class:`Unkeyable` for what has no content to read.
    """
    if type(value) is not list and type(value) is not tuple:
        return digest(value), None
    hashed: _Hashed = {}
    whole = _digest_at(value, "", frozenset(), hashed)
    return whole, [_digest_at(item, "", frozenset(), hashed) for item in value]


# What :func:`digest_items` remembers during one call: by an array's identity, the array (held,
# so that its identity is not reused) and what its content fed.
_Hashed = dict[int, tuple[object, bytes]]


def _digest_at(
    value: object, where: Where, busy: frozenset[int], hashed: _Hashed | None = None
) -> bytes:
    scalar = _SCALARS.get(type(value))
    if scalar is not None:  # A number, a string, `None` alone: what the walk feeds for it.
        return _soma.blake3(scalar(value))
    out = bytearray()
    numpy = sys.modules.get("numpy")
    array: Any = value
    if (
        numpy is not None
        and type(array) is numpy.ndarray
        and not array.dtype.hasobject
        and not (_IGNORED and id(value) in _IGNORED)
    ):
        # A plain array alone, the commonest item of an `each`: what the walk feeds for it,
        # without the walk's setting up, which cost a small array's digest a third of its time.
        _numpy_array(value, where, [], out, hashed)
    else:
        _feed(value, where, out, busy, hashed)
    return _soma.blake3(out)


def _feed(
    root: object,
    where: Where,
    out: bytearray,
    busy: frozenset[int],
    hashed: _Hashed | None = None,
) -> None:
    """Writes ``root``'s encoding into ``out``, the bytes to be hashed; a buffer (an array's, a
    tensor's) is written as its own BLAKE3 digest, made where it lies, so it is never copied.
    ``busy``: the classes and functions whose digests are being made further up, met again as
    a reference; ``hashed``: the arrays hashed already in this call (:func:`digest_items`)."""
    # Each entry: a value and where it lies (a tuple), raw bytes to feed as they are, or a mark.
    pending: list[Any] = [(root, where)]
    # Containers met so far, by identity, with the order they were met in (held, so that no
    # id is reused while the walk lasts); each member of a set is walked with a map of its own.
    seen: dict[int, tuple[int, object]] = {}
    scopes: list[tuple[bytearray, dict[int, tuple[int, object]]]] = []
    members: list[bytes] = []
    open_sets: set[int] = set()
    # How many objects reduced by `__reduce_ex__` hold the one being walked: a reduction that
    # makes a new object to reduce at each level would go on for ever.
    reductions = 0
    while pending:
        item = pending.pop()
        if type(item) is not tuple:
            if isinstance(item, bytes):
                out += item
            elif item is _REDUCED_END:
                reductions -= 1
            elif item is _MEMBER_START:
                scopes.append((out, seen))
                out, seen = bytearray(), {}
            elif item is _MEMBER_END:
                members.append(_soma.blake3(out))
                out, seen = scopes.pop()
            else:
                done = sorted(members[len(members) - item.count :])
                del members[len(members) - item.count :]
                out += b"".join(done)
                open_sets.discard(item.set_id)
            continue
        value: Any = item[0]
        where = item[1]
        kind = type(value)
        scalar = _SCALARS.get(kind)
        if scalar is not None:
            out += scalar(value)
            continue
        if kind is tuple:
            size = len(value)
            out += _TUPLE_HEADS[size] if size < len(_TUPLE_HEADS) else b"(" + _length(size)
            if size == 2:  # A pair, a cons cell: as many of them as values in a nested list.
                pending.append((value[1], (where, 1)))
                pending.append((value[0], (where, 0)))
            else:
                pending.extend((v, (where, i)) for i, v in reversed(list(enumerate(value))))
            continue
        if kind is types.CodeType:
            out += b"k" + _code_digest(value)
            continue
        mark = seen.get(id(value))
        if mark is not None:
            out += b"@" + _length(mark[0])
            continue
        seen[id(value)] = (len(seen), value)
        if _IGNORED and id(value) in _IGNORED:  # Kept out of keys by the user.
            out += b"x"
        elif kind is list:
            out += b"[" + _length(len(value))
            pending.extend((v, (where, i)) for i, v in reversed(list(enumerate(value))))
        elif kind is dict:
            # In its order, which a node can read (`next(iter(d))`): a dict in another order
            # is another value.
            out += b"{" + _length(len(value))
            entries = list(value.items())
            for key, entry in reversed(entries):
                pending.append((entry, (where, None, key)))
                pending.append((key, (where, ".keys()")))
        elif kind is set or kind is frozenset or isinstance(value, (set, frozenset)):
            if id(value) in open_sets:
                raise Unkeyable(f"{_qualified(kind)} that holds itself", where)
            open_sets.add(id(value))
            # In the order of its members' digests: a set's own order is its hashes', which
            # differ between processes.
            out += b"<" if kind is set else b">" if kind is frozenset else b"U"
            if kind is not set and kind is not frozenset:
                pending.append(_subclass_state(value, where))
                pending.append((kind, (where, ".__class__")))
            out += _length(len(value))
            pending.append(_SetEnd(len(value), id(value)))
            for member in value:
                pending.append(_MEMBER_END)
                pending.append((member, (where, "{…}")))
                pending.append(_MEMBER_START)
        elif kind is bytearray:
            out += b"B" + _length(len(value)) + bytes(value)
        elif kind is memoryview:
            data = value.tobytes()
            out += _text(b"v", value.format) + _text(b"", repr(value.shape))
            out += _length(len(data)) + data
        elif _is(value, "numpy", "ndarray"):
            _numpy_array(value, where, pending, out, hashed)
        elif _is(value, "numpy", "generic"):
            out += _text(b"g", value.dtype.str) + _text(b"", repr(value.dtype))
            data = value.tobytes()
            out += _length(len(data)) + data
        elif _is(value, "torch", "Tensor"):
            _torch_tensor(value, where, pending, out)
        elif isinstance(value, type):
            if _users_class(value):
                out += b"C" + _unit_digest(value, busy)
            else:
                out += _text(b"c", _qualified(value))
        elif kind is types.FunctionType:
            if _users_function(value):
                out += b"F" + _unit_digest(value, busy)
            else:
                out += _text(b"l", _qualified(value))
        elif kind is types.MethodType:
            out += b"m"
            pending.append((value.__self__, (where, ".__self__")))
            pending.append((value.__func__, (where, ".__func__")))
        elif isinstance(value, _BUILTIN_CALLABLES):
            bound = getattr(value, "__self__", None)
            out += _text(b"h", _qualified(value))
            if bound is None or isinstance(bound, types.ModuleType):
                out += b"-"
            else:
                out += b"+"
                pending.append((bound, (where, ".__self__")))
        elif kind is types.ModuleType:
            out += _text(b"M", value.__name__)
        elif kind is staticmethod or kind is classmethod:
            out += b"y" if kind is staticmethod else b"Y"
            pending.append((value.__func__, (where, ".__func__")))
        elif kind is functools.cached_property:  # By its function: its lock is no content.
            out += b"Q"
            pending.append((value.func, (where, ".func")))
        elif kind is property:
            out += b"p"
            for part in ("fdel", "fset", "fget"):
                pending.append((getattr(value, part), (where, f".{part}")))
        elif kind is types.MappingProxyType:
            out += b"P"
            pending.append((dict(value), where))
        elif _is_resource(kind):
            # What a node works with, not what it computes from: its type.
            if _users_class(kind):
                out += b"Z" + _unit_digest(kind, busy)
            else:
                out += _text(b"w", _qualified(kind))
        elif kind.__module__ == "pyarrow.lib" and _arrow_text(value, out):
            pass
        else:
            if reductions >= DEEPEST_REDUCTION:
                raise Unkeyable(f"{_qualified(kind)} reduced {reductions} levels deep", where)
            reductions += 1
            pending.append(_REDUCED_END)
            _reduced(value, where, pending, out)


def _subclass_state(value: object, where: Where) -> tuple[object, Where]:
    """What an instance of a subclass holds beside its base's content: its ``__dict__`` and
    ``__slots__``, as a dict."""
    state = dict(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:
        declared = cls.__dict__.get("__slots__", ())
        for name in [declared] if isinstance(declared, str) else declared:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                state[name] = getattr(value, name)
    return (state, (where, ".__dict__"))


def _reduced(value: Any, where: Where, pending: list[Any], out: bytearray) -> None:
    """An object by what pickle would save of it — how to make it again, and from what — beside
    its class: a namedtuple by its fields, a subclass of a builtin by its content and its
    instance state, a `datetime`, a `Decimal`, a pandas frame by its blocks and axes. What
    pickle refuses (a lock, a generator) has no key."""
    kind = type(value)
    try:
        # As pickle asks: a reducer registered for its type first (`copyreg.pickle`).
        reducer = copyreg.dispatch_table.get(kind)
        reduced: Any
        if reducer is None and _pandas_arrow(kind):
            reduced = _pandas_arrow_reduction(value)
        else:
            reduced = value.__reduce_ex__(4) if reducer is None else reducer(value)
    except Exception:
        raise Unkeyable(_qualified(kind), where) from None
    if isinstance(reduced, str):
        # Pickled by reference to a module-level name (a function of C code, a singleton).
        out += _text(b"r", _qualified(kind)) + _text(b"", reduced)
        wrapped = getattr(value, "__wrapped__", None)  # `functools.lru_cache(helper)`
        out += b"-" if wrapped is None else b"+"
        if wrapped is not None:
            pending.append((wrapped, (where, ".__wrapped__")))
        return
    if not isinstance(reduced, tuple) or not 2 <= len(reduced) <= 6:
        raise Unkeyable(_qualified(kind), where)
    # Its list and dict items come as iterators: read them into lists.
    parts = [list(p) if hasattr(p, "__next__") else p for p in reduced]
    out += b"R" + _length(len(parts))
    pending.append((tuple(parts), where))
    pending.append((kind, (where, ".__class__")))


# The Arrow types of a text column, by name, and whether their offsets are 64-bit.
_ARROW_TEXT_TYPES = {"string": False, "binary": False, "large_string": True, "large_binary": True}


def _arrow_text(value: Any, out: bytearray) -> bool:
    """Feeds a ``pyarrow`` array or chunked array of text or bytes (``string``, ``binary`` and
    their ``large_`` kin) by its class, its type and its elements read from its buffers in
    Rust (``soma._soma.arrow_text``), so that the same strings give the same digest however
    they are chunked or sliced; ``False`` for any other, which is reduced as pickle would."""
    known = _ARROW_DIGESTS.get(id(value))
    if known is not None and known[0]() is value:
        out += known[1]
        return True
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None:
        return False
    if isinstance(value, pyarrow.ChunkedArray):
        chunks = value.chunks
    elif isinstance(value, pyarrow.Array):
        chunks = [value]
    else:
        return False
    wide = _ARROW_TEXT_TYPES.get(str(value.type))
    if wide is None or type(value.type) is not pyarrow.DataType:  # An extension type, say.
        return False
    given = []
    for chunk in chunks:
        validity, offsets, data = chunk.buffers()
        given.append((validity, offsets, data, chunk.offset, len(chunk)))
    column = _soma.arrow_text(given, wide)
    if column is None:  # Offsets outside its buffers: reduced, as pickle would save it.
        return False
    fed = _text(b"W", _qualified(type(value))) + _text(b"", str(value.type)) + column
    out += fed
    key = id(value)
    _ARROW_DIGESTS[key] = (weakref.ref(value, lambda _: _ARROW_DIGESTS.pop(key, None)), fed)
    return True


# What an Arrow array read by `_arrow_text` fed, by the array's identity, while it lives: an
# Arrow array never changes once made (Arrow's rule: pandas and pyarrow make a new one for any
# change), so a column that several outputs share — a frame's column carried through `assign`,
# a list's items digested again one by one — is read once.
_ARROW_DIGESTS: dict[int, tuple[weakref.ref[Any], bytes]] = {}


def _pandas_arrow(kind: type) -> bool:
    """Whether ``kind`` is a pandas array backed by Arrow (``string[pyarrow]``, ``str`` where
    pyarrow is installed, any ``ArrowDtype``) that pickles as pandas' own class does."""
    module = sys.modules.get("pandas.core.arrays.arrow.array")
    base = getattr(module, "ArrowExtensionArray", None)
    return (
        isinstance(base, type)
        and issubclass(kind, base)
        and getattr(kind, "__getstate__", None) is base.__getstate__
        and getattr(kind, "__reduce_ex__", None) is object.__reduce_ex__
        and getattr(kind, "__reduce__", None) is object.__reduce__
    )


def _pandas_arrow_reduction(value: Any) -> tuple[Any, ...]:
    """What ``value.__reduce_ex__(4)`` answers for a pandas array backed by Arrow, but with its
    chunked array as it is, where pandas' ``__getstate__`` copies its chunks into one: the
    chunked array's digest does not depend on its chunks."""
    state = dict(value.__dict__)
    state["_pa_array"] = value._pa_array
    state["_cache"] = {}  # What pandas' own leaves out: values computed from the rest.
    return (copyreg.__newobj__, (type(value),), state, None, None)  # type: ignore[attr-defined]


# What a dtype without fields feeds, by the dtype's identity, with the dtype held (so that its
# identity is not reused): its `str` and `repr` cost three numpy calls in Python, a third of
# digesting a small array, and an `each` over 10,000 arrays asked them for the same dtype 20,000
# times. A dtype with fields is read each time: its field names can be set in place. A process
# that makes dtype after dtype starts the table afresh past `_DTYPE_HEADERS_KEPT`.
_DTYPE_HEADERS: dict[int, tuple[object, bytes]] = {}
_DTYPE_HEADERS_KEPT = 256


def _dtype_header(dtype: Any) -> bytes:
    known = _DTYPE_HEADERS.get(id(dtype))
    if known is not None:
        return known[1]
    header = _text(b"", dtype.str) + _text(b"", repr(dtype))
    if dtype.fields is None:
        if len(_DTYPE_HEADERS) >= _DTYPE_HEADERS_KEPT:
            _DTYPE_HEADERS.clear()
        _DTYPE_HEADERS[id(dtype)] = (dtype, header)
    return header


def _numpy_array(
    array: Any, where: Where, pending: list[Any], out: bytearray, hashed: _Hashed | None
) -> None:
    numpy = sys.modules["numpy"]
    met = array
    kind = type(array)
    dtype = array.dtype
    if kind is not numpy.ndarray:
        # A subclass: its class, and what it holds beside the array (a masked array's mask
        # and fill value; `_sharedmask`, how it came to share its mask, is no content).
        out += b"X"
        if _is(array, "numpy.ma", "MaskedArray"):
            ma = sys.modules["numpy.ma"]
            state: Any = (ma.getmaskarray(array), array.fill_value, array.hardmask)
        elif _is(array, "numpy", "memmap"):
            state = None  # Its content is its bytes; where it maps them is not.
        else:
            state = _subclass_state(array, where)[0]
        pending.append((state, (where, ".__dict__")))
        pending.append((kind, (where, ".__class__")))
        array = array.view(numpy.ndarray)
    known = None if hashed is None else hashed.get(id(met))
    if known is not None:
        out += known[1]
        return
    header = _dtype_header(dtype) + _text(b"", repr(array.shape))
    start = len(out)
    if dtype.hasobject:  # Pointers, not content.
        out += b"A" + header
        if dtype.kind == "O":
            # Text (a pandas `object` or `str` column): its strings read in Rust, in order, each
            # tagged and its length before it, where walking them here cost three calls each.
            # `T` begins no value's encoding, so this never feeds what a walked array feeds.
            column = _soma.text_column(numpy.ascontiguousarray(array).reshape(-1))
            if column is not None:
                out += b"T" + column
                if hashed is not None:
                    hashed[id(met)] = (met, bytes(out[start:]))
                return
        # Any other object: walked as the nested lists they hold.
        pending.append((array.tolist(), where))
        return
    out += b"a" + header
    # Its own digest, made on several threads when it is large, stands for its bytes.
    out += _soma.blake3(numpy.ascontiguousarray(array).reshape(-1).view(numpy.uint8))
    if hashed is not None:
        hashed[id(met)] = (met, bytes(out[start:]))


def _torch_tensor(tensor: Any, where: Where, pending: list[Any], out: bytearray) -> None:
    torch = sys.modules["torch"]
    if tensor.layout is not torch.strided or tensor.is_quantized:
        raise Unkeyable(f"{tensor.layout} tensor", where)
    subclass = type(tensor) is not torch.Tensor  # A `Parameter`, or a subclass of the user's.
    out += (
        b"t"
        + _text(b"", str(tensor.dtype))
        + _text(b"", repr(tuple(tensor.shape)))
        + _text(b"", tensor.device.type)
        + (b"1" if tensor.requires_grad else b"0")
        + (b"+" if subclass else b"-")
    )
    flat = tensor.detach().resolve_conj().resolve_neg().to("cpu").contiguous().reshape(-1)
    as_bytes = flat.view(torch.uint8)  # Alive while its memory is read.
    out += _soma.blake3(_tensor_bytes(as_bytes))
    if subclass:  # Its class, then its own attributes.
        pending.append(_subclass_state(tensor, where))
        pending.append((type(tensor), (where, ".__class__")))


def _tensor_bytes(flat: Any) -> memoryview:
    """The bytes of ``flat``, a contiguous one-dimensional ``uint8`` tensor on the CPU, read in
    place: through its memory's address, since a tensor exports no buffer and ``Tensor.numpy()``
    needs numpy, which Soma does not (torch runs without it). The view is read while ``flat``,
    which owns that memory, is alive: the caller's frame holds it."""
    size = flat.numel()
    if size == 0:
        return memoryview(b"")
    # Cast to bytes: a view with the shape and strides the digest's buffer reader asks for.
    return memoryview((ctypes.c_ubyte * size).from_address(flat.data_ptr())).cast("B")


# ---------------------------------------------------------------------------------------------
# Code, by what it reaches


# The kinds of binding a witness checks that a node's own witness uses (the others are made by
# `soma._soma.reach`; see `crates/soma-python/src/witness.rs`).
_ATTRIBUTE, _VARS, _VARS_LEN, _TYPE = 0, 1, 2, 8


class _Unit:
    """A class's or a function's digest as remembered: the digest of what cannot change in
    place, the witness of what it was read from, and where each volatile binding lies."""

    __slots__ = ("owner", "stable", "wheres", "witness")

    def __init__(self, stable: bytes, witness: _soma.Witness, wheres: tuple[str, ...]) -> None:
        self.stable = stable
        self.witness = witness
        self.wheres = wheres
        # Its owner, weakly, with the callback that removes this entry when the owner goes.
        self.owner: weakref.ref[Any] | None = None


def _finish(
    stable: bytes, current: tuple[object, ...], wheres: tuple[str, ...], busy: frozenset[int]
) -> bytes:
    """The digest of a remembered part, with what its volatile bindings hold now."""
    if not current:
        return stable
    out = bytearray(stable)
    for value, where in zip(current, wheres, strict=True):
        out += _digest_at(value, where, busy)
    return _soma.blake3(out)


# Classes' and functions' remembered digests, by the id of the class or function; each entry
# leaves with its owner (before the id can be anyone else's), and its witness holds the owner
# weakly, so the entry never keeps it alive.
_UNITS: dict[int, _Unit] = {}


def _unit(owner: type | types.FunctionType) -> tuple[_Unit, tuple[object, ...]]:
    """The remembered digest of a class or a function of the user's — made afresh when its
    witness says a binding changed — and what its volatile bindings hold now."""
    unit = _UNITS.get(id(owner))
    if unit is not None:
        current = unit.witness.current()
        if current is not None:
            return unit, current
    for _ in range(3):
        unit = _reach(owner)
        current = unit.witness.current()
        if current is not None:
            break
    else:  # Rebound between the walk and its check, each time.
        raise Unkeyable(_qualified(owner), "(its code changes while it is read)")
    key = id(owner)

    def forget(gone: weakref.ref[Any]) -> None:
        if (entry := _UNITS.get(key)) is not None and entry.owner is gone:
            del _UNITS[key]

    try:
        unit.owner = weakref.ref(owner, forget)
    except TypeError:  # Cannot be referenced weakly: made afresh each time, never kept.
        return unit, current
    _UNITS[key] = unit
    return unit, current


def _unit_digest(owner: type | types.FunctionType, busy: frozenset[int]) -> bytes:
    """A class's or a function's whole digest; a reference by name when it is being made
    further up (a class whose attribute holds one of its instances)."""
    if id(owner) in busy:  # By its name, without its module's (see `reach`).
        return _soma.blake3(_text(b"busy", owner.__qualname__))
    unit, current = _unit(owner)
    return _finish(unit.stable, current, unit.wheres, busy | {id(owner)})


def _users(obj: object) -> bool:
    """Whether a function, a class or a module is the user's own, whose code a key follows
    (asked by ``soma._soma.reach``)."""
    if type(obj) is types.FunctionType:
        return _users_function(obj)
    if isinstance(obj, type):
        return _users_class(obj)
    if isinstance(obj, types.ModuleType):
        return _users_module(obj)
    return False


def _load(name: str) -> types.ModuleType | None:
    """The module ``name``, which a function of the user's imports in its body and this
    process has not imported yet, imported now if it is the user's (asked by
    ``soma._soma.reach``): a hit never calls the node whose call would import it, and its code
    must be in the key all the same. ``None`` for a library's module (keyed by name) and for
    one that cannot be found, whose import fails in the node as it would without a cache."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not isinstance(spec.origin, str) or not _users_file(spec.origin):
        return None
    return importlib.import_module(name)


def _reach(owner: type | types.FunctionType) -> _Unit:
    """A class's or a function's code read afresh (``soma._soma.reach`` says what it follows)."""
    try:
        stable, witness, wheres = _soma.reach(owner, _USERS_FILES, _users_file, _users, _load)
    except Exception as error:  # An attribute that raised when read, a constant no compiler makes.
        raise Unkeyable(
            f"{_qualified(owner)} ({type(error).__name__}: {error})", _qualified(owner)
        ) from None
    return _Unit(stable, witness, tuple(wheres))


# ---------------------------------------------------------------------------------------------
# Nodes


# Fingerprints of nodes whose state cannot change in place, by the id of the node: each entry
# holds its node weakly and leaves when the node goes (before its id can be anyone else's).
_REMEMBERED: dict[int, _soma.Remembered] = {}


def fingerprint(node: object) -> bytes:
    """The digest of what ``node``'s output depends on besides its input: its class's code
    (each class of its MRO of the user's: methods, attributes, and the functions, classes and
    module-level values its code reaches by name) and its state.

    Raises :class:`Unkeyable` when what it reaches cannot be read, saying where.
    """
    remembered = _REMEMBERED.get(id(node))
    if remembered is not None and remembered.node() is node:
        current = remembered.witness.current()
        if current is not None:  # Nothing it was read from was rebound: what every rerun does.
            if not current:
                return remembered.stable
            return _finish(remembered.stable, current, remembered.wheres, frozenset())
    cls = type(node)
    if _users_class(cls):
        unit, current = _unit(cls)
        out = bytearray(b"N" + unit.stable)
        wheres = unit.wheres
    else:  # Soma's own (`switch`, `loop`), or an installed library's: by name.
        unit, current, wheres = None, (), ()
        out = bytearray(_text(b"n", _qualified(cls)))
    native = getattr(node, "_soma_native", None)
    if native is not None:  # A Rust node: what it was made with is in its description.
        out += _text(b"R", repr(native))
    state = _state(node)
    out += _length(len(state))
    for name, attribute in state.items():
        out += _text(b"", name)
        _feed(attribute, f".{name}", out, frozenset())
    # What the node says its output depends on beside what Soma reads (a file's content, an
    # environment variable): asked on every run, never remembered.
    hook = getattr(cls, "cache_key", None)
    if hook is not None:
        out += b"+"
        _feed(hook(node), ".cache_key()", out, frozenset())
    else:
        out += b"-"
    stable = _soma.blake3(out)
    result = _finish(stable, current, wheres, frozenset())
    if native is None and hook is None and all(map(_unchangeable, state.values())):
        _remember(node, cls, state, stable, unit, wheres)
    elif remembered is not None and remembered.node() is node:
        del _REMEMBERED[id(node)]  # Its state can now change in place: checked no more.
    return result


def _remember(
    node: object,
    cls: type,
    state: dict[str, object],
    stable: bytes,
    unit: _Unit | None,
    wheres: tuple[str, ...],
) -> None:
    key = id(node)

    def forget(gone: weakref.ref[Any]) -> None:
        if (entry := _REMEMBERED.get(key)) is not None and entry.node is gone:
            del _REMEMBERED[key]

    try:
        held = weakref.ref(node, forget)
    except TypeError:  # Slots without `__weakref__`: it is digested on every run instead.
        return
    bindings: list[tuple[Any, ...]] = [(_TYPE, cls, False)]
    attributes = getattr(node, "__dict__", None)
    if attributes is not None:
        bindings.append((_VARS_LEN, len(attributes), False))
    for name, value in state.items():
        if attributes is not None and name in attributes:
            bindings.append((_VARS, name, value, False))
        else:
            bindings.append((_ATTRIBUTE, name, value, False))
    owners: list[tuple[object, list[tuple[Any, ...]]]] = [(node, bindings)]
    # The classes of its MRO that its class's witness does not read (a library's, Soma's): a
    # `cacheable = False` set on one since makes it run uncached, which a rerun's hit, read
    # from this witness alone, must see. A class written in C never changes.
    for base in cls.__mro__:
        if base.__flags__ & _HEAP_TYPE and (unit is None or not _users_class(base)):
            namespace = base.__dict__
            checks: list[tuple[Any, ...]] = [(_VARS_LEN, len(namespace), False)]
            if "cacheable" in namespace:
                checks.append((_VARS, "cacheable", namespace["cacheable"], False))
            owners.append((base, checks))
    parts = [] if unit is None else [unit.witness]
    witness = _soma.Witness(owners, parts)
    # A `soma._soma.Remembered`, which the run cache reads a rerun's hit from without a frame.
    _REMEMBERED[key] = _soma.Remembered(held, stable, witness, wheres)


# By class: the names of its slots, read once.
_SLOTS: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _slots(cls: type) -> tuple[str, ...]:
    known = _SLOTS.get(cls)
    if known is None:
        found: list[str] = []
        for c in cls.__mro__:
            declared = c.__dict__.get("__slots__", ())
            for name in [declared] if isinstance(declared, str) else declared:
                if name not in ("__dict__", "__weakref__"):
                    found.append(name)
        known = tuple(found)
        _SLOTS[cls] = known
    return known


def _state(obj: object) -> dict[str, object]:
    """A node's attributes: its ``__slots__`` and its ``__dict__``, Soma's own left out."""
    state: dict[str, object] = {
        name: getattr(obj, name) for name in _slots(type(obj)) if hasattr(obj, name)
    }
    state.update(getattr(obj, "__dict__", {}))
    # What Soma's own steps hold that the nodes inside are keyed as themselves by: a switch's
    # cases, a loop's body (see `soma._build.decide`).
    structure = getattr(type(obj), "_soma_not_state", ())
    return {
        name: value
        for name, value in state.items()
        if not name.startswith("_soma_") and name not in structure
    }
