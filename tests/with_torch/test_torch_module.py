"""With torch: a module is a node, and ``g.module()`` is the graph as one ``nn.Module`` — its
nodes' modules registered by node id, so parameters, state_dicts, train/eval, ``to``,
optimizers and gradient clipping reach them all — whose ``forward`` runs the graph.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import soma


@soma.node
def join(branches: dict[str, torch.Tensor]) -> torch.Tensor:
    return branches["left"] + branches["right"]


class Head(soma.Node):
    """A node holding modules in its attributes: one directly, some in a list and a dict."""

    def __init__(self) -> None:
        self.project = nn.Linear(4, 4)
        self.layers = [nn.Linear(4, 4), nn.Tanh(), "not a module"]
        self.named_layers = {"out": nn.Linear(4, 2)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:2]:
            x = layer(x)
        return self.named_layers["out"](self.project(x))


class Residual(soma.Node, nn.Module):
    """A node that is itself a module."""

    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


def two_branches() -> tuple[soma.Graph, nn.Module, nn.Module, nn.Module]:
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(8, 4), nn.ReLU())
    left, right = nn.Linear(4, 4), nn.Linear(4, 4)
    g = soma.Graph.somatize(
        soma.node(encoder).named("encoder")
        >> (soma.node(left).named("left") | soma.node(right).named("right"))
        >> join
    )
    return g, encoder, left, right


# ---------------------------------------------------------------------------------------------
# A module as a node


def test_a_module_node_calls_the_module_so_its_hooks_run() -> None:
    layer = nn.Linear(3, 2)
    seen: list[torch.Size] = []
    layer.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    g = soma.Graph.somatize(soma.node(layer))
    out = g.forward(torch.ones(5, 3))
    assert seen == [torch.Size([5, 2])]
    torch.testing.assert_close(out, layer(torch.ones(5, 3)))


def test_a_module_node_is_named_after_its_class() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(3, 2)) >> soma.node(nn.ReLU()) >> nn.Linear(2, 1))
    assert g.nodes() == ["linear", "re_lu", "linear_2"]
    assert isinstance(g.implementation("linear"), soma.ModuleNode)


def test_a_module_beside_a_node_in_an_expression_is_a_node() -> None:
    class Scale(soma.Node):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    first = nn.Linear(3, 3)
    g = soma.Graph.somatize(first >> Scale() >> nn.Identity())
    assert g.nodes() == ["linear", "scale", "identity"]
    assert g.implementation("linear").module is first
    torch.testing.assert_close(g.forward(torch.ones(1, 3)), first(torch.ones(1, 3)) * 2)


def test_g_node_registers_a_module_as_a_node_calling_it() -> None:
    g = soma.Graph()
    assert g.node(nn.Tanh()) == "tanh"
    torch.testing.assert_close(g.forward(torch.zeros(2)), torch.zeros(2))


def test_a_module_node_placed_on_a_device_moves_what_it_receives_there() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(3, 2, device="meta")).on("meta"))
    out = g.forward(torch.ones(4, 3))
    assert out.device.type == "meta"
    assert out.shape == (4, 2)


def test_a_module_node_pickles_with_its_module() -> None:
    import pickle

    layer = nn.Linear(3, 2)
    g = soma.Graph.somatize(soma.node(layer).named("layer").retry(1, backoff=0.0))
    loaded = pickle.loads(pickle.dumps(g))
    assert loaded.retries() == g.retries()
    torch.testing.assert_close(loaded.forward(torch.ones(1, 3)), layer(torch.ones(1, 3)))


# ---------------------------------------------------------------------------------------------
# The graph as a module


def test_the_graphs_module_registers_each_module_node_under_its_id() -> None:
    g, encoder, left, _ = two_branches()
    m = g.module()
    assert isinstance(m, nn.Module)
    assert isinstance(m, soma.GraphModule)
    assert [name for name, _ in m.named_parameters()] == [
        "encoder.0.weight",
        "encoder.0.bias",
        "left.weight",
        "left.bias",
        "right.weight",
        "right.bias",
    ]
    assert m.encoder is encoder
    assert m.left is left


def test_its_forward_runs_the_graph() -> None:
    g, encoder, left, right = two_branches()
    x = torch.randn(5, 8)
    torch.testing.assert_close(g.module()(x), left(encoder(x)) + right(encoder(x)))


def test_modules_a_node_holds_are_registered_under_its_id_by_attribute() -> None:
    g = soma.Graph.somatize(Head().named("head") >> Residual().named("residual"))
    m = g.module()
    assert sorted(name for name, _ in m.named_parameters()) == [
        "head.layers.0.bias",
        "head.layers.0.weight",
        "head.named_layers.out.bias",
        "head.named_layers.out.weight",
        "head.project.bias",
        "head.project.weight",
        "residual.inner.bias",
        "residual.inner.weight",
    ]
    assert m.residual is g.implementation("residual")
    assert isinstance(m.head, soma.NodeModules)


def test_a_function_node_of_a_modules_method_registers_the_module() -> None:
    layer = nn.Linear(3, 3)
    m = soma.Graph.somatize(soma.node(layer.forward).named("step")).module()
    assert m.step is layer


def test_a_function_node_of_a_callable_object_registers_the_modules_it_holds() -> None:
    class Scorer:
        def __init__(self) -> None:
            self.net = nn.Linear(3, 1)

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    scorer = Scorer()
    m = soma.Graph.somatize(soma.node(scorer)).module()
    assert [name for name, _ in m.named_parameters()] == ["scorer.net.weight", "scorer.net.bias"]
    assert m.scorer.net is scorer.net


def test_its_forward_takes_the_graphs_keywords() -> None:
    g, _, _, _ = two_branches()
    trace = soma.Trace()
    out = g.module()(torch.randn(4, 8), trace=trace, timeout=60.0)
    assert out.shape == (4, 4)
    assert sorted(span.node for span in trace.spans) == ["encoder", "join", "left", "right"]


def test_the_nodes_inside_each_switch_and_loop_are_registered_by_their_ids() -> None:
    g = soma.Graph.somatize(
        soma.each(nn.Linear(2, 2)).named("items")
        >> soma.switch(lambda xs: "stack", {"stack": torch.stack}).named("pick")
        >> soma.loop(nn.Tanh(), until=lambda x: True, max_iterations=2).named("again")
    )
    m = g.module()
    assert [name for name, _ in m.named_children()] == ["items/linear", "again/tanh"]
    out = m([torch.ones(2), torch.zeros(2)])
    assert out.shape == (2, 2)


def test_train_and_eval_reach_every_module() -> None:
    g = soma.Graph.somatize(
        Head().named("head")
        >> soma.node(nn.Dropout(0.5)).named("drop")
        >> soma.each(nn.Linear(2, 2)).named("items")
    )
    m = g.module()
    modules = [module for module in m.modules() if module is not m]
    assert len(modules) == 9
    m.eval()
    assert not any(module.training for module in modules)
    assert not g.implementation("drop").module.training
    assert not g.implementation("head").layers[0].training
    m.train()
    assert all(module.training for module in modules)


def test_dropout_in_eval_is_the_identity_through_the_graph() -> None:
    g = soma.Graph.somatize(soma.node(nn.Dropout(0.9)))
    m = g.module().eval()
    x = torch.ones(100)
    torch.testing.assert_close(m(x), x)


def test_a_dtype_reaches_every_module() -> None:
    g = soma.Graph.somatize(Head().named("head") >> soma.node(nn.Linear(2, 2)).named("last"))
    m = g.module().to(torch.float64)
    assert {p.dtype for p in m.parameters()} == {torch.float64}
    assert m(torch.ones(1, 4, dtype=torch.float64)).dtype == torch.float64


def test_to_a_device_keeps_a_placed_node_on_its_own_and_says_so() -> None:
    g = soma.Graph.somatize(
        soma.node(nn.Linear(2, 2)).named("free") >> soma.node(nn.Linear(2, 2)).named("pinned")
    )
    g.place("pinned", "cpu")
    m = g.module()
    with pytest.warns(soma.PlacementWarning, match="`pinned` on cpu: placed with .on, kept"):
        m.to("meta")
    assert m.free.weight.device.type == "meta"
    assert m.pinned.weight.device.type == "cpu"


def test_cuda_and_cpu_go_through_to(monkeypatch: pytest.MonkeyPatch) -> None:
    m = soma.Graph.somatize(soma.node(nn.Linear(2, 2))).module()
    asked: list[object] = []
    monkeypatch.setattr(type(m), "to", lambda self, *args: asked.append(args) or self)
    assert m.cuda() is m
    m.cuda(1)
    m.cpu()
    assert asked == [("cuda",), (torch.device("cuda", 1),), ("cpu",)]


def test_a_placed_module_node_moves_the_tensors_of_a_dict_it_receives() -> None:
    class Sum(nn.Module):
        def forward(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
            return parts["a"] + parts["b"]

    class Make(soma.Node):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    g = soma.Graph.somatize((Make().named("a") | Make().named("b")) >> soma.node(Sum()).on("meta"))
    assert g.forward(torch.ones(2)).device.type == "meta"


def test_to_the_device_a_node_is_placed_on_says_nothing() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("pinned").on("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.module().to("cpu")
        g.module().cpu()


def test_an_optimizer_and_gradient_clipping_work_on_its_parameters() -> None:
    g, encoder, left, right = two_branches()
    m = g.module()
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(5, 8)
    before = m(x).detach()
    m(x).pow(2).sum().backward()
    norm = nn.utils.clip_grad_norm_(m.parameters(), max_norm=0.01)
    assert norm > 0.01
    clipped = torch.cat([p.grad.reshape(-1) for p in m.parameters()]).norm()
    torch.testing.assert_close(clipped, torch.tensor(0.01), rtol=1e-3, atol=1e-6)
    optimizer.step()
    assert not torch.allclose(m(x), before)  # the next forward computes with the new weights
    torch.testing.assert_close(m(x), left(encoder(x)) + right(encoder(x)))


def test_an_optimizer_step_changes_what_a_cache_sees_of_a_module_node() -> None:
    layer = nn.Linear(3, 1)
    g = soma.Graph.somatize(soma.node(layer).named("layer"))
    cache = soma.Cache()
    x = torch.ones(2, 3)
    with torch.no_grad():
        first = g.forward(x, cache=cache)
        assert cache.would_hit(g, x) == {"layer": True}
    optimizer = torch.optim.SGD(g.module().parameters(), lr=0.5)
    layer(x).sum().backward()
    optimizer.step()
    assert cache.would_hit(g, x) == {"layer": False}
    with torch.no_grad():
        assert not torch.equal(g.forward(x, cache=cache), first)


def test_made_again_after_a_node_is_added_it_registers_that_node_too() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("first"))
    before = g.module()
    g.edge("first", g.node("second", nn.Linear(2, 2)))
    assert [name for name, _ in before.named_children()] == ["first"]
    assert [name for name, _ in g.module().named_children()] == ["first", "second"]


def test_a_deep_copy_registers_the_copied_graphs_own_modules() -> None:
    g, encoder, _, _ = two_branches()
    m = g.module()
    copied = copy.deepcopy(m)
    assert copied.encoder is not encoder
    with torch.no_grad():
        copied.encoder[0].weight.zero_()
    x = torch.randn(2, 8)
    assert not torch.equal(copied(x), m(x))  # the copy runs its own, changed, weights
    torch.testing.assert_close(
        copied(x), copied.left(copied.encoder(x)) + copied.right(copied.encoder(x))
    )


def test_training_a_module_on_a_host_is_a_module_error_naming_it() -> None:
    g, _, _, _ = two_branches()
    g.place_at("left", "gpu-box")
    with pytest.raises(soma.ModuleError, match="node `left` runs on host `gpu-box`") as raised:
        g.module()(torch.randn(2, 8))
    assert raised.value.node == "left"


def test_a_node_id_holding_a_dot_is_a_module_error_naming_it() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("enc.v2"))
    with pytest.raises(soma.ModuleError, match=r"node `enc\.v2` holds a torch module") as raised:
        g.module()
    assert raised.value.node == "enc.v2"


def test_a_node_id_that_nn_module_takes_is_a_module_error_naming_it() -> None:
    g = soma.Graph.somatize(soma.node(nn.Linear(2, 2)).named("forward"))
    with pytest.raises(
        soma.ModuleError, match="names an attribute every `GraphModule` has already"
    ):
        g.module()


# ---------------------------------------------------------------------------------------------
# state_dicts


def test_a_state_dict_loads_into_a_graph_built_the_same_way() -> None:
    saved = two_branches()[0].module().state_dict()
    torch.manual_seed(1)
    g = two_branches()[0]
    with torch.no_grad():
        for p in g.module().parameters():
            p.add_(1.0)
    g.module().load_state_dict(saved)
    for key, value in g.module().state_dict().items():
        torch.testing.assert_close(value, saved[key])


def test_a_state_dict_of_another_size_names_the_node_it_does_not_fit() -> None:
    saved = two_branches()[0].module().state_dict()
    saved["left.weight"] = torch.zeros(3, 4)
    with pytest.raises(soma.StateDictError) as raised:
        two_branches()[0].module().load_state_dict(saved)
    assert raised.value.nodes == ["left"]
    assert "`left.weight` is (3, 4) in the state_dict, (4, 4) here" in str(raised.value)
    assert isinstance(raised.value, RuntimeError)
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_missing_and_unexpected_keys_name_their_nodes_unless_not_strict() -> None:
    saved = two_branches()[0].module().state_dict()
    del saved["encoder.0.bias"]
    saved["extra.weight"] = torch.zeros(1)
    m = two_branches()[0].module()
    with pytest.raises(soma.StateDictError) as raised:
        m.load_state_dict(saved)
    assert raised.value.nodes == ["encoder", "extra"]
    message = str(raised.value)
    assert "`encoder.0.bias` is missing from the state_dict" in message
    assert "`extra.weight` is in the state_dict, and no parameter or buffer here" in message
    result = m.load_state_dict(saved, strict=False)
    assert result.missing_keys == ["encoder.0.bias"]
    assert result.unexpected_keys == ["extra.weight"]


def test_a_size_that_differs_is_refused_even_when_not_strict() -> None:
    saved = two_branches()[0].module().state_dict()
    saved["right.bias"] = torch.zeros(5)
    with pytest.raises(soma.StateDictError, match=r"`right\.bias` is \(5,\) in the state_dict"):
        two_branches()[0].module().load_state_dict(saved, strict=False)


def test_a_state_dict_saved_in_one_process_loads_in_another(tmp_path: Path) -> None:
    # The model: built the same way in both processes, from a file both import.
    (tmp_path / "two_branch_model.py").write_text(
        "import soma, torch\n"
        "from torch import nn\n\n\n"
        "@soma.node\n"
        "def join(b):\n"
        "    return b['left'] + b['linear']\n\n\n"
        "def build(seed):\n"
        "    torch.manual_seed(seed)\n"
        "    return soma.Graph.somatize(\n"
        "        soma.node(nn.Sequential(nn.Linear(8, 4), nn.ReLU())).named('encoder')\n"
        "        >> (soma.node(nn.Linear(4, 4)).named('left') | nn.Linear(4, 4)) >> join\n"
        "    ).module()\n"
    )
    weights, outputs = tmp_path / "weights.pt", tmp_path / "outputs.pt"
    save = (
        "import torch, two_branch_model\n"
        "m = two_branch_model.build(0).eval()\n"
        f"torch.save(m.state_dict(), {str(weights)!r})\n"
        "torch.manual_seed(5)\n"
        f"torch.save(m(torch.randn(3, 8)).detach(), {str(outputs)!r})\n"
    )
    load = (
        "import torch, two_branch_model\n"
        "m = two_branch_model.build(1).eval()\n"
        f"m.load_state_dict(torch.load({str(weights)!r}))\n"
        "torch.manual_seed(5)\n"
        f"torch.testing.assert_close(m(torch.randn(3, 8)), torch.load({str(outputs)!r}))\n"
        "print(sorted(m.state_dict()))\n"
    )
    for script in (save, load):
        run = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stderr
    assert run.stdout == (
        "['encoder.0.bias', 'encoder.0.weight', 'left.bias', 'left.weight', "
        "'linear.bias', 'linear.weight']\n"
    )


def test_a_whole_model_saved_by_a_process_that_exited_loads_in_another(tmp_path: Path) -> None:
    # A graph's nodes pickle with multiprocessing's pickler, where torch registers a tensor's
    # reduction to shared memory, valid only while the process that pickled it lives.
    (tmp_path / "saved_model.py").write_text(
        "import soma, torch\n"
        "from torch import nn\n\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return soma.Graph.somatize(soma.node(nn.Linear(3, 4)) >> nn.Tanh()).module()\n"
    )
    model, graph = tmp_path / "model.pt", tmp_path / "graph.pickle"
    save = (
        "import pickle, torch, saved_model\n"
        "m = saved_model.build()\n"
        f"torch.save(m, {str(model)!r})\n"
        f"open({str(graph)!r}, 'wb').write(pickle.dumps(m._soma_graph))\n"
    )
    load = (
        "import pickle, torch, saved_model\n"
        f"m = torch.load({str(model)!r}, weights_only=False)\n"
        f"g = pickle.loads(open({str(graph)!r}, 'rb').read())\n"
        "x = torch.ones(2, 3)\n"
        "expected = saved_model.build()(x)\n"
        "torch.testing.assert_close(m(x), expected)\n"
        "torch.testing.assert_close(g.forward(x), expected)\n"
        "assert m.linear is m._soma_graph.implementation('linear').module\n"
        "print('loaded')\n"
    )
    for script in (save, load):
        run = subprocess.run(
            [sys.executable, "-c", script],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, run.stderr
    assert run.stdout == "loaded\n"


def test_torch_is_not_imported_by_import_soma_nor_by_building_without_it() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, soma\n"
            "g = soma.Graph.somatize(soma.node(len))\n"
            "assert g.forward([1, 2]) == 2\n"
            "assert 'torch' not in sys.modules\n"
            "soma.GraphModule  # asking for the torch class imports torch\n"
            "assert 'torch' in sys.modules\n",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
