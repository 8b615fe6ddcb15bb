"""With torch loaded, a cache keys tensors by content: a module's weights changed in place by
an optimizer step change its node's key, and tensors of other dtypes or shapes differ.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

from typing import Any

import torch

import soma
from conftest import CallRecord
from soma.cache import _fingerprint

# Calls of `Linear.forward`: keyed as an empty record, so that counting them changes no key.
CALLS = CallRecord()


class Linear(soma.Node):
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def forward(self, x: Any) -> Any:
        CALLS.append(1)
        with torch.no_grad():
            return self.layer(x)


def test_an_optimizer_step_changes_the_key_and_the_node_runs_again() -> None:
    node = Linear().named("linear")
    g = soma.Graph.somatize(node)
    cache = soma.Cache()
    x = torch.ones(2, 3)
    first = g.forward(x, cache=cache)
    CALLS.clear()
    assert torch.equal(g.forward(x, cache=cache), first)
    assert CALLS == []
    optimizer = torch.optim.SGD(node.layer.parameters(), lr=0.1)
    node.layer(x).sum().backward()
    optimizer.step()
    after = g.forward(x, cache=cache)
    assert CALLS == [1]
    assert not torch.equal(after, first)


def test_a_tensor_digest_follows_content_dtype_and_shape() -> None:
    t = torch.arange(6.0)
    assert _fingerprint.digest(t) == _fingerprint.digest(t.clone())
    assert _fingerprint.digest(t) != _fingerprint.digest(t.to(torch.float64))
    assert _fingerprint.digest(t) != _fingerprint.digest(t.reshape(2, 3))
    assert _fingerprint.digest(t.to(torch.bfloat16)) == _fingerprint.digest(
        torch.arange(6.0).to(torch.bfloat16)
    )
