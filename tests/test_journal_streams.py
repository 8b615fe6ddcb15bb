"""Streams with a journal: ``g.map(items, run="id", journal=j)`` (and ``amap``) is one run,
held from the call to the stream's end, whose items' nodes are recorded as they return, keyed
by content as a cache keys each item. ``map`` again with the same id — after an error, a close,
a pause, or a SIGKILL in another process — answers every node an item recorded from the journal
and calls the rest: the stream resumes at its first unfinished item. ``g.resume`` refuses a
stream (its items are the caller's); a node's ``ctx.ask`` pauses the stream at its item,
whatever ``on_error`` says; the run ends finished, failed or paused as the stream ends."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import soma
from conftest import DEADLINE, SUBPROCESS_DEADLINE, CallRecord, run_script

# Which node was called on which item, in order: keyed as an empty record, so a call changes
# no key (see `CallRecord`).
CALLED = CallRecord()
# The items node `b` fails on while listed here: listed or not, `b`'s key is the same.
FAIL_ON = CallRecord()
# What the effect of `Sends` did, in order.
SENT = CallRecord()


class A(soma.Node):
    def forward(self, x: int) -> int:
        CALLED.append(("a", x))
        return x + 1


class B(soma.Node):
    def forward(self, x: int) -> int:
        CALLED.append(("b", x - 1))
        if x - 1 in FAIL_ON:
            raise ValueError(f"b fails on item {x - 1}")
        return x * 10


class Asks(soma.Node):
    """Asks whether to keep an item from 2 on; returns it, or its negation when told no."""

    def forward(self, x: int, ctx: Any) -> int:
        CALLED.append(("q", x - 1))
        if x - 1 < 2:
            return x
        return x if ctx.ask(f"keep {x - 1}?") == "yes" else -x


class Sends(soma.Node):
    """Sends a message as an effect, then fails on the items `FAIL_ON` lists."""

    def forward(self, x: int, ctx: Any) -> int:
        ctx.effect(SENT.append, x)
        if x in FAIL_ON:
            raise ValueError(f"fails on {x} after sending")
        return x


class AsyncB(soma.Node):
    async def forward(self, x: int) -> int:
        await asyncio.sleep(0)
        CALLED.append(("b", x - 1))
        if x - 1 in FAIL_ON:
            raise ValueError(f"b fails on item {x - 1}")
        return x * 10


def chain() -> soma.Graph:
    return soma.Graph.somatize(A().named("a") >> B().named("b"))


def expected(n: int) -> list[int]:
    return [(x + 1) * 10 for x in range(n)]


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[soma.Journal]:
    CALLED.clear()
    FAIL_ON.clear()
    SENT.clear()
    j = soma.Journal(tmp_path / "runs.db")
    yield j
    j.close()
    FAIL_ON.clear()


def test_a_stream_with_an_id_records_every_items_nodes_and_ends_finished(
    journal: soma.Journal,
) -> None:
    assert list(chain().map(range(5), run="s", journal=journal)) == expected(5)
    record = journal.run("s")
    assert record.status == "finished"
    assert sorted(node for node, _, _ in journal.nodes("s")) == ["a"] * 5 + ["b"] * 5


def test_a_streams_run_counts_its_node_calls_never_a_done_of_total_above_its_total(
    journal: soma.Journal,
) -> None:
    assert list(chain().map(range(5), run="s", journal=journal)) == expected(5)
    record = journal.run("s")
    assert record.stream
    assert (record.done, record.nodes) == (10, 2)
    assert chain().forward(1, run="r", journal=journal) == 20
    assert not journal.run("r").stream
    listed = subprocess.run(
        [sys.executable, "-m", "soma.runs", "--journal", journal.target, "list"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_DEADLINE,
        check=True,
    ).stdout.splitlines()
    by_id = {line.split()[0]: line for line in listed}
    assert by_id["s"].endswith("10 calls")
    assert by_id["r"].endswith("2/2")


def test_map_again_after_an_item_failed_calls_nodes_only_from_the_first_unfinished_item_on(
    journal: soma.Journal,
) -> None:
    g = chain()
    FAIL_ON.append(3)
    with pytest.raises(ValueError, match="b fails on item 3"):
        list(g.map(range(6), run="s", journal=journal, in_flight=2))
    assert journal.run("s").status == "failed"
    first = list(CALLED)
    CALLED.clear()
    FAIL_ON.clear()
    assert list(g.map(range(6), run="s", journal=journal, in_flight=2)) == expected(6)
    assert journal.run("s").status == "finished"
    # Nothing before the first unfinished item is called again; past it, only what was not
    # recorded (a stage may have run ahead of the failure).
    assert all(item >= 3 for _, item in CALLED), CALLED
    assert ("b", 3) in CALLED
    again = [call for call in CALLED if call in first]
    assert again == [("b", 3)], (first, list(CALLED))


def test_items_finished_out_of_order_are_answered_from_the_journal_and_only_failed_ones_run(
    journal: soma.Journal,
) -> None:
    g = chain()
    FAIL_ON.append(0)
    unordered = dict(g.map(range(5), run="s", journal=journal, ordered=False, on_error="skip"))
    assert unordered == {i: (i + 1) * 10 for i in range(1, 5)}
    CALLED.clear()
    FAIL_ON.clear()
    assert dict(g.map(range(5), run="s", journal=journal, ordered=False)) == dict(
        enumerate(expected(5))
    )
    assert list(CALLED) == [("b", 0)]


def test_a_stream_that_skipped_failed_items_ends_failed_naming_how_many_and_the_first(
    journal: soma.Journal,
) -> None:
    FAIL_ON.extend([1, 3])
    stream = chain().map(range(5), run="s", journal=journal, on_error="skip")
    assert list(stream) == [10, 30, 50]
    record = journal.run("s")
    assert record.status == "failed"
    assert record.error == (
        "2 items failed; the first, item 1 at node `b`: ValueError: b fails on item 1"
    )


def test_a_stream_closed_before_its_end_ends_its_run_failed_and_map_again_finishes_it(
    journal: soma.Journal,
) -> None:
    g = chain()
    stream = g.map(range(5), run="s", journal=journal, in_flight=1)
    assert next(stream) == 10
    assert journal.run("s").status == "running"
    stream.close()
    record = journal.run("s")
    assert (record.status, record.error) == ("failed", "the stream was closed before its end")
    CALLED.clear()
    assert list(g.map(range(5), run="s", journal=journal)) == expected(5)
    assert ("a", 0) not in CALLED
    assert ("b", 0) not in CALLED


def test_a_stream_dropped_unclosed_lets_go_of_its_run(journal: soma.Journal) -> None:
    stream = chain().map(range(5), run="s", journal=journal, in_flight=1)
    next(stream)
    del stream
    gc.collect()
    assert journal.run("s").status == "failed"
    # Not held any more: taken up at once rather than refused with the holder's name.
    assert list(chain().map(range(5), run="s", journal=journal)) == expected(5)


def test_a_stream_holds_its_run_until_it_ends_so_a_second_map_of_it_is_refused(
    journal: soma.Journal,
) -> None:
    g = chain()
    with g.map(range(5), run="s", journal=journal) as stream:
        next(stream)
        with pytest.raises(soma.errors.RunHeldError):
            g.map(range(5), run="s", journal=journal)


def test_resume_refuses_a_stream_pointing_to_map_again(journal: soma.Journal) -> None:
    g = chain()
    list(g.map(range(3), run="s", journal=journal))
    with pytest.raises(soma.errors.JournalError, match=r"is a stream \(map\)") as refused:
        g.resume("s", journal=journal)
    assert "g.map(the same items, run='s', journal=j" in str(refused.value)
    assert refused.value.run == "s"


def test_forward_with_a_streams_id_and_map_with_a_runs_id_are_refused(
    journal: soma.Journal,
) -> None:
    g = chain()
    list(g.map(range(3), run="s", journal=journal))
    with pytest.raises(soma.errors.JournalError, match=r"`s` is a stream \(map\)"):
        g.forward(1, run="s", journal=journal)
    g.forward(1, run="f", journal=journal)
    with pytest.raises(soma.errors.JournalError, match="`f` is a run on one input"):
        g.map(range(3), run="f", journal=journal)


@pytest.mark.parametrize("on_error", ["raise", "skip", "collect"])
def test_an_ask_in_a_streamed_node_raises_paused_at_its_item_whatever_on_error_says(
    journal: soma.Journal, on_error: Any
) -> None:
    g = soma.Graph.somatize(A().named("a") >> Asks().named("q"))
    stream = g.map(range(5), run="s", journal=journal, on_error=on_error, in_flight=1)
    assert [next(stream), next(stream)] == [1, 2]
    with pytest.raises(soma.Paused) as paused:
        next(stream)
    assert paused.value.run == "s"
    assert paused.value.questions["q"] == "keep 2?"
    record = journal.run("s")
    assert record.status == "paused"
    assert record.questions["q"] == "keep 2?"


def test_map_again_with_answers_goes_on_from_the_question_without_calling_finished_items(
    journal: soma.Journal,
) -> None:
    g = soma.Graph.somatize(A().named("a") >> Asks().named("q"))
    answers: dict[str, str] = {}
    paused_at = 0
    for _ in range(4):  # Items 2, 3 and 4 ask once each; in_flight=1 meets them one by one.
        CALLED.clear()
        try:
            result = list(g.map(range(5), run="s", journal=journal, answers=answers, in_flight=1))
        except soma.Paused as paused:
            ((path, question),) = paused.questions.items()
            # The items before the one that asked last time finished: never called again.
            assert all(item >= paused_at for _, item in CALLED), (paused_at, list(CALLED))
            paused_at = int(str(question).split()[1].rstrip("?"))
            answers = {path: "no" if paused_at == 3 else "yes"}
            continue
        break
    assert paused_at == 4
    assert all(item >= 4 for _, item in CALLED), list(CALLED)
    assert result == [1, 2, 3, -4, 5]
    assert journal.run("s").status == "finished"


def test_answers_to_a_stream_without_an_id_are_refused() -> None:
    with pytest.raises(ValueError, match="answers are for a run's open questions"):
        chain().map(range(3), answers={"q": "yes"})


def test_an_effect_of_a_streamed_item_is_made_once_across_the_items_failure(
    journal: soma.Journal,
) -> None:
    g = soma.Graph.somatize(Sends().named("send"))
    FAIL_ON.append(2)
    assert list(g.map(range(4), run="s", journal=journal, on_error="collect"))[2].node == "send"
    FAIL_ON.clear()
    assert list(g.map(range(4), run="s", journal=journal)) == [0, 1, 2, 3]
    assert sorted(SENT) == [0, 1, 2, 3]


def test_amap_records_and_takes_up_a_stream_as_map_does(journal: soma.Journal) -> None:
    g = soma.Graph.somatize(A().named("a") >> AsyncB().named("b"))

    async def streamed() -> list[int]:
        return [y async for y in g.amap(range(5), run="s", journal=journal, in_flight=1)]

    FAIL_ON.append(3)
    with pytest.raises(ValueError, match="b fails on item 3"):
        asyncio.run(streamed())
    assert journal.run("s").status == "failed"
    CALLED.clear()
    FAIL_ON.clear()
    assert asyncio.run(streamed()) == expected(5)
    assert journal.run("s").status == "finished"
    assert all(item >= 3 for _, item in CALLED), CALLED


def test_an_ask_in_amap_raises_paused_at_its_item(journal: soma.Journal) -> None:
    g = soma.Graph.somatize(A().named("a") >> Asks().named("q"))

    async def streamed() -> list[int]:
        out = []
        async for y in g.amap(range(5), run="s", journal=journal, in_flight=1):
            out.append(y)
        return out

    with pytest.raises(soma.Paused) as paused:
        asyncio.run(streamed())
    assert list(paused.value.questions.values()) == ["keep 2?"]
    assert journal.run("s").status == "paused"


_KILLED_STREAM = """
import os, signal, sys, time
import soma

CALLS = {calls!r}

class A(soma.Node):
    def forward(self, x):
        with open(CALLS, "a") as out:
            out.write(f"a {{x}}\\n")
        return x + 1

class B(soma.Node):
    def forward(self, x):
        with open(CALLS, "a") as out:
            out.write(f"b {{x - 1}}\\n")
        return x * 10

g = soma.Graph.somatize(A().named("a") >> B().named("b"))
j = soma.Journal({db!r}, lease=0.3)
stream = g.map(range(40), run="killed", journal=j, in_flight=4)
if {kill!r}:
    for i, y in enumerate(stream):
        if i == 19:
            # Killed once items 0 to 19 are written down: what it wrote is all it leaves.
            deadline = time.monotonic() + 5.0
            while len(j.nodes("killed")) < 40 and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
print(list(stream))
"""


def test_a_stream_killed_in_another_process_is_taken_up_calling_exactly_the_unrecorded_nodes(
    tmp_path: Path,
) -> None:
    db, calls = str(tmp_path / "runs.db"), str(tmp_path / "calls.txt")
    killed = run_script(textwrap.dedent(_KILLED_STREAM.format(calls=calls, db=db, kill=True)))
    assert killed.returncode == -9, killed.stderr
    j = soma.Journal(db)
    deadline = time.monotonic() + DEADLINE
    while j.run("killed").status != "abandoned":  # Its holder is gone: its lease lapses.
        assert time.monotonic() < deadline, j.run("killed")
    recorded = {(node, seconds) for node, seconds, _ in j.nodes("killed")}
    assert len(j.nodes("killed")) >= 40, recorded
    before = len(j.nodes("killed"))
    Path(calls).write_text("")
    taken_up = run_script(textwrap.dedent(_KILLED_STREAM.format(calls=calls, db=db, kill=False)))
    assert taken_up.returncode == 0, taken_up.stderr
    assert taken_up.stdout.strip() == str(expected(40))
    called = Path(calls).read_text().split("\n")[:-1]
    assert len(called) == 80 - before, called
    assert not [line for line in called if int(line.split()[1]) < 20], called
    assert j.run("killed").status == "finished"


def test_a_streams_run_is_current_only_for_its_items_never_for_the_callers_other_runs(
    journal: soma.Journal,
) -> None:
    asking = soma.Graph.somatize(A().named("a") >> Asks().named("q"))
    with chain().map(range(5), run="s", journal=journal) as stream:
        assert next(stream) == 10
        # A run of the caller's without a journal has none to pause in, even mid-stream.
        with pytest.raises(RuntimeError, match="only with a journal"):
            asking.forward(2)
    assert journal.run("s").questions == {}


class AsyncAsks(soma.Node):
    async def forward(self, x: int, ctx: Any) -> int:
        CALLED.append(("q", x))
        if x == 2:
            answer: int = await ctx.aask("how much?")
            return answer
        return x


def test_map_of_a_graph_with_async_nodes_pauses_at_a_question_and_goes_on_with_its_answer(
    journal: soma.Journal,
) -> None:
    g = soma.Graph.somatize(AsyncAsks().named("q"))
    stream = g.map(range(4), run="s", journal=journal, in_flight=1)
    assert [next(stream), next(stream)] == [0, 1]
    with pytest.raises(soma.Paused) as paused:
        next(stream)
    assert paused.value.questions == {"q": "how much?"}
    CALLED.clear()
    assert list(g.map(range(4), run="s", journal=journal, answers={"q": 7})) == [0, 1, 7, 3]
    assert CALLED == [("q", 2), ("q", 3)]
