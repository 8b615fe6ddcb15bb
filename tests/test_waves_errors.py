"""CU9's Python questionnaire: what stops a wave.

The first declared branch's error wins whatever the clock says, a Rust panic in a branch leaves
the process standing, and Ctrl-C stops a long run soon after the signal.
"""

from __future__ import annotations

import textwrap
import threading
from typing import Any

import pytest

import soma
from conftest import DEADLINE, Add, Double, Meet, Pass, interrupt_script

# ---------------------------------------------------------------------------------------------
# Failures in branches


class Branch(Exception):
    pass


class FailAfter(soma.Node):
    """Waits for `gate` (if any), raises its own error, then opens `opens` (if any)."""

    def __init__(
        self, error: Exception, gate: threading.Event | None, opens: threading.Event | None
    ) -> None:
        self.raised = error
        self.gate = gate
        self.opens = opens

    def forward(self, x: Any) -> Any:
        if self.gate is not None:
            assert self.gate.wait(DEADLINE), "the other branch never failed"
        if self.opens is not None:
            self.opens.set()
        raise self.raised


def test_the_first_declared_branch_error_wins_when_it_fails_first() -> None:
    first_failed = threading.Event()
    first = FailAfter(Branch("first"), gate=None, opens=first_failed).named("first")
    second = FailAfter(Branch("second"), gate=first_failed, opens=None).named("second")
    g = soma.Graph.somatize(Pass() >> (first | second))
    with pytest.raises(Branch) as excinfo:
        g.forward(0)
    assert excinfo.value is first.raised


def test_the_first_declared_branch_error_wins_even_when_it_fails_last() -> None:
    second_failed = threading.Event()
    first = FailAfter(Branch("first"), gate=second_failed, opens=None).named("first")
    second = FailAfter(Branch("second"), gate=None, opens=second_failed).named("second")
    g = soma.Graph.somatize(Pass() >> (first | second))
    with pytest.raises(Branch) as excinfo:
        g.forward(0)
    assert excinfo.value is first.raised
    assert any("`first`" in note for note in excinfo.value.__notes__)


def test_a_branch_that_succeeds_does_not_hide_a_later_branchs_error() -> None:
    failing = FailAfter(Branch("late"), gate=None, opens=None).named("late")
    g = soma.Graph.somatize(Pass() >> ((Add(1) >> Double()) | failing))
    with pytest.raises(Branch) as excinfo:
        g.forward(0)
    assert excinfo.value is failing.raised


def test_a_rust_panic_in_a_branch_is_panic_error_and_the_process_survives() -> None:
    g = soma.Graph.somatize(Pass() >> ((Add(1) >> Double()) | soma.native.Panic("in a branch")))
    with pytest.raises(soma.PanicError, match="in a branch"):
        g.forward(0)
    barrier = threading.Barrier(2, timeout=DEADLINE)
    after = soma.Graph.somatize(Meet(barrier).named("x") | Meet(barrier).named("y"))
    assert after.forward(1) == {"x": 1, "y": 1}


# ---------------------------------------------------------------------------------------------
# Ctrl-C


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import signal
    import time
    import soma

    # Whatever the parent did with SIGINT, this child turns it into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    ran = []

    class Nap(soma.Node):
        def forward(self, x, ctx):
            ran.append(ctx.node)
            if len(ran) == 1:
                print("started", flush=True)
            time.sleep(0.05)
            return x

    def chain(prefix, n):
        expr = Nap().named(prefix + "0")
        for i in range(1, n):
            expr = expr >> Nap().named(prefix + str(i))
        return expr

    class Quick(soma.Node):
        def forward(self, x):
            return x

    shape = "{shape}"
    if shape == "chain":
        expr = chain("n", 400)
    elif shape == "wave":
        expr = chain("l", 400) | chain("r", 400)
    else:
        # The calling thread's own branch ends at once; it only waits on the other, on its own
        # thread, where Python never runs signal handlers: only the engine can notice Ctrl-C.
        expr = Quick() | chain("r", 400)
    g = soma.Graph.somatize(expr)
    try:
        g.forward(0)
    except KeyboardInterrupt:
        print("caught KeyboardInterrupt after", len(ran), "nodes", flush=True)
    else:
        print("finished without interruption", flush=True)
    """
)


@pytest.mark.parametrize("shape", ["chain", "wave", "waiting"])
def test_ctrl_c_stops_a_long_forward_with_keyboard_interrupt(shape: str) -> None:
    child = interrupt_script(CTRL_C_SCRIPT.format(shape=shape), "started")
    out, err = child.stdout, child.stderr
    assert "caught KeyboardInterrupt" in out, (out, err)
    nodes_ran = int(out.split("after")[1].split()[0])
    # Each node naps 50 ms and the whole run would take 20 s: stopping within 100 nodes (5 s)
    # is stopping at a node boundary soon after the signal, with room for a slow machine.
    assert nodes_ran < (200 if shape == "wave" else 100), out
