"""The documentation runs: every ```python block of README.md and docs/*.md, each on its own.

Each block is executed in a fresh namespace, compiled under its file's name and padded to its
line, so a failure's traceback points into the Markdown itself (`docs/guide.md:123`). A block
followed by a paragraph saying `prints` and a ```text block must print exactly that text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first line of code
    source: str
    prints: str | None  # the ```text block that follows "prints", if any

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, as (language, first code line, text), in order;
    then the python ones, each with what it is said to print."""
    lines = path.read_text().splitlines()
    fenced: list[tuple[str, int, int, str]] = []  # language, first line, end line, text
    at = 0
    while at < len(lines):
        opening = FENCE.match(lines[at])
        if opening is None:
            at += 1
            continue
        end = next(
            (i for i in range(at + 1, len(lines)) if lines[i].rstrip() == "```"),
            None,
        )
        if end is None:
            raise AssertionError(f"{path.relative_to(ROOT)}:{at + 1}: a block that never closes")
        fenced.append((opening.group(1), at + 2, end + 1, "\n".join(lines[at + 1 : end]) + "\n"))
        at = end + 1
    found = []
    for index, (language, first, end, text) in enumerate(fenced):
        if language != "python":
            continue
        prints = None
        if index + 1 < len(fenced):
            next_language, next_first, _, next_text = fenced[index + 1]
            between = [line.strip() for line in lines[end : next_first - 2] if line.strip()]
            if next_language == "text" and between == ["prints"]:
                prints = next_text
        found.append(Block(path, first, text, prints))
    return found


BLOCKS = [block for path in DOCUMENTS for block in blocks(path)]


def test_the_documents_have_python_blocks() -> None:
    documents = {block.path.name for block in BLOCKS}
    assert {"README.md", "guide.md"} <= documents, documents


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.where)
def test_a_python_block_runs(
    block: Block,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)  # Whatever a block writes lands outside the repository.
    # Padded to its line and compiled under the file's name: tracebacks point into the Markdown.
    code = compile("\n" * (block.line - 1) + block.source, str(block.path), "exec")
    try:
        exec(code, {"__name__": "__main__"})
    except BaseException as error:
        error.add_note(f"in the python block at {block.where}")
        raise
    if block.prints is not None:
        assert capsys.readouterr().out == block.prints, f"what the block at {block.where} prints"
