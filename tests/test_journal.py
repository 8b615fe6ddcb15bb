"""Runs that survive (issue 45), in one process: ``soma.Journal`` records a run as its nodes
return, ``g.resume`` calls exactly what was not recorded, effects happen once, questions pause a
run, leases name a run's holder, signed entries are refused when altered, and ``soma.runs`` and
``python -m soma.runs`` tell the history. Kill-and-resume across processes, edited nodes and
leases between processes are ``test_journal_kill.py``.

The nodes are written as users write them: module-level lists counting calls, a module-level
client, a flag file for a flaky service, threads a node starts, ``asyncio.timeout`` and
``TaskGroup`` inside async nodes, imports inside functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import soma
from conftest import DEADLINE, SUBPROCESS_DEADLINE, run_script
from soma.errors import JournalError, RunHeldError, SignatureError

# ---------------------------------------------------------------------------------------------
# The code users write: module-level call counts, a client, a flaky service told by a file.

CALLS: list[str] = []
CALLS_LOCK = threading.Lock()


def called(name: str) -> None:
    with CALLS_LOCK:
        CALLS.append(name)


class Client:
    """A module-level API client: each request is one call on the far side."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self._lock = threading.Lock()

    def post(self, payload: Any) -> int:
        with self._lock:
            self.requests.append(payload)
            return len(self.requests)


CLIENT = Client()

#: While this file exists, the service nodes call is down (a node reading it is not edited by
#: it: a file's content is no part of a node's key).
DOWN = Path(os.environ.get("TMPDIR", "/tmp")) / f"soma-journal-test-down-{os.getpid()}"


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    CALLS.clear()
    CLIENT.requests.clear()
    DOWN.unlink(missing_ok=True)
    yield
    DOWN.unlink(missing_ok=True)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[soma.Journal]:
    kept = soma.Journal(tmp_path / "runs.db")
    yield kept
    kept.close()


class Step(soma.Node):
    """Counts its call in CALLS, then adds ``k``; fails while the service is down if ``flaky``."""

    def __init__(self, k: int, flaky: bool = False) -> None:
        self.k = k
        self.flaky = flaky

    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        if self.flaky and DOWN.exists():
            raise ConnectionError(f"{ctx.node}: the service is down")
        if isinstance(x, dict):
            x = sum(x.values())
        return x + self.k


class AsyncStep(soma.Node):
    def __init__(self, k: int, flaky: bool = False) -> None:
        self.k = k
        self.flaky = flaky

    async def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        await asyncio.sleep(0)
        if self.flaky and DOWN.exists():
            raise ConnectionError(f"{ctx.node}: the service is down")
        return x + self.k


def chain() -> soma.Graph:
    """a >> (b | c) >> d >> e, with d flaky."""
    return soma.Graph.somatize(
        Step(1).named("a")
        >> (Step(10).named("b") | Step(100).named("c"))
        >> Step(1000, flaky=True).named("d")
        >> Step(1).named("e")
    )


def uninterrupted(make: Any, x: Any) -> Any:
    return make().forward(x)


# ---------------------------------------------------------------------------------------------
# Recorded, then resumed


def test_a_resumed_run_calls_exactly_the_nodes_it_had_not_recorded(
    journal: soma.Journal,
) -> None:
    g = chain()
    DOWN.touch()
    with pytest.raises(ConnectionError):
        g.forward(1, run="r", journal=journal)
    assert sorted(CALLS) == ["a", "b", "c", "d"]
    CALLS.clear()
    DOWN.unlink()
    g.resume("r", journal=journal)
    assert sorted(CALLS) == ["d", "e"]


def test_a_resumed_run_returns_what_an_uninterrupted_run_returns(journal: soma.Journal) -> None:
    expected = uninterrupted(chain, 1)
    DOWN.touch()
    with pytest.raises(ConnectionError):
        chain().forward(1, run="r", journal=journal)
    DOWN.unlink()
    assert chain().resume("r", journal=journal) == expected


def test_a_finished_run_resumed_calls_nothing_and_returns_its_result(
    journal: soma.Journal,
) -> None:
    g = chain()
    first = g.forward(1, run="r", journal=journal)
    CALLS.clear()
    assert g.resume("r", journal=journal) == first
    assert CALLS == []


#: The ``done`` table as journals made before its rows were kept in the order written had it:
#: keyed by run and key, so that a batch of a large run wrote a page of the file a node.
DONE_BY_KEY = (
    "CREATE TEMP TABLE kept AS SELECT run, key, node, seconds, digest, payload, sig FROM done",
    "DROP TABLE done",
    "CREATE TABLE done (run INTEGER NOT NULL, key BLOB NOT NULL, node INTEGER NOT NULL,"
    " seconds REAL NOT NULL, digest BLOB, payload BLOB NOT NULL, sig BLOB,"
    " PRIMARY KEY (run, key)) WITHOUT ROWID",
    "INSERT INTO done SELECT * FROM kept",
)


def test_a_journal_made_before_rows_were_kept_in_order_resumes_its_runs_and_lists_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    expected = {x: uninterrupted(chain, x) for x in (1, 2, 3)}
    g = chain()
    old = soma.Journal(path)
    assert g.forward(2, run="s", journal=old) == expected[2]
    DOWN.touch()
    with pytest.raises(ConnectionError):
        g.forward(1, run="r", journal=old)
    old.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for statement in DONE_BY_KEY:
            db.execute(statement)
    DOWN.unlink()
    CALLS.clear()
    journal = soma.Journal(path)
    try:
        assert [(run.id, run.done) for run in soma.runs(journal)] == [("r", 3), ("s", 5)]
        assert g.resume("r", journal=journal) == expected[1]
        assert sorted(CALLS) == ["d", "e"]
        assert g.forward(3, run="t", journal=journal) == expected[3]
        CALLS.clear()
        assert g.resume("t", journal=journal) == expected[3]
        assert g.resume("s", journal=journal) == expected[2]
        assert CALLS == []
    finally:
        journal.close()
    with contextlib.closing(sqlite3.connect(path)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(done)")]
    assert columns[0] == "id"


def test_forward_with_the_id_of_a_run_held_elsewhere_is_refused_naming_its_holder(
    tmp_path: Path,
) -> None:
    inside = threading.Barrier(2, timeout=DEADLINE)
    release = threading.Event()
    refused: list[BaseException] = []

    class Hold(soma.Node):
        def forward(self, x: Any) -> Any:
            inside.wait()
            release.wait(DEADLINE)
            return x

    g = soma.Graph.somatize(Hold().named("hold"))
    holder_journal = soma.Journal(tmp_path / "runs.db")
    worker = threading.Thread(target=lambda: g.forward(1, run="r", journal=holder_journal))
    worker.start()
    try:
        inside.wait()
        other = soma.Journal(tmp_path / "runs.db")
        try:
            g.forward(1, run="r", journal=other)
        except RunHeldError as error:
            refused.append(error)
        holder = holder_journal.run("r").holder
    finally:
        release.set()
        worker.join(DEADLINE)
    assert len(refused) == 1
    error = refused[0]
    assert isinstance(error, RunHeldError)
    assert holder is not None
    assert error.holder == holder
    assert holder in str(error)


def test_forward_with_an_existing_id_and_another_input_is_a_journal_error(
    journal: soma.Journal,
) -> None:
    g = chain()
    g.forward(1, run="r", journal=journal)
    with pytest.raises(JournalError, match="another input") as raised:
        g.forward(2, run="r", journal=journal)
    assert raised.value.run == "r"


def test_resuming_an_unknown_run_is_a_journal_error_naming_it(journal: soma.Journal) -> None:
    with pytest.raises(JournalError, match="`nope`") as raised:
        chain().resume("nope", journal=journal)
    assert raised.value.run == "nope"


class AskTwice(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        first = ctx.ask(f"first about {x}?")
        second = ctx.ask("second?")
        return (x, first, second)


def test_answers_at_a_path_with_no_open_question_are_a_journal_error_listing_the_open_paths(
    journal: soma.Journal,
) -> None:
    g = soma.Graph.somatize(AskTwice().named("asker"))
    with pytest.raises(soma.Paused):
        g.forward(1, run="r", journal=journal)
    with pytest.raises(JournalError, match="no open question at `elsewhere`") as raised:
        g.resume("r", journal=journal, answers={"elsewhere": "yes"})
    assert "`asker`" in str(raised.value)


# ---------------------------------------------------------------------------------------------
# Steps: each, switch, loop


def test_a_node_inside_each_is_recorded_where_it_finishes(journal: soma.Journal) -> None:
    g = soma.Graph.somatize(soma.each(Step(1).named("inc")).named("items"))
    g.forward([1, 2, 3], run="r", journal=journal)
    assert [node for node, _, _ in journal.nodes("r")].count("items/inc") == 3


def test_a_node_inside_switch_is_recorded_where_it_finishes(journal: soma.Journal) -> None:
    route = soma.switch(
        lambda x: "big" if x > 2 else "small",
        {"big": Step(1).named("up"), "small": Step(-1).named("down")},
    )
    g = soma.Graph.somatize(route.named("pick"))
    g.forward(3, run="r", journal=journal)
    recorded = {node for node, _, _ in journal.nodes("r")}
    assert "pick/big/up" in recorded
    assert not any(node.endswith("down") for node in recorded)


def test_a_node_inside_loop_is_recorded_at_each_turn_and_the_finished_loop_resumes_calling_nothing(
    journal: soma.Journal,
) -> None:
    class Halve(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            called(ctx.node)
            return x // 2

    g = soma.Graph.somatize(
        soma.loop(Halve().named("half"), until=lambda x: x < 10, max_iterations=8).named("lp")
    )
    result = g.forward(100, run="r", journal=journal)
    assert [node for node, _, _ in journal.nodes("r")].count("lp/half") == 4
    CALLS.clear()
    assert g.resume("r", journal=journal) == result
    assert CALLS == []


def test_resume_after_a_failure_in_one_each_item_reruns_only_that_items_nodes(
    journal: soma.Journal,
) -> None:
    class Check(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            called(f"check {x}")
            if x == 9 and DOWN.exists():
                raise ConnectionError("the service is down for 9")
            return x + 1

    class Square(soma.Node):
        def forward(self, x: Any) -> Any:
            called(f"square {x}")
            return x * x

    def make() -> soma.Graph:
        return soma.Graph.somatize(
            soma.each(Square().named("sq") >> Check().named("check")).named("items") >> sum
        )

    expected = make().forward([1, 2, 3])
    CALLS.clear()
    DOWN.touch()
    with pytest.raises(ConnectionError):
        make().forward([1, 2, 3], run="r", journal=journal)
    CALLS.clear()
    DOWN.unlink()
    assert make().resume("r", journal=journal) == expected
    assert CALLS == ["check 9"]


# ---------------------------------------------------------------------------------------------
# Async nodes


def async_chain() -> soma.Graph:
    return soma.Graph.somatize(
        AsyncStep(1).named("a") >> AsyncStep(10, flaky=True).named("b") >> AsyncStep(100).named("c")
    )


def test_async_nodes_resumed_with_aresume_call_exactly_the_unrecorded_nodes(
    journal: soma.Journal,
) -> None:
    async def main() -> Any:
        g = async_chain()
        DOWN.touch()
        with pytest.raises(ConnectionError):
            await g.aforward(1, run="r", journal=journal)
        CALLS.clear()
        DOWN.unlink()
        return await g.aresume("r", journal=journal)

    assert asyncio.run(main()) == 112
    assert CALLS == ["b", "c"]


def test_async_nodes_under_sync_forward_resume_calling_exactly_the_unrecorded_nodes(
    journal: soma.Journal,
) -> None:
    g = async_chain()
    DOWN.touch()
    with pytest.raises(ConnectionError):
        g.forward(1, run="r", journal=journal)
    CALLS.clear()
    DOWN.unlink()
    assert g.resume("r", journal=journal) == 112
    assert CALLS == ["b", "c"]


class GroupAsk(soma.Node):
    """Asks from a TaskGroup's task, under asyncio.timeout: the pause must come through both."""

    async def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        async with asyncio.timeout(SUBPROCESS_DEADLINE), asyncio.TaskGroup() as group:
            price = group.create_task(ctx.aeffect(CLIENT.post, ("quote", x)))
            answer = group.create_task(ctx.aask(f"buy {x}?"))
        return (price.result(), answer.result())


def test_an_aask_inside_a_taskgroup_task_pauses_the_run_rather_than_failing_it(
    journal: soma.Journal,
) -> None:
    g = soma.Graph.somatize(GroupAsk().named("buy"))
    with pytest.raises(soma.Paused) as paused:
        g.forward(7, run="r", journal=journal)
    assert paused.value.questions == {"buy": "buy 7?"}
    assert journal.run("r").status == "paused"
    assert g.resume("r", journal=journal, answers={"buy": "yes"}) == (1, "yes")
    assert CLIENT.requests == [("quote", 7)]


# ---------------------------------------------------------------------------------------------
# Retries and deadlines


def test_a_retried_node_gets_its_effects_recorded_result_back_so_the_effect_runs_once(
    journal: soma.Journal,
) -> None:
    attempts: list[int] = []

    class Order(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            receipt = ctx.effect(CLIENT.post, ("order", x))
            attempts.append(receipt)
            if len(attempts) < 3:
                raise ConnectionError("the confirmation did not come")
            return receipt

    g = soma.Graph.somatize(Order().named("order"))
    g.retry("order", 3)
    assert g.forward(5, run="r", journal=journal) == 1
    assert attempts == [1, 1, 1]
    assert CLIENT.requests == [("order", 5)]


class Approve(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        return (x, ctx.ask(f"approve {x}?"))


def test_forward_with_a_timeout_pauses_a_run_that_asks(journal: soma.Journal) -> None:
    g = soma.Graph.somatize(Step(1).named("a") >> Approve().named("approve"))
    with pytest.raises(soma.Paused) as paused:
        g.forward(1, run="r", journal=journal, timeout=SUBPROCESS_DEADLINE)
    assert paused.value.questions == {"approve": "approve 2?"}
    assert g.resume("r", journal=journal, answers={"approve": "ok"}) == (2, "ok")


def test_a_run_that_timed_out_resumes_and_finishes(journal: soma.Journal) -> None:
    started = threading.Event()

    class Stuck(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            called(ctx.node)
            if DOWN.exists():
                started.set()
                threading.Event().wait(SUBPROCESS_DEADLINE)  # Cut off by the deadline.
            return x * 3

    def make() -> soma.Graph:
        return soma.Graph.somatize(Step(1).named("a") >> Stuck().named("stuck"))

    DOWN.touch()
    with pytest.raises(TimeoutError):
        make().forward(1, run="r", journal=journal, timeout=0.2)
    assert started.is_set()
    assert journal.run("r").status == "failed"
    CALLS.clear()
    DOWN.unlink()
    assert make().resume("r", journal=journal) == 6
    assert CALLS == ["stuck"]


# ---------------------------------------------------------------------------------------------
# Effects once, questions


class CallThenAsk(soma.Node):
    """LangGraph#7780: an API call, then a question — the call must not be made again."""

    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        ticket = ctx.effect(CLIENT.post, {"open": x})
        decision = ctx.ask(f"ticket {ticket}: close it?")
        return (ticket, decision)


def test_an_api_call_made_before_a_question_is_not_made_again_after_the_answer(
    journal: soma.Journal,
) -> None:
    g = soma.Graph.somatize(CallThenAsk().named("triage"))
    with pytest.raises(soma.Paused) as paused:
        g.forward("disk full", run="r", journal=journal)
    assert paused.value.questions == {"triage": "ticket 1: close it?"}
    assert g.resume("r", journal=journal, answers={"triage": "yes"}) == (1, "yes")
    assert CLIENT.requests == [{"open": "disk full"}]
    assert CALLS == ["triage", "triage"]


def test_an_effect_made_from_a_thread_the_node_started_runs_once(journal: soma.Journal) -> None:
    class Threaded(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            got: list[Any] = []
            worker = threading.Thread(target=lambda: got.append(ctx.effect(CLIENT.post, x)))
            worker.start()
            worker.join(DEADLINE)
            return (got[0], ctx.ask("go on?"))

    g = soma.Graph.somatize(Threaded().named("t"))
    with pytest.raises(soma.Paused):
        g.forward("x", run="r", journal=journal)
    assert g.resume("r", journal=journal, answers={"t": "yes"}) == (1, "yes")
    assert CLIENT.requests == ["x"]


def test_a_node_asking_twice_pauses_twice_and_gets_both_answers(journal: soma.Journal) -> None:
    g = soma.Graph.somatize(AskTwice().named("asker"))
    with pytest.raises(soma.Paused) as first:
        g.forward(1, run="r", journal=journal)
    assert first.value.questions == {"asker": "first about 1?"}
    with pytest.raises(soma.Paused) as second:
        g.resume("r", journal=journal, answers={"asker": "one"})
    assert second.value.questions == {"asker": "second?"}
    assert g.resume("r", journal=journal, answers={"asker": "two"}) == (1, "one", "two")


class AskAbout(soma.Node):
    """Asks about its input; with ``meet``, only once every branch is in flight, so that each
    asks before the first question stops the wave."""

    def __init__(self, meet: threading.Barrier | None = None) -> None:
        self.meet = meet

    def forward(self, x: Any, ctx: Any) -> Any:
        if self.meet is not None:
            self.meet.wait()
        return ctx.ask(f"{ctx.node} ok?")


def both_ask(meet: threading.Barrier | None = None) -> soma.Graph:
    return soma.Graph.somatize(AskAbout(meet).named("left") | AskAbout(meet).named("right"))


def test_branches_of_a_wave_asking_at_once_are_all_in_paused_questions(
    journal: soma.Journal,
) -> None:
    g = both_ask(threading.Barrier(2, timeout=DEADLINE))
    with pytest.raises(soma.Paused) as paused:
        g.forward(1, run="r", journal=journal)
    assert paused.value.questions == {"left": "left ok?", "right": "right ok?"}
    answered = both_ask().resume("r", journal=journal, answers={"left": "L", "right": "R"})
    assert answered == {"left": "L", "right": "R"}


def test_async_branches_of_a_wave_asking_at_once_are_all_in_paused_questions(
    journal: soma.Journal,
) -> None:
    arrived: list[str] = []

    class AskAtOnce(soma.Node):
        async def forward(self, x: Any, ctx: Any) -> Any:
            arrived.append(ctx.node)
            async with asyncio.timeout(DEADLINE):  # Both are in flight before either asks.
                while len(arrived) < 2:
                    await asyncio.sleep(0)
            return await ctx.aask(f"{ctx.node} ok?")

    g = soma.Graph.somatize(AskAtOnce().named("left") | AskAtOnce().named("right"))
    with pytest.raises(soma.Paused) as paused:
        g.forward(1, run="r", journal=journal)
    assert paused.value.questions == {"left": "left ok?", "right": "right ok?"}


class AskItem(soma.Node):
    def __init__(self, meet: threading.Barrier | None = None) -> None:
        self.meet = meet

    def forward(self, x: Any, ctx: Any) -> Any:
        if self.meet is not None:
            self.meet.wait()
        return (x, ctx.ask(f"item {x}?"))


def test_items_of_an_each_asking_at_once_ask_one_question_each_answered_at_its_own_path(
    journal: soma.Journal,
) -> None:
    def make(meet: threading.Barrier | None = None) -> soma.Graph:
        return soma.Graph.somatize(soma.each(AskItem(meet).named("q")).named("items"))

    with pytest.raises(soma.Paused) as paused:
        make(threading.Barrier(3, timeout=DEADLINE)).forward([1, 2, 3], run="r", journal=journal)
    questions = paused.value.questions
    assert sorted(questions.values()) == ["item 1?", "item 2?", "item 3?"]
    assert all(path.startswith("items/q") for path in questions)
    answers = {path: f"yes to {question}" for path, question in questions.items()}
    assert make().resume("r", journal=journal, answers=answers) == [
        (1, "yes to item 1?"),
        (2, "yes to item 2?"),
        (3, "yes to item 3?"),
    ]


def test_answering_one_of_two_open_questions_pauses_again_with_only_the_other(
    journal: soma.Journal,
) -> None:
    with pytest.raises(soma.Paused):
        both_ask(threading.Barrier(2, timeout=DEADLINE)).forward(1, run="r", journal=journal)
    g = both_ask()
    with pytest.raises(soma.Paused) as again:
        g.resume("r", journal=journal, answers={"left": "L"})
    assert again.value.questions == {"right": "right ok?"}
    assert soma.runs(journal)[0].questions == {"right": "right ok?"}
    assert g.resume("r", journal=journal, answers={"right": "R"}) == {"left": "L", "right": "R"}


def test_a_question_altered_in_the_journal_is_never_unpickled(
    journal: soma.Journal, marker: Path
) -> None:
    with pytest.raises(soma.Paused):
        both_ask(threading.Barrier(2, timeout=DEADLINE)).forward(1, run="r", journal=journal)
    g = both_ask()
    alter(Path(journal.target), "UPDATE questions SET question = ? WHERE path = 'right'")
    with pytest.raises(soma.Paused) as again:
        g.resume("r", journal=journal, answers={"left": "L"})
    assert again.value.questions == {"right": "right ok?"}
    assert not marker.exists()


def test_a_paused_run_hands_over_its_questions_as_asked_never_read_back_from_the_store(
    journal: soma.Journal, marker: Path
) -> None:
    both_in_flight = threading.Barrier(2, timeout=DEADLINE)

    class AskThenTamper(soma.Node):
        """`right` alters `left`'s question in the store once `left` has asked it, as another
        writer of the store could, then asks its own."""

        def forward(self, x: Any, ctx: Any) -> Any:
            both_in_flight.wait()
            if ctx.node == "right":
                with contextlib.closing(sqlite3.connect(journal.target)) as db, db:
                    deadline = time.monotonic() + DEADLINE
                    while not db.execute("SELECT 1 FROM questions WHERE path = 'left'").fetchall():
                        assert time.monotonic() < deadline, "`left` never asked"
                        time.sleep(0.005)
                    altered = "UPDATE questions SET question = ? WHERE path = 'left'"
                    db.execute(altered, (planted(),))
            return ctx.ask(f"{ctx.node} ok?")

    g = soma.Graph.somatize(AskThenTamper().named("left") | AskThenTamper().named("right"))
    with pytest.raises(soma.Paused) as paused:
        g.forward(1, run="r", journal=journal)
    assert not marker.exists()
    assert paused.value.questions == {"left": "left ok?", "right": "right ok?"}


FACTOR = 2


class Scale(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        return x * FACTOR


def test_a_node_asking_again_on_an_input_changed_by_an_edit_asks_at_its_own_path(
    journal: soma.Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make() -> soma.Graph:
        return soma.Graph.somatize(
            Scale().named("scale") >> Approve().named("approve") >> Ignore().named("after")
        )

    with pytest.raises(soma.Paused):
        make().forward(1, run="r", journal=journal)
    DOWN.touch()
    with pytest.raises(ConnectionError):  # Answered; the node after it fails.
        make().resume("r", journal=journal, answers={"approve": "yes"})
    DOWN.unlink()
    monkeypatch.setattr(sys.modules[__name__], "FACTOR", 3)  # `scale` edited.
    with pytest.raises(soma.Paused) as paused:
        make().resume("r", journal=journal)
    # The answer was to `approve 2?`; asked `approve 3?` now, at the node's own path.
    assert paused.value.questions == {"approve": "approve 3?"}
    assert make().resume("r", journal=journal, answers={"approve": "no"}) == "done"


def test_ask_outside_a_journal_is_a_runtime_error_saying_a_journal_is_needed() -> None:
    g = soma.Graph.somatize(Approve().named("approve"))
    with pytest.raises(RuntimeError, match="journal") as raised:
        g.forward(1)
    assert "`approve`" in str(raised.value)


def test_effect_outside_a_journal_just_runs() -> None:
    class Post(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return ctx.effect(CLIENT.post, x)

    g = soma.Graph.somatize(Post().named("post"))
    assert g.forward("a") == 1
    assert g.forward("a") == 2
    assert CLIENT.requests == ["a", "a"]


def test_a_question_asked_from_a_thread_the_node_started_pauses_the_run_and_gets_its_answer(
    journal: soma.Journal,
) -> None:
    class AskInThread(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            got: list[Any] = []
            raised: list[BaseException] = []

            def worker() -> None:
                try:
                    got.append(ctx.ask(f"ship {x}?"))
                except BaseException as signal:  # The question, handed back to the node.
                    raised.append(signal)

            thread = threading.Thread(target=worker)
            thread.start()
            thread.join(DEADLINE)
            if raised:
                raise raised[0]
            return got[0]

    g = soma.Graph.somatize(AskInThread().named("ship"))
    with pytest.raises(soma.Paused) as paused:
        g.forward("box", run="r", journal=journal)
    assert paused.value.questions == {"ship": "ship box?"}
    assert g.resume("r", journal=journal, answers={"ship": "yes"}) == "yes"


def test_an_async_nodes_effect_runs_once_across_a_pause_for_its_question(
    journal: soma.Journal,
) -> None:
    class PostThenAsk(soma.Node):
        async def forward(self, x: Any, ctx: Any) -> Any:
            posted = await ctx.aeffect(_apost, x)
            return (posted, await ctx.aask("go on?"))

    g = soma.Graph.somatize(PostThenAsk().named("post"))
    with pytest.raises(soma.Paused):
        g.forward("x", run="r", journal=journal)
    assert g.resume("r", journal=journal, answers={"post": "yes"}) == (1, "yes")
    assert CLIENT.requests == ["x"]


async def _apost(payload: Any) -> int:
    return CLIENT.post(payload)


def test_a_journaled_run_after_another_ended_still_records_its_effects(
    journal: soma.Journal,
) -> None:
    """The count of runs the process holds went back to none between the two: the second run's
    calls must still find their run."""

    class PostThenAsk(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            return (ctx.effect(CLIENT.post, x), ctx.ask("go on?"))

    g = soma.Graph.somatize(PostThenAsk().named("post"))
    for run in ("first", "second"):
        with pytest.raises(soma.Paused):
            g.forward(run, run=run, journal=journal)
    assert g.resume("second", journal=journal, answers={"post": "yes"}) == (2, "yes")
    assert CLIENT.requests == ["first", "second"]


def test_a_nodes_call_reads_no_journal_while_the_process_holds_no_run_with_one(
    tmp_path: Path,
) -> None:
    """Every call of a node that takes a ``ctx`` would otherwise read the journal's context
    variable, a Python call, journal or not: counted here through a stand-in for it."""
    script = f"""
import soma
import soma.journal._active as active

real = active.ACTIVE
reads = []

class Counted:
    def get(self):
        reads.append(1)
        return real.get()

active.ACTIVE = Counted()

class Post(soma.Node):
    def forward(self, x, ctx):
        return ctx.effect(lambda: x + 1)

class AsyncPost(soma.Node):
    async def forward(self, x, ctx):
        return ctx.effect(lambda: x + 1)

for node in (Post(), AsyncPost()):
    g = soma.Graph.somatize(node.named("post") >> Post().named("again"))
    assert g.forward(1) == 3
print("without", len(reads))
with soma.Journal({str(tmp_path / "runs.db")!r}) as journal:
    g = soma.Graph.somatize(Post().named("post"))
    assert g.forward(1, run="r", journal=journal) == 2
print("with", len(reads))
"""
    child = run_script(script)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["without", "0", "with", "1"]


# ---------------------------------------------------------------------------------------------
# Leases, in one process (across processes: test_journal_kill.py)


def test_a_run_being_run_reads_as_running_with_its_holder(journal: soma.Journal) -> None:
    seen: list[soma.RunRecord] = []

    class Look(soma.Node):
        def forward(self, x: Any) -> Any:
            seen.extend(soma.runs(journal))
            return x

    soma.Graph.somatize(Look().named("look")).forward(1, run="r", journal=journal)
    assert [(run.id, run.status) for run in seen] == [("r", "running")]
    assert seen[0].holder is not None
    assert str(os.getpid()) in seen[0].holder


# ---------------------------------------------------------------------------------------------
# Signing

MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / f"soma-journal-unpickled-{os.getpid()}"


class Planted:
    """A payload whose unpickling writes a marker file: what a store's writer could plant."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (Path.touch, (MARKER,))


def planted() -> bytes:
    return pickle.dumps(Planted())


class EffectAskNode(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        ticket = ctx.effect(CLIENT.post, x)
        return (ticket, ctx.ask("ok?"))


def signed_paused_run(path: Path) -> soma.Graph:
    """Run ``r`` in the signed journal at ``path``: ``first`` finished, ``ask``'s effect made,
    its question answered, not yet resumed."""
    g = soma.Graph.somatize(Step(1).named("first") >> EffectAskNode().named("ask"))
    signed = soma.Journal(path, key=b"secret")
    with pytest.raises(soma.Paused):
        g.forward(1, run="r", journal=signed)
    signed.close()
    return g


def alter(path: Path, statement: str) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        changed = db.execute(statement, (planted(),)).rowcount
    assert changed >= 1


@pytest.fixture
def marker() -> Iterator[Path]:
    MARKER.unlink(missing_ok=True)
    yield MARKER
    MARKER.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE done SET payload = ?",
        "UPDATE effects SET result = ?",
        "UPDATE runs SET input = ?",
    ],
    ids=["output", "effect", "input"],
)
def test_an_altered_signed_entry_is_refused_with_a_signature_error_never_unpickled(
    tmp_path: Path, marker: Path, statement: str
) -> None:
    path = tmp_path / "runs.db"
    g = signed_paused_run(path)
    alter(path, statement)
    signed = soma.Journal(path, key=b"secret")
    CALLS.clear()
    with pytest.raises(SignatureError):
        g.resume("r", journal=signed, answers={"ask": "yes"})
    assert not marker.exists()
    assert "first" not in CALLS  # Refused as the run is taken up, not read as a miss.


def alter_output_of(path: Path, node: str) -> None:
    alter(
        path,
        "UPDATE done SET payload = ? WHERE node IN (SELECT n.id FROM names n"
        f" WHERE n.name = '{node}')",
    )


def test_an_output_altered_while_the_run_runs_is_refused_with_a_signature_error_never_unpickled(
    tmp_path: Path, marker: Path
) -> None:
    path = tmp_path / "runs.db"

    class Tamper(soma.Node):
        """Alters `kept`'s recorded output, as another writer of the store could, while the
        run runs: after the run was taken up, before `join` reads it."""

        def forward(self, x: Any, ctx: Any) -> Any:
            called(ctx.node)
            if DOWN.exists():
                raise ConnectionError("down")
            alter_output_of(path, "kept")
            return x

    def make() -> soma.Graph:
        return soma.Graph.somatize(
            Step(1).named("src")
            >> (Step(10).named("kept") | Tamper().named("tamper"))
            >> Step(0).named("join")
        )

    signed = soma.Journal(path, key=b"secret")
    DOWN.touch()
    with pytest.raises(ConnectionError):
        make().forward(1, run="r", journal=signed)
    DOWN.unlink()
    with pytest.raises(SignatureError):
        make().resume("r", journal=signed)
    assert not marker.exists()
    assert signed.run("r").status == "failed"


class AskAgain(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        first = ctx.ask("ok?")
        return (first, ctx.ask("really?"))


def test_an_altered_signed_answer_is_refused_with_a_signature_error_never_unpickled(
    tmp_path: Path, marker: Path
) -> None:
    path = tmp_path / "runs.db"
    signed = soma.Journal(path, key=b"secret")
    g = soma.Graph.somatize(AskAgain().named("ask"))
    with pytest.raises(soma.Paused):
        g.forward(1, run="r", journal=signed)
    with pytest.raises(soma.Paused):  # The first answer recorded; the second question open.
        g.resume("r", journal=signed, answers={"ask": "yes"})
    alter(path, "UPDATE questions SET answer = ? WHERE answer IS NOT NULL")
    with pytest.raises(SignatureError):
        g.resume("r", journal=signed, answers={"ask": "sure"})
    assert not marker.exists()


def test_a_journal_opened_without_the_key_reads_signed_entries(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    g = signed_paused_run(path)
    plain = soma.Journal(path)
    assert g.resume("r", journal=plain, answers={"ask": "yes"}) == (1, "yes")
    assert CLIENT.requests == [2]


def test_a_journal_opened_with_a_wrong_key_refuses_signed_entries(
    tmp_path: Path, marker: Path
) -> None:
    path = tmp_path / "runs.db"
    g = signed_paused_run(path)
    wrong = soma.Journal(path, key=b"not the secret")
    with pytest.raises(SignatureError):
        g.resume("r", journal=wrong, answers={"ask": "yes"})


# ---------------------------------------------------------------------------------------------
# History and the command


def statuses(journal: soma.Journal) -> dict[str, str]:
    return {run.id: run.status for run in soma.runs(journal)}


def test_soma_runs_tells_paused_failed_and_finished_runs_apart(journal: soma.Journal) -> None:
    with pytest.raises(soma.Paused):
        soma.Graph.somatize(Approve().named("approve")).forward(1, run="p", journal=journal)
    DOWN.touch()
    with pytest.raises(ConnectionError):
        chain().forward(1, run="f", journal=journal)
    DOWN.unlink()
    chain().forward(2, run="ok", journal=journal)
    assert statuses(journal) == {"p": "paused", "f": "failed", "ok": "finished"}


def test_soma_runs_counts_a_runs_done_nodes_of_its_nodes(journal: soma.Journal) -> None:
    DOWN.touch()
    with pytest.raises(ConnectionError):
        chain().forward(1, run="f", journal=journal)
    (run,) = soma.runs(journal)
    assert (run.done, run.nodes) == (3, 5)


def test_soma_runs_gives_a_failed_runs_error(journal: soma.Journal) -> None:
    DOWN.touch()
    with pytest.raises(ConnectionError):
        chain().forward(1, run="f", journal=journal)
    (run,) = soma.runs(journal)
    assert run.error is not None
    assert run.error.startswith("ConnectionError: d: the service is down")


def test_soma_runs_gives_a_paused_runs_open_questions(journal: soma.Journal) -> None:
    with pytest.raises(soma.Paused):
        soma.Graph.somatize(Approve().named("approve")).forward(1, run="p", journal=journal)
    (run,) = soma.runs(journal)
    assert run.questions == {"approve": "approve 1?"}


def cli(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "soma.runs", "--journal", str(path), *args],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
        check=False,
    )


def test_the_runs_command_lists_each_run_with_its_status_and_done_nodes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    journal = soma.Journal(path)
    chain().forward(1, run="nightly-1", journal=journal)
    with pytest.raises(soma.Paused):
        soma.Graph.somatize(Approve().named("approve")).forward(1, run="ask-1", journal=journal)
    listed = cli(path, "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 2
    by_id = {line.split()[0]: line.split() for line in lines}
    assert by_id["nightly-1"][1] == "finished"
    assert "5/5" in by_id["nightly-1"]
    assert by_id["ask-1"][1] == "paused"
    assert "asks at approve" in lines[[line.split()[0] for line in lines].index("ask-1")]


def test_the_runs_command_shows_a_run_node_by_node(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    chain().forward(1, run="nightly-1", journal=soma.Journal(path))
    shown = cli(path, "show", "nightly-1")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "run      nightly-1" in lines
    assert "status   finished" in lines
    assert "done     5 of 5 nodes" in lines
    finished = [line.split()[0] for line in lines if "finished " in line and line.startswith("  ")]
    assert finished == ["a", "b", "c", "d", "e"]


def test_the_runs_command_show_of_an_unknown_run_says_so_and_exits_1(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    soma.Journal(path).close()
    shown = cli(path, "show", "nope")
    assert shown.returncode == 1
    assert "`nope`" in shown.stderr


def test_the_runs_command_prunes_ended_runs_older_than_given(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    journal = soma.Journal(path)
    chain().forward(1, run="old", journal=journal)
    pruned = cli(path, "prune", "--older-than", "0s")
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.splitlines() == ["pruned 1 runs"]
    assert soma.runs(journal) == []
    assert cli(path, "list").stdout == ""


# ---------------------------------------------------------------------------------------------
# What cannot be recorded


class Unpicklable(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        return threading.Lock()


class Ignore(soma.Node):
    def forward(self, x: Any, ctx: Any) -> Any:
        called(ctx.node)
        if DOWN.exists():
            raise ConnectionError("down")
        return "done"


def test_an_output_that_does_not_pickle_warns_once_and_its_node_reruns_on_resume(
    journal: soma.Journal,
) -> None:
    def make() -> soma.Graph:
        return soma.Graph.somatize(
            soma.each(Unpicklable().named("lock")).named("items") >> Ignore().named("after")
        )

    DOWN.touch()
    with (
        pytest.warns(soma.JournalWarning, match="`items") as warned,
        pytest.raises(ConnectionError),
    ):
        make().forward([1, 2, 3], run="r", journal=journal)
    # Once a node: the inner node, and the step, whose whole output (a list of them) the
    # journal records too.
    said = [str(w.message) for w in warned if issubclass(w.category, soma.JournalWarning)]
    assert sorted(message.split("'")[0].split("`")[1] for message in said) == [
        "items",
        "items/lock",
    ]
    CALLS.clear()
    DOWN.unlink()
    with pytest.warns(soma.JournalWarning):
        assert make().resume("r", journal=journal) == "done"
    assert sorted(CALLS) == ["after", "items/lock", "items/lock", "items/lock"]


def test_an_input_that_does_not_pickle_is_a_type_error_before_any_node_runs(
    journal: soma.Journal,
) -> None:
    with pytest.raises(TypeError, match="cannot be recorded"):
        chain().forward(threading.Lock(), run="r", journal=journal)
    assert CALLS == []
    assert soma.runs(journal) == []


def test_a_node_importing_inside_its_function_is_recorded_and_not_called_again(
    journal: soma.Journal,
) -> None:
    class Hash(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            import hashlib

            called(ctx.node)
            return hashlib.sha256(str(x).encode()).hexdigest()

    class Use(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            called(ctx.node)
            if DOWN.exists():
                raise ConnectionError("down")
            return x[:8]

    def make() -> soma.Graph:
        return soma.Graph.somatize(Hash().named("hash") >> Use().named("use"))

    expected = make().forward(1)
    CALLS.clear()
    DOWN.touch()
    with pytest.raises(ConnectionError):
        make().forward(1, run="r", journal=journal)
    CALLS.clear()
    DOWN.unlink()
    assert make().resume("r", journal=journal) == expected
    assert CALLS == ["use"]


class AsksAtOnce(soma.Node):
    """Asks at once, and lets the later branch go on only then: its question is asked first."""

    def __init__(self, asked: threading.Event) -> None:
        self.asked = asked

    def forward(self, x: Any, ctx: Any) -> Any:
        self.asked.set()
        return ctx.ask("first?")


class AsksAfterTheOther(soma.Node):
    """Waits until the other branch has asked, then asks too: a sibling a question stopped
    would never get here."""

    def __init__(self, asked: threading.Event) -> None:
        self.asked = asked

    def forward(self, x: Any, ctx: Any) -> Any:
        assert self.asked.wait(DEADLINE), "the earlier branch never asked"
        return ctx.ask("second?")


class AsyncAsksAfterTheOther(soma.Node):
    def __init__(self, asked: threading.Event) -> None:
        self.asked = asked

    async def forward(self, x: Any, ctx: Any) -> Any:
        while not self.asked.is_set():  # Awaiting as a real call would, the loop free.
            await asyncio.sleep(0.001)
        return await ctx.aask("second?")


@pytest.mark.parametrize("later", [AsksAfterTheOther, AsyncAsksAfterTheOther])
def test_a_question_stops_no_sibling_so_a_branch_that_asks_later_still_asks_before_the_pause(
    journal: soma.Journal, later: type[soma.Node]
) -> None:
    asked = threading.Event()
    g = soma.Graph.somatize(
        AsksAtOnce(asked).named("now")
        | (soma.node(lambda x: x).named("prep") >> later(asked).named("later"))
    )
    with pytest.raises(soma.Paused) as paused:
        g.forward(1, run="r", journal=journal)
    assert paused.value.questions == {"later": "second?", "now": "first?"}
    assert g.resume("r", journal=journal, answers={"now": "a", "later": "b"}) == {
        "now": "a",
        "later": "b",
    }


def test_a_siblings_failure_comes_out_of_a_run_where_a_branch_asked(
    journal: soma.Journal,
) -> None:
    asked = threading.Event()

    def fails(x: Any) -> Any:
        assert asked.wait(DEADLINE), "the asking branch never asked"
        raise ValueError("broken")

    g = soma.Graph.somatize(AsksAtOnce(asked).named("now") | soma.node(fails).named("fails"))
    with pytest.raises(ValueError, match="broken"):
        g.forward(1, run="r", journal=journal)
    assert journal.run("r").status == "failed"
