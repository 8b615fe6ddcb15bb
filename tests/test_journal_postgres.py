"""A journal in PostgreSQL (``soma.Journal("postgresql://...")``) keeps its promises against a
real server: the one ``tests/_postgres.py`` starts for the session (Debian's, on 127.0.0.1), a
fresh database for each test.

What a journal shared by processes is for is seen across processes: a run begun in one child is
killed (SIGKILL) and resumed in another, paused in one and answered in another, taken up by two
at once. Children are fresh interpreters with a deadline (``run_script``); the one that must be
cut off or held at a point says so on its stdout ("holding") and waits for a line on its stdin —
a rendezvous, never a sleep. The only waits are for a lease to lapse, which is what a lease is.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

import soma
from conftest import DEADLINE, SUBPROCESS_DEADLINE, Add, Meet, _note_panics, run_script
from soma.errors import SignatureError

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: What every child runs first: the nodes, the journal and two graphs. A node notes each call of
#: it in the file CALLS (one line, appended), and its effect notes itself once more; the node
#: SOMA_TEST_HOLD names holds (`send` once its effect is recorded, and with it what finished
#: before it) until a line comes on stdin; `c` fails where SOMA_TEST_FAIL is set. The children
#: of one test build the same graphs from the same source, so their nodes' keys agree.
PRELUDE = textwrap.dedent(
    """
    import os, sys, time
    import soma
    from soma.errors import JournalError, RunHeldError

    URL = __URL__
    CALLS = __CALLS__

    def note(what):
        with open(CALLS, "a") as calls:
            calls.write(what + "\\n")
        return what

    def hold(node):
        if os.environ.get("SOMA_TEST_HOLD") == node:
            print("holding", flush=True)
            sys.stdin.readline()

    class Step(soma.Node):
        def forward(self, x, ctx):
            note(ctx.node)
            if ctx.node == "c" and os.environ.get("SOMA_TEST_FAIL"):
                raise ValueError("c failed")
            hold(ctx.node)
            return [*x, ctx.node]

    class Send(soma.Node):
        def forward(self, x, ctx):
            note(ctx.node)
            sent = ctx.effect(note, "effect " + ctx.node)
            hold(ctx.node)
            return [*x, sent]

    class Approve(soma.Node):
        def forward(self, x, ctx):
            note(ctx.node)
            answer = ctx.ask("approve " + ", ".join(x) + "?")
            return [*x, "answer " + answer]

    journal = soma.Journal(URL, lease=float(os.environ.get("SOMA_TEST_LEASE", "30")))
    steps = soma.Graph.somatize(
        Step().named("a") >> Step().named("b") >> Send().named("send") >> Step().named("c")
    )
    asking = soma.Graph.somatize(
        Step().named("a") >> Send().named("send") >> Approve().named("approve") >> Step().named("c")
    )
    """
)

#: Resumes run "r", waiting out the lease of a holder that no longer renews it: prints who held
#: it when first refused, then the run's output.
RESUME_ONCE_LAPSED = textwrap.dedent(
    """
    refused = False
    while True:
        try:
            out = steps.resume("r", journal=journal)
        except RunHeldError as held:
            if not refused:
                print("held by", held.holder, flush=True)
                refused = True
            time.sleep(max(0.0, held.until - time.time()) + 0.01)
        else:
            break
    print(out)
    """
)

#: Takes up run "r" (begins it, or resumes it after its failure) on a line from stdin, once the
#: journal is open: prints "ready" first, and "held by HOLDER" when refused.
TAKE_UP_ON_GO = textwrap.dedent(
    """
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        out = (
            steps.resume("r", journal=journal)
            if os.environ.get("SOMA_TEST_RESUME")
            else steps.forward([], run="r", journal=journal)
        )
    except RunHeldError as held:
        print("held by", held.holder, flush=True)
    else:
        print(out, flush=True)
    """
)


@pytest.fixture
def script(postgres_url: str, tmp_path: pathlib.Path) -> Callable[[str], str]:
    """A child's source: the prelude, for this test's database and calls file, then ``tail``."""
    prelude = PRELUDE.replace("__URL__", repr(postgres_url)).replace(
        "__CALLS__", repr(str(tmp_path / "calls"))
    )
    return lambda tail: prelude + textwrap.dedent(tail)


@pytest.fixture
def calls(tmp_path: pathlib.Path) -> Callable[[], list[str]]:
    """The nodes' calls and effects the children noted, in order."""

    def read() -> list[str]:
        path = tmp_path / "calls"
        return path.read_text().splitlines() if path.exists() else []

    return read


@contextlib.contextmanager
def child(source: str, **environment: str) -> Iterator[subprocess.Popen[str]]:
    """A child running ``source``, its stdin and stdout pipes to this test, killed if still
    running when the block ends or at ``SUBPROCESS_DEADLINE``."""
    started = subprocess.Popen(
        [sys.executable, "-c", source],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **environment},
    )
    killer = threading.Timer(SUBPROCESS_DEADLINE, started.kill)
    killer.start()
    try:
        yield started
    finally:
        killer.cancel()
        if started.poll() is None:
            started.kill()
        started.communicate()


def said(running: subprocess.Popen[str]) -> str:
    """The next line ``running`` printed; the test fails, with its stderr, if it ended first."""
    assert running.stdout is not None
    line = running.stdout.readline()
    if not line:
        running.kill()
        _, err = running.communicate()
        pytest.fail(f"the child ended without a word:\n{err}")
    return line.strip()


def tell(running: subprocess.Popen[str], line: str = "go") -> None:
    assert running.stdin is not None
    running.stdin.write(line + "\n")
    running.stdin.flush()


def finished(ran: subprocess.CompletedProcess[str]) -> str:
    """What a child printed, once it is seen to have exited well."""
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def kill_while_holding(source: str, **environment: str) -> int:
    """Runs ``source`` until it says "holding", kills it there (SIGKILL), and returns its pid."""
    with child(source, **environment) as running:
        assert said(running) == "holding"
        os.kill(running.pid, signal.SIGKILL)
        running.wait()
        assert running.returncode == -signal.SIGKILL
        return running.pid


def test_a_run_killed_mid_run_is_finished_by_another_process_calling_only_what_was_not_recorded(
    script: Callable[[str], str], calls: Callable[[], list[str]], postgres_url: str
) -> None:
    kill_while_holding(
        script('steps.forward([], run="r", journal=journal)'),
        SOMA_TEST_HOLD="send",
        SOMA_TEST_LEASE="1",
    )
    assert calls() == ["a", "b", "send", "effect send"]
    killed = soma.Journal(postgres_url).run("r")
    assert (killed.done, killed.nodes) == (2, 4)

    out = finished(run_script(script(RESUME_ONCE_LAPSED)))

    assert out.splitlines()[-1] == "['a', 'b', 'effect send', 'c']"
    # a and b were recorded: not called again; send's effect was recorded: its call runs again
    # (a frame is not kept) but the effect does not.
    assert calls() == ["a", "b", "send", "effect send", "send", "c"]
    resumed = soma.Journal(postgres_url).run("r")
    assert (resumed.status, resumed.done, resumed.holder) == ("finished", 4, None)


def held_elsewhere(url: str) -> None:
    """Marks run "r"'s holder a process of another machine, as one holding it from there is:
    this machine cannot see it gone, only its lease lapse."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("UPDATE runs SET holder_process = 'another-boot:1:4242:1'")


def test_a_killed_holder_of_another_machine_is_refused_naming_it_until_its_lease_lapses(
    script: Callable[[str], str], postgres_url: str
) -> None:
    killed = kill_while_holding(
        script('steps.forward([], run="r", journal=journal)'),
        SOMA_TEST_HOLD="send",
        # Long enough for the resumer to start and try within it on a loaded machine.
        SOMA_TEST_LEASE="5",
    )
    held_elsewhere(postgres_url)
    out = finished(run_script(script(RESUME_ONCE_LAPSED)))
    refusal, result = out.splitlines()[-2:]

    assert refusal.startswith("held by ")
    assert f" pid {killed} " in refusal
    assert result == "['a', 'b', 'effect send', 'c']"
    assert soma.Journal(postgres_url).run("r").status == "finished"


def test_a_killed_holder_of_this_machine_lets_its_run_be_taken_up_at_once(
    script: Callable[[str], str], postgres_url: str
) -> None:
    kill_while_holding(
        script('steps.forward([], run="r", journal=journal)'),
        SOMA_TEST_HOLD="send",
        SOMA_TEST_LEASE="3600",  # Never lapsing within the test: only the holder's end counts.
    )
    out = finished(run_script(script(RESUME_ONCE_LAPSED)))

    assert out.splitlines() == ["['a', 'b', 'effect send', 'c']"]  # Not refused once.
    assert soma.Journal(postgres_url).run("r").status == "finished"


def test_a_run_whose_holder_of_this_machine_died_lists_as_abandoned_at_once(
    script: Callable[[str], str], postgres_url: str
) -> None:
    killed = kill_while_holding(
        script('steps.forward([], run="r", journal=journal)'),
        SOMA_TEST_HOLD="send",
        SOMA_TEST_LEASE="3600",
    )
    assert [(run.id, run.status, run.holder) for run in soma.runs(soma.Journal(postgres_url))] == [
        ("r", "abandoned", None)
    ]
    held_elsewhere(postgres_url)  # Of another machine, it reads as running while its lease runs.
    held = soma.Journal(postgres_url).run("r")
    assert held.status == "running"
    assert held.holder is not None
    assert f" pid {killed} " in held.holder


def test_a_run_paused_in_one_process_is_answered_and_finished_in_another_its_effect_made_once(
    script: Callable[[str], str], calls: Callable[[], list[str]], postgres_url: str
) -> None:
    paused = run_script(
        script(
            """
            try:
                asking.forward([], run="p", journal=journal)
            except soma.Paused as paused:
                print(paused.run, paused.questions)
            """
        )
    )
    assert finished(paused).strip() == "p {'approve': 'approve a, effect send?'}"
    journal = soma.Journal(postgres_url)
    listed = journal.run("p")
    assert (listed.status, listed.done, listed.holder) == ("paused", 2, None)
    assert listed.questions == {"approve": "approve a, effect send?"}

    answered = run_script(
        script('print(asking.resume("p", journal=journal, answers={"approve": "yes"}))')
    )

    assert finished(answered).strip() == "['a', 'effect send', 'answer yes', 'c']"
    # Only the node that asked runs again: what finished before it was recorded as it asked.
    assert calls() == ["a", "send", "effect send", "approve", "approve", "c"]
    assert journal.run("p").status == "finished"


@pytest.mark.parametrize("taking_up", ["begun", "resumed"])
def test_of_two_processes_taking_up_one_run_at_once_one_runs_it_and_the_other_is_refused_naming_it(
    script: Callable[[str], str],
    calls: Callable[[], list[str]],
    postgres_url: str,
    taking_up: str,
) -> None:
    environment = {"SOMA_TEST_HOLD": "c"}
    if taking_up == "resumed":
        failed = run_script(
            script(
                """
                os.environ["SOMA_TEST_FAIL"] = "1"
                steps.forward([], run="r", journal=journal)
                """
            )
        )
        assert failed.returncode != 0
        assert "c failed" in failed.stderr
        environment["SOMA_TEST_RESUME"] = "1"
        calls_before = calls()
    else:
        calls_before = []
    with (
        child(script(TAKE_UP_ON_GO), **environment) as first,
        child(script(TAKE_UP_ON_GO), **environment) as second,
    ):
        assert (said(first), said(second)) == ("ready", "ready")
        tell(first)
        tell(second)
        # Each says one line: the one that holds the run "holding" (and waits), the other who
        # holds it.
        words = {first.pid: said(first), second.pid: said(second)}
        (holder,) = [pid for pid, word in words.items() if word == "holding"]
        (refused,) = [pid for pid, word in words.items() if word != "holding"]
        assert words[refused].startswith("held by ")
        assert f" pid {holder} " in words[refused]
        running = first if holder == first.pid else second
        tell(running)
        assert said(running) == "['a', 'b', 'effect send', 'c']"

    ran = calls()[len(calls_before) :]
    # The run ran once: c alone on resume (what finished before it failed was recorded).
    expected = ["c"] if taking_up == "resumed" else ["a", "b", "send", "effect send", "c"]
    assert ran == expected
    assert soma.Journal(postgres_url).run("r").status == "finished"


def test_processes_opening_a_new_databases_journal_at_once_all_open_it(postgres_url: str) -> None:
    # Each makes the tables as it opens the journal, the same instant as the others: on a
    # fresh database, CREATE TABLE IF NOT EXISTS run at once by several fails all but one.
    source = textwrap.dedent(
        f"""
        import sys
        import soma
        print("ready", flush=True)
        sys.stdin.readline()
        print(soma.Journal({postgres_url!r}).runs(), flush=True)
        """
    )
    with contextlib.ExitStack() as stack:
        opening = [stack.enter_context(child(source)) for _ in range(6)]
        assert [said(one) for one in opening] == ["ready"] * 6
        for one in opening:
            tell(one)
        assert [said(one) for one in opening] == ["[]"] * 6


def test_a_forked_child_uses_a_connection_of_its_own_and_leaves_its_parents_working(
    script: Callable[[str], str],
) -> None:
    ran = run_script(
        script(
            """
            import warnings
            warnings.simplefilter("error", ResourceWarning)
            print(steps.forward([], run="before", journal=journal))
            child = os.fork()
            if child == 0:
                out = steps.forward(["child"], run="in child", journal=journal)
                sys.stdout.flush()
                os._exit(0 if out == ["child", "a", "b", "effect send", "c"] else 3)
            _, status = os.waitpid(child, 0)
            print("child", os.waitstatus_to_exitcode(status))
            print(steps.forward(["after"], run="after", journal=journal))
            print(sorted((run.id, run.status) for run in soma.runs(journal)))
            """
        )
    )
    assert finished(ran).splitlines() == [
        "['a', 'b', 'effect send', 'c']",
        "child 0",
        "['after', 'a', 'b', 'effect send', 'c']",
        "[('after', 'finished'), ('before', 'finished'), ('in child', 'finished')]",
    ]


class WritesOnUnpickling:
    """A payload whose unpickling creates the file at ``path``: proof that it was unpickled."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (pathlib.Path.touch, (self.path,))


@pytest.fixture
def signed_run(postgres_url: str, tmp_path: pathlib.Path) -> tuple[soma.Graph, soma.Journal]:
    """A run finished in a journal with a key: its graph and its journal."""
    graph = soma.Graph.somatize(Add(1).named("one") >> Add(2).named("two"))
    journal = soma.Journal(postgres_url, key=b"the key")
    assert graph.forward(1, run="signed", journal=journal) == 4
    # The payload the tests write in its place does what it is there for: unpickled, it
    # writes its file.
    pickle.loads(pickle.dumps(WritesOnUnpickling(tmp_path / "control")))
    assert (tmp_path / "control").exists()
    return graph, journal


def overwritten(url: str, statement: str, payload: object) -> int:
    """Runs ``statement`` on the journal's tables, as whoever can write the database could."""
    with psycopg.connect(url, autocommit=True) as connection:
        return connection.execute(statement, (pickle.dumps(payload),)).rowcount


def test_an_input_changed_in_the_database_is_refused_under_the_key_and_never_unpickled(
    signed_run: tuple[soma.Graph, soma.Journal], postgres_url: str, tmp_path: pathlib.Path
) -> None:
    graph, journal = signed_run
    written = tmp_path / "written"
    assert overwritten(postgres_url, "UPDATE runs SET input = %s", WritesOnUnpickling(written))

    with pytest.raises(SignatureError) as refused:
        graph.resume("signed", journal=journal)

    assert refused.value.what == "run `signed`'s input"
    assert not written.exists()


def test_an_output_changed_in_the_database_is_refused_and_never_unpickled_under_the_key(
    signed_run: tuple[soma.Graph, soma.Journal],
    postgres_url: str,
    tmp_path: pathlib.Path,
) -> None:
    graph, journal = signed_run
    written = tmp_path / "written"
    changed = overwritten(postgres_url, "UPDATE done SET payload = %s", WritesOnUnpickling(written))
    assert changed == 2

    with pytest.raises(SignatureError) as refused:
        graph.resume("signed", journal=journal)

    assert refused.value.what is not None
    assert refused.value.what.startswith("the output under key ")
    assert not written.exists()


def test_runs_lists_a_journals_runs_and_the_command_shows_one(
    script: Callable[[str], str], postgres_url: str
) -> None:
    made = run_script(
        script(
            """
            print(steps.forward([], run="first", journal=journal))
            try:
                asking.forward([], run="second", journal=journal)
            except soma.Paused as paused:
                print(list(paused.questions))
            """
        )
    )
    assert finished(made).splitlines() == ["['a', 'b', 'effect send', 'c']", "['approve']"]
    journal = soma.Journal(postgres_url)
    listed = soma.runs(journal)
    assert [(run.id, run.status, run.done, run.nodes) for run in listed] == [
        ("second", "paused", 2, 4),
        ("first", "finished", 4, 4),
    ]
    assert listed[0].questions == {"approve": "approve a, effect send?"}

    command = [sys.executable, "-m", "soma.runs", "--journal", postgres_url]
    shown = subprocess.run(
        [*command, "show", "first"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
        check=False,
    )
    _note_panics(shown.stderr)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "run      first" in lines
    assert "status   finished" in lines
    assert "done     4 of 4 nodes" in lines
    # Each node with the size of its output as kept (pickled), in bytes.
    outputs = {"a": ["a"], "b": ["a", "b"], "send": ["a", "b", "effect send"]}
    outputs["c"] = [*outputs["send"], "c"]
    assert [
        (line.split()[0], int(line.split()[-5]))
        for line in lines
        if line.endswith("B in the journal")
    ] == [
        (node, len(pickle.dumps(outputs[node], protocol=pickle.HIGHEST_PROTOCOL)))
        for node in ("a", "b", "c", "send")
    ]
    listing = subprocess.run(
        [*command, "list", "--status", "paused"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
        check=False,
    )
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[:2] for line in listing.stdout.splitlines()] == [["second", "paused"]]


def test_threads_of_one_process_run_their_runs_at_once_on_one_journal(postgres_url: str) -> None:
    # Each run's `meet` passes only once all four runs are in it: they ran at once.
    barrier = threading.Barrier(4, timeout=DEADLINE)
    graph = soma.Graph.somatize(
        Add(1).named("one") >> Meet(barrier).named("meet") >> Add(2).named("two")
    )
    journal = soma.Journal(postgres_url)

    with ThreadPoolExecutor(4) as pool:
        outs = list(
            pool.map(lambda x: graph.forward(x, run=f"thread {x}", journal=journal), range(4))
        )

    assert outs == [3, 4, 5, 6]
    assert sorted((run.id, run.status, run.done) for run in soma.runs(journal)) == [
        (f"thread {x}", "finished", 3) for x in range(4)
    ]


async_effects: list[int] = []


async def made(x: int) -> int:
    async_effects.append(x)
    await asyncio.sleep(0)
    return x


class AsyncApprove(soma.Node):
    async def forward(self, x: int, ctx: soma.Ctx) -> str:
        effect: int = await ctx.aeffect(made, x)
        answer: Any = await ctx.aask(f"approve {x}?")
        return f"{effect}:{answer}"


def test_an_async_node_pauses_and_resumes_with_its_effect_made_once(postgres_url: str) -> None:
    async_effects.clear()
    graph = soma.Graph.somatize(AsyncApprove().named("approve"))
    journal = soma.Journal(postgres_url)

    async def paused_then_resumed() -> tuple[dict[str, object], Any]:
        with pytest.raises(soma.Paused) as paused:
            await graph.aforward(7, run="async", journal=journal)
        return paused.value.questions, await graph.aresume(
            "async", journal=journal, answers={"approve": "yes"}
        )

    assert asyncio.run(paused_then_resumed()) == ({"approve": "approve 7?"}, "7:yes")
    assert async_effects == [7]


def test_a_journal_let_go_unclosed_closes_its_connection(postgres_url: str) -> None:
    def others() -> int:
        with psycopg.connect(postgres_url, autocommit=True) as connection:
            found = connection.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert found is not None
        return int(found[0])

    journal = soma.Journal(postgres_url)
    assert journal.runs() == []
    assert others() == 1
    del journal
    gc.collect()
    # The server ends the session once it reads the goodbye: soon, not at once.
    deadline = time.monotonic() + DEADLINE
    while others() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert others() == 0


def test_a_journal_whose_session_the_server_ended_goes_on_with_a_new_one(postgres_url: str) -> None:
    graph = soma.Graph.somatize(Add(1).named("one") >> Add(2).named("two"))
    journal = soma.Journal(postgres_url)
    assert graph.forward(1, run="before", journal=journal) == 4
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        ended = connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert ended == [(True,)]

    assert graph.forward(2, run="after", journal=journal) == 5

    assert sorted((run.id, run.status) for run in journal.runs()) == [
        ("after", "finished"),
        ("before", "finished"),
    ]


def test_eight_processes_running_and_resuming_runs_between_them_lose_none_and_run_none_twice(
    postgres_url: str,
) -> None:
    ran = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benches" / "python" / "journal_postgres.py"),
            "--url",
            postgres_url,
            "--processes",
            "8",
            "--runs",
            "80",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    _note_panics(ran.stderr)
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout.splitlines()[-1])
    assert report["runs"] == 80
    assert report["finished"] == 80
    assert report["lost"] == []
    assert report["twice"] == []
    # The runs were shared, not all run by whichever worker started first.
    assert len(report["finished_by"]) > 1


# ---------------------------------------------------------------------------------------------
# A journal made before its rows were kept in the order written

#: The ``done`` table as such a journal had it: keyed by run and key (its index ``done_pkey``).
DONE_BY_KEY = (
    "CREATE TEMP TABLE kept AS SELECT run, key, node, seconds, digest, payload, sig FROM done",
    "DROP TABLE done",
    "CREATE TABLE done (run BIGINT NOT NULL, key BYTEA NOT NULL, node BIGINT NOT NULL,"
    " seconds DOUBLE PRECISION NOT NULL, digest BYTEA, payload BYTEA NOT NULL, sig BYTEA,"
    " PRIMARY KEY (run, key))",
    "INSERT INTO done SELECT * FROM kept",
)

COUNTED: list[str] = []


class Counted(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: Any, ctx: soma.Ctx) -> Any:
        COUNTED.append(ctx.node)
        return x + self.k


def test_a_journal_made_before_rows_were_kept_in_order_resumes_its_runs_and_lists_them(
    postgres_url: str,
) -> None:
    g = soma.Graph.somatize(Counted(1).named("one") >> Counted(2).named("two"))
    old = soma.Journal(postgres_url)
    assert g.forward(1, run="r", journal=old) == 4
    old.close()
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        for statement in DONE_BY_KEY:
            connection.execute(statement)
    COUNTED.clear()
    journal = soma.Journal(postgres_url)
    try:
        assert [(run.id, run.done) for run in soma.runs(journal)] == [("r", 2)]
        assert g.resume("r", journal=journal) == 4
        assert COUNTED == []
        assert g.forward(5, run="s", journal=journal) == 8
        assert COUNTED == ["one", "two"]
        COUNTED.clear()
        assert g.resume("s", journal=journal) == 8
        assert COUNTED == []
    finally:
        journal.close()
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        columns = connection.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'done'"
            " ORDER BY ordinal_position"
        ).fetchall()
    assert columns[0] == ("id",)
