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

from soma import devices, native, remote
from soma._cache import Cache, CacheStats, CacheWarning
from soma._decide import Each, Loop, Switch, each, loop, switch
from soma._dsl import Expr
from soma._graph import Graph
from soma._node import Node
from soma._policy import RetryPolicy
from soma._soma import DEFAULT_TURN_LIMIT, MAX_NESTED_FORWARDS, Await, Ctx, Done, Plan, Span, Trace
from soma._stream import Failed, Progress, StageFigures, Stream, StreamFigures
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
    NodePicklingError,
    PanicError,
    RemoteError,
    RunError,
    SomaError,
    ThreadError,
    TimeLimitError,
    TurnLimitError,
    UnknownNodeError,
    WrongDeviceError,
)

__all__ = [
    "DEFAULT_TURN_LIMIT",
    "MAX_NESTED_FORWARDS",
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
    "Expr",
    "Failed",
    "Graph",
    "GraphError",
    "HostError",
    "InvalidIdError",
    "Loop",
    "Node",
    "NodePicklingError",
    "PanicError",
    "Plan",
    "Progress",
    "RemoteError",
    "RetryPolicy",
    "RunError",
    "SomaError",
    "Span",
    "StageFigures",
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
    "remote",
    "switch",
]
