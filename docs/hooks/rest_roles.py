"""A griffe extension for the API reference: the Sphinx roles some docstrings use
(``:class:`Graph```, ``:meth:`~soma.Graph.map```) read as code, as in the rest of the text.

The reference renders docstrings as Markdown, where a role would show its colons and name. A
role becomes the code span it names (the last part of the path when it starts with ``~``), so
the docstring reads the same in the editor, in ``help()`` and on the site.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def as_code(match: re.Match[str]) -> str:
    """The role matched, as the code span it names."""
    short, target = match.group(1), match.group(2)
    return f"``{target.rsplit('.', 1)[-1] if short else target}``"


class RestRoles(griffe.Extension):
    """Rewrites each docstring's roles as it is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(as_code, obj.docstring.value)
