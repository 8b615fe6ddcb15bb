"""The site's build fails on a public name of ``soma`` that its docstring leaves unexplained.

The API reference is generated from the docstrings (mkdocstrings); a name without one would show
as a bare signature, and nothing else would notice. This hook, run by ``mkdocs build`` before
anything is written, reads the package as mkdocstrings does (griffe, statically: the sources and
``_soma.pyi``, the stubs of the compiled module, with the reference's own extension for methods
taken from functions) and names each of these it finds:

- a public object without a docstring;
- a parameter of a public function or method that its docstring does not name (in an ``Args:``
  section, or as ``name``, ``name=...`` or ``.name`` in code in the text; a class's parameters,
  in the class's docstring or its ``__init__``'s);
- a public attribute of a public class with neither a docstring of its own nor an entry in the
  class's (an ``Attributes:`` section, or the same code in the text).

Public is what a user reaches: the names in ``soma.__all__``, and those of the public submodules
(their ``__all__``, or for ``soma.cache``, which has none, what it defines without a leading
underscore); of a public class, each method, property, attribute and nested class it defines, not
what it inherits or what starts with an underscore (``__init__``'s parameters are the class's).

``tests/test_site.py`` runs :func:`undocumented` on a package with each of these left out, so the
check is seen to fail.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[2]
PUBLIC_MODULES = ("cache", "devices", "errors", "native", "remote", "telemetry")


def public_names(module: griffe.Module) -> list[str]:
    """What a user imports from ``module``: its ``__all__``, else what it defines unprefixed."""
    if module.exports is not None:
        return sorted(str(name) for name in module.exports)
    return sorted(
        name
        for name, member in module.members.items()
        if not name.startswith("_") and not member.is_alias and not member.is_module
    )


def text(obj: griffe.Object | None) -> str:
    """``obj``'s docstring, or nothing."""
    return obj.docstring.value.strip() if obj is not None and obj.docstring else ""


def names(docstring: str, name: str) -> bool:
    """Whether ``docstring`` names ``name``: an entry of a Google section (``name:``,
    ``name (type):``) or code in the text (``name``, ``name=...``, ``*name``, ``.name``)."""
    escaped = re.escape(name)
    return bool(
        re.search(rf"^\s+\*{{0,2}}{escaped}( \([^)]*\))?:", docstring, re.MULTILINE)
        or re.search(rf"``(\.|\*{{1,2}})?{escaped}(=[^`]*)?``", docstring)
    )


def unexplained_parameters(
    function: griffe.Function, docstring: str, where: str, documented: frozenset[str] = frozenset()
) -> list[str]:
    """What ``docstring`` leaves out of ``function``'s parameters, but for those ``documented``
    elsewhere (a dataclass's fields, each with a docstring of its own)."""
    return [
        f"`{where}` does not name its parameter `{parameter.name}`"
        for parameter in function.parameters
        if parameter.name not in {"self", "cls"} | documented
        and not names(docstring, parameter.name)
    ]


def missing_in(obj: Any, public: str) -> list[str]:
    """What ``obj``, shown as ``public``, leaves unexplained: itself, and its own members."""
    own = text(obj)
    if not own:
        return [f"`{public}` has no docstring"]
    missing = []
    if obj.is_function:
        missing += unexplained_parameters(obj, own, public)
    if obj.is_class:
        init = obj.members.get("__init__")
        if init is not None and not init.is_alias and init.is_function:
            fields = frozenset(
                name
                for name, member in obj.members.items()
                if not member.is_alias and member.is_attribute and text(member)
            )
            missing += unexplained_parameters(init, own + "\n" + text(init), public, fields)
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias:
                continue
            if member.is_function or member.is_class or "property" in member.labels:
                missing += missing_in(member, f"{public}.{name}")
            elif member.is_attribute and not text(member) and not names(own, name):
                missing.append(f"`{public}.{name}`, an attribute, is neither documented nor named")
    return missing


def public_objects(
    package: str = "soma", search_path: Path = ROOT / "python"
) -> dict[str, griffe.Object]:
    """Every public name of ``package`` (``soma.Graph``, ``soma.remote.use``), with the object
    it names, as the reference shows it: the name's own path, not where it is defined."""
    root: Any = griffe.load(
        package,
        search_paths=[str(search_path)],
        resolve_aliases=True,
    )
    objects: dict[str, griffe.Object] = {}
    for name in public_names(root):
        target = root.members[name]
        target = target.final_target if target.is_alias else target
        if target.is_module and name in PUBLIC_MODULES:
            continue  # Walked below, with its own names.
        objects[f"{package}.{name}"] = target
    for module_name in PUBLIC_MODULES:
        if module_name not in root.members:
            continue
        module = root.members[module_name]
        objects[f"{package}.{module_name}"] = module
        for name in public_names(module):
            target = module.members[name]
            objects[f"{package}.{module_name}.{name}"] = (
                target.final_target if target.is_alias else target
            )
    return objects


def undocumented(package: str = "soma", search_path: Path = ROOT / "python") -> list[str]:
    """What the docstrings of ``package``'s public names leave unexplained, a line each."""
    missing: list[str] = []
    for public, obj in public_objects(package, search_path).items():
        if obj.is_module:
            if not text(obj):
                missing.append(f"`{public}` has no docstring")
            continue
        missing += missing_in(obj, public)
    return sorted(set(missing))


def on_config(config: Any) -> Any:
    """MkDocs' hook, before the build: fails it, naming each undocumented public object."""
    from mkdocs.exceptions import PluginError

    missing = undocumented()
    if missing:
        raise PluginError(
            f"the API reference is made of docstrings, and {len(missing)} things a user of "
            "soma reaches are left unexplained by theirs:\n" + "\n".join(missing)
        )
    return config


if __name__ == "__main__":
    print("\n".join(undocumented()))
