"""A function is a node: ``@soma.node`` on a ``def`` or ``async def``, ``soma.node(callable)``,
and a function beside a node in an expression; named, placed, retried, pickled and cached as
any node, without torch ever being imported."""

from __future__ import annotations

import asyncio
import functools
import importlib
import math
import operator
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import soma
from conftest import Double, Pass, Tag, run_script

# ---------------------------------------------------------------------------------------------
# Functions at the top level of this module, so that they pickle


@soma.node
def clean(text: str) -> str:
    """Strips the text."""
    return text.strip()


@soma.node
def shout(text: str) -> str:
    return text.upper()


@soma.node
def where(x: Any, ctx: soma.Ctx) -> str:
    return f"{ctx.node}:{x}"


@soma.node
def told_by_keyword(x: Any, *, ctx: soma.Ctx) -> str:
    return f"{ctx.node}:{x}"


@soma.node
def scaled(x: float, factor: float = 10.0) -> float:
    return x * factor


@soma.node
async def fetch(x: int) -> int:
    await asyncio.sleep(0)
    return x + 1


@soma.node
async def fetch_where(x: int, ctx: soma.Ctx) -> str:
    await asyncio.sleep(0)
    return f"{ctx.node}:{x}"


def increment(x: int) -> int:
    return x + 1


class Counter:
    """A callable object, and an object with a method."""

    def __init__(self, step: int) -> None:
        self.step = step

    def __call__(self, x: int) -> int:
        return x + self.step

    def times(self, x: int) -> int:
        return x * self.step


# ---------------------------------------------------------------------------------------------
# A decorated function


def test_a_decorated_function_is_still_the_function_when_called() -> None:
    assert clean("  hi  ") == "hi"
    assert clean.__name__ == "clean"
    assert clean.__doc__ == "Strips the text."
    assert clean.__wrapped__("  x ") == "x"


def test_a_decorated_function_in_an_expression_is_a_node_named_after_it() -> None:
    g = soma.Graph.somatize(clean >> shout)
    assert g.nodes() == ["clean", "shout"]
    assert g.forward("  hi ") == "HI"
    assert isinstance(g.implementation("clean"), soma.FunctionNode)


def test_the_same_decorated_function_twice_is_two_nodes() -> None:
    g = soma.Graph.somatize(clean >> shout >> clean)
    assert g.nodes() == ["clean", "shout", "clean_2"]
    assert g.implementation("clean") is not g.implementation("clean_2")
    assert g.forward(" a ") == "A"


def test_registering_a_decorated_function_twice_is_two_nodes() -> None:
    g = soma.Graph()
    assert [g.node(clean), g.node(clean), g.node("mine", clean)] == ["clean", "clean_2", "mine"]


def test_a_node_of_a_function_is_an_instance_of_a_class_named_after_it() -> None:
    node = clean.named("c")
    assert type(node).__name__ == "clean"
    assert isinstance(type(node)(), type(node))
    assert repr(node).startswith("soma.node(<function clean")


def test_the_settings_of_a_decorated_function_each_make_a_new_node() -> None:
    first = clean.named("first").on("cpu").retry(2, backoff=0.0).time_limit(30.0)
    second = clean.named("second")
    placed = clean.at("gpu-box")
    g = soma.Graph.somatize(first >> second >> clean.concurrency(2))
    assert g.nodes() == ["first", "second", "clean"]
    assert g.devices() == {"first": "cpu"}
    assert g.retries() == {"first": soma.RetryPolicy(2, 0.0, (Exception,))}
    assert g.time_limits() == {"first": 30.0}
    assert placed._soma_host == "gpu-box"
    assert clean.named("again")._soma_id == "again"
    assert soma.Graph.somatize(clean).nodes() == ["clean"]  # the blueprint stays unnamed


def test_a_ctx_is_passed_as_the_second_argument_when_the_function_has_one() -> None:
    g = soma.Graph.somatize(where.named("here"))
    assert g.forward(3) == "here:3"


def test_a_ctx_is_passed_by_keyword_when_the_function_takes_it_so() -> None:
    g = soma.Graph.somatize(told_by_keyword.named("here"))
    assert g.forward(3) == "here:3"


def test_a_defaulted_second_parameter_keeps_its_default_and_gets_no_ctx() -> None:
    g = soma.Graph.somatize(scaled)
    assert g.forward(2.0) == 20.0


def test_a_functions_exception_comes_out_as_itself_with_a_note_naming_the_node() -> None:
    failure = ValueError("bad input")

    @soma.node
    def fails(x: Any) -> Any:
        raise failure

    with pytest.raises(ValueError, match="bad input") as raised:
        soma.Graph.somatize(Pass() >> fails.named("checker")).forward(1)
    assert raised.value is failure
    assert any("`checker`" in note for note in raised.value.__notes__)


# ---------------------------------------------------------------------------------------------
# What a function is refused for, named, where it is decorated


def test_a_function_without_a_parameter_is_refused_where_it_is_decorated() -> None:
    def load() -> list[int]:
        return [1]

    with pytest.raises(TypeError, match="`load` takes no positional parameter"):
        soma.node(load)


def test_a_function_taking_ctx_first_is_refused() -> None:
    def backwards(ctx: Any, x: Any) -> Any:
        return x

    with pytest.raises(TypeError, match="`backwards` takes `ctx` first"):
        soma.node(backwards)


def test_a_function_needing_a_second_argument_is_refused_naming_it() -> None:
    def pair(x: Any, y: Any) -> Any:
        return x, y

    with pytest.raises(TypeError, match="`pair` needs `y` beside its input"):
        soma.node(pair)


def test_a_class_an_expression_and_a_non_callable_are_refused_by_soma_node() -> None:
    with pytest.raises(TypeError, match="`Counter` is a class"):
        soma.node(Counter)
    with pytest.raises(TypeError, match="not an expression"):
        soma.node(Pass() >> Pass())
    with pytest.raises(TypeError, match="not an object of type `int`"):
        soma.node(3)  # type: ignore[call-overload]


def test_soma_node_of_a_node_or_a_decorated_function_is_that_very_object() -> None:
    node = Double()
    assert soma.node(node) is node
    assert soma.node(clean) is clean


# ---------------------------------------------------------------------------------------------
# Any callable, and a function in an expression without the decorator


def test_a_bound_method_is_a_node_named_after_the_method() -> None:
    g = soma.Graph.somatize(soma.node(Counter(3).times))
    assert g.nodes() == ["times"]
    assert g.forward(2) == 6


def test_a_callable_object_is_a_node_named_after_its_class() -> None:
    g = soma.Graph.somatize(soma.node(Counter(5)))
    assert g.nodes() == ["counter"]
    assert g.forward(1) == 6


def test_a_library_function_is_a_node() -> None:
    g = soma.Graph.somatize(soma.node(math.sqrt) >> soma.node(operator.neg))
    assert g.nodes() == ["sqrt", "neg"]
    assert g.forward(9.0) == -3.0


def test_a_partial_is_a_node_named_after_its_function() -> None:
    g = soma.Graph.somatize(soma.node(functools.partial(scaled.__wrapped__, factor=3.0)))
    assert g.nodes() == ["scaled"]
    assert g.forward(2.0) == 6.0


def test_a_function_after_a_node_in_an_expression_is_wrapped() -> None:
    g = soma.Graph.somatize(Double() >> increment)
    assert g.nodes() == ["double", "increment"]
    assert g.forward(5) == 11


def test_a_function_before_a_node_and_beside_one_is_wrapped() -> None:
    g = soma.Graph.somatize((increment >> Double()) | increment)
    assert g.nodes() == ["increment", "double", "increment_2"]
    assert g.forward(1) == {"double": 4, "increment_2": 2}


def test_a_lambda_in_an_expression_is_a_node_named_lambda() -> None:
    g = soma.Graph.somatize(Pass() >> (lambda x: x * 7) >> (lambda x: x + 1))
    assert g.nodes() == ["pass", "lambda", "lambda_2"]
    assert g.forward(1) == 8


def test_two_plain_functions_alone_are_pythons_to_refuse() -> None:
    with pytest.raises(TypeError):
        increment >> increment  # type: ignore[operator]


def test_g_node_registers_a_plain_function_as_a_node() -> None:
    g = soma.Graph()
    first = g.node(increment)
    second = g.node(increment)
    g.edge(first, second)
    assert (first, second) == ("increment", "increment_2")
    assert g.forward(0) == 2


def test_an_object_with_a_forward_of_its_own_is_still_registered_as_it_is() -> None:
    class Duck:
        def forward(self, x: int) -> int:
            return x - 1

        def __call__(self, x: int) -> int:
            raise AssertionError("called, where forward was meant")

    g = soma.Graph()
    g.node("duck", Duck())
    assert g.forward(5) == 4


def test_functions_run_inside_each_switch_and_loop() -> None:
    g = soma.Graph.somatize(
        soma.each(increment).named("items")
        >> soma.switch(len, {3: soma.node(sum), 2: max}).named("pick")
        >> soma.loop(lambda n: n * 2, until=lambda n: n >= 10, max_iterations=20).named("grow")
    )
    assert g.implementation("items/increment").function is increment
    assert g.forward([1, 2, 3]) == 18  # [2, 3, 4], summed: 9, doubled once
    assert g.forward([1, 2]) == 12  # [2, 3], its max: 3, doubled twice


def test_a_retried_function_node_runs_again_after_a_failure() -> None:
    calls: list[int] = []

    @soma.node
    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError("try again")
        return x * 10

    g = soma.Graph.somatize(flaky.retry(2, backoff=0.0, on=(ConnectionError,)))
    assert g.forward(4) == 40
    assert calls == [4, 4, 4]


# ---------------------------------------------------------------------------------------------
# Async functions


def test_a_decorated_async_function_is_an_async_node() -> None:
    g = soma.Graph.somatize(fetch >> fetch >> fetch_where.named("told"))
    assert g.nodes() == ["fetch", "fetch_2", "told"]
    assert asyncio.run(g.aforward(1)) == "told:3"
    assert g.forward(1) == "told:3"  # on the loop Soma keeps


def test_an_async_function_taking_ctx_by_keyword_gets_it() -> None:
    @soma.node
    async def keyed(x: int, *, ctx: soma.Ctx) -> str:
        return f"{ctx.node}:{x}"

    assert asyncio.run(soma.Graph.somatize(keyed).aforward(2)) == "keyed:2"


def test_an_async_callable_object_is_an_async_node() -> None:
    class Later:
        async def __call__(self, x: int) -> int:
            await asyncio.sleep(0)
            return -x

    assert asyncio.run(soma.Graph.somatize(soma.node(Later())).aforward(2)) == -2


# ---------------------------------------------------------------------------------------------
# Pickling


def test_a_graph_of_decorated_functions_pickles_and_runs_again() -> None:
    g = soma.Graph.somatize(clean.retry(1, backoff=0.0) >> shout.named("loud") >> clean)
    loaded = pickle.loads(pickle.dumps(g))
    assert loaded.nodes() == ["clean", "loud", "clean_2"]
    assert loaded.retries() == g.retries()
    assert loaded.forward(" a ") == "A"
    assert type(loaded.implementation("clean")) is type(g.implementation("clean"))


def test_a_decorated_function_pickles_by_name() -> None:
    assert pickle.loads(pickle.dumps(clean)) is clean


def test_nodes_of_library_functions_and_methods_pickle() -> None:
    g = soma.Graph.somatize(soma.node(math.sqrt) >> soma.node(Counter(2).times) >> increment)
    assert pickle.loads(pickle.dumps(g)).forward(16.0) == 9.0


def test_a_lambda_node_does_not_pickle_and_is_named() -> None:
    g = soma.Graph.somatize(Pass() >> soma.node(lambda x: x).named("anonymous"))
    with pytest.raises(soma.NodePicklingError, match="node `anonymous` "):
        pickle.dumps(g)


def test_a_graph_of_functions_pickled_in_one_process_runs_in_another(tmp_path: Path) -> None:
    (tmp_path / "text_steps.py").write_text(
        "import soma\n\n\n@soma.node\ndef clean(text):\n    return text.strip()\n\n\n"
        "def shout(text):\n    return text.upper()\n"
    )
    saved = tmp_path / "graph.pickle"
    env = {"PYTHONPATH": str(tmp_path)}
    write = (
        "import pickle, soma, text_steps\n"
        "g = soma.Graph.somatize(text_steps.clean >> soma.node(text_steps.shout))\n"
        f"open({str(saved)!r}, 'wb').write(pickle.dumps(g))\n"
    )
    read = f"import pickle\nprint(pickle.loads(open({str(saved)!r}, 'rb').read()).forward(' hi '))"
    for script in (write, read):
        run = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, **env},
        )
        assert run.returncode == 0, run.stderr
    assert run.stdout == "HI\n"


def test_a_local_decorated_function_does_not_pickle_and_its_node_is_named() -> None:
    @soma.node
    def local(x: Any) -> Any:
        return x

    with pytest.raises(soma.NodePicklingError, match="node `local` "):
        pickle.dumps(soma.Graph.somatize(local))


# ---------------------------------------------------------------------------------------------
# The cache keys a function node by its code

STEPS_V1 = """
import soma
from conftest import CallRecord

# A record of calls that is no part of what the nodes compute (a plain list they append to
# would be, and would rerun them: a key covers the module-level values a node reads).
CALLS = CallRecord()


@soma.node
def load(x):
    CALLS.append("load")
    return x + 1


@soma.node
def scale(x):
    CALLS.append("scale")
    return x * 2
"""


def _import_steps(folder: Path, source: str) -> Any:
    (folder / "edited_steps.py").write_text(source)
    sys.modules.pop("edited_steps", None)
    importlib.invalidate_caches()
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("edited_steps")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("edited_steps", None)


def test_editing_a_functions_code_reruns_its_node_and_only_what_follows(tmp_path: Path) -> None:
    cache = soma.Cache(tmp_path / "runs")
    results = []
    for source in (STEPS_V1, STEPS_V1, STEPS_V1.replace("x * 2", "x * 3")):
        steps = _import_steps(tmp_path, source)
        g = soma.Graph.somatize(steps.load >> steps.scale)
        results.append((g.forward(1, cache=cache), steps.CALLS))
    assert results == [(4, ["load", "scale"]), (4, []), (6, ["scale"])]


def test_a_function_node_of_a_method_is_keyed_by_its_objects_state() -> None:
    cache = soma.Cache()
    counter = Counter(2)
    g = soma.Graph.somatize(soma.node(counter.times))
    assert g.forward(5, cache=cache) == 10
    counter.step = 3
    assert g.forward(5, cache=cache) == 15


# ---------------------------------------------------------------------------------------------
# torch is never imported


def test_function_nodes_never_import_torch() -> None:
    run = run_script(
        "import sys, asyncio, soma\n"
        "@soma.node\n"
        "def f(x):\n    return x + 1\n"
        "@soma.node\n"
        "async def g(x):\n    return x * 2\n"
        "graph = soma.Graph.somatize((soma.each(f) >> (lambda xs: xs)) | g)\n"
        "assert graph.forward([1]) == {'lambda': [2], 'g': [1, 1]}\n"
        "assert soma.Graph.somatize(soma.node(len)).forward([1]) == 1\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "print('ok')\n"
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "ok\n"


# ---------------------------------------------------------------------------------------------
# An expression of functions is the graph of the same expression of nodes


@soma.node
def tag(x: Any, ctx: soma.Ctx) -> Any:
    """What ``conftest.Tag`` returns: its id and what it read, spelling out the data flow."""
    return (ctx.node, list(x.items()) if isinstance(x, dict) else x)


@given(st.recursive(st.just("leaf"), lambda inner: st.tuples(st.sampled_from(">|"), inner, inner)))
def test_an_expression_of_a_function_is_the_graph_of_the_same_expression_of_a_class(
    tree: Any,
) -> None:
    functions = soma.Graph.somatize(written(tree, lambda: tag))
    classes = soma.Graph.somatize(written(tree, Tag))
    assert functions.nodes() == classes.nodes()
    assert functions.edges() == classes.edges()
    assert functions.forward(0) == classes.forward(0)


def written(tree: Any, leaf: Any) -> Any:
    """The expression ``tree`` describes, each leaf ``leaf()``: built bottom-up with a stack of
    its own."""
    built: list[Any] = []
    pending: list[Any] = [tree]
    while pending:
        item = pending.pop()
        if item == "leaf":
            built.append(leaf())
        elif len(item) == 3:
            pending.extend([("join", item[0]), item[2], item[1]])
        else:
            right, left = built.pop(), built.pop()
            built.append(left >> right if item[1] == ">" else left | right)
    return built[0]
