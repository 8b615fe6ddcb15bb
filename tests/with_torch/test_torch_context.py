"""With torch loaded, every branch runs in its caller's torch state: grad mode, inference mode
and autocast, which torch keeps per thread, are carried from the thread that reached a wave into
each branch, on whichever thread runs it; what a branch changes is its own, and its thread's
state is put back when it ends.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from typing import Any

import torch

import soma

DEADLINE = 5.0


class Probe(soma.Node):
    """Meets the others at ``barrier`` (so that the branches are on different threads), runs
    ``before`` if given, then answers the torch state it sees and its thread."""

    def __init__(self, barrier: threading.Barrier | None = None, before: Any = None) -> None:
        self.barrier = barrier
        self.before = before

    def forward(self, x: Any) -> dict[str, Any]:
        if self.before is not None:
            self.before()
        if self.barrier is not None:
            self.barrier.wait()
        return {
            "grad": torch.is_grad_enabled(),
            "inference": torch.is_inference_mode_enabled(),
            "autocast": torch.is_autocast_enabled("cpu"),
            "autocast_dtype": torch.get_autocast_dtype("cpu"),
            "thread": threading.get_ident(),
        }


def two_branches(before: Any = None) -> soma.Graph:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    return soma.Graph.somatize(Probe(barrier, before).named("a") | Probe(barrier).named("b"))


def on_two_threads(out: dict[str, Any]) -> dict[str, Any]:
    assert out["a"]["thread"] != out["b"]["thread"], "the branches ran on two threads"
    return out


def test_no_grad_around_forward_is_seen_in_every_branch() -> None:
    g = two_branches()
    with torch.no_grad():
        out = on_two_threads(g.forward(None))
    assert (out["a"]["grad"], out["b"]["grad"]) == (False, False)
    out = on_two_threads(g.forward(None))
    assert (out["a"]["grad"], out["b"]["grad"]) == (True, True)


def test_a_tensor_computed_in_a_branch_under_the_callers_no_grad_keeps_no_graph() -> None:
    weight = torch.ones(3, requires_grad=True)

    class Scale(soma.Node):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * weight

    g = soma.Graph.somatize(Scale().named("a") | Scale().named("b"))
    with torch.no_grad():
        out = g.forward(torch.ones(3))
    assert not out["a"].requires_grad
    assert not out["b"].requires_grad
    out = g.forward(torch.ones(3))
    assert out["a"].requires_grad
    assert out["b"].requires_grad


def test_inference_mode_around_forward_is_seen_in_every_branch() -> None:
    g = two_branches()
    with torch.inference_mode():
        out = on_two_threads(g.forward(None))
    assert (out["a"]["inference"], out["b"]["inference"]) == (True, True)
    assert (out["a"]["grad"], out["b"]["grad"]) == (False, False)
    out = on_two_threads(g.forward(None))
    assert (out["a"]["inference"], out["b"]["inference"]) == (False, False)


def test_autocast_around_forward_is_seen_in_every_branch_with_its_dtype() -> None:
    g = two_branches()
    with torch.autocast("cpu", dtype=torch.float16):
        out = on_two_threads(g.forward(None))
    assert (out["a"]["autocast"], out["b"]["autocast"]) == (True, True)
    assert (out["a"]["autocast_dtype"], out["b"]["autocast_dtype"]) == (
        torch.float16,
        torch.float16,
    )
    out = on_two_threads(g.forward(None))
    assert (out["a"]["autocast"], out["b"]["autocast"]) == (False, False)


def test_a_matmul_in_a_branch_runs_in_the_callers_autocast_dtype() -> None:
    class MatMul(soma.Node):
        def forward(self, x: torch.Tensor) -> torch.dtype:
            return (x @ x).dtype

    barrier = threading.Barrier(2, timeout=DEADLINE)

    class Meet(soma.Node):
        def forward(self, x: Any) -> Any:
            barrier.wait()
            return x

    g = soma.Graph.somatize(
        (Meet().named("m1") >> MatMul().named("a")) | (Meet().named("m2") >> MatMul().named("b"))
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = g.forward(torch.ones(4, 4))
    assert out == {"a": torch.bfloat16, "b": torch.bfloat16}


def test_what_a_branch_changes_is_seen_neither_by_its_sibling_nor_by_the_caller() -> None:
    g = two_branches(before=lambda: torch.set_grad_enabled(False))
    out = on_two_threads(g.forward(None))
    assert (out["a"]["grad"], out["b"]["grad"]) == (False, True)
    assert torch.is_grad_enabled(), "the caller's grad mode is its own"


def test_a_thread_lent_again_finds_the_new_callers_state_not_what_a_branch_left() -> None:
    # `b` runs on a crew thread; it turns grad mode off on its thread and leaves it so.
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Probe(barrier).named("a")
        | (
            Probe(barrier).named("b")
            >> Probe(before=lambda: torch.set_grad_enabled(False)).named("c")
        )
    )
    threads = set()
    for _ in range(3):
        out = g.forward(None)
        assert out["a"]["grad"]
        assert not out["c"]["grad"]
        threads.add(out["c"]["thread"])
    with torch.no_grad():
        out = g.forward(None)
    assert not out["a"]["grad"]
    out = g.forward(None)
    assert out["a"]["grad"]
    assert len(threads) == 1, "one crew thread was lent every time"


def test_nested_waves_carry_the_state_of_the_branch_around_them() -> None:
    inner = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        (
            Probe(before=lambda: torch.set_grad_enabled(False)).named("a")
            >> (Probe(inner).named("c") | Probe(inner).named("d"))
        )
        | Probe().named("b")
    )
    out = g.forward(None)
    assert out["c"]["thread"] != out["d"]["thread"]
    assert (out["c"]["grad"], out["d"]["grad"], out["b"]["grad"]) == (False, False, True)
    assert torch.is_grad_enabled()


def test_autocast_a_node_switches_on_and_leaves_on_ends_with_its_branch() -> None:
    switching = [True]

    def switch_on() -> None:
        if switching[0]:
            torch.set_autocast_enabled("cpu", True)

    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Probe(barrier, before=switch_on).named("a")
        | (Probe(barrier, before=switch_on).named("b") >> Probe().named("c"))
    )
    out = g.forward(None)
    assert out["a"]["thread"] != out["c"]["thread"], "the branches ran on two threads"
    assert out["a"]["autocast"], "the node's own change holds in its branch"
    assert out["c"]["autocast"], "and for the nodes after it in its branch"
    assert not torch.is_autocast_enabled("cpu"), "not after the branch, on the caller's thread"
    switching[0] = False
    again = g.forward(None)
    assert again["c"]["thread"] == out["c"]["thread"], "the same crew thread, lent again"
    assert (again["a"]["autocast"], again["c"]["autocast"]) == (False, False)


def test_a_thread_a_node_left_in_inference_mode_runs_its_next_branch_in_the_callers_state() -> None:
    # `b` enters inference mode on its crew thread and never leaves it (the guard is kept alive,
    # as a node that stores it would): the next branch that thread runs must not inherit it.
    kept: list[Any] = []

    def enter_inference() -> None:
        if not kept:
            guard = torch.inference_mode()
            guard.__enter__()
            kept.append(guard)

    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Probe(barrier).named("a") | (Probe(barrier, before=enter_inference).named("b"))
    )
    first = on_two_threads(g.forward(None))
    assert first["b"]["inference"], "the node's own change holds in its branch"
    again = on_two_threads(g.forward(None))
    assert again["b"]["thread"] == first["b"]["thread"], "the same crew thread, lent again"
    assert (again["b"]["inference"], again["b"]["grad"]) == (False, True)
    assert not torch.is_inference_mode_enabled()


def test_what_a_node_outside_every_wave_changes_does_not_reach_the_caller() -> None:
    # No wave: `a` and `b` run on the caller's own thread, in a forward of its own.
    g = soma.Graph.somatize(
        Probe(before=lambda: torch.set_grad_enabled(False)).named("a") >> Probe().named("b")
    )
    assert not g.forward(None)["grad"], "`b` sees what `a` set, as in a function"
    assert torch.is_grad_enabled()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g.forward(None)
        assert torch.is_grad_enabled()
        assert torch.is_autocast_enabled("cpu")


def test_torch_imported_after_a_forward_is_carried_from_the_next_forward_on() -> None:
    # In a fresh interpreter: forwards without torch first (Soma then stops looking for it
    # until `sys.modules` changes), then torch imported, then `no_grad` around a forward.
    program = textwrap.dedent(
        """
        import sys, threading
        import soma

        barrier = threading.Barrier(2, timeout=5)

        class Grad(soma.Node):
            def forward(self, x):
                barrier.wait()
                torch = sys.modules.get("torch")
                return None if torch is None else torch.is_grad_enabled()

        g = soma.Graph.somatize(Grad().named("a") | Grad().named("b"))
        assert g.forward(None) == {"a": None, "b": None}
        assert g.forward(None) == {"a": None, "b": None}
        import torch
        with torch.no_grad():
            assert g.forward(None) == {"a": False, "b": False}, g.forward(None)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def test_in_a_stream_each_item_carries_its_torch_state_from_stage_to_stage() -> None:
    class SwitchOff(soma.Node):
        def forward(self, x: int) -> list[Any]:
            seen = torch.is_grad_enabled()
            torch.set_grad_enabled(False)
            return [x, seen]

    class Read(soma.Node):
        def forward(self, pair: list[Any]) -> list[Any]:
            return [*pair, torch.is_grad_enabled(), torch.is_autocast_enabled("cpu")]

    g = soma.Graph.somatize(SwitchOff().named("off") >> Read().named("read"))
    # `off` sees the caller's state for every item, whatever the item before left on its thread;
    # `read`, on a thread of its own, sees what `off` left for the same item, as in forward.
    assert list(g.map(range(4))) == [[i, True, False, False] for i in range(4)]
    assert g.forward(0) == [0, True, False, False]
    assert torch.is_grad_enabled(), "the caller's grad mode is its own"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert list(g.map(range(2))) == [[i, True, False, True] for i in range(2)]
    with torch.no_grad():
        slices = g.forward([0, 1], micro_batches=2, join=list)
    assert slices == [[[0], False, False, False], [[1], False, False, False]]
