"""Nodes from functions and torch modules, and the graph as a model: what they cost beside the
plain way of writing the same thing, measured in one run.

    .venv/bin/python benches/python/modules.py [--quick] [--out PATH]

Prints markdown tables (and writes them to PATH). Timings only, never assertions; each graph's
result is checked against its peer's once, untimed. The rows, each against its target (issue 30):

1. **A two-branch MLP** (float32, CPU, batch 256, hidden 1024): a trunk ``Linear(256, 1024)``
   and ReLU, two branches of three ``Linear(1024, 1024)`` and ReLU each ending in a
   ``Linear(1024, 16)``, the two heads concatenated. Soma's ``g.module()`` beside the same
   modules in one plain ``nn.Module`` whose ``forward`` runs them in sequence: a training step
   (forward, backward, an SGD step; target: at most 1.0x the plain module's) and the forward
   alone (target: at least 1.7x faster). Timed with torch's intra-op threads at 1 (the
   branches are what runs side by side) and at torch's default (one a core).
2. **A chain of 8 small modules** (``Linear(256, 256)`` and ReLU each, batch 64): a training
   step through ``g.module()`` beside the same modules in an ``nn.Sequential`` (target: within
   5%), and the same at ``Linear(64, 64)``, batch 32, where the per-node cost shows most; one
   intra-op thread, as a chain runs on one thread either way.
3. **A chain of 1,000 trivial ``@soma.node`` functions** (``x + 1``) beside the same chain of
   ``soma.Node`` classes: a forward (target: within 10%), and building the graph.

Rows 1 and 2 need torch (``make test-torch`` installs it): without it they say "not run".
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path
from typing import Any

import soma
from deadline import log, publish, table
from timing import OtherLoad, compare

CHAIN = 1_000


@soma.node
def step(x: int) -> int:
    return x + 1


class Step(soma.Node):
    def forward(self, x: int) -> int:
        return x + 1


def function_rows(repeat: int) -> list[list[str]]:
    def functions() -> soma.Graph:
        expr = step >> step
        for _ in range(CHAIN - 2):
            expr = expr >> step
        return soma.Graph.somatize(expr)

    def classes() -> soma.Graph:
        expr = Step() >> Step()
        for _ in range(CHAIN - 2):
            expr = expr >> Step()
        return soma.Graph.somatize(expr)

    of_functions, of_classes = functions(), classes()
    assert of_functions.forward(0) == of_classes.forward(0) == CHAIN  # Checked, not timed.
    with OtherLoad() as load:
        runs = compare(
            {
                "functions": lambda: of_functions.forward(0),
                "classes": lambda: of_classes.forward(0),
            },
            repeat=repeat,
            sample_s=0.2,
            warmup_s=0.1,
        )
        builds = compare(
            {"functions": functions, "classes": classes},
            repeat=max(3, repeat // 3),
            sample_s=0.2,
            warmup_s=0.1,
        )
    ratio = runs["functions"].median_s / runs["classes"].median_s
    build_ratio = builds["functions"].median_s / builds["classes"].median_s
    log(f"functions: forward {ratio:.3f}x, build {build_ratio:.3f}x, others' load {_load(load)}")
    return [
        [
            f"forward, a chain of {CHAIN:,} `@soma.node` functions",
            _us(runs["functions"].median_s),
            f"`soma.Node` classes: {_us(runs['classes'].median_s)}",
            f"{ratio:.3f}x (target ≤ 1.10x)",
            _load(load),
        ],
        [
            "building that chain (`>>` and `somatize`)",
            _ms(builds["functions"].median_s),
            f"`soma.Node` classes: {_ms(builds['classes'].median_s)}",
            f"{build_ratio:.3f}x",
            _load(load),
        ],
    ]


def torch_rows(repeat: int) -> list[list[str]]:
    import torch
    from torch import nn

    rows = []
    for threads in (1, torch.get_num_threads()):
        torch.set_num_threads(threads)
        rows += two_branch_rows(torch, nn, threads, repeat)
    # One intra-op thread for the chains: a chain runs on one thread in either, and two intra-op
    # threads for ops this small measure how busy the other core is, not the graph.
    torch.set_num_threads(1)
    rows += chain_rows(torch, nn, hidden=256, batch=64, repeat=repeat)
    rows += chain_rows(torch, nn, hidden=64, batch=32, repeat=repeat)
    return rows


def two_branch_rows(torch: Any, nn: Any, threads: int, repeat: int) -> list[list[str]]:
    torch.manual_seed(0)

    def branch() -> Any:
        layers: list[Any] = []
        for _ in range(3):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(1024, 16))

    trunk = nn.Sequential(nn.Linear(256, 1024), nn.ReLU())
    left, right = branch(), branch()

    class Plain(nn.Module):  # type: ignore[misc]
        """The same modules as one module, run in sequence."""

        def __init__(self) -> None:
            super().__init__()
            self.trunk, self.left, self.right = trunk, left, right

        def forward(self, x: Any) -> Any:
            hidden = self.trunk(x)
            return torch.cat([self.left(hidden), self.right(hidden)], dim=-1)

    @soma.node
    def heads(outputs: dict[str, Any]) -> Any:
        return torch.cat([outputs["left"], outputs["right"]], dim=-1)

    plain = Plain()
    graph = soma.Graph.somatize(
        soma.node(trunk).named("trunk")
        >> (soma.node(left).named("left") | soma.node(right).named("right"))
        >> heads
    ).module()
    x, target = torch.randn(256, 256), torch.randn(256, 32)
    with torch.no_grad():
        torch.testing.assert_close(graph(x), plain(x))  # Checked, not timed.
    train = {
        name: _training_step(torch, nn, model, x, target)
        for name, model in (("soma", graph), ("plain", plain))
    }

    def forward_of(model: Any) -> Any:
        def forward() -> None:
            with torch.no_grad():
                model(x)

        return forward

    with OtherLoad() as load:
        timings = compare(
            {
                "soma step": train["soma"],
                "plain step": train["plain"],
                "soma forward": forward_of(graph),
                "plain forward": forward_of(plain),
            },
            repeat=repeat,
            sample_s=0.3,
            warmup_s=0.3,
        )
    ms = {name: timing.median_s for name, timing in timings.items()}
    step_ratio = ms["soma step"] / ms["plain step"]
    speedup = ms["plain forward"] / ms["soma forward"]
    log(
        f"two branches, {threads} torch thread(s): step {step_ratio:.3f}x, forward "
        f"{speedup:.2f}x faster, others' load {_load(load)}"
    )
    setting = f"torch threads {threads}"
    return [
        [
            f"two-branch MLP, a training step ({setting})",
            _ms(ms["soma step"]),
            f"plain `nn.Module`: {_ms(ms['plain step'])}",
            f"{step_ratio:.3f}x (target ≤ 1.0x)",
            _load(load),
        ],
        [
            f"two-branch MLP, forward alone ({setting})",
            _ms(ms["soma forward"]),
            f"plain `nn.Module`: {_ms(ms['plain forward'])}",
            f"{speedup:.2f}x faster (target ≥ 1.7x)",
            _load(load),
        ],
    ]


def chain_rows(torch: Any, nn: Any, hidden: int, batch: int, repeat: int) -> list[list[str]]:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(8)]
    sequential = nn.Sequential(*blocks)
    expr = soma.node(blocks[0]) >> soma.node(blocks[1])
    for block in blocks[2:]:
        expr = expr >> soma.node(block)
    graph = soma.Graph.somatize(expr).module()
    x, target = torch.randn(batch, hidden), torch.randn(batch, hidden)
    with torch.no_grad():
        torch.testing.assert_close(graph(x), sequential(x))  # Checked, not timed.
    with OtherLoad() as load:
        timings = compare(
            {
                "soma": _training_step(torch, nn, graph, x, target),
                "sequential": _training_step(torch, nn, sequential, x, target),
            },
            repeat=repeat,
            sample_s=0.2,
            warmup_s=0.2,
        )
    ratio = timings["soma"].median_s / timings["sequential"].median_s
    log(f"chain of 8, hidden {hidden}: step {ratio:.3f}x, others' load {_load(load)}")
    return [
        [
            f"chain of 8 `Linear({hidden}, {hidden})` + ReLU, batch {batch}, a training step",
            _us(timings["soma"].median_s),
            f"`nn.Sequential`: {_us(timings['sequential'].median_s)}",
            f"{ratio:.3f}x (target ≤ 1.05x)",
            _load(load),
        ]
    ]


def _training_step(torch: Any, nn: Any, model: Any, x: Any, target: Any) -> Any:
    """One step of training ``model``: forward, a mean squared error, backward, SGD."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def training_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), target).backward()
        optimizer.step()

    return training_step


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"


def _load(load: OtherLoad) -> str:
    return "n/a" if load.share is None else f"{load.share:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    repeat = 3 if args.quick else 9
    rows = function_rows(repeat)
    if importlib.util.find_spec("torch") is None:
        rows.append(
            ["the two-branch MLP and the chain of 8 modules", "not run", "", "needs torch", ""]
        )
        log("modules: torch is not installed (`make test-torch` installs it); not run")
    else:
        rows += torch_rows(repeat)
    lines = [
        "## Nodes from functions and modules, the graph as a model",
        "",
        f"Medians of interleaved samples, on {os.cpu_count()} cores; each row beside what it is "
        "measured against, in the same run, with the share of the machine other processes "
        "used meanwhile:",
        "",
        *table(["what", "Soma", "beside", "ratio", "others' load"], rows),
        "",
    ]
    publish(lines, args.out)


if __name__ == "__main__":
    main()
