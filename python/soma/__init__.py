"""Soma: compose nodes with ``>>`` and ``|``, compile the graph into a plan of waves, run it.

>>> import soma
>>> class Double(soma.Node):
...     def forward(self, x: int) -> int:
...         return 2 * x
>>> g = soma.Graph.somatize(Double().named("a") >> (Double().named("b") | Double().named("c")))
>>> g.plan()
Sequence([Execute(a), Wave([Execute(b), Execute(c)])])
>>> g.forward(1)
{'b': 4, 'c': 4}
"""

from typing import TYPE_CHECKING, Any

from soma import devices, native, remote, telemetry
from soma._build import module as _module
from soma._build.decide import Each, Loop, Switch, each, loop, switch
from soma._build.dsl import Expr
from soma._build.function import FunctionNode, ModuleNode, NodeFunction, node
from soma._build.module import PlacementWarning
from soma._build.node import Node
from soma._build.policy import RetryPolicy
from soma._graph import Graph
from soma._run.events import Event
from soma._run.loop_close import on_loop_close
from soma._run.stream import AsyncStream, Failed, Progress, StageFigures, Stream, StreamFigures
from soma._soma import DEFAULT_TURN_LIMIT, MAX_NESTED_FORWARDS, Await, Ctx, Done, Plan, Span, Trace
from soma.cache._cache import Cache, CacheStats, CacheWarning
from soma.errors import (
    CancelledError,
    CompileError,
    CycleError,
    DeviceError,
    DriverError,
    DuplicateEdgeError,
    DuplicateNodeError,
    GraphError,
    HostError,
    InvalidIdError,
    ModuleError,
    NodePicklingError,
    PanicError,
    RemoteError,
    RunError,
    SomaError,
    StateDictError,
    ThreadError,
    TimeLimitError,
    TurnLimitError,
    UnknownNodeError,
    WrongDeviceError,
)
from soma.journal import Journal, JournalRun, JournalWarning, Paused

# The function, bound over the package of `python -m soma.runs` of the same name: imported
# first, that package is in place, and importing it again (or its command) never rebinds it.
from soma.runs import runs
from soma.view import report, view

if TYPE_CHECKING:
    from soma._build.module import GraphModule as GraphModule
    from soma._build.module import NodeModules as NodeModules


def __getattr__(name: str) -> Any:
    """``soma.GraphModule`` and ``soma.NodeModules``, torch modules: made (and torch imported)
    when first read, so that ``import soma`` never imports torch. Not in ``__all__``, so that
    ``from soma import *`` does not either."""
    if name in ("GraphModule", "NodeModules"):
        return getattr(_module, name)
    raise AttributeError(f"module 'soma' has no attribute {name!r}")


__all__ = [
    "DEFAULT_TURN_LIMIT",
    "MAX_NESTED_FORWARDS",
    "AsyncStream",
    "Await",
    "Cache",
    "CacheStats",
    "CacheWarning",
    "CancelledError",
    "CompileError",
    "Ctx",
    "CycleError",
    "DeviceError",
    "Done",
    "DriverError",
    "DuplicateEdgeError",
    "DuplicateNodeError",
    "Each",
    "Event",
    "Expr",
    "Failed",
    "FunctionNode",
    "Graph",
    "GraphError",
    "HostError",
    "InvalidIdError",
    "Journal",
    "JournalRun",
    "JournalWarning",
    "Loop",
    "ModuleError",
    "ModuleNode",
    "Node",
    "NodeFunction",
    "NodePicklingError",
    "PanicError",
    "Paused",
    "PlacementWarning",
    "Plan",
    "Progress",
    "RemoteError",
    "RetryPolicy",
    "RunError",
    "SomaError",
    "Span",
    "StageFigures",
    "StateDictError",
    "Stream",
    "StreamFigures",
    "Switch",
    "ThreadError",
    "TimeLimitError",
    "Trace",
    "TurnLimitError",
    "UnknownNodeError",
    "WrongDeviceError",
    "devices",
    "each",
    "loop",
    "native",
    "node",
    "on_loop_close",
    "remote",
    "report",
    "runs",
    "switch",
    "telemetry",
    "view",
]
