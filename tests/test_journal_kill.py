"""Runs that survive a killed process (issue 45): a run is recorded by one process, SIGKILLed at
a node (or paused), its module perhaps edited, and resumed by a fresh process, which calls
exactly what was not recorded (and what an edit changed) and returns what an uninterrupted run
returns; two processes never run one run at once, and a dead holder's lease lapses.

Every run here happens in a child process under a deadline, from a module file the test writes
as a user would: nodes count their calls by appending a line to a file (the only record that
survives a SIGKILL), and a node kills its own process when an environment variable names it.
Rendezvous between processes are files, each waited for under ``DEADLINE``.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import soma
from conftest import DEADLINE, SUBPROCESS_DEADLINE, run_script
from soma.errors import RunHeldError
from test_properties import Dag, dags, expected_run

#: The module the children import: nodes as users write them, each noting its call in CALLS_FILE
#: (read inside ``forward``, so that no environment goes into a node's key) and killing its own
#: process when KILL_AT names it.
FLOW = '''
import json
import os
import signal
import sys
import time

import soma


def note(node):
    with open(os.environ["CALLS_FILE"], "a") as calls:
        calls.write(node + "\\n")


def wait_for(name):
    """Waits for the file ``name`` in the test's folder: a rendezvous with the test."""
    path = os.path.join(os.environ["MEET_DIR"], name)
    deadline = time.monotonic() + float(os.environ["MEET_DEADLINE"])
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody made {name}")
        time.sleep(0.01)


def wait_recorded(count):
    """Waits until run ``r`` has ``count`` nodes recorded (written every few milliseconds)."""
    journal = soma.Journal(os.environ["JOURNAL"])
    deadline = time.monotonic() + float(os.environ["MEET_DEADLINE"])
    while len(journal.nodes("r")) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"never {count} nodes recorded")
        time.sleep(0.01)


class Tag(soma.Node):
    """Returns (its id, what it read), a fan-in as its ordered items, after noting its call."""

    def forward(self, x, ctx):
        note(ctx.node)
        if ctx.node in (os.environ.get("KILL_AT"), os.environ.get("HOLD_AT")):
            # Where the test says so, what ran before is written first (every few ms).
            wait_recorded(int(os.environ.get("RECORDED_FIRST", "0")))
        if os.environ.get("KILL_AT") == ctx.node:
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get("HOLD_AT") == ctx.node:
            open(os.path.join(os.environ["MEET_DIR"], "inside"), "w").close()
            wait_for("release")
        if isinstance(x, dict):
            return (ctx.node, list(x.items()))
        return (ctx.node, x)


def dag_graph(nodes, edges):
    g = soma.Graph()
    for node in nodes:
        g.node(node, Tag())
    for src, dst in edges:
        g.edge(src, dst)
    return g


def main(graph, how, x=None):
    journal = soma.Journal(os.environ["JOURNAL"], lease=float(os.environ.get("LEASE", "30")))
    try:
        if how == "forward":
            out = graph.forward(x, run="r", journal=journal)
        else:
            answers = json.loads(os.environ.get("ANSWERS", "null"))
            out = graph.resume("r", journal=journal, answers=answers)
    except soma.Paused as paused:
        print(json.dumps({"paused": paused.questions}))
        return
    except soma.errors.RunHeldError as held:
        print(json.dumps({"held": held.holder}))
        return
    print(json.dumps({"out": repr(out)}))
'''


class Flow:
    """A folder with the module, a journal, a calls file, and the children that use them."""

    def __init__(self, folder: Path, module: str = FLOW, graph: str = "") -> None:
        self.folder = folder
        self.journal = folder / "runs.db"
        self.calls = folder / "calls.txt"
        self.module = folder / "flow.py"
        self.module.write_text(module + textwrap.dedent(graph))

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "CALLS_FILE": str(self.calls),
            "JOURNAL": str(self.journal),
            "MEET_DIR": str(self.folder),
            "MEET_DEADLINE": str(DEADLINE),
            **extra,
        }

    def script(self, call: str) -> str:
        return f"import sys; sys.path.insert(0, {str(self.folder)!r}); import flow; {call}"

    def run(self, call: str, **env: str) -> subprocess.CompletedProcess[str]:
        """Runs ``call`` in a fresh process, under the suite's deadline."""
        saved = dict(os.environ)
        os.environ.update(self.env(**env))
        try:
            return run_script(self.script(call))
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start(self, call: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", self.script(call)],
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def taken_calls(self) -> list[str]:
        """The calls noted since the last look, emptied."""
        if not self.calls.exists():
            return []
        noted = self.calls.read_text().splitlines()
        self.calls.unlink()
        return noted

    def recorded(self) -> list[str]:
        journal = soma.Journal(self.journal)
        try:
            return [node for node, _, _ in journal.nodes("r")]
        finally:
            journal.close()

    def wait_for(self, name: str) -> None:
        deadline = time.monotonic() + SUBPROCESS_DEADLINE
        while not (self.folder / name).exists():
            if time.monotonic() > deadline:
                pytest.fail(f"the child never made {name}")
            time.sleep(0.01)

    def wait_abandoned(self) -> None:
        """Waits for run ``r``'s lease to lapse: ``soma.runs`` reads it ``abandoned``."""
        journal = soma.Journal(self.journal)
        try:
            deadline = time.monotonic() + DEADLINE
            while journal.run("r").status != "abandoned":
                if time.monotonic() > deadline:
                    pytest.fail(f"run `r` never read abandoned: {journal.run('r')}")
                time.sleep(0.02)
        finally:
            journal.close()


def output(ran: subprocess.CompletedProcess[str]) -> Any:
    """What the child's run returned (a dict compares without its order, as a result does)."""
    return ast.literal_eval(answer(ran)["out"])


def answer(ran: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines, ran.stderr
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def killed(ran: subprocess.CompletedProcess[str]) -> None:
    assert ran.returncode == -signal.SIGKILL, (ran.returncode, ran.stdout, ran.stderr)


CHAIN_NODES = ["a", "b", "c", "d", "e", "f"]
# a >> (b | c) >> d >> e >> f, as edges.
CHAIN = Dag(CHAIN_NODES, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e"), ("e", "f")])


def dag_call(dag: Dag, how: str) -> str:
    return f"flow.main(flow.dag_graph({dag.nodes!r}, {dag.edges!r}), {how!r}, 7)"


# ---------------------------------------------------------------------------------------------
# Killed, then resumed


#: Where a chain's run is killed, and how many nodes are recorded by then (what ran before).
KILLS = [("b", 1), ("d", 3), ("f", 5)]


@pytest.mark.parametrize(("kill_at", "before"), KILLS)
def test_a_run_killed_at_a_node_resumes_in_a_fresh_process_to_the_uninterrupted_result(
    tmp_path: Path, kill_at: str, before: int
) -> None:
    flow = Flow(tmp_path)
    killed(
        flow.run(
            dag_call(CHAIN, "forward"), KILL_AT=kill_at, RECORDED_FIRST=str(before), LEASE="0.5"
        )
    )
    flow.wait_abandoned()
    resumed = output(flow.run(dag_call(CHAIN, "resume"), LEASE="0.5"))
    assert resumed == expected_run(CHAIN, 7)


@pytest.mark.parametrize(("kill_at", "before"), KILLS)
def test_a_run_killed_at_a_node_resumed_calls_exactly_the_nodes_not_recorded(
    tmp_path: Path, kill_at: str, before: int
) -> None:
    flow = Flow(tmp_path)
    killed(
        flow.run(
            dag_call(CHAIN, "forward"), KILL_AT=kill_at, RECORDED_FIRST=str(before), LEASE="0.5"
        )
    )
    assert kill_at in flow.taken_calls()
    recorded = flow.recorded()
    assert len(recorded) >= before
    assert kill_at not in recorded
    flow.wait_abandoned()
    answer(flow.run(dag_call(CHAIN, "resume"), LEASE="0.5"))
    assert Counter(flow.taken_calls()) == Counter(CHAIN_NODES) - Counter(recorded)


# Each example runs two processes and waits out a lease: a few examples, and no shrinking (a
# failure prints its example and blob to replay, unshrunk).
@settings(max_examples=6, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(dag=dags(max_nodes=8).filter(lambda dag: len(dag.nodes) > 0), pick=st.integers(0, 1 << 16))
def test_a_random_graph_killed_at_a_random_node_resumes_to_the_uninterrupted_result(
    dag: Dag, pick: int
) -> None:
    with tempfile.TemporaryDirectory(prefix="soma-journal-kill-") as folder:
        flow = Flow(Path(folder))
        kill_at = dag.nodes[pick % len(dag.nodes)]
        killed(flow.run(dag_call(dag, "forward"), KILL_AT=kill_at, LEASE="0.3"))
        recorded = flow.recorded()
        flow.taken_calls()
        flow.wait_abandoned()
        resumed = output(flow.run(dag_call(dag, "resume"), LEASE="0.3"))
        assert resumed == expected_run(dag, 7)
        assert Counter(flow.taken_calls()) == Counter(dag.nodes) - Counter(recorded)


# ---------------------------------------------------------------------------------------------
# An effect, then a kill

EFFECT = """
import random


class Draw(soma.Node):
    \"\"\"Returns a number it draws: another on each call, as a model's sample is.\"\"\"

    def forward(self, x, ctx):
        note(ctx.node)
        return (x, random.random())


class Charge(soma.Node):
    \"\"\"Charges a card once per run (the charge noted in a file), then the process dies.\"\"\"

    def forward(self, x, ctx):
        note(ctx.node)
        receipt = ctx.effect(charge, x)
        if os.environ.get("KILL_AT") == ctx.node:
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt


def charge(x):
    note("charged")
    return ("receipt", x)


graph = soma.Graph.somatize(Draw().named("draw") >> Charge().named("charge"))
"""


def test_an_effect_made_just_before_a_kill_is_not_made_again_when_what_fed_it_ran_again(
    tmp_path: Path,
) -> None:
    flow = Flow(tmp_path, graph=EFFECT)
    killed(flow.run("flow.main(flow.graph, 'forward', 1)", KILL_AT="charge", LEASE="0.3"))
    assert flow.taken_calls() == ["draw", "charge", "charged"]
    # `draw`'s sample is written with the effect: were it lost and drawn again, `charge` would
    # read another input, be another call, and charge the card again.
    assert "draw" in flow.recorded()
    flow.wait_abandoned()
    resumed = output(flow.run("flow.main(flow.graph, 'resume')", LEASE="0.3"))
    assert flow.taken_calls() == ["charge"]
    assert resumed[0] == "receipt"


# ---------------------------------------------------------------------------------------------
# An edited node

EDITED = """
class Ask(soma.Node):
    def forward(self, x, ctx):
        note(ctx.node)
        if os.environ.get("KILL_AT") == ctx.node:
            wait_recorded(4)  # What ran before is written: the edit is all that reruns.
            os.kill(os.getpid(), signal.SIGKILL)
        return (x, ctx.ask("ship it?"))


class Scale(soma.Node):
    def forward(self, x, ctx):
        note(ctx.node)
        return x * FACTOR


class Plus(soma.Node):
    def __init__(self, k):
        self.k = k

    def forward(self, x, ctx):
        note(ctx.node)
        if isinstance(x, dict):
            return sum(x.values()) + self.k
        return x + self.k


FACTOR = 2

# a >> (b >> c | e) >> d: b is edited, e is beside it.
graph = soma.Graph.somatize(
    Plus(1).named("a")
    >> (Scale().named("b") >> Plus(10).named("c") | Plus(100).named("e"))
    >> Ask().named("d")
)
"""


@pytest.mark.parametrize("stop", ["pause", "kill"])
def test_an_edited_node_and_what_depends_on_it_rerun_on_resume_and_nothing_else(
    tmp_path: Path, stop: str
) -> None:
    flow = Flow(tmp_path, graph=EDITED)
    if stop == "pause":
        first = answer(flow.run("flow.main(flow.graph, 'forward', 1)", LEASE="0.5"))
        assert first == {"paused": {"d": "ship it?"}}
    else:
        killed(flow.run("flow.main(flow.graph, 'forward', 1)", KILL_AT="d", LEASE="0.5"))
        flow.wait_abandoned()
    assert sorted(flow.taken_calls()) == ["a", "b", "c", "d", "e"]
    flow.module.write_text(flow.module.read_text().replace("FACTOR = 2", "FACTOR = 3"))
    # `d` reads another input now: a question of its call on the old one is not its own (an
    # answer belongs to the input it was asked about), so it asks again, at its own path: the
    # question of the old call, which no node asks now, is no longer open.
    again = flow.run("flow.main(flow.graph, 'resume')", LEASE="0.5")
    assert answer(again) == {"paused": {"d": "ship it?"}}
    assert sorted(flow.taken_calls()) == ["b", "c", "d"]
    resumed = flow.run(
        "flow.main(flow.graph, 'resume')", ANSWERS=json.dumps({"d": "yes"}), LEASE="0.5"
    )
    assert flow.taken_calls() == ["d"]
    # a = 2; b = 6; c = 16; e = 102; d reads {c: 16, e: 102}.
    assert output(resumed) == ({"c": 16, "e": 102}, "yes")


# ---------------------------------------------------------------------------------------------
# Leases between processes


def failed_run(flow: Flow) -> None:
    """Run ``r`` of ``CHAIN`` recorded up to ``d``, which a killed process left unfinished."""
    killed(flow.run(dag_call(CHAIN, "forward"), KILL_AT="d", RECORDED_FIRST="3", LEASE="0.3"))
    flow.wait_abandoned()
    flow.taken_calls()


def test_of_two_processes_resuming_one_run_at_once_one_runs_and_the_other_is_told_its_holder(
    tmp_path: Path,
) -> None:
    flow = Flow(tmp_path)
    failed_run(flow)
    holder = flow.start(dag_call(CHAIN, "resume"), HOLD_AT="e")
    try:
        flow.wait_for("inside")  # The first resume is running, in `e`.
        second = answer(flow.run(dag_call(CHAIN, "resume")))
        (tmp_path / "release").touch()
        out, err = holder.communicate(timeout=SUBPROCESS_DEADLINE)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
    assert holder.returncode == 0, err
    assert f"pid {holder.pid} " in second["held"]
    assert ast.literal_eval(json.loads(out.splitlines()[-1])["out"]) == expected_run(CHAIN, 7)
    assert Counter(flow.taken_calls()) == Counter(["d", "e", "f"])


def test_a_killed_holders_run_reads_abandoned_then_is_taken_over_once_its_lease_lapses(
    tmp_path: Path,
) -> None:
    flow = Flow(tmp_path)
    holder = flow.start(dag_call(CHAIN, "forward"), HOLD_AT="d", RECORDED_FIRST="3", LEASE="0.5")
    try:
        flow.wait_for("inside")
        journal = soma.Journal(flow.journal, lease=0.5)
        with pytest.raises(RunHeldError):  # Held while its holder lives.
            soma.Graph().resume("r", journal=journal)
        holder.send_signal(signal.SIGKILL)
        holder.communicate(timeout=SUBPROCESS_DEADLINE)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.communicate()
    flow.wait_abandoned()
    assert [run.status for run in soma.runs(journal)] == ["abandoned"]
    flow.taken_calls()
    resumed = output(flow.run(dag_call(CHAIN, "resume"), LEASE="0.5"))
    assert resumed == expected_run(CHAIN, 7)
    assert sorted(flow.taken_calls()) == ["d", "e", "f"]
    assert [run.status for run in soma.runs(journal)] == ["finished"]
    journal.close()


def test_a_killed_holder_on_this_machine_lets_a_new_process_take_its_run_up_at_once(
    tmp_path: Path,
) -> None:
    flow = Flow(tmp_path)
    # An hour's lease: only the holder's end, seen on this machine, lets the run be taken.
    killed(flow.run(dag_call(CHAIN, "forward"), KILL_AT="d", RECORDED_FIRST="3", LEASE="3600"))
    journal = soma.Journal(flow.journal)
    assert [run.status for run in soma.runs(journal)] == ["abandoned"]
    flow.taken_calls()
    resumed = output(flow.run(dag_call(CHAIN, "resume"), LEASE="3600"))
    assert resumed == expected_run(CHAIN, 7)
    assert sorted(flow.taken_calls()) == ["d", "e", "f"]
    journal.close()
