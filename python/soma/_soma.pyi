"""Stubs of the compiled glue module ``soma._soma``."""

import os
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import Any, Literal, NoReturn, Self, final, overload

from soma.errors import HostError

__all__ = [
    "DEFAULT_TURN_LIMIT",
    "MAX_NESTED_FORWARDS",
    "Await",
    "Board",
    "CacheCounts",
    "Ctx",
    "Done",
    "FlowCore",
    "FlowNext",
    "GraphCore",
    "Hasher",
    "MemoryEntries",
    "NativeNode",
    "Plan",
    "Remembered",
    "Span",
    "Stepper",
    "StopFlag",
    "StreamCore",
    "Trace",
    "Witness",
    "_at_exit",
    "_carry_context",
    "_journal_run_held",
    "_thread_in_reserve",
    "arrow_text",
    "blake3",
    "boarded_runs",
    "checked_timeout",
    "code_digest",
    "host_refused",
    "hosts_past_timeout",
    "node_inside",
    "observe",
    "parse_device",
    "parse_host",
    "reach",
    "run_number",
    "step_and_rest",
    "text_column",
    "text_pack",
    "text_unpack",
    "write_hashed",
    "xxh3_128",
]

DEFAULT_TURN_LIMIT: int
"""How many calls a node that awaits gets in a run (64) unless ``forward(x, turn_limit=n)`` says
otherwise; one still awaiting on its last raises ``soma.TurnLimitError``."""
MAX_NESTED_FORWARDS: int
"""How deep ``forward`` calls may nest inside nodes, across threads (1,000): a deeper one raises
``RecursionError`` before it starts."""

def blake3(data: bytes | memoryview | Any) -> bytes:
    """The 32-byte BLAKE3 digest of ``data``: bytes or any C-contiguous buffer (a numpy
    array), read in place; a large one with the GIL released."""

def write_hashed(
    path: str | os.PathLike[str],
    at: int,
    pieces: list[bytes | memoryview | Any],
    checksum: Literal["blake3", "xxh3"],
) -> bytes:
    """Writes ``pieces`` (bytes or C-contiguous buffers, read in place), one after the other,
    into the existing file at ``path`` from byte ``at`` on, and returns the ``checksum`` of
    those bytes (BLAKE3's 32 bytes, or XXH3-128's 16 as :func:`xxh3_128` gives them), the GIL
    released; a large payload checksummed on a second thread while it is written. Raises
    ``OSError`` when the file cannot be opened or written, ``ValueError`` for another
    ``checksum``."""

def xxh3_128(data: bytes | memoryview | Any) -> bytes:
    """The 16-byte XXH3-128 checksum of ``data`` (its canonical big-endian form): bytes or any
    C-contiguous buffer, read in place; a large one with the GIL released."""

def text_column(array: Any) -> bytes | None:
    """The 32-byte digest of a C-contiguous ``numpy.ndarray`` of dtype ``object`` whose
    elements are each exactly a ``str`` (with a UTF-8 form), ``None`` or a ``float``, read from
    its pointers (a large one on a few threads) with the GIL held; ``None`` for any other
    array. Its dtype and shape are the caller's to key."""

def arrow_text(
    chunks: list[tuple[Any | None, Any, Any | None, int, int]], wide: bool
) -> bytes | None:
    """The 32-byte digest of an Arrow text column (``string``, ``binary``, and with ``wide``
    their ``large_`` kin) made of ``chunks``, each ``(validity, offsets, data, offset,
    length)`` as the array's buffers and offset say, read in place: the same as
    :func:`text_column`'s of the same strings whatever the chunks, ``None`` standing for a
    missing value; ``None`` when an offset lies outside its buffers."""

def text_pack(array: Any) -> bytes | None:
    """The array :func:`text_column` reads, packed for a cache entry: its distinct elements
    once each and an index per element; ``None`` for any other array."""

def text_unpack(packed: bytes, shape: tuple[int, ...]) -> Any:
    """A new ``numpy.ndarray`` of dtype ``object`` and ``shape`` from :func:`text_pack`'s
    bytes; raises ``ValueError`` for bytes it did not write."""

@final
class Hasher:
    """An incremental BLAKE3 hash: ``update`` with bytes or buffers, then ``digest``."""

    def __init__(self) -> None: ...
    def update(self, data: bytes | memoryview | Any) -> None:
        """Feeds ``data``: bytes, or any C-contiguous buffer, read in place."""
    def digest(self) -> bytes:
        """The 32-byte digest of everything fed so far."""

@final
class MemoryEntries:
    """A memory cache's entries by key, the least recently used dropped first past
    ``max_bytes``; each method one call, with no Python lock to convoy on."""

    def __new__(cls, max_bytes: int | None) -> MemoryEntries: ...
    def used(self, key: bytes) -> Any | None:
        """The entry under ``key``, now the most recently used; ``None`` when there is none."""
    def peek(self, key: bytes) -> Any | None:
        """The entry under ``key``, its last use left as it was; ``None`` when there is none."""
    def put(self, key: bytes, entry: Any, size: int) -> tuple[bool, int]:
        """Files ``entry`` of ``size`` bytes under ``key``: whether it was kept, and how many
        least recently used others it dropped to make room."""
    def __len__(self) -> int: ...

@final
class CacheCounts:
    """What a cache did since it was made, each count added to in one call."""

    def __init__(self) -> None: ...
    def add(
        self,
        *,
        hits: float = 0.0,
        misses: float = 0.0,
        corrupted: float = 0.0,
        bytes_read: float = 0.0,
        bytes_written: float = 0.0,
        seconds_saved: float = 0.0,
        evicted: float = 0.0,
    ) -> None:
        """Adds to the counts; a negative amount takes back what was counted too soon."""
    def read(self) -> list[float]:
        """Hits, misses, corrupted, bytes read, bytes written, seconds saved and evicted, read
        at one moment."""

def code_digest(code: Any) -> bytes:
    """The 32-byte digest of a code object: its instructions, names, constants (nested code
    included), argument counts, flags and exception table, not its file name or line numbers;
    remembered by the code object."""

def reach(
    root: type | Callable[..., Any],
    files: dict[str, bool],
    users_file: Callable[[str], bool],
    users: Callable[[object], bool],
    load: Callable[[str], object],
) -> tuple[bytes, Witness, list[str]]:
    """The digest of what the class or function ``root`` of the user's reaches by name, the
    witness of the bindings it was read from, and where each volatile binding lies."""

@final
class Remembered:
    """A node's fingerprint as remembered: the node (weakly), the digest of what cannot change
    in place, the witness of what it was read from, and where its volatile bindings lie."""

    def __new__(
        cls, node: weakref.ref[Any], stable: bytes, witness: Witness, wheres: tuple[str, ...]
    ) -> Remembered: ...
    @property
    def node(self) -> weakref.ref[Any]: ...
    @property
    def stable(self) -> bytes: ...
    @property
    def witness(self) -> Witness: ...
    @property
    def wheres(self) -> tuple[str, ...]: ...

@final
class Witness:
    """What a remembered digest was made from: bindings that must still hold the objects they
    held, each checked by identity."""

    def __new__(
        cls, owners: Iterable[tuple[object, Iterable[tuple[Any, ...]]]], parts: list[Witness] = ...
    ) -> Witness: ...
    def current(self) -> tuple[object, ...] | None:
        """What the volatile bindings hold now, parts first; ``None`` when a binding no longer
        holds the object it held."""
    def __len__(self) -> int:
        """How many bindings it checks, its parts' included."""

def _at_exit() -> None:
    """The hook run at interpreter exit: Soma's threads stop entering the interpreter, and the
    exit waits a quarter of a second at most for those inside (registered on import; not API)."""

def _carry_context(on: bool) -> bool:
    """Switches context carry off or on for every run (the benchmark's switch, not API);
    returns whether it was on."""

def _journal_run_held(held: bool) -> None:
    """Counts a run with a journal this process holds, or no longer (``soma.journal`` calls it
    where a run begins and ends): while none is held, a node's call reads no journal. Not
    API."""

def _thread_in_reserve() -> bool:
    """Whether a thread waits in the process's reserve, filled first if it was taken (for
    tests that count the process's threads; not API)."""

def observe(target: Any | None, boards: tuple[int, int] | None = None) -> None:
    """Installs ``target`` as the process's observer of runs (``soma._run.observe``); ``None``
    removes it. With ``boards`` — how many finished runs, of how many nodes in all, the ledger
    :func:`boarded_runs` takes from keeps until they are taken — each run of ``forward`` and
    ``aforward`` keeps a :class:`Board`, which goes in that ledger as the run begins, with what
    the run tells as it begins and ends (``target`` is told neither), and the calls of nodes
    that are not awaited are told ``target`` only when they fail. Not API."""

def boarded_runs() -> list[Board]:
    """The boards of the runs begun since the last call, in the order they began. Not API."""

def run_number() -> int:
    """A number for a run the view lists, from this process's one count. Not API."""

def checked_timeout(seconds: object) -> float:
    """``seconds`` if it is a timeout every run accepts: a finite number of seconds, 0 or more;
    otherwise the ``ValueError`` that says so."""

def hosts_past_timeout(timeout: float | None, still: str) -> TimeoutError:
    """The ``TimeoutError`` of ``forward`` on hosts past its ``timeout``, ``still`` saying what
    it left where (``"; still running: ..."``), worded as every run's. Not API."""

def parse_device(text: str) -> str: ...
def parse_host(text: str) -> str: ...
def host_refused(kind: str, node: str, own: bool) -> HostError: ...
def node_inside(step: str, id: str, key: str | None = None) -> str:
    """The id of node ``id`` inside step ``step`` (its case ``key``'s, for a switch) as the graph
    around the step holds it: ``step/id`` or ``step/key/id``; a key holding ``/`` is a
    ``soma.InvalidIdError``."""

def step_and_rest(id: str) -> tuple[str, str] | None:
    """The outermost step ``id`` is inside of, and its id inside that step; ``None`` for a node
    of the graph itself."""

@final
class Await:
    """Asks the driver; the node is called again with the answers in ``ctx.results``."""

    # A PyO3 class is built by `__new__`, and its special methods take positional arguments
    # only: the stubs say so, as `mypy.stubtest` checks against the compiled module.
    def __new__(cls, requests: Iterable[Any]) -> Await: ...
    @property
    def requests(self) -> list[Any]:
        """The requests, in order: the driver's ``perform`` gets them, and answers each."""

@final
class Done:
    """A node's output, said explicitly."""

    def __new__(cls, value: Any) -> Done: ...
    @property
    def value(self) -> Any:
        """The output; returning the value itself means the same."""

@final
class Ctx:
    """What a node knows about the call it is in."""

    @property
    def node(self) -> str:
        """The node's id (``step/id`` for a node inside a step)."""
    @property
    def turn(self) -> int:
        """0 on the first call, one more after each answered ``Await``."""
    @property
    def results(self) -> list[Any]:
        """The driver's answers to the previous ``Await``, in order; empty on turn 0."""
    @property
    def device(self) -> str | None:
        """The device the node is placed on (``"cuda:1"``), ``None`` when unplaced."""
    def emit(self, value: Any) -> None:
        """Sends ``value`` to whoever watches the run as it goes (``Graph.events``, the
        telemetry); nothing happens when nobody watches."""
    def effect(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Runs ``function(*args, **kwargs)`` once per run and returns its result: in a run with
        a journal, a resumed or retried call gets the recorded result back instead of running
        it again; outside one, it simply runs. ``function`` is called with ``*args`` and
        ``**kwargs``; its result is pickled to be recorded (see the guide's "Runs that
        survive")."""
    def aeffect(
        self, function: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, Any]:
        """``effect`` for an async function: awaits ``function(*args, **kwargs)`` once per
        run (``function`` called with ``*args`` and ``**kwargs``; a result that is not
        awaitable is taken as it is)."""
    def ask(self, question: Any) -> Any:
        """Asks a person ``question`` and returns the answer; without one yet, the run pauses
        (``forward`` raises ``soma.Paused``) until resumed with one."""
    def aask(self, question: Any) -> Coroutine[Any, Any, Any]:
        """``ask``, awaitable, for an async node: the answer to ``question``."""
    @property
    def _call(self) -> Any:
        """This call's place in its run's journal (not API)."""

@final
class Plan:
    """A compiled plan: a read-only tree that compares by structure."""

    @property
    def kind(self) -> str:
        """``"Empty"``, ``"Execute"``, ``"Sequence"``, ``"Wave"``, ``"Remote"``, ``"Map"``,
        ``"Switch"`` or ``"Loop"``."""
    @property
    def children(self) -> list[Plan]:
        """The steps of a ``Sequence``, the branches of a ``Wave``, the one slice of a
        ``Remote``, the body of a ``Map`` or ``Loop``, the cases of a ``Switch``; empty
        otherwise."""
    @property
    def node(self) -> str | None:
        """The node an ``Execute`` runs, or a ``Map``, ``Switch`` or ``Loop`` step is; ``None``
        otherwise."""
    @property
    def inputs(self) -> list[str]:
        """Where an ``Execute``, ``Map``, ``Switch`` or ``Loop`` step reads from, in
        edge-declaration order; empty means the graph's input."""
    @property
    def host(self) -> str | None:
        """The host a ``Remote`` slice runs on; ``None`` otherwise."""
    @property
    def keys(self) -> list[str]:
        """The keys of a ``Switch``'s cases, in the order of ``children``; empty otherwise."""
    @property
    def bound(self) -> int | None:
        """How many items of a ``Map`` run at once at most (``None``: as many as the crew
        lends), or how many iterations a ``Loop`` may run; ``None`` for any other plan."""
    @property
    def cached(self) -> list[str] | None:
        """The nodes a run would find in the cache this plan was asked for with
        (``g.plan(cache=...)``), in plan order; ``None`` for a plan asked for without a
        cache."""
    def shape(self) -> str:
        """The tree without ids: ``Sequence([Execute, Wave([Execute, Execute])])``."""
    def to_mermaid(self) -> str:
        """The plan as a Mermaid ``flowchart LR``, a ``subgraph`` per wave; a placed node's
        label says its device, and one a run would find in the cache says ``(cached)``."""
    def to_dot(self) -> str:
        """The plan as a graphviz ``digraph`` with ``rankdir=LR``, a ``cluster`` per wave; a
        placed node's label says its device, and one a run would find in the cache says
        ``(cached)``."""
    def to_svg(self) -> str:
        """The plan drawn as an SVG document by Soma itself (no graphviz needed): waves framed,
        branches stacked; a notebook shows it inline."""
    def _repr_svg_(self) -> str: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __copy__(self) -> Self: ...
    def __deepcopy__(self, memo: Any, /) -> Self: ...

@final
class NativeNode:
    @staticmethod
    def add(k: int) -> NativeNode: ...
    @staticmethod
    def identity() -> NativeNode: ...
    @staticmethod
    def sum() -> NativeNode: ...
    @staticmethod
    def panic(message: str) -> NativeNode: ...
    def forward(self, x: Any) -> Any: ...
    def __copy__(self) -> Self: ...
    def __deepcopy__(self, memo: Any, /) -> Self: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

@final
class GraphCore:
    def __init__(self) -> None: ...
    def add_python(
        self, id: str, object: object, takes_ctx: bool, is_async: bool = False
    ) -> None: ...
    def add_native(self, id: str, object: object, native: NativeNode) -> None: ...
    def add_each(
        self, id: str, object: object, body: GraphCore, in_flight: int | None = None
    ) -> None: ...
    def add_switch(self, id: str, object: object, cases: list[tuple[str, GraphCore]]) -> None: ...
    def add_loop(self, id: str, object: object, body: GraphCore, max_iterations: int) -> None: ...
    def add_edge(self, source: str, target: str) -> None: ...
    def nodes(self) -> list[str]: ...
    def edges(self) -> list[tuple[str, str]]: ...
    def roots(self) -> list[str]: ...
    def leaves(self) -> list[str]: ...
    def predecessors(self, id: str) -> list[str]: ...
    def successors(self, id: str) -> list[str]: ...
    def topological_sort(self) -> list[str]: ...
    def implementation(self, id: str) -> Any: ...
    def free_id(self, base: str) -> str: ...
    def plan(self, cached: list[str] | None = None) -> Plan: ...
    def place(self, id: str, device: str | None) -> None: ...
    def devices(self) -> list[tuple[str, str]]: ...
    def place_at(self, id: str, host: str | None) -> None: ...
    def hosts(self) -> list[tuple[str, str]]: ...
    def distributed_plan(self) -> Plan: ...
    def set_concurrency(self, id: str, workers: int | None) -> None: ...
    def stream_concurrency(self, asked: list[tuple[str, int]]) -> list[tuple[str, int]]: ...
    def concurrencies(self) -> list[tuple[str, int]]: ...
    # The runner a call takes: one run (`streamed` false) or a stream.
    @overload
    def route(self, streamed: Literal[False]) -> Literal["engine", "hosts"]: ...
    @overload
    def route(self, streamed: Literal[True]) -> Literal["stream", "flow"]: ...
    @overload
    def route(self, streamed: bool) -> Literal["engine", "hosts", "stream", "flow"]: ...
    def set_retry(
        self,
        id: str,
        times: int | None,
        backoff: float = 0.5,
        on: tuple[type[BaseException], ...] | None = None,
    ) -> None: ...
    def set_time_limit(self, id: str, seconds: float | None) -> None: ...
    def retries(
        self,
    ) -> list[tuple[str, tuple[int, float, tuple[type[BaseException], ...]]]]: ...
    def time_limits(self) -> list[tuple[str, float]]: ...
    def to_svg(self) -> str: ...
    def threads(self) -> int: ...
    @property
    def idle_threads(self) -> int: ...
    @idle_threads.setter
    def idle_threads(self, limit: int) -> None: ...
    def _refuse_next_threads(self, count: int) -> None: ...
    def would_hit(self, input: Any, cache: Any) -> list[tuple[str, bool]]: ...
    def aforward(
        self,
        input: Any,
        driver: Any = None,
        turn_limit: int = ...,
        trace: Trace | None = None,
        timeout: float | None = None,
        cache: Any = None,
        graph: Any = None,
    ) -> Awaitable[Any]: ...
    def forward(
        self,
        input: Any,
        driver: Any = None,
        turn_limit: int = ...,
        trace: Trace | None = None,
        timeout: float | None = None,
        stop: StopFlag | None = None,
        cache: Any = None,
        graph: Any = None,
    ) -> Any: ...
    def __len__(self) -> int: ...
    def __contains__(self, id: str, /) -> bool: ...

@final
class Span:
    """One node's run; times in seconds since the trace was created."""

    @property
    def node(self) -> str:
        """The node's id."""
    @property
    def start(self) -> float:
        """When its first turn started."""
    @property
    def end(self) -> float:
        """When it was done, or failed."""
    @property
    def duration(self) -> float:
        """``end - start``, in seconds."""
    @property
    def thread(self) -> int:
        """The thread it ran on (a process-wide number, stable for the thread's life)."""
    @property
    def branch(self) -> str:
        """The branch it ran in: ``main``, or its index in each enclosing wave joined by dots."""
    @property
    def turns(self) -> int:
        """Calls to its ``forward`` (0 for a node the cache answered)."""
    @property
    def error(self) -> str | None:
        """Its error, if it failed."""
    @property
    def device(self) -> str | None:
        """The device it was placed on, if any."""
    @property
    def host(self) -> str | None:
        """The host it ran on, for a node of a slice that ran on one; else ``None``."""
    @property
    def cached(self) -> bool:
        """Whether its output came from the run's cache: the node was not called."""
    def __copy__(self) -> Self: ...
    def __deepcopy__(self, memo: Any, /) -> Self: ...

@final
class StopFlag:
    """Stops the run it is given to (``GraphCore.forward(stop=...)``) at its next node
    boundary once set, from any thread."""

    def __init__(self) -> None: ...
    def set(self) -> None: ...
    @property
    def is_set(self) -> bool: ...

@final
class Board:
    """A run's node states as the engine keeps them (``soma_core::Board``), with what its run
    told as it began and ended: read in bulk by the view (``soma.view.record``). Not API."""

    @property
    def number(self) -> int:
        """The run's number among this process's runs (:func:`run_number`)."""
    @property
    def graph(self) -> Any:
        """The graph the run is of (``GraphCore``)."""
    @property
    def started_at(self) -> float:
        """When the run began, in seconds since the epoch."""
    @property
    def elapsed(self) -> float:
        """Seconds since the run began."""
    @property
    def begun(self) -> tuple[int, bool, Any, frozenset[str], Any, int | None] | None:
        """What the run told as it began: ``(nodes, asynchronous, parent, hidden,
        journal_run, item)`` (``item``: a streamed item's index, ``None`` for a whole run), or
        ``None`` before it began."""
    @property
    def ended(self) -> tuple[int, BaseException | None, float] | None:
        """How the run ended: ``(outcome, error, seconds)``, or ``None`` while it runs."""
    @property
    def has_ended(self) -> bool:
        """Whether the run has ended."""

    @property
    def done(self) -> int:
        """How many of the run's own nodes (not those inside its steps) are done: finished, or
        answered by the cache."""
    @property
    def program(self) -> int:
        """The program the run resolved, as a number: the same for every run of a graph not
        changed since, while a board of it is alive."""
    def nodes(self) -> list[tuple[str, str | None]]:
        """Each node's id and device, by index."""
    def read(self) -> list[tuple[int, str, int, int, float, float | None]]:
        """The records changed since the last read: ``(index, state, attempt, thread, started,
        ended)``, the thread as ``threading.get_ident`` names it (on x86-64 Linux), times in
        seconds since the run was made, ``ended`` ``None`` while it runs."""
    def __len__(self) -> int: ...

@final
class Trace:
    """Spans recorded by ``forward(..., trace=trace)``: one per node."""

    def __init__(self) -> None: ...
    @property
    def spans(self) -> list[Span]:
        """The spans, in the order they ended."""
    def clear(self) -> None:
        """Forgets every span."""
    def to_chrome(self) -> str:
        """The Chrome trace-event JSON that Perfetto and ``chrome://tracing`` open, one track
        per thread."""
    def write_chrome(self, path: str | os.PathLike[str]) -> None:
        """Writes the JSON of ``to_chrome`` to ``path``.

        Raises:
            OSError: the file cannot be written.
        """
    def summary(self, top: int = 10) -> str:
        """A table of the ``top`` slowest nodes (10 unless given)."""
    def to_svg(self) -> str:
        """A timeline, one row per thread, as SVG; a notebook shows it inline."""
    def _repr_svg_(self) -> str: ...
    def __len__(self) -> int: ...
    def _now(self) -> float: ...
    def _ship(
        self, nodes: set[str]
    ) -> list[tuple[str, float, float, int, list[int], int, str | None, str | None, bool]]: ...
    def _adopt(
        self,
        spans: list[tuple[str, float, float, int, list[int], int, str | None, str | None, bool]],
        host: str,
        at: float,
    ) -> None: ...
    def _record(
        self,
        spans: list[tuple[str, float, float, int, list[int], int, str | None, str | None, bool]],
        at: float,
        prefix: list[int],
    ) -> None: ...
    @staticmethod
    def _thread() -> int: ...
    # Refused with a `TypeError` that says how to keep a trace's spans.
    def __copy__(self) -> NoReturn: ...
    def __deepcopy__(self, memo: Any, /) -> NoReturn: ...

@final
class Stepper:
    """One of the engine's tasks, driven by an asyncio task: a coroutine in all but type
    (``soma._run.loop`` registers it as one)."""

    def __await__(self) -> Generator[Any, None, Any]: ...
    def __iter__(self) -> Stepper: ...
    def __next__(self) -> Any: ...
    def send(self, _value: Any) -> Any: ...
    def throw(self, kind: Any, value: Any = None, _traceback: Any = None) -> Any: ...
    def close(self) -> None: ...

@final
class FlowCore:
    """A stream of a graph with async nodes, each item a run of its own on an event loop: the
    engine behind ``map`` and ``amap`` of such a graph."""

    def __new__(
        cls,
        graph: GraphCore,
        inputs: Iterable[Any] | None,
        in_flight: int,
        ordered: bool,
        stop_on_error: bool,
        concurrency: list[tuple[str, int]],
        driver: Any = None,
        turn_limit: int = ...,
        trace: Trace | None = None,
        timeout: float | None = None,
        cache: Any = None,
        on_running_loop: bool = False,
    ) -> FlowCore: ...
    # `(index, value, None)`, or `(index, None, (exception, node, input))` for a failed item.
    def __next__(self) -> tuple[int, Any, tuple[BaseException, str | None, Any] | None] | None: ...
    def inputs_raised(self, raised: BaseException) -> None: ...
    def has_room(self) -> bool: ...
    def start(self, input: Any) -> None: ...
    def next(self, inputs_done: bool) -> FlowNext: ...
    def stopped(self) -> FlowNext: ...
    def time_left(self) -> float | None: ...
    def timed_out(self) -> TimeoutError: ...
    def close(self) -> None: ...
    def abandon(self) -> None: ...
    def figures(self) -> dict[str, Any] | None: ...

@final
class FlowNext:
    """What ``amap`` awaits of its ``FlowCore``: the next item, or the end of those it cancelled."""

    def __await__(self) -> Generator[Any, None, Any]: ...
    def __next__(self) -> Any: ...
    def send(self, _value: Any) -> Any: ...
    def throw(self, kind: Any, value: Any = None, _traceback: Any = None) -> Any: ...
    def close(self) -> None: ...

@final
class StreamCore:
    """A graph's program over an iterable, its stages overlapped: the engine behind
    ``soma.Graph.map`` (``soma/_run/stream.py`` says what comes out)."""

    def __new__(
        cls,
        graph: GraphCore,
        inputs: Iterable[Any],
        in_flight: int,
        ordered: bool,
        stop_on_error: bool,
        concurrency: list[tuple[str, int]],
        driver: Any = None,
        turn_limit: int = ...,
        trace: Trace | None = None,
        timeout: float | None = None,
        cache: Any = None,
    ) -> StreamCore: ...
    # `(index, value, None)`, or `(index, None, (exception, node, input))` for a failed item.
    def __next__(self) -> tuple[int, Any, tuple[BaseException, str | None, Any] | None] | None: ...
    def close(self) -> None: ...
    def abandon(self) -> None: ...
    def figures(self) -> dict[str, Any] | None: ...
