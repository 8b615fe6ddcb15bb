"""The package's layout: ``soma`` grouped by stage, imports running one way, never in a circle.

The package is grouped as polars groups its own, by what each part is for; the stages, in the
order a graph meets them:

1. the base: the compiled ``soma._soma`` and ``soma.errors``, which every stage uses;
2. ``soma._build``: what a graph is built of (expressions, ``Node``, functions and torch modules
   as nodes, ``each``/``switch``/``loop``, ``.retry()``/``.time_limit()``, ``Graph.module()``);
3. ``soma._run``: what the engine calls back into while it walks a run (the observer, the
   event loop it keeps, ``Graph.events``, ``Graph.map``);
4. ``soma.devices``: the backends a placed node's device is made current by, device queues,
   torch's per-thread state carried into branches;
5. ``soma.cache``: ``soma.Cache``, what its keys cover, and ``python -m soma.cache``;
5b. ``soma.journal`` and ``soma.runs``: runs written down as they go (resumed, paused, listed),
   built on the cache's keys, and ``python -m soma.runs``;
6. ``soma.remote``: slices of a graph on hosts, Ray's among them, which run with the run's
   observer and the cache;
7. the front: ``soma._graph`` (``Graph``, which ties every stage together, so it comes after
   them all rather than inside one), the public ``soma.native``, ``soma.telemetry`` and
   ``soma.view`` (the browser's view of runs, a listener of the observer as the telemetry is),
   and the package itself.

A module imports, as it runs, only modules of its own stage and of the stages before it; and
no import closes a circle, counting those under ``if TYPE_CHECKING:`` (for the typing only):
a lower stage takes what it uses of a graph, its core (``soma._soma.GraphCore``) and, where it
must make a graph, a factory the front hands down, rather than naming ``Graph`` back. Two arrows
back are the public API's own (:data:`TYPED_BACK`): a lower class with a public signature that
takes a ``Graph``, itself named in one of ``Graph``'s, can only name ``Graph`` back, for the
typing. A private module lives in a subpackage; the only private modules left at the top are
the compiled ``_soma`` (``pyproject.toml``'s ``module-name``, which the glue and the stub name)
and ``_graph``, the front.

Read from the source with ``ast`` rather than by importing, so an import made inside a function,
which Python resolves only when the function first runs, counts as much as one at the top.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import NamedTuple

import soma

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "soma"

#: The stages, in order: what each holds, by module or package name.
STAGES: tuple[tuple[str, ...], ...] = (
    ("soma._soma", "soma.errors"),
    ("soma._build",),
    ("soma._run",),
    ("soma.devices",),
    ("soma.cache",),
    ("soma.journal", "soma.runs"),
    ("soma.remote",),
    ("soma._graph", "soma.native", "soma.telemetry", "soma.view", "soma"),
)

#: The private modules at the top of the package, and why each is not in a subpackage.
TOP_LEVEL_PRIVATE = {
    "soma._soma": "the compiled module, named so by pyproject.toml, the glue and its stub",
    "soma._graph": "the front: Graph ties every stage together",
}

#: The private subpackages, whose `__init__` imports none of their modules.
PRIVATE_PACKAGES = ("soma._build", "soma._run")

#: The arrows back to the front, for the typing only, that the public API draws: each a public
#: signature of a lower stage's class naming ``Graph``, while a signature of ``Graph``'s names
#: that class. Two classes that name each other so close a circle wherever they live apart; no
#: other arrow may.
TYPED_BACK = {
    ("soma.cache._cache", "soma._graph"): "Cache.would_hit(graph: Graph), beside "
    "Graph.forward(cache: Cache)",
    ("soma._build.module", "soma._graph"): "GraphModule(graph: Graph), beside "
    "Graph.module() -> GraphModule",
}


def module_name(path: Path) -> str:
    parts = ("soma", *path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package with Python source, by dotted name."""
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


class Imports(NamedTuple):
    """The modules one module imports: as it runs, and for the typing only."""

    run: set[str]
    typing: set[str]


def _type_checking(test: ast.expr) -> bool:
    """Whether an ``if`` tests ``TYPE_CHECKING`` (or ``typing.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(name: str, path: Path, known: set[str]) -> Imports:
    """The modules of ``known`` that the module ``name`` imports, wherever in it it does so:
    under ``if TYPE_CHECKING:`` for the typing only, anywhere else as it runs.

    ``from soma import x`` names the submodule ``soma.x`` when there is one and the package
    ``soma`` itself otherwise, since then it reads ``x`` from the package's ``__init__``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = Imports(set(), set())
    stack: list[tuple[ast.AST, bool]] = [(ast.parse(path.read_text(), str(path)), False)]
    while stack:
        node, for_typing = stack.pop()
        into = found.typing if for_typing else found.run
        if isinstance(node, ast.Import):
            into.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                into.add(submodule if submodule in known else base)
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend((child, True) for child in node.body)
            stack.extend((child, for_typing) for child in node.orelse)
        else:
            stack.extend((child, for_typing) for child in ast.iter_child_nodes(node))
    return Imports(
        {module for module in found.run if module in known and module != name},
        {module for module in found.typing if module in known and module != name},
    )


def known_modules() -> set[str]:
    # A compiled module (``_soma``) has only its stub: it can be imported, and imports nothing.
    return set(modules()) | {module_name(stub) for stub in PACKAGE.rglob("*.pyi")}


def import_graph() -> dict[str, Imports]:
    known = known_modules()
    return {name: imported(name, path, known) for name, path in modules().items()}


def run_graph() -> dict[str, set[str]]:
    """What each module imports as it runs."""
    return {name: found.run for name, found in import_graph().items()}


def arrows(graph: dict[str, Imports]) -> dict[str, set[str]]:
    """What each module of ``graph`` imports, as it runs and for the typing alike, but the
    arrows of :data:`TYPED_BACK`."""
    return {
        name: {to for to in found.run | found.typing if (name, to) not in TYPED_BACK}
        for name, found in graph.items()
    }


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


def stage_of(module: str) -> int | None:
    """The index in :data:`STAGES` of the stage ``module`` belongs to; None for none."""
    for index, members in enumerate(STAGES):
        for member in members:
            inside = member != "soma" and module.startswith(f"{member}.")
            if module == member or inside:
                return index
    return None


def backward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import in ``graph`` of a module of a later stage than the importer's, as
    ``importer -> imported``."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            at, to = stage_of(module), stage_of(target)
            if at is not None and to is not None and to > at:
                found.append(f"{module} -> {target}")
    return found


def stand_ins(source: str) -> list[str]:
    """What a module declares in place of a type it does not import: a module-level alias of
    ``Any`` (``Graph = Any``, ``Graph: TypeAlias = Any``, ``type Graph = Any``), or a protocol
    named as a public class of Soma's is (``class _Graph(Protocol)``)."""

    def is_any(value: ast.expr | None) -> bool:
        return (isinstance(value, ast.Name) and value.id == "Any") or (
            isinstance(value, ast.Attribute) and value.attr == "Any"
        )

    public = set(soma.__all__)
    type_alias = getattr(ast, "TypeAlias", ())
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and is_any(node.value):
            found.extend(ast.unparse(target) for target in node.targets)
        elif isinstance(node, ast.AnnAssign) and is_any(node.value):
            found.append(ast.unparse(node.target))
        elif isinstance(node, type_alias) and is_any(node.value):  # `type X = ...`, 3.12 on.
            found.append(ast.unparse(node.name))
        elif isinstance(node, ast.ClassDef) and node.name.lstrip("_") in public:
            bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases}
            if "Protocol" in bases:
                found.append(node.name)
    return found


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
    found = imported("soma.late", path, known)
    assert found == Imports({"soma", "soma._build.node", "soma.errors"}, set())


def test_an_import_under_type_checking_counts_for_the_typing_only(tmp_path: Path) -> None:
    path = tmp_path / "typed.py"
    path.write_text(
        "import typing\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from soma._graph import Graph\nelse:\n    import soma.errors\n"
        "if typing.TYPE_CHECKING:\n    import soma.remote\n"
    )
    known = {"soma._graph", "soma.errors", "soma.remote"}
    found = imported("soma.typed", path, known)
    assert found == Imports({"soma.errors"}, {"soma._graph", "soma.remote"})


def test_the_import_graph_holds_the_packages_own_imports() -> None:
    graph = import_graph()
    assert "soma._build.dsl" in graph["soma._build.node"].run
    assert {"soma._graph", "soma.native", "soma.errors"} <= graph["soma"].run
    assert "soma._graph" in graph["soma.cache._cache"].typing


def test_the_cycle_finder_finds_a_cycle_closed_by_an_import_for_the_typing_only(
    tmp_path: Path,
) -> None:
    (tmp_path / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from soma.front import Front\n"
    )
    (tmp_path / "front.py").write_text("from soma import low\n")
    known = {"soma.low", "soma.front"}
    graph = {name: imported(name, tmp_path / f"{name[5:]}.py", known) for name in known}
    assert find_cycle({name: found.run for name, found in graph.items()}) is None
    assert find_cycle(arrows(graph)) == ["soma.front", "soma.low", "soma.front"]


def test_no_module_of_soma_imports_itself_back_not_even_for_the_typing() -> None:
    cycle = find_cycle(arrows(import_graph()))
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])


def test_each_arrow_back_the_public_api_draws_is_there_and_for_the_typing_only() -> None:
    graph = import_graph()
    assert {
        (module, to): (to in graph[module].typing, to in graph[module].run)
        for module, to in TYPED_BACK
    } == dict.fromkeys(TYPED_BACK, (True, False))


def test_every_module_belongs_to_a_stage() -> None:
    assert [module for module in sorted(known_modules()) if stage_of(module) is None] == []


def test_the_stage_check_finds_an_import_of_a_later_stage() -> None:
    graph = {"soma._build.dsl": {"soma.errors"}, "soma.cache._cache": {"soma.remote._slices"}}
    assert backward_imports(graph) == ["soma.cache._cache -> soma.remote._slices"]


def test_a_module_imports_as_it_runs_only_its_stage_and_those_before_it() -> None:
    assert backward_imports(run_graph()) == []


def test_every_private_module_lives_in_a_subpackage_but_the_compiled_one_and_the_front() -> None:
    files = [*PACKAGE.glob("_*.py"), *PACKAGE.glob("_*.pyi")]
    top = {module_name(file) for file in files if not file.name.startswith("__")}
    assert top == set(TOP_LEVEL_PRIVATE)


def test_a_private_subpackage_imports_none_of_its_modules_when_imported() -> None:
    # Importing one module of a stage runs its package's `__init__` first: it stays empty, so
    # that reading one part of a stage never loads the rest.
    graph = run_graph()
    assert {package: graph[package] for package in PRIVATE_PACKAGES} == {
        package: set() for package in PRIVATE_PACKAGES
    }


def test_the_stand_in_finder_finds_an_alias_of_any_and_a_protocol_named_as_a_soma_class() -> None:
    source = (
        "from typing import Any, Protocol, TypeAlias\nimport typing\n"
        "Graph = Any\nCache: TypeAlias = typing.Any\nWork = tuple[int, Any]\n"
        "class _Graph(Protocol): ...\nclass Listener(Protocol): ...\n"
    )
    assert stand_ins(source) == ["Graph", "Cache", "_Graph"]


def test_no_module_stands_in_for_a_type_by_an_alias_of_any_or_a_protocol() -> None:
    found = {name: stand_ins(path.read_text()) for name, path in modules().items()}
    assert {name: names for name, names in found.items() if names} == {}


def test_each_public_module_imports_by_its_path_and_has_the_names_it_lists() -> None:
    # `soma.cache` lists none: its names are the command's.
    listed = ["soma", "soma.errors", "soma.native", "soma.devices", "soma.remote", "soma.telemetry"]
    public = {name: importlib.import_module(name).__all__ for name in listed}
    public["soma.cache"] = ["listing", "clear", "main"]
    missing = [
        f"{module}.{name}"
        for module, names in public.items()
        for name in names
        if not hasattr(importlib.import_module(module), name)
    ]
    assert missing == []
