"""A graph pickles: ids, nodes, edges, where its nodes run and its settings come back, nothing
of a run does, and a node that cannot be pickled is named."""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import sys
import threading
import types
from typing import Any

import pytest

import soma
from conftest import DEADLINE, Add, Double, Pass
from soma import native


class Box(soma.Node):
    """Holds whatever it is given, and returns it with the input appended."""

    def __init__(self, items: Any) -> None:
        self.items = items

    def forward(self, x: Any) -> Any:
        return [*self.items, x]


class Locked(soma.Node):
    """Holds a lock, which cannot be pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def forward(self, x: Any) -> Any:
        return x


def a_graph() -> soma.Graph:
    """A wave between a source and a join, Python and Rust nodes, devices, hosts, a setting."""
    g = soma.Graph.somatize(
        Add(1).named("source").on("meta")
        >> (Double().named("double").at("box").concurrency(4) | native.Add(10).named("plus_ten"))
        >> native.Sum().named("join")
    )
    g.place("double", "cpu")
    g.place("source", None)  # Its own `.on` undone: it must stay unplaced.
    g.place_at("plus_ten", "gpu-box")
    g.place_at("double", None)  # Its own `.at` undone: it must stay here.
    g.concurrency("double", None)  # Its own `.concurrency` undone: one item at a time.
    g.concurrency("source", 3)
    g.idle_threads = 5
    return g


def unpickled(g: soma.Graph) -> soma.Graph:
    loaded = pickle.loads(pickle.dumps(g))
    assert isinstance(loaded, soma.Graph)
    return loaded


def test_a_pickled_graph_comes_back_with_its_ids_edges_and_plan() -> None:
    g = a_graph()
    loaded = unpickled(g)
    assert loaded.nodes() == g.nodes() == ["source", "double", "plus_ten", "join"]
    assert loaded.edges() == g.edges()
    assert loaded.plan() == g.plan()
    assert repr(loaded.plan()) == repr(g.plan())


def test_a_pickled_graph_keeps_where_its_nodes_run_and_its_settings() -> None:
    loaded = unpickled(a_graph())
    assert loaded.devices() == {"double": "cpu"}
    assert loaded.hosts() == {"plus_ten": "gpu-box"}
    assert loaded.distributed_plan() == a_graph().distributed_plan()
    assert loaded.concurrencies() == {"source": 3}
    assert loaded.idle_threads == 5


@pytest.mark.parametrize("copied", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_a_copied_graph_keeps_where_its_nodes_run_and_their_concurrency_as_set_by_id(
    copied: Any,
) -> None:
    g = copied(a_graph())
    assert g.devices() == {"double": "cpu"}
    assert g.hosts() == {"plus_ten": "gpu-box"}
    assert g.concurrencies() == {"source": 3}


def test_a_pickled_graph_gives_the_same_results() -> None:
    g = soma.Graph.somatize(
        Add(1).named("source") >> (Double() | native.Add(10)) >> native.Sum().named("join")
    )
    loaded = unpickled(g)
    assert loaded.forward(4) == g.forward(4) == (4 + 1) * 2 + (4 + 1 + 10)


def test_a_graph_pickled_after_running_carries_none_of_its_threads() -> None:
    g = soma.Graph.somatize(Pass() >> (Double() | Double()) >> Pass())
    assert g.forward(1) == {"double": 2, "double_2": 2}
    assert g.threads() > 0
    loaded = unpickled(g)
    assert loaded.threads() == 0
    assert loaded.forward(3) == {"double": 6, "double_2": 6}


class SavesItsGraph(soma.Node):
    """Pickles the graph it runs in, from inside the run."""

    def __init__(self) -> None:
        self.graph: soma.Graph | None = None
        self.saved: list[bytes] = []

    def forward(self, x: Any) -> Any:
        assert self.graph is not None
        self.saved.append(pickle.dumps(self.graph))
        return x + 1


def test_a_graph_pickled_while_it_runs_comes_back_idle_and_runs() -> None:
    saver = SavesItsGraph()
    g = soma.Graph.somatize(Pass() >> (saver.named("saver") | Double()) >> native.Sum())
    saver.graph = g
    assert g.forward(3) == 4 + 6
    loaded = pickle.loads(saver.saved[0])
    assert loaded.threads() == 0
    assert loaded.edges() == g.edges()
    assert loaded.implementation("saver").graph is loaded
    assert loaded.forward(3) == 4 + 6


def test_rust_nodes_pickle_as_the_constructor_that_made_them() -> None:
    for node in (native.Add(3), native.Identity(), native.Sum(), native.Panic("boom")):
        loaded = pickle.loads(pickle.dumps(node))
        assert type(loaded) is type(node)
        assert repr(loaded) == repr(node)
    assert pickle.loads(pickle.dumps(native.Add(3))).forward(4) == 7


def test_nodes_that_share_an_object_share_it_after_unpickling() -> None:
    shared = [1]
    g = soma.Graph()
    g.node("a", Box(shared))
    g.node("b", Box(shared))
    loaded = unpickled(g)
    a, b = loaded.implementation("a"), loaded.implementation("b")
    assert a.items is b.items
    assert a.items == [1]


def test_a_node_that_refers_to_its_graph_refers_to_the_unpickled_one() -> None:
    g = soma.Graph()
    keeper = Box([])
    keeper.graph = g  # type: ignore[attr-defined]
    g.node("keeper", keeper)
    loaded = unpickled(g)
    assert loaded.implementation("keeper").graph is loaded


def test_a_node_that_cannot_be_pickled_is_named_with_its_class_and_cause() -> None:
    g = soma.Graph()
    g.node("fine", Pass())
    g.node("locked", Locked())
    with pytest.raises(soma.NodePicklingError) as raised:
        pickle.dumps(g)
    error = raised.value
    assert isinstance(error, pickle.PicklingError)
    assert error.node == "locked"
    assert str(error).startswith(
        "node `locked` (`test_pickle.Locked`) cannot be pickled: "
        "TypeError: cannot pickle '_thread.lock' object\nhint: "
    )
    assert isinstance(error.__cause__, TypeError)


def test_a_lambda_node_is_named_too() -> None:
    g = soma.Graph()
    g.node("anonymous", types.SimpleNamespace(forward=lambda x: x))
    with pytest.raises(soma.NodePicklingError, match="node `anonymous` "):
        pickle.dumps(g)


def test_a_node_whose_class_cannot_be_imported_where_it_loads_is_named_there() -> None:
    module = types.ModuleType("soma_test_vanishing")
    exec("class Gone:\n    def forward(self, x):\n        return x\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        g = soma.Graph()
        g.node("gone", module.Gone())
        saved = pickle.dumps(g)
    finally:
        del sys.modules[module.__name__]
    with pytest.raises(ModuleNotFoundError) as raised:
        pickle.loads(saved)
    assert any("while loading node `gone`" in note for note in raised.value.__notes__)


def run_pickled(saved: bytes, x: Any) -> tuple[int, Any]:
    """What a worker process does with a graph it was sent: load it and run it."""
    return os.getpid(), pickle.loads(saved).forward(x)


def run_sent(g: soma.Graph, x: Any) -> tuple[int, Any]:
    return os.getpid(), g.forward(x)


def test_a_graph_pickled_here_runs_in_a_spawned_process() -> None:
    g = soma.Graph.somatize(
        Add(1).named("source") >> (Double() | native.Add(10)) >> native.Sum().named("join")
    )
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        from_bytes = pool.apply_async(run_pickled, (pickle.dumps(g), 4))
        as_argument = pool.apply_async(run_sent, (g, 4))
        expected = g.forward(4)
        for pid, result in (from_bytes.get(10 * DEADLINE), as_argument.get(10 * DEADLINE)):
            assert pid != os.getpid()
            assert result == expected


class Reports(soma.Node):
    """Puts what it computes on a queue shared with the process that made it."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def forward(self, x: Any) -> Any:
        self.queue.put(x * 10)
        return x


def run_and_return(g: soma.Graph, x: Any) -> None:
    g.forward(x)


def test_a_node_holding_a_multiprocessing_queue_goes_to_a_process_with_its_graph() -> None:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    g = soma.Graph.somatize(Pass() >> Reports(queue))
    child = context.Process(target=run_and_return, args=(g, 4))
    child.start()
    try:
        assert queue.get(timeout=10 * DEADLINE) == 40
    finally:
        child.join(timeout=10 * DEADLINE)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
