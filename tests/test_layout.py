"""The package's layout: imports among the modules of ``soma`` run one way, never in a circle.

Read from the source with ``ast`` rather than by importing, so an import made inside a function,
which Python resolves only when the function first runs, counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "soma"


def module_name(path: Path) -> str:
    parts = ("soma", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package with Python source, by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that the module ``name`` imports, wherever in it it does so.

    ``from soma import x`` names the submodule ``soma.x`` when there is one and the package
    ``soma`` itself otherwise, since then it reads ``x`` from the package's ``__init__``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    sources = modules()
    # A compiled module (``_soma``) has only its stub: it can be imported, and imports nothing.
    known = set(sources) | {module_name(stub) for stub in PACKAGE.rglob("*.pyi")}
    return {name: imported(name, path, known) for name, path in sources.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as the path around it, first module repeated at the end; or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph.get(module, ())):
            cycle = visit(target)
            if cycle is not None:
                return cycle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module)
        if cycle is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_only_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_an_import_inside_a_function_counts(tmp_path: Path) -> None:
    path = tmp_path / "late.py"
    path.write_text(
        "def f():\n    from soma._build import node\n    from soma import Node\n"
        "    from . import errors\n"
    )
    known = {"soma", "soma._build.node", "soma.errors"}
    assert imported("soma.late", path, known) == {"soma", "soma._build.node", "soma.errors"}


def test_the_import_graph_holds_the_packages_own_imports() -> None:
    graph = import_graph()
    assert "soma._build.dsl" in graph["soma._build.node"]
    assert {"soma._graph", "soma.native", "soma.errors"} <= graph["soma"]


def test_no_module_of_soma_imports_itself_back() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])
