"""A torch model split over two branches, run on the CPU: a shared trunk, then two heads side
by side, each on a thread of its own, then the two outputs joined.

    Trunk >> (Classifier | Regressor) >> Join

Every node is placed with ``.on("cpu")`` (``ctx.device`` says so, and each output is checked to
be there), and the graph runs inside the caller's ``torch.inference_mode()``: the branches run on
other threads, and torch keeps inference mode per thread, yet both heads run in it, because every
branch runs in its caller's context. The script prints what each head saw and the output shape.
It needs torch: ``make test-torch`` installs it into .venv; then run
``.venv/bin/python examples/torch_two_branches.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn

import soma

torch.manual_seed(0)


class Layer(soma.Node):
    """A torch module as a node; remembers the thread it ran on and whether it saw inference
    mode, to show them afterwards."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.seen: dict[str, Any] = {}

    def forward(self, x: torch.Tensor, ctx: soma.Ctx) -> torch.Tensor:
        self.seen = {
            "device": ctx.device,
            "inference mode": torch.is_inference_mode_enabled(),
            "thread": threading.current_thread().name,
        }
        return self.module(x.to(ctx.device or x.device))


class Join(soma.Node):
    """Both heads' outputs side by side."""

    def forward(self, heads: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([heads["classifier"], heads["regressor"]], dim=-1)


def main() -> None:
    trunk = Layer(nn.Sequential(nn.Linear(64, 256), nn.ReLU())).named("trunk")
    classifier = Layer(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
    regressor = Layer(nn.Sequential(nn.Linear(256, 128), nn.Tanh(), nn.Linear(128, 1)))
    g = soma.Graph.somatize(
        (trunk >> (classifier.named("classifier") | regressor.named("regressor")) >> Join()).on(
            "cpu"
        )
    )
    print(g.plan())
    with torch.inference_mode():
        out = g.forward(torch.randn(32, 64))
    for name, node in (("trunk", trunk), ("classifier", classifier), ("regressor", regressor)):
        print(f"{name}: {node.seen}")
    assert classifier.seen["inference mode"]
    assert regressor.seen["inference mode"]
    assert out.shape == (32, 11)
    print(f"output: {tuple(out.shape)} on {out.device}, inference tensor: {out.is_inference()}")


if __name__ == "__main__":
    main()
