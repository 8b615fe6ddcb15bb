"""What Ray raises when a host cannot run a node, told as Soma tells errors.

Ray's wrappers name its actor methods (``_HostActor.load``), print in terminal colours and bury
the cause in Ray's own traceback. What went wrong is about the user's nodes: a module the host
cannot import, a node or a value that does not pickle on its way there or back, an exception
that cannot travel. Each comes out as a :class:`soma.RemoteError` with ``.host``, ``.node`` and
``.slice``, naming the node(s) and their class, what failed, and the fix on a ``hint:`` line.

Finding the culprit pickles the slice's nodes or values once more, one by one: that happens
only once something has failed, so a run that works pays nothing for it.
"""

from __future__ import annotations

import pickle
import re
import sys
from collections.abc import Iterable
from typing import Any

from soma.errors import RemoteError
from soma.remote._slices import INPUT, Slice

# The terminal colours Ray puts in what it prints: a message is read anywhere.
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
_NO_MODULE = re.compile(r"No module named '([^']+)'")
_NODE_NOTE = re.compile(r"raised in soma node `([^`]+)`")

#: How to make a module importable on a host, the ways Soma supports.
_IMPORT_HINT = (
    "make `{module}` importable on host `{host}`: install it there as a package, or send it "
    "to every host with Ray's runtime_env before the first run: "
    '`ray.init(runtime_env={{"py_modules": ["{path}"]}})` (or `{{"working_dir": "."}}` for the '
    "current folder)"
)
_PICKLE_HINT = (
    "a node on a host, and every value it reads or returns, must pickle: keep what cannot "
    "(a lock, an open file, a connection, a generator) out of it, make it on the host in "
    "`forward`, or give its class `__getstate__`/`__setstate__`; or keep the node here with "
    "`g.place_at(id, None)`"
)
_EXCEPTION_HINT = (
    "let the exception pickle: pass every argument of its `__init__` on to "
    "`super().__init__(...)` (or give it a `__reduce__`), and keep locks, files and "
    "connections out of its attributes"
)


def plain(text: str) -> str:
    """``text`` without Ray's terminal colours."""
    return _COLOURS.sub("", text)


def said(error: BaseException) -> str:
    """``str(error)``, uncoloured, or what its class is when even that fails."""
    try:
        return plain(str(error))
    except Exception:
        return f"<a {class_of(error)} whose str() raised>"


def class_of(value: Any) -> str:
    """``value``'s class, as ``module.Name``."""
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


def why_not_pickled(value: Any) -> str | None:
    """Why ``value`` does not survive Ray's pickling (``cloudpickle`` there, ``pickle`` back),
    as ``Type: message``; ``None`` when it does."""
    import ray

    try:
        pickle.loads(ray.cloudpickle.dumps(value))
    except Exception as failed:
        return f"{type(failed).__name__}: {said(failed)}"
    return None


def _error(
    message: str, hint: str, host: str, pieces: list[Slice], node: str | None
) -> RemoteError:
    error = RemoteError(f"{message}\nhint: {hint}")
    error.host = host
    error.slice = [name for piece in pieces for name in piece.names()]
    error.node = node if node is not None else error.slice[0]
    return error


def _named(nodes: Iterable[tuple[str, Any]]) -> str:
    return ", ".join(f"`{node}` (class `{class_of(obj)}`)" for node, obj in nodes)


def nodes_not_sent(host: str, pieces: list[Slice], failed: BaseException) -> RemoteError:
    """Sending ``pieces`` to ``host`` failed here, pickling them: the nodes that do not pickle."""
    nodes = [pair for piece in pieces for pair in piece.nodes]
    culprits = [(pair, why) for pair in nodes if (why := why_not_pickled(pair[1])) is not None]
    if not culprits:  # Only together do they fail: name them all, with what pickle said.
        culprits = [(pair, _reason(failed)) for pair in nodes]
    (first, why), many = culprits[0], len(culprits) > 1
    return _error(
        f"node{'s' if many else ''} {_named(pair for pair, _ in culprits)} cannot be pickled to "
        f"be sent to host `{host}`: {why}",
        _PICKLE_HINT,
        host,
        pieces,
        first[0],
    )


def values_not_sent(
    host: str, piece: Slice, inputs: dict[str, Any], failed: BaseException
) -> RemoteError:
    """Sending ``inputs`` to ``piece`` on ``host`` failed here, pickling them: which did not."""
    culprits = [(read, why) for read, value in inputs.items() if (why := why_not_pickled(value))]
    if not culprits:
        culprits = [(read, _reason(failed)) for read in inputs]
    read, why = culprits[0]
    return _error(
        f"{_value_of(read, inputs[read])}, read by the slice of {piece.listed()} on host "
        f"`{host}`, cannot be pickled to be sent there: {why}",
        _PICKLE_HINT,
        host,
        [piece],
        piece.names()[0],
    )


def _value_of(read: str, value: Any) -> str:
    source = "the graph's input" if read == INPUT else f"the output of `{read}`"
    return f"{source} (a `{class_of(value)}`)"


def _reason(failed: BaseException) -> str:
    """What pickle said, under Ray's wrapping of it."""
    inner = cause_of(failed)
    lines = said(inner).splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"


def missing_module(text: str) -> str | None:
    """The module a ``ModuleNotFoundError`` in Ray's ``text`` names, if it names one."""
    found = _NO_MODULE.search(plain(text))
    return None if found is None else found.group(1)


def _needing(values: list[tuple[str, Any]], module: str) -> list[tuple[str, Any]]:
    """Those of ``values`` (named) that need ``module``: those of a class from there; else
    those holding something that is (the slower test, so only when no class is); else all."""
    by_class = [pair for pair in values if class_of(pair[1]).startswith(module + ".")]
    return by_class or [pair for pair in values if _holds(pair[1], module)] or values


def _holds(value: Any, module: str) -> bool:
    """Whether ``value``'s pickle names ``module``, or one inside it, as a string of its own."""
    import ray

    try:
        pickled = ray.cloudpickle.dumps(value)
    except Exception:
        return False
    name = module.encode()
    # A name pickled as a short string: its opcode and length, then the name itself.
    return b"\x8c" + bytes([len(name)]) + name in pickled or name + b"." in pickled


def nodes_not_read(host: str, pieces: list[Slice], text: str) -> RemoteError:
    """``host`` could not unpickle the nodes of ``pieces`` (Ray's ``text`` says why)."""
    nodes = [pair for piece in pieces for pair in piece.nodes]
    module = missing_module(text)
    if module is None:
        return _error(
            f"host `{host}` could not unpickle node(s) {_named(nodes)}: {_last_line(text)}",
            _PICKLE_HINT,
            host,
            pieces,
            None,
        )
    needing = _needing(nodes, module)
    return _error(
        f"host `{host}` cannot import module `{module}`, which node"
        f"{'s' if len(needing) > 1 else ''} {_named(needing)} need"
        f"{'' if len(needing) > 1 else 's'}",
        _import_hint(module, host),
        host,
        pieces,
        needing[0][0],
    )


def values_not_read(host: str, piece: Slice, inputs: dict[str, Any], text: str) -> RemoteError:
    """``host`` could not unpickle the values sent to ``piece`` (Ray's ``text`` says why)."""
    module = missing_module(text)
    if module is None:
        return _error(
            f"host `{host}` could not unpickle the values sent to the slice of "
            f"{piece.listed()}: {_last_line(text)}",
            _PICKLE_HINT,
            host,
            [piece],
            None,
        )
    needing = _needing(list(inputs.items()), module)
    return _error(
        f"host `{host}` cannot import module `{module}`, which "
        + ", ".join(_value_of(read, value) for read, value in needing)
        + f" sent to the slice of {piece.listed()} needs",
        _import_hint(module, host),
        host,
        [piece],
        None,
    )


def _import_hint(module: str, host: str) -> str:
    root = sys.modules.get(module.partition(".")[0])
    paths = list(getattr(root, "__path__", None) or [])
    path = paths[0] if paths else getattr(root, "__file__", None)
    return _IMPORT_HINT.format(
        module=module, host=host, path=path or f"<the folder or .py file of `{module}`>"
    )


def cause_of(failed: BaseException) -> BaseException:
    """Pickle's own error under Ray's wrapping of it (which prints in colours)."""
    return failed.__cause__ or failed


def _last_line(text: str) -> str:
    lines = [line.strip() for line in plain(text).splitlines() if line.strip()]
    return lines[-1] if lines else "(Ray said nothing more)"


def returns_not_sent(host: str, piece: Slice, failed: BaseException) -> RemoteError:
    """What ``piece`` returned on ``host`` could not be pickled there to come back."""
    returned = [pair for pair in piece.nodes if pair[0] in piece.returns]
    which = "the value returned by" if len(returned) == 1 else "one of the values returned by"
    return _error(
        f"{which} {_named(returned)} on host `{host}` cannot be pickled to come back: "
        f"{type(failed).__name__}: {said(failed)}",
        _PICKLE_HINT,
        host,
        [piece],
        returned[0][0] if returned else None,
    )


def returns_not_read(host: str, piece: Slice, text: str) -> RemoteError:
    """What ``piece`` returned on ``host`` could not be unpickled here."""
    returned = [pair for pair in piece.nodes if pair[0] in piece.returns]
    which = "the value returned by" if len(returned) == 1 else "one of the values returned by"
    module = missing_module(text)
    hint = (
        _PICKLE_HINT
        if module is None
        else f"make `{module}` importable here too, or return values this process can unpickle"
    )
    return _error(
        f"{which} {_named(returned)} on host `{host}` cannot be unpickled here: {_last_line(text)}",
        hint,
        host,
        [piece],
        returned[0][0] if returned else None,
    )


def exception_not_sent(raised: BaseException, host: str, nodes: list[str]) -> RemoteError | None:
    """On a host: a stand-in for ``raised`` (raised in a slice of ``nodes``) if it cannot travel
    back; ``None`` if it can. The stand-in names the exception's class and message."""
    why = why_not_pickled(raised)
    if why is None:
        return None
    notes = getattr(raised, "__notes__", None) or []
    named = [found.group(1) for note in notes if (found := _NODE_NOTE.match(note))]
    node = named[-1] if named else None
    where = (
        f"node `{node}`"
        if node is not None
        else "the slice of " + ", ".join(f"`{n}`" for n in nodes)
    )
    error = RemoteError(
        f"{where} raised `{class_of(raised)}: {said(raised)}` on host `{host}`, an "
        f"exception that cannot be pickled to come back here ({why})\nhint: {_EXCEPTION_HINT}"
    )
    error.host = host
    error.slice = list(nodes)
    error.node = node if node is not None else (nodes[0] if nodes else None)
    return error


def exception_not_read(host: str, piece: Slice, text: str) -> RemoteError:
    """An exception raised in ``piece`` on ``host`` travelled but could not be unpickled here;
    Ray's ``text`` is what the host printed of it (its traceback, its last line, its notes)."""
    lines = [line for line in plain(text).rstrip().splitlines() if line.strip()]
    named = [found.group(1) for line in lines if (found := _NODE_NOTE.match(line))]
    while lines and _NODE_NOTE.match(lines[-1]):
        lines.pop()
    node = named[-1] if named else None
    where = f"node `{node}`" if node is not None else f"the slice of {piece.listed()}"
    return _error(
        f"{where} raised `{lines[-1] if lines else '?'}` on host `{host}`, an exception that "
        "cannot be unpickled here",
        "make the exception's class importable here too, and " + _EXCEPTION_HINT,
        host,
        [piece],
        node,
    )


def other(host: str, piece: Slice, failed: BaseException) -> RemoteError:
    """Any other failure of Ray's, about ``piece`` on ``host``, in its own words, uncoloured."""
    return _error(
        f"host `{host}` could not run the slice of {piece.listed()}: Ray raised "
        f"`{type(failed).__name__}`: {_last_line(str(failed))}",
        "the cause below is Ray's own report",
        host,
        [piece],
        None,
    )
