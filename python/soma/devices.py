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

__all__ = ["Backend", "backend", "register", "unregister"]


@runtime_checkable
class Backend(Protocol):
    """What Soma asks of a library to make a device current on the calling thread."""

    #: The device kinds this backend serves, as torch spells them: ``("cuda",)``.
    kinds: tuple[str, ...]

    def current(self, kind: str) -> str | None:
        """The device of ``kind`` current on the calling thread (``"cuda:0"``), or ``None``
        when there is none to put back."""
        ...

    def set(self, device: str) -> None:
        """Makes ``device`` (``"cuda:1"``) current on the calling thread."""
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
