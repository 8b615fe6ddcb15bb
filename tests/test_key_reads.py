"""What a cache key reads of the code people write: the questionnaire of issue 43.

A key covers what a node's output depends on, and nothing else: a resource a node works with
(a lock, a client, a logger) is keyed by its type; a log, a counter or a metrics dict the node
only writes to is not read; the module's name (`__main__` as a script, a name when imported)
is not in it; every import a node's code makes is followed; and an edit the process makes
(a module `__getattr__`'s dict, annotations, a global defined later) runs the node again.
The tests are written the way users write theirs: module-level lists cleared before each run,
counters in dicts, lists a closure captures, in sync and async nodes, inside `each`, `switch`
and `loop`, and across processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import multiprocessing
import os
import queue
import selectors
import socket
import sqlite3
import ssl
import subprocess
import sys
import textwrap
import threading
import typing
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import soma
from conftest import SUBPROCESS_DEADLINE, run_script
from soma.cache import _fingerprint


@pytest.fixture(params=["memory", "folder"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> soma.Cache:
    return soma.Cache() if request.param == "memory" else soma.Cache(tmp_path / "cache")


@pytest.fixture(autouse=True)
def no_cache_warning() -> Iterator[None]:
    """Every test here runs with a `CacheWarning` an error: none may be said."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", soma.CacheWarning)
        yield


# ---------------------------------------------------------------------------------------------
# Resources are keyed by their type, never digested, never a warning


class _FakeClient:
    """A client of a library this process never imported, told by its module and name."""


def _library_class(module: str, name: str) -> type:
    return type(name, (_FakeClient,), {"__module__": module})


def _open_file() -> Any:
    return open(os.devnull)


RESOURCES: dict[str, Callable[[], object]] = {
    "threading.Lock": threading.Lock,
    "threading.RLock": threading.RLock,
    "threading.Condition": threading.Condition,
    "threading.Semaphore": threading.Semaphore,
    "threading.BoundedSemaphore": threading.BoundedSemaphore,
    "threading.Event": threading.Event,
    "threading.Thread": lambda: threading.Thread(target=print),
    "threading.local": threading.local,
    "socket.socket": socket.socket,
    "logging.Logger": lambda: logging.getLogger("soma.tests.resources"),
    "ThreadPoolExecutor": lambda: concurrent.futures.ThreadPoolExecutor(1),
    "asyncio loop": asyncio.new_event_loop,
    "asyncio.Semaphore": asyncio.Semaphore,
    "asyncio.Lock": asyncio.Lock,
    "open file": _open_file,
    "httpx.AsyncClient": lambda: _library_class("httpx._client", "AsyncClient")(),
    "requests.Session": lambda: _library_class("requests.sessions", "Session")(),
    "aiohttp.ClientSession": lambda: _library_class("aiohttp.client", "ClientSession")(),
    "openai client": lambda: _library_class("openai._base_client", "BaseClient")(),
    "anthropic client": lambda: _library_class("anthropic._base_client", "BaseClient")(),
    "urllib3.PoolManager": lambda: _library_class("urllib3.poolmanager", "PoolManager")(),
    "botocore client": lambda: _library_class("botocore.client", "BaseClient")(),
    "redis.Redis": lambda: _library_class("redis.client", "Redis")(),
    "sqlalchemy.Engine": lambda: _library_class("sqlalchemy.engine.base", "Engine")(),
    "threading.Barrier": lambda: threading.Barrier(1),
    "queue.Queue": queue.Queue,
    "queue.SimpleQueue": queue.SimpleQueue,
    "multiprocessing.Lock": multiprocessing.Lock,
    "ProcessPoolExecutor": lambda: concurrent.futures.ProcessPoolExecutor(1),
    "asyncio.Event": asyncio.Event,
    "asyncio.Queue": asyncio.Queue,
    "selector": selectors.DefaultSelector,
    "ssl.SSLContext": ssl.create_default_context,
    "sqlite3.Connection": lambda: sqlite3.connect(":memory:"),
    "logging.Handler": logging.StreamHandler,
    "logging.LoggerAdapter": lambda: logging.LoggerAdapter(logging.getLogger("soma"), {}),
}


class UsesResource(soma.Node):
    def forward(self, x: int) -> int:
        RESOURCE_CALLS.append("uses")
        assert RESOURCE is not None
        return x + 1


RESOURCE: object = None
RESOURCE_CALLS: list[str] = []


@pytest.mark.parametrize("kind", list(RESOURCES))
def test_a_node_that_uses_a_module_level_resource_is_cached_without_a_warning(
    kind: str, cache: soma.Cache
) -> None:
    global RESOURCE
    RESOURCE = RESOURCES[kind]()
    try:
        g = soma.Graph.somatize(UsesResource())
        RESOURCE_CALLS.clear()
        assert g.forward(1, cache=cache) == 2
        assert g.forward(1, cache=cache) == 2
        assert RESOURCE_CALLS == ["uses"]
        assert cache.stats().hits == 1
    finally:
        closing = getattr(RESOURCE, "close", None)
        if callable(closing) and not isinstance(RESOURCE, _FakeClient):
            closing()
        RESOURCE = None


class HoldsClient(soma.Node):
    def __init__(self, client: object) -> None:
        self.client = client
        self.lock = threading.Lock()

    def forward(self, x: int) -> int:
        with self.lock:
            return x * 2


def test_a_node_holding_a_client_and_a_lock_hits_and_another_client_of_its_type_hits_too(
    cache: soma.Cache,
) -> None:
    client = _library_class("httpx._client", "Client")
    g = soma.Graph.somatize(HoldsClient(client()))
    assert g.forward(2, cache=cache) == 4
    again = soma.Graph.somatize(HoldsClient(client()))
    assert again.forward(2, cache=cache) == 4
    assert cache.stats().hits == 1


def test_a_class_said_a_resource_with_soma_cache_resource_is_keyed_by_its_type(
    cache: soma.Cache,
) -> None:
    class Pool:
        """A class of the user's with no content a key could read: a connection pool."""

        def __init__(self) -> None:
            self.generator = (i for i in range(3))

    g = soma.Graph.somatize(HoldsClient(Pool()))
    with pytest.warns(soma.CacheWarning, match="builtins.generator"):
        g.forward(1, cache=cache)
    assert soma.cache.resource(Pool) is Pool
    fresh = soma.Cache()
    assert g.forward(1, cache=fresh) == 2
    assert soma.Graph.somatize(HoldsClient(Pool())).forward(1, cache=fresh) == 2
    assert fresh.stats().hits == 1


def test_an_in_memory_file_is_data_keyed_by_its_content() -> None:
    digest = _fingerprint.digest
    assert digest(io.BytesIO(b"a")) != digest(io.BytesIO(b"b"))
    assert digest(io.StringIO("a")) != digest(io.StringIO("b"))
    assert digest(threading.Lock()) == digest(threading.Lock())
    assert digest(threading.Lock()) != digest(threading.RLock())


# ---------------------------------------------------------------------------------------------
# What a node writes is not what it reads

CALLS: list[str] = []
COUNTER: dict[str, int] = {"n": 0}
METRICS: dict[str, float] = {}
RUNS = 0


class A(soma.Node):
    def forward(self, x: int) -> int:
        CALLS.append("a")
        return x + 1


class B(soma.Node):
    def forward(self, x: int) -> int:
        CALLS.append("b")
        COUNTER["n"] += 1
        return x * 2


class C(soma.Node):
    def forward(self, x: int) -> int:
        global RUNS
        CALLS.append("c")
        RUNS += 1
        METRICS["c"] = float(x)
        return x - 3


class D(soma.Node):
    async def forward(self, x: int) -> int:
        CALLS.append("d")
        COUNTER["n"] += 1
        await asyncio.sleep(0)
        return x * 10


def test_nodes_that_append_to_a_log_count_and_fill_metrics_call_nothing_the_second_time(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(A() >> B() >> C())
    CALLS.clear()
    assert g.forward(1, cache=cache) == 1
    assert CALLS == ["a", "b", "c"]
    CALLS.clear()
    assert g.forward(1, cache=cache) == 1
    assert CALLS == []


def test_async_nodes_that_write_to_a_log_and_a_counter_call_nothing_the_second_time(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(A() >> D() >> B())
    CALLS.clear()
    assert asyncio.run(g.aforward(1, cache=cache)) == 40
    CALLS.clear()
    assert asyncio.run(g.aforward(1, cache=cache)) == 40
    assert CALLS == []


def test_a_log_not_cleared_between_runs_misses_nothing_either(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(A() >> B() >> C() >> D())
    first = list(CALLS)
    assert g.forward(2, cache=cache) == 30
    assert g.forward(2, cache=cache) == 30
    assert CALLS[len(first) :] == ["a", "b", "c", "d"]


def test_a_list_a_closure_captures_to_count_calls_changes_no_key(cache: soma.Cache) -> None:
    calls: list[int] = []

    @soma.node
    def double(x: int) -> int:
        calls.append(x)
        return x * 2

    @soma.node
    async def plus(x: int) -> int:
        calls.append(x)
        return x + 1

    g = soma.Graph.somatize(double >> plus >> double)
    assert asyncio.run(g.aforward(1, cache=cache)) == 6
    assert asyncio.run(g.aforward(1, cache=cache)) == 6
    assert calls == [1, 2, 3]


def test_a_counter_a_closure_rebinds_changes_no_key(cache: soma.Cache) -> None:
    count = 0

    @soma.node
    def counted(x: int) -> int:
        nonlocal count
        count += 1
        return x + 1

    g = soma.Graph.somatize(counted >> counted)
    assert g.forward(1, cache=cache) == 3
    assert g.forward(1, cache=cache) == 3
    assert count == 2


def _selector(x: int) -> str:
    CALLS.append("select")
    return "big" if x > 2 else "small"


@soma.node
def _total(xs: list[int]) -> int:
    return sum(xs)


def _done(x: int) -> bool:
    CALLS.append("until")
    return x > 100


def test_nodes_that_write_a_log_inside_each_switch_and_loop_call_nothing_the_second_time(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(
        soma.each(A() >> B())
        >> _total
        >> soma.switch(_selector, {"big": C(), "small": A()})
        >> soma.loop(B(), until=_done, max_iterations=10)
    )
    CALLS.clear()
    first = g.forward([1, 2], cache=cache)
    assert "a" in CALLS
    CALLS.clear()
    assert g.forward([1, 2], cache=cache) == first
    assert CALLS == []


def test_a_node_that_reads_what_it_logs_is_keyed_on_it() -> None:
    class Reads(soma.Node):
        def forward(self, x: int) -> int:
            CALLS.append("reads")
            return x + len(CALLS)

    before = _fingerprint.fingerprint(Reads())
    CALLS.append("more")
    assert _fingerprint.fingerprint(Reads()) != before


MEMO: dict[int, int] = soma.cache.ignore({})


class Memoized(soma.Node):
    def forward(self, x: int) -> int:
        CALLS.append("memoized")
        if x not in MEMO:
            MEMO[x] = x * x
        return MEMO[x]


def test_a_value_said_not_part_of_the_key_with_soma_cache_ignore_changes_no_key(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Memoized())
    CALLS.clear()
    assert g.forward(3, cache=cache) == 9
    MEMO[4] = 16
    assert g.forward(3, cache=cache) == 9
    assert CALLS == ["memoized"]
    with pytest.raises(TypeError, match=r"soma\.cache\.ignore takes a value that can change"):
        soma.cache.ignore(3)


class ReadsEnvironment(soma.Node):
    def forward(self, x: str) -> str:
        CALLS.append("env")
        return x + os.environ.get("SOMA_TEST_SUFFIX", "")

    def cache_key(self) -> object:
        return os.environ.get("SOMA_TEST_SUFFIX")


def test_a_node_s_cache_key_adds_what_soma_cannot_see_to_its_key(
    cache: soma.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = soma.Graph.somatize(ReadsEnvironment())
    CALLS.clear()
    monkeypatch.setenv("SOMA_TEST_SUFFIX", "!")
    assert g.forward("a", cache=cache) == "a!"
    assert g.forward("a", cache=cache) == "a!"
    monkeypatch.setenv("SOMA_TEST_SUFFIX", "?")
    assert g.forward("a", cache=cache) == "a?"
    assert CALLS == ["env", "env"]


_WRITERS = """
import soma

CALLS = []
COUNTER = {"n": 0}


class First(soma.Node):
    def forward(self, x):
        CALLS.append("first")
        COUNTER["n"] += 1
        return x + 1


class Second(soma.Node):
    async def forward(self, x):
        CALLS.append("second")
        COUNTER["n"] += 1
        return x * 2


def pipeline():
    return soma.Graph.somatize(soma.each(First() >> Second()))
"""

_RUN_WRITERS = """
import asyncio, sys
sys.path.insert(0, {folder!r})
import soma, writers
cache = soma.Cache({cache!r})
print(asyncio.run(writers.pipeline().aforward([1, 2], cache=cache)), sorted(writers.CALLS))
"""


def test_nodes_that_write_a_log_and_a_counter_hit_in_the_next_process(tmp_path: Path) -> None:
    (tmp_path / "writers.py").write_text(_WRITERS)
    script = _RUN_WRITERS.format(folder=str(tmp_path), cache=str(tmp_path / "cache"))
    first = run_script(script)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "[4, 6] ['first', 'first', 'second', 'second']"
    second = run_script(script)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "[4, 6] []"


# ---------------------------------------------------------------------------------------------
# The module's name is not in the key

_PIPELINE = """
import sys
import soma

CALLS = []
SCALE = 3


def helper(x):
    return x * SCALE


class Load(soma.Node):
    def forward(self, n):
        CALLS.append("load")
        return list(range(n))


class Scale(soma.Node):
    def forward(self, xs):
        CALLS.append("scale")
        return [helper(x) for x in xs]


@soma.node
def total(xs):
    CALLS.append("total")
    return sum(xs)


def main(cache):
    g = soma.Graph.somatize(Load() >> Scale() >> total)
    print(g.forward(4, cache=soma.Cache(cache)), CALLS)


if __name__ == "__main__":
    main(sys.argv[1])
"""


def test_the_same_pipeline_run_as_a_script_imported_and_execd_hits_the_same_entries(
    tmp_path: Path,
) -> None:
    (tmp_path / "pipeline.py").write_text(_PIPELINE)
    cache = str(tmp_path / "cache")

    def run(arguments: list[str]) -> str:
        done = subprocess.run(
            [sys.executable, *arguments],
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_DEADLINE,
            check=False,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run(["pipeline.py", cache]) == "18 ['load', 'scale', 'total']"
    assert run(["-c", f"import pipeline; pipeline.main({cache!r})"]) == "18 []"
    execd = (
        f"source = open('pipeline.py').read(); scope = {{'__name__': 'cell'}}; "
        f"exec(compile(source, '<cell>', 'exec'), scope); scope['main']({cache!r})"
    )
    assert run(["-c", execd]) == "18 []"


# ---------------------------------------------------------------------------------------------
# Every import a node's code makes is followed

_HELPERS = """
def scale(x):
    return x * 2
"""

_IMPORTING = """
import soma


class Relative(soma.Node):
    def forward(self, x):
        from .helpers import scale
        return scale(x)


class Absolute(soma.Node):
    def forward(self, x):
        from {package}.helpers import scale
        return scale(x) + 1


class Whole(soma.Node):
    def forward(self, x):
        from . import helpers
        return helpers.scale(x) + 2
"""

_RUN_IMPORTING = """
import sys
sys.path.insert(0, {folder!r})
import soma
from {package} import nodes
cache = soma.Cache({cache!r})
calls = []
for node in (nodes.Relative(), nodes.Absolute(), nodes.Whole()):
    g = soma.Graph.somatize(node)
    print(g.forward(5, cache=cache), end=" ")
print(cache.stats().hits, "helpers" in sys.modules.get({package!r} + ".helpers", "").__name__)
"""


def _package(folder: Path, name: str) -> None:
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text("")
    (folder / name / "helpers.py").write_text(_HELPERS)
    (folder / name / "nodes.py").write_text(_IMPORTING.format(package=name))


def test_a_helper_imported_inside_forward_edited_between_two_processes_runs_again(
    tmp_path: Path,
) -> None:
    _package(tmp_path, "edited_pkg")
    script = _RUN_IMPORTING.format(
        folder=str(tmp_path), package="edited_pkg", cache=str(tmp_path / "cache")
    )

    def run() -> str:
        done = run_script(script)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "10 11 12 0 True"
    # A hit calls no node, so nothing imports the helpers: the key imports them to read them.
    assert run() == "10 11 12 3 True"
    (tmp_path / "edited_pkg" / "helpers.py").write_text(_HELPERS.replace("x * 2", "x * 3"))
    assert run() == "15 16 17 0 True"


def test_a_helper_imported_inside_forward_rebound_in_this_process_runs_again(
    tmp_path: Path, cache: soma.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    _package(tmp_path, "rebound_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        from rebound_pkg import helpers, nodes  # type: ignore[import-not-found]

        results = []
        for node in (nodes.Relative(), nodes.Absolute(), nodes.Whole()):
            g = soma.Graph.somatize(node)
            results.append(g.forward(5, cache=cache))
            monkeypatch.setattr(helpers, "scale", lambda x: x * 4)
            results.append(g.forward(5, cache=cache))
            monkeypatch.undo()
            monkeypatch.syspath_prepend(str(tmp_path))
        assert results == [10, 20, 11, 21, 12, 22]
    finally:
        for name in ("rebound_pkg", "rebound_pkg.helpers", "rebound_pkg.nodes"):
            sys.modules.pop(name, None)


# ---------------------------------------------------------------------------------------------
# Edits made in the process


def test_a_module_attribute_served_by_a_module_getattr_whose_dict_changes_runs_again(
    tmp_path: Path, cache: soma.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lazy_settings.py").write_text(
        textwrap.dedent(
            """
            _VALUES = {"factor": 2}


            def __getattr__(name):
                return _VALUES[name]
            """
        )
    )
    (tmp_path / "lazy_nodes.py").write_text(
        textwrap.dedent(
            """
            import soma
            import lazy_settings


            class Times(soma.Node):
                def forward(self, x):
                    return x * lazy_settings.factor
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import lazy_nodes  # type: ignore[import-not-found]
        import lazy_settings  # type: ignore[import-not-found]

        g = soma.Graph.somatize(lazy_nodes.Times())
        assert g.forward(5, cache=cache) == 10
        lazy_settings._VALUES["factor"] = 3
        assert g.forward(5, cache=cache) == 15
    finally:
        sys.modules.pop("lazy_nodes", None)
        sys.modules.pop("lazy_settings", None)


def _made_config(kind: type) -> type:
    scope: dict[str, Any] = {"kind": kind}
    # A notebook cell run again (compiled on its own, not as this module's annotations are).
    exec(compile("class Config:\n    value: kind\n", "<cell>", "exec", dont_inherit=True), scope)
    return typing.cast(type, scope["Config"])


class Typed(soma.Node):
    def forward(self, x: str) -> object:
        return typing.get_type_hints(CONFIG)["value"](x)


CONFIG = _made_config(int)


def test_annotations_read_through_get_type_hints_changed_by_a_class_made_again_run_again(
    cache: soma.Cache,
) -> None:
    global CONFIG
    g = soma.Graph.somatize(Typed())
    try:
        assert g.forward("2", cache=cache) == 2
        CONFIG = _made_config(float)
        assert g.forward("2", cache=cache) == 2.0
        assert isinstance(g.forward("2", cache=cache), float)
    finally:
        CONFIG = _made_config(int)


class Optional(soma.Node):
    def forward(self, x: int) -> int:
        try:
            return x + LATER  # type: ignore[name-defined]
        except NameError:
            return x


def test_a_global_defined_after_a_first_run_that_did_without_it_runs_the_node_again(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Optional())
    assert g.forward(1, cache=cache) == 1
    globals()["LATER"] = 10
    try:
        assert g.forward(1, cache=cache) == 11
    finally:
        del globals()["LATER"]
    assert g.forward(1, cache=cache) == 1


# ---------------------------------------------------------------------------------------------
# A value a key cannot read in bounded time and memory


_ENDLESS = """
import warnings
import soma


class Endless:
    def __reduce__(self):
        return (Endless, (Endless(),))


class Holds(soma.Node):
    def __init__(self):
        self.endless = Endless()

    def forward(self, x):
        return x + 1


g = soma.Graph.somatize(Holds())
cache = soma.Cache()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(g.forward(1, cache=cache), g.forward(1, cache=cache), cache.stats().hits)
print([str(w.message).splitlines()[0][:60] for w in caught])
"""


def test_an_endless_reduce_runs_the_node_uncached_with_one_warning_in_bounded_time() -> None:
    done = run_script(_ENDLESS, deadline=30.0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "2 2 0",
        "['node `holds` runs uncached: the `__main__.Endless reduced 10']",
    ]


def test_a_cons_list_nested_past_any_recursion_limit_is_keyed_by_its_content() -> None:
    def cons(n: int, last: int) -> object:
        built: object = None
        for i in range(n):
            built = (last if i == n - 1 else i, built)
        return built

    assert _fingerprint.digest(cons(200_000, 1)) != _fingerprint.digest(cons(200_000, 2))
    assert _fingerprint.digest(cons(200_000, 1)) == _fingerprint.digest(cons(200_000, 1))


# ---------------------------------------------------------------------------------------------
# A switch's selector is keyed by its own code


class Case(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        CALLS.append(f"case {self.k}")
        return x + self.k


def test_a_case_the_selector_did_not_take_edited_reruns_neither_selector_nor_taken_case(
    cache: soma.Cache,
) -> None:
    taken, untaken = Case(1), Case(2)
    g = soma.Graph.somatize(soma.switch(_selector, {"small": taken, "big": untaken}))
    CALLS.clear()
    assert g.forward(1, cache=cache) == 2
    untaken.k = 20
    assert g.forward(1, cache=cache) == 2
    assert CALLS == ["select", "case 1"]
    taken.k = 10
    assert g.forward(1, cache=cache) == 11
    assert CALLS == ["select", "case 1", "case 10"]
