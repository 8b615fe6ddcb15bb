# ruff: noqa: E501 -- a snapshot is the message as it is, however long its lines.
"""With torch: every message the graph as a model shows, word for word, as inline snapshots
(``tests/test_messages.py`` holds the rest; the same conventions).

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import warnings

import torch
from inline_snapshot import snapshot
from torch import nn

import soma
from test_messages import story


def two_layers(hidden: int) -> soma.GraphModule:
    return soma.Graph.somatize(
        soma.node(nn.Linear(4, hidden)).named("encoder")
        >> soma.node(nn.Linear(hidden, 2)).named("head")
    ).module()


def test_a_state_dict_that_does_not_fit_one_node() -> None:
    saved = two_layers(8).state_dict()
    del saved["head.bias"]
    assert story(lambda: two_layers(8).load_state_dict(saved)) == snapshot("""\
StateDictError: the state_dict does not fit node `head`: `head.bias` is missing from the state_dict
hint: load a state_dict saved from a graph built the same way (the same ids, the same modules); strict=False leaves out missing and unexpected keys, never a size that differs
cause: RuntimeError: Error(s) in loading state_dict for GraphModule:
	Missing key(s) in state_dict: "head.bias". \
""")


def test_a_state_dict_that_does_not_fit_several_nodes() -> None:
    saved = two_layers(8).state_dict()
    saved["old.weight"] = torch.zeros(1)
    assert story(lambda: two_layers(6).load_state_dict(saved)) == snapshot("""\
StateDictError: the state_dict does not fit nodes `encoder`, `head`, `old`:
- `encoder`: `encoder.weight` is (8, 4) in the state_dict, (6, 4) here; `encoder.bias` is (8,) in the state_dict, (6,) here
- `head`: `head.weight` is (2, 8) in the state_dict, (2, 6) here
- `old`: `old.weight` is in the state_dict, and no parameter or buffer here
hint: load a state_dict saved from a graph built the same way (the same ids, the same modules); strict=False leaves out missing and unexpected keys, never a size that differs
cause: RuntimeError: Error(s) in loading state_dict for GraphModule:
	Unexpected key(s) in state_dict: "old.weight". \n\
	size mismatch for encoder.weight: copying a param with shape torch.Size([8, 4]) from checkpoint, the shape in current model is torch.Size([6, 4]).
	size mismatch for encoder.bias: copying a param with shape torch.Size([8]) from checkpoint, the shape in current model is torch.Size([6]).
	size mismatch for head.weight: copying a param with shape torch.Size([2, 8]) from checkpoint, the shape in current model is torch.Size([2, 6]).\
""")


def test_a_node_id_with_a_dot() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("enc.v2"))
    assert story(g.module) == snapshot("""\
ModuleError: node `enc.v2` holds a torch module, and its id cannot name it in a module: it holds a `.`
hint: give the node another id with `.named(...)`\
""")


def test_a_node_id_nn_module_takes() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("training"))
    assert story(g.module) == snapshot("""\
ModuleError: node `training` holds a torch module, and its id cannot name it in a module: it names an attribute every `GraphModule` has already
hint: give the node another id with `.named(...)`\
""")


def test_a_module_attribute_whose_key_holds_a_dot() -> None:
    class Holder(soma.Node):
        def __init__(self) -> None:
            self.layers = {"v1.0": nn.Linear(2, 2)}

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    assert story(soma.Graph.somatize(Holder()).module) == snapshot("""\
ModuleError: node `holder` holds a torch module, and its attribute or key `v1.0` cannot name it in a module: it holds a `.`
hint: keep the module under a name without a `.`\
""")


def test_a_module_to_train_on_a_host() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("remote").at("gpu-box"))
    assert story(lambda: g.module()(torch.ones(1, 2))) == snapshot("""\
ModuleError: node `remote` runs on host `gpu-box`, and its modules have parameters to train: what a host returns comes back without autograd's record, so backward would not reach them
hint: run it under `torch.no_grad()` to infer, or keep the nodes you train here: `g.place_at('remote', None)`\
""")


def test_a_placed_node_kept_on_its_device() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("pinned").on("cpu"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g.module().to("meta")
    assert [f"{type(w.message).__name__}: {w.message}" for w in caught] == snapshot(
        [
            """\
PlacementWarning: `pinned` on cpu: placed with .on, kept there; the rest moved to meta
hint: `g.place(id, None)` unplaces a node, which then moves with the model\
"""
        ]
    )
