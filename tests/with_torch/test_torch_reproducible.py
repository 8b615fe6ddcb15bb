"""With ``torch.use_deterministic_algorithms(True)``, gradients through a wave are the same bits
from run to run: the wave's branches run on the thread that reached it, one after another in
declared order, since backward sums the gradients a value gets from several branches in the
order of numbers torch's autograd counts per thread — branches side by side on the crew's
threads made that order, and the sum's last bits, change from run to run.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import soma

RUNS = 40


@pytest.fixture
def deterministic() -> Iterator[None]:
    """torch's deterministic algorithms asked for during the test, and switched back after."""
    had = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(had)


class Sum(soma.Node):
    """The heads' outputs added up, in declared order."""

    def forward(self, heads: dict[str, torch.Tensor]) -> torch.Tensor:
        total = heads["h0"]
        for name in ("h1", "h2", "h3"):
            total = total + heads[name]
        return total


def trunk_and_four_heads() -> tuple[soma.Graph, torch.nn.Linear]:
    torch.manual_seed(0)
    trunk = torch.nn.Linear(64, 256)
    heads = [soma.node(torch.nn.Linear(256, 256)).named(f"h{i}") for i in range(4)]
    wave = heads[0] | heads[1] | heads[2] | heads[3]
    g = soma.Graph.somatize(soma.node(trunk).named("trunk") >> wave >> Sum().named("sum"))
    return g, trunk


@pytest.mark.usefixtures("deterministic")
def test_the_trunks_gradient_through_a_wave_of_four_heads_is_the_same_bits_in_every_run() -> None:
    g, trunk = trunk_and_four_heads()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    patterns = set()
    for _ in range(RUNS):
        trunk.zero_grad()
        (g.forward(x) ** 2).sum().backward()
        assert trunk.weight.grad is not None
        patterns.add(tuple(trunk.weight.grad.view(torch.int32).flatten().tolist()))
    assert len(patterns) == 1, f"{len(patterns)} bit patterns of the trunk's gradient"


class Where(soma.Node):
    """Records the thread it ran on, in the order the nodes ran. The first branch waits a
    while for a sibling to run (which its siblings tell it): branches side by side would."""

    def __init__(self, ran: list[tuple[str, int]], name: str, sibling_ran: threading.Event) -> None:
        self.ran = ran
        self.name = name
        self.sibling_ran = sibling_ran

    def forward(self, x: Any) -> str:
        if self.name == "a":
            self.sibling_ran.wait(timeout=0.5)
        else:
            self.sibling_ran.set()
        self.ran.append((self.name, threading.get_ident()))
        return self.name


@pytest.mark.usefixtures("deterministic")
def test_under_determinism_a_waves_branches_run_on_the_callers_thread_in_declared_order() -> None:
    ran: list[tuple[str, int]] = []
    sibling_ran = threading.Event()
    names = ["a", "b", "c", "d"]
    nodes = [Where(ran, name, sibling_ran).named(name) for name in names]
    g = soma.Graph.somatize(nodes[0] | nodes[1] | nodes[2] | nodes[3])
    assert g.forward(None) == {name: name for name in names}
    assert ran == [(name, threading.get_ident()) for name in names]


def test_without_determinism_a_waves_branches_still_run_side_by_side() -> None:
    assert not torch.are_deterministic_algorithms_enabled()
    barrier = threading.Barrier(2, timeout=5.0)

    class Meet(soma.Node):
        def forward(self, x: Any) -> int:
            barrier.wait()  # Both branches at once, or a BrokenBarrierError past the timeout.
            return threading.get_ident()

    out = soma.Graph.somatize(Meet().named("a") | Meet().named("b")).forward(None)
    assert out["a"] != out["b"]


@pytest.mark.usefixtures("deterministic")
def test_under_determinism_an_each_steps_items_run_on_the_callers_thread_in_order() -> None:
    ran: list[tuple[int, int]] = []
    sibling_ran = threading.Event()

    def item(i: int) -> int:
        # The first item waits a while for another to run, as items side by side would.
        if i == 0:
            sibling_ran.wait(timeout=0.5)
        else:
            sibling_ran.set()
        ran.append((i, threading.get_ident()))
        return i

    g = soma.Graph.somatize(soma.each(item))
    assert g.forward([0, 1, 2, 3]) == [0, 1, 2, 3]
    assert ran == [(i, threading.get_ident()) for i in range(4)]
