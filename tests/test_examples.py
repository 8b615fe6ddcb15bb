"""Every example in examples/ runs to the end, as a user would run it: its own process, exit 0.

Each runs in a scratch directory, so what an example writes (`traced.py` writes `run.json`)
stays out of the repository. `awaiting.py` also exits non-zero if its two branches' waits did
not overlap.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


def test_there_are_examples() -> None:
    assert {"quickstart.py", "branches.py", "awaiting.py"} <= {path.name for path in EXAMPLES}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_an_example_runs(example: Path, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, str(example)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert run.returncode == 0, f"{example.name} exited {run.returncode}:\n{run.stdout}{run.stderr}"
    assert run.stdout, f"{example.name} printed nothing"
