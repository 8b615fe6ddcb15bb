"""Hosts served by Ray: one actor per host, on the Ray node(s) that offer the host's resource.

The rule that maps a host to Ray is one: host ``gpu-box`` is whatever Ray node offers the
custom resource ``soma-host:gpu-box`` (start it with
``ray start --resources='{"soma-host:gpu-box": 1}'``). Each host gets one actor, placed by
asking for a sliver of that resource, and holding the slices of every graph that uses the host
(sent at a graph's first run, and a slice again once its nodes changed here, not per call); it
runs them with Soma's own engine, several at once (a threaded actor), so two slices for one
host never queue behind each other. Each run of a slice has a token and, there, a stop flag:
a cancel, on a thread of its own (the ``control`` concurrency group), sets it, and the slice
stops at its next node boundary. Values travel through Ray's object store: numpy arrays are
read without a copy on the same node (the arguments go out of band, so the host's array is a
read-only view of the store).

This is the only module that imports Ray, and only when a graph with hosts runs.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any

from soma._soma import StopFlag
from soma.errors import RemoteError, RemoteTraceback, SomaError
from soma.remote import _ray_errors
from soma.remote._slices import (
    CANCEL_WAIT,
    DEADLINE_GRACE,
    CacheCounts,
    FolderCache,
    RemoteHost,
    Shipped,
    Slice,
    SliceRunner,
    remote_error,
)

#: The Ray rule: the Ray node(s) of host ``name`` offer the custom resource
#: ``soma-host:<name>`` (``ray start --resources='{"soma-host:gpu-box": 1}'``).
RESOURCE_PREFIX = "soma-host:"
"""What a Ray node's custom resource starts with to offer a host: ``soma-host:<name>``
(:func:`resource_of`)."""


def resource_of(host: str) -> str:
    """The Ray custom resource that marks the node(s) of ``host``: ``soma-host:<host>``."""
    return RESOURCE_PREFIX + host


#: The slices a host's actor may run at once.
MAX_CONCURRENCY = 64

_INSTALL_HINT = "install Ray with `pip install 'soma-graph[ray]'` (or `pip install ray`)"


def _import_ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "this graph places nodes on hosts, and Soma runs them on Ray, which is not "
            f"installed\nhint: {_INSTALL_HINT}; or bring the nodes back here with "
            "`g.place_at(id, None)`",
            name="ray",
        ) from None
    return ray


#: The actor's concurrency group for cancels: its own thread, so a cancel is never queued
#: behind the slices it is meant to stop.
CONTROL = "control"

#: Cancels kept for runs that had not started when their cancel came, at most: a cancel for a
#: run that had already ended is kept too, and forgotten once this many came after it.
EARLY_CANCELS = 4096


class _HostActor:
    """What runs on a host: the slices of each graph that uses it, by graph key, and the stop
    flags of the slice runs in progress, by token."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.slices: dict[str, dict[int, SliceRunner]] = {}
        self._lock = threading.Lock()
        self._running: dict[str, StopFlag] = {}
        self._early: collections.OrderedDict[str, None] = collections.OrderedDict()

    def load(self, key: str, slices: list[Slice]) -> None:
        runners = {piece.index: SliceRunner(piece) for piece in slices}
        # Built first: a run of the slice's old copy, under way meanwhile, holds its own runner.
        self.slices.setdefault(key, {}).update(runners)

    def run(
        self,
        key: str,
        index: int,
        inputs: dict[str, Any],
        token: str,
        traced: bool,
        cache: FolderCache | None = None,
    ) -> tuple[dict[str, Any], list[Shipped], CacheCounts]:
        stop = StopFlag()
        with self._lock:
            self._running[token] = stop
            if token in self._early:  # Cancelled on its way here.
                del self._early[token]
                stop.set()
        runner = self.slices[key][index]
        try:
            return runner.run(inputs, stop, traced, cache=cache)
        except BaseException as raised:
            # Ray would send an exception that does not pickle back as its own serialization
            # error: what comes back instead says what the node raised.
            stand_in = _ray_errors.exception_not_sent(raised, self.host, runner.nodes)
            if stand_in is None:
                raise
            raise stand_in from raised
        finally:
            with self._lock:
                del self._running[token]

    def cancel(self, tokens: list[str]) -> None:
        with self._lock:
            for token in tokens:
                stop = self._running.get(token)
                if stop is not None:
                    stop.set()
                    continue
                self._early[token] = None
                if len(self._early) > EARLY_CANCELS:
                    self._early.popitem(last=False)

    def running(self) -> int:
        """The slice runs in progress here."""
        with self._lock:
            return len(self._running)

    def unstopped(self) -> int:
        """The slice runs in progress here that no cancel has reached."""
        with self._lock:
            return sum(not stop.is_set for stop in self._running.values())

    def unload(self, key: str) -> None:
        self.slices.pop(key, None)

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())


class _RayHost:
    """One host's actor, as the local side holds it."""

    def __init__(self, hosts: RayHosts, name: str, actor: Any) -> None:
        self._hosts = hosts
        self.name = name
        self.actor = actor
        self._loaded: dict[str, dict[int, Slice]] = {}

    def load(self, key: str, slices: list[Slice], timeout: float | None = None) -> None:
        ray = self._hosts.ray
        limit = (
            self._hosts.start_timeout
            if timeout is None
            else min(timeout, self._hosts.start_timeout)
        )
        try:
            ref = self.actor.load.remote(key, slices)
        except Exception as failed:  # Pickling the slices' nodes, here.
            raise _ray_errors.nodes_not_sent(self.name, slices, failed) from (
                _ray_errors.cause_of(failed)
            )
        try:
            ray.get(ref, timeout=limit)
        except ray.exceptions.RayTaskError as failed:  # Unpickling them, there.
            raise _ray_errors.nodes_not_read(self.name, slices, str(failed)) from _traceback(
                failed, self.name
            )
        except ray.exceptions.RayActorError:
            self._hosts.forget(self)
            raise remote_error(
                self.name, slices[0], "died while its slices were sent", _DIED_HINT
            ) from None
        except ray.exceptions.GetTimeoutError:
            raise remote_error(
                self.name,
                slices[0],
                f"did not take its slices within {limit:.3g} s",
                "a host's actor starts on first use; give it longer with "
                "`soma.remote.use(soma.remote.RayHosts(start_timeout=...))`",
            ) from None
        self._loaded.setdefault(key, {}).update((piece.index, piece) for piece in slices)

    def run(
        self,
        key: str,
        index: int,
        inputs: dict[str, Any],
        timeout: float | None,
        token: str,
        traced: bool,
        cache: FolderCache | None = None,
    ) -> tuple[dict[str, Any], list[Shipped], CacheCounts]:
        ray = self._hosts.ray
        piece = self._loaded[key][index]
        limit = self._hosts.timeout if timeout is None else timeout
        try:
            ref = self.actor.run.remote(key, index, inputs, token, traced, cache)
        except Exception as failed:  # Pickling the values the slice reads, here.
            raise _ray_errors.values_not_sent(self.name, piece, inputs, failed) from (
                _ray_errors.cause_of(failed)
            )
        try:
            out: tuple[dict[str, Any], list[Shipped], CacheCounts] = ray.get(ref, timeout=limit)
        except ray.exceptions.RayTaskError as failed:
            raised, remote = _as_raised(failed, self.name, piece, inputs)
            raise raised from remote
        except ray.exceptions.RayActorError:
            self._hosts.forget(self)
            raise remote_error(
                self.name, piece, "died while running its slice", _DIED_HINT
            ) from None
        except ray.exceptions.GetTimeoutError:
            # The run's own deadline passed (when it has one): it is kept to a tenth of a second.
            _answer_read_when_it_comes(ref)
            self.cancel([token], CANCEL_WAIT if timeout is None else DEADLINE_GRACE)
            raise remote_error(
                self.name, piece, f"did not finish its slice within {limit:.3g} s", _TIMEOUT_HINT
            ) from None
        except ray.exceptions.UnserializableException as failed:  # An exception, here.
            text = getattr(failed, "_original_stack_trace", str(failed))
            raise _ray_errors.exception_not_read(self.name, piece, text) from RemoteTraceback(
                self.name, _ray_errors.plain(text).rstrip()
            )
        except ray.exceptions.RaySystemError as failed:  # Unpickling what came back, here.
            raise _ray_errors.returns_not_read(self.name, piece, str(failed)) from _traceback(
                failed, self.name
            )
        except ray.exceptions.RayError as failed:  # Anything else of Ray's, in its own words.
            raise _ray_errors.other(self.name, piece, failed) from _traceback(failed, self.name)
        except BaseException:  # Ctrl-C while waiting here: the slice stops there too.
            _answer_read_when_it_comes(ref)
            self.cancel([token])
            raise
        return out

    def cancel(self, tokens: list[str], wait: float = CANCEL_WAIT) -> None:
        ray = self._hosts.ray
        wait = min(self._hosts.timeout, wait)
        # Anything but an answer means the host is gone or swamped: nothing more to do here.
        with contextlib.suppress(Exception):
            ray.get(
                self.actor.cancel.options(concurrency_group=CONTROL).remote(tokens), timeout=wait
            )

    def unload(self, key: str) -> None:
        self._loaded.pop(key, None)
        if not self._hosts.ray.is_initialized():
            return  # Ray was shut down, and its actors with it; calling it would start it again.
        # A courtesy to a host that may be gone, or a Ray shut down already: never an error.
        with contextlib.suppress(Exception):
            self.actor.unload.remote(key)


_DIED_HINT = (
    "the host's Ray node or actor is gone; the next forward starts a new actor there once a "
    "node offers the host's resource again"
)
_TIMEOUT_HINT = "pass a larger `timeout=` to forward, or to `soma.remote.RayHosts(timeout=...)`"


def _answer_read_when_it_comes(ref: Any) -> None:
    """Reads the answer to a slice's run that nobody waits for any more (the run timed out, or
    was interrupted) once it comes, and drops it. A slice stopped there answers with its
    ``CancelledError``; a Ray answer holding an error that is never read is logged by Ray, as
    the ref is freed, as an "Unhandled error" with its traceback — on the user's terminal, for
    a cancel the user asked for."""
    with contextlib.suppress(Exception):  # Ray shut down meanwhile: nothing is left to log it.
        ref.future().add_done_callback(_read)


def _read(answer: Any) -> None:
    answer.exception()


def _traceback(failed: Any, host: str) -> RemoteTraceback:
    """What Ray printed for ``failed``: the task, and the traceback on the host, uncoloured."""
    return RemoteTraceback(host, _ray_errors.plain(str(failed)).rstrip())


def _as_raised(
    failed: Any, host: str, piece: Slice, inputs: dict[str, Any]
) -> tuple[BaseException, RemoteTraceback]:
    """What a failed run of ``piece`` on ``host`` raises here, and the remote traceback to
    raise it from: the node's own exception out of Ray's wrapper, noted with its host; a
    :class:`soma.RemoteError` when it was Ray that failed on the host, reading the values sent
    or pickling the values returned."""
    import ray

    remote = _traceback(failed, host)
    cause = getattr(failed, "cause", None)
    if not isinstance(cause, BaseException) or isinstance(cause, ray.exceptions.RaySystemError):
        # Ray could not unpickle the values sent, there.
        return _ray_errors.values_not_read(host, piece, inputs, str(failed)), remote
    if isinstance(cause, ray.exceptions.RayError):
        return _ray_errors.other(host, piece, cause), remote
    if isinstance(cause, RemoteError):  # The host's own: it says where already.
        return cause, remote
    notes = getattr(cause, "__notes__", None)
    ours = isinstance(cause, SomaError) or any(
        note.startswith("raised in soma node ") for note in notes or []
    )
    if not ours and "pickle" in remote.traceback:
        # Raised outside the slice's run: by Ray, pickling what it returned.
        return _ray_errors.returns_not_sent(host, piece, cause), remote
    # The engine on the host named the node; say where that was, in the same note.
    named = [at for at, note in enumerate(notes or []) if note.startswith("raised in soma node ")]
    if notes and named:
        notes[named[-1]] += f" on host `{host}`"
    else:
        cause.add_note(f"raised on host `{host}`")
    return cause, remote


class RayHosts:
    """The Ray transport: host ``name`` is the Ray node(s) offering the custom resource
    ``soma-host:<name>``; each host is served by one threaded actor there.

    Ray is used as the program set it up: if it is not initialised yet, ``ray.init(address)``
    is called on first use (``address=None`` means Ray's own default: the ``RAY_ADDRESS``
    environment variable, or a running local cluster, or a new one). ``timeout`` bounds each
    trip to a host, in seconds, when ``forward`` is given none; ``start_timeout`` bounds
    starting a host's actor and sending it a graph's slices (a busy node may take seconds).
    A host imports the modules its nodes are defined in through Ray's job: a program whose
    modules are not installed on the hosts sends them with
    ``ray.init(runtime_env={"py_modules": [...]})`` (or ``{"working_dir": "."}``) before its
    first run, which Soma then uses as it is.
    """

    def __init__(
        self, *, timeout: float = 300.0, start_timeout: float = 120.0, address: str | None = None
    ) -> None:
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.address = address
        self._lock = threading.Lock()
        self._hosts: dict[str, _RayHost] = {}
        self._ray: Any = None
        self._actor_class: Any = None

    @property
    def ray(self) -> Any:
        """The ``ray`` module, imported and initialised on first use."""
        if self._ray is None:
            ray = _import_ray()
            if not ray.is_initialized():
                ray.init(address=self.address)
            self._actor_class = ray.remote(concurrency_groups={CONTROL: 1})(_HostActor)
            self._ray = ray
        return self._ray

    def host(self, name: str) -> RemoteHost:
        """The host named ``name``: its actor, started on first use on the Ray node(s) offering
        ``soma-host:<name>``, and the same while it lives.

        Raises:
            soma.RemoteError: no Ray node offers that resource (``.host`` names it).
            ModuleNotFoundError: Ray is not installed (the message says how to install it).
        """
        with self._lock:
            found = self._hosts.get(name)
            if found is None:
                found = self._hosts[name] = self._start(name)
            return found

    def _start(self, name: str) -> _RayHost:
        ray = self.ray
        resource = resource_of(name)
        if ray.cluster_resources().get(resource, 0) <= 0:
            from soma.errors import RemoteError

            error = RemoteError(
                f"host `{name}` is not in the Ray cluster: no node offers the resource "
                f"`{resource}`\nhint: start the Ray node for `{name}` with "
                f"`ray start --resources='{{\"{resource}\": 1}}'` (a local one with "
                f'`ray.init(resources={{"{resource}": 1}})`); every host name maps to the '
                f"resource `{RESOURCE_PREFIX}<name>`"
            )
            error.host = name
            raise error
        actor = self._actor_class.options(
            resources={resource: 0.001},
            num_cpus=0,
            max_concurrency=MAX_CONCURRENCY,
        ).remote(name)
        return _RayHost(self, name, actor)

    def forget(self, host: _RayHost) -> None:
        """Drops ``host``, whose actor died: the next run there starts a new one."""
        with self._lock:
            if self._hosts.get(host.name) is host:
                del self._hosts[host.name]

    def actor_node_id(self, name: str) -> str:
        """The Ray node id the actor of host ``name`` runs on."""
        host = self.host(name)
        assert isinstance(host, _RayHost)
        return str(self.ray.get(host.actor.node_id.remote(), timeout=self.start_timeout))
