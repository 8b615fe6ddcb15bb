"""Hosts, without a cluster: ``.at()`` and ``g.place_at()`` place nodes on hosts, read where
written (the innermost ``.at`` wins); the plan stays what it was, and ``distributed_plan`` cuts
it into one ``Remote`` slice per largest subtree on one host; each slice is sent only what it
reads and sends back only what later steps read. A graph without hosts never imports Ray, and
without Ray a graph with hosts says how to install it. A deadline met while a slice is out names
the slice's nodes and host, not the stand-in that waits for it here.

The runs on a real Ray cluster are in ``test_ray_hosts.py``.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import soma
from conftest import CallRecord, serving
from soma.remote import INPUT, Distributed


class Add(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        return x + self.k


class Total(soma.Node):
    def forward(self, xs: dict[str, int]) -> int:
        return sum(xs.values())


def diamond() -> soma.Graph:
    return soma.Graph.somatize(
        Add(1).named("a")
        >> (Add(10).named("b") | (Add(100).named("c") >> Add(1000).named("d")))
        >> Total().named("t")
    )


def test_a_nodes_own_at_wins_over_an_expressions_around_it() -> None:
    inner = Add(1).named("inner").at("gpu-box")
    g = soma.Graph.somatize((inner >> Add(2).named("outer")).at("cpu-box"))
    assert g.hosts() == {"inner": "gpu-box", "outer": "cpu-box"}


def test_place_at_places_replaces_and_unplaces() -> None:
    g = diamond()
    g.place_at("b", "one")
    g.place_at("c", "two")
    g.place_at("c", "three")
    g.place_at("d", "three")
    assert g.hosts() == {"b": "one", "c": "three", "d": "three"}
    g.place_at("b", None)
    assert g.hosts() == {"c": "three", "d": "three"}


def test_a_host_name_that_cannot_be_is_refused_where_it_is_written() -> None:
    with pytest.raises(soma.HostError, match=r"`gpu box` is not a host name\nhint:") as raised:
        Add(1).at("gpu box")
    assert raised.value.host == "gpu box"
    with pytest.raises(soma.HostError):
        (Add(1) >> Add(2)).at("")
    with pytest.raises(soma.HostError):
        diamond().place_at("a", "a:b")


def test_placing_an_unknown_node_on_a_host_names_it() -> None:
    with pytest.raises(soma.UnknownNodeError, match="`nope`"):
        diamond().place_at("nope", "one")


def test_hosts_change_neither_the_plan_nor_a_graph_without_them() -> None:
    g = diamond()
    before = g.plan()
    assert g.distributed_plan() == before
    g.place_at("b", "one")
    assert g.plan() == before
    assert g.distributed_plan() != before


def test_the_distributed_plan_has_a_remote_slice_per_largest_subtree_on_one_host() -> None:
    g = diamond()
    g.place_at("b", "one")
    g.place_at("c", "two")
    g.place_at("d", "two")
    plan = g.distributed_plan()
    assert repr(plan) == (
        "Sequence([Execute(a), Wave([Remote@one(Execute(b)), "
        "Remote@two(Sequence([Execute(c), Execute(d)]))]), Execute(t)])"
    )
    remote = plan.children[1].children[1]
    assert (remote.kind, remote.host, remote.children[0].kind) == ("Remote", "two", "Sequence")
    assert "Remote on two" in str(plan)
    assert 'subgraph soma_host_1 ["host two"]' in plan.to_mermaid()
    assert plan.to_svg().count('<g class="host">') == 2


def test_a_slice_is_sent_only_what_it_reads_and_returns_only_what_later_steps_read() -> None:
    g = soma.Graph.somatize(
        Add(1).named("a")
        >> Add(2).named("b")
        >> Add(3).named("c")
        >> Add(4).named("d")
        >> Add(5).named("e")
    )
    g.place_at("b", "one")
    g.place_at("c", "one")
    g.place_at("d", "one")
    (piece,) = Distributed(g._core, soma.Graph).slices
    assert (piece.host, piece.names()) == ("one", ["b", "c", "d"])
    assert piece.reads == ("a",)
    assert piece.returns == ("d",)


def test_a_slice_reads_the_graphs_input_and_returns_a_leaf_of_the_run() -> None:
    g = soma.Graph.somatize(Add(1).named("a").at("one") >> (Add(2).named("b") | Add(3).named("c")))
    g.place_at("b", "one")
    # Not one: `a` and `b` are no subtree of their own.
    first, second = Distributed(g._core, soma.Graph).slices
    assert (first.names(), first.reads, first.returns) == (["a"], (INPUT,), ("a",))
    assert (second.names(), second.reads, second.returns) == (["b"], ("a",), ("b",))


def test_a_stream_refuses_a_graph_with_hosts_rather_than_run_it_here() -> None:
    g = diamond()
    g.place_at("b", "one")
    with pytest.raises(ValueError, match=r"node `b` is placed on host `one`, and streams do not"):
        g.map([1, 2])
    with pytest.raises(ValueError, match="streams do not run slices on hosts yet"):
        g.forward([1, 2], micro_batches=2)


def run_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_graph_without_hosts_never_imports_ray() -> None:
    child = run_child(
        """
        import sys
        import soma

        class Add(soma.Node):
            def forward(self, x):
                return x + 1

        g = soma.Graph.somatize(Add().named("a") >> (Add().named("b") | Add().named("c")))
        assert g.forward(1) == {"b": 3, "c": 3}
        assert g.distributed_plan() == g.plan()
        assert "ray" not in sys.modules, "ray was imported"
        print("ok")
        """
    )
    assert (child.returncode, child.stdout.strip()) == (0, "ok"), child.stderr


def test_without_ray_a_graph_with_hosts_says_how_to_install_it() -> None:
    child = run_child(
        """
        import sys
        sys.modules["ray"] = None  # As if it were not installed.
        import soma

        class Add(soma.Node):
            def forward(self, x):
                return x + 1

        g = soma.Graph.somatize(Add().named("a") >> Add().named("b").at("gpu-box"))
        try:
            g.forward(1)
        except ModuleNotFoundError as error:
            print(error)
        """
    )
    assert child.returncode == 0, child.stderr
    assert "Soma runs them on Ray, which is not installed" in child.stdout
    assert "pip install 'soma-graph[ray]'" in child.stdout


def test_a_timeout_met_while_a_slice_is_out_names_the_slices_nodes_and_host() -> None:
    # A transport that does not keep the run's deadline itself: the engine's own deadline ends
    # the run while the slice's stand-in still waits, and the error names what the stand-in
    # stands for. In a child, with a deadline: a run that hangs fails the test.
    child = run_child(
        """
        import threading, time
        import soma
        from soma.remote import SliceRunner

        started = threading.Event()

        class LateHost:
            def load(self, key, slices, timeout=None):
                self.runners = {piece.index: SliceRunner(piece) for piece in slices}

            def run(self, key, index, inputs, timeout, token, traced):
                started.set()
                time.sleep(2.0)  # Past the run's deadline, whatever it was told.
                return self.runners[index].run(inputs)

            def cancel(self, tokens, wait=5.0):
                pass

            def unload(self, key):
                pass

        class Hosts:
            def __init__(self):
                self.one = LateHost()

            def host(self, name):
                return self.one

        class AfterTheSliceLeft(soma.Node):
            def forward(self, x):
                assert started.wait(20)
                return x

        class Far(soma.Node):
            def forward(self, x):
                return x

        soma.remote.use(Hosts())
        g = soma.Graph.somatize(AfterTheSliceLeft().named("here") | Far().named("far").at("one"))
        try:
            g.forward(1, timeout=0.5)
        except TimeoutError as error:
            print(str(error).splitlines()[0])
        """
    )
    assert child.returncode == 0, child.stderr
    said = child.stdout.strip()
    assert "still running: `far` on host `one`" in said, said
    assert "one#" not in said, said


class _HostHere:
    """A host in this process, as a host elsewhere would be: it keeps copies of the slices it is
    sent (pickled and unpickled), counts what it is sent (``loads``: the node ids of each slice
    sent, by load), and finds its folder cache at ``folder`` (``None``: where the caller's is),
    as a host elsewhere would see a path."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.runners: dict[tuple[str, int], Any] = {}
        self.loads: list[list[list[str]]] = []
        #: Loads to refuse, as a host that did not take them in time would.
        self.refuse = 0

    def load(self, key: str, slices: list[Any], timeout: float | None = None) -> None:
        if self.refuse:
            self.refuse -= 1
            raise soma.RemoteError("host `one` did not take its slices in time")
        copies = pickle.loads(pickle.dumps(slices))
        for piece in copies:
            self.runners[key, piece.index] = soma.remote.SliceRunner(piece)
        self.loads.append([piece.names() for piece in slices])

    def run(
        self,
        key: str,
        index: int,
        inputs: dict[str, Any],
        timeout: float | None,
        token: str,
        traced: bool,
        cache: tuple[str, int | None, bytes | None] | None = None,
    ) -> Any:
        if cache is not None and self.folder is not None:
            cache = (self.folder, cache[1], cache[2])
        return self.runners[key, index].run(inputs, None, traced, cache=cache)

    def cancel(self, tokens: list[str], wait: float = 5.0) -> None:
        pass

    def unload(self, key: str) -> None:
        pass


class _HostsHere:
    def __init__(self, folder: str | None = None) -> None:
        self.folder = folder
        self.hosts: dict[str, _HostHere] = {}

    def host(self, name: str) -> _HostHere:
        return self.hosts.setdefault(name, _HostHere(self.folder))


@pytest.fixture
def hosts_here() -> Iterator[_HostsHere]:
    """Hosts in this process, each keeping copies of what it is sent, as the transport."""
    with serving(_HostsHere()) as hosts:
        yield hosts


class _Counted(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        _CALLED.append(self.k)
        return x + self.k


_CALLED = CallRecord()  # Keyed as an empty record: recording a call changes no key.


def test_a_host_that_cannot_open_the_cache_folder_runs_its_slice_uncached_with_one_warning(
    tmp_path: Path,
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    soma.remote.use(_HostsHere(str(blocked / "cache")))  # type: ignore[arg-type]
    try:
        g = soma.Graph.somatize(_Counted(1) >> _Counted(2).at("one"))
        cache = soma.Cache(tmp_path / "cache")
        _CALLED.clear()
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            results = [g.forward(0, cache=cache) for _ in range(2)]
        assert results == [3, 3]
        assert [type(w.message) for w in warned] == [soma.CacheWarning]
        assert "cannot be opened on this host" in str(warned[0].message)
        assert _CALLED == [1, 2, 2]
    finally:
        soma.remote.use(None)


class _Joined(soma.Node):
    def forward(self, xs: dict[str, int]) -> int:
        _CALLED.append(0)
        return sum(xs.values())


def test_a_slice_reading_the_graphs_input_and_a_node_here_is_found_in_the_cache_on_a_rerun(
    tmp_path: Path,
) -> None:
    soma.remote.use(_HostsHere())  # type: ignore[arg-type]
    try:
        g = soma.Graph()
        g.node("first", _Counted(1))
        g.node("far", _Counted(10).at("one"))  # Reads the graph's input, on the host...
        g.node("join", _Joined().at("one"))  # ...and this, there, reads `first` from here too.
        g.edge("first", "join")
        g.edge("far", "join")
        cache = soma.Cache(tmp_path / "cache")
        _CALLED.clear()
        assert g.forward(5, cache=cache) == 6 + 15
        assert sorted(_CALLED) == [0, 1, 10]
        _CALLED.clear()
        assert g.forward(5, cache=cache) == 21
        assert _CALLED == []
        assert cache.stats().hits == 3
    finally:
        soma.remote.use(None)


class Holds(soma.Node):
    """Adds what it holds: a number, or the sum of a list or an array."""

    def __init__(self, held: Any) -> None:
        self.held = held

    def forward(self, x: int) -> int:
        return x + int(np.sum(self.held))


def _rebind(node: Holds) -> None:
    node.held = 5


def _set_second(node: Holds) -> None:
    node.held[1] = 4


#: By name: what the node holds first (made afresh for each test), and the edit.
EDITS: dict[str, tuple[Callable[[], Any], Callable[[Holds], None]]] = {
    "an attribute rebound": (lambda: 1, _rebind),
    "a list mutated in place": (lambda: [1, 0], _set_second),
    "a numpy array changed in place": (lambda: np.array([1, 0]), _set_second),
}


@pytest.mark.parametrize("cached", [False, True], ids=["without a cache", "with a folder cache"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_a_node_on_a_host_edited_between_runs_runs_there_as_it_is_now(
    hosts_here: _HostsHere, tmp_path: Path, edit: str, cached: bool
) -> None:
    held, change = EDITS[edit]
    far = Holds(held()).named("far").at("one")
    g = soma.Graph.somatize(Add(0).named("a") >> far >> Add(100).named("b").at("two"))
    cache = soma.Cache(tmp_path / "cache") if cached else None
    assert g.forward(10, cache=cache) == 111
    change(far)
    assert g.forward(10, cache=cache) == 115
    # The edited node's slice went again, alone: the other host's was never sent twice.
    assert hosts_here.hosts["one"].loads == [[["far"]], [["far"]]]
    assert hosts_here.hosts["two"].loads == [[["b"]]]


def test_a_rerun_of_an_unchanged_graph_sends_its_hosts_nothing(hosts_here: _HostsHere) -> None:
    g = soma.Graph.somatize(
        Holds([1, 2]).named("far").at("one") >> Holds(np.ones(3)).named("farther").at("two")
    )
    assert [g.forward(0) for _ in range(3)] == [6, 6, 6]
    assert hosts_here.hosts["one"].loads == [[["far"]]]
    assert hosts_here.hosts["two"].loads == [[["farther"]]]


def test_of_two_slices_on_one_host_only_the_one_whose_node_changed_is_sent_again(
    hosts_here: _HostsHere,
) -> None:
    first = Holds([1]).named("first").at("one")
    g = soma.Graph.somatize(first >> Add(0).named("here") >> Holds(2).named("second").at("one"))
    assert g.forward(0) == 3
    first.held.append(10)
    assert g.forward(0) == 13
    assert hosts_here.hosts["one"].loads == [[["first"], ["second"]], [["first"]]]


class _InItsOwnSet:
    """An object held in a set it holds: pickle keeps the cycle, a digest refuses it."""

    def __init__(self) -> None:
        self.members = {self}


def test_a_node_whose_state_cannot_be_fingerprinted_is_sent_again_before_every_run(
    hosts_here: _HostsHere,
) -> None:
    # It pickles, but a digest of it would go round the set forever: it has none, and no edit
    # of the node could be seen.
    odd = Holds(1).named("odd").at("one")
    odd.marker = _InItsOwnSet()
    g = soma.Graph.somatize(odd >> Holds(2).named("plain").at("two"))
    assert [g.forward(0) for _ in range(3)] == [3, 3, 3]
    assert hosts_here.hosts["one"].loads == [[["odd"]]] * 3
    assert hosts_here.hosts["two"].loads == [[["plain"]]]


def test_a_slice_that_could_not_be_sent_again_is_sent_on_the_next_run(
    hosts_here: _HostsHere,
) -> None:
    far = Holds(1).named("far").at("one")
    g = soma.Graph.somatize(far)
    assert g.forward(0) == 1
    far.held = 2
    hosts_here.hosts["one"].refuse = 1
    with pytest.raises(soma.RemoteError, match="did not take its slices"):
        g.forward(0)
    assert g.forward(0) == 2
    assert hosts_here.hosts["one"].loads == [[["far"]], [["far"]]]


class _LoadsUntilJustBeforeTheDeadline(_HostHere):
    """A host whose load gives up a hair before the run's deadline, as a transport's timer
    bounded by the run's time left may fire early."""

    def load(self, key: str, slices: list[Any], timeout: float | None = None) -> None:
        assert timeout is not None
        threading.Event().wait(max(timeout - 0.01, 0.0))
        raise soma.RemoteError("host `one` did not take its slices in time")


def test_a_load_given_up_just_before_the_deadline_ends_the_run_as_its_timeout(
    hosts_here: _HostsHere,
) -> None:
    hosts_here.hosts["one"] = _LoadsUntilJustBeforeTheDeadline(None)
    g = soma.Graph.somatize(Holds(1).named("far").at("one"))
    with pytest.raises(TimeoutError, match="its nodes still on their way there"):
        g.forward(0, timeout=0.3)
