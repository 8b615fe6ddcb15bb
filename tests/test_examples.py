"""Every example in examples/ runs to the end, as a user would run it: its own process, exit 0.

Each runs in a scratch directory, so what an example writes (`traced.py` writes `run.json`)
stays out of the repository. `awaiting.py` also exits non-zero if its two branches' waits did
not overlap: its driver sends a batch only once the other branch's is there too. `approval.py`
runs with nothing on stdin (its run stays paused), and again with an answer fed to it. An
example that imports torch is skipped where torch is not installed (`make test-torch` installs
it); one that imports Ray (`two_hosts.py`, which starts its own local cluster) where Ray is not.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import blocks

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_RAY = importlib.util.find_spec("ray") is not None


def needs_torch(example: Path) -> bool:
    return "\nimport torch\n" in example.read_text()


def needs_ray(example: Path) -> bool:
    return "\nimport ray\n" in example.read_text()


def runnable(example: Path) -> object:
    """The example, skipped where it needs torch or Ray and that is not installed."""
    marks = [
        pytest.mark.skipif(
            needs_torch(example) and not HAS_TORCH,
            reason="needs torch: `make test-torch` installs it",
        ),
        pytest.mark.skipif(
            needs_ray(example) and not HAS_RAY,
            reason="needs Ray: `make test` installs it (constraints.txt)",
        ),
    ]
    return pytest.param(example, id=example.name, marks=marks)


def test_there_are_examples() -> None:
    assert {"quickstart.py", "branches.py", "awaiting.py"} <= {path.name for path in EXAMPLES}


@pytest.mark.parametrize("example", [runnable(example) for example in EXAMPLES])
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


def test_the_awaiting_examples_driver_fails_a_run_whose_waits_do_not_overlap() -> None:
    # What makes `awaiting.py` exit non-zero: a batch that reaches its driver alone.
    spec = importlib.util.spec_from_file_location("awaiting", EXAMPLES[0].parent / "awaiting.py")
    assert spec is not None
    assert spec.loader is not None
    awaiting = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(awaiting)
    network = awaiting.SlowNetwork(deadline=0.05)
    with pytest.raises(awaiting.NotOverlapped, match="did not overlap"):
        network.perform([("users", "ada")])
    assert network.round_trips == 0


def test_quickstart_is_the_readme_example_and_prints_what_the_readme_shows(tmp_path: Path) -> None:
    example = next(path for path in EXAMPLES if path.name == "quickstart.py")
    readme = blocks(example.parent.parent / "README.md")[0]  # "An example", the README's first.
    assert readme.prints is not None, "the README's example says what it prints"
    assert readme.source in example.read_text(), "quickstart.py holds the README's code"
    run = subprocess.run(
        [sys.executable, str(example)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    assert run.stdout == readme.prints


def test_the_http_fan_out_example_has_every_request_in_flight_at_once(tmp_path: Path) -> None:
    example = next(path for path in EXAMPLES if path.name == "fan_out_http.py")
    run = subprocess.run(
        [sys.executable, str(example)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    assert run.stdout.splitlines()[1:] == [
        "warmest: cairo at 25 C of 8 cities",
        "requests in flight at once: 8 of 8",
        "day 1: warmest: cairo at 26 C of 8 cities",
        "day 2: warmest: cairo at 27 C of 8 cities",
        "from forward: warmest: cairo at 28 C of 8 cities",
    ]


CHUNKS_PRINTS = """\
Sequence
├── split <- (input)
├── Map chunks <- split, each item:
│   └── Switch chunks/route <- (input), the case it names:
│       ├── case heading: Empty
│       ├── case code: chunks/route/code/measure <- (input)
│       └── case prose: chunks/route/prose/summarize <- (input)
└── report <- chunks
1. # Soma
2. prose: Soma runs a graph ...
3. code, 2 lines
4. prose: A step can decide ...
summarize: 4 attempts, 2 retried
"""


def test_the_chunks_example_routes_each_chunk_by_kind_and_retries_the_flaky_step(
    tmp_path: Path,
) -> None:
    example = next(path for path in EXAMPLES if path.name == "chunks.py")
    run = subprocess.run(
        [sys.executable, str(example)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    assert run.stdout == CHUNKS_PRINTS


APPROVAL_PRINTS = """\
-- the first process runs the graph until it pauses
   draft: called
     saving the draft: 'Soma 2.0 is out.'
   approve: called
   paused at approve: send 'Soma 2.0 is out.' to 3 subscribers? (yes/no)
   waiting for an answer...
-- the first process is killed while it waits (SIGKILL)
-- a new process resumes the run
the journal holds run announcement-1: paused
approve asks: send 'Soma 2.0 is out.' to 3 subscribers? (yes/no)
answer: {answer}
approve: called
send: called
{sent}"""


@pytest.mark.parametrize(
    ("answer", "sent"),
    [
        ("yes", "  sending to 3 subscribers\nresult: sent to 3 subscribers\n"),
        ("no", "result: not sent\n"),
    ],
)
def test_the_approval_example_resumes_a_killed_paused_run_with_the_answer_typed_in_a_new_process(
    answer: str, sent: str, tmp_path: Path
) -> None:
    # The example runs the graph in a child process that pauses and is killed while it waits,
    # then resumes it in another that reads the answer from stdin: the draft is written and
    # saved once, in the first process; the second calls only the asking node and what follows.
    example = next(path for path in EXAMPLES if path.name == "approval.py")
    run = subprocess.run(
        [sys.executable, str(example)],
        cwd=tmp_path,
        input=f"{answer}\n",
        capture_output=True,
        text=True,
        timeout=100,
        check=True,
    )
    assert run.stdout == APPROVAL_PRINTS.format(answer=answer, sent=sent)
