"""The glue's layout (``crates/soma-python/src``): its modules use one another without a circle,
and the ``soma`` package's own Python modules, which the glue calls back into, are named in one
file, ``py_modules.rs``, as polars-python keeps its own.

Read from the Rust source: every ``crate::name`` a module writes (in a ``use``, grouped or not,
or a path in its code) is an arrow from the module to ``name`` — a folder (``graph/``) counts as
one module, its files together — and every string naming a ``soma.`` module is an import of it.
"""

from __future__ import annotations

import re
from pathlib import Path

GLUE = Path(__file__).resolve().parent.parent / "crates" / "soma-python" / "src"
#: The one file that names the package's modules the glue imports.
PY_MODULES = GLUE / "py_modules.rs"


def _code(text: str) -> str:
    """``text`` without its comments, so that a module named in a comment is no arrow."""
    return re.sub(r"//[^\n]*", "", text)


def _arrows(text: str) -> set[str]:
    """The top-level modules of the crate that ``text`` names: ``crate::name`` and each name
    of a grouped ``use crate::{a, b::c}``."""
    found = set(re.findall(r"crate::(\w+)", text))
    for group in re.findall(r"crate::\{([^}]*)\}", text):
        found.update(re.findall(r"(?:^|,)\s*(\w+)", group))
    return found


def glue_graph(root: Path = GLUE) -> dict[str, set[str]]:
    """Each top-level module of the crate (``lib`` aside) and the modules it uses."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.rs")):
        module = path.relative_to(root).parts[0].removesuffix(".rs")
        if module == "lib":
            continue
        graph.setdefault(module, set()).update(_arrows(_code(path.read_text())) - {module})
    return {module: uses & graph.keys() for module, uses in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: its strongly connected parts of more than one module, each
    sorted (Tarjan's, with an explicit stack: no recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return found


def test_the_cycle_finder_finds_a_circle_and_only_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_a_grouped_use_and_a_path_in_code_are_arrows_and_a_comment_is_not() -> None:
    text = "use crate::{errors::x, watch};\nfn f() { crate::stopped::g(); } // crate::graph\n"
    assert _arrows(_code(text)) == {"errors", "watch", "stopped"}


def test_the_glues_modules_use_one_another_without_a_circle() -> None:
    graph = glue_graph()
    assert {"aio", "graph", "node", "cache", "stopped", "errors"} <= graph.keys()
    assert cycles(graph) == []


def test_only_py_modules_names_a_module_of_the_soma_package() -> None:
    named = {}
    for path in sorted(GLUE.rglob("*.rs")):
        if path == PY_MODULES:
            continue
        # `soma._soma`, the glue's own module, is what its classes say they belong to.
        found = set(re.findall(r'"(soma\.[\w.]+)"', _code(path.read_text()))) - {"soma._soma"}
        if found:
            named[str(path.relative_to(GLUE))] = sorted(found)
    assert named == {}
    assert len(re.findall(r'"soma\.[\w.]+"', PY_MODULES.read_text())) >= 8
