"""Every branch runs in its caller's context: the ``contextvars`` of the thread that reached its
wave, a copy per branch (as ``asyncio.to_thread`` gives), on whichever thread runs it — the
caller's own included. What a branch sets is its own: seen neither by its siblings, nor by the
code after the wave, nor by the next branch its thread is lent to.

Branches that must be on different threads meet at a barrier first (see ``conftest.Meet``).
torch's grad mode, inference mode and autocast, carried the same way, are tested in
``tests/with_torch/`` (``make test-torch``).
"""

from __future__ import annotations

import contextvars
import gc
import threading
import time
import weakref
from typing import Any

import pytest

import soma
from conftest import DEADLINE, run_script

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="default")
HELD: contextvars.ContextVar[object] = contextvars.ContextVar("HELD", default=None)


class Probe(soma.Node):
    """Sets ``VAR`` to ``set`` (when given), meets the others at ``barrier`` (when given), then
    answers what it sees: ``VAR`` and its thread."""

    def __init__(self, set: str | None = None, barrier: threading.Barrier | None = None) -> None:
        self.set = set
        self.barrier = barrier

    def forward(self, x: Any) -> tuple[str, int]:
        if self.set is not None:
            VAR.set(self.set)
        if self.barrier is not None:
            self.barrier.wait()
        return VAR.get(), threading.get_ident()


def in_context(value: str, run: Any, *args: Any, **kwargs: Any) -> Any:
    """``run(*args, **kwargs)`` in a fresh context where ``VAR`` is ``value`` (and ``HELD`` what
    it is in the caller's), as a caller would set them."""

    def call() -> Any:
        VAR.set(value)
        return run(*args, **kwargs)

    return contextvars.copy_context().run(call)


def test_a_contextvar_the_caller_set_is_seen_in_branches_on_other_threads() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(Probe(barrier=barrier).named("a") | Probe(barrier=barrier).named("b"))
    out = in_context("caller", g.forward, None)
    assert out["a"][1] != out["b"][1], "the branches ran on two threads"
    assert (out["a"][0], out["b"][0]) == ("caller", "caller")


def test_a_contextvar_the_caller_set_is_seen_in_the_branches_of_nested_waves() -> None:
    outer = threading.Barrier(2, timeout=DEADLINE)
    inner = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        (Probe(barrier=outer).named("a") >> (Probe(barrier=inner).named("c") | Probe().named("d")))
        | (Probe(barrier=outer).named("b") >> Probe(barrier=inner).named("e"))
    )
    out = in_context("caller", g.forward, None)
    assert {leaf: seen for leaf, (seen, _) in out.items()} == {
        "c": "caller",
        "d": "caller",
        "e": "caller",
    }


def test_a_nested_wave_runs_in_the_context_of_the_branch_around_it() -> None:
    inner = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        (
            Probe(set="branch").named("a")
            >> (Probe(barrier=inner).named("c") | Probe(barrier=inner).named("d"))
        )
        | Probe().named("b")
    )
    out = in_context("caller", g.forward, None)
    assert out["c"][1] != out["d"][1], "the inner branches ran on two threads"
    assert (out["c"][0], out["d"][0], out["b"][0]) == ("branch", "branch", "caller")


def test_what_a_branch_sets_is_not_seen_by_its_siblings() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    # Both set before they meet and read after: each sees its own.
    g = soma.Graph.somatize(
        Probe(set="a", barrier=barrier).named("a") | Probe(set="b", barrier=barrier).named("b")
    )
    out = in_context("caller", g.forward, None)
    assert (out["a"][0], out["b"][0]) == ("a", "b")


def test_siblings_the_caller_runs_one_after_the_other_do_not_see_each_others_changes() -> None:
    # Quick branches: the caller's thread may take every one of them itself, in order.
    g = soma.Graph.somatize(
        Probe(set="a").named("a") | Probe().named("b") | Probe().named("c") | Probe().named("d")
    )
    for _ in range(20):
        out = in_context("caller", g.forward, None)
        assert [out[leaf][0] for leaf in "bcd"] == ["caller"] * 3


def test_the_callers_context_is_unchanged_after_forward_though_it_ran_a_branch_itself() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Probe(set="a", barrier=barrier).named("a") | Probe(set="b", barrier=barrier).named("b")
    )

    def forward_then_look() -> tuple[Any, str]:
        out = g.forward(None)
        return out, VAR.get()

    out, after = in_context("caller", forward_then_look)
    assert threading.get_ident() in {out["a"][1], out["b"][1]}, "the caller ran a branch"
    assert after == "caller"


def test_the_nodes_after_a_wave_see_the_callers_context_not_a_branchs() -> None:
    class Last(soma.Node):
        def forward(self, x: Any) -> str:
            return VAR.get()

    g = soma.Graph.somatize((Probe(set="a").named("a") | Probe(set="b").named("b")) >> Last())
    assert in_context("caller", g.forward, None) == "caller"


def test_a_thread_lent_again_finds_the_new_callers_context_not_what_a_branch_left() -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Probe(barrier=barrier).named("a")
        | (Probe(barrier=barrier).named("b") >> Probe(set="left").named("c"))
    )
    crew_threads = set()
    for caller in ("first", "second", "third"):
        out = in_context(caller, g.forward, None)
        assert out["a"][0] == caller
        assert out["c"][0] == "left"
        crew_threads.add(out["c"][1])
    assert len(crew_threads) == 1, "the same crew thread ran `b` and `c` every time"
    # And on the caller's own thread, outside every branch, nothing a branch set is seen.
    assert VAR.get() == "default"


def test_what_the_nodes_of_a_graph_without_a_wave_set_does_not_reach_the_caller() -> None:
    g = soma.Graph.somatize(Probe(set="chain").named("a") >> Probe().named("b"))

    def forward_then_look() -> tuple[Any, str]:
        return g.forward(None), VAR.get()

    out, after = in_context("caller", forward_then_look)
    assert out[0] == "chain", "a node sees what the node before it in its branch set"
    assert after == "caller"


def test_a_branch_left_running_by_a_timed_out_forward_runs_on_in_the_callers_context() -> None:
    all_in = threading.Barrier(2, timeout=DEADLINE)
    release = threading.Event()
    threading.Timer(DEADLINE, release.set).start()  # a regression fails rather than hangs
    seen: list[str] = []
    done = threading.Event()

    class Fails(soma.Node):
        def forward(self, x: Any) -> Any:
            all_in.wait()
            raise ValueError("the sibling that fails first")

    class Stuck(soma.Node):
        def forward(self, x: Any) -> Any:
            all_in.wait()
            release.wait()
            seen.append(VAR.get())
            done.set()
            return x

    g = soma.Graph.somatize(Fails().named("first") | Stuck().named("stuck"))

    class Held:
        pass

    held = Held()
    kept = weakref.ref(held)
    HELD.set(held)
    try:
        with pytest.raises(TimeoutError):
            in_context("caller", g.forward, None, timeout=0.1)
    finally:
        HELD.set(None)
    del held
    release.set()
    assert done.wait(DEADLINE), "the stuck branch finished once released"
    assert seen == ["caller"]
    deadline = time.monotonic() + DEADLINE
    while kept() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()
    assert kept() is None, "the context the branch ran in was freed once it finished"


def test_a_torch_blocked_in_sys_modules_counts_as_not_loaded() -> None:
    # `sys.modules["torch"] = None` is how a program keeps torch from being imported.
    script = """
import sys
sys.modules["torch"] = None
import soma

class Id(soma.Node):
    def forward(self, x):
        return x

g = soma.Graph.somatize(Id().named("a").on("cuda:0") | Id().named("b"))
assert g.forward(1) == {"a": 1, "b": 1}
print("ran")
"""
    ran = run_script(script)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout == "ran\n"
    assert ran.stderr == "", "nothing reported as unraisable"
