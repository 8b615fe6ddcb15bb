"""Nodes from what is not a ``soma.Node``: plain functions (``@soma.node``) and torch modules.

``@soma.node`` on a ``def`` or ``async def`` — or ``soma.node(f)`` on a bound method, a callable
object, a library's function — makes a :class:`NodeFunction`: still the function when called,
and a blueprint of nodes wherever it stands in a graph, as a class is. Each use makes a new
:class:`FunctionNode` of it, so one function twice in a graph is two nodes (``clean``,
``clean_2``), and ``.named()``, ``.on()``, ``.retry()`` on it make a node and set it.

A function's nodes are instances of one class made for the function, named after it, whose
``forward`` is the function itself, held as a ``staticmethod``: the graph calls the function
with no call in between, names the node as it names a class's (the snake_case of its name,
made unique), and reads its shape once per function. A ``ctx`` is passed when the function has
a parameter of that name: as the second argument when it is the second parameter, by keyword
otherwise, through a small function that adds it.

A torch module is a node of its own (``soma.node(nn.Linear(64, 256))``, or a module standing
in an expression): a :class:`ModuleNode`, of a class named after the module's, whose
``forward`` calls the module, so its hooks run. torch is never imported here: a module is
recognised by its class only when ``torch`` is in ``sys.modules`` already, as it is wherever a
module exists.

:func:`as_node` is the one rule that says what becomes a node where a node is expected: the DSL
(``Node >> function``, ``function >> Node``) and ``Graph.node`` ask it, the DSL through the
hook it keeps for this module (it knows nothing of nodes).
"""

from __future__ import annotations

import abc
import functools
import inspect
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast, overload

from soma._build import dsl as _dsl
from soma._build.decide import _is_async as is_async_callable
from soma._build.dsl import Composable, Expr, refuse_class
from soma._build.node import Node

P = ParamSpec("P")
R = TypeVar("R", covariant=True)
N = TypeVar("N", bound=Node)


class FunctionNode(Node):
    """A node that calls a function: ``forward`` is the function (``self.function``, the
    ``function`` of its blueprint) itself.

    Made by a :class:`NodeFunction` wherever it stands in a graph, each an instance of the
    class made for that function and named after it; ``type(node)()`` makes another.
    Pickled as the function's blueprint and the node's settings, so it pickles wherever the
    function does (a function defined at the top level of a module).
    """

    # The blueprint the class was made for, set on each class made (see `NodeFunction`).
    _soma_template: NodeFunction[..., Any]

    def __init__(self) -> None:
        # In the node's state, so that a cache key covers the function's code (and a bound
        # method's object), as it covers any callable a node holds.
        self.function: Callable[..., Any] = type(self)._soma_template.__wrapped__

    def __reduce__(self) -> tuple[Any, ...]:
        state = {name: value for name, value in vars(self).items() if name != "function"}
        return (_restamped, (type(self)._soma_template, state))

    def __repr__(self) -> str:
        return f"soma.node({self.function!r})"


def _restamped(template: NodeFunction[..., Any], state: dict[str, Any]) -> FunctionNode:
    """The node ``FunctionNode.__reduce__`` saved."""
    node = template._node_class()
    node.__dict__.update(state)
    return node


class NodeFunction(Generic[P, R]):
    """A function made a node's blueprint by ``@soma.node`` (or ``soma.node(f)``).

    Called, it is the function. Standing in an expression (``clean >> embed``), given to
    ``Graph.node`` or ``soma.each``, it is a new :class:`FunctionNode` each time, as a class
    makes a new instance; ``.named()``, ``.on()``, ``.at()``, ``.retry()``, ``.time_limit()`` and
    ``.concurrency()`` make one and set it. Pickled by reference where it is the module's own
    name (a decorated function at the top level), else as the function it wraps.

    Made by ``soma.node(function)``, which says what ``function`` may be.
    """

    __wrapped__: Callable[P, R]

    def __init__(self, function: Callable[P, R]) -> None:
        refuse_class(function, verb="give", call="soma.node(")
        if not callable(function):
            raise TypeError(
                f"soma.node takes a function, a callable or a torch module, not an object of "
                f"type `{type(function).__name__}`\n"
                "hint: decorate a `def` with `@soma.node`, or subclass soma.Node"
            )
        self.__wrapped__ = function
        inner = _unwrapped(function)
        name = getattr(inner, "__name__", None)
        name = name if isinstance(name, str) and name else type(inner).__name__
        self.__name__ = name
        self.__qualname__ = getattr(inner, "__qualname__", name)
        self.__module__ = getattr(inner, "__module__", None) or type(inner).__module__
        self.__doc__ = getattr(inner, "__doc__", None)
        forward, shape = _calling(function, name)
        self._node_class = cast(
            type[FunctionNode],
            abc.ABCMeta(
                name.strip("<>") or "function",  # A lambda's nodes: `lambda`, `lambda_2`.
                (FunctionNode,),
                {
                    "forward": staticmethod(forward),
                    "_soma_forward_shape": shape,
                    "_soma_template": self,
                    "__module__": self.__module__,
                    "__qualname__": self.__qualname__,
                    "__doc__": self.__doc__,
                },
            ),
        )

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.__wrapped__(*args, **kwargs)

    def _stamp(self) -> FunctionNode:
        """A new node of this function."""
        return self._node_class()

    def named(self, node_id: str) -> FunctionNode:
        """A new node of this function, with id ``node_id`` (see ``soma.Node.named``)."""
        return self._stamp().named(node_id)

    def on(self, device: str) -> FunctionNode:
        """A new node of this function, placed on ``device`` (see ``soma.Node.on``)."""
        return self._stamp().on(device)

    def at(self, host: str) -> FunctionNode:
        """A new node of this function, run on ``host`` (see ``soma.Node.at``)."""
        return self._stamp().at(host)

    def retry(
        self,
        times: int,
        backoff: float = 0.5,
        on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    ) -> FunctionNode:
        """A new node of this function, with retries: ``times``, ``backoff`` and ``on`` as in
        ``soma.Node.retry``, which says what it raises."""
        return self._stamp().retry(times, backoff, on)

    def time_limit(self, seconds: float) -> FunctionNode:
        """A new node of this function, with a time limit per call of ``seconds``, as in
        ``soma.Node.time_limit``, which says what it raises."""
        return self._stamp().time_limit(seconds)

    def concurrency(self, workers: int) -> FunctionNode:
        """A new node of this function, taking up to ``workers`` items of a stream at once (see
        ``soma.Node.concurrency``)."""
        return self._stamp().concurrency(workers)

    def __rshift__(self, other: object) -> Expr:
        return self._stamp() >> other

    def __rrshift__(self, other: object) -> Expr:
        return self._stamp().__rrshift__(other)

    def __or__(self, other: object) -> Expr:
        return self._stamp() | other

    def __ror__(self, other: object) -> Expr:
        return self._stamp().__ror__(other)

    def __reduce__(self) -> str | tuple[Any, ...]:
        # By name where the module holds this very blueprint under it: the function it wraps
        # cannot be pickled by name then (its name is this blueprint's).
        held: Any = sys.modules.get(self.__module__)
        for part in self.__qualname__.split("."):
            held = getattr(held, part, None)
        if held is self:
            return str(self.__qualname__)
        return (NodeFunction, (self.__wrapped__,))

    def __repr__(self) -> str:
        return f"soma.node({self.__wrapped__!r})"


def _unwrapped(function: Callable[..., Any]) -> Any:
    """What a function's nodes are named after (its name, else its class's for a callable
    object): the function itself, or the one a partial binds."""
    while isinstance(function, functools.partial):
        function = function.func
    return function


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _calling(
    function: Callable[..., Any], name: str
) -> tuple[Callable[..., Any], tuple[bool, bool]]:
    """What the graph calls for ``function`` — the function itself, or for a ``ctx`` it takes by
    keyword a function that passes it so — and its shape: whether it takes a ``ctx``, and
    whether it is async. Refuses, naming the function, one that cannot take a node's input."""
    is_async = is_async_callable(function)
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # A builtin without a signature: called with its input.
        return function, (False, is_async)
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    takes_many = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    ctx = next((p for p in parameters if p.name == "ctx" and p.kind not in _VARIADIC), None)
    if not positional and not takes_many:
        raise TypeError(
            f"`{name}` takes no positional parameter, where a node's function takes its input\n"
            f"hint: `def {name}(x)`: a root node receives the graph's input (`None` when "
            "`forward()` is given none)"
        )
    if positional and positional[0] is ctx:
        raise TypeError(
            f"`{name}` takes `ctx` first, where a node's function takes its input first\n"
            f"hint: `def {name}(x, ctx)`"
        )
    required = [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind not in _VARIADIC
        and p is not ctx
        and not (positional and p is positional[0])
    ]
    if required:
        listed = ", ".join(f"`{parameter}`" for parameter in required)
        raise TypeError(
            f"`{name}` needs {listed} beside its input, where a node's function is called with "
            "its input alone (and `ctx`)\nhint: a node with several predecessors receives one "
            "dict keyed by their ids; give the other parameters defaults, or bind them with "
            "functools.partial"
        )
    if ctx is None:
        return function, (False, is_async)
    if len(positional) >= 2 and positional[1] is ctx:
        return function, (True, is_async)
    if ctx.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(
            f"`{name}` takes `ctx` by position but not second, so it cannot be passed\n"
            f"hint: make `ctx` the second parameter, or keyword-only: `def {name}(x, *, ctx)`"
        )
    return _ctx_by_keyword(function, is_async), (True, is_async)


def _ctx_by_keyword(function: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    """``function``, called with its input and ``ctx=ctx``."""
    if is_async:

        async def forward_async(x: Any, ctx: Any) -> Any:
            return await function(x, ctx=ctx)

        return forward_async

    def forward(x: Any, ctx: Any) -> Any:
        return function(x, ctx=ctx)

    return forward


class ModuleNode(Node):
    """A torch module as a node: ``forward`` calls ``self.module`` (so its hooks run), the
    ``module`` it was made with by ``soma.node(module)``.

    Each an instance of a class named after the module's (``nn.Linear`` makes ``linear``); one
    module is one node, as a node instance is. Placed with ``.on(device)``, it moves the
    tensors it receives onto that device first (a tensor, or those directly in a dict, tuple or
    list: what a node with several predecessors receives), a copy that autograd follows.
    """

    def __init__(self, module: Any) -> None:
        self.module = module

    def forward(self, x: Any, ctx: Any) -> Any:
        """Calls the module on ``x`` (moved first onto the node's device, as ``ctx`` says, if
        it is placed) and returns what it returns; what the module raises comes out as
        itself."""
        device = ctx.device
        if device is not None:
            x = _onto(x, device)
        return self.module(x)

    def __reduce__(self) -> tuple[Any, ...]:
        state = {name: value for name, value in vars(self).items() if name != "module"}
        return (_module_node, (self.module, state))

    def __repr__(self) -> str:
        return f"soma.node({type(self.module).__name__}(...))"


def _module_node(module: Any, state: dict[str, Any] | None = None) -> ModuleNode:
    """A new node of ``module``, of the node class named after the module's class."""
    cls = type(module)
    node_class = _MODULE_NODE_CLASSES.get(cls)
    if node_class is None:
        node_class = cast(
            type[ModuleNode],
            abc.ABCMeta(
                cls.__name__,
                (ModuleNode,),
                {"__module__": __name__, "__qualname__": f"ModuleNode[{cls.__qualname__}]"},
            ),
        )
        _MODULE_NODE_CLASSES[cls] = node_class
    node = node_class(module)
    if state:
        node.__dict__.update(state)
    return node


# The node class made for each module class: one per class, so that building a large graph of
# modules makes few classes.
_MODULE_NODE_CLASSES: weakref.WeakKeyDictionary[type, type[ModuleNode]] = (
    weakref.WeakKeyDictionary()
)


def _onto(x: Any, device: str) -> Any:
    """``x`` with its tensors on ``device``: ``x`` itself, or those directly in a dict, tuple or
    list; what is there already is not copied."""
    tensor = sys.modules["torch"].Tensor
    if isinstance(x, tensor):
        return x if str(x.device) == device else x.to(device)
    if type(x) is dict:
        return {key: _onto(value, device) for key, value in x.items()}
    if type(x) in (tuple, list):
        return type(x)(_onto(value, device) for value in x)
    return x


def is_torch_module(item: object) -> bool:
    """Whether ``item`` is a ``torch.nn.Module``, without importing torch: where torch is not
    loaded, no module can exist."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(item, torch.nn.Module)


# The blueprint made for each function met in an expression, so that a function written many
# times makes one class; an entry leaves with its blueprint's last node.
# Kept for plain functions only, which hash by identity (a bound method hashes its object).
_TEMPLATES: weakref.WeakValueDictionary[Any, NodeFunction[..., Any]] = weakref.WeakValueDictionary()


def _template_of(function: Callable[..., Any]) -> NodeFunction[..., Any]:
    if type(function) is not types.FunctionType:
        return NodeFunction(function)
    template = _TEMPLATES.get(function)
    if template is None or template.__wrapped__ is not function:
        template = _TEMPLATES[function] = NodeFunction(function)
    return template


def as_node(item: object) -> Composable | None:
    """``item`` as a node where a node is expected and ``item`` is none: a new node of a
    :class:`NodeFunction`, a :class:`ModuleNode` of a torch module, a :class:`FunctionNode` of
    any other callable; ``None`` for the rest (an object with a ``forward`` of its own is a node
    as it is, in a graph, and is refused in an expression). Classes are the caller's to
    refuse."""
    if isinstance(item, NodeFunction):
        return item._stamp()
    if is_torch_module(item):
        return _module_node(item)
    if callable(getattr(item, "forward", None)) or not callable(item) or isinstance(item, type):
        return None
    return _template_of(cast(Callable[..., Any], item))._stamp()


_dsl.wrap_with(as_node)


class _TorchModule(Protocol):
    """What the typing sees of a ``torch.nn.Module``: parameters to train (a function has none,
    so a function never reads as one)."""

    training: bool

    def parameters(self, recurse: bool = ...) -> Iterator[Any]: ...


@overload
def node(target: N) -> N: ...


@overload
def node(target: _TorchModule) -> ModuleNode: ...


@overload
def node(target: Callable[P, R]) -> NodeFunction[P, R]: ...


def node(target: Any) -> Any:
    """A node, or a node's blueprint, of ``target``.

    On a function — ``@soma.node`` on a ``def`` or ``async def``, or ``soma.node(f)`` on a bound
    method, a callable object, a library's function — a :class:`NodeFunction`: the function
    when called, a new node wherever it stands in a graph. The node calls the function with its
    input, and with ``ctx`` too where the function has a parameter of that name; it is named
    after the function. A ``def`` that cannot take a node's input (no parameter, or another one
    without a default) is refused here, naming it.

    On a torch module, a :class:`ModuleNode` calling it, named after its class. On a node, the
    node itself.
    """
    if isinstance(target, (Node, NodeFunction)):
        return target
    if isinstance(target, Expr):
        raise TypeError(
            "soma.node takes one function, callable or torch module, not an expression\n"
            "hint: an expression of nodes is composed as it is: `soma.Graph.somatize(expr)`"
        )
    refuse_class(target, verb="give", call="soma.node(")
    if is_torch_module(target):
        return _module_node(target)
    return NodeFunction(target)
