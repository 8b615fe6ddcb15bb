"""The docstrings' examples run: every ``>>>`` in every module of the ``soma`` package.

A docstring example is what a reader copies first, so it is held to what it shows, output
included. Modules are found by walking the package, so a new module's examples run unasked.
"""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil

import pytest

import soma

MODULES = ["soma", *(info.name for info in pkgutil.walk_packages(soma.__path__, "soma."))]


def examples(module: str) -> list[doctest.DocTest]:
    """The docstrings of ``module`` that hold at least one example."""
    found = doctest.DocTestFinder().find(importlib.import_module(module))
    return [test for test in found if test.examples]


# The modules with examples to run: a case per module that has some, none for those that have
# none (a case that ran no example would pass whatever the examples said).
WITH_EXAMPLES = [module for module in MODULES if examples(module)]


def test_the_package_has_examples_to_run() -> None:
    # Without this, a walk or a finder that found nothing would leave nothing below to fail.
    assert "soma._build.dsl" in MODULES
    assert {"soma", "soma.devices"} <= set(WITH_EXAMPLES), WITH_EXAMPLES


@pytest.mark.parametrize("module", WITH_EXAMPLES)
def test_a_modules_examples_run_and_print_what_they_show(module: str) -> None:
    runner = doctest.DocTestRunner()
    report = io.StringIO()
    for test in examples(module):
        runner.run(test, out=report.write)
    assert runner.tries > 0, f"no example of {module} ran"
    assert runner.failures == 0, report.getvalue()
