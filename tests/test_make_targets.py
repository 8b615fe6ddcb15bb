"""What ``make`` installs for each target: ``make demo`` only what the demo runs (maturin to
build the extension, and the package), ``make test`` and ``make lint`` the whole toolchain.
Read from ``make -n`` (what it would run) into a virtual environment that does not exist yet, so
nothing is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def planned(target: str, venv: Path) -> str:
    """The commands ``make target`` would run for a fresh ``venv``."""
    return subprocess.run(
        ["make", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_make_demo_installs_maturin_and_the_package_and_none_of_the_tools(tmp_path: Path) -> None:
    commands = planned("demo", tmp_path / "venv")
    assert "-r constraints.txt" not in commands
    assert "install --quiet maturin -c constraints.txt" in commands
    assert "maturin develop" in commands
    assert "examples/quickstart.py" in commands


def test_make_lint_and_test_python_install_the_whole_toolchain(tmp_path: Path) -> None:
    for target in ("lint", "test-python"):
        commands = planned(target, tmp_path / "venv")
        assert "-r constraints.txt" in commands, target
