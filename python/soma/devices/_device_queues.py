"""Device queues per branch: two branches placed on one GPU put their work on device queues of
their own, and a value that passes from one queue to another is synchronized by an event, never
by a device-wide synchronize.

A *device queue* is what CUDA and torch call a *stream*: an ordered queue of work on one device,
whose work runs after what was put on it before and alongside another queue's. Soma says
"queue" so that "stream" means only a stream of items (``g.map``, ``soma._run.stream``).

The glue (``device_queues.rs``) drives this module, and only for a forward whose graph places a
node on a device whose backend offers queues (:meth:`soma.devices.Backend.queues`): any other
forward never calls it.

- :func:`root`, once per forward on the caller's thread: the caller's current queue on each
  device the graph places nodes on. The nodes outside every wave run on those, as they would
  without Soma.
- :meth:`Scope.fork`, once per wave on the thread that reached it: an event recorded on each of
  the queues the enclosing branch (or the caller) has, marking the work put there before the wave
  — the values its branches read.
- :meth:`Wave.branch`, once per branch on the thread that runs it: a :class:`Branch`, with no
  queue of its own until one of its nodes is placed on a device; the first such node makes its
  queue on that device, which waits on the fork's event before any of its work.
- :meth:`Scope.enter`, around every placed node: the node's device current (as
  :func:`soma.devices._enter` does) and, while it runs, the branch's queues current on their
  devices — every device the branch has a queue on, not only the node's own, so that a copy
  from another device waits on the queue that made the value. What the thread had current is
  put back when the node returns, so between nodes and after its branch a lent thread has its
  own queues back.
- :meth:`Branch.close`, when the branch ends: an event recorded on each queue the branch made,
  and the enclosing queue on that device waits on it — the join and whatever follows the wave
  run after the branch's work.

The fork's events are recorded when the wave starts, not when a branch first needs them, so
that a sibling's join (which makes the enclosing queue wait) never holds another sibling back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from soma import devices

Restore = Callable[[], None]


def _hooks(device: str) -> devices.QueueHooks | None:
    """The queue hooks of the backend that serves ``device``'s kind, if it offers them."""
    kind = device.partition(":")[0]
    served = devices.backend(kind)
    if served is None:
        return None
    offered = getattr(served, "queues", None)
    return offered(kind) if offered is not None else None


class Scope:
    """Where a node runs: the caller's queues (:class:`Root`) or a branch's (:class:`Branch`).

    ``queues`` maps each device to the queue its work goes on in this scope, with the hooks
    that drive it. Changed only by this scope's own nodes, which never run while one of its
    waves does: its branches read it from their threads unguarded.
    """

    __slots__ = ("queues",)

    def __init__(self, queues: dict[str, tuple[devices.QueueHooks, Any]]) -> None:
        self.queues = queues

    def fork(self) -> Wave:
        """A wave about to start here: an event on each of this scope's queues."""
        return Wave(
            self,
            {device: hooks.record(queue) for device, (hooks, queue) in self.queues.items()},
        )

    def enter(self, device: str) -> Restore | None:
        """Makes ``device`` current for a node about to run here; returns what puts back the
        thread's own, or ``None`` when there is nothing to put back."""
        return devices._enter(device)


class Root(Scope):
    """The caller's own queues: nodes outside every wave run on them, and nothing changes."""

    __slots__ = ()


class Wave:
    """A wave's fork: the scope it was reached in, and an event per device marking the work put
    on its queue there before it."""

    __slots__ = ("events", "parent")

    def __init__(self, parent: Scope, events: dict[str, Any]) -> None:
        self.parent = parent
        self.events = events

    def branch(self) -> Branch:
        """A branch of this wave, about to start on the calling thread."""
        return Branch(self)


class Branch(Scope):
    """One branch of a wave: a queue of its own on each device one of its nodes is placed on,
    made when the first one runs."""

    __slots__ = ("own", "wave")

    def __init__(self, wave: Wave) -> None:
        super().__init__(dict(wave.parent.queues))
        self.wave = wave
        self.own: dict[str, tuple[devices.QueueHooks, Any]] = {}

    def enter(self, device: str) -> Restore | None:
        if device not in self.own:
            hooks = _hooks(device)
            if hooks is not None:
                queue = hooks.new_queue(device)
                event = self.wave.events.get(device)
                if event is not None:
                    hooks.wait(queue, event)
                self.own[device] = self.queues[device] = (hooks, queue)
        restore_device = devices._enter(device)
        had = [
            (device, hooks, hooks.current_queue(device))
            for device, (hooks, _) in self.queues.items()
        ]
        for device, (hooks, queue) in self.queues.items():
            hooks.set_queue(device, queue)

        def restore() -> None:
            for device, hooks, queue in had:
                hooks.set_queue(device, queue)
            if restore_device is not None:
                restore_device()

        return restore

    def close(self) -> None:
        """The branch has ended: the enclosing queue on each of its devices waits on its work."""
        outer = self.wave.parent.queues
        for device, (hooks, queue) in self.own.items():
            event = hooks.record(queue)
            enclosing = outer.get(device)
            if enclosing is not None:
                hooks.wait(enclosing[1], event)


def root(placed: list[str]) -> Root | None:
    """The scope of a forward whose graph places nodes on ``placed``, on the caller's thread;
    ``None`` when no backend offers queues for any of them (then nothing here runs again)."""
    queues = {}
    for device in placed:
        hooks = _hooks(device)
        if hooks is not None:
            queues[device] = (hooks, hooks.current_queue(device))
    return Root(queues) if queues else None
