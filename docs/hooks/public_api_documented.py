"""The site's build fails on a public name of ``soma`` without a docstring.

The API reference is generated from the docstrings (mkdocstrings); a name without one would show
as a bare signature, and nothing else would notice. This hook, run by ``mkdocs build`` before
anything is written, reads the package as mkdocstrings does (griffe, statically: the sources and
``_soma.pyi``, the stubs of the compiled module) and names every public object that has none.

Public is what a user reaches: the names in ``soma.__all__``, and those of the public submodules
(their ``__all__``, or for ``soma.cache``, which has none, what it defines without a leading
underscore); of a public class, each method, property and nested class it defines, not what it
inherits or what starts with an underscore (``__init__``'s parameters are the class's docstring's
to say, as the reference merges the two).

``tests/test_site.py`` runs :func:`undocumented` on a package with a name left bare, so the
check is seen to fail.
"""

from __future__ import annotations

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


def missing_in(obj: griffe.Object) -> list[str]:
    """``obj``'s path if it has no docstring, and those of its own public members that have none."""
    missing = [] if obj.docstring and obj.docstring.value.strip() else [obj.path]
    if obj.is_class:
        for name, member in obj.members.items():
            if name.startswith("_") or member.is_alias:
                continue
            if member.is_function or member.is_class or "property" in member.labels:
                missing += missing_in(member)
    return missing


def public_objects(
    package: str = "soma", search_path: Path = ROOT / "python"
) -> dict[str, griffe.Object]:
    """Every public name of ``package`` (``soma.Graph``, ``soma.remote.use``), with the object
    it names, as the reference shows it: the name's own path, not where it is defined."""
    root: Any = griffe.load(package, search_paths=[str(search_path)], resolve_aliases=True)
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
    """The dotted path of every public object of ``package`` that has no docstring."""
    missing: list[str] = []
    for public, obj in public_objects(package, search_path).items():
        if obj.is_module:
            if not (obj.docstring and obj.docstring.value.strip()):
                missing.append(public)
            continue
        missing += [public + path.removeprefix(obj.path) for path in missing_in(obj)]
    return sorted(set(missing))


def on_config(config: Any) -> Any:
    """MkDocs' hook, before the build: fails it, naming each undocumented public object."""
    from mkdocs.exceptions import PluginError

    missing = undocumented()
    if missing:
        raise PluginError(
            f"{len(missing)} public names of soma have no docstring, and the API reference is "
            "made of docstrings: " + ", ".join(f"`{name}`" for name in missing)
        )
    return config


if __name__ == "__main__":
    print("\n".join(undocumented()))
