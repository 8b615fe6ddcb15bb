"""Stopping a run whose branches do not stop: Ctrl-C and ``forward(timeout=...)`` return at once,
the nodes still running are left to finish in the background, and the graph runs again."""

from __future__ import annotations

import gc
import math
import textwrap
import threading
import time
import weakref
from typing import Any

import pytest

import soma
from conftest import DEADLINE, interrupt_script

STUCK_SCRIPT = textwrap.dedent(
    """
    import signal
    import threading
    import soma

    signal.signal(signal.SIGINT, signal.default_int_handler)
    release = threading.Event()
    both_in = threading.Barrier(2, timeout=30)

    class Stuck(soma.Node):
        def forward(self, x, ctx):
            both_in.wait()
            if ctx.node == "stuck":
                print("started", flush=True)
            release.wait()
            return x

    class Fails(soma.Node):
        def forward(self, x):
            both_in.wait()
            raise ValueError("the branch that would have set the event")

    class Quick(soma.Node):
        def forward(self, x):
            both_in.wait()
            return x

    state = "{state}"
    first = {{"waiting": Quick(), "after_error": Fails(), "both_stuck": Stuck()}}[state]
    g = soma.Graph.somatize(first.named("first") | Stuck().named("stuck"))
    try:
        g.forward(0)
    except KeyboardInterrupt as stopped:
        print("caught KeyboardInterrupt", flush=True)
        print("notes", getattr(stopped, "__notes__", None) or stopped.args, flush=True)
    else:
        print("finished without interruption", flush=True)
    release.set()
    both_in.reset()
    if state == "after_error":
        try:
            g.forward(1)
        except ValueError:
            print("again: the same error", flush=True)
    else:
        print("again:", g.forward(1), flush=True)
    """
)


@pytest.mark.parametrize("state", ["waiting", "after_error", "both_stuck"])
def test_ctrl_c_returns_while_a_branch_waits_for_something_that_will_never_come(
    state: str,
) -> None:
    child = interrupt_script(STUCK_SCRIPT.format(state=state), "started")
    out, err = child.stdout, child.stderr
    assert "caught KeyboardInterrupt" in out, (out, err)
    # The branch left running is named, and the graph works again once it can.
    assert "`stuck`" in out, out
    assert "again:" in out, (out, err)
    if state != "after_error":
        assert "again: {'first': 1, 'stuck': 1}" in out, out


class Stuck(soma.Node):
    """Meets its siblings, then waits for ``release``."""

    def __init__(self, all_in: threading.Barrier, release: threading.Event) -> None:
        self.all_in = all_in
        self.release = release

    def forward(self, x: Any) -> Any:
        self.all_in.wait()
        self.release.wait()
        return x


class Fails(soma.Node):
    def __init__(self, all_in: threading.Barrier) -> None:
        self.all_in = all_in

    def forward(self, x: Any) -> Any:
        self.all_in.wait()
        raise ValueError("the branch that would have released its sibling")


class Pass(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


def stuck_after_a_failure() -> tuple[soma.Graph, threading.Event]:
    """``first`` fails once both branches are in flight; ``stuck`` then waits until released
    (by the test, or by a timer after the deadline, so that a regression fails instead of hanging
    the suite)."""
    all_in = threading.Barrier(2, timeout=DEADLINE)
    release = threading.Event()
    threading.Timer(DEADLINE, release.set).start()
    graph = soma.Graph.somatize(
        Pass().named("source")
        >> (Fails(all_in).named("first") | Stuck(all_in, release).named("stuck"))
    )
    return graph, release


def test_a_timeout_raises_timeout_error_naming_the_node_still_running() -> None:
    g, release = stuck_after_a_failure()
    with pytest.raises(TimeoutError, match="still running: `stuck`") as timed_out:
        g.forward(0, timeout=0.2)
    assert "did not finish within its timeout of 0.2 s" in str(timed_out.value)
    assert not release.is_set(), "forward waited for the stuck branch to be released"
    release.set()


def test_the_graph_runs_again_at_once_after_a_timeout() -> None:
    g, release = stuck_after_a_failure()
    with pytest.raises(TimeoutError):
        g.forward(0, timeout=0.1)
    release.set()
    # The same nodes, a new run: the first branch's error, as without a timeout.
    with pytest.raises(ValueError, match="released its sibling"):
        g.forward(0, timeout=DEADLINE)


def test_what_a_timed_out_run_held_is_freed_once_its_last_branch_finishes() -> None:
    g, release = stuck_after_a_failure()

    class Payload:
        pass

    payload = Payload()
    held = weakref.ref(payload)
    with pytest.raises(TimeoutError):
        g.forward(payload, timeout=0.1)
    del payload
    gc.collect()
    assert held() is not None, "freed while a branch still reads the run's input"
    release.set()
    deadline = time.monotonic() + DEADLINE
    while held() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()
    assert held() is None, "the run's input was never freed"


def test_a_forward_that_finishes_within_its_timeout_returns_its_result() -> None:
    g = soma.Graph.somatize(Pass().named("a") >> (Pass().named("b") | Pass().named("c")))
    assert g.forward(3, timeout=DEADLINE) == {"b": 3, "c": 3}


class Nap(soma.Node):
    def forward(self, x: Any) -> Any:
        time.sleep(0.05)
        return x


def test_a_timeout_stops_a_chain_at_its_next_node_boundary() -> None:
    expr: Any = Nap().named("n0")
    for i in range(1, 200):
        expr = expr >> Nap().named(f"n{i}")
    g = soma.Graph.somatize(expr)
    with pytest.raises(TimeoutError, match="every branch stopped at a node boundary"):
        g.forward(0, timeout=0.2)


@pytest.mark.parametrize("timeout", [-1.0, math.nan, math.inf])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_refused(timeout: float) -> None:
    g = soma.Graph.somatize(Pass().named("a"))
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
        g.forward(0, timeout=timeout)


class SetsFlag(soma.Node):
    """Sets ``flag`` and records that it ran: a stop from inside the run, at a known node."""

    def __init__(self, flag: soma._soma.StopFlag, ran: list[str]) -> None:
        self.flag = flag
        self.ran = ran

    def forward(self, x: Any, ctx: Any) -> Any:
        self.ran.append(ctx.node)
        if ctx.node == "setter":
            self.flag.set()
        return x


def test_a_set_stop_flag_stops_the_run_at_the_next_node_boundary_with_a_cancelled_error() -> None:
    # How a host stops a slice whose caller gave up on the run (soma.remote).
    flag = soma._soma.StopFlag()
    ran: list[str] = []
    g = soma.Graph.somatize(
        SetsFlag(flag, ran).named("before")
        >> SetsFlag(flag, ran).named("setter")
        >> SetsFlag(flag, ran).named("after")
    )
    with pytest.raises(soma.CancelledError, match="stopped by its stop flag"):
        g._core.forward(0, stop=flag)
    assert ran == ["before", "setter"]
    assert flag.is_set
    assert g._core.forward(0) == 0  # A run without the flag runs on.
