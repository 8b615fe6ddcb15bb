"""Values of any shape: does a Rust node read a value nested thousands of levels deep, and
hand one back, without a deep stack? Is a list that contains itself refused, naming the node,
and a list held in many places converted once?

Each check runs in a subprocess with a deadline: a regression here is a stack overflow (which
would take the test runner down with it) or a conversion that never ends.
"""

from __future__ import annotations

import os

from conftest import run_script

TESTS = os.path.dirname(os.path.abspath(__file__))

PRELUDE = """
import sys, threading
sys.path.insert(0, {tests!r})
import soma
from soma import native


def nested(levels, bottom=0):
    value = bottom
    for level in range(levels):
        value = {{"k": value}} if level % 3 == 2 else [None, value]
    return value


def depth(value):
    levels = 0
    while isinstance(value, (list, dict)):
        value = value["k"] if isinstance(value, dict) else value[1]
        levels += 1
    return levels, value
"""


def run(body: str) -> str:
    """Runs ``body`` after the prelude in a fresh interpreter; returns what it printed, failing
    the test on a crash, an exception or a hang."""
    done = run_script(PRELUDE.format(tests=TESTS) + body)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_value_nested_a_hundred_thousand_levels_crosses_rust_nodes_in_branches() -> None:
    out = run("""
class Pass(soma.Node):
    def forward(self, x):
        return x


# Two Rust nodes in two branches (one of them on a lent thread), then a third reading both.
g = soma.Graph.somatize(
    (native.Identity().named("a") | Pass().named("b")) >> native.Identity().named("c")
)
out = g.forward(nested(100_000, bottom=7))
print("a", depth(out["a"]), flush=True)
print("b", depth(out["b"]), flush=True)
del out
print("a again", depth(g.forward(nested(100_000, bottom=8))["a"]), flush=True)
""")
    assert out == "a (100000, 7)\nb (100000, 7)\na again (100000, 8)\n", out


def test_a_deep_value_converts_for_a_rust_node_run_alone_and_in_a_lent_thread() -> None:
    out = run("""
print(depth(native.Identity().forward(nested(100_000))), flush=True)
meet = threading.Barrier(2, timeout=30)


class Wait(soma.Node):
    def forward(self, x):
        meet.wait()
        return 0


class Meet(soma.Node):
    def forward(self, x):
        meet.wait()
        return nested(100_000, bottom=x)


# `Wait` holds the caller's thread, so `Meet >> Identity` runs on a lent one.
g = soma.Graph.somatize(Wait().named("w") | Meet().named("m") >> native.Identity().named("i"))
print(depth(g.forward(3)["i"]), flush=True)
""")
    assert out == "(100000, 0)\n(100000, 3)\n", out


def test_a_list_that_contains_itself_is_refused_with_value_error_naming_the_node() -> None:
    out = run("""
loop = [1]
loop.append(loop)
tangled = {"a": [loop]}
g = soma.Graph.somatize(native.Identity().named("reader"))
for value in (loop, tangled, (0, tangled)):
    try:
        g.forward(value)
    except ValueError as error:
        print(str(error).splitlines()[0], error.__notes__, "hint:" in str(error), flush=True)
print(g.forward([[1], [1]]), flush=True)
""")
    refused = "a Rust node cannot read a `list` that contains itself"
    line = f"{refused} ['raised in soma node `reader`'] True\n"
    assert out == 3 * line + "[[1], [1]]\n", out


def test_a_list_held_in_many_places_converts_once_and_comes_back_shared() -> None:
    # Two hundred levels of `[inner, inner]`: 2**200 paths, 200 lists. Walking every path would
    # never end; converting each list once takes no time.
    out = run("""
inner = [1]
for _ in range(200):
    inner = [inner, inner]
out = native.Identity().forward({"x": inner, "y": inner})
print(out["x"] is out["y"], out["x"][0] is out["x"][1], flush=True)
levels = 0
while len(out["x"]) == 2:
    out["x"] = out["x"][0]
    levels += 1
print(levels, out["x"], flush=True)
""")
    assert out == "True True\n200 [1]\n", out
