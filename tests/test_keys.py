"""What a cache key covers: a hit is always the answer the node would have computed.

Every value a key is taken of is keyed by its whole content and type, or has no key (its node
runs uncached, with one warning); every piece of code a node runs — its class, the callables it
holds, and the functions, classes and module-level values of the user's own code it reaches by
name — is in its key. The guide's "What a key covers" says the same, sentence by sentence.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import importlib
import importlib.util
import io
import itertools
import logging
import pickle
import struct
import subprocess
import sys
import textwrap
import threading
import types
import typing
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import soma
from conftest import SUBPROCESS_DEADLINE, CallRecord, Fn
from soma.cache import _fingerprint

CALLS = CallRecord()


def calls(graph: soma.Graph, x: Any, cache: soma.Cache) -> tuple[Any, list[str]]:
    """The result of a cached forward, and the nodes it called."""
    CALLS.clear()
    result = graph.forward(x, cache=cache)
    return result, list(CALLS)


@pytest.fixture(params=["memory", "folder"])
def cache(request: pytest.FixtureRequest, tmp_path: Path) -> soma.Cache:
    return soma.Cache() if request.param == "memory" else soma.Cache(tmp_path / "cache")


def digest(value: object) -> bytes:
    return _fingerprint.digest(value)


def fingerprint(node: object) -> bytes:
    return _fingerprint.fingerprint(node)


# ---------------------------------------------------------------------------------------------
# A hit is the answer: values by their whole content and type


P = collections.namedtuple("P", "a b")


class Typed(typing.NamedTuple):
    a: int
    b: int


class Sum(soma.Node):
    def forward(self, p: Any) -> Any:
        CALLS.append("sum")
        return p.a + p.b


def test_a_namedtuple_is_keyed_by_its_fields_so_another_one_is_never_a_stale_hit(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Sum())
    assert calls(g, P(1, 2), cache) == (3, ["sum"])
    assert calls(g, P(30, 40), cache) == (70, ["sum"])
    assert calls(g, Typed(5, 6), cache) == (11, ["sum"])
    assert calls(g, P(1, 2), cache) == (3, [])


class MakeP(soma.Node):
    def forward(self, x: int) -> P:
        CALLS.append("make")
        return P(x, x)


def test_a_node_returning_a_namedtuple_leaves_its_reader_keyed_on_its_fields(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(MakeP() >> Sum())
    assert calls(g, 1, cache) == (2, ["make", "sum"])
    assert calls(g, 20, cache) == (40, ["make", "sum"])


class MyInt(int):
    pass


class MyStr(str):
    pass


class MyList(list[Any]):
    pass


class MyDict(dict[str, Any]):
    pass


def test_a_subclass_of_a_builtin_is_keyed_by_its_content_its_class_and_its_instance_state() -> None:
    assert digest(MyInt(1)) != digest(MyInt(2))
    assert digest(MyInt(1)) != digest(1)
    assert digest(MyStr("a")) != digest(MyStr("b"))
    assert digest(MyStr("a")) != digest("a")
    assert digest(MyList([1])) != digest(MyList([2]))
    assert digest(MyList([1])) != digest([1])
    assert digest(MyDict(a=1)) != digest(MyDict(a=2))
    tagged, other = MyList([1]), MyList([1])
    tagged.unit = "m"  # type: ignore[attr-defined]
    other.unit = "s"  # type: ignore[attr-defined]
    assert digest(tagged) != digest(other)
    assert digest(MyInt(7)) == digest(MyInt(7))


def test_an_ordered_dict_is_keyed_in_its_order_and_a_dict_in_its_own() -> None:
    first = collections.OrderedDict(a=1, b=2)
    moved = collections.OrderedDict(a=1, b=2)
    moved.move_to_end("a")
    assert digest(first) != digest(moved)
    assert digest({"a": 1, "b": 2}) != digest({"b": 2, "a": 1})
    assert digest(first) != digest({"a": 1, "b": 2})
    assert digest(collections.defaultdict(int, a=1)) != digest(collections.defaultdict(list, a=1))


def test_sets_are_keyed_regardless_of_order_and_apart_from_frozensets() -> None:
    assert digest({3, 1, 2}) == digest({1, 2, 3})
    assert digest({"x", "y"}) != digest(frozenset({"x", "y"}))
    assert digest({1, 2}) != digest({1, 3})


@dataclasses.dataclass
class Point:
    x: float
    y: float


class Color(enum.Enum):
    RED = 1
    GREEN = 2


def test_dataclasses_enums_arrays_and_pickled_objects_are_keyed_by_their_content() -> None:
    assert digest(Point(1.0, 2.0)) == digest(Point(1.0, 2.0))
    assert digest(Point(1.0, 2.0)) != digest(Point(2.0, 1.0))
    assert digest(Color.RED) != digest(Color.GREEN)
    assert digest(array.array("i", [1, 2])) != digest(array.array("i", [1, 3]))
    assert digest(array.array("i", [1, 2])) != digest(array.array("l", [1, 2]))
    assert digest(decimal.Decimal("1.0")) != digest(decimal.Decimal("1.00"))
    assert digest(fractions.Fraction(1, 3)) != digest(fractions.Fraction(2, 3))
    day = datetime.datetime(2026, 1, 2, 3, 4, 5)
    assert digest(day) != digest(day.replace(tzinfo=datetime.UTC))


def test_an_int_of_any_size_is_keyed_and_a_cached_run_on_one_neither_fails_nor_reports(
    cache: soma.Cache,
) -> None:
    big = 7**6000  # Past the 4,300 digits `str(int)` refuses.
    assert digest(big) != digest(big + 1)
    g = soma.Graph.somatize(Fn(lambda x: x % 1000).named("tail"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Nor any unraisable report, which pytest turns into one.
        assert g.forward(big, cache=cache) == big % 1000
        assert g.forward(big, cache=cache) == big % 1000
    assert cache.stats().hits == 1


def test_numpy_arrays_are_keyed_by_dtype_shape_and_bytes_of_every_kind() -> None:
    values = [
        np.arange(4, dtype=np.int64),
        np.arange(4, dtype=np.int32),
        np.arange(4, dtype=">i8"),
        np.array([1, 2], dtype="datetime64[D]"),
        np.array([1, 2], dtype="datetime64[s]"),
        np.array([1 + 2j, 3]),
        np.array([True, False]),
        np.array(["ab", "c"]),
        np.array([b"ab", b"c"]),
        np.array(["ab", "c"], dtype=np.dtypes.StringDType()),
        np.array(["ab", "cd"], dtype=np.dtypes.StringDType()),
        np.array([1, "x"], dtype=object),
        np.arange(4).reshape(2, 2),
    ]
    digests = {digest(value) for value in values}
    assert len(digests) == len(values)
    assert digest(np.array(["ab", "c"], dtype=np.dtypes.StringDType())) == digest(
        np.array(["ab", "c"], dtype=np.dtypes.StringDType())
    )


def test_a_structured_array_is_keyed_by_its_fields_names_and_types() -> None:
    plain = np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")])
    renamed = np.zeros(2, dtype=[("x", "<i4"), ("b", "<f8")])
    retyped = np.zeros(2, dtype=[("a", "<f4"), ("b", "<f8")])
    assert len({digest(plain), digest(renamed), digest(retyped)}) == 3
    assert digest(plain) == digest(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8")]))


def test_a_masked_array_is_keyed_by_its_mask_and_fill_value_too() -> None:
    data = [1.0, 2.0, 3.0]
    assert digest(np.ma.array(data, mask=[0, 1, 0])) != digest(np.ma.array(data, mask=[1, 0, 0]))
    assert digest(np.ma.array(data, mask=[0, 1, 0])) != digest(np.array(data))
    filled = np.ma.array(data, mask=[0, 1, 0], fill_value=-1.0)
    assert digest(np.ma.array(data, mask=[0, 1, 0])) != digest(filled)
    assert digest(np.ma.array(data, mask=[0, 1, 0])) == digest(np.ma.array(data, mask=[0, 1, 0]))


def test_pandas_frames_series_and_indexes_are_keyed_by_values_dtypes_index_and_columns() -> None:
    frame = pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})
    same = pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})
    others = [
        pd.DataFrame({"a": [1, 3], "b": [0.5, 1.5]}),  # values
        pd.DataFrame({"a": [1.0, 2.0], "b": [0.5, 1.5]}),  # dtypes
        pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]}, index=[10, 11]),  # index
        pd.DataFrame({"a": [1, 2], "c": [0.5, 1.5]}),  # columns
        pd.DataFrame({"b": [0.5, 1.5], "a": [1, 2]}),  # their order
    ]
    assert digest(frame) == digest(same)
    assert len({digest(frame), *map(digest, others)}) == len(others) + 1
    series = pd.Series(["x", "y"], name="s")
    assert digest(series) == digest(pd.Series(["x", "y"], name="s"))
    assert digest(series) != digest(pd.Series(["x", "y"], name="t"))
    assert digest(series) != digest(pd.Series(["x", "z"], name="s"))
    assert digest(pd.Index([1, 2])) != digest(pd.Index([1, 2], name="i"))
    assert digest(pd.Categorical(["a", "b"])) != digest(pd.Categorical(["b", "a"]))


class Recipe:
    """An object that says what pickle keeps of it: its content, the cache dropped."""

    def __init__(self, steps: list[str]) -> None:
        self.steps = steps
        self.memo: dict[str, int] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (Recipe, (self.steps,))


def test_an_object_is_keyed_by_what_pickle_keeps_of_it() -> None:
    recipe = Recipe(["boil"])
    before = digest(recipe)
    recipe.memo["boil"] = 1
    assert digest(recipe) == before
    recipe.steps.append("salt")
    assert digest(recipe) != before


class Reading:
    def __init__(self, value: float) -> None:
        self.value = value

    def shown(self) -> str:
        return f"{self.value:.1f}"


class Reads(soma.Node):
    def forward(self, x: float) -> Reading:
        return Reading(x)


class Shows(soma.Node):
    def forward(self, reading: Reading) -> str:
        CALLS.append("shows")
        return reading.shown()  # A method of its input's class: no name its own code reaches.


def test_a_value_of_a_class_of_the_users_is_keyed_by_its_class_code_so_its_reader_sees_an_edit(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Reads() >> Shows())
    assert calls(g, 2.0, cache) == ("2.0", ["shows"])
    original = Reading.shown
    Reading.shown = lambda self: f"{self.value:.3f}"  # type: ignore[method-assign]
    try:
        assert calls(g, 2.0, cache) == ("2.000", ["shows"])
    finally:
        Reading.shown = original  # type: ignore[method-assign]
    assert calls(g, 2.0, cache) == ("2.0", [])


# ---------------------------------------------------------------------------------------------
# Values with no key: the node runs uncached, said once


class Holder:
    def __init__(self) -> None:
        self.pending = (i for i in range(3))  # A generator has no content to digest.


def test_an_input_with_no_key_runs_its_readers_uncached_with_one_warning_naming_node_and_type(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(Fn(lambda h: type(h).__name__).named("reader"))
    held = Holder()
    with pytest.warns(
        soma.CacheWarning, match=r"node `reader` runs uncached.*`builtins.generator`"
    ):
        assert g.forward(held, cache=cache) == "Holder"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Said once.
        assert g.forward(held, cache=cache) == "Holder"
    assert cache.stats().hits == 0


class Unreadable:
    def __reduce_ex__(self, protocol: Any) -> Any:
        raise RuntimeError("no state to give")


def test_a_value_whose_pickling_raises_has_no_key_and_fails_no_run(cache: soma.Cache) -> None:
    with pytest.raises(_fingerprint.Unkeyable, match="Unreadable"):
        digest(Unreadable())
    g = soma.Graph.somatize(Fn(lambda u: 1).named("one"))
    with pytest.warns(soma.CacheWarning, match="node `one` runs uncached"):
        assert g.forward(Unreadable(), cache=cache) == 1


class InItsOwnSet:
    def __init__(self) -> None:
        self.members = {self}


def test_a_value_held_in_a_set_it_holds_has_no_key() -> None:
    with pytest.raises(_fingerprint.Unkeyable, match="holds itself"):
        digest(InItsOwnSet())


# ---------------------------------------------------------------------------------------------
# The code a node runs


def scaler(k: int) -> Callable[[int], int]:
    def scale(x: int) -> int:
        return x * k

    return scale


class Holds(soma.Node):
    """Calls what it holds."""

    def __init__(self, f: Callable[[Any], Any]) -> None:
        self.f = f

    def forward(self, x: Any) -> Any:
        CALLS.append("holds")
        return self.f(x)


def test_a_closure_rebound_to_other_cells_runs_the_node_again(cache: soma.Cache) -> None:
    node = Holds(scaler(2))
    g = soma.Graph.somatize(node)
    assert calls(g, 5, cache) == (10, ["holds"])
    node.f = scaler(3)
    assert calls(g, 5, cache) == (15, ["holds"])
    node.f = scaler(2)
    assert calls(g, 5, cache) == (10, [])


def test_a_closure_cell_changed_in_place_is_seen() -> None:
    k = 2

    def scale(x: int) -> int:
        return x * k

    node = Holds(scale)
    before = fingerprint(node)
    k = 3
    assert scale(1) == 3
    assert fingerprint(node) != before


def add(x: int, k: int = 1, *, also: int = 0) -> int:
    return x + k + also


class Adder:
    def __init__(self, k: int) -> None:
        self.k = k

    def add(self, x: int) -> int:
        return x + self.k


def test_defaults_keyword_defaults_partial_arguments_and_a_bound_object_are_in_the_key() -> None:
    def with_default(k: int) -> Callable[[int], int]:
        def f(x: int, k: int = k) -> int:
            return x + k

        return f

    assert fingerprint(Holds(with_default(1))) != fingerprint(Holds(with_default(2)))
    assert fingerprint(Holds(functools.partial(add, k=1))) != fingerprint(
        Holds(functools.partial(add, k=2))
    )
    assert fingerprint(Holds(functools.partial(add, also=1))) != fingerprint(
        Holds(functools.partial(add, also=2))
    )
    assert fingerprint(Holds(Adder(1).add)) != fingerprint(Holds(Adder(2).add))
    assert fingerprint(Holds(Adder(1).add)) == fingerprint(Holds(Adder(1).add))
    # A function's defaults set again, as a module reloaded in place would.
    node = Holds(add)
    before = fingerprint(node)
    add.__kwdefaults__ = {"also": 5}
    try:
        assert fingerprint(node) != before
    finally:
        add.__kwdefaults__ = {"also": 0}
    assert fingerprint(node) == before


def test_a_switch_selector_and_a_loop_predicate_that_are_closures_are_in_their_key(
    cache: soma.Cache,
) -> None:
    def parity(offset: int) -> Callable[[int], str]:
        return lambda x: "even" if (x + offset) % 2 == 0 else "odd"

    def cases() -> dict[str, Any]:
        return {"even": Fn(lambda x: "E").named("e"), "odd": Fn(lambda x: "O").named("o")}

    first = soma.Graph.somatize(soma.switch(parity(0), cases()).named("route"))
    second = soma.Graph.somatize(soma.switch(parity(1), cases()).named("route"))
    assert first.forward(2, cache=cache) == "E"
    assert second.forward(2, cache=cache) == "O"

    def reaches(limit: int) -> Callable[[int], bool]:
        return lambda x: x >= limit

    for limit, expected in ((4, 4), (8, 8)):
        g = soma.Graph.somatize(
            soma.loop(Fn(lambda x: x * 2).named("twice"), until=reaches(limit), max_iterations=9)
        )
        assert g.forward(1, cache=cache) == expected


class Base(soma.Node):
    def step(self, x: int) -> int:
        return x + 1

    def forward(self, x: int) -> int:
        CALLS.append("child")
        return self.step(x)


class Child(Base):
    pass


def test_a_method_of_a_base_class_edited_runs_the_node_again(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(Child())
    assert calls(g, 1, cache) == (2, ["child"])
    original = Base.step
    Base.step = lambda self, x: x + 100  # type: ignore[method-assign]
    try:
        assert calls(g, 1, cache) == (101, ["child"])
    finally:
        Base.step = original  # type: ignore[method-assign]
    assert calls(g, 1, cache) == (2, [])


def notebook_cell(version: int, body: str) -> Any:
    """A class as a notebook cell defines it: by `exec`, with no source file to read."""
    scope: dict[str, Any] = {"soma": soma, "__name__": "__main__"}
    source = f"""
class Model(soma.Node):
    version = {version}

    def forward(self, x):
        return {body}
"""
    exec(compile(source, "<ipython-input-1>", "exec"), scope)
    return scope["Model"]()


def test_a_class_defined_by_exec_is_keyed_by_its_code_and_its_attributes(cache: soma.Cache) -> None:
    assert fingerprint(notebook_cell(1, "x + 1")) == fingerprint(notebook_cell(1, "x + 1"))
    assert fingerprint(notebook_cell(1, "x + 1")) != fingerprint(notebook_cell(1, "x + 2"))
    # The documented fix for a change the key cannot see: an attribute such as `version = 2`.
    assert fingerprint(notebook_cell(1, "x + 1")) != fingerprint(notebook_cell(2, "x + 1"))
    g = soma.Graph.somatize(notebook_cell(1, "x * 10").named("model"))
    assert g.forward(3, cache=cache) == 30
    g = soma.Graph.somatize(notebook_cell(1, "x * 20").named("model"))
    assert g.forward(3, cache=cache) == 60


def test_a_class_made_by_exec_in_a_namespace_of_its_own_is_the_users() -> None:
    def made(body: str) -> object:
        scope: dict[str, Any] = {"soma": soma}  # No `__name__`: its classes say `builtins`.
        exec(f"class Typed(soma.Node):\n    def forward(self, x):\n        return {body}", scope)
        return scope["Typed"]()

    assert fingerprint(made("x + 1")) == fingerprint(made("x + 1"))
    assert fingerprint(made("x + 1")) != fingerprint(made("x + 2"))


# ---------------------------------------------------------------------------------------------
# The user's own code, reached by name, in this process and the next


_HELPERS_V1 = """
import math

SCALE = 2


def double(x):
    return x * SCALE


def root(x):
    return math.sqrt(double(x))
"""

_NODES = """
import soma
import helpers_here
from helpers_there import tidy
from conftest import CallRecord

CALLS = CallRecord()
OFFSET = 1


def local(x):
    return x + OFFSET


class Uses(soma.Node):
    def forward(self, x):
        CALLS.append("uses")
        return tidy(local(helpers_here.double(x)))
"""

_THERE_V1 = """
from helpers_here import root


def tidy(x):
    return round(root(x) * 1000)
"""


def _write(folder: Path, **files: str) -> None:
    for name, source in files.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """A folder of the user's modules, and a function importing them afresh."""
    _write(tmp_path, helpers_here=_HELPERS_V1, helpers_there=_THERE_V1, uses_nodes=_NODES)
    names = ("helpers_here", "helpers_there", "uses_nodes")
    sys.path.insert(0, str(tmp_path))

    def fresh() -> Any:
        for name in names:
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return importlib.import_module("uses_nodes")

    try:
        yield fresh
    finally:
        sys.path.remove(str(tmp_path))
        for name in names:
            sys.modules.pop(name, None)


def test_a_helper_a_helper_calls_in_another_module_is_in_the_key(
    project: Callable[[], Any], tmp_path: Path
) -> None:
    before = fingerprint(project().Uses())
    assert fingerprint(project().Uses()) == before
    _write(tmp_path, helpers_here=_HELPERS_V1.replace("math.sqrt(", "math.cbrt("))
    assert fingerprint(project().Uses()) != before


def test_a_module_level_constant_a_helper_reads_is_in_the_key(
    project: Callable[[], Any], tmp_path: Path
) -> None:
    before = fingerprint(project().Uses())
    _write(tmp_path, helpers_here=_HELPERS_V1.replace("SCALE = 2", "SCALE = 3"))
    assert fingerprint(project().Uses()) != before


def test_a_global_rebound_in_this_process_runs_the_node_again(
    project: Callable[[], Any], cache: soma.Cache
) -> None:
    nodes = project()
    g = soma.Graph.somatize(nodes.Uses().named("uses"))
    first = g.forward(8, cache=cache)
    nodes.OFFSET = 100  # As a notebook cell run again would.
    assert g.forward(8, cache=cache) == g.forward(8) != first
    sys.modules["helpers_here"].SCALE = 5
    assert g.forward(8, cache=cache) == g.forward(8)


def test_a_function_whose_code_is_patched_in_place_runs_the_node_again(
    project: Callable[[], Any], cache: soma.Cache
) -> None:
    nodes = project()
    g = soma.Graph.somatize(nodes.Uses().named("uses"))
    first = g.forward(2, cache=cache)
    helpers = sys.modules["helpers_here"]
    helpers.double.__code__ = (lambda x: x * 8).__code__  # As an autoreloader does.
    assert g.forward(2, cache=cache) == g.forward(2) != first


def test_an_attribute_set_on_a_helper_function_after_a_run_changes_the_key(
    project: Callable[[], Any],
) -> None:
    node = project().Uses()
    before = fingerprint(node)
    witness = _fingerprint._REMEMBERED[id(node)].witness
    assert witness.current() is not None  # Remembered, and checked: nothing changed.
    sys.modules["helpers_here"].double.tuned = 3
    assert witness.current() is None  # The helper's namespace grew.
    after = fingerprint(node)
    assert after != before
    assert fingerprint(node) == after


_RUN = """
import sys
sys.path[:0] = [{folder!r}, {tests!r}]
import soma
import uses_nodes
g = soma.Graph.somatize(uses_nodes.Uses().named("uses"))
print(g.forward(8, cache=soma.Cache({cache!r})), list(uses_nodes.CALLS))
"""


def test_a_helper_edited_in_another_module_between_two_processes_runs_the_node_again(
    tmp_path: Path,
) -> None:
    _write(tmp_path, helpers_here=_HELPERS_V1, helpers_there=_THERE_V1, uses_nodes=_NODES)
    script = _RUN.format(
        folder=str(tmp_path), tests=str(Path(__file__).parent), cache=str(tmp_path / "cache")
    )

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=SUBPROCESS_DEADLINE,
            check=True,
        )
        return done.stdout.strip()

    # round(sqrt(2 * (8 * 2 + 1)) * 1000), then * 10 after the edit, then with SCALE = 8.
    assert run() == "5831 ['uses']"
    assert run() == "5831 []"
    _write(tmp_path, helpers_there=_THERE_V1.replace("* 1000", "* 10"))
    assert run() == "58 ['uses']"
    _write(tmp_path, helpers_here=_HELPERS_V1.replace("SCALE = 2", "SCALE = 8"))
    assert run() == "228 ['uses']"
    assert run() == "228 []"


def test_a_method_moved_down_its_file_with_a_comment_above_keeps_its_key(
    project: Callable[[], Any], tmp_path: Path
) -> None:
    before = fingerprint(project().Uses())
    moved = _HELPERS_V1.replace("import math\n", "import math\n\n# Helpers.\n\n\n")
    _write(tmp_path, helpers_here=moved)
    assert fingerprint(project().Uses()) == before


SETTINGS = {"scale": 2}


def scaled(x: int) -> int:
    return x * SETTINGS["scale"]


def test_a_module_level_dict_changed_in_place_is_seen_on_the_next_run(cache: soma.Cache) -> None:
    g = soma.Graph.somatize(Holds(scaled).named("scaled"))
    assert calls(g, 5, cache) == (10, ["holds"])
    SETTINGS["scale"] = 3
    try:
        assert calls(g, 5, cache) == (15, ["holds"])
    finally:
        SETTINGS["scale"] = 2
    assert calls(g, 5, cache) == (10, [])


def nested(depth: int, leaf: int) -> Any:
    value: Any = (leaf,)
    for _ in range(depth):
        value = (value,)
    return value


DEEP = nested(5_000, 1)


def deepest(x: Any) -> Any:
    return DEEP if x else None


def test_a_constant_nested_deeper_than_any_code_makes_is_keyed_and_its_change_seen() -> None:
    global DEEP
    node = Holds(deepest)
    before = fingerprint(node)
    DEEP = nested(5_000, 2)
    try:
        assert fingerprint(node) != before
    finally:
        DEEP = nested(5_000, 1)
    assert fingerprint(node) == before


model = [1.0, 2.0]  # A module-level name a node's attribute shares, which it never reads.


class Weighs(soma.Node):
    def __init__(self) -> None:
        self.model = 3.0

    def forward(self, x: float) -> float:
        return x * self.model


def test_an_attribute_of_the_same_name_as_a_global_does_not_make_the_key_read_the_global() -> None:
    node = Weighs()
    before = fingerprint(node)
    model.append(3.0)
    try:
        assert fingerprint(node) == before
    finally:
        model.pop()


_LOCKED = """
import soma

PENDING = (i for i in range(3))


class Guard(soma.Node):
    def forward(self, x):
        return x + 1 if PENDING else x
"""


def test_what_its_code_reads_with_no_key_runs_the_node_uncached_naming_the_path_to_it(
    tmp_path: Path, cache: soma.Cache
) -> None:
    _write(tmp_path, locked_nodes=_LOCKED)
    sys.path.insert(0, str(tmp_path))
    try:
        nodes = importlib.import_module("locked_nodes")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("locked_nodes", None)
    g = soma.Graph.somatize(nodes.Guard())
    where = "locked_nodes.Guard.forward > locked_nodes.PENDING"
    with pytest.warns(soma.CacheWarning, match=f"node `guard` runs uncached: .*`{where}`"):
        assert g.forward(1, cache=cache) == 2


def test_a_class_made_by_exec_from_a_file_of_the_users_is_the_users_whatever_its_module() -> None:
    # As a docs runner or `python -m` makes it: `__name__` is a library module's.
    def made(body: str) -> object:
        scope: dict[str, Any] = {"soma": soma, "__name__": "json"}
        source = f"class Typed(soma.Node):\n    def forward(self, x):\n        return {body}"
        exec(compile(source, __file__, "exec"), scope)
        return scope["Typed"]()

    assert fingerprint(made("x + 1")) != fingerprint(made("x + 2"))


# ---------------------------------------------------------------------------------------------
# What a key does not cover


def test_the_code_of_an_installed_library_is_keyed_by_its_name_not_its_code() -> None:
    node = Holds(textwrap.dedent)
    before = fingerprint(node)
    original = textwrap.dedent.__code__
    textwrap.dedent.__code__ = textwrap.fill.__code__  # As an upgrade of the library would.
    try:
        assert fingerprint(node) == before
    finally:
        textwrap.dedent.__code__ = original


def test_every_file_of_somas_own_package_is_a_librarys_not_the_users() -> None:
    # Soma's code is keyed by name like any library's, in every subpackage, not only the one
    # that tells a library's file from the user's (`soma.cache`).
    package = Path(soma.__file__).parent
    files = sorted(package.rglob("*.py"))
    assert {file.parent.name for file in files} >= {"soma", "_build", "_run", "cache", "remote"}
    assert [str(file) for file in files if _fingerprint._users_file(str(file))] == []


SHIFT = 1


class ByString(soma.Node):
    def forward(self, x: int) -> int:
        return x + getattr(sys.modules[__name__], "SH" + "IFT")  # type: ignore[no-any-return]


class ByGlobals(soma.Node):
    def forward(self, x: int) -> int:
        return x + globals()["SH" + "IFT"]  # type: ignore[no-any-return]


class ByImport(soma.Node):
    def __init__(self, module: str) -> None:
        self.module = module

    def forward(self, text: str) -> str:
        return importlib.import_module(self.module).dedent(text)  # type: ignore[no-any-return]


def test_a_name_looked_up_by_a_string_built_at_run_time_is_not_followed(
    project: Callable[[], Any], tmp_path: Path
) -> None:
    global SHIFT
    nodes = [ByString(), ByGlobals()]
    before = [fingerprint(node) for node in nodes]
    SHIFT = 2
    try:
        assert [fingerprint(node) for node in nodes] == before
    finally:
        SHIFT = 1
    project()
    imports = ByImport("helpers_here")
    before_import = fingerprint(imports)
    _write(tmp_path, helpers_here=_HELPERS_V1 + "\n\ndef dedent(text):\n    return text\n")
    project()
    assert fingerprint(imports) == before_import
    holds = Holds(lambda x: x)
    holds.helpers = sys.modules["helpers_here"]  # type: ignore[attr-defined]
    before_held = fingerprint(holds)
    holds.helpers.SCALE = 10  # type: ignore[attr-defined]
    assert fingerprint(holds) == before_held  # A module held is keyed by its name.


class Opens(soma.Node):
    def forward(self, path: str) -> str:
        return Path(path).read_text()


def test_a_file_a_node_opens_by_its_path_is_not_in_its_key(
    tmp_path: Path, cache: soma.Cache
) -> None:
    data = tmp_path / "data.txt"
    data.write_text("old")
    g = soma.Graph.somatize(Opens())
    assert g.forward(str(data), cache=cache) == "old"
    data.write_text("new")
    assert g.forward(str(data), cache=cache) == "old"  # What the guide says it does not cover.


LOG: list[str] = []


class Logs(soma.Node):
    def forward(self, x: int) -> int:
        LOG.append("called")
        return x


class ReadsLog(soma.Node):
    def forward(self, x: int) -> int:
        LOG.append("called")
        return x + len(LOG)


def test_a_module_level_list_a_node_only_appends_to_is_not_part_of_its_key() -> None:
    node = Logs()
    before = fingerprint(node)
    LOG.append("called")
    assert fingerprint(node) == before
    LOG.clear()


def test_a_module_level_list_a_node_appends_to_and_reads_is_part_of_its_key() -> None:
    node = ReadsLog()
    before = fingerprint(node)
    LOG.append("called")
    try:
        assert fingerprint(node) != before
    finally:
        LOG.clear()
    assert fingerprint(node) == before


LOGGER = logging.getLogger("soma.tests.keys")


class LogsWell(soma.Node):
    def forward(self, x: int) -> int:
        LOGGER.info("called on %s", x)
        CALLS.append("logs")
        return x


def test_a_node_that_logs_with_logging_or_into_a_record_pickled_empty_keeps_its_key(
    cache: soma.Cache,
) -> None:
    g = soma.Graph.somatize(LogsWell())
    assert calls(g, 1, cache) == (1, ["logs"])
    assert calls(g, 1, cache) == (1, [])


class Counted(soma.Node):
    def forward(self, x: int) -> int:
        CALLS.append("counted")
        return x + 1


@pytest.mark.parametrize("where", ["node", "class", "library base"])
def test_cacheable_false_set_after_a_node_was_remembered_keeps_it_out_until_unset(
    cache: soma.Cache, where: str
) -> None:
    node = Counted()
    owner: Any = {"node": node, "class": Counted, "library base": soma.Node}[where]
    g = soma.Graph.somatize(node)
    calls(g, 1, cache)
    assert calls(g, 1, cache) == (2, [])
    owner.cacheable = False
    try:
        assert calls(g, 1, cache) == (2, ["counted"])
        assert calls(g, 1, cache) == (2, ["counted"])
    finally:
        del owner.cacheable
    assert calls(g, 1, cache) == (2, [])


TRIP = [False]  # When set, the next read of `Trips.k` raises, once, as Ctrl-C arriving would.


class Trips(soma.Node):
    __slots__ = ("k",)

    def __init__(self) -> None:
        self.k = 1

    def __getattribute__(self, name: str) -> Any:
        if name == "k" and TRIP[0]:
            TRIP[0] = False
            raise KeyboardInterrupt
        return super().__getattribute__(name)

    def forward(self, x: int) -> int:
        return x + self.k


def test_ctrl_c_met_while_a_remembered_key_is_checked_is_raised_not_taken_for_a_change(
    cache: soma.Cache,
) -> None:
    node = Trips()
    # A single node: no node boundary comes after its lookup, and Ctrl-C reaches the caller.
    g = soma.Graph.somatize(node)
    assert g.forward(1, cache=cache) == 2
    try:
        TRIP[0] = True
        with pytest.raises(KeyboardInterrupt):
            fingerprint(node)
        TRIP[0] = True
        with pytest.raises(KeyboardInterrupt):
            g.forward(1, cache=cache)
    finally:
        TRIP[0] = False
    assert g.forward(1, cache=cache) == 2
    assert cache.stats().hits >= 1


class FileTrips(types.ModuleType):
    """A module with no `__file__`, whose read of it raises, once, as Ctrl-C arriving there
    would (CPython 3.13 runs Python code to word the error for a missing module attribute)."""

    def __getattr__(self, name: str) -> Any:
        if name == "__file__" and TRIP[0]:
            TRIP[0] = False
            raise KeyboardInterrupt
        raise AttributeError(name)


NO_FILE = FileTrips("no_file")
NO_FILE.k = 3  # type: ignore[attr-defined]


def test_ctrl_c_met_while_reading_whether_a_module_is_the_users_is_raised_not_taken_for_no_file(
    cache: soma.Cache,
) -> None:
    # A class of its own for each run of the test: a class's code is followed once.
    class ReadsAModule(soma.Node):
        def forward(self, x: int) -> int:
            return x + NO_FILE.k  # type: ignore[attr-defined, no-any-return]

    try:
        TRIP[0] = True
        with pytest.raises(KeyboardInterrupt):
            fingerprint(ReadsAModule())
        TRIP[0] = True
        with pytest.raises(KeyboardInterrupt):
            soma.Graph.somatize(ReadsAModule()).forward(1, cache=cache)
    finally:
        TRIP[0] = False
    assert soma.Graph.somatize(ReadsAModule()).forward(1, cache=cache) == 4


# ---------------------------------------------------------------------------------------------
# The memory cache's bound


class Blob(soma.Node):
    def __init__(self, size: int) -> None:
        self.size = size

    def forward(self, x: int) -> bytes:
        return bytes(self.size)


def test_an_output_larger_than_a_memory_cache_bound_is_not_kept_and_evicts_nothing() -> None:
    cache = soma.Cache(max_bytes=4_000)
    small = soma.Graph.somatize(Blob(1_000).named("small"))
    small.forward(0, cache=cache)
    assert len(cache) == 1
    soma.Graph.somatize(Blob(10_000).named("large")).forward(0, cache=cache)
    assert (len(cache), cache.stats().evicted) == (1, 0)
    small.forward(0, cache=cache)
    assert cache.stats().hits == 1


# ---------------------------------------------------------------------------------------------
# Soma imports no optional library for a key


def test_keys_import_neither_numpy_pandas_nor_torch_unless_a_value_is_one() -> None:
    script = textwrap.dedent("""
        import sys
        import soma
        from soma.cache import _fingerprint

        class Add(soma.Node):
            def forward(self, x):
                return {"x": x, "items": [x, (x, 2.0)], "set": {1, 2}}

        g = soma.Graph.somatize(Add())
        cache = soma.Cache()
        g.forward(1, cache=cache)
        g.forward(1, cache=cache)
        _fingerprint.digest(object.__new__(type("Plain", (), {})))
        print(sorted(m for m in ("numpy", "pandas", "torch") if m in sys.modules))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
        check=True,
    )
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# The property: different content, different keys; equal content, the same key anywhere


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclasses.dataclass(frozen=True)
class Pair:
    left: Any
    right: Any


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _float(bits: bytes) -> float:
    return float(struct.unpack("<d", bits)[0])


# A spec describes a value so that two specs are equal exactly when the values they build have
# the same content and type; `build` makes the value afresh each time.
Spec = tuple[Any, ...]

_DTYPES = ["<i8", "<i4", ">i4", "<f8", "<f4", "|b1", "<c16", "<M8[s]", "<U3", "|S3"]


def _scalars() -> st.SearchStrategy[Spec]:
    return st.one_of(
        st.just(("none",)),
        st.booleans().map(lambda b: ("bool", b)),
        st.one_of(st.integers(), st.integers(min_value=2**64, max_value=2**200)).map(
            lambda i: ("int", i)
        ),
        st.floats(allow_nan=True, allow_infinity=True).map(lambda x: ("float", _bits(x))),
        st.text(max_size=6).map(lambda s: ("str", s)),
        st.binary(max_size=6).map(lambda b: ("bytes", b)),
        st.integers(-3, 3).map(lambda i: ("myint", i)),
        st.text(max_size=3).map(lambda s: ("mystr", s)),
        st.sampled_from(list(Mode)).map(lambda m: ("enum", m.name)),
        st.integers(-5, 5).map(lambda i: ("decimal", f"{i}.{abs(i)}0")),
        st.integers(0, 10**6).map(lambda s: ("datetime", s)),
    )


def _arrays() -> st.SearchStrategy[Spec]:
    def array_spec(dtype: str, length: int, data: bytes, shape: bool) -> Spec:
        return ("ndarray", dtype, length, data[: length * np.dtype(dtype).itemsize], shape)

    @st.composite
    def one(draw: st.DrawFn) -> Spec:
        dtype = draw(st.sampled_from(_DTYPES))
        length = draw(st.integers(0, 4))
        size = np.dtype(dtype).itemsize * length
        data = draw(st.binary(min_size=size, max_size=size))
        if dtype in ("<U3",):  # Only valid code points.
            data = np.array(
                draw(st.lists(st.text(max_size=3), min_size=length, max_size=length)), dtype=dtype
            ).tobytes()
        if dtype == "|b1":
            data = bytes(b % 2 for b in data)
        reshaped = length == 4 and draw(st.booleans())
        return array_spec(dtype, length, data, reshaped)

    @st.composite
    def masked(draw: st.DrawFn) -> Spec:
        length = draw(st.integers(1, 4))
        values = draw(st.lists(st.integers(-9, 9), min_size=length, max_size=length))
        mask = draw(st.lists(st.booleans(), min_size=length, max_size=length))
        return ("masked", tuple(values), tuple(mask))

    @st.composite
    def structured(draw: st.DrawFn) -> Spec:
        names = draw(st.sampled_from([("a", "b"), ("b", "a"), ("a", "c")]))
        types_ = draw(st.sampled_from([("<i4", "<f8"), ("<f4", "<f8")]))
        values = draw(st.lists(st.integers(-9, 9), min_size=2, max_size=2))
        return ("structured", names, types_, tuple(values))

    return st.one_of(one(), masked(), structured())


def _frames() -> st.SearchStrategy[Spec]:
    @st.composite
    def frame(draw: st.DrawFn) -> Spec:
        columns = tuple(draw(st.lists(st.sampled_from("abc"), min_size=1, max_size=3, unique=True)))
        rows = draw(st.integers(0, 3))
        floats = draw(st.booleans())
        cells = st.lists(st.integers(-5, 5), min_size=rows, max_size=rows)
        values = []
        for _ in columns:
            values.append(tuple(draw(cells)))
        index = tuple(draw(st.lists(st.integers(0, 9), min_size=rows, max_size=rows)))
        return ("frame", columns, floats, tuple(values), index)

    @st.composite
    def series(draw: st.DrawFn) -> Spec:
        # Text columns as pandas keeps them (`object`, and `str` with a missing value among
        # them), read in Rust: characters of every width CPython stores, strings split apart.
        text = st.sampled_from(["x", "xy", "y", "", "é", "ā€", "😀", None])
        values = tuple(draw(st.lists(text, max_size=4)))
        name = draw(st.sampled_from([None, "s", "t"]))
        # `str` is Arrow's buffers where pyarrow is installed, as `string[pyarrow]` is, and
        # Python's strings where it is not, as `string[python]` always is.
        dtype = draw(st.sampled_from(["object", "str", "string[python]", *_ARROW_DTYPES]))
        return ("series", values, name, dtype)

    return st.one_of(frame(), series(), *([_arrow()] if _ARROW_DTYPES else []))


# Where pyarrow is installed (CI installs it), pandas' Arrow-backed text and pyarrow's own arrays.
_ARROW_DTYPES = ["string[pyarrow]"] if importlib.util.find_spec("pyarrow") else []


@dataclasses.dataclass(frozen=True)
class Cuts:
    """Where an Arrow array is cut into chunks and how far into its buffers it starts: no part
    of its content, so equal to every other (two specs differing only here are one value)."""

    at: tuple[int, ...]
    lead: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cuts)

    def __hash__(self) -> int:
        return 0


def _arrow() -> st.SearchStrategy[Spec]:
    """pyarrow arrays of text and bytes, chunked or not, cut and sliced anywhere."""
    text = st.sampled_from(["x", "xy", "y", "", "é", "ā€", "😀", None])
    cuts = st.builds(Cuts, st.lists(st.integers(0, 4), max_size=3).map(tuple), st.integers(0, 2))
    return st.tuples(
        st.just("arrow"),
        st.lists(text, max_size=5).map(tuple),
        st.sampled_from(["string", "large_string", "binary", "large_binary"]),
        st.booleans(),  # Chunked, or one array.
        cuts,
    )


def _arrow_value(values: tuple[str | None, ...], kind: str, chunked: bool, cuts: Cuts) -> Any:
    import pyarrow as pa

    items = [v if v is None or "string" in kind else v.encode() for v in values]
    # Sliced out of a longer array, so that it starts `cuts.lead` elements into its buffers.
    whole = pa.array(["pad"] * cuts.lead + items + ["pad"], type=getattr(pa, kind)())
    array_ = whole.slice(cuts.lead, len(items))
    if not chunked:
        return array_
    at = sorted({min(a, len(items)) for a in cuts.at})
    bounds = [0, *at, len(items)]
    return pa.chunked_array(
        [array_.slice(a, b - a) for a, b in itertools.pairwise(bounds)],
        type=array_.type,
    )


# Resources, keyed by their type: two of one type are one value to a key.
_RESOURCE_KINDS: dict[str, Callable[[], object]] = {
    "lock": lambda: __import__("threading").Lock(),
    "rlock": lambda: __import__("threading").RLock(),
    "event": lambda: __import__("threading").Event(),
    "logger": lambda: logging.getLogger("soma.tests.property"),
}


def _resources() -> st.SearchStrategy[Spec]:
    return st.one_of(
        st.sampled_from(sorted(_RESOURCE_KINDS)).map(lambda kind: ("resource", kind)),
        # In-memory files are data, by their content.
        st.binary(max_size=4).map(lambda data: ("bytesio", data)),
    )


def specs() -> st.SearchStrategy[Spec]:
    # Deferred, so that the strategy's description stays short: a recursive one repeats its
    # leaves' in every branch, which hypothesis warns about past 30 kB.
    leaves = st.deferred(lambda: st.one_of(_scalars(), _arrays(), _frames(), _resources()))
    keys = st.text(max_size=3)
    members = st.one_of(
        st.frozensets(st.integers(-9, 9).map(lambda i: ("int", i)), max_size=4),
        st.frozensets(st.text(max_size=3).map(lambda s: ("str", s)), max_size=4),
    )

    def containers(children: st.SearchStrategy[Spec]) -> st.SearchStrategy[Spec]:
        ordered = st.lists(children, max_size=3).map(tuple)

        @st.composite
        def pairs(draw: st.DrawFn) -> tuple[tuple[str, Spec], ...]:
            names = draw(st.lists(keys, max_size=3, unique=True))
            drawn = []
            for name in names:
                drawn.append((name, draw(children)))
            return tuple(drawn)

        mapping = pairs()
        return st.one_of(
            ordered.map(lambda items: ("tuple", items)),
            ordered.map(lambda items: ("list", items)),
            ordered.map(lambda items: ("mylist", items)),
            mapping.map(lambda items: ("dict", items)),
            mapping.map(lambda items: ("ordered", items)),
            mapping.map(lambda items: ("mydict", items)),
            members.map(lambda items: ("set", items)),
            members.map(lambda items: ("frozenset", items)),
            st.tuples(children, children).map(lambda lr: ("namedtuple", *lr)),
            st.tuples(children, children).map(lambda lr: ("pair", *lr)),
        )

    return st.recursive(leaves, containers, max_leaves=8)


def build(spec: Spec) -> Any:
    """The value ``spec`` describes, made afresh."""
    kind, *rest = spec
    if kind == "none":
        return None
    if kind in ("bool", "int", "str", "bytes"):
        return rest[0]
    if kind == "float":
        return _float(rest[0])
    if kind == "myint":
        return MyInt(rest[0])
    if kind == "mystr":
        return MyStr(rest[0])
    if kind == "enum":
        return Mode[rest[0]]
    if kind == "decimal":
        return decimal.Decimal(rest[0])
    if kind == "datetime":
        return datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=rest[0])
    if kind == "ndarray":
        dtype, length, data, reshaped = rest
        array_ = np.frombuffer(data, dtype=dtype, count=length).copy()
        return array_.reshape(2, 2) if reshaped else array_
    if kind == "masked":
        return np.ma.array(list(rest[0]), mask=list(rest[1]))
    if kind == "structured":
        names, formats, values = rest
        made = np.zeros(2, dtype=list(zip(names, formats, strict=True)))
        made[names[0]] = values
        return made
    if kind == "frame":
        columns, floats, values, index = rest
        data = {
            c: [float(v) if floats else v for v in vs]
            for c, vs in zip(columns, values, strict=True)
        }
        return pd.DataFrame(data, index=list(index), columns=list(columns))
    if kind == "series":
        return pd.Series(list(rest[0]), name=rest[1], dtype=rest[2])
    if kind == "arrow":
        return _arrow_value(*rest)
    if kind in ("tuple", "list", "mylist"):
        items = [build(item) for item in rest[0]]
        return {"tuple": tuple, "list": list, "mylist": MyList}[kind](items)
    if kind in ("dict", "ordered", "mydict"):
        pairs = [(key, build(value)) for key, value in rest[0]]
        return {"dict": dict, "ordered": collections.OrderedDict, "mydict": MyDict}[kind](pairs)
    if kind in ("set", "frozenset"):
        return {"set": set, "frozenset": frozenset}[kind](build(member) for member in rest[0])
    if kind == "resource":
        return _RESOURCE_KINDS[rest[0]]()
    if kind == "bytesio":
        return io.BytesIO(rest[0])
    if kind == "namedtuple":
        return P(build(rest[0]), build(rest[1]))
    if kind == "pair":
        return Pair(build(rest[0]), build(rest[1]))
    raise AssertionError(f"no value of kind {kind}")


@settings(max_examples=300)
@given(first=specs(), second=specs())
def test_two_values_have_the_same_digest_exactly_when_they_have_the_same_content_and_type(
    first: Spec, second: Spec
) -> None:
    assert digest(build(first)) == digest(build(first))
    assert (digest(build(first)) == digest(build(second))) == (first == second)


@pytest.mark.skipif(not _ARROW_DTYPES, reason="pyarrow is not installed")
@settings(max_examples=200)
@given(spec=_arrow() if _ARROW_DTYPES else st.nothing(), cuts=st.lists(st.integers(0, 5)))
def test_an_arrow_text_column_has_one_digest_however_it_is_chunked_or_sliced(
    spec: Spec, cuts: list[int]
) -> None:
    _, values, kind, chunked, _ = spec
    recut = Cuts(tuple(cuts), len(cuts) % 3)
    assert digest(build(spec)) == digest(_arrow_value(values, kind, chunked, recut))
    # And as pandas holds it: a `string[pyarrow]` column over those chunks.
    if "string" in kind:
        import pyarrow as pa

        def column(cuts: Cuts) -> pd.Series[Any]:
            chunks = _arrow_value(values, kind, True, cuts)
            array_ = pd.arrays.ArrowStringArray(chunks.cast(pa.large_string()))
            return pd.Series(array_, dtype="string[pyarrow]")

        assert digest(column(spec[4])) == digest(column(recut))


BOX: dict[str, Any] = {}


class WritesBox(soma.Node):
    def forward(self, x: Any) -> Any:
        BOX["seen"] = x
        return x


class ReadsBox(soma.Node):
    def forward(self, x: Any) -> Any:
        BOX["seen"] = x
        return BOX.get("value")


@settings(max_examples=100)
@given(first=specs(), second=specs())
def test_a_dict_a_node_only_writes_to_is_in_no_key_and_one_it_reads_is_by_its_content(
    first: Spec, second: Spec
) -> None:
    keys = []
    for spec in (first, second):
        BOX.clear()
        BOX["value"] = build(spec)
        keys.append((fingerprint(WritesBox()), fingerprint(ReadsBox())))
    BOX.clear()
    assert keys[0][0] == keys[1][0]
    assert (keys[0][1] == keys[1][1]) == (first == second)


# Digests values as this module builds them, in another interpreter with another hash seed: one
# child for the module, answering a line of digests for each line of pickled specs it reads, so
# that a property asks it about many examples for the cost of one interpreter's start.
_ELSEWHERE = textwrap.dedent("""
    import pickle, sys
    sys.path.insert(0, sys.argv[1])
    import test_keys
    from soma.cache import _fingerprint
    for line in sys.stdin:
        specs = pickle.loads(bytes.fromhex(line))
        print(" ".join(_fingerprint.digest(test_keys.build(s)).hex() for s in specs), flush=True)
""")


@pytest.fixture(scope="module")
def digests_elsewhere() -> Iterator[Callable[[list[Spec]], str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", _ELSEWHERE, str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONHASHSEED": "4242", "PATH": ""},
    )
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None
    assert stdout is not None

    def digests(values: list[Spec]) -> str:
        # A child that hangs is killed at the deadline, and its empty answer fails the test.
        killer = threading.Timer(SUBPROCESS_DEADLINE, child.kill)
        killer.start()
        try:
            stdin.write(pickle.dumps(values).hex() + "\n")
            stdin.flush()
            answer = stdout.readline()
        finally:
            killer.cancel()
        assert answer, child.stderr.read() if child.stderr else "the child ended"
        return answer.strip()

    try:
        yield digests
    finally:
        stdin.close()
        try:
            child.wait(SUBPROCESS_DEADLINE)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            stdout.close()
            if child.stderr is not None:
                child.stderr.close()


@settings(max_examples=100)
@given(values=st.lists(specs(), min_size=1, max_size=10))
def test_equal_values_have_the_same_digest_in_another_process_with_another_hash_seed(
    digests_elsewhere: Callable[[list[Spec]], str], values: list[Spec]
) -> None:
    here = " ".join(digest(build(spec)).hex() for spec in values)
    assert digests_elsewhere(values) == here


def test_the_same_value_built_twice_has_one_digest_whatever_types_modules_hold() -> None:
    # A type a module holds (`types`), no builtin: its digest reaches it through its module.
    assert type(types.SimpleNamespace(a=1)).__module__ == "types"
    assert digest(types.SimpleNamespace(a=1)) == digest(types.SimpleNamespace(a=1))
    assert digest(types.SimpleNamespace(a=1)) != digest(types.SimpleNamespace(a=2))
