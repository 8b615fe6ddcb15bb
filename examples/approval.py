"""A run pauses for a person's answer, its process is killed while it waits, and a new process
resumes it with the answer typed on the terminal: nothing done before the question is done again.

    Draft >> Approve >> Send

`Draft` writes an announcement and saves it (an effect: once per run), `Approve` asks whether to
send it (`ctx.ask`: the run pauses, `forward` raises `soma.Paused`), `Send` sends it (an effect).
The script runs the graph in a first process, which waits for the answer on the terminal and is
killed (SIGKILL) while it waits — a deploy, say: the run, paused, held nothing in it. A second
process reads the open question from the journal, asks it on the terminal, and resumes the run
with the answer: `Draft` is not called again, and the draft is not saved twice.

    .venv/bin/python examples/approval.py          # type yes or no when asked

Each step can be run alone too: `approval.py start JOURNAL` runs the graph until it pauses,
`approval.py resume JOURNAL` answers and resumes it. With nothing to read on stdin the run stays
paused, and `python -m soma.runs --journal JOURNAL list` shows it so.
"""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import soma

RUN = "announcement-1"
SUBSCRIBERS = ["ada@example.com", "grace@example.com", "edsger@example.com"]


def save_draft(text: str) -> str:
    print(f"  saving the draft: {text!r}", flush=True)
    return "draft-1"


def send(text: str, to: list[str]) -> int:
    print(f"  sending to {len(to)} subscribers", flush=True)
    return len(to)


class Draft(soma.Node):
    def forward(self, version: str, ctx: soma.Ctx) -> str:
        print("draft: called", flush=True)
        text = f"Soma {version} is out."
        ctx.effect(save_draft, text)
        return text


class Approve(soma.Node):
    def forward(self, text: str, ctx: soma.Ctx) -> str | None:
        print("approve: called", flush=True)
        answer = ctx.ask(f"send {text!r} to {len(SUBSCRIBERS)} subscribers? (yes/no)")
        return text if str(answer).strip().lower() == "yes" else None


class Send(soma.Node):
    def forward(self, text: str | None, ctx: soma.Ctx) -> str:
        print("send: called", flush=True)
        if text is None:
            return "not sent"
        sent = ctx.effect(send, text, SUBSCRIBERS)
        return f"sent to {sent} subscribers"


GRAPH = soma.Graph.somatize(Draft() >> Approve() >> Send())


def start(journal: soma.Journal) -> None:
    """Runs the graph until it pauses, then waits for the answer on the terminal."""
    try:
        GRAPH.forward("2.0", run=RUN, journal=journal)
    except soma.Paused as paused:
        for path, question in paused.questions.items():
            print(f"paused at {path}: {question}", flush=True)
    print("waiting for an answer...", flush=True)
    answer = sys.stdin.readline()  # Killed here, before anyone answers.
    print(f"answered {answer.strip()!r} in the first process", flush=True)


def resume(journal: soma.Journal) -> None:
    """Asks the run's open question on the terminal and resumes it with the answer."""
    record = journal.run(RUN)
    print(f"the journal holds run {record.id}: {record.status}", flush=True)
    answers = {}
    for path, question in record.questions.items():
        print(f"{path} asks: {question}", flush=True)
        print("answer: ", end="", flush=True)
        answer = sys.stdin.readline()
        if not answer:  # Nothing to read: the run stays paused, to be answered later.
            print("\nno answer typed: the run stays paused", flush=True)
            return
        if not sys.stdin.isatty():
            print(answer.strip(), flush=True)  # What was typed, shown as a terminal would.
        answers[path] = answer.strip()
    print(f"result: {GRAPH.resume(RUN, journal=journal, answers=answers)}", flush=True)


def demo() -> int:
    journal = Path(tempfile.mkdtemp(prefix="approval-")) / "runs.db"
    me = [sys.executable, os.path.abspath(__file__)]
    print("-- the first process runs the graph until it pauses", flush=True)
    first = subprocess.Popen(
        [*me, "start", str(journal)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert first.stdout is not None
    for line in first.stdout:
        print(f"   {line}", end="", flush=True)
        if line.startswith("waiting"):
            break
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=60)
    killed = signal.Signals(-first.returncode).name
    print(f"-- the first process is killed while it waits ({killed})", flush=True)
    print("-- a new process resumes the run", flush=True)
    second = subprocess.run([*me, "resume", str(journal)], timeout=60, check=False)
    return second.returncode


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] in ("start", "resume"):
        journal = soma.Journal(sys.argv[2])
        (start if sys.argv[1] == "start" else resume)(journal)
        journal.close()
        return 0
    return demo()


if __name__ == "__main__":
    sys.exit(main())
