"""``g.events(x)`` and ``g.aevents(x)``: a run's events as they happen — started, finished,
failed, retried, timed out, paused, emitted — then its result, its pause or its error, last,
never raised; a run with a journal taken up begins with resumed; a branch's events in its
order; a slow reader never holding the run up."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import soma
from conftest import DEADLINE, Pass, Raise
from soma._run.events import RESULTS_WAITING
from test_one_walk import outcome, random_runs, twin
from test_policies import Flaky
from test_properties import Dag


class Emits(soma.Node):
    """Emits each word of its input, then returns how many it emitted."""

    def forward(self, x: str, ctx: Any) -> int:
        words = x.split()
        for word in words:
            ctx.emit(word)
        return len(words)


class Held(soma.Node):
    """Waits until released (or the deadline passes), then returns its input."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def forward(self, x: Any) -> Any:
        self.release.wait(DEADLINE)
        return x


def kinds(events: list[soma.Event]) -> list[tuple[str, str | None]]:
    return [(event.kind, event.node) for event in events]


def test_a_chains_events_are_each_node_started_then_finished_in_order_then_the_result() -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Pass().named("b"))
    events = list(g.events(3))
    assert kinds(events) == [
        ("started", "a"),
        ("finished", "a"),
        ("started", "b"),
        ("finished", "b"),
        ("result", None),
    ]
    assert events[-1].value == 3
    assert events[1].seconds is not None
    assert events[1].seconds >= 0
    assert events[-1].dropped == 0


def test_a_failed_run_ends_with_its_error_as_the_last_event_and_the_iterator_does_not_raise() -> (
    None
):
    error = ValueError("no")
    g = soma.Graph.somatize(Pass().named("a") >> Raise(error).named("bad"))
    events = list(g.events(1))
    assert kinds(events)[-2:] == [("failed", "bad"), ("error", None)]
    assert events[-2].value is error
    assert events[-1].value is error


def test_a_node_s_emitted_values_reach_the_reader_while_it_still_runs() -> None:
    seen = threading.Event()

    class Waits(soma.Node):
        def forward(self, x: Any, ctx: Any) -> Any:
            ctx.emit("first")
            # Returns only once the reader has seen the first value: a reader that only saw
            # events after the run would hang here, until the deadline fails the test.
            assert seen.wait(DEADLINE), "the reader never saw the value emitted"
            return "done"

    events = []
    for event in soma.Graph.somatize(Waits().named("w")).events(None):
        events.append(event)
        if event.kind == "emitted":
            seen.set()
    assert kinds(events) == [
        ("started", "w"),
        ("emitted", "w"),
        ("finished", "w"),
        ("result", None),
    ]
    assert events[1].value == "first"


def test_a_branch_s_events_keep_its_order_and_each_item_and_inner_node_is_named() -> None:
    g = soma.Graph.somatize(soma.each(Emits().named("say"), in_flight=2).named("lines"))
    events = list(g.events(["a b c", "d e"]))
    assert events[-1].kind == "result"
    assert events[-1].value == [3, 2]
    for item, words in ((0, ["a", "b", "c"]), (1, ["d", "e"])):
        mine = [event for event in events if event.item == item]
        assert [event.kind for event in mine] == ["started", *["emitted"] * len(words), "finished"]
        assert [event.value for event in mine if event.kind == "emitted"] == words
        assert {event.node for event in mine} == {"lines/say"}


def test_a_retried_call_says_retried_then_finished_on_its_second_attempt() -> None:
    g = soma.Graph.somatize(Flaky(1).named("f").retry(times=2, backoff=0.001))
    events = list(g.events(1))
    assert kinds(events) == [
        ("started", "f"),
        ("retried", "f"),
        ("started", "f"),
        ("finished", "f"),
        ("result", None),
    ]
    assert isinstance(events[1].value, ConnectionError)
    assert [events[0].attempt, events[2].attempt, events[3].attempt] == [0, 1, 1]


def test_a_call_past_its_time_limit_says_timed_out() -> None:
    held = Held()
    g = soma.Graph.somatize(held.named("slow").time_limit(0.05))
    try:
        events = list(g.events(1))
    finally:
        # The call past its limit was left to finish on its thread: it finishes now.
        held.release.set()
    assert kinds(events) == [("started", "slow"), ("timed_out", "slow"), ("error", None)]
    assert isinstance(events[1].value, soma.TimeLimitError)
    assert isinstance(events[-1].value, soma.TimeLimitError)


def test_a_node_the_cache_answers_says_finished_cached() -> None:
    cache = soma.Cache()
    g = soma.Graph.somatize(Pass().named("a"))
    g.forward(1, cache=cache)
    events = list(g.events(1, cache=cache))
    assert kinds(events) == [("finished", "a"), ("result", None)]
    assert events[0].cached


def test_a_slow_reader_never_holds_the_run_up_newer_events_are_dropped_and_counted() -> None:
    ended = threading.Event()

    class End(soma.Node):
        def forward(self, x: Any) -> Any:
            ended.set()
            return x

    g = soma.Graph.somatize(Emits().named("say") >> End().named("end"))
    words = " ".join(str(n) for n in range(100))
    stream = g.events(words, buffer=5)
    first = next(stream)
    # The reader reads nothing more until the run has reached its last node: a run held up by
    # its reader would never get there.
    assert ended.wait(DEADLINE), "the run waited for its reader"
    rest = list(stream)
    assert first.kind == "started"
    last = rest[-1]
    assert last.kind == "result"
    assert last.value == 100
    # started, 100 emitted and finished of `say`, started and finished of `end`.
    told = 104
    received = 1 + len(rest) - 1
    assert received <= 1 + 5 + 1
    assert received + last.dropped == told


def test_aevents_streams_tokens_from_two_async_branches_as_they_come() -> None:
    both = asyncio.Event()
    started: list[str] = []

    class Tokens(soma.Node):
        async def forward(self, x: str, ctx: Any) -> int:
            started.append(ctx.node)
            if len(started) == 2:
                both.set()
            # Each branch emits only once both run: tokens of the two interleave on the loop.
            await asyncio.wait_for(both.wait(), DEADLINE)
            for word in x.split():
                ctx.emit(word)
                await asyncio.sleep(0)
            return len(x.split())

    g = soma.Graph.somatize(Tokens().named("left") | Tokens().named("right"))

    async def main() -> list[soma.Event]:
        return [event async for event in g.aevents("one two three")]

    events = asyncio.run(main())
    emitted = [event.node for event in events if event.kind == "emitted"]
    assert sorted(emitted) == ["left"] * 3 + ["right"] * 3
    assert emitted != sorted(emitted), "the two branches' tokens did not interleave"
    assert events[-1].kind == "result"
    assert events[-1].value == {"left": 3, "right": 3}


def test_leaving_aevents_early_cancels_the_run() -> None:
    cancelled = asyncio.Event()

    class Forever(soma.Node):
        async def forward(self, x: Any, ctx: Any) -> Any:
            ctx.emit("up")
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    g = soma.Graph.somatize(Forever().named("forever"))

    async def main() -> None:
        async for event in g.aevents(None):
            if event.kind == "emitted":
                break
        await asyncio.wait_for(cancelled.wait(), DEADLINE)

    asyncio.run(main())


class Token:
    """A value a node emits, whose life the test follows."""


def test_a_run_that_nobody_watches_sends_its_emits_nowhere() -> None:
    emitted: list[weakref.ref[Token]] = []

    class EmitsTokens(soma.Node):
        def forward(self, x: int, ctx: Any) -> int:
            for _ in range(x):
                token = Token()
                emitted.append(weakref.ref(token))
                ctx.emit(token)
            return x

    # Another run is watched meanwhile, from this thread: its stream is open and listening
    # while the unwatched run emits, and takes none of what that run emits.
    held = Held()
    watched = soma.Graph.somatize(Emits().named("other") >> held.named("held"))
    stream = watched.events("c d")
    seen = [next(stream)]
    assert kinds(seen) == [("started", "other")]
    assert soma.Graph.somatize(EmitsTokens().named("say")).forward(3) == 3
    held.release.set()
    seen += list(stream)
    assert [event.value for event in seen if event.kind == "emitted"] == ["c", "d"], seen
    assert all(event.node != "say" for event in seen), seen
    # Nothing kept what was emitted: no buffer, no listener, no stream holds it.
    assert len(emitted) == 3
    gc.collect()
    assert [ref() for ref in emitted] == [None, None, None]


@settings(max_examples=30, deadline=None)
@given(random_runs(), st.integers(min_value=0, max_value=20), st.booleans())
def test_each_call_of_a_random_run_starts_then_ends_once_and_the_last_event_is_its_outcome(
    run_of: tuple[Dag, dict[str, tuple[int, int, int | None]], set[str]],
    x: int,
    asynchronously: bool,
) -> None:
    dag, shapes, asynced = run_of
    expected = outcome(lambda: twin(dag, shapes, asynced).forward(x))
    g = twin(dag, shapes, asynced)
    if asynchronously:

        async def read() -> list[soma.Event]:
            return [event async for event in g.aevents(x)]

        events = asyncio.run(read())
    else:
        events = list(g.events(x))
    last = events[-1]
    if expected[0] == "value":
        assert (last.kind, last.value) == ("result", expected[1])
    else:
        assert last.kind == "error"
        assert f"{type(last.value).__name__}: {last.value}" == expected[1]
    open_calls: set[tuple[str | None, int]] = set()
    for event in events[:-1]:
        key = (event.node, event.attempt)
        if event.kind == "started":
            assert key not in open_calls, key
            open_calls.add(key)
        else:
            assert event.kind in ("finished", "failed", "retried", "timed_out"), event
            open_calls.remove(key)
    assert open_calls == set()


def test_a_run_past_its_timeout_ends_with_the_timeout_as_its_last_event() -> None:
    held = Held()
    g = soma.Graph.somatize(Pass().named("a") >> held.named("stuck"))
    try:
        events = list(g.events(1, timeout=0.2))
    finally:
        held.release.set()
    assert kinds(events)[:3] == [("started", "a"), ("finished", "a"), ("started", "stuck")]
    assert events[-1].kind == "error"
    assert isinstance(events[-1].value, TimeoutError)


class AsyncStuck(soma.Node):
    """Waits for ever, until its run is cancelled."""

    async def forward(self, x: Any) -> Any:
        await asyncio.Event().wait()


def test_an_async_node_the_runs_deadline_cancelled_says_timed_out_on_events_and_aevents() -> None:
    g = soma.Graph.somatize(Pass().named("a") >> AsyncStuck().named("stuck"))

    async def read() -> list[soma.Event]:
        return [event async for event in g.aevents(1, timeout=0.2)]

    for events in (list(g.events(1, timeout=0.2)), asyncio.run(read())):
        assert kinds(events) == [
            ("started", "a"),
            ("finished", "a"),
            ("started", "stuck"),
            ("timed_out", "stuck"),
            ("error", None),
        ]
        assert isinstance(events[3].value, TimeoutError)
        assert isinstance(events[-1].value, TimeoutError)
        assert "`stuck`" in str(events[-1].value)


class CatchesItsOwnTimeout(soma.Node):
    async def forward(self, x: Any) -> Any:
        async with asyncio.timeout(0.01):
            await asyncio.Event().wait()


def test_an_async_nodes_own_timeout_error_says_failed_not_timed_out() -> None:
    g = soma.Graph.somatize(CatchesItsOwnTimeout().named("own"))
    events = list(g.events(1, timeout=DEADLINE))
    assert kinds(events) == [("started", "own"), ("failed", "own"), ("error", None)]
    assert type(events[1].value) is TimeoutError


def test_micro_batches_tell_each_slices_nodes_with_the_slices_index() -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Pass().named("b"))
    events = list(g.events([1, 2, 3, 4], micro_batches=2))
    assert events[-1].kind == "result"
    assert events[-1].value == [1, 2, 3, 4]
    for item in (0, 1):
        mine = [(event.kind, event.node) for event in events if event.item == item]
        assert mine == [("started", "a"), ("finished", "a"), ("started", "b"), ("finished", "b")]


def test_map_events_give_each_items_result_with_its_index_and_a_failing_items_error_last() -> None:
    class Picky(soma.Node):
        def forward(self, x: int) -> int:
            if x == 2:
                raise ValueError("two")
            return x * 10

    g = soma.Graph.somatize(Picky().named("p"))
    events = list(g.map_events([0, 1, 2, 3]))
    results = [(event.item, event.value) for event in events if event.kind == "result"]
    assert results == [(0, 0), (1, 10)]
    last = events[-1]
    assert last.kind == "error"
    assert last.item == 2
    assert isinstance(last.value, ValueError)
    assert [event.item for event in events if event.kind == "failed"] == [2]


def test_a_graph_run_inside_a_node_tells_its_nodes_in_the_outer_runs_events() -> None:
    inner = soma.Graph.somatize(Emits().named("inner_say"))

    class Outer(soma.Node):
        def forward(self, x: str) -> int:
            return int(inner.forward(x))

    g = soma.Graph.somatize(Outer().named("outer"))
    events = list(g.events("a b"))
    assert kinds(events) == [
        ("started", "outer"),
        ("started", "inner_say"),
        ("emitted", "inner_say"),
        ("emitted", "inner_say"),
        ("finished", "inner_say"),
        ("finished", "outer"),
        ("result", None),
    ]


def test_amap_events_give_each_items_result_in_input_order() -> None:
    class Later(soma.Node):
        async def forward(self, x: int) -> int:
            await asyncio.sleep(0)
            return x + 1

    g = soma.Graph.somatize(Later().named("later"))

    async def read() -> list[soma.Event]:
        return [event async for event in g.amap_events(range(3))]

    events = asyncio.run(read())
    assert [(event.item, event.value) for event in events if event.kind == "result"] == [
        (0, 1),
        (1, 2),
        (2, 3),
    ]
    assert sorted(event.item for event in events if event.kind == "started") == [0, 1, 2]


def events_thread(before: set[threading.Thread]) -> threading.Thread:
    """The thread an events stream started since `before` runs its run on."""
    (runner,) = [
        thread
        for thread in threading.enumerate()
        if thread.name == "soma-events" and thread not in before
    ]
    return runner


def waits_for_the_reader(runner: threading.Thread) -> bool:
    """Whether the events thread `runner` is waiting for room among the results waiting for
    the reader (in `finish`, parked in the wait for room): it hands the run no further."""
    frame = sys._current_frames().get(runner.ident or 0)
    stack = []
    while frame is not None:
        stack.append(frame.f_code.co_name)
        frame = frame.f_back
    return bool(stack) and stack[0] == "wait" and "finish" in stack


def held_back(runner: threading.Thread, streams: list[soma.Stream]) -> soma.StreamFigures:
    """Waits until the stream behind an events reader is held back by it, and returns the
    stream's figures then: the events thread waits for the reader to take a result, and every
    item the stream read has gone through its node, the stream having read ahead of what it
    handed on. Nothing then starts until the reader reads: a state, not a quiet moment."""
    until = time.monotonic() + DEADLINE
    while True:
        figures = streams[0].figures() if streams else None
        if (
            figures is not None
            and waits_for_the_reader(runner)
            and figures.stages[0].items == figures.read > figures.succeeded
        ):
            return figures
        assert time.monotonic() < until, f"the stream was never held back: {figures}"
        time.sleep(0.001)


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> list[soma.Stream]:
    """Every stream `Graph.map` opens during the test, `map_events`' own included."""
    opened: list[soma.Stream] = []
    original = soma.Graph.map

    def map(graph: soma.Graph, *args: Any, **kwargs: Any) -> soma.Stream:
        stream = original(graph, *args, **kwargs)
        opened.append(stream)
        return stream

    monkeypatch.setattr(soma.Graph, "map", map)
    return opened


def test_a_streams_results_wait_for_a_slow_reader_at_most_a_bound_never_dropped(
    streams: list[soma.Stream],
) -> None:
    started: list[int] = []

    class Counts(soma.Node):
        def forward(self, x: int) -> int:
            started.append(x)
            return x

    g = soma.Graph.somatize(Counts().named("c"))
    before = set(threading.enumerate())
    stream = g.map_events(range(10_000), in_flight=4)
    first = next(event for event in stream if event.kind == "result")
    assert first.item == 0
    # The reader takes nothing more: the stream goes no further than the results waiting for
    # it and the items in flight behind them, where it would run on to the end.
    figures = held_back(events_thread(before), streams)
    assert figures.succeeded >= 1 + RESULTS_WAITING, figures
    assert len(started) == figures.read <= 1 + RESULTS_WAITING + 4 + 4, figures
    rest = [event for event in stream if event.kind == "result"]
    assert [event.item for event in rest] == list(range(1, 10_000))
    assert len(started) == 10_000


def test_leaving_map_events_early_stops_the_stream() -> None:
    started: list[int] = []

    class Counts(soma.Node):
        def forward(self, x: int) -> int:
            started.append(x)
            return x

    g = soma.Graph.somatize(Counts().named("c"))
    before = set(threading.enumerate())
    stream = g.map_events(range(100_000), in_flight=4)
    for event in stream:
        if event.kind == "result":
            break
    runner = events_thread(before)
    stream.close()
    # The run's thread ends once it has closed the stream, which returns once every stage
    # has stopped: nothing starts after that.
    runner.join(DEADLINE)
    assert not runner.is_alive()
    assert len(started) < 1_000, len(started)


def test_leaving_amap_events_early_stops_the_stream() -> None:
    started: list[int] = []

    class Counts(soma.Node):
        async def forward(self, x: int) -> int:
            started.append(x)
            await asyncio.sleep(0)
            return x

    g = soma.Graph.somatize(Counts().named("c"))

    async def main() -> None:
        stream = g.amap_events(range(100_000), in_flight=4)
        async for event in stream:
            if event.kind == "result":
                break
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(main())
    assert len(started) < 1_000, len(started)


class Approves(soma.Node):
    """Asks a person whether to go on; returns its input once told yes."""

    def forward(self, x: int, ctx: Any) -> int:
        if ctx.ask(f"go on with {x}?") != "yes":
            raise ValueError("told no")
        return x


class AsksInTasks(soma.Node):
    """An async node whose two tasks each ask, in a TaskGroup: the group gathers both asks."""

    async def forward(self, x: int, ctx: Any) -> int:
        async with asyncio.TaskGroup() as group:
            first = group.create_task(ctx.aask("first?"))
            second = group.create_task(ctx.aask("second?"))
        return x + len(await first) + len(await second)


def test_a_run_that_asks_says_paused_for_the_node_then_paused_last_rather_than_error(
    tmp_path: Path,
) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Approves().named("ask"))
    journal = soma.Journal(tmp_path / "runs.db")
    events = list(g.events(3, run="r", journal=journal))
    assert kinds(events) == [
        ("started", "a"),
        ("finished", "a"),
        ("started", "ask"),
        ("paused", "ask"),
        ("paused", None),
    ]
    assert events[3].value == "go on with 3?"
    assert isinstance(events[-1].value, soma.Paused)
    assert events[-1].value.questions == {"ask": "go on with 3?"}


def test_an_async_node_whose_tasks_ask_says_paused_not_failed(tmp_path: Path) -> None:
    g = soma.Graph.somatize(AsksInTasks().named("ask"))
    journal = soma.Journal(tmp_path / "runs.db")
    events = list(g.events(3, run="r", journal=journal))
    assert kinds(events) == [("started", "ask"), ("paused", "ask"), ("paused", None)]
    assert events[1].value in ("first?", "second?")


def test_a_run_taken_up_from_its_journal_begins_with_resumed_and_a_new_one_does_not(
    tmp_path: Path,
) -> None:
    g = soma.Graph.somatize(Pass().named("a") >> Approves().named("ask"))
    journal = soma.Journal(tmp_path / "runs.db")
    first = list(g.events(3, run="r", journal=journal))
    assert first[0].kind == "started"
    assert journal.run("r").status == "paused"
    events = list(g.events(3, run="r", journal=journal))
    assert (events[0].kind, events[0].node, events[0].value) == ("resumed", None, "r")
    assert kinds(events)[1:] == [
        ("finished", "a"),
        ("started", "ask"),
        ("paused", "ask"),
        ("paused", None),
    ]
    assert events[1].cached


def test_a_stream_that_asks_ends_its_map_events_with_paused_and_map_again_begins_resumed(
    tmp_path: Path,
) -> None:
    g = soma.Graph.somatize(Approves().named("ask"))
    journal = soma.Journal(tmp_path / "runs.db")
    events = list(g.map_events([1], run="s", journal=journal))
    assert [event.kind for event in events] == ["started", "paused", "paused"]
    assert isinstance(events[-1].value, soma.Paused)
    again = list(g.map_events([1], run="s", journal=journal, answers={"ask": "yes"}))
    assert [(event.kind, event.value) for event in again if event.node is None] == [
        ("resumed", "s"),
        ("result", 1),
    ]
