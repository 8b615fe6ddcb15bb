"""With torch: a placed node's output is checked against its device, torch's device backend is
there as soon as torch is, and a small model placed on ``meta`` runs end to end, its branches on
threads of their own.

Without a GPU, setting the current CUDA device per node (and device queues per branch) cannot be
run here; ``tests/test_devices.py`` proves the set-and-restore rules with a fake backend.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import soma

DEADLINE = 5.0


class Make(soma.Node):
    """Returns a tensor on ``device``, alone or in the container ``wrap`` makes."""

    def __init__(self, device: str, wrap: Any = None) -> None:
        self.device = device
        self.wrap = wrap

    def forward(self, x: Any) -> Any:
        tensor = torch.zeros(2, device=self.device)
        return tensor if self.wrap is None else self.wrap(tensor)


@pytest.mark.parametrize(
    "wrap",
    [None, lambda t: (t,), lambda t: [t], lambda t: {"out": t}],
    ids=["alone", "tuple", "list", "dict"],
)
def test_a_node_placed_on_meta_that_returns_a_cpu_tensor_fails_naming_both_devices(
    wrap: Any,
) -> None:
    g = soma.Graph.somatize(Make("cpu", wrap).named("head").on("meta"))
    with pytest.raises(soma.WrongDeviceError) as failed:
        g.forward(None)
    assert (failed.value.node, failed.value.declared, failed.value.found) == ("head", "meta", "cpu")
    assert ".to(ctx.device)" in str(failed.value)


def test_a_node_placed_on_the_device_its_tensor_is_on_passes() -> None:
    g = soma.Graph.somatize(Make("meta").named("a").on("meta") | Make("cpu").named("b").on("cpu"))
    out = g.forward(None)
    assert (out["a"].device.type, out["b"].device.type) == ("meta", "cpu")


def test_torchs_device_backend_is_there_once_torch_is_imported() -> None:
    cuda = soma.devices.backend("cuda")
    assert cuda is not None
    assert type(cuda).__name__ == "_TorchBackend"
    assert soma.devices.backend("meta") is None, "meta has no current device to set"


class Linear(soma.Node):
    def __init__(self, module: nn.Module, barrier: threading.Barrier | None = None) -> None:
        self.module = module
        self.barrier = barrier

    def forward(self, x: torch.Tensor, ctx: Any) -> torch.Tensor:
        if self.barrier is not None:
            self.barrier.wait()
        assert x.device.type == ctx.device
        return self.module(x)


class Concat(soma.Node):
    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat(list(x.values()), dim=-1)


def test_a_small_model_on_meta_runs_end_to_end_in_two_branches() -> None:
    with torch.device("meta"):
        trunk, left, right = nn.Linear(16, 32), nn.Linear(32, 8), nn.Linear(32, 4)
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        (
            Linear(trunk).named("trunk")
            >> (Linear(left, barrier).named("left") | Linear(right, barrier).named("right"))
            >> Concat()
        ).on("meta")
    )
    assert set(g.devices().values()) == {"meta"}
    with torch.inference_mode():
        out = g.forward(torch.empty(5, 16, device="meta"))
    assert out.device.type == "meta"
    assert out.shape == (5, 12)
    assert not out.requires_grad
