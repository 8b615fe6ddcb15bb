"""Every exception Soma raises, declared once.

The Rust glue instantiates these classes and sets their data as attributes (the node id, the
cycle's path), so a caller can react to an error without parsing its message. An exception
raised *inside* a node is never wrapped: it comes out of ``forward`` as itself, with a note.
"""

from __future__ import annotations

import pickle


class SomaError(Exception):
    """Base of every error Soma raises about a graph, a plan or a run."""


class GraphError(SomaError, ValueError):
    """A graph refused a node or an edge; the graph is unchanged. ``.node``: the id refused, or
    the node the refusal is about."""

    node: str | None = None


class InvalidIdError(GraphError):
    """The id is empty or holds whitespace, control characters or a ``/`` (which separates a
    step's id from the ids inside it); or a ``switch`` key holds a ``/`` (``.node``: the step)."""


class DuplicateNodeError(GraphError):
    """A node with this id is already in the graph (``.node``)."""


class UnknownNodeError(GraphError):
    """No node has this id (``.node``)."""


class DuplicateEdgeError(GraphError):
    """This edge was already declared (``.source``, ``.target``)."""

    source: str | None = None
    target: str | None = None


class CycleError(GraphError):
    """The edge would close a cycle; ``.path`` is that cycle, first node repeated at the end."""

    path: list[str] | None = None


class DeviceError(SomaError, ValueError):
    """A device could not be read (``.device``, what was written): malformed, of a kind torch
    does not name, or a bare ``cuda`` that does not say which one."""

    device: str | None = None


class HostError(SomaError, ValueError):
    """A host name could not be (``.host``, what was written): empty, too long, or with a
    character outside ``[A-Za-z0-9._-]``."""

    host: str | None = None


class CompileError(SomaError):
    """The graph could not be compiled into a plan (``.node``)."""

    node: str | None = None


class RunError(SomaError):
    """A run stopped for a reason of the engine's, about ``.node``."""

    node: str | None = None


class TurnLimitError(RunError):
    """A node was still awaiting on its last allowed turn (``.node``, ``.limit``)."""

    limit: int | None = None


class TimeLimitError(RunError, TimeoutError):
    """A call of node ``.node`` ran past its time limit (``.limit``, in seconds), set with
    ``.time_limit(seconds)``; the call goes on in the background and its result is dropped.
    A ``TimeoutError``, so ``.retry(on=(TimeoutError,))`` retries it."""

    limit: float | None = None


class DriverError(RunError):
    """A node awaited and the driver could not serve it (``.node``).

    Raised when no driver was given, when the driver raised (its exception is the
    ``__cause__``), or when it answered a different number of results than requested.
    """


class ThreadError(RunError, RuntimeError):
    """The operating system refused a thread that a branch of a wave needed.

    The branches that had a thread ran on; the graph stays usable, and the same ``forward`` can
    be tried again once the process has threads to spare.
    """


class WrongDeviceError(RunError):
    """A placed node returned a value that lives on another device: ``.node``, ``.declared``
    (where it is placed) and ``.found`` (where its output is)."""

    declared: str | None = None
    found: str | None = None


class CancelledError(RunError):
    """A run was stopped by its stop flag, set from another thread: on a host, a slice whose
    caller gave up on the run (Ctrl-C, a timeout, a sibling branch's error)."""


class RemoteError(RunError):
    """A host could not run its slice: it is not in the cluster, its process died, it did not
    answer in time, or a node, a value or an exception could not travel to or from it (a module
    it cannot import, something that does not pickle). ``.host``; ``.slice``: the slice's
    nodes, in plan order; ``.node``: the node to look at."""

    host: str | None = None
    slice: list[str] | None = None


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a host (``.host``), as the host formatted it
    (``.traceback``): the ``__cause__`` of that exception where it comes out here, as
    ``concurrent.futures.ProcessPoolExecutor`` does, so that it prints above it."""

    def __init__(self, host: str, traceback: str) -> None:
        super().__init__(host, traceback)
        self.host = host
        self.traceback = traceback

    def __str__(self) -> str:
        return f'\n"""\non host `{self.host}`:\n{self.traceback}\n"""'


class PanicError(SomaError):
    """A Rust node panicked (``.node``); the run was stopped once every branch had been joined."""

    node: str | None = None


class NodePicklingError(SomaError, pickle.PicklingError):
    """A graph could not be pickled because one of its nodes (``.node``) could not; the node's
    own error is the ``__cause__``."""

    node: str | None = None


class ModuleError(SomaError, ValueError):
    """``g.module()`` could not register a node's torch module (``.node``): its id, or the
    attribute that holds it, cannot name a submodule (it holds a ``.``, or is taken by
    ``nn.Module`` itself, such as ``forward`` or ``training``); or its ``forward``, with grad
    mode on, would run modules to train on a host, where backward cannot reach them."""

    node: str | None = None


class StateDictError(SomaError, RuntimeError):
    """A state_dict loaded into ``g.module()`` does not fit: ``.nodes``, the nodes whose keys
    are missing, unexpected or of another size (``.node``, the first); torch's own error is the
    ``__cause__``. A ``RuntimeError``, as torch's is."""

    node: str | None = None
    nodes: list[str] | None = None


class JournalError(SomaError):
    """A run's journal refused what was asked of it: ``.run``, the run's id. A run id taken by
    another input, a run to resume that the journal does not hold, an answer to no open
    question."""

    run: str | None = None


class RunHeldError(JournalError):
    """The run is being run by another process (or another call in this one) right now:
    ``.holder`` names it (host, process id), ``.until`` is when its lease ends unless it is
    renewed. A holder that died stops renewing, and the run can be taken once that passes."""

    holder: str | None = None
    until: float | None = None


class SignatureError(JournalError):
    """An entry of a journal opened with a ``key`` does not verify under it (written without
    the key, with another, or changed since): refused, never unpickled. ``.what`` says which."""

    what: str | None = None


__all__ = [
    "CancelledError",
    "CompileError",
    "CycleError",
    "DeviceError",
    "DriverError",
    "DuplicateEdgeError",
    "DuplicateNodeError",
    "GraphError",
    "HostError",
    "InvalidIdError",
    "JournalError",
    "ModuleError",
    "NodePicklingError",
    "PanicError",
    "RemoteError",
    "RemoteTraceback",
    "RunError",
    "RunHeldError",
    "SignatureError",
    "SomaError",
    "StateDictError",
    "ThreadError",
    "TimeLimitError",
    "TurnLimitError",
    "UnknownNodeError",
    "WrongDeviceError",
]
