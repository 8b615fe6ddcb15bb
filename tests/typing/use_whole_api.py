"""Every public name of ``soma``, used once with the types a user would write.

Two checks in one file: ``mypy --strict tests/typing`` (in ``make lint``) proves the stubs and
annotations describe the API — each ``assert_type`` pins what a call returns — and
``tests/test_typing.py`` runs it as a plain script, proving the same lines work. That test also
fails when a name in ``soma.__all__`` (or ``soma.native.__all__``) is not used here: a new
public name comes with a line in this file.
"""

from __future__ import annotations

import asyncio
import pickle
import tempfile
import types
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, assert_type

import soma
from soma import native
from soma.view import RunRecord

E = TypeVar("E", bound=BaseException)

# --- nodes and the DSL ----------------------------------------------------------------------


class Source(soma.Node):
    def forward(self, n: int) -> list[int]:
        return list(range(n))


class Total(soma.Node):
    def forward(self, xs: list[int]) -> int:
        return sum(xs)


class Count(soma.Node):
    def forward(self, xs: list[int]) -> int:
        return len(xs)


class Mean(soma.Node):
    def forward(self, parts: dict[str, int]) -> float:
        return parts["total"] / parts["count"]


class Lookup(soma.Node):
    """Asks the driver for each key, then sums the answers."""

    def forward(self, keys: list[str], ctx: soma.Ctx) -> soma.Await | soma.Done:
        assert_type(ctx.node, str)
        assert_type(ctx.turn, int)
        assert_type(ctx.results, list[Any])
        if ctx.turn == 0:
            return soma.Await(keys)
        return soma.Done(sum(ctx.results))


class Table:
    """A driver: anything with ``perform(requests) -> list``."""

    def __init__(self, data: dict[str, int]) -> None:
        self.data = data

    def perform(self, requests: list[str]) -> list[int]:
        return [self.data[key] for key in requests]


source = Source()
assert_type(source.named("source"), Source)
expr = source >> (Total() | Count()) >> Mean()
assert_type(expr, soma.Expr)
assert_type(soma.Expr.of(Total(), ">>"), soma.Expr)
assert len(expr.nodes) == 4
assert expr.edges == ((0, 1), (0, 2), (1, 3), (2, 3))
assert expr.heads == (0,)
assert expr.terminals == (3,)

# --- nodes from functions and torch modules ------------------------------------------------


@soma.node
def strip(text: str) -> str:
    return text.strip()


@soma.node
def tagged(text: str, ctx: soma.Ctx) -> str:
    return f"{ctx.node}:{text}"


@soma.node
async def later(x: int) -> int:
    await asyncio.sleep(0)
    return x + 1


# The decorated function keeps its signature: called, it is the function.
as_function: Callable[[str], str] = strip
assert_type(strip("  a "), str)
assert as_function(" b ") == "b"
coroutine: Coroutine[Any, Any, int] = later(1)
assert asyncio.run(coroutine) == 2
stripped: soma.FunctionNode = strip.named("strip").on("cpu").retry(1, backoff=0.0)
assert_type(strip.time_limit(5.0), soma.FunctionNode)
assert_type(strip.at("gpu-box"), soma.FunctionNode)
assert_type(strip.concurrency(2), soma.FunctionNode)
assert_type(soma.node(Total()), Total)
upper: soma.NodeFunction[[str], str] = soma.node(str.upper)
words = soma.Graph.somatize(stripped >> upper >> tagged >> (lambda s: s + "!"))
assert_type(strip >> tagged, soma.Expr)
assert_type(Total() >> strip, soma.Expr)
assert words.nodes() == ["strip", "upper", "tagged", "lambda"]
assert words.forward(" a ") == "tagged:A!"
assert soma.Graph.somatize(later >> later).forward(1) == 3
assert issubclass(soma.ModuleNode, soma.Node)
assert issubclass(soma.ModuleError, soma.SomaError)
assert issubclass(soma.StateDictError, RuntimeError)
assert issubclass(soma.PlacementWarning, UserWarning)
if TYPE_CHECKING:  # Not run: torch is not installed where this file runs in `make test`.
    strip(3)  # type: ignore[arg-type]  # mypy sees the function's own signature
    model = words.module()
    assert_type(model, soma.GraphModule)
    assert_type(model.to("cpu"), soma.GraphModule)
    assert_type(model(" a ", micro_batches=None, timeout=1.0), Any)
    node_modules: soma.NodeModules | None = None

# --- a graph, its queries and its plan ------------------------------------------------------

g = soma.Graph.somatize(expr)
assert_type(g, soma.Graph)
assert g.nodes() == ["source", "total", "count", "mean"]
assert g.edges() == [("source", "total"), ("source", "count"), ("total", "mean"), ("count", "mean")]
assert g.roots() == ["source"]
assert g.leaves() == ["mean"]
assert g.predecessors("mean") == ["total", "count"]
assert g.successors("source") == ["total", "count"]
assert g.topological_sort() == ["source", "total", "count", "mean"]
assert g.implementation("source") is source
assert len(g) == 4
assert "mean" in g
assert repr(g).startswith("Graph(4 nodes")

plan = g.plan()
assert_type(plan, soma.Plan)
assert plan.kind == "Sequence"
wave = plan.children[1]
assert_type(wave, soma.Plan)
assert wave.kind == "Wave"
assert [branch.node for branch in wave.children] == ["total", "count"]
assert wave.children[0].inputs == ["source"]
assert plan.shape() == "Sequence([Execute, Wave([Execute, Execute]), Execute])"
assert repr(plan) == (
    "Sequence([Execute(source), Wave([Execute(total), Execute(count)]), Execute(mean)])"
)
assert str(plan).startswith("Sequence\n")
assert plan == soma.Graph.somatize(expr_again := Source() >> (Total() | Count()) >> Mean()).plan()
assert len(expr_again.nodes) == 4
assert hash(plan) == hash(g.plan())
drawings: list[str] = [plan.to_mermaid(), plan.to_dot(), plan.to_svg()]
drawings += [g.to_mermaid(), g.to_dot(), g.to_svg()]
assert all(drawings)

# --- running ---------------------------------------------------------------------------------

mean: Any = g.forward(5)
held: int = g.threads()
g.idle_threads = g.idle_threads + 1
assert mean == 2.0

built = soma.Graph()
first: str = built.node(Lookup())
second: str = built.node("then", native.Add(1))
built.edge(first, second)
assert built.forward(["a", "b"], driver=Table({"a": 1, "b": 20})) == 22
assert soma.DEFAULT_TURN_LIMIT == 64
assert_type(soma.DEFAULT_TURN_LIMIT, int)
assert soma.MAX_NESTED_FORWARDS == 1000
assert_type(soma.MAX_NESTED_FORWARDS, int)

request = soma.Await(["key"])
assert request.requests == ["key"]
assert soma.Done(3).value == 3

trace = soma.Trace()
built.forward(["a"], driver=Table({"a": 1}), trace=trace)
assert len(trace) == 2
spans: list[soma.Span] = trace.spans
span = spans[0]
assert span.node == "lookup"
assert_type(span.start, float)
assert_type(span.end, float)
assert_type(span.duration, float)
assert_type(span.thread, int)
assert_type(span.branch, str)
assert span.turns == 2
assert span.error is None
summary: str = trace.summary(top=1)
chrome: str = trace.to_chrome()
assert summary
assert chrome
assert trace.to_svg()
with tempfile.TemporaryDirectory() as scratch:
    trace.write_chrome(Path(scratch) / "run.json")
trace.clear()
assert len(trace) == 0

# --- watching a run --------------------------------------------------------------------------


class Speaks(soma.Node):
    def forward(self, text: str, ctx: soma.Ctx) -> int:
        for word in text.split():
            ctx.emit(word)
        return len(text.split())


speaking = soma.Graph.somatize(Speaks())
told: list[soma.Event] = list(speaking.events("a b", buffer=100))
assert [event.value for event in told if event.kind == "emitted"] == ["a", "b"]
last_event: soma.Event = told[-1]
assert last_event.kind == "result"
assert last_event.node is None
assert last_event.item is None
assert last_event.dropped == 0
seconds: float | None = told[1].seconds
attempt: int = told[0].attempt
cached: bool = told[0].cached
mapped: list[soma.Event] = list(speaking.map_events(["a", "b c"]))
assert [event.value for event in mapped if event.kind == "result"] == [1, 2]


async def watch_async() -> list[soma.Event]:
    told = [event async for event in speaking.aevents("a")]
    return told + [event async for event in speaking.amap_events(["a"])]


assert asyncio.run(watch_async())[-1].kind == "result"
on: bool = soma.telemetry.enabled()
assert not on
soma.telemetry.disable()

# The browser's view of this process's runs, and the offline report of one.
with soma.view(port=0, quiet=True) as viewed:
    page: str = viewed.url
    speaking.forward("a b")
    recorded: list[RunRecord] = viewed.runs()
    soma.report(recorded[0], Path(tempfile.mkdtemp()) / "run.html")
assert page.startswith("http://127.0.0.1:")

# --- Rust nodes ------------------------------------------------------------------------------

natives: list[native.NativeNode] = [native.Add(1), native.Identity(), native.Sum()]
assert [node.forward(2) for node in natives] == [3, 2, 2]
assert isinstance(native.Panic("kaboom"), soma.Node)

# --- errors ----------------------------------------------------------------------------------

errors: list[type[soma.SomaError]] = [
    soma.GraphError,
    soma.InvalidIdError,
    soma.DuplicateNodeError,
    soma.UnknownNodeError,
    soma.DuplicateEdgeError,
    soma.CycleError,
    soma.CompileError,  # Not reachable from Python: a node is registered with its implementation.
    soma.RunError,
    soma.DriverError,
    soma.ThreadError,
    soma.TurnLimitError,
    soma.PanicError,
    soma.NodePicklingError,
    soma.DeviceError,
    soma.WrongDeviceError,
]
assert all(issubclass(error, soma.SomaError) for error in errors)


def raised(kind: type[E], action: Callable[[], object]) -> E:
    """The `kind` exception `action` raises."""
    try:
        action()
    except kind as error:
        return error
    raise AssertionError(f"expected a {kind.__name__}")


cycle = raised(soma.CycleError, lambda: built.edge(second, first))
assert_type(cycle.path, list[str] | None)
assert cycle.path == ["then", "lookup", "then"]

duplicate = raised(soma.DuplicateEdgeError, lambda: built.edge(first, second))
assert_type(duplicate.source, str | None)
assert (duplicate.source, duplicate.target) == ("lookup", "then")

refused = raised(soma.GraphError, lambda: built.node("then", Total()))
assert isinstance(refused, soma.DuplicateNodeError)
assert_type(refused.node, str | None)
assert refused.node == "then"
assert isinstance(raised(soma.GraphError, lambda: built.node("a b", Total())), soma.InvalidIdError)
assert isinstance(raised(soma.GraphError, lambda: built.edge("a", "b")), soma.UnknownNodeError)

limit = raised(soma.TurnLimitError, lambda: built.forward(["a"], driver=Table({}), turn_limit=1))
assert_type(limit.limit, int | None)
assert (limit.node, limit.limit) == ("lookup", 1)

stopped = raised(soma.RunError, lambda: built.forward(["a"]))
assert isinstance(stopped, soma.DriverError)
assert_type(stopped.node, str | None)
assert stopped.node == "lookup"

panic = raised(soma.PanicError, lambda: soma.Graph.somatize(native.Panic("boom")).forward(None))
assert_type(panic.node, str | None)
assert panic.node == "panic"

unpicklable = soma.Graph()
unpicklable.node("lambda", types.SimpleNamespace(forward=lambda x: x))
not_pickled = raised(soma.NodePicklingError, lambda: pickle.dumps(unpicklable))
assert_type(not_pickled.node, str | None)
assert not_pickled.node == "lambda"
assert pickle.loads(pickle.dumps(soma.Graph.somatize(native.Add(1)))).forward(1) == 2

# --- devices and placement --------------------------------------------------------------------


class Where(soma.Node):
    def forward(self, x: Any, ctx: soma.Ctx) -> str | None:
        return ctx.device


class Gpu:
    """A device backend: a current device per kind, here one for the whole process."""

    kinds: tuple[str, ...] = ("xpu",)

    def __init__(self) -> None:
        self.now = "xpu:0"

    def current(self, kind: str) -> str | None:
        return self.now

    def set(self, device: str) -> None:
        self.now = device


placed = soma.Graph.somatize((Where().named("p").on("xpu:1") | Where().named("q")).on("meta"))
placed.place("q", "cpu")
assert_type(placed.devices(), dict[str, str])
assert placed.devices() == {"p": "xpu:1", "q": "cpu"}
gpu = Gpu()
soma.devices.register(gpu)
assert soma.devices.backend("xpu") is gpu
assert placed.forward(None) == {"p": "xpu:1", "q": "cpu"}
assert gpu.now == "xpu:0"
soma.devices.unregister(gpu)


class Queues:
    """Device queues (what CUDA calls streams) for a backend: the queue current on this thread,
    and events that are the queue they were recorded on."""

    def __init__(self) -> None:
        self.now: object = "default"
        self.made = 0

    def current_queue(self, device: str) -> object:
        return self.now

    def new_queue(self, device: str) -> object:
        self.made += 1
        return f"queue {self.made}"

    def set_queue(self, device: str, queue: object) -> None:
        self.now = queue

    def record(self, queue: object) -> object:
        return queue

    def wait(self, queue: object, event: object) -> None:
        pass


class QueuedGpu(Gpu):
    """A device backend that offers device queues."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks = Queues()

    def queues(self, kind: str) -> soma.devices.QueueHooks | None:
        return self.hooks


queued = QueuedGpu()
soma.devices.register(queued)
assert placed.forward(None) == {"p": "xpu:1", "q": "cpu"}
assert queued.hooks.made == 1, "the branch placed on xpu:1 had a queue of its own"
assert queued.hooks.now == "default", "and the caller's queue is back"
soma.devices.unregister(queued)
placed_trace = soma.Trace()
placed.forward(None, trace=placed_trace)
assert_type(placed_trace.spans[0].device, str | None)
assert "p <- (input) @ xpu:1" in str(placed.plan())
unreadable = raised(soma.DeviceError, lambda: placed.place("p", "cuda"))
assert_type(unreadable.device, str | None)
assert unreadable.device == "cuda"


class Elsewhere(soma.Node):
    class OnCpu:
        device = "cpu"

    def forward(self, x: Any) -> object:
        return self.OnCpu()


elsewhere = soma.Graph.somatize(Elsewhere().on("cuda:0"))
wrong = raised(soma.WrongDeviceError, lambda: elsewhere.forward(None))
assert_type(wrong.found, str | None)
assert (wrong.node, wrong.declared, wrong.found) == ("elsewhere", "cuda:0", "cpu")

# Streams: `map`, its records and figures, micro-batches.
streamed = soma.Graph.somatize(native.Add(1).named("plus") >> native.Add(1).named("again"))
events: list[soma.Progress] = []
stream = streamed.map(range(5), in_flight=2, progress=events.append)
assert_type(stream, soma.Stream)
assert list(stream) == [2, 3, 4, 5, 6]
stream_figures = stream.figures()
assert stream_figures is not None
assert_type(stream_figures, soma.StreamFigures)
stage_figures: list[soma.StageFigures] = stream_figures.stages
assert [stage.nodes for stage in stage_figures] == [["plus"], ["again"]]
assert events[-1].done
collected = list(soma.Graph.somatize(Total()).map([[1], None], on_error="collect"))
failure = collected[1]
assert isinstance(failure, soma.Failed)
assert_type(failure.node, str | None)
assert soma.Graph.somatize(Total()).forward([1, 2, 3], micro_batches=2, join=list) == [3, 3]
assert list(streamed.map([1, 2], ordered=False, concurrency={"plus": 2})) == [(0, 3), (1, 4)]
streamed.concurrency("plus", 2)
assert_type(streamed.concurrencies(), dict[str, int])
assert streamed.concurrencies() == {"plus": 2}
streamed.concurrency("plus", None)

# Hosts: `.at`, `place_at`, `hosts`, the distributed plan, and the transport's names (no Ray run).
hosted = soma.Graph.somatize((Where().named("h1").at("gpu-box") >> Where().named("h2")).at("cpu"))
hosted.place_at("h2", None)
assert_type(hosted.hosts(), dict[str, str])
assert hosted.hosts() == {"h1": "gpu-box"}
sliced = hosted.distributed_plan()
assert_type(sliced, soma.Plan)
assert_type(sliced.children[0].host, str | None)
assert sliced.children[0].host == "gpu-box"
bad_host = raised(soma.HostError, lambda: hosted.place_at("h1", "no such host"))
assert_type(bad_host.host, str | None)
assert issubclass(soma.RemoteError, soma.RunError)
assert issubclass(soma.CancelledError, soma.RunError)
remote_traceback = soma.errors.RemoteTraceback("gpu-box", "Traceback ...")
assert_type(remote_traceback.host, str)
assert "gpu-box" in str(remote_traceback)
assert_type(soma.remote.resource_of("gpu-box"), str)
assert soma.remote.RESOURCE_PREFIX == "soma-host:"

# Retries and time limits: on a node, on an expression, by id; the error of a call that overran.
policied = soma.Graph.somatize(Where().named("p1").retry(2, backoff=0.0) >> Where().named("p2"))
policied.time_limit("p2", 30.0)
retries = policied.retries()
assert_type(retries, dict[str, soma.RetryPolicy])
assert retries["p1"] == soma.RetryPolicy(2, 0.0, (Exception,))
assert_type(policied.time_limits(), dict[str, float])
assert issubclass(soma.TimeLimitError, TimeoutError)
assert_type(soma.TimeLimitError("late").limit, float | None)

# Running again: a cache, its stats, a warning class, and the trace's mark of a hit.
kept = soma.Cache()
assert kept.path is None
chained = soma.Graph.somatize(Where().named("w1") >> Where().named("w2"))
cache_trace = soma.Trace()
assert chained.forward(1, cache=kept) == chained.forward(1, cache=kept, trace=cache_trace)
assert_type(cache_trace.spans[0].cached, bool)
assert all(span.cached for span in cache_trace.spans)
stats: soma.CacheStats = kept.stats()
assert_type(stats.hits, int)
assert_type(stats.seconds_saved, float)
assert (stats.hits, stats.misses) == (2, 2)
assert_type(kept.would_hit(chained, 1), dict[str, bool])
assert kept.would_hit(chained, 1) == {"w1": True, "w2": True}
assert issubclass(soma.CacheWarning, UserWarning)
with tempfile.TemporaryDirectory() as folder:
    on_disk = soma.Cache(folder)
    assert_type(on_disk.path, Path | None)
    assert list(chained.map([1, 2], cache=on_disk)) == [chained.forward(1), chained.forward(2)]
    # `w1` runs on each item; `w2` reads the same output of it (`None`) for both: one entry.
    assert len(on_disk) == 3

# Graphs that decide as they run: each item, one case, a body until done.
mapped_step: soma.Each = soma.each(Where().named("item"), in_flight=2).named("items")
routed_step: soma.Switch = soma.switch(lambda n: "small" if n < 10 else "big", {"small": None})
looped_step: soma.Loop = soma.loop(Where(), until=lambda out: out is None, max_iterations=3)
deciding = soma.Graph.somatize(Source() >> mapped_step)
assert deciding.forward(3) == [None, None, None]
map_plan = deciding.plan().children[1]
assert (map_plan.kind, map_plan.bound, map_plan.keys) == ("Map", 2, [])
assert_type(map_plan.bound, int | None)
assert_type(map_plan.keys, list[str])
assert soma.Graph.somatize(routed_step).forward(3) == 3
assert soma.Graph.somatize(looped_step).forward(3) is None

# Async nodes: `async def forward`, with or without `ctx`; `aforward` and `amap` from a loop,
# `forward` from none.


class Fetch(soma.Node):
    async def forward(self, x: int) -> int:
        await asyncio.sleep(0)
        return x + 1


class FetchWithCtx(soma.Node):
    async def forward(self, x: int, ctx: soma.Ctx) -> str:
        return f"{ctx.node}:{x}"


fetched = soma.Graph.somatize(Fetch().named("fetch") >> FetchWithCtx().named("told"))


async def closed() -> None:
    pass


async def use_async() -> list[Any]:
    one: Any = await fetched.aforward(1, timeout=30.0, trace=soma.Trace(), cache=soma.Cache())
    await soma.on_loop_close(closed)
    stream: AsyncIterator[Any] = fetched.amap([1, 2], in_flight=2, concurrency={"fetch": 2})
    skipping: soma.AsyncStream = fetched.amap([1], ordered=False, on_error="skip")
    pairs = [pair async for pair in skipping]
    failures: list[soma.Failed] = skipping.failures
    return [one, *[y async for y in stream], *pairs, *failures]


assert asyncio.run(use_async()) == ["told:2", "told:2", "told:3", (0, "told:2")]
assert fetched.forward(4) == "told:5"

# Runs that survive: a journal, a run that pauses for an answer, its resume, and the history.

effects_made: list[str] = []


def send(what: str) -> str:
    effects_made.append(what)
    return what


class Approve(soma.Node):
    def forward(self, x: int, ctx: soma.Ctx) -> str:
        sent: str = ctx.effect(send, "sent")
        answer: Any = ctx.ask(f"approve {x}?")
        return f"{sent}:{answer}"


class AsyncApprove(soma.Node):
    async def forward(self, x: int, ctx: soma.Ctx) -> str:
        made: int = await ctx.aeffect(asyncio.sleep, 0, x)
        answer: Any = await ctx.aask("again?")
        return f"{made}:{answer}"


with tempfile.TemporaryDirectory() as runs_folder:
    journal = soma.Journal(Path(runs_folder) / "runs.db", key=b"secret", lease=5.0)
    approving = soma.Graph.somatize(Approve().named("approve"))
    first_pause: soma.Paused | None = None
    try:
        approving.forward(1, run="first", journal=journal)
    except soma.Paused as paused:
        first_pause = paused
    assert first_pause is not None
    assert_type(first_pause.questions, dict[str, object])
    assert (first_pause.run, first_pause.questions) == ("first", {"approve": "approve 1?"})
    assert approving.resume("first", journal=journal, answers={"approve": "yes"}) == "sent:yes"
    assert effects_made == ["sent"]
    asking = soma.Graph.somatize(AsyncApprove().named("ask"))

    async def use_journal() -> Any:
        asked: list[str] = []
        try:
            await asking.aforward(2, run="second", journal=journal)
        except soma.Paused as paused:
            asked = list(paused.questions)
        assert asked == ["ask"]
        return await asking.aresume("second", journal=journal, answers={"ask": "no"})

    assert asyncio.run(use_journal()) == "2:no"
    listed: list[soma.JournalRun] = soma.runs(journal)
    assert [(run.id, run.status, run.done, run.nodes) for run in listed] == [
        ("second", "finished", 1, 1),
        ("first", "finished", 1, 1),
    ]
    warned: type[Warning] = soma.JournalWarning
    # A stream with an id: paused at an item's question, taken up by map with the answers.
    streamed_pause: soma.Paused | None = None
    try:
        list(approving.map([3], run="streamed", journal=journal))
    except soma.Paused as paused:
        streamed_pause = paused
    assert streamed_pause is not None
    answered: soma.Stream = approving.map(
        [3], run="streamed", journal=journal, answers={"approve": "yes"}
    )
    assert list(answered) == ["sent:yes"]

    async def use_journaled_amap() -> list[Any]:
        return [y async for y in asking.amap([4], run="streamed-async", journal=journal)]

    amap_paused = False
    try:
        asyncio.run(use_journaled_amap())
    except soma.Paused:
        amap_paused = True
    assert amap_paused
    journal.close()
