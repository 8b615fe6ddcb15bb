"""Deep as well as wide: a graph nested a hundred thousand levels deep compiles, runs, draws its
shape and is dropped like any other — no recursion per level anywhere on the way.

Each check runs in a subprocess with a deadline: a regression here is a stack overflow, which
would take the test runner down with it.
"""

from __future__ import annotations

import os

from conftest import run_script

DEEP_SCRIPT = """
import sys, threading
sys.path.insert(0, {tests!r})
import soma


class First(soma.Node):
    \"\"\"Passes one of its inputs on, so that values stay flat however deep the graph.\"\"\"

    def forward(self, x):
        return next(iter(x.values())) if isinstance(x, dict) else x


# `(((n0 >> n1) | n2) >> n3) | n4 ...`, built with node()/edge() as a loop would.
g = soma.Graph()
g.node("n0", First())
terminals = ["n0"]
for level in range(1, {levels}):
    node = g.node(f"n{{level}}", First())
    if level % 2:
        for terminal in terminals:
            g.edge(terminal, node)
        terminals = [node]
    else:
        terminals.append(node)
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
    done = run_script(DEEP_SCRIPT.format(tests=tests, levels=100_000))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done" in done.stdout, done.stdout
