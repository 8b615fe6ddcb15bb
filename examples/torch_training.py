"""Training a two-branch model through a graph, saving it, and evaluating it in a fresh process.

    encoder >> (classifier | regressor) >> heads

The layers are plain torch modules and the join a plain function: ``soma.node`` makes nodes of
them, and ``g.module()`` makes the graph one ``nn.Module`` — its parameters for the optimizer,
``train()``/``eval()``, a ``state_dict`` — whose forward runs the graph, the two heads on two
threads. The script trains it for a few steps on synthetic data, each batch in four
micro-batches whose stages overlap, saves the ``state_dict``, then starts a fresh Python that
builds the same graph, loads the weights and evaluates: it must see the loss the trainer saw.
It needs torch: ``make test-torch`` installs it into .venv; then run
``.venv/bin/python examples/torch_training.py``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import soma

FEATURES, CLASSES, STEPS = 16, 3, 60


@soma.node
def heads(outputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Both heads' outputs side by side: the class scores, then the regression."""
    return torch.cat([outputs["classifier"], outputs["regressor"]], dim=-1)


def build() -> soma.GraphModule:
    """The model: the same graph in the trainer and in the process that evaluates it."""
    graph = soma.Graph.somatize(
        soma.node(nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU())).named("encoder")
        >> (
            soma.node(nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, CLASSES))).named(
                "classifier"
            )
            | soma.node(nn.Linear(64, 1)).named("regressor")
        )
        >> heads
    )
    return graph.module()


def batch(seed: int, size: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic data: the class is the largest of the first three features, the target their
    sum."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, FEATURES, generator=generator)
    return x, x[:, :CLASSES].argmax(dim=1), x[:, :CLASSES].sum(dim=1)


def loss_of(out: torch.Tensor, labels: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out[:, :CLASSES], labels) + nn.functional.mse_loss(
        out[:, CLASSES], targets
    )


def evaluate(model: soma.GraphModule) -> tuple[float, float]:
    """The held-out batch's loss and accuracy, in eval mode, without gradients."""
    model.eval()
    x, labels, targets = batch(seed=10_000)
    with torch.no_grad():
        out = model(x)
    accuracy = (out[:, :CLASSES].argmax(dim=1) == labels).float().mean()
    return loss_of(out, labels, targets).item(), accuracy.item()


def train(weights: Path) -> float:
    torch.manual_seed(0)
    model = build()
    print(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for step in range(STEPS):
        x, labels, targets = batch(seed=step)
        optimizer.zero_grad()
        loss = loss_of(model(x, micro_batches=4), labels, targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=5.0)
        optimizer.step()
        if step in (0, STEPS - 1):
            print(f"step {step + 1:>2}: training loss {loss.item():.3f}")
    loss, accuracy = evaluate(model)
    print(f"held out, after training: loss {loss:.4f}, accuracy {accuracy:.0%}")
    state = model.state_dict()
    torch.save(state, weights)
    print(f"saved {len(state)} tensors: {', '.join(list(state)[:3])}, ...")
    return loss


def load_and_evaluate(weights: Path) -> None:
    """What the fresh process does: build the graph, load the weights, evaluate."""
    model = build()
    model.load_state_dict(torch.load(weights))
    loss, accuracy = evaluate(model)
    print(f"{loss:.6f} {accuracy:.6f}")


def main() -> None:
    if sys.argv[1:2] == ["--evaluate"]:
        load_and_evaluate(Path(sys.argv[2]))
        return
    with tempfile.TemporaryDirectory() as folder:
        weights = Path(folder) / "model.pt"
        loss = train(weights)
        fresh = subprocess.run(
            [sys.executable, __file__, "--evaluate", str(weights)],
            capture_output=True,
            text=True,
            check=True,
        )
    fresh_loss, fresh_accuracy = (float(word) for word in fresh.stdout.split())
    print(f"a fresh process, weights loaded: loss {fresh_loss:.4f}, accuracy {fresh_accuracy:.0%}")
    assert abs(fresh_loss - loss) < 1e-5, (fresh_loss, loss)


if __name__ == "__main__":
    main()
