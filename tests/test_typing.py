"""The typed API: `tests/typing/use_whole_api.py` runs, and uses every public name.

`make lint` type-checks that file with `mypy --strict` and checks the stubs of `soma._soma`
against the compiled module with `mypy.stubtest`; here it runs as a plain script, so every
line mypy accepts is also shown to work.
"""

from __future__ import annotations

import ast
import runpy
from pathlib import Path

import pytest

import soma
from soma import native

USE_WHOLE_API = Path(__file__).parent / "typing" / "use_whole_api.py"


def test_the_whole_api_file_runs() -> None:
    runpy.run_path(str(USE_WHOLE_API), run_name="__main__")


def attributes_used(module: str) -> set[str]:
    """The `X` of every `module.X` in the file."""
    tree = ast.parse(USE_WHOLE_API.read_text(), str(USE_WHOLE_API))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == module
    }


@pytest.mark.parametrize(
    ("module", "public"),
    [("soma", soma.__all__), ("native", native.__all__)],
)
def test_the_whole_api_file_uses_every_public_name(module: str, public: list[str]) -> None:
    used = attributes_used(module) | ({"native"} if module == "soma" else set())
    assert sorted(set(public) - used) == []


def test_soma_runs_stays_the_listing_when_the_command_of_that_name_is_imported() -> None:
    from conftest import run_script

    ran = run_script(
        "import soma.runs.__main__, soma.runs._command, soma.runs, soma\n"
        "print(callable(soma.runs), soma.runs.__module__)"
    )
    assert (ran.returncode, ran.stdout.strip()) == (0, "True soma.journal._journal"), ran.stderr
