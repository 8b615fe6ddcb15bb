"""Async nodes run in their caller's torch state too: under ``forward``, where they run on the
event loop Soma keeps on a thread of its own, as under ``aforward``, where they run on the
caller's. grad mode, inference mode and autocast are set around each step of the run's tasks
and the loop thread's own put back after; what a task's nodes change travels with the task.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import torch

import soma
from soma._run.loop import kept_loop

DEADLINE = 5.0

WEIGHT = torch.ones(3, requires_grad=True)


def state() -> dict[str, Any]:
    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "autocast": torch.is_autocast_enabled("cpu"),
        "autocast_dtype": torch.get_autocast_dtype("cpu"),
    }


class AsyncScale(soma.Node):
    """An async node that awaits between its steps, so that the loop runs other work between
    them, then multiplies by a weight that requires grad."""

    async def forward(self, x: torch.Tensor) -> torch.Tensor:
        await asyncio.sleep(0)
        return x * WEIGHT


class AsyncProbe(soma.Node):
    """The torch state an async node sees, before and after it awaits."""

    async def forward(self, x: Any) -> dict[str, Any]:
        before = state()
        await asyncio.sleep(0)
        return {"before": before, "after": state(), "thread": threading.get_ident()}


class SyncProbe(soma.Node):
    """The torch state a sync node sees, in a graph with async nodes (lent to a crew thread)."""

    def forward(self, x: Any) -> dict[str, Any]:
        return state()


def test_an_async_nodes_output_under_no_grad_around_forward_has_no_graph() -> None:
    g = soma.Graph.somatize(AsyncScale().named("scale"))
    with torch.no_grad():
        out = g.forward(torch.ones(3))
    assert not out.requires_grad
    assert g.forward(torch.ones(3)).requires_grad, "without no_grad it has one"
    assert torch.is_grad_enabled()


def test_an_async_nodes_output_under_inference_mode_around_forward_is_an_inference_tensor() -> None:
    g = soma.Graph.somatize(AsyncScale().named("scale"))
    with torch.inference_mode():
        out = g.forward(torch.ones(3))
    assert out.is_inference()
    assert not out.requires_grad
    assert not g.forward(torch.ones(3)).is_inference()


def test_an_async_node_runs_in_the_callers_autocast_with_its_dtype_before_and_after_it_awaits() -> (
    None
):
    g = soma.Graph.somatize(AsyncProbe().named("probe"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = g.forward(None)
    for seen in (out["before"], out["after"]):
        assert seen["autocast"]
        assert seen["autocast_dtype"] == torch.bfloat16
    plain = g.forward(None)
    assert not plain["before"]["autocast"]
    assert not plain["after"]["autocast"]


def test_an_async_matmul_runs_in_the_callers_autocast_dtype_under_forward() -> None:
    class AsyncMatmul(soma.Node):
        async def forward(self, x: torch.Tensor) -> torch.Tensor:
            await asyncio.sleep(0)
            return x @ x

    g = soma.Graph.somatize(AsyncMatmul().named("mm"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = g.forward(torch.ones(4, 4))
    assert out.dtype == torch.bfloat16
    assert g.forward(torch.ones(4, 4)).dtype == torch.float32


def test_async_branches_of_a_wave_and_a_sync_node_beside_them_see_no_grad_under_forward() -> None:
    g = soma.Graph.somatize(
        AsyncProbe().named("a") | AsyncProbe().named("b") | SyncProbe().named("sync")
    )
    with torch.no_grad():
        out = g.forward(None)
    for branch in ("a", "b"):
        assert not out[branch]["before"]["grad"], branch
        assert not out[branch]["after"]["grad"], branch
    assert not out["sync"]["grad"]
    out = g.forward(None)
    assert out["a"]["before"]["grad"], "the next forward without no_grad finds grad mode on"
    assert out["sync"]["grad"]


def test_the_kept_loops_thread_gets_its_own_state_back_after_each_step() -> None:
    class LeavesNoGrad(soma.Node):
        async def forward(self, x: Any) -> Any:
            torch.set_grad_enabled(False)
            await asyncio.sleep(0)
            return torch.is_grad_enabled()

    g = soma.Graph.somatize(LeavesNoGrad().named("off"))
    with torch.autocast("cpu", dtype=torch.float16):
        assert g.forward(None) is False, "what a node sets holds in its task across its awaits"
    seen = asyncio.run_coroutine_threadsafe(_state_on_loop(), kept_loop()).result(DEADLINE)
    # (autocast's dtype is left as it was: it has no effect while autocast is off.)
    assert (seen["grad"], seen["inference"], seen["autocast"]) == (True, False, False)


async def _state_on_loop() -> dict[str, Any]:
    return state()


def test_the_graphs_module_under_no_grad_gives_an_async_nodes_output_no_graph() -> None:
    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(3))

        async def run(self, x: torch.Tensor) -> torch.Tensor:
            await asyncio.sleep(0)
            return x * self.weight

    class AsyncModuleNode(soma.Node):
        def __init__(self) -> None:
            self.scale = Scale()

        async def forward(self, x: torch.Tensor) -> torch.Tensor:
            return await self.scale.run(x)

    model = soma.Graph.somatize(AsyncModuleNode().named("scaled")).module()
    with torch.no_grad():
        out = model(torch.ones(3))
    assert not out.requires_grad
    out = model(torch.ones(3))
    assert out.requires_grad
    out.sum().backward()
    assert model.get_submodule("scaled.scale").weight.grad is not None


def test_under_aforward_what_a_node_changes_stays_in_the_run_and_the_caller_keeps_its_state() -> (
    None
):
    class LeavesNoGrad(soma.Node):
        async def forward(self, x: Any) -> Any:
            torch.set_grad_enabled(False)
            await asyncio.sleep(0)
            return torch.is_grad_enabled()

    g = soma.Graph.somatize(LeavesNoGrad().named("off") >> AsyncProbe().named("probe"))

    async def main() -> tuple[Any, bool, Any]:
        out = await g.aforward(None)
        after = torch.is_grad_enabled()
        with torch.no_grad():
            under = await soma.Graph.somatize(AsyncScale().named("s")).aforward(torch.ones(3))
        return out, after, under

    out, after, under = asyncio.run(main())
    assert not out["before"]["grad"], "the node after sees what the node before left"
    assert after, "the caller's grad mode is its own"
    assert not under.requires_grad


def test_a_stream_of_async_nodes_under_no_grad_gives_outputs_without_a_graph() -> None:
    g = soma.Graph.somatize(AsyncScale().named("scale") >> AsyncScale().named("again"))
    with torch.no_grad():
        outs = list(g.map([torch.ones(3), torch.zeros(3)]))
    assert [out.requires_grad for out in outs] == [False, False]
    assert [out.requires_grad for out in g.map([torch.ones(3)])] == [True]
