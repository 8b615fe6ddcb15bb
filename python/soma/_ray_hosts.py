"""Hosts served by Ray: one actor per host, on the Ray node(s) that offer the host's resource.

The rule that maps a host to Ray is one: host ``gpu-box`` is whatever Ray node offers the
custom resource ``soma-host:gpu-box`` (start it with
``ray start --resources='{"soma-host:gpu-box": 1}'``). Each host gets one actor, placed by
asking for a sliver of that resource, and holding the slices of every graph that uses the host
(sent once per graph, not per call); it runs them with Soma's own engine, several at once
(a threaded actor), so two slices for one host never queue behind each other. Each run of a
slice has a token and, there, a stop flag: a cancel, on a thread of its own (the ``control``
concurrency group), sets it, and the slice stops at its next node boundary. Values travel
through Ray's object store: numpy arrays are read without a copy on the same node (the
arguments go out of band, so the host's array is a read-only view of the store).

This is the only module that imports Ray, and only when a graph with hosts runs.
"""

from __future__ import annotations

import collections
import contextlib
import re
import threading
from typing import Any

from soma._slices import CANCEL_WAIT, RemoteHost, Shipped, Slice, SliceRunner, remote_error
from soma._soma import StopFlag
from soma.errors import RemoteTraceback

#: The Ray rule: the Ray node(s) of host ``name`` offer the custom resource
#: ``soma-host:<name>`` (``ray start --resources='{"soma-host:gpu-box": 1}'``).
RESOURCE_PREFIX = "soma-host:"


def resource_of(host: str) -> str:
    """The Ray custom resource that marks the node(s) of ``host``: ``soma-host:<host>``."""
    return RESOURCE_PREFIX + host


#: The slices a host's actor may run at once.
MAX_CONCURRENCY = 64

_INSTALL_HINT = "install Ray with `pip install 'soma[ray]'` (or `pip install ray`)"


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
        self.slices[key] = {piece.index: SliceRunner(piece) for piece in slices}

    def run(
        self, key: str, index: int, inputs: dict[str, Any], token: str, traced: bool
    ) -> tuple[dict[str, Any], list[Shipped]]:
        stop = StopFlag()
        with self._lock:
            self._running[token] = stop
            if token in self._early:  # Cancelled on its way here.
                del self._early[token]
                stop.set()
        try:
            return self.slices[key][index].run(inputs, stop, traced)
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

    def load(self, key: str, slices: list[Slice]) -> None:
        ray = self._hosts.ray
        try:
            ray.get(self.actor.load.remote(key, slices), timeout=self._hosts.start_timeout)
        except ray.exceptions.RayActorError:
            self._hosts.forget(self)
            raise remote_error(
                self.name, slices[0], "died while its slices were sent", _DIED_HINT
            ) from None
        except ray.exceptions.GetTimeoutError:
            raise remote_error(
                self.name,
                slices[0],
                f"did not take its slices within {self._hosts.start_timeout} s",
                "a host's actor starts on first use; give it longer with "
                "`soma.remote.use(soma.remote.RayHosts(start_timeout=...))`",
            ) from None
        self._loaded[key] = {piece.index: piece for piece in slices}

    def run(
        self,
        key: str,
        index: int,
        inputs: dict[str, Any],
        timeout: float | None,
        token: str,
        traced: bool,
    ) -> tuple[dict[str, Any], list[Shipped]]:
        ray = self._hosts.ray
        piece = self._loaded[key][index]
        limit = self._hosts.timeout if timeout is None else timeout
        ref = self.actor.run.remote(key, index, inputs, token, traced)
        try:
            out: tuple[dict[str, Any], list[Shipped]] = ray.get(ref, timeout=limit)
        except ray.exceptions.RayTaskError as failed:
            raised, remote = _as_raised(failed, self.name)
            raise raised from remote
        except ray.exceptions.RayActorError:
            self._hosts.forget(self)
            raise remote_error(
                self.name, piece, "died while running its slice", _DIED_HINT
            ) from None
        except ray.exceptions.GetTimeoutError:
            self.cancel([token])
            raise remote_error(
                self.name, piece, f"did not finish its slice within {limit:.3g} s", _TIMEOUT_HINT
            ) from None
        except BaseException:  # Ctrl-C while waiting here: the slice stops there too.
            self.cancel([token])
            raise
        return out

    def cancel(self, tokens: list[str]) -> None:
        ray = self._hosts.ray
        wait = min(self._hosts.timeout, CANCEL_WAIT)
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


# The terminal colours Ray puts in what it prints: a note is read anywhere.
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def _as_raised(failed: Any, host: str) -> tuple[BaseException, RemoteTraceback | None]:
    """The node's own exception out of Ray's wrapper, noted with its host, and the remote
    traceback to raise it from; Ray's wrapper itself, and no traceback of its own, when the
    exception could not travel."""
    cause = getattr(failed, "cause", None)
    if not isinstance(cause, BaseException):
        return failed, None
    notes = getattr(cause, "__notes__", None)
    # The engine on the host named the node; say where that was, in the same note.
    named = [at for at, note in enumerate(notes or []) if note.startswith("raised in soma node ")]
    if notes and named:
        notes[named[-1]] += f" on host `{host}`"
    else:
        cause.add_note(f"raised on host `{host}`")
    # What Ray prints for the failure: the task, and the traceback on the host.
    return cause, RemoteTraceback(host, _COLOURS.sub("", str(failed)).rstrip())


class RayHosts:
    """The Ray transport: host ``name`` is the Ray node(s) offering the custom resource
    ``soma-host:<name>``; each host is served by one threaded actor there.

    Ray is used as the program set it up: if it is not initialised yet, ``ray.init(address)``
    is called on first use (``address=None`` means Ray's own default: the ``RAY_ADDRESS``
    environment variable, or a running local cluster, or a new one). ``timeout`` bounds each
    trip to a host, in seconds, when ``forward`` is given none; ``start_timeout`` bounds
    starting a host's actor and sending it a graph's slices (a busy node may take seconds).
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
        """Drops a host whose actor died: the next run there starts a new one."""
        with self._lock:
            if self._hosts.get(host.name) is host:
                del self._hosts[host.name]

    def actor_node_id(self, name: str) -> str:
        """The Ray node id the actor of host ``name`` runs on."""
        host = self.host(name)
        assert isinstance(host, _RayHost)
        return str(self.ray.get(host.actor.node_id.remote(), timeout=self.start_timeout))
