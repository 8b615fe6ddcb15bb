"""With torch loaded, a cache keys tensors by content: a module's weights changed in place by
an optimizer step change its node's key, and tensors of other dtypes or shapes differ.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import textwrap
from typing import Any

import torch

import soma
from conftest import CallRecord, run_script
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


# Tensors of several kinds, made the same way in the test and in a child without numpy.
SAMPLES = """
import torch

def samples():
    base = torch.arange(12.0).reshape(3, 4)
    return {
        "float32": base,
        "bfloat16": base.to(torch.bfloat16),
        "int64": torch.arange(5),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "transposed": base.t(),
        "sliced": base[:, ::2],
        "conjugate": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "parameter": torch.nn.Parameter(torch.ones(2)),
    }
"""


# A `sys.meta_path` finder that refuses numpy, as an interpreter without it would.
HIDE_NUMPY = """
import sys

class NoNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoNumpy())
"""


def test_tensors_are_keyed_and_cached_where_numpy_is_not_installed() -> None:
    program = (
        HIDE_NUMPY
        + SAMPLES
        + textwrap.dedent(
            """
            import soma
            from soma.cache import _fingerprint

            assert "numpy" not in sys.modules, "torch imported without numpy"
            for name, tensor in samples().items():
                print(name, _fingerprint.digest(tensor).hex())

            class Double(soma.Node):
                def forward(self, x):
                    print("ran double")  # Counted by the test: a list here would be keyed.
                    return x * 2

            g = soma.Graph.somatize(Double().named("double"))
            cache = soma.Cache()
            first = g.forward(torch.ones(3), cache=cache)
            again = g.forward(torch.ones(3), cache=cache)
            print("equal", torch.equal(first, again), cache.stats().hits)
            print("numpy_loaded", "numpy" in sys.modules)
            """
        )
    )
    child = run_script(program)
    assert child.returncode == 0, child.stderr
    lines = dict(line.split(" ", 1) for line in child.stdout.splitlines() if line != "ran double")
    assert child.stdout.count("ran double") == 1, "the second forward is served from the cache"
    assert lines.pop("equal") == "True 1"
    assert lines.pop("numpy_loaded") == "False"
    # With numpy here, the same tensors digest the same: keys a cache holds stay valid.
    made: dict[str, Any] = {}
    exec(SAMPLES, made)
    assert lines == {
        name: _fingerprint.digest(tensor).hex() for name, tensor in made["samples"]().items()
    }
