"""``Graph.module()``: the graph as a torch ``nn.Module``, over the modules its nodes hold.

torch users expect a composition of modules to be a module — ``parameters()``, ``state_dict()``,
``train()``/``eval()``, ``to()`` recursing through it — and torch gives that only for the
modules a container registers (``add_module``): a module kept in a plain attribute of something
else is silently left out (pytorch#715). So :class:`GraphModule` registers, under each node's id,
the module that node is or holds:

- a module node (``soma.node(nn.Linear(...))``, a module in an expression): its module;
- a ``soma.Node`` that is itself an ``nn.Module``: the node;
- a function node of a bound method or a callable object: the module that object is, or the
  modules it holds, as below;
- any other node: the modules among its attributes — each directly, or in a list, tuple or dict
  (one level down) — in a :class:`NodeModules` of its own, by attribute name
  (``"trunk.layers.0.weight"``).

The nodes inside ``each``, ``switch`` and ``loop`` steps count, under their ids
(``"chunks/embed"``).
What a function reaches through a closure or a global is not found: make it a module node, or
hold it in a node. ``forward`` runs the graph itself, branches on their threads, so gradients
flow back through whatever ran.

The modules are read when the module is made: call ``g.module()`` again after adding nodes or
giving a node another module. A pickle or a copy of one is remade from the graph's own pickle
or copy, so that it registers the very modules its graph runs.

torch is imported when a :class:`GraphModule` is first made (or ``soma.GraphModule`` first
read), never by importing this module: the classes are made then, and kept.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from soma import _soma
from soma._build.decide import Decision
from soma._build.function import FunctionNode, ModuleNode
from soma.errors import ModuleError, StateDictError

if TYPE_CHECKING:  # `soma._graph` imports this module: the graph is named for the typing only.
    from soma._graph import Graph


class PlacementWarning(UserWarning):
    """``GraphModule.to(device)`` kept the nodes placed with ``.on`` on their own devices."""


def graph_module(graph: Graph) -> GraphModule:
    """The graph as an ``nn.Module``: see :class:`GraphModule`."""
    return _classes()[0](graph)


def __getattr__(name: str) -> Any:
    """``GraphModule`` and ``NodeModules``, made on first use (with torch imported): so that
    ``soma.GraphModule`` and a pickle naming it find it."""
    if name == "GraphModule":
        return _classes()[0]
    if name == "NodeModules":
        return _classes()[1]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _node_ids(plan: _soma.Plan) -> list[str]:
    """Every node of a plan, the nodes inside its steps included, in plan order: a walk with a
    stack of its own, as deep as the plan."""
    ids: list[str] = []
    pending = [plan]
    while pending:
        step = pending.pop()
        node = step.node
        if node is not None:
            ids.append(node)
        pending.extend(reversed(step.children))
    return ids


def _attributes(obj: object) -> list[tuple[str, Any]]:
    """An object's attributes, ``__dict__`` and ``__slots__``, Soma's own left out."""
    found = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        declared = cls.__dict__.get("__slots__", ())
        for name in [declared] if isinstance(declared, str) else declared:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                found.setdefault(name, getattr(obj, name))
    return [(name, value) for name, value in found.items() if not name.startswith("_soma_")]


def _classes() -> tuple[type[GraphModule], type[NodeModules]]:
    made = _made()
    globals().update(GraphModule=made[0], NodeModules=made[1])  # Found as they are from now on.
    return made


@functools.cache
def _made() -> tuple[type[GraphModule], type[NodeModules]]:
    """The two classes, made once torch is imported: they subclass ``nn.Module``."""
    import torch
    from torch import nn

    class NodeModules(nn.Module):  # type: ignore[misc]
        """The modules one node holds in its attributes, registered by attribute name: the
        node runs them, this container only shows them to torch."""

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                "a node's modules are run by its node, not by this container\n"
                "hint: run the graph: call the GraphModule, or `g.forward(x)`"
            )

    class GraphModule(nn.Module):  # type: ignore[misc]
        """A graph as a torch module: its nodes' modules registered under the nodes' ids,
        ``forward`` running the graph (see :mod:`soma._build.module` for what is found)."""

        def __init__(self, graph: Graph) -> None:
            super().__init__()
            self._soma_graph = graph
            for node_id, held in _held_modules(graph, nn, NodeModules):
                _add(self, node_id, held, node_id)

        def forward(
            self,
            input: Any = None,
            *,
            driver: Any = None,
            turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
            trace: _soma.Trace | None = None,
            timeout: float | None = None,
            micro_batches: int | None = None,
            join: Callable[[list[Any]], Any] | None = None,
            cache: Any = None,
        ) -> Any:
            """Runs the graph on ``input``, as ``g.forward(input, ...)`` with the same
            keywords: ``micro_batches=k`` runs the slices of a batch through it, overlapped.

            With grad mode on, a node on a host whose modules have parameters to train is a
            ``soma.ModuleError``: what a host returns comes back without autograd's record, so
            ``backward`` could not reach them, and they would silently not train."""
            if torch.is_grad_enabled():
                hosts = self._soma_graph.hosts()
                if hosts:
                    _refuse_trained_on_hosts(self, hosts)
            return self._soma_graph.forward(
                input,
                driver=driver,
                turn_limit=turn_limit,
                trace=trace,
                timeout=timeout,
                micro_batches=micro_batches,
                join=join,
                cache=cache,
            )

        def to(self, *args: Any, **kwargs: Any) -> GraphModule:
            """``nn.Module.to``, but a node placed with ``.on`` (or ``g.place``) goes to its
            own device, and a :class:`PlacementWarning` names each that stays off ``device``;
            a dtype reaches every module."""
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
            placed = self._soma_graph.devices()
            if device is None or not placed:
                return super().to(*args, **kwargs)  # type: ignore[no-any-return]
            own = {"dtype": dtype, "non_blocking": non_blocking}
            if memory_format is not None:
                own["memory_format"] = memory_format
            kept = []
            for name, child in self.named_children():
                where = placed.get(name)
                if where is None:
                    child.to(*args, **kwargs)
                    continue
                child.to(where, **own)
                if _elsewhere(torch.device(where), device):
                    kept.append(f"`{name}` on {where}")
            if kept:
                warnings.warn(
                    PlacementWarning(
                        f"{', '.join(kept)}: placed with .on, kept there; the rest moved to "
                        f"{device}\nhint: `g.place(id, None)` unplaces a node, which then "
                        "moves with the model"
                    ),
                    stacklevel=2,
                )
            return self

        def cuda(self, device: Any = None) -> GraphModule:
            """``to`` a CUDA device: the current one, or ``device`` (an index or a device)."""
            if device is None:
                return self.to("cuda")
            return self.to(torch.device("cuda", device) if isinstance(device, int) else device)

        def cpu(self) -> GraphModule:
            """``to("cpu")``."""
            return self.to("cpu")

        def load_state_dict(
            self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
        ) -> Any:
            """``nn.Module.load_state_dict``; a state_dict that does not fit is a
            ``soma.StateDictError`` naming each node it does not fit and how, torch's own
            error its cause."""
            try:
                return super().load_state_dict(state_dict, strict=strict, assign=assign)
            except RuntimeError as failure:
                misfits = _misfits(self.state_dict(keep_vars=True), state_dict, strict)
                if not misfits:
                    raise
                raise _state_dict_error(misfits) from failure

        def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
            # Remade from the graph: a graph pickles its nodes in a pickle of their own, so the
            # modules pickled here beside it would come back as other objects than its nodes'.
            return (_remade, (self._soma_graph, self.training))

    for cls in (NodeModules, GraphModule):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return GraphModule, NodeModules


def _refuse_trained_on_hosts(module: Any, hosts: dict[str, str]) -> None:
    """Refuses a run with grad mode on that would send modules to train to a host."""
    for node_id, host in hosts.items():
        held = module._modules.get(node_id)
        if held is not None and any(p.requires_grad for p in held.parameters()):
            error = ModuleError(
                f"node `{node_id}` runs on host `{host}`, and its modules have parameters to "
                "train: what a host returns comes back without autograd's record, so backward "
                "would not reach them\nhint: run it under `torch.no_grad()` to infer, or keep "
                f"the nodes you train here: `g.place_at({node_id!r}, None)`"
            )
            error.node = node_id
            raise error


def _remade(graph: Graph, training: bool) -> GraphModule:
    """The module ``GraphModule.__reduce_ex__`` saved."""
    module = graph_module(graph)
    module.training = training
    return module


def _elsewhere(where: Any, device: Any) -> bool:
    """Whether a node on ``where`` is off ``device``: another kind, or another index of it (a
    device without one, such as a bare ``cuda``, is any of its kind)."""
    if where.type != device.type:
        return True
    return where.index is not None and device.index is not None and where.index != device.index


def _held_modules(graph: Graph, nn: Any, box: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Each node's module, by node id, in plan order: see :mod:`soma._build.module`."""
    held = []
    for node_id in _node_ids(graph.plan()):
        found = _held_by(graph.implementation(node_id), node_id, nn, box)
        if found is not None:
            held.append((node_id, found))
    return held


def _held_by(obj: object, node_id: str, nn: Any, box: Callable[[], Any]) -> Any:
    """The module node ``node_id`` (``obj``) is or holds, or ``None``."""
    if isinstance(obj, ModuleNode):
        return obj.module
    if isinstance(obj, nn.Module):
        return obj
    if isinstance(obj, Decision):
        return None
    if isinstance(obj, FunctionNode):
        owner = getattr(obj.function, "__self__", obj.function)
        if isinstance(owner, nn.Module):
            return owner
        obj = owner
    container = None
    for name, value in _attributes(obj):
        found = value if isinstance(value, nn.Module) else _collected(value, node_id, nn, box)
        if found is not None:
            if container is None:
                container = box()
            _add(container, name, found, node_id)
    return container


def _collected(value: object, node_id: str, nn: Any, box: Callable[[], Any]) -> Any:
    """The modules in a list, tuple or dict, by index or key, in a container; or ``None``."""
    if isinstance(value, (list, tuple)):
        items = [(str(index), item) for index, item in enumerate(value)]
    elif isinstance(value, dict):
        items = [(key, item) for key, item in value.items() if isinstance(key, str)]
    else:
        return None
    modules = [(key, item) for key, item in items if isinstance(item, nn.Module)]
    if not modules:
        return None
    container = box()
    for key, module in modules:
        _add(container, key, module, node_id)
    return container


def _add(parent: Any, name: str, module: Any, node_id: str) -> None:
    """Registers ``module`` under ``name``, or says why a name cannot be one."""
    if "." in name or (hasattr(parent, name) and name not in parent._modules):
        what = "its id" if name == node_id else f"its attribute or key `{name}`"
        reason = (
            "holds a `.`"
            if "." in name
            else f"names an attribute every `{type(parent).__name__}` has already"
        )
        error = ModuleError(
            f"node `{node_id}` holds a torch module, and {what} cannot name it in a module: it "
            f"{reason}\nhint: give the node another id with `.named(...)`"
            if name == node_id
            else f"node `{node_id}` holds a torch module, and {what} cannot name it in a "
            f"module: it {reason}\nhint: keep the module under a name without a `.`"
        )
        error.node = node_id
        raise error
    parent.add_module(name, module)


def _misfits(
    own: Mapping[str, Any], given: Mapping[str, Any], strict: bool
) -> dict[str, list[str]]:
    """What does not fit, per node: missing and unexpected keys (when ``strict``), and sizes
    that differ."""
    misfits: dict[str, list[str]] = {}

    def note(key: str, what: str) -> None:
        misfits.setdefault(key.split(".", 1)[0], []).append(what)

    for key, value in own.items():
        if key not in given:
            if strict:
                note(key, f"`{key}` is missing from the state_dict")
            continue
        theirs = getattr(given[key], "shape", None)
        ours = getattr(value, "shape", None)
        if theirs is not None and ours is not None and tuple(theirs) != tuple(ours):
            note(key, f"`{key}` is {tuple(theirs)} in the state_dict, {tuple(ours)} here")
    if strict:
        for key in given:
            if key not in own:
                note(key, f"`{key}` is in the state_dict, and no parameter or buffer here")
    return misfits


def _state_dict_error(misfits: dict[str, list[str]]) -> StateDictError:
    nodes = list(misfits)
    if len(nodes) == 1:
        what = f"node `{nodes[0]}`: " + "; ".join(misfits[nodes[0]])
    else:
        listed = ", ".join(f"`{node}`" for node in nodes)
        what = f"nodes {listed}:" + "".join(
            f"\n- `{node}`: " + "; ".join(found) for node, found in misfits.items()
        )
    error = StateDictError(
        f"the state_dict does not fit {what}\n"
        "hint: load a state_dict saved from a graph built the same way (the same ids, the same "
        "modules); strict=False leaves out missing and unexpected keys, never a size that differs"
    )
    error.node = nodes[0]
    error.nodes = nodes
    return error


if TYPE_CHECKING:
    from torch import nn

    class NodeModules(nn.Module):  # type: ignore[misc]
        """The modules one node holds in its attributes, registered by attribute name."""

    class GraphModule(nn.Module):  # type: ignore[misc]
        """A graph as a torch module: its nodes' modules registered under the nodes' ids,
        ``forward`` running the graph."""

        def __init__(self, graph: Graph) -> None: ...

        def forward(
            self,
            input: Any = None,
            *,
            driver: Any = None,
            turn_limit: int = _soma.DEFAULT_TURN_LIMIT,
            trace: _soma.Trace | None = None,
            timeout: float | None = None,
            micro_batches: int | None = None,
            join: Callable[[list[Any]], Any] | None = None,
            cache: Any = None,
        ) -> Any: ...

        def to(self, *args: Any, **kwargs: Any) -> GraphModule: ...

        def cuda(self, device: Any = None) -> GraphModule: ...

        def cpu(self) -> GraphModule: ...

        def load_state_dict(
            self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
        ) -> Any: ...
