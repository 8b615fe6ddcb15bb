"""Shared nodes, drivers, plan helpers and a child-process runner for Soma's Python tests.

Nothing here sleeps to prove a point: concurrency is shown by rendezvous (`Meet`) with a
deadline (`DEADLINE`), so a test that fails does so in seconds and says why.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import settings

import soma
from _children.sitecustomize import note_logged_errors
from _postgres import postgres_cluster, postgres_url  # noqa: F401  (fixtures: a server, a database)

# tests/with_torch/ needs torch, a few GB installed: `make test-torch` installs it and runs them
# with SOMA_TORCH_TESTS=1; every other run leaves them out, torch installed or not. (Not named
# `torch`: this folder is on `sys.path`, where a folder of that name would pass for torch.)
collect_ignore = [] if os.environ.get("SOMA_TORCH_TESTS") else ["with_torch"]
# tests/installed/ installs the wheel `make wheel` built into a fresh venv: `make test-wheel`
# (part of `make test`) and `make test-py313` build it and name its folder in SOMA_WHEELS.
if not os.environ.get("SOMA_WHEELS"):
    collect_ignore.append("installed")

# Seconds a rendezvous waits for the other side before it declares the run sequential.
DEADLINE = 5.0

# ---------------------------------------------------------------------------------------------
# What a user would see go wrong, though the test passed: a log record at ERROR or above, an
# exception Python could only ignore, an exception that ended a thread — in this process or in
# any Python process a test starts. Any of them fails the test that caused it; a test that
# means to cause one says which, by pattern: ``@pytest.mark.expected_errors("Failed to …")``.
# (In this process pytest already fails a test on an ignored exception or a thread's: the
# warnings it raises for them are errors here, by ``filterwarnings``.)

_FINDINGS = tempfile.mkdtemp(prefix="soma-test-findings-")
os.environ["SOMA_TEST_FINDINGS"] = _FINDINGS
# Every Python child loads tests/_children/sitecustomize.py, which writes its findings there.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [os.path.join(os.path.dirname(__file__), "_children")]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)
_logged_here: list[str] = []
note_logged_errors(lambda kind, text: _logged_here.append(f"--- {kind}\n{text}"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "expected_errors(*patterns): the logged errors, ignored exceptions and thread "
        "exceptions this test causes on purpose, each matched by one of the regular "
        "expressions (re.search)",
    )


def _note_panics(stderr: str) -> None:
    """A Rust panic a child printed (the engine's or the glue's): a finding, as a logged error
    is, whatever the child then did with the exception it became. Rust writes it to the
    process's stderr itself, out of reach of the child's hooks, so it is read here."""
    if "panicked at" in stderr:
        _logged_here.append(f"--- a Rust panic on a child's stderr\n{stderr}")


def _take_findings() -> list[str]:
    found, _logged_here[:] = list(_logged_here), []
    for name in sorted(os.listdir(_FINDINGS)):
        path = os.path.join(_FINDINGS, name)
        with contextlib.suppress(OSError), open(path, encoding="utf-8") as written:
            found.extend(f"--- {block}" for block in written.read().split("--- ") if block)
        with contextlib.suppress(OSError):
            os.unlink(path)
    return found


@pytest.fixture(autouse=True)
def no_logged_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test whose run logged an error, ignored an exception or lost one in a thread,
    here or in a child, unless the test's ``expected_errors`` marker matches each of them."""
    _take_findings()
    yield
    found = _take_findings()
    marker = request.node.get_closest_marker("expected_errors")
    patterns = [re.compile(p) for p in marker.args] if marker is not None else []
    unexpected = [f for f in found if not any(p.search(f) for p in patterns)]
    if unexpected:
        pytest.fail(
            "the test passed, but a user would have seen this go wrong:\n" + "\n".join(unexpected),
            pytrace=False,
        )


# "ci" (the default, what `make test` and a plain `pytest` run): fresh random examples on every
# run, so that each CI run tries examples no run before it tried, where one fixed corpus was
# replayed run after run. A failure stays reproducible: hypothesis prints the falsifying example
# and the `@reproduce_failure(...)` line to paste over the test (`print_blob`), and for a failure
# it could not replay, the `@seed(...)` / `--hypothesis-seed=...` that reruns it. No example
# database: CI keeps none between runs. Time stays bounded by the examples' count: 200 at most
# per property unless a property says fewer. "dev" (SOMA_HYPOTHESIS_PROFILE=dev): more examples,
# and failing ones kept in the local database (.hypothesis/) and replayed first.
settings.register_profile(
    "ci", derandomize=False, print_blob=True, max_examples=200, deadline=None, database=None
)
settings.register_profile("dev", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("SOMA_HYPOTHESIS_PROFILE", "ci"))


# ---------------------------------------------------------------------------------------------
# Recording what ran, where and in which order


@dataclass(frozen=True)
class Call:
    node: str
    thread: int
    value: Any


class Log:
    """Every node call, in the real order it happened, from whichever thread made it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls: list[Call] = []

    def add(self, node: str, value: Any) -> None:
        with self._lock:
            self.calls.append(Call(node, threading.get_ident(), value))

    def order(self) -> list[str]:
        with self._lock:
            return [call.node for call in self.calls]

    def threads(self, node: str) -> set[int]:
        with self._lock:
            return {call.thread for call in self.calls if call.node == node}

    def inputs(self, node: str) -> list[Any]:
        with self._lock:
            return [call.value for call in self.calls if call.node == node]


class CallRecord(list[Any]):
    """Which nodes were called, in order, appended to by the nodes themselves: a record that is
    no part of what they compute. A node's key covers the module-level values its code reads,
    a list it appends to among them; this one pickles, and so is keyed, as an empty record (what
    pickle keeps of a value is what a key reads of it), so appending to it changes no key."""

    def __reduce__(self) -> tuple[type[CallRecord], tuple[()]]:
        return (CallRecord, ())


class Record(soma.Node):
    """Logs each call (its id from ctx, its thread, its input), then returns `fn(x)`."""

    def __init__(self, log: Log, fn: Callable[[Any], Any] | None = None) -> None:
        self.log = log
        self.fn = fn

    def forward(self, x: Any, ctx: Any) -> Any:
        self.log.add(ctx.node, x)
        return x if self.fn is None else self.fn(x)


# ---------------------------------------------------------------------------------------------
# Small pure nodes


class Add(soma.Node):
    def __init__(self, k: Any) -> None:
        self.k = k

    def forward(self, x: Any) -> Any:
        return x + self.k


class Double(soma.Node):
    def forward(self, x: Any) -> Any:
        return x * 2


class Pass(soma.Node):
    """Returns its input untouched: the same object."""

    def forward(self, x: Any) -> Any:
        return x


# Classes whose names the derived ids are checked against (`Encoder` -> `encoder`, ...).


class Source(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class Encoder(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class Other2(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class HTTPServer(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class Const(soma.Node):
    def __init__(self, value: Any) -> None:
        self.value = value

    def forward(self, x: Any) -> Any:
        return self.value


class Fn(soma.Node):
    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def forward(self, x: Any) -> Any:
        return self.fn(x)


class SumValues(soma.Node):
    """A fan-in join: the sum of the dict's values."""

    def forward(self, x: dict[str, Any]) -> Any:
        return sum(x.values())


class Tag(soma.Node):
    """Returns `(its id, what it read)`, with a fan-in dict as its ordered items, so that a
    run's output spells out the whole data flow, edge order included."""

    def forward(self, x: Any, ctx: Any) -> Any:
        if isinstance(x, dict):
            return (ctx.node, list(x.items()))
        return (ctx.node, x)


class Meet(soma.Node):
    """Waits at a barrier: it only passes if every party is in flight at the same time."""

    def __init__(self, barrier: threading.Barrier, log: Log | None = None) -> None:
        self.barrier = barrier
        self.log = log

    def forward(self, x: Any, ctx: Any) -> Any:
        if self.log is not None:
            self.log.add(ctx.node, x)
        self.barrier.wait()
        return x


class Raise(soma.Node):
    """Raises `exc` and keeps it, so a test can check the very same object came back."""

    def __init__(self, exc: BaseException) -> None:
        self.raised = exc

    def forward(self, x: Any) -> Any:
        raise self.raised


# ---------------------------------------------------------------------------------------------
# Drivers


class Answer:
    """A driver answering each request with `fn(request)`, and remembering what it was asked."""

    def __init__(self, fn: Callable[[Any], Any] = lambda r: r) -> None:
        self.fn = fn
        self._lock = threading.Lock()
        self.asked: list[list[Any]] = []

    def perform(self, requests: list[Any]) -> list[Any]:
        with self._lock:
            self.asked.append(list(requests))
        return [self.fn(r) for r in requests]


# ---------------------------------------------------------------------------------------------
# Building and reading


def series(*nodes: Any) -> Any:
    """`nodes[0] >> nodes[1] >> ...`"""
    return functools.reduce(operator.rshift, nodes)


def parallel(*nodes: Any) -> Any:
    """`nodes[0] | nodes[1] | ...`"""
    return functools.reduce(operator.or_, nodes)


def named(ids: str, factory: Callable[[], soma.Node] = Pass) -> list[soma.Node]:
    """One fresh node per space-separated id: `a, b = named("a b")`."""
    return [factory().named(i) for i in ids.split()]


def build(nodes: list[str], edges: list[tuple[str, str]], factory: Callable[[], Any] = Pass) -> Any:
    """A graph made with node()/edge() in a loop, the way the DSL is not."""
    g = soma.Graph()
    for n in nodes:
        g.node(n, factory())
    for src, dst in edges:
        g.edge(src, dst)
    return g


def walk(plan: Any) -> Iterator[Any]:
    """Every sub-plan, depth first, parents before children."""
    yield plan
    for child in plan.children:
        yield from walk(child)


def executed(plan: Any) -> list[str]:
    """The Execute steps' nodes, in the order a sequential run would take them."""
    return [p.node for p in walk(plan) if p.kind == "Execute"]


# ---------------------------------------------------------------------------------------------
# Child processes

# How long a subprocess may take, start-up and import included, before it counts as hung.
SUBPROCESS_DEADLINE = 60.0


def interrupt_script(script: str, ready: str) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in a fresh interpreter and sends it Ctrl-C (SIGINT) once it has printed
    the line ``ready``; a child that never gets ready fails the test, and one still running at
    ``SUBPROCESS_DEADLINE`` is killed."""
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killer = threading.Timer(SUBPROCESS_DEADLINE, child.kill)
    killer.start()
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        if first.strip() != ready:
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the child never printed {ready!r}: {first!r}\n{err}")
        os.kill(child.pid, signal.SIGINT)
        out, err = child.communicate()
        _note_panics(err)
        return subprocess.CompletedProcess(child.args, child.returncode, out, err)
    finally:
        killer.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()


def reserve_settled() -> None:
    """Waits until a thread waits in Soma's reserve (guide: "Which thread a branch runs on"), so
    that a count of the process's threads taken now holds it: a reserve taken by an earlier
    graph is refilled when its thread has nothing left to do, which may be later."""
    deadline = time.monotonic() + DEADLINE
    while not soma._soma._thread_in_reserve():
        if time.monotonic() > deadline:
            pytest.fail("no thread came to Soma's reserve")
        time.sleep(0.005)


def run_script(
    script: str, deadline: float = SUBPROCESS_DEADLINE
) -> subprocess.CompletedProcess[str]:
    """Runs ``script`` in a fresh interpreter, capturing what it prints; a child still running
    at ``deadline`` (``SUBPROCESS_DEADLINE`` unless a child has more to do) fails the test
    rather than stalling the suite."""
    try:
        ran = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=deadline,
            check=False,
        )
        _note_panics(ran.stderr)
        return ran
    except subprocess.TimeoutExpired as hung:
        # Shared by the GIL, fork and exit tests: the likeliest hang differs, so name none.
        pytest.fail(f"the child hung past {deadline}s\n{hung}")


def merged(out: dict[str, Any]) -> dict[str, Any]:
    """Every node's record, from a result keyed by leaf or not."""
    records: dict[str, Any] = {}
    stack = [out]
    while stack:
        item = stack.pop()
        for key, value in item.items():
            if isinstance(value, dict):
                stack.append(value)
            else:
                records[key] = value
    return records


@contextlib.contextmanager
def registered(backend: Any) -> Iterator[Any]:
    """``backend`` registered with ``soma.devices`` for the block; the registry as it was after."""
    saved = dict(soma.devices._backends)
    soma.devices.register(backend)
    try:
        yield backend
    finally:
        soma.devices._backends.clear()
        soma.devices._backends.update(saved)


#: Python source, for a script run in a subprocess, that builds `g`:
#: `(((n0 >> n1) | n2) >> n3) | n4 ...` to `LEVELS` nodes with node()/edge() as a loop would,
#: each node passing one of its inputs on so that values stay flat however deep the graph.
#: A regression in depth is a stack overflow, which would take the test runner down with it.
DEEP_GRAPH = """
class First(soma.Node):
    \"\"\"Passes one of its inputs on, so that values stay flat however deep the graph.\"\"\"

    def forward(self, x):
        return next(iter(x.values())) if isinstance(x, dict) else x


g = soma.Graph()
g.node("n0", First())
terminals = ["n0"]
for level in range(1, LEVELS):
    node = g.node(f"n{level}", First())
    if level % 2:
        for terminal in terminals:
            g.edge(terminal, node)
        terminals = [node]
    else:
        terminals.append(node)
"""


def deep_graph(levels: int) -> str:
    """:data:`DEEP_GRAPH` to ``levels`` nodes."""
    return DEEP_GRAPH.replace("LEVELS", str(levels))


_Transport = TypeVar("_Transport")


@contextlib.contextmanager
def serving(transport: _Transport) -> Iterator[_Transport]:
    """``transport`` as ``soma.remote``'s for the block (hosts here, in a test), none after."""
    soma.remote.use(transport)  # type: ignore[arg-type]
    try:
        yield transport
    finally:
        soma.remote.use(None)
