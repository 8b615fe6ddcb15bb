"""With torch: training through the graph gives the gradients of the same modules run in
sequence — through waves, ``each``, ``switch``, ``loop``, retries and micro-batches — compared
with ``torch.testing.assert_close``; the micro-batches' forward stages overlap.

Each test runs one set of modules twice, through the graph and by hand in sequence, and
compares the loss and every parameter's gradient.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import nn

import soma

DEADLINE = 5.0


def gradients(modules: list[nn.Module], loss: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    """The loss and each parameter's gradient after ``loss().backward()``, from zero."""
    for module in modules:
        module.zero_grad(set_to_none=True)
    value = loss()
    value.backward()
    found = [value.detach()]
    for module in modules:
        for parameter in module.parameters():
            assert parameter.grad is not None, "a parameter the loss depends on has no gradient"
            found.append(parameter.grad.clone())
    return found


def assert_same_gradients(
    modules: list[nn.Module],
    through_graph: Callable[[], torch.Tensor],
    in_sequence: Callable[[], torch.Tensor],
) -> None:
    graph = gradients(modules, through_graph)
    sequence = gradients(modules, in_sequence)
    assert len(graph) == len(sequence)
    for found, expected in zip(graph, sequence, strict=True):
        torch.testing.assert_close(found, expected)


@soma.node
def join(branches: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([branches["left"], branches["right"]], dim=-1)


def test_gradients_through_a_wave_are_the_sequential_models() -> None:
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
    left = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    right = nn.Linear(16, 3)
    m = soma.Graph.somatize(
        soma.node(trunk).named("trunk")
        >> (soma.node(left).named("left") | soma.node(right).named("right"))
        >> join
    ).module()
    x, target = torch.randn(32, 8), torch.randn(32, 7)

    def by_hand() -> torch.Tensor:
        hidden = trunk(x)
        return nn.functional.mse_loss(torch.cat([left(hidden), right(hidden)], dim=-1), target)

    assert_same_gradients(
        [trunk, left, right], lambda: nn.functional.mse_loss(m(x), target), by_hand
    )


def test_gradients_through_each_are_the_sequential_models() -> None:
    torch.manual_seed(0)
    layer = nn.Linear(6, 6)
    m = soma.Graph.somatize(
        soma.node(lambda x: list(x.chunk(4))) >> soma.each(layer) >> torch.cat
    ).module()
    x = torch.randn(16, 6)
    assert_same_gradients(
        [layer],
        lambda: m(x).pow(2).mean(),
        lambda: torch.cat([layer(chunk) for chunk in x.chunk(4)]).pow(2).mean(),
    )


def test_gradients_through_switch_reach_the_case_that_ran_only() -> None:
    torch.manual_seed(0)
    wide, narrow = nn.Linear(8, 2), nn.Linear(8, 2)
    m = soma.Graph.somatize(
        soma.switch(
            lambda x: "wide" if x.shape[0] > 4 else "narrow", {"wide": wide, "narrow": narrow}
        )
    ).module()
    x = torch.randn(6, 8)
    assert_same_gradients([wide], lambda: m(x).sum(), lambda: wide(x).sum())
    narrow.zero_grad(set_to_none=True)
    m(x).sum().backward()
    assert narrow.weight.grad is None


class Refine(soma.Node):
    """A loop's body: one shared layer, applied once per turn, counting the turns."""

    def __init__(self) -> None:
        self.layer = nn.Linear(4, 4)

    def forward(self, state: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, int]:
        x, turns = state
        return torch.tanh(self.layer(x)), turns + 1


def test_gradients_through_loop_accumulate_over_its_turns_as_in_sequence() -> None:
    torch.manual_seed(0)
    refine = Refine()
    m = soma.Graph.somatize(
        soma.node(lambda x: (x, 0))
        >> soma.loop(refine, until=lambda state: state[1] == 3, max_iterations=5)
        >> (lambda state: state[0])
    ).module()
    assert [name for name, _ in m.named_parameters()] == [
        "loop/refine.layer.weight",
        "loop/refine.layer.bias",
    ]
    x = torch.randn(5, 4)

    def by_hand() -> torch.Tensor:
        out = x
        for _ in range(3):
            out = torch.tanh(refine.layer(out))
        return out.sum()

    assert_same_gradients([refine.layer], lambda: m(x).sum(), by_hand)


class Flaky(soma.Node):
    """Fails its first call after doing part of its work, then runs its layer."""

    def __init__(self) -> None:
        self.layer = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        partial = self.layer(x)
        if self.calls == 1:
            raise ConnectionError(f"lost after computing {tuple(partial.shape)}")
        return self.layer(x)


def test_gradients_after_a_retry_are_those_of_the_attempt_that_succeeded() -> None:
    torch.manual_seed(0)
    flaky = Flaky()
    m = soma.Graph.somatize(flaky.retry(1, backoff=0.0, on=(ConnectionError,))).module()
    x = torch.randn(3, 4)
    assert_same_gradients([flaky.layer], lambda: m(x).sum(), lambda: flaky.layer(x).sum())
    assert flaky.calls == 2  # the attempt that failed, then the one that succeeded


def test_gradients_over_micro_batches_are_the_whole_batchs_for_a_mean_loss() -> None:
    torch.manual_seed(0)
    trunk, left, right = nn.Linear(8, 8), nn.Linear(8, 3), nn.Linear(8, 2)
    m = soma.Graph.somatize(
        soma.node(trunk).named("trunk")
        >> (soma.node(left).named("left") | soma.node(right).named("right"))
        >> join
    ).module()
    x, target = torch.randn(64, 8), torch.randn(64, 5)

    def by_hand() -> torch.Tensor:
        hidden = trunk(x)
        return nn.functional.mse_loss(torch.cat([left(hidden), right(hidden)], dim=-1), target)

    assert_same_gradients(
        [trunk, left, right],
        lambda: nn.functional.mse_loss(m(x, micro_batches=4), target),
        by_hand,
    )


def test_the_micro_batches_forward_stages_overlap() -> None:
    # The first stage on the second slice and the second stage on the first meet at a
    # barrier: only a run whose stages overlap gets past it.
    meeting = threading.Barrier(2, timeout=DEADLINE)
    first, second = nn.Linear(4, 4), nn.Linear(4, 4)
    calls = {"first": 0, "second": 0}

    def meet(name: str, at: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: object) -> None:
            calls[name] += 1
            if calls[name] == at:
                meeting.wait()

        return hook

    first.register_forward_pre_hook(meet("first", 2))
    second.register_forward_pre_hook(meet("second", 1))
    m = soma.Graph.somatize(soma.node(first) >> soma.node(second)).module()
    out = m(torch.randn(8, 4), micro_batches=2)
    out.sum().backward()
    assert out.shape == (8, 4)
    assert first.weight.grad is not None


def test_an_optimizer_step_through_the_graph_trains_it_as_in_sequence() -> None:
    torch.manual_seed(0)
    trunk, left, right = nn.Linear(8, 8), nn.Linear(8, 3), nn.Linear(8, 2)
    reference = [nn.Linear(8, 8), nn.Linear(8, 3), nn.Linear(8, 2)]
    for mine, theirs in zip((trunk, left, right), reference, strict=True):
        theirs.load_state_dict(mine.state_dict())
    m = soma.Graph.somatize(
        soma.node(trunk).named("trunk")
        >> (soma.node(left).named("left") | soma.node(right).named("right"))
        >> join
    ).module()
    ours = torch.optim.Adam(m.parameters(), lr=0.01)
    theirs_optimizer = torch.optim.Adam(
        [p for layer in reference for p in layer.parameters()], lr=0.01
    )
    x, target = torch.randn(32, 8), torch.randn(32, 5)
    for _ in range(5):
        ours.zero_grad()
        nn.functional.mse_loss(m(x), target).backward()
        ours.step()
        theirs_optimizer.zero_grad()
        hidden = reference[0](x)
        out = torch.cat([reference[1](hidden), reference[2](hidden)], dim=-1)
        nn.functional.mse_loss(out, target).backward()
        theirs_optimizer.step()
    for mine, theirs in zip((trunk, left, right), reference, strict=True):
        for key, value in mine.state_dict().items():
            torch.testing.assert_close(value, theirs.state_dict()[key])
