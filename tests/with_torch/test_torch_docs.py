"""With torch: the docs' blocks that import torch run, and the training example trains,
saves, and evaluates in a fresh process what the trainer evaluated.

``tests/test_docs.py`` leaves these blocks to this file, and ``tests/test_examples.py`` runs
the example too where torch is installed.

Run by ``make test-torch``, which installs torch; left out of ``make test``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import BLOCKS, Block, needs_torch, run_block

ROOT = Path(__file__).resolve().parent.parent.parent
TORCH_BLOCKS = [block for block in BLOCKS if needs_torch(block)]


def test_the_guide_has_blocks_that_need_torch() -> None:
    assert len([block for block in TORCH_BLOCKS if block.path.name == "graph-as-a-model.md"]) >= 4


@pytest.mark.parametrize("block", TORCH_BLOCKS, ids=lambda block: block.where)
def test_a_python_block_that_imports_torch_runs(
    block: Block,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    run_block(block, capsys, monkeypatch, tmp_path)


def test_the_training_example_evaluates_in_a_fresh_process_what_it_trained(
    tmp_path: Path,
) -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torch_training.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    trained = next(line for line in lines if line.startswith("held out, after training: "))
    fresh = next(line for line in lines if line.startswith("a fresh process, weights loaded: "))
    assert trained.split(": ", 1)[1] == fresh.split(": ", 1)[1]
    first, last = (float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("step "))
    assert last < first / 4  # it learned
    assert "saved 8 tensors: encoder.0.weight, encoder.0.bias, classifier.0.weight, ..." in lines
