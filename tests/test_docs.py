"""The documentation runs: every ```python block of README.md and of every page under docs/
(the site's pages, `make docs`), each on its own.

Each block is executed in a fresh namespace, compiled under its file's name and padded to its
line, so a failure's traceback points into the Markdown itself (`docs/streams.md:123`). A block
followed by a paragraph saying `prints` and a ```text block must print exactly that text.

A block that imports torch is run by ``make test-torch`` (``tests/with_torch/test_torch_docs.py``),
which installs torch, and skipped here: run in this process, it would leave torch loaded for the
tests after it, which expect what a process without torch does.

Every fence is read strictly first: a block opens with a labelled fence (```python, ```text)
and closes with a bare one. A stray fence would otherwise pair with the next one and turn prose
into a block and a ```python block into prose, which then runs nowhere without a word.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every page of the site, wherever it stands under docs/: a page added is run unasked.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(\s*)```(.*)$")
LABEL = re.compile(r"^\w+$")


def fences(lines: list[str]) -> tuple[list[tuple[str, int, int, str]], list[str]]:
    """The fenced blocks of a Markdown file's lines, as (language, first code line, end line,
    text), and what is wrong with its fences, each as `line N: what`.

    A fence outside a block must open one and name its language; inside a block, the next fence
    must be a bare one that closes it. A fence indented, or never closed, is wrong too.
    """
    fenced: list[tuple[str, int, int, str]] = []
    problems: list[str] = []
    opened: tuple[str, int] | None = None  # language, line of the opening fence (0-based)
    for at, line in enumerate(lines):
        fence = FENCE.match(line)
        if fence is None:
            continue
        indent, label = fence.group(1), fence.group(2).strip()
        if indent:
            problems.append(f"line {at + 1}: an indented fence, which this check does not read")
        if opened is None:
            if not LABEL.match(label):
                problems.append(
                    f"line {at + 1}: a fence that opens a block without naming its language "
                    "(a stray closing fence, or an opening one without ```python, ```text)"
                )
            opened = (label, at)
        elif label:
            problems.append(
                f"line {at + 1}: a fence labelled `{label}` inside the block opened at line "
                f"{opened[1] + 1}, which is not closed before it"
            )
            opened = (label, at)
        else:
            language, start = opened
            fenced.append((language, start + 2, at + 1, "\n".join(lines[start + 1 : at]) + "\n"))
            opened = None
    if opened is not None:
        problems.append(f"line {opened[1] + 1}: a block that never closes")
    return fenced, problems


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
    fenced, _ = fences(lines)  # What is wrong with them is the fence test's to say.
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


def needs_torch(block: Block) -> bool:
    return "\nimport torch\n" in f"\n{block.source}"


def runnable(block: Block) -> object:
    """The block, skipped if it needs torch: ``make test-torch`` runs it."""
    mark = pytest.mark.skipif(needs_torch(block), reason="needs torch: `make test-torch` runs it")
    return pytest.param(block, id=block.where, marks=[mark])


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_fence_of_a_document_is_labelled_and_closed(path: Path) -> None:
    _, problems = fences(path.read_text().splitlines())
    assert problems == [], f"{path.relative_to(ROOT)}: " + "; ".join(problems)


def test_the_fence_check_catches_a_stray_unlabelled_or_unclosed_fence() -> None:
    good = ["```python", "x = 1", "```", "prints", "```text", "1", "```"]
    assert fences(good) == (
        [("python", 2, 3, "x = 1\n"), ("text", 6, 7, "1\n")],
        [],
    )
    # The guide's old shape: a python block missing its opening fence, then a stray closing
    # fence that pairs with the next block's opening one and swallows the block after it.
    stray = ["prose", "x = 1", "```", "more prose", "```python", "y = 2", "```"]
    _, problems = fences(stray)
    assert problems == [
        "line 3: a fence that opens a block without naming its language (a stray closing "
        "fence, or an opening one without ```python, ```text)",
        "line 5: a fence labelled `python` inside the block opened at line 3, which is not "
        "closed before it",
    ]
    _, problems = fences(["```", "x = 1", "```"])
    assert problems[0].startswith("line 1: a fence that opens a block without naming")
    _, problems = fences(["```python", "x = 1"])
    assert problems == ["line 1: a block that never closes"]
    _, problems = fences(["- a list", "  ```python", "  x = 1", "  ```"])
    assert problems[0] == "line 2: an indented fence, which this check does not read"


def test_the_documents_have_python_blocks() -> None:
    documents = {block.path.name for block in BLOCKS}
    # The README, the guide's first page and its last, and the page of failures.
    assert {"README.md", "getting-started.md", "hosts.md", "when-things-go-wrong.md"} <= documents
    assert len(BLOCKS) >= 57, len(BLOCKS)  # As many as the one guide.md held before its split.


@pytest.mark.parametrize("block", [runnable(block) for block in BLOCKS])
def test_a_python_block_runs(
    block: Block,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    run_block(block, capsys, monkeypatch, tmp_path)


def run_block(
    block: Block,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Runs ``block`` in a fresh namespace from ``tmp_path``, and checks what it prints."""
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
