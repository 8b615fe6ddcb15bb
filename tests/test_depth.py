"""Deep as well as wide: a graph nested a hundred thousand levels deep compiles, runs, draws its
shape and is dropped like any other — no recursion per level anywhere on the way.

Each check runs in a subprocess with a deadline: a regression here is a stack overflow, which
would take the test runner down with it.
"""

from __future__ import annotations

import os

from conftest import deep_graph, run_script

DEEP_SCRIPT = """
import sys, threading
sys.path.insert(0, {tests!r})
import soma


{graph}
plan = g.plan()
shape = plan.shape()
assert shape.startswith("Sequence([Wave([Sequence([Wave(["), shape[:40]
assert shape.count("Wave") == ({levels} - 1) // 2
assert g.forward(3) == 3
assert g.forward(4) == 4
assert plan == g.plan()
print("threads", g.threads(), flush=True)
del g, plan
print("done", flush=True)
"""


def test_a_graph_nested_a_hundred_thousand_levels_deep_compiles_runs_and_drops() -> None:
    tests = os.path.dirname(os.path.abspath(__file__))
    done = run_script(DEEP_SCRIPT.format(tests=tests, graph=deep_graph(100_000), levels=100_000))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done" in done.stdout, done.stdout
