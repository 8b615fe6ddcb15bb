"""torch's per-thread state, carried from the thread that reached a wave into its branches.

grad mode, inference mode and autocast are thread-local in torch, and a branch runs on a thread
lent to it, so the glue (``torch_state.rs``) carries them, once per wave and only when torch is
already in ``sys.modules``. torch's usual state — inference mode off, autocast off everywhere —
it reads and sets itself, with torch's own functions; for any other it asks this module for
:func:`capture` (or :func:`usual`, for a branch's thread found in another state). Each branch
calls what that returned on its own thread, and calls what *that* returned when the branch
ends, putting its thread's state back — whatever the branch's nodes changed meanwhile. torch is
imported by :func:`capture`, never by importing this module, so the module can be imported (by
a doctest walk, say) without it.

Other torch thread-local state (a ``torch.set_default_device``, dispatch modes, saved-tensor
hooks) is not carried, and behaves as in any thread pool.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

Restore = Callable[[], None]


@functools.cache
def _devices() -> tuple[str, ...]:
    """The device types whose autocast state is carried: of those torch names, the ones this
    build supports."""
    import torch

    available = torch.amp.autocast_mode.is_autocast_available
    return tuple(device for device in ("cpu", "cuda", "xpu", "mps", "hpu") if available(device))


def _any_autocast(torch: Any) -> bool:
    """Whether autocast is on for any device type on this thread: one call where torch has it
    (a private function, so looked up with a fallback), one per device type otherwise."""
    check = getattr(torch._C, "_is_any_autocast_enabled", None)
    if check is not None:
        return bool(check())
    return any(torch.is_autocast_enabled(device) for device in _devices())


class _State:
    """grad mode, inference mode, and autocast: its switch and dtype per device type, and
    whether it caches casts — read only when autocast is on somewhere, which is rare, so that
    the usual state costs three calls to read."""

    __slots__ = ("autocast", "autocast_cache", "grad", "inference")

    def __init__(self, torch: Any) -> None:
        self.grad = torch.is_grad_enabled()
        self.inference = torch.is_inference_mode_enabled()
        # `None`: autocast off for every device type.
        self.autocast: tuple[tuple[bool, Any], ...] | None = None
        self.autocast_cache = True
        if _any_autocast(torch):
            self.autocast = tuple(
                (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
                for device in _devices()
            )
            self.autocast_cache = torch.is_autocast_cache_enabled()

    @classmethod
    def usual(cls, grad: bool) -> _State:
        """torch's usual state, with grad mode ``grad``: inference mode off, and autocast off
        everywhere with its cache on, as torch starts a thread."""
        state = cls.__new__(cls)
        state.grad, state.inference, state.autocast, state.autocast_cache = grad, False, None, True
        return state


def _set_autocast(torch: Any, state: _State) -> None:
    """Sets autocast as ``state`` has it; for a state with autocast off everywhere, switches it
    off everywhere and leaves each dtype as it is (it has no effect while off)."""
    if state.autocast is None:
        for device in _devices():
            torch.set_autocast_enabled(device, False)
    else:
        for device, (enabled, dtype) in zip(_devices(), state.autocast, strict=True):
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(state.autocast_cache)


def capture() -> Callable[[], Restore]:
    """The calling thread's torch state, as a function that sets it on the thread that calls it
    and returns what puts that thread's own back."""
    import torch

    return _carrying(torch, _State(torch))


def usual(grad: bool) -> Callable[[], Restore]:
    """As :func:`capture`, for a caller in torch's usual state — inference mode off, autocast off
    everywhere — with grad mode ``grad``: what the glue reads itself, and asks of this module
    only for a thread that is not in that state."""
    import torch

    return _carrying(torch, _State.usual(grad))


def switch_autocast_off() -> None:
    """Switches autocast off for every device type on this thread, as a thread in torch's usual
    state has it: for a branch whose node switched it on and left it."""
    import torch

    _set_autocast(torch, _State.usual(grad=True))


def _carrying(torch: Any, wanted: _State) -> Callable[[], Restore]:
    """What sets ``wanted`` on the thread that calls it and returns what puts that thread's own
    back."""

    def enter() -> Restore:
        had = _State(torch)
        # Inference mode is a guard in torch, entered and left; it sets grad mode too, so it
        # goes first and grad mode is set after it.
        inference = None
        if had.inference != wanted.inference:
            inference = torch._C._InferenceMode(wanted.inference)
            inference.__enter__()
        torch._C._set_grad_enabled(wanted.grad)
        autocast = wanted.autocast is not None or had.autocast is not None
        if autocast:
            _set_autocast(torch, wanted)
            # As `torch.autocast` does: the casts it caches are dropped when the outermost
            # autocast ends, here when the branch does.
            torch.autocast_increment_nesting()

        def restore() -> None:
            if autocast and torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            # Also when neither side had autocast on: a node may have switched it on and left it.
            if autocast or _any_autocast(torch):
                _set_autocast(torch, had)
            if inference is not None:
                inference.__exit__(None, None, None)
            torch._C._set_grad_enabled(had.grad)

        return restore

    return enter
