# ruff: noqa: E501 -- a snapshot is the message as it is, however long its lines.
"""Every message Soma shows a Python user, word for word, as inline snapshots.

The convention they follow: what is wrong between backticks — the node, the edge, the cycle's
path, the Python type — and a ``hint:`` line saying what to do. A snapshot is the whole story a
user reads: the exception's type and message, its notes, and its cause.

A mismatch fails the test and changes no file (see ``[tool.inline-snapshot]`` in
pyproject.toml). After changing a message on purpose, ``pytest tests/test_messages.py
--inline-snapshot=fix`` rewrites the snapshots in place, for review in the diff.

``soma.CompileError`` is not here: a graph registers a node and its implementation in one step,
so from Python no node can lack one. Its message is snapshotted in Rust
(``crates/soma-core/tests/it/messages.rs``), with every other core message.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from inline_snapshot import snapshot

import soma
from soma import _soma, native

ROOT = Path(__file__).resolve().parent.parent


def story(action: Callable[[], object]) -> str:
    """What a user reads when `action` raises: `Type: message`, then its notes and its cause."""
    try:
        action()
    except BaseException as error:  # Whatever it raises is the subject here.
        lines = [f"{type(error).__name__}: {error}"]
        lines += [f"note: {note}" for note in getattr(error, "__notes__", [])]
        if error.__cause__ is not None:
            lines.append(f"cause: {type(error.__cause__).__name__}: {error.__cause__}")
        return "\n".join(lines)
    raise AssertionError("expected an exception")


class Pass(soma.Node):
    def forward(self, x: Any) -> Any:
        return x


class AwaitsForever(soma.Node):
    def forward(self, x: Any, ctx: soma.Ctx) -> Any:
        return soma.Await([ctx.turn])


class Echo:
    """A driver that answers each request with itself."""

    def perform(self, requests: list[Any]) -> list[Any]:
        return requests


def chain(*ids: str) -> soma.Graph:
    g = soma.Graph()
    for node_id in ids:
        g.node(node_id, Pass())
    for source, target in itertools.pairwise(ids):
        g.edge(source, target)
    return g


def poller() -> soma.Graph:
    g = soma.Graph()
    g.node("poll", AwaitsForever())
    return g


# --- the graph refuses ----------------------------------------------------------------------


def test_cycle_shows_its_path() -> None:
    g = chain("a", "b", "c")
    assert story(lambda: g.edge("c", "a")) == snapshot("""\
CycleError: the edge `c` -> `a` would close a cycle: `c` -> `a` -> `b` -> `c`
hint: a graph is acyclic; remove an edge of that path\
""")


def test_self_loop() -> None:
    g = chain("a")
    assert story(lambda: g.edge("a", "a")) == snapshot("""\
CycleError: the edge `a` -> `a` would close a cycle: `a` -> `a`
hint: a graph is acyclic; remove an edge of that path\
""")


def test_duplicate_node() -> None:
    g = chain("encoder")
    assert story(lambda: g.node("encoder", Pass())) == snapshot("""\
DuplicateNodeError: a node `encoder` is already in the graph
hint: give the new node another id, or let Soma derive one\
""")


def test_a_node_named_as_one_inside_a_step() -> None:
    g = soma.Graph.somatize(soma.each(Pass().named("x")).named("a"))
    assert story(lambda: g.node("a/x", Pass())) == snapshot("""\
InvalidIdError: invalid node id `a/x`: `/` separates a step's id from the ids of the nodes inside it (`chunks/clean`), and cannot be in an id
hint: use another character, as in `a_x`\
""")


def test_a_switch_key_holding_a_slash() -> None:
    route = soma.switch(str, {"a/b": Pass()}).named("route")
    assert story(lambda: soma.Graph.somatize(route)) == snapshot("""\
InvalidIdError: invalid key `a/b` of switch step `route`: `/` separates the levels of the ids inside a case (`route/key/node`), and cannot be in a key
hint: use another character, as in `a_b`\
""")


def test_unknown_node() -> None:
    g = chain("a")
    assert story(lambda: g.edge("a", "ghost")) == snapshot("""\
UnknownNodeError: no node `ghost` in the graph
hint: add it with `node` before connecting it\
""")


def test_placing_an_unknown_node() -> None:
    g = chain("a", "b")
    assert story(lambda: g.place("nope", "cpu")) == snapshot("""\
UnknownNodeError: no node `nope` in the graph
hint: name a node by the id `node()` returned; the graph has `a`, `b`\
""")


def test_placing_a_node_of_an_empty_graph() -> None:
    assert story(lambda: soma.Graph().place("nope", "cpu")) == snapshot("""\
UnknownNodeError: no node `nope` in the graph
hint: the graph has no node yet: `g.node(obj)` adds one and returns its id\
""")


def test_asking_about_an_unknown_node_of_a_large_graph() -> None:
    g = chain(*(f"n{i}" for i in range(12)))
    assert story(lambda: g.implementation("nope")) == snapshot("""\
UnknownNodeError: no node `nope` in the graph
hint: name a node by the id `node()` returned; the graph has `n0`, `n1`, `n2`, `n3`, `n4`, `n5`, `n6`, `n7` and 4 more (`g.nodes()` lists them all)\
""")


def test_a_device_with_a_leading_zero() -> None:
    assert story(lambda: Pass().on("cuda:01")) == snapshot("""\
DeviceError: `cuda:01` is not how a device is written: torch writes it `cuda:1`
hint: write `cuda:1`: a kind in lowercase, then `:` and the index in decimal digits without a leading zero, no spaces\
""")


def test_invalid_id() -> None:
    assert story(lambda: soma.Graph().node("two words", Pass())) == snapshot("""\
InvalidIdError: invalid node id `two words`
hint: an id is a non-empty name without spaces or control characters\
""")


def test_duplicate_edge() -> None:
    g = chain("a", "b")
    assert story(lambda: g.edge("a", "b")) == snapshot("""\
DuplicateEdgeError: the edge `a` -> `b` is already in the graph
hint: an edge is declared once\
""")


def test_an_id_that_is_not_a_str() -> None:
    assert story(lambda: soma.Graph().node(3, Pass())) == snapshot("""\
TypeError: a node id is a `str`, not an object of type `int`
hint: call `g.node(obj)` or `g.node("id", obj)`\
""")


def test_an_object_without_forward() -> None:
    assert story(lambda: soma.Graph().node("n", object())) == snapshot("""\
TypeError: an object of type `object` cannot be a node: it has no callable `forward`
hint: subclass soma.Node and define `forward(self, x)`\
""")


# --- the DSL refuses ------------------------------------------------------------------------


def test_a_non_node_in_series() -> None:
    assert story(lambda: Pass() >> 3) == snapshot("""\
TypeError: cannot compose an object of type `int` with `>>`: only nodes (soma.Node instances, functions, torch modules) and expressions of them compose
hint: subclass soma.Node and define `forward(self, x)`, or decorate a function with `@soma.node`; an object with a `forward` of its own registers with Graph.node() and connects with Graph.edge()\
""")


def test_a_non_node_side_by_side() -> None:
    assert story(lambda: "text" | Pass()) == snapshot("""\
TypeError: cannot compose an object of type `str` with `|`: only nodes (soma.Node instances, functions, torch modules) and expressions of them compose
hint: subclass soma.Node and define `forward(self, x)`, or decorate a function with `@soma.node`; an object with a `forward` of its own registers with Graph.node() and connects with Graph.edge()\
""")


def test_a_function_without_a_parameter() -> None:
    def load() -> list[int]:
        return [1]

    assert story(lambda: soma.node(load)) == snapshot("""\
TypeError: `load` takes no positional parameter, where a node's function takes its input
hint: `def load(x)`: a root node receives the graph's input (`None` when `forward()` is given none)\
""")


def test_a_function_taking_ctx_first() -> None:
    def backwards(ctx: Any, x: Any) -> Any:
        return x

    assert story(lambda: soma.node(backwards)) == snapshot("""\
TypeError: `backwards` takes `ctx` first, where a node's function takes its input first
hint: `def backwards(x, ctx)`\
""")


def test_a_function_needing_more_than_its_input() -> None:
    def pair(x: Any, y: Any, *, z: Any) -> Any:
        return x

    assert story(lambda: soma.node(pair)) == snapshot("""\
TypeError: `pair` needs `y`, `z` beside its input, where a node's function is called with its input alone (and `ctx`)
hint: a node with several predecessors receives one dict keyed by their ids; give the other parameters defaults, or bind them with functools.partial\
""")


def test_soma_node_of_something_not_callable() -> None:
    not_callable: Any = 3
    assert story(lambda: soma.node(not_callable)) == snapshot("""\
TypeError: soma.node takes a function, a callable or a torch module, not an object of type `int`
hint: decorate a `def` with `@soma.node`, or subclass soma.Node\
""")


def test_the_same_instance_twice() -> None:
    shared = Pass()
    assert story(lambda: soma.Graph.somatize(shared >> shared)) == snapshot("""\
DuplicateNodeError: node `pass` appears twice in the expression
hint: a node instance is one node; create another instance to use it again\
""")


# --- a run stops ----------------------------------------------------------------------------


def test_turn_limit() -> None:
    assert story(lambda: poller().forward(None, driver=Echo(), turn_limit=3)) == snapshot("""\
TurnLimitError: node `poll` was still awaiting after 3 turns
hint: make it finish, or raise the turn limit\
""")


def test_no_driver() -> None:
    assert story(lambda: poller().forward(None)) == snapshot("""\
DriverError: node `poll` awaited, but no driver was given
hint: pass a driver that serves its requests\
""")


def test_wrong_result_count() -> None:
    class Three:
        def perform(self, requests: list[Any]) -> list[Any]:
            return [1, 2, 3]

    assert story(lambda: poller().forward(None, driver=Three())) == snapshot("""\
DriverError: the driver answered 3 result(s) to the 1 request(s) of node `poll`
hint: a driver returns exactly one result per request, in order\
""")


def test_the_driver_raised() -> None:
    class Offline:
        def perform(self, requests: list[Any]) -> list[Any]:
            raise ConnectionError("connection refused")

    assert story(lambda: poller().forward(None, driver=Offline())) == snapshot("""\
DriverError: the driver failed serving node `poll`: ConnectionError: connection refused
hint: the driver's own error is the cause; fix the driver, or the requests `poll` makes
cause: ConnectionError: connection refused\
""")


def test_the_driver_returned_no_list() -> None:
    class Counts:
        def perform(self, requests: list[Any]) -> int:
            return len(requests)

    assert story(lambda: poller().forward(None, driver=Counts())) == snapshot("""\
DriverError: the driver failed serving node `poll`: TypeError: `Counts.perform` returned a `int`, not a list of results
hint: return a `list` or a `tuple` holding one result per request, in order; other iterables are refused unread
hint: the driver's own error is the cause; fix the driver, or the requests `poll` makes
cause: TypeError: `Counts.perform` returned a `int`, not a list of results
hint: return a `list` or a `tuple` holding one result per request, in order; other iterables are refused unread\
""")


def test_the_driver_returned_a_str() -> None:
    class Spells:
        def perform(self, requests: list[Any]) -> str:
            return "x" * len(requests)

    assert story(lambda: poller().forward(None, driver=Spells())) == snapshot("""\
DriverError: the driver failed serving node `poll`: TypeError: `Spells.perform` returned a `str`, not a list of results
hint: return a `list` or a `tuple` holding one result per request, in order; other iterables are refused unread
hint: the driver's own error is the cause; fix the driver, or the requests `poll` makes
cause: TypeError: `Spells.perform` returned a `str`, not a list of results
hint: return a `list` or a `tuple` holding one result per request, in order; other iterables are refused unread\
""")


def test_the_driver_returned_an_endless_generator() -> None:
    class Streams:
        def perform(self, requests: list[Any]) -> Iterator[int]:
            return itertools.count()

    assert story(lambda: poller().forward(None, driver=Streams())) == snapshot("""\
DriverError: the driver failed serving node `poll`: TypeError: `Streams.perform` returned a `count`, not a list of results
hint: return a `list` or a `tuple` holding one result per request, in order; other iterables are refused unread
hint: the driver's own error is the cause; fix the driver, or the requests `poll` makes
cause: TypeError: `Streams.perform` returned a `count`, not a list of results
hint: return a `list` or a `tuple` holding one result per request, in order; other iterables are refused unread\
""")


def test_a_keyboard_interrupt_from_the_driver() -> None:
    class Interrupted:
        def perform(self, requests: list[Any]) -> list[Any]:
            raise KeyboardInterrupt

    assert story(lambda: poller().forward(None, driver=Interrupted())) == snapshot("""\
KeyboardInterrupt: \n\
note: raised in the driver serving soma node `poll`\
""")


def test_a_turn_limit_of_0() -> None:
    assert story(lambda: poller().forward(None, driver=Echo(), turn_limit=0)) == snapshot("""\
TurnLimitError: a turn limit of 0 lets no node run, so none was called
hint: the turn limit is the number of calls each node gets; pass at least 1, or leave it out for the default of 64\
""")


def test_a_driver_without_perform() -> None:
    assert story(lambda: poller().forward(None, driver=object())) == snapshot("""\
TypeError: a driver needs a callable `perform(requests)`, and `object` has none
hint: pass an object whose `perform` takes a list of requests and returns a list of results\
""")


def test_await_without_a_list() -> None:
    assert story(lambda: soma.Await(5)) == snapshot("""\
TypeError: `Await` takes a list of requests, not an object of type `int`
hint: wrap a single request in a list: `soma.Await([request])`\
""")


def test_an_exception_from_a_node_is_noted_with_the_node() -> None:
    class Check(soma.Node):
        def forward(self, x: int) -> int:
            raise ValueError(f"negative input: {x}")

    g = soma.Graph.somatize(Pass() >> Check())
    assert story(lambda: g.forward(-1)) == snapshot("""\
ValueError: negative input: -1
note: raised in soma node `check`\
""")


# --- the boundary with Rust nodes -----------------------------------------------------------


def test_a_value_a_rust_node_cannot_read() -> None:
    g = soma.Graph.somatize(Pass() >> native.Add(1))
    assert story(lambda: g.forward({1, 2})) == snapshot("""\
TypeError: a Rust node cannot read a value of type `set`
hint: Rust nodes read None, bool, int, float, str, bytes, lists and tuples of those, and dicts with str keys; convert it in a Python node first
note: raised in soma node `add`\
""")


def test_an_int_too_big_for_a_rust_node() -> None:
    g = soma.Graph.somatize(native.Add(1))
    assert story(lambda: g.forward(2**70)) == snapshot("""\
TypeError: a Rust node cannot read an `int` outside the 64-bit range
hint: keep big integers in Python nodes
note: raised in soma node `add`\
""")


def test_a_dict_without_str_keys_for_a_rust_node() -> None:
    g = soma.Graph.somatize(native.Sum())
    assert story(lambda: g.forward({1: 2})) == snapshot("""\
TypeError: a Rust node cannot read a `dict` with `int` keys
hint: use str keys
note: raised in soma node `sum`\
""")


def test_a_rust_node_refuses_a_value() -> None:
    g = soma.Graph.somatize(native.Add(1))
    assert story(lambda: g.forward("text")) == snapshot("""\
RunError: node `add` failed: `Add` reads an int or a float, not a `Text`
hint: give it numbers; convert the value in a node before it\
""")


def test_a_rust_node_refuses_a_value_outside_a_graph() -> None:
    assert story(lambda: native.Add(1).forward("text")) == snapshot("""\
ValueError: `Add` reads an int or a float, not a `Text`
hint: give it numbers; convert the value in a node before it\
""")


def test_a_rust_panic() -> None:
    g = soma.Graph.somatize(Pass() >> native.Panic("kaboom").named("bomb"))
    assert story(lambda: g.forward(1)) == snapshot("""\
PanicError: node `bomb` panicked: kaboom
hint: a panic is a bug in the node's Rust code; the run was stopped once every branch had been joined, and the graph can run again\
""")


# --- hostile input: a class for a node, ids that are not text, ints past 64 bits, copies ------


def test_a_node_class_where_an_instance_belongs() -> None:
    assert story(lambda: soma.Graph().node("x", Pass)) == snapshot("""\
TypeError: `Pass` is a class, where a node instance is expected
hint: register an instance: `g.node("x", Pass())`\
""")


def test_a_class_without_forward_where_a_node_belongs() -> None:
    assert story(lambda: soma.Graph().node(dict)) == snapshot("""\
TypeError: `dict` is a class, where a node instance is expected
hint: a node is an instance of a class with `forward(self, x)`, such as a soma.Node subclass\
""")


def test_somatize_given_a_class() -> None:
    assert story(lambda: soma.Graph.somatize(Pass)) == snapshot("""\
TypeError: `Pass` is a class, where a node instance is expected
hint: register an instance: `soma.Graph.somatize(Pass())`\
""")


def test_an_id_holding_a_lone_surrogate() -> None:
    assert story(lambda: soma.Graph().node("x\ud800", Pass())) == snapshot("""\
InvalidIdError: invalid node id `'x\\ud800'`: `'\\ud800'` at index 1 is a lone surrogate, not a character
hint: an id is a non-empty name without spaces or control characters; a lone surrogate usually comes from bytes decoded with errors='surrogateescape': decode them strictly, or choose another id\
""")


def test_an_edge_given_a_node_instead_of_its_id() -> None:
    g = chain("a")
    assert story(lambda: g.edge(Pass(), "a")) == snapshot("""\
TypeError: an edge source is a `str`, not an object of type `Pass`
hint: name the nodes by the ids `node()` returned: `a = g.node(A())`, then `g.edge(a, b)`\
""")


def test_a_rust_node_overflows() -> None:
    g = soma.Graph.somatize(native.Add(1).named("inc"))
    assert story(lambda: g.forward(2**63 - 1)) == snapshot("""\
OverflowError: `inc` overflowed: 9223372036854775807 + 1 is outside the 64-bit range of a Rust node's ints
hint: keep integers this large in Python nodes, or give the Rust node floats
note: raised in soma node `inc`\
""")


def test_a_rust_sum_overflows_outside_a_graph() -> None:
    assert story(lambda: native.Sum().forward([2**63 - 1, 1])) == snapshot("""\
OverflowError: `Sum()` overflowed: the sum 9223372036854775808 is outside the 64-bit range of a Rust node's ints
hint: keep integers this large in Python nodes, or give the Rust node floats\
""")


def test_a_rust_add_of_a_k_past_64_bits() -> None:
    assert story(lambda: native.Add(2**63)) == snapshot("""\
OverflowError: `Add(9223372036854775808)`: `k` is outside the 64-bit range of a Rust node's ints
hint: add integers this large in a Python node\
""")


def test_copying_a_trace() -> None:
    assert story(lambda: copy.copy(soma.Trace())) == snapshot("""\
TypeError: `copy.copy` cannot copy a `soma.Trace`: it is where runs record their spans, not a record
hint: keep what it holds — `spans = trace.spans` (a list of immutable spans) or `trace.to_chrome()` — and pass a new `soma.Trace()` to later runs\
""")


# --- async nodes -------------------------------------------------------------------------------


class AsyncPass(soma.Node):
    async def forward(self, x: Any) -> Any:
        return x


class AsyncAwaits(soma.Node):
    async def forward(self, x: Any) -> Any:
        return soma.Await([x])


class AsyncForever(soma.Node):
    async def forward(self, x: Any) -> Any:
        await asyncio.Event().wait()


def async_graph() -> soma.Graph:
    return soma.Graph.somatize(Pass().named("a") >> AsyncPass().named("fetch"))


def test_forward_of_async_nodes_inside_a_running_loop() -> None:
    async def inside() -> None:
        async_graph().forward(1)

    assert story(lambda: asyncio.run(inside())) == snapshot("""\
RuntimeError: forward of a graph with async nodes (`fetch`) was called inside a running event loop, which it would block
hint: `await g.aforward(x)` runs the graph on this loop without blocking it\
""")


def test_map_of_a_graph_with_async_nodes_inside_a_running_loop() -> None:
    g = async_graph()

    async def map_inside() -> None:
        g.map([1])

    assert story(lambda: asyncio.run(map_inside())) == snapshot("""\
RuntimeError: map of a graph with async nodes (`fetch`) was called inside a running event loop, which it would block
hint: `await g.aforward(x)` runs the graph on this loop without blocking it\
""")


def test_what_a_step_with_an_async_node_inside_says() -> None:
    class Fails(soma.Node):
        async def forward(self, x: Any) -> Any:
            raise ValueError(f"item {x} failed")

    inside = soma.Graph.somatize(soma.each(AsyncPass()).named("chunks"))

    async def forward_inside() -> None:
        inside.forward([1])

    assert story(lambda: asyncio.run(forward_inside())) == snapshot("""\
RuntimeError: forward of a graph with async nodes (`chunks/async_pass`) was called inside a running event loop, which it would block
hint: `await g.aforward(x)` runs the graph on this loop without blocking it\
""")
    assert story(lambda: asyncio.run(inside.aforward("text"))) == snapshot("""\
RunError: `each` step `chunks` read a `str`, not a list of items
hint: the step before it returns the items, a list (any sized sequence); wrap a single item in one\
""")
    failing = soma.Graph.somatize(soma.each(Fails()).named("chunks"))
    assert story(lambda: asyncio.run(failing.aforward([1, 2]))) == snapshot("""\
ValueError: item 1 failed
note: raised in soma node `chunks/fails`\
""")
    route = soma.Graph.somatize(soma.switch(str, {"a": AsyncPass()}).named("route"))
    assert story(lambda: asyncio.run(route.aforward("b"))) == snapshot("""\
RunError: `switch` step `route` has no case for key `'b'`; its cases: `'a'`
hint: make the selector return one of these keys, or add a case for it
note: raised in soma node `route`\
""")
    again = soma.Graph.somatize(
        soma.loop(AsyncPass(), until=lambda y: False, max_iterations=3).named("again")
    )
    assert story(lambda: asyncio.run(again.aforward({}))) == snapshot("""\
RunError: `loop` step `again` ran its body 3 times and `until` still said not done; the last output was a `dict`
hint: raise `max_iterations`, or check that `until` can become true\
""")


def test_an_async_node_returns_await() -> None:
    g = soma.Graph.somatize(AsyncAwaits().named("asks"))
    assert story(lambda: asyncio.run(g.aforward(1))) == snapshot("""\
TypeError: async node `asks` returned soma.Await: a driver serves sync nodes only
hint: await the call in the node itself, or make the node sync to batch its requests with a driver
note: raised in soma node `asks`\
""")


def test_an_async_node_past_its_time_limit_and_a_run_past_its_timeout() -> None:
    limited = soma.Graph.somatize(AsyncForever().named("slow").time_limit(0.01))
    assert story(lambda: asyncio.run(limited.aforward(1))) == snapshot("""\
TimeLimitError: node `slow` ran past its time limit of 0.01 s
hint: a sync call goes on in the background, its result dropped, and an async one is cancelled; raise the limit, or let `.retry(on=(TimeoutError,))` try it again\
""")
    stuck = soma.Graph.somatize(Pass().named("a") >> AsyncForever().named("stuck"))
    # Long enough for `stuck` to have started, its sync predecessor lent a thread and back, on
    # a loaded machine: at the deadline it is the node running.
    assert story(lambda: asyncio.run(stuck.aforward(1, timeout=0.2))) == snapshot("""\
TimeoutError: aforward did not finish within its timeout of 0.2 s; still running: `stuck` (cancelled)
hint: the graph can run again at once; a node that waits for something that may not come should wait with a timeout of its own\
""")
    assert story(lambda: list(stuck.map([1], timeout=0.2))) == snapshot("""\
TimeoutError: the stream did not finish within its timeout of 0.2 s; still running: `stuck` (cancelled)
hint: the graph can run again at once; a node that waits for something that may not come should wait with a timeout of its own\
""")


def test_a_run_on_hosts_past_its_timeout_is_worded_as_every_run() -> None:
    # What `soma.remote` raises when a slice outlasts the run's deadline on its host (the Ray
    # tests run it for real and read its first line).
    def raise_it() -> None:
        raise _soma.hosts_past_timeout(0.5, "; still running: `stuck` on host `one`, stopped there")

    assert story(raise_it) == snapshot("""\
TimeoutError: forward did not finish within its timeout of 0.5 s; still running: `stuck` on host `one`, stopped there
hint: the graph can run again at once; a node that waits for something that may not come should wait with a timeout of its own\
""")


# --- the snapshots themselves ---------------------------------------------------------------


@pytest.mark.parametrize("ci", [True, False], ids=["ci", "local"])
def test_a_wrong_snapshot_fails_and_changes_no_file(tmp_path: Path, ci: bool) -> None:
    """Under this project's configuration (a copy of its pyproject.toml, warnings as errors
    included), a snapshot that no longer matches fails the run — in CI and out of it — and no
    file is rewritten."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    wrong = tmp_path / "test_wrong.py"
    wrong.write_text(
        "from inline_snapshot import snapshot\n\n\n"
        "def test_wrong() -> None:\n"
        '    assert "what it says" == snapshot("what it said")\n'
    )
    before = wrong.read_text()
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", wrong.name],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "1 failed" in run.stdout, run.stdout
    assert wrong.read_text() == before
