"""Devices: the backends that make a placed node's device current on its thread while it runs.

A node placed with ``.on("cuda:1")`` or ``g.place(id, "cuda:1")`` runs with its device current on
the thread that runs it — for torch, ``torch.cuda.current_device() == 1`` — and the device that
was current before is put back as soon as the node returns or raises. It is set per node, not
per branch: between nodes, and after its branch, a thread has current what it had before, and a
node never sees the device of the node before it. Unplaced nodes cost nothing here.

Which device is current is each library's own per-thread state, so it is set through a
*backend*: an object with ``kinds`` (the device kinds it serves, as torch spells them), and
``current(kind)`` and ``set(device)``. torch's is registered on first use when torch is already
imported (Soma never imports torch); a user registers another (JAX, CuPy) with :func:`register`.
Kinds no backend serves (``cpu``, ``meta``, ``mps``: one device each) are recorded and passed on
(``ctx.device``) but set nowhere.

A backend may also offer *device queues* — ordered queues of work on one device, what CUDA and
torch call *streams* (Soma keeps that word for ``g.map``): ``queues(kind)`` returns
:class:`QueueHooks` for the kind, or ``None``. Then two branches of a wave placed on one device
put their work on queues of their own, and values pass between queues by events: each branch's
queue waits on an event recorded where the wave started, and the queue the wave was reached on
waits on an event recorded at the end of each branch — never a device-wide synchronize. torch's
backend offers its streams as queues for ``cuda`` (and ``xpu``) when that runtime is available;
``soma.devices._device_queues`` says the rules.

>>> class Recorder:
...     kinds = ("xpu",)
...     def __init__(self) -> None:
...         self.now = "xpu:0"
...     def current(self, kind: str) -> str | None:
...         return self.now
...     def set(self, device: str) -> None:
...         self.now = device
>>> recorder = Recorder()
>>> register(recorder)
>>> backend("xpu") is recorder
True
>>> unregister(recorder)
>>> backend("xpu") is None
True
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["Backend", "QueueHooks", "backend", "register", "unregister"]


@runtime_checkable
class Backend(Protocol):
    """What Soma asks of a library to make a device current on the calling thread. A backend
    that also has ``queues(kind) -> QueueHooks | None`` gives branches device queues of their
    own."""

    kinds: tuple[str, ...]
    """The device kinds this backend serves, as torch spells them: ``("cuda",)``."""

    def current(self, kind: str) -> str | None:
        """The device of ``kind`` current on the calling thread (``"cuda:0"``), or ``None``
        when there is none to put back."""
        ...

    def set(self, device: str) -> None:
        """Makes ``device`` (``"cuda:1"``) current on the calling thread."""
        ...


class QueueHooks(Protocol):
    """What Soma asks of a library to give a branch device queues of its own (CUDA's streams),
    and to pass values between queues by events. A backend offers them by a method
    ``queues(kind) -> QueueHooks | None``; a backend without it has no device queues.

    Queues and events are the library's own objects (a ``torch.cuda.Stream``), passed back to it
    untouched. Every call but ``current_queue`` and ``set_queue`` may come from any thread.
    """

    def current_queue(self, device: str) -> Any:
        """The queue current on ``device`` for the calling thread."""
        ...

    def new_queue(self, device: str) -> Any:
        """A queue on ``device`` for one branch (from a pool, where the library keeps one)."""
        ...

    def set_queue(self, device: str, queue: Any) -> None:
        """Makes ``queue`` current on ``device`` for the calling thread, and leaves which
        device is current as it was."""
        ...

    def record(self, queue: Any) -> Any:
        """An event recorded on ``queue``: done once the work put there so far is."""
        ...

    def wait(self, queue: Any, event: Any) -> None:
        """Makes the work put on ``queue`` from now on wait for ``event``, without blocking
        the calling thread."""
        ...


_lock = threading.Lock()
_backends: dict[str, Backend] = {}
_torch_registered = False


def register(backend: Backend) -> None:
    """Serves each of ``backend.kinds`` with ``backend`` from now on, in place of whichever
    backend served it before (torch's included)."""
    if not isinstance(backend, Backend):
        raise TypeError(
            f"an object of type `{type(backend).__name__}` is not a device backend\n"
            "hint: give it `kinds` (a tuple of device kinds), `current(kind)` and `set(device)`"
        )
    _torch_backend()  # Registered first, so that a user's backend replaces it, never the reverse.
    with _lock:
        for kind in backend.kinds:
            _backends[kind] = backend


def unregister(backend: Backend) -> None:
    """Stops serving with ``backend`` every kind it serves now."""
    with _lock:
        for kind in [kind for kind, served in _backends.items() if served is backend]:
            del _backends[kind]


def backend(kind: str) -> Backend | None:
    """The backend that serves ``kind`` (``"cuda"``), or ``None``."""
    _torch_backend()
    return _backends.get(kind)


def _torch_backend() -> None:
    """Registers torch's backend the first time it is needed once torch is imported."""
    global _torch_registered
    if _torch_registered or sys.modules.get("torch") is None:
        return
    with _lock:
        if _torch_registered:
            return
        _torch_registered = True
        torch = _TorchBackend()
        for kind in torch.kinds:
            _backends.setdefault(kind, torch)


class _TorchBackend:
    """torch's current CUDA and XPU device, per thread."""

    kinds: tuple[str, ...] = ("cuda", "xpu")

    def __init__(self) -> None:
        import torch

        self._torch: Any = torch

    def current(self, kind: str) -> str | None:
        # Initialises the runtime if nothing has yet; setting the device would anyway.
        return f"{kind}:{getattr(self._torch, kind).current_device()}"

    def set(self, device: str) -> None:
        kind, _, index = device.partition(":")
        getattr(self._torch, kind).set_device(int(index))

    def queues(self, kind: str) -> QueueHooks | None:
        """torch's streams, as device queues, and events on ``kind``, when its runtime is there
        (a build without CUDA has none, and a CPU or ``meta`` device never gets here)."""
        runtime = getattr(self._torch, kind)
        return _TorchQueues(runtime) if runtime.is_available() else None


class _TorchQueues:
    """torch's streams (Soma's device queues) and events for one device kind (``torch.cuda``,
    ``torch.xpu``).

    Not run on a GPU where it was written (none was lent): the guide says what to check.
    """

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def current_queue(self, device: str) -> Any:
        return self._runtime.current_stream(_index(device))

    def new_queue(self, device: str) -> Any:
        # From torch's pool of streams per device: cheap, and reused round-robin.
        return self._runtime.Stream(device=_index(device))

    def set_queue(self, device: str, queue: Any) -> None:
        # torch's `set_stream` also makes the stream's device current: put that back.
        before = self._runtime.current_device()
        self._runtime.set_stream(queue)
        if before != _index(device):
            self._runtime.set_device(before)

    def record(self, queue: Any) -> Any:
        return queue.record_event()

    def wait(self, queue: Any, event: Any) -> None:
        queue.wait_event(event)


def _index(device: str) -> int:
    """The index of ``cuda:1``."""
    return int(device.partition(":")[2])


def _enter(device: str) -> Callable[[], None] | None:
    """Makes ``device`` current on this thread, and returns what puts back the device that was
    current before — or ``None`` when no backend serves its kind, or it was current already.
    Called by the glue around every placed node."""
    kind = device.partition(":")[0]
    served = backend(kind)
    if served is None:
        return None
    before = served.current(kind)
    if before == device:
        return None
    served.set(device)
    if before is None:
        return None
    return lambda: served.set(before)
