"""A griffe extension for the API reference: a method a class takes from a function written
elsewhere (``map = _stream.stream_map`` in ``Graph``) reads as the method it is.

Read statically, such a line is a class attribute whose value is a name, with no signature and
no docstring, though ``g.map(inputs, in_flight=...)`` calls the function with the graph as its
first argument. The extension puts a method in the attribute's place: the function's signature
with its first parameter as ``self``, its return type and its docstring, so the reference shows
``Graph.map`` as it is called, from the one docstring it has.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe


def classes(module: griffe.Module) -> Iterator[griffe.Class]:
    """The classes defined in ``module`` and the modules under it, nested ones included."""
    pending: list[griffe.Module | griffe.Class] = [module]
    while pending:
        holder = pending.pop()
        for member in holder.members.values():
            if member.is_alias:
                continue
            if member.is_class or member.is_module:
                pending.append(member)  # type: ignore[arg-type]
            if member.is_class:
                yield member  # type: ignore[misc]


class MethodsFromFunctions(griffe.Extension):
    """Once the package is loaded, turns each class attribute that names a function of the
    package into that function as a method."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for cls in list(classes(pkg)):
            for name, member in list(cls.members.items()):
                if member.is_alias or not member.is_attribute:
                    continue
                value = member.value  # type: ignore[union-attr]
                if not isinstance(value, (griffe.ExprName, griffe.ExprAttribute)):
                    continue
                try:
                    function = loader.modules_collection[value.canonical_path]
                except KeyError:
                    continue  # Not the package's: nothing to read a signature from.
                if function.is_alias or not function.is_function or not function.parameters:
                    continue
                first, *rest = function.parameters
                method = griffe.Function(
                    name,
                    lineno=member.lineno,
                    endlineno=member.endlineno,
                    parameters=griffe.Parameters(griffe.Parameter("self", kind=first.kind), *rest),
                    returns=function.returns,
                    docstring=(
                        griffe.Docstring(function.docstring.value, lineno=function.docstring.lineno)
                        if function.docstring is not None
                        else None
                    ),
                )
                cls.set_member(name, method)
