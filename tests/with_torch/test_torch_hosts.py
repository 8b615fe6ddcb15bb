"""With torch loaded, a module on a host whose weights an optimizer step changed here runs
there with the new weights at the next run: its node is sent again.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import soma
from soma.remote import SliceRunner


class _HostHere:
    """A host in this process that keeps copies (pickled and unpickled) of what it is sent, as a
    host elsewhere would, and counts its loads."""

    def __init__(self) -> None:
        self.runners: dict[tuple[str, int], SliceRunner] = {}
        self.loads = 0

    def load(self, key: str, slices: list[Any], timeout: float | None = None) -> None:
        for piece in pickle.loads(pickle.dumps(slices)):
            self.runners[key, piece.index] = SliceRunner(piece)
        self.loads += 1

    def run(
        self,
        key: str,
        index: int,
        inputs: dict[str, Any],
        timeout: float | None,
        token: str,
        traced: bool,
    ) -> Any:
        return self.runners[key, index].run(inputs)[:2]

    def cancel(self, tokens: list[str], wait: float = 5.0) -> None:
        pass

    def unload(self, key: str) -> None:
        pass


class _Hosts:
    def __init__(self) -> None:
        self.one = _HostHere()

    def host(self, name: str) -> _HostHere:
        return self.one


@pytest.fixture
def hosts() -> Iterator[_Hosts]:
    serving = _Hosts()
    soma.remote.use(serving)  # type: ignore[arg-type]
    try:
        yield serving
    finally:
        soma.remote.use(None)


class Linear(soma.Node):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def forward(self, x: Any) -> Any:
        with torch.no_grad():
            return self.layer(x)


def test_an_optimizer_step_here_reaches_the_host_at_the_next_run(hosts: _Hosts) -> None:
    node = Linear().named("linear").at("one")
    g = soma.Graph.somatize(node)
    x = torch.ones(2, 3)
    first = g.forward(x)
    assert torch.equal(g.forward(x), first)
    assert hosts.one.loads == 1  # Unchanged: not sent again.
    optimizer = torch.optim.SGD(node.layer.parameters(), lr=0.1)
    node.layer(x).sum().backward()
    optimizer.step()
    with torch.no_grad():
        expected = node.layer(x)
    after = g.forward(x)
    assert hosts.one.loads == 2
    assert torch.equal(after, expected)
    assert not torch.equal(after, first)


def test_the_graphs_module_runs_a_module_on_a_host_under_no_grad(hosts: _Hosts) -> None:
    layer = torch.nn.Linear(3, 1)
    g = soma.Graph.somatize(soma.node(layer).named("remote").at("one"))
    x = torch.ones(2, 3)
    with torch.no_grad():
        out = g.module()(x)
        torch.testing.assert_close(out, layer(x))
    assert hosts.one.loads == 1
    with pytest.raises(soma.ModuleError, match="node `remote` runs on host `one`"):
        g.module()(x)  # with grad mode on, refused before anything runs
    assert hosts.one.loads == 1
