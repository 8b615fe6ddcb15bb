"""Devices: ``.on()`` and ``g.place()`` place nodes, read where written; placement changes neither
the plan nor a result, and drawings and traces show it. While a placed node runs, its device is
current on its thread, and the device current before is put back when it returns or raises — on
chains, waves, nested waves and the N, with threads lent again and again. A placed node whose
output lives elsewhere fails with a named error.

A fake backend stands in for torch: it keeps a current device per thread and records who set
what (``soma.devices`` says what a backend is).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import soma
from conftest import DEADLINE, merged, registered


class Recorder:
    """A backend for ``cuda`` and ``xpu`` that keeps a current device per thread, ``cuda:0``
    unless set, as the CUDA runtime does."""

    kinds = ("cuda", "xpu")

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self.sets: list[tuple[int, str]] = []

    def current(self, kind: str) -> str | None:
        return getattr(self._local, kind, f"{kind}:0")

    def set(self, device: str) -> None:
        setattr(self._local, device.partition(":")[0], device)
        with self._lock:
            self.sets.append((threading.get_ident(), device))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    with registered(Recorder()) as backend:
        yield backend


class Where(soma.Node):
    """Meets the others at ``barrier`` (if given), raises ``raises`` (if given), else answers its
    ``ctx.device``, the current cuda device of its thread, and its thread."""

    def __init__(
        self,
        recorder: Recorder,
        barrier: threading.Barrier | None = None,
        raises: BaseException | None = None,
    ) -> None:
        self.recorder = recorder
        self.barrier = barrier
        self.raises = raises

    def forward(self, x: Any, ctx: Any) -> dict[str, Any]:
        if self.barrier is not None:
            self.barrier.wait()
        if self.raises is not None:
            raise self.raises
        seen = dict(x) if isinstance(x, dict) else {}
        seen[ctx.node] = (ctx.device, self.recorder.current("cuda"), threading.get_ident())
        return seen


# ---------------------------------------------------------------------------------------------
# Writing placements


def test_on_places_a_node_and_the_innermost_on_wins(recorder: Recorder) -> None:
    a, b, c = Where(recorder).named("a"), Where(recorder).named("b"), Where(recorder).named("c")
    g = soma.Graph.somatize(a.on("cuda:1") >> (b | c.on("cuda:2")).on("cuda:3"))
    assert g.devices() == {"a": "cuda:1", "b": "cuda:3", "c": "cuda:2"}


def test_place_places_replaces_and_unplaces_a_node() -> None:
    g = soma.Graph.somatize(soma.native.Identity().named("a") >> soma.native.Identity().named("b"))
    assert g.devices() == {}
    g.place("b", "cuda:0")
    g.place("a", "meta")
    assert g.devices() == {"a": "meta", "b": "cuda:0"}, "in the order the nodes were added"
    g.place("b", "xpu:1")
    assert g.devices() == {"a": "meta", "b": "xpu:1"}
    g.place("a", None)
    assert g.devices() == {"b": "xpu:1"}


@pytest.mark.parametrize(
    "written",
    ["cuda", "gpu:0", "cuda:x", "CUDA:0", "", "cuda:-1", "xpu", "cuda:01", "cuda:+1", "cuda: 1"],
)
def test_a_device_that_cannot_be_read_is_refused_where_it_is_written(written: str) -> None:
    g = soma.Graph.somatize(soma.native.Identity().named("a"))
    with pytest.raises(soma.DeviceError) as placed:
        g.place("a", written)
    assert placed.value.device == written
    with pytest.raises(soma.DeviceError):
        soma.native.Identity().on(written)
    with pytest.raises(soma.DeviceError):
        (soma.native.Identity() | soma.native.Identity()).on(written)
    assert g.devices() == {}


@pytest.mark.parametrize(
    ("written", "canonical"),
    [("cuda:01", "cuda:1"), ("cuda:+1", "cuda:1"), ("cuda: 1", "cuda:1"), ("CUDA:1", "cuda:1")],
)
def test_a_device_spelled_otherwise_than_torch_spells_it_is_refused_naming_both_spellings(
    written: str, canonical: str
) -> None:
    with pytest.raises(soma.DeviceError) as refused:
        soma.native.Identity().on(written)
    assert refused.value.device == written
    assert str(refused.value).startswith(
        f"`{written}` is not how a device is written: torch writes it `{canonical}`\n"
    )


def test_a_bare_cuda_is_refused_with_a_hint_that_says_which_to_write() -> None:
    with pytest.raises(soma.DeviceError, match=r"write `cuda:0`, `cuda:1`"):
        soma.native.Identity().on("cuda")


def test_placing_an_unknown_node_is_an_unknown_node_error() -> None:
    g = soma.Graph.somatize(soma.native.Identity().named("a"))
    with pytest.raises(soma.UnknownNodeError):
        g.place("ghost", "cpu")


def test_placing_changes_neither_the_plan_nor_the_result() -> None:
    g = soma.Graph.somatize(
        soma.native.Add(1).named("a")
        >> (soma.native.Add(2).named("b") | soma.native.Add(3).named("c"))
    )
    plan, result = g.plan(), g.forward(1)
    g.place("b", "cuda:1")
    g.place("a", "cpu")
    assert g.plan() == plan
    assert g.forward(1) == result


def test_a_plan_handed_out_keeps_drawing_the_placement_it_was_given_after_placing_again() -> None:
    g = soma.Graph.somatize(soma.native.Identity().named("a") >> soma.native.Identity().named("b"))
    g.place("b", "cuda:1")
    before = g.plan()
    g.place("b", "cuda:2")
    g.place("a", "meta")
    assert str(before) == "Sequence\n├── a <- (input)\n└── b <- a @ cuda:1"
    assert str(g.plan()) == "Sequence\n├── a <- (input) @ meta\n└── b <- a @ cuda:2"


def test_a_copy_of_a_graph_keeps_its_placement() -> None:
    g = soma.Graph.somatize(soma.native.Identity().named("a"))
    g.place("a", "meta")
    assert copy.copy(g).devices() == {"a": "meta"}
    assert copy.deepcopy(g).devices() == {"a": "meta"}


def test_the_drawings_of_a_plan_show_each_placed_nodes_device() -> None:
    g = soma.Graph.somatize(soma.native.Identity().named("a") >> soma.native.Identity().named("b"))
    g.place("b", "cuda:1")
    plan = g.plan()
    assert str(plan) == "Sequence\n├── a <- (input)\n└── b <- a @ cuda:1"
    assert 'b["b @ cuda:1"]' in plan.to_mermaid()
    assert '"b" [label="b @ cuda:1"];' in plan.to_dot()
    assert 'a["a"]' in plan.to_mermaid()
    assert ">b @ cuda:1</text>" in plan.to_svg()
    assert plan._repr_svg_() == plan.to_svg()


def test_the_drawing_of_a_graph_shows_each_placed_nodes_device_and_the_others_bare() -> None:
    g = soma.Graph.somatize(soma.native.Identity().named("a") >> soma.native.Identity().named("b"))
    g.place("b", "cuda:1")
    drawn = g.to_svg()
    assert ">b @ cuda:1</text>" in drawn
    assert ">a</text>" in drawn
    assert g._repr_svg_() == drawn
    g.place("b", None)
    assert "@" not in g.to_svg(), "unplacing a node takes its device off the drawing"


def test_a_trace_records_each_nodes_device(recorder: Recorder) -> None:
    g = soma.Graph.somatize(Where(recorder).named("a").on("cuda:1") >> Where(recorder).named("b"))
    trace = soma.Trace()
    g.forward(None, trace=trace)
    assert {span.node: span.device for span in trace.spans} == {"a": "cuda:1", "b": None}


# ---------------------------------------------------------------------------------------------
# The current device while a placed node runs, and after


def test_on_a_chain_each_placed_node_runs_on_its_device_and_the_others_on_the_threads(
    recorder: Recorder,
) -> None:
    g = soma.Graph.somatize(
        Where(recorder).named("a").on("cuda:1")
        >> Where(recorder).named("b")
        >> Where(recorder).named("c").on("cuda:2")
    )
    seen = g.forward(None)
    assert {node: seen[node][:2] for node in "abc"} == {
        "a": ("cuda:1", "cuda:1"),
        "b": (None, "cuda:0"),
        "c": ("cuda:2", "cuda:2"),
    }
    assert recorder.current("cuda") == "cuda:0", "the caller's device is put back"


def test_the_callers_own_current_device_is_what_its_unplaced_nodes_see_and_is_put_back(
    recorder: Recorder,
) -> None:
    recorder.set("cuda:3")
    g = soma.Graph.somatize(Where(recorder).named("a").on("cuda:1") >> Where(recorder).named("b"))
    seen = g.forward(None)
    assert seen["b"][1] == "cuda:3"
    assert recorder.current("cuda") == "cuda:3"


def test_the_branches_of_a_wave_each_run_on_their_device_on_their_own_threads(
    recorder: Recorder,
) -> None:
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Where(recorder, barrier).named("a").on("cuda:1")
        | Where(recorder, barrier).named("b").on("cuda:2")
    )
    out = merged(g.forward(None))
    assert out["a"][2] != out["b"][2], "on two threads"
    assert (out["a"][1], out["b"][1]) == ("cuda:1", "cuda:2")
    assert recorder.current("cuda") == "cuda:0"


def test_a_thread_lent_again_has_its_own_device_back_not_the_last_branchs(
    recorder: Recorder,
) -> None:
    # `b` (on a crew thread) is placed; the unplaced `c` after it in its branch, and in every
    # later run, sees that thread's own device.
    barrier = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        Where(recorder, barrier).named("a")
        | (Where(recorder, barrier).named("b").on("cuda:5") >> Where(recorder).named("c"))
    )
    threads = set()
    for _ in range(3):
        out = merged(g.forward(None))
        assert out["b"][1] == "cuda:5"
        assert out["c"][1] == "cuda:0"
        assert out["b"][2] == out["c"][2] != threading.get_ident()
        threads.add(out["c"][2])
    assert len(threads) == 1, "one crew thread was lent every time"
    puts_back = [device for thread, device in recorder.sets if thread in threads]
    assert puts_back == ["cuda:5", "cuda:0"] * 3


def test_nested_waves_set_and_put_back_each_placed_nodes_device(recorder: Recorder) -> None:
    inner = threading.Barrier(2, timeout=DEADLINE)
    g = soma.Graph.somatize(
        (
            Where(recorder).named("a").on("cuda:1")
            >> (
                Where(recorder, inner).named("c").on("cuda:2")
                | (Where(recorder, inner).named("d") >> Where(recorder).named("e").on("cuda:3"))
            )
        )
        | Where(recorder).named("b")
    )
    out = merged(g.forward(None))
    assert out["c"][2] != out["d"][2], "the inner branches ran on two threads"
    assert {node: out[node][1] for node in "abcde"} == {
        "a": "cuda:1",
        "b": "cuda:0",
        "c": "cuda:2",
        "d": "cuda:0",
        "e": "cuda:3",
    }
    assert recorder.current("cuda") == "cuda:0"


def test_the_n_shape_sets_and_puts_back_each_placed_nodes_device(recorder: Recorder) -> None:
    # a -> c, b -> c, b -> d: not series-parallel, walked in a valid order.
    g = soma.Graph()
    for node_id in "abcd":
        g.node(node_id, Where(recorder))
    for source, target in [("a", "c"), ("b", "c"), ("b", "d")]:
        g.edge(source, target)
    g.place("a", "cuda:1")
    g.place("c", "cuda:2")
    out = merged(g.forward(None))
    assert {node: out[node][1] for node in "abcd"} == {
        "a": "cuda:1",
        "b": "cuda:0",
        "c": "cuda:2",
        "d": "cuda:0",
    }
    assert recorder.current("cuda") == "cuda:0"


def test_a_placed_node_that_raises_still_puts_its_threads_device_back(recorder: Recorder) -> None:
    g = soma.Graph.somatize(Where(recorder, raises=KeyError("x")).named("a").on("cuda:4"))
    with pytest.raises(KeyError):
        g.forward(None)
    assert recorder.sets == [(threading.get_ident(), "cuda:4"), (threading.get_ident(), "cuda:0")]
    assert recorder.current("cuda") == "cuda:0"


def test_a_device_no_backend_serves_is_passed_on_and_set_nowhere(recorder: Recorder) -> None:
    g = soma.Graph.somatize(Where(recorder).named("a").on("meta"))
    assert g.forward(None)["a"][:2] == ("meta", "cuda:0")
    assert recorder.sets == []


def test_an_object_without_the_hooks_is_refused_as_a_backend() -> None:
    with pytest.raises(TypeError, match="not a device backend"):
        soma.devices.register(object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Where a placed node's output lives


class OnDevice:
    """A value that says where it lives, as a tensor does."""

    def __init__(self, device: str) -> None:
        self.device = device


class Returns(soma.Node):
    def __init__(self, value: Any) -> None:
        self.value = value

    def forward(self, x: Any) -> Any:
        return self.value


@pytest.mark.parametrize(
    ("value", "at"),
    [
        (OnDevice("cpu"), ""),
        ((OnDevice("cuda:1"), OnDevice("cpu")), " (at `[1]`)"),
        ([OnDevice("cpu")], " (at `[0]`)"),
        ({"logits": OnDevice("cpu")}, " (at `['logits']`)"),
    ],
)
def test_a_placed_node_whose_output_lives_elsewhere_fails_with_a_named_error(
    value: Any, at: str
) -> None:
    g = soma.Graph.somatize(Returns(value).named("head").on("cuda:1"))
    with pytest.raises(soma.WrongDeviceError) as failed:
        g.forward(None)
    error = failed.value
    assert (error.node, error.declared, error.found) == ("head", "cuda:1", "cpu")
    what = f"an output{at}" if at else "its output"
    assert str(error).startswith(f"node `head` is placed on `cuda:1`, but {what} is on `cpu`\n")
    assert 'g.place("head", "cpu")' in str(error)


@pytest.mark.parametrize(
    ("placed", "value"),
    [
        ("cuda:1", OnDevice("cuda:1")),
        ("mps", OnDevice("mps:0")),
        ("cuda:1", 3),
        ("cuda:1", OnDevice("somewhere odd")),
        ("cuda:1", ({"nested": OnDevice("cpu")},)),
    ],
)
def test_an_output_on_the_device_or_that_does_not_say_where_passes(placed: str, value: Any) -> None:
    g = soma.Graph.somatize(Returns(value).named("head").on(placed))
    assert g.forward(None) is value


def test_an_unplaced_nodes_output_is_not_checked() -> None:
    value = OnDevice("cpu")
    assert soma.Graph.somatize(Returns(value)).forward(None) is value


def test_ctx_device_is_none_for_an_unplaced_node(recorder: Recorder) -> None:
    assert soma.Graph.somatize(Where(recorder).named("a")).forward(None)["a"][0] is None
