"""Watching runs in the browser (``soma.view``) and the offline report (``soma.report``): the
server over loopback with a real HTTP client, then a real headless Chromium reading the pages.

Each test's runs wait on events the test sets, so what a page shows is asked at a known moment,
never after a sleep; every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import soma
from conftest import DEADLINE, run_script
from soma._run import observe
from soma.view import pages, record

SCREENSHOTS = Path("/work")
EVIL_ID = "<script>alert(1)<_script>"
EVIL_MESSAGE = "<script>alert(1)</script>"


@pytest.fixture
def view() -> Iterator[Any]:
    opened = soma.view(port=0, quiet=True)
    try:
        yield opened
    finally:
        opened.close()


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=DEADLINE) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def address(opened: Any, path: str) -> str:
    return f"http://127.0.0.1:{opened.port}{path}"


class Gate:
    """A node that says it began, then waits until the test opens it (with a deadline)."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.open = threading.Event()

    def __call__(self, x: int) -> int:
        self.began.set()
        assert self.open.wait(DEADLINE), "the test never opened the gate"
        return x


def gated_graph(gate: Gate) -> soma.Graph:
    first = soma.node(lambda x: x + 1).named("first")
    held = soma.node(gate).named("held")
    last = soma.node(lambda x: x * 2).named("last")
    return soma.Graph.somatize(first >> held >> last)


def failing_graph() -> soma.Graph:
    def fails(x: int) -> int:
        raise ValueError(EVIL_MESSAGE)

    return soma.Graph.somatize(soma.node(lambda x: x).named(EVIL_ID) >> soma.node(fails))


def test_import_soma_imports_neither_starlette_nor_uvicorn() -> None:
    child = run_script(
        "import sys, soma\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'uvicorn'}))"
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "[]"


def test_a_view_prints_its_url_and_serves_the_runs_page_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    opened = soma.view(port=0)
    try:
        assert opened.url in capsys.readouterr().out
        status, page = get(opened.url)
        assert status == 200
        assert "<h1>Runs</h1>" in page
    finally:
        opened.close()


def test_the_runs_list_shows_each_run_with_graph_status_and_nodes_done(view: Any) -> None:
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    gated = Gate()
    gated.open.set()
    assert gated_graph(gated).forward(1) == 4
    status, body = get(address(view, "/api/runs"))
    assert status == 200
    runs = json.loads(body)
    # Newest first.
    assert [(run["status"], run["done"], run["total"]) for run in runs] == [
        ("finished", 3, 3),
        ("failed", 1, 2),
    ]
    assert runs[0]["graph"] == "first → last (3 nodes)"
    assert runs[1]["error"] == f"ValueError: {EVIL_MESSAGE}"
    _, page = get(address(view, "/"))
    assert page.index('data-run="2"') < page.index('data-run="1"')


def test_a_running_runs_row_counts_the_nodes_done_so_far_and_names_its_graph(
    view: Any,
) -> None:
    gated = Gate()
    graph = gated_graph(gated)
    worker = threading.Thread(target=graph.forward, args=(1,))
    worker.start()
    try:
        assert gated.began.wait(DEADLINE)
        [row] = json.loads(get(address(view, "/api/runs"))[1])
        assert (row["status"], row["done"], row["total"]) == ("running", 1, 3)
    finally:
        gated.open.set()
        worker.join(DEADLINE)
    graph.forward(1)
    rows = json.loads(get(address(view, "/api/runs"))[1])
    # The second run of the same graph takes the first's label.
    assert [row["graph"] for row in rows] == ["first → last (3 nodes)"] * 2


def test_the_runs_list_filters_by_status(view: Any) -> None:
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    gated = Gate()
    gated.open.set()
    gated_graph(gated).forward(1)
    _, body = get(address(view, "/api/runs?status=failed"))
    assert [run["status"] for run in json.loads(body)] == ["failed"]
    _, page = get(address(view, "/?status=finished"))
    assert 'data-status="finished"' in page
    assert 'data-status="failed"' not in page


def test_a_runs_page_draws_the_engines_plan_with_each_box_tagged_by_its_node(view: Any) -> None:
    gated = Gate()
    gated.open.set()
    graph = gated_graph(gated)
    graph.forward(1)
    status, page = get(address(view, "/runs/1"))
    assert status == 200
    # The engine's drawing, each box tagged: the same boxes as the plan's own SVG.
    assert page.count('<g class="node"') == graph.plan().to_svg().count('<g class="node"')
    for node in ("first", "held", "last"):
        assert f'data-node="{node}"' in page
    _, detail = get(address(view, "/api/runs/1/nodes/held"))
    shown = json.loads(detail)
    assert shown["state"] == "finished"
    assert shown["attempts"] == 1
    assert shown["row"] == threading.current_thread().name
    assert shown["output"] is None


def read_events(answer: Any) -> Iterator[tuple[str, Any]]:
    """The server-sent events of an open stream, as (event, data)."""
    kind = None
    for raw in answer:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: ") :]
        elif line.startswith("data: "):
            yield kind or "message", json.loads(line[len("data: ") :])


def test_a_runs_event_stream_delivers_a_node_state_change_as_it_happens(view: Any) -> None:
    gate = Gate()
    graph = gated_graph(gate)
    worker = threading.Thread(target=graph.forward, args=(1,))
    worker.start()
    try:
        assert gate.began.wait(DEADLINE)
        stream = urllib.request.urlopen(address(view, "/api/runs/1/events"), timeout=DEADLINE)
        events = read_events(stream)
        kind, first = next(events)
        assert kind == "snapshot"
        states = {node["id"]: node["state"] for node in first["nodes"]}
        assert states == {"first": "finished", "held": "running"}
        gate.open.set()
        seen: dict[str, str] = {}
        until = time.monotonic() + DEADLINE
        for _kind, data in events:
            seen.update({node["id"]: node["state"] for node in data.get("nodes", [])})
            if data["run"]["status"] == "finished" or time.monotonic() > until:
                break
        assert seen["held"] == "finished"
        assert seen["last"] == "finished"
        stream.close()
    finally:
        gate.open.set()
        worker.join(DEADLINE)


def test_a_run_pages_stream_sends_nothing_again_that_its_snapshot_showed(view: Any) -> None:
    gate = Gate()
    worker = threading.Thread(target=gated_graph(gate).forward, args=(1,))
    worker.start()
    try:
        assert gate.began.wait(DEADLINE)
        stream = urllib.request.urlopen(address(view, "/api/runs/1/events"), timeout=DEADLINE)
        events = read_events(stream)
        kind, snapshot = next(events)
        assert kind == "snapshot"
        assert {node["id"] for node in snapshot["nodes"]} == {"first", "held"}
        # Nothing changed since: the next message is the running run's heartbeat, no node in
        # it (a node sent again would hold a change that follows back by a tick).
        _kind, following = next(events)
        assert following.get("nodes", []) == []
    finally:
        gate.open.set()
        worker.join(DEADLINE)


def test_a_server_bound_beyond_loopback_refuses_a_request_without_its_token() -> None:
    opened = soma.view(port=0, host="0.0.0.0", quiet=True)
    try:
        assert opened.token is not None
        assert f"token={opened.token}" in opened.url
        assert get(address(opened, "/api/runs"))[0] == 403
        assert get(address(opened, "/api/runs?token=wrong"))[0] == 403
        assert get(address(opened, "/static/run.js"))[0] == 403
        assert get(address(opened, f"/api/runs?token={opened.token}"))[0] == 200
        assert get(address(opened, "/api/runs"), {"X-Soma-Token": opened.token})[0] == 200
        # The page's own links and scripts carry the token.
        _, page = get(address(opened, f"/?token={opened.token}"))
        assert f"/static/runs.js?token={opened.token}" in page
    finally:
        opened.close()


def test_a_server_on_loopback_needs_no_token(view: Any) -> None:
    assert view.token is None
    assert get(address(view, "/api/runs"))[0] == 200


def test_a_node_id_and_an_error_with_markup_are_escaped_on_every_page(
    view: Any, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    _, runs_page = get(address(view, "/"))
    _, run_page = get(address(view, "/runs/1"))
    soma.report(view.runs()[0], tmp_path / "run.html")
    report = (tmp_path / "run.html").read_text()
    for page in (runs_page, run_page, report):
        assert EVIL_MESSAGE not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for page in (run_page, report):
        assert EVIL_ID not in page
        assert "&lt;script&gt;alert(1)&lt;_script&gt;" in page


def test_pages_run_only_the_scripts_the_server_ships(view: Any) -> None:
    gate = Gate()
    gate.open.set()
    gated_graph(gate).forward(1)
    for path in ("/", "/runs/1"):
        with urllib.request.urlopen(address(view, path), timeout=DEADLINE) as answer:
            policy = answer.headers["Content-Security-Policy"]
        assert "script-src 'self';" in policy
        assert "default-src 'self';" in policy


def test_emitted_values_are_kept_as_type_size_and_a_short_repr_and_only_the_last(
    view: Any,
) -> None:
    def talks(x: int, ctx: soma.Ctx) -> int:
        for token in range(record.EMITS_KEPT + 50):
            ctx.emit("<b>" * 1000 if token == 0 else token)
        return x

    soma.Graph.somatize(soma.node(talks).named("talks")).forward(1)
    _, body = get(address(view, "/api/runs/1"))
    emits = json.loads(body)["emits"]
    assert len(emits) == record.EMITS_KEPT
    assert emits[-1] == {
        "type": "int",
        "size": None,
        "repr": str(record.EMITS_KEPT + 49),
        "node": "talks",
        "at": emits[-1]["at"],
    }
    shown = record.described("<b>" * 1000)
    assert shown["size"] == 3000
    assert len(shown["repr"]) <= 100


def test_an_emit_from_a_thread_a_node_starts_reaches_the_view_alone(view: Any) -> None:
    # The view alone listens: the engine calls its recorder directly, with no dispatch to make a
    # watched call of each node call; the run's own still carries the emit to it.
    assert observe.dispatch.telemetry is None
    assert observe.dispatch.streams == 0

    def talks(x: int, ctx: soma.Ctx) -> int:
        worker = threading.Thread(target=ctx.emit, args=("from a thread",))
        worker.start()
        worker.join(DEADLINE)
        return x

    soma.Graph.somatize(soma.node(talks).named("talks")).forward(1)
    snapshot = json.loads(get(address(view, "/api/runs/1"))[1])
    assert [(emit["node"], emit["repr"]) for emit in snapshot["emits"]] == [
        ("talks", "'from a thread'")
    ]


def test_a_retried_node_shows_its_attempts_and_a_timed_out_one_its_state(view: Any) -> None:
    calls: list[int] = []

    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            raise ConnectionError("once")
        return x

    retried = soma.Graph.somatize(soma.node(flaky).named("flaky"))
    retried.retry("flaky", times=2, backoff=0.0)
    retried.forward(1)
    never = threading.Event()

    def slow(x: int) -> int:
        never.wait(DEADLINE)
        return x

    timed = soma.Graph.somatize(soma.node(slow).named("slow"))
    timed.time_limit("slow", 0.05)
    with pytest.raises(soma.TimeLimitError):
        timed.forward(1)
    never.set()
    flaky_node = json.loads(get(address(view, "/api/runs/1/nodes/flaky"))[1])
    assert (flaky_node["state"], flaky_node["attempts"]) == ("finished", 2)
    spans = json.loads(get(address(view, "/api/runs/1"))[1])["spans"]
    assert [span["state"] for span in spans] == ["retrying", "finished"]
    slow_node = json.loads(get(address(view, "/api/runs/2/nodes/slow"))[1])
    assert slow_node["state"] == "timed_out"


def test_an_each_step_its_inner_nodes_and_a_streams_items_each_show_their_states(
    view: Any,
) -> None:
    split = soma.node(lambda x: [x, x + 1]).named("split")
    double = soma.node(lambda x: 2 * x).named("double")
    total = soma.node(sum).named("total")
    graph = soma.Graph.somatize(split >> soma.each(double) >> total)
    assert graph.forward(1) == 6
    assert list(graph.map([1, 2])) == [6, 10]
    runs = json.loads(get(address(view, "/api/runs"))[1])
    # The whole run, then each streamed item's, newest first.
    assert [(run["item"], run["done"], run["total"]) for run in runs] == [
        (1, 3, 3),
        (0, 3, 3),
        (None, 3, 3),
    ]
    snapshot = json.loads(get(address(view, "/api/runs/1"))[1])
    states = {node["id"]: node["state"] for node in snapshot["nodes"]}
    assert states == {
        "split": "finished",
        "each": "finished",
        "each/double": "finished",
        "total": "finished",
    }
    _, page = get(address(view, "/runs/1"))
    assert 'data-node="each/double"' in page


def test_async_nodes_each_have_the_timeline_row_of_their_task(view: Any) -> None:
    both = threading.Barrier(2)

    async def meets(x: int) -> int:
        await asyncio.to_thread(both.wait, DEADLINE)
        return x

    graph = soma.Graph.somatize(soma.node(meets).named("left") | soma.node(meets).named("right"))
    asyncio.run(graph.aforward(1))
    snapshot = json.loads(get(address(view, "/api/runs/1"))[1])
    rows = {node["id"]: node["row"] for node in snapshot["nodes"]}
    assert rows["left"].startswith("task ")
    assert rows["right"].startswith("task ")
    assert rows["left"] != rows["right"]


class Add(soma.Node):
    def __init__(self, k: int) -> None:
        self.k = k

    def forward(self, x: int) -> int:
        return x + self.k


def test_a_rerun_from_a_cache_shows_its_nodes_cached_and_done(view: Any) -> None:
    cache = soma.Cache()
    graph = soma.Graph.somatize(Add(1).named("one") >> Add(2).named("two"))
    assert graph.forward(1, cache=cache) == 4
    assert graph.forward(1, cache=cache) == 4
    rerun = json.loads(get(address(view, "/api/runs/2"))[1])
    assert {node["id"]: node["state"] for node in rerun["nodes"]} == {
        "one": "cached",
        "two": "cached",
    }
    assert (rerun["run"]["done"], rerun["run"]["total"]) == (2, 2)


def test_a_view_and_an_event_stream_watch_the_same_run_each_in_full(view: Any) -> None:
    def talks(x: int, ctx: soma.Ctx) -> int:
        ctx.emit("hello")
        return x

    graph = soma.Graph.somatize(Add(1).named("one") >> soma.node(talks).named("talks"))
    events = list(graph.events(1))
    assert [event.kind for event in events] == [
        "started",
        "finished",
        "started",
        "emitted",
        "finished",
        "result",
    ]
    snapshot = json.loads(get(address(view, "/api/runs/1"))[1])
    assert snapshot["run"]["status"] == "finished"
    assert [emit["repr"] for emit in snapshot["emits"]] == ["'hello'"]


def test_a_run_past_its_timeout_shows_timed_out_and_the_node_it_left_running_too(
    view: Any,
) -> None:
    never = threading.Event()

    def slow(x: int) -> int:
        never.wait(DEADLINE)
        return x

    graph = soma.Graph.somatize(soma.node(slow).named("slow"))
    with pytest.raises(TimeoutError):
        graph.forward(1, timeout=0.05)
    run = json.loads(get(address(view, "/api/runs/1"))[1])
    never.set()
    assert run["run"]["status"] == "timed_out"
    assert run["run"]["error"].startswith("TimeoutError: forward did not finish within")
    # Left to finish in the background, unwatched: the page no longer shows it running.
    assert [(node["state"], node["error"]) for node in run["nodes"]] == [
        ("timed_out", "left running when its run timed out")
    ]


class CountingRecorder(record.Recorder):
    """A recorder that counts the node calls the engine tells it of."""

    def __init__(self) -> None:
        self.calls: list[str | None] = []
        super().__init__()

    def began(self, kind: int, node: str | None, *rest: Any) -> Any:
        if kind == observe.CALL:
            self.calls.append(node)
        return super().began(kind, node, *rest)


def test_a_watched_runs_nodes_tell_python_nothing_unless_they_fail() -> None:
    recorder = CountingRecorder()
    observe.set_watcher(recorder)
    try:
        with pytest.raises(ValueError, match="alert"):
            failing_graph().forward(1)
    finally:
        observe.set_watcher(None)
    # The engine kept both states on the run's board: only the failure crossed into Python,
    # for its traceback.
    assert recorder.calls == ["fails"]
    [run] = recorder.runs()
    states = {node["id"]: node["state"] for node in run.nodes_json()}
    assert states == {EVIL_ID: "finished", "fails": "failed"}
    failed = run.node_json("fails", detail=True)
    assert failed is not None
    assert "ValueError" in failed["traceback"]
    assert failed["row"] == threading.current_thread().name


def test_a_watched_run_that_returns_runs_no_python_of_the_views_until_it_is_read() -> None:
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    graph = soma.Graph.somatize(
        soma.node(lambda x: x + 1).named("a") >> soma.node(lambda x: x * 2).named("b")
    )
    views_own = {record.__file__, observe.__file__}
    called: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename in views_own:
            called.append(frame.f_code.co_name)

    try:
        sys.setprofile(profile)
        try:
            assert graph.forward(1) == 4
        finally:
            sys.setprofile(None)
    finally:
        observe.set_watcher(None)
    # The run and its nodes went on its board, in the glue's ledger: nothing of the view's ran.
    assert called == []
    [run] = recorder.runs()
    assert run.status is record.RunStatus.FINISHED
    assert run.progress() == "2 / 2 nodes"
    states = {node["id"]: node["state"] for node in run.nodes_json()}
    assert states == {"a": "finished", "b": "finished"}


class CountingEveryWork(record.Recorder):
    """A recorder that counts every work the engine tells it of: runs, calls, parts."""

    def __init__(self) -> None:
        self.told: list[tuple[int, str | None]] = []
        super().__init__()

    def began(self, kind: int, node: str | None, *rest: Any) -> Any:
        self.told.append((kind, node))
        return super().began(kind, node, *rest)


def test_a_watched_streams_items_each_keep_a_board_and_tell_python_only_a_failure() -> None:
    recorder = CountingEveryWork()
    observe.set_watcher(recorder)

    def checked(x: int) -> int:
        if x == 3:
            raise ValueError("three")
        return x

    graph = soma.Graph.somatize(
        soma.node(lambda x: x + 1).named("a") >> soma.node(checked).named("b")
    )
    try:
        assert list(graph.map([0, 1])) == [1, 2]
        with pytest.raises(ValueError, match="three"):
            list(graph.map([2]))
    finally:
        observe.set_watcher(None)
    # Each item's run and its calls went on the item's board: only the failure was told.
    assert recorder.told == [(observe.CALL, "b")]
    listed = [(run.item, run.status, run.progress()) for run in recorder.runs()]
    assert listed == [
        (0, record.RunStatus.FAILED, "1 / 2 nodes"),
        (1, record.RunStatus.FINISHED, "2 / 2 nodes"),
        (0, record.RunStatus.FINISHED, "2 / 2 nodes"),
    ]
    failed = recorder.runs()[0].node_json("b", detail=True)
    assert failed is not None
    assert failed["state"] == "failed"
    assert "ValueError: three" in failed["traceback"]


def test_a_streamed_items_nodes_the_cache_answers_show_cached_on_its_board() -> None:
    recorder = CountingEveryWork()
    observe.set_watcher(recorder)
    graph = soma.Graph.somatize(
        soma.node(lambda x: x + 1).named("a") >> soma.node(lambda x: x * 2).named("b")
    )
    cache = soma.Cache()
    try:
        assert list(graph.map([1, 2], cache=cache)) == [4, 6]
        assert list(graph.map([1, 2], cache=cache)) == [4, 6]
    finally:
        observe.set_watcher(None)
    assert recorder.told == []
    newest = recorder.runs()[0]
    assert newest.item == 1
    assert {node["id"]: node["state"] for node in newest.nodes_json()} == {
        "a": "cached",
        "b": "cached",
    }


def test_what_a_streamed_items_node_emits_or_starts_is_that_items_runs_own(view: Any) -> None:
    inner = soma.Graph.somatize(soma.node(lambda x: x * 10).named("inner"))

    def talks(x: int, ctx: soma.Ctx) -> int:
        ctx.emit(f"item {x}")
        return int(inner.forward(x))

    graph = soma.Graph.somatize(soma.node(talks).named("talks"))
    assert list(graph.map([1, 2])) == [10, 20]
    runs = json.loads(get(address(view, "/api/runs"))[1])
    by_id = {run["id"]: run for run in runs}
    items = {run["item"]: run for run in runs if run["item"] is not None}
    for item, x in ((0, 1), (1, 2)):
        snapshot = json.loads(get(address(view, f"/api/runs/{items[item]['id']}"))[1])
        assert [emit["repr"] for emit in snapshot["emits"]] == [f"'item {x}'"]
    # Each forward a node started names the item's run it was started in as its parent.
    started = [run for run in runs if run["item"] is None]
    assert sorted(by_id[run["parent"]]["item"] for run in started) == [0, 1]


def test_a_run_started_by_a_watched_runs_node_names_that_run_as_its_parent() -> None:
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    inner = soma.Graph.somatize(soma.node(lambda x: x + 1).named("inner"))
    outer = soma.Graph.somatize(soma.node(lambda x: inner.forward(x)).named("outer"))
    try:
        assert outer.forward(1) == 2
        assert inner.forward(5) == 6
    finally:
        observe.set_watcher(None)
    listed = {run.id: run.as_json()["parent"] for run in recorder.runs()}
    assert listed == {"1": None, "2": "1", "3": None}


def test_runs_nobody_reads_wait_for_the_view_no_more_than_it_keeps() -> None:
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    graph = soma.Graph.somatize(soma.node(lambda x: x).named("one"))
    try:
        for _ in range(3 * record.FINISHED_KEPT):
            graph.forward(1)
        # What waits for the view to take it: the boards of the last runs it would keep.
        waiting = soma._soma.boarded_runs()
    finally:
        observe.set_watcher(None)
    # The ledger trims once it holds twice what the view keeps, down to that.
    assert record.FINISHED_KEPT <= len(waiting) <= 2 * record.FINISHED_KEPT
    assert waiting[-1].number - waiting[0].number == len(waiting) - 1


def test_a_run_in_flight_stays_listed_however_many_runs_end_after_it() -> None:
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    gate = Gate()
    quick = soma.Graph.somatize(soma.node(lambda x: x).named("quick"))
    worker = threading.Thread(target=gated_graph(gate).forward, args=(1,))
    worker.start()
    try:
        assert gate.began.wait(DEADLINE)
        for _ in range(2 * record.FINISHED_KEPT):
            quick.forward(1)
        listed = {run.id: run for run in recorder.runs()}
        assert listed["1"].status is record.RunStatus.RUNNING
        assert len(listed) == record.FINISHED_KEPT + 1
        gate.open.set()
        worker.join(DEADLINE)
        held = recorder.run("1")
        assert held is not None
        assert held.status is record.RunStatus.FINISHED
    finally:
        gate.open.set()
        worker.join(DEADLINE)
        observe.set_watcher(None)


def test_runs_are_listed_newest_first_whether_or_not_the_engine_keeps_their_board() -> None:
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    graph = soma.Graph.somatize(soma.node(lambda x: x + 1).named("one"))
    try:
        graph.forward(1)  # its board waits in the ledger until the list is read
        assert list(graph.map([1, 2])) == [2, 3]  # each item's run told as it begins
        graph.forward(2)
    finally:
        observe.set_watcher(None)
    listed = [(run.id, run.item) for run in recorder.runs()]
    assert listed == [("4", None), ("3", 1), ("2", 0), ("1", None)]


def test_a_runs_page_is_sent_the_newest_runs_a_tick_however_many_ended(
    view: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from soma.view import server

    monkeypatch.setattr(server, "RUNS_SENT", 3)
    stream = urllib.request.urlopen(address(view, "/api/runs/events"), timeout=DEADLINE)
    events = read_events(stream)
    kind, first = next(events)
    assert (kind, first) == ("runs", [])
    graph = soma.Graph.somatize(soma.node(lambda x: x).named("one"))
    for _ in range(20):
        graph.forward(1)
    sent: list[list[str]] = []
    until = time.monotonic() + DEADLINE
    for kind, rows in events:
        assert kind == "update"
        sent.append([row["id"] for row in rows])
        if "20" in sent[-1] or time.monotonic() > until:
            break
    stream.close()
    assert sent[-1][-1] == "20"
    assert all(len(ids) <= 3 for ids in sent), sent


def test_a_nodes_seconds_on_the_board_are_right_to_within_its_clocks_resolution() -> None:
    resolution = 0.001
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    try:
        naps = soma.node(lambda x: time.sleep(0.05) or x).named("naps")
        began = time.perf_counter()
        soma.Graph.somatize(naps).forward(1)
        took = time.perf_counter() - began
    finally:
        observe.set_watcher(None)
    [run] = recorder.runs()
    shown = run.node_json("naps", detail=True)
    assert shown is not None
    assert 0.05 - resolution <= shown["seconds"] <= took + resolution


def _naps_in(arrangement: str) -> tuple[Callable[[], object], str]:
    """A node that naps 30 ms, placed as ``arrangement`` says: how to run it once, and its id
    on its run's board."""
    naps = soma.node(lambda x: time.sleep(0.03) or x).named("naps")
    if arrangement == "alone":
        alone = soma.Graph.somatize(naps)
        return lambda: alone.forward(1), "naps"
    if arrangement == "a wave's branch":
        wave = soma.Graph.somatize(naps | soma.node(lambda x: x).named("beside"))
        return lambda: wave.forward(1), "naps"
    if arrangement == "an each's inner node":
        each = soma.Graph.somatize(soma.node(lambda x: [x]).named("split") >> soma.each(naps))
        return lambda: each.forward(1), "each/naps"
    assert arrangement == "a streamed item's node"
    streamed = soma.Graph.somatize(naps)
    return lambda: list(streamed.map([1])), "naps"


@pytest.mark.parametrize(
    "arrangement",
    ["alone", "a wave's branch", "an each's inner node", "a streamed item's node"],
)
def test_a_nodes_seconds_on_a_busy_machine_are_never_shorter_than_it_lasted(
    arrangement: str,
) -> None:
    # More spinning processes than cores: the board's ticking thread waits its turn, and its
    # tick is late; a node's end, read from the clock itself, is not.
    resolution = 0.001
    recorder = record.Recorder()
    spinners: list[subprocess.Popen[bytes]] = []
    took: list[float] = []
    # Everything after the first spinner starts is inside the `try`, and a spinner stops by
    # itself after a minute, should this process be killed before it kills them.
    spin = "import time\nuntil = time.monotonic() + 60\nprint(flush=True)\n"
    spin += "while time.monotonic() < until: pass"
    try:
        # One more than the cores this process may run on (a few dozen at most: a test's cost).
        for _ in range(min(len(os.sched_getaffinity(0)) + 1, 33)):
            spinners.append(
                subprocess.Popen(
                    [sys.executable, "-c", spin],
                    stdout=subprocess.PIPE,
                )
            )
        for spinner in spinners:
            assert spinner.stdout is not None
            spinner.stdout.readline()  # It spins from now on.
        observe.set_watcher(recorder)
        run, node = _naps_in(arrangement)
        for _ in range(20):
            began = time.perf_counter()
            run()
            took.append(time.perf_counter() - began)
    finally:
        observe.set_watcher(None)
        for spinner in spinners:
            spinner.kill()
            spinner.communicate()
    shown = [run.node_json(node, detail=True) for run in reversed(recorder.runs())]
    seconds = [node["seconds"] for node in shown if node is not None]
    assert len(seconds) == len(took) == 20
    assert all(0.03 <= s <= t + resolution for s, t in zip(seconds, took, strict=True)), (
        seconds,
        took,
    )


def test_closing_a_view_stops_recording(view: Any) -> None:
    assert observe.dispatch.watcher is not None
    view.close()
    assert observe.dispatch.watcher is None
    view.close()


def test_a_recorder_keeps_its_last_finished_runs_only() -> None:
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    try:
        graph = soma.Graph.somatize(soma.node(lambda x: x).named("one"))
        for _ in range(record.FINISHED_KEPT + 10):
            graph.forward(1)
    finally:
        observe.set_watcher(None)
    runs = recorder.runs()
    assert len(runs) == record.FINISHED_KEPT
    assert runs[0].id == str(record.FINISHED_KEPT + 10)


def test_a_recorder_frees_a_run_it_no_longer_keeps_with_the_cycle_collector_off() -> None:
    import gc
    import weakref

    recorder = record.Recorder()
    observe.set_watcher(recorder)
    graph = soma.Graph.somatize(soma.node(lambda x: x).named("one"))
    enabled = gc.isenabled()
    gc.disable()
    try:
        graph.forward(1)
        first = weakref.ref(recorder.runs()[0])
        for _ in range(record.FINISHED_KEPT):
            graph.forward(1)
        recorder.runs()  # What a page reads: the recorder takes the runs begun since.
        assert first() is None
    finally:
        observe.set_watcher(None)
        if enabled:
            gc.enable()


def test_a_recorder_keeps_finished_runs_within_its_budget_of_nodes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(record, "FINISHED_NODES_KEPT", 5)
    recorder = record.Recorder()
    observe.set_watcher(recorder)
    try:
        graph = soma.Graph.somatize(
            soma.node(lambda x: x).named("a")
            >> soma.node(lambda x: x).named("b")
            >> soma.node(lambda x: x).named("c")
        )
        for _ in range(4):
            graph.forward(1)
    finally:
        observe.set_watcher(None)
    # Three nodes a run: a second run kept would make six.
    assert [run.id for run in recorder.runs()] == ["4"]


def test_a_ring_keeps_its_last_entries_and_tells_a_reader_that_fell_behind() -> None:
    ring: record.Ring[int] = record.Ring(3)
    for entry in range(5):
        ring.append(entry)
    assert ring.since(0) == ([2, 3, 4], 5, True)
    assert ring.since(3) == ([3, 4], 5, False)


def test_a_report_is_one_self_contained_file_of_the_plan_states_timeline_and_errors(
    view: Any, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    path = tmp_path / "run.html"
    soma.report(view.runs()[0], path)
    page = path.read_text()
    # Nothing to fetch: no script or style from elsewhere, no link, no url().
    for fetched in ("<script", "<link", " src=", "url(", "@import"):
        assert fetched not in page
    assert "<style>" in page
    assert 'class="node state-finished" data-node="&lt;script' in page
    assert 'class="node state-failed" data-node="fails"' in page
    assert '<g class="span">' in page  # the trace's own timeline
    assert "Traceback" in page  # where the node raised it


def test_a_large_reports_drawings_are_gzipped_inside_it_with_their_states(
    view: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "INLINE_DRAWINGS", 10)
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    path = tmp_path / "run.html"
    soma.report(view.runs()[0], path)
    page = path.read_text()
    assert "<script src" not in page
    assert "<svg" not in page
    packed = re.search(r'<div id=plan data-gzip="([^"]+)">', page)
    assert packed is not None
    plan = gzip.decompress(base64.b64decode(packed.group(1))).decode()
    assert 'class="node state-failed" data-node="fails"' in plan


def test_a_report_of_a_trace_draws_its_timeline_and_with_a_graph_its_plan(
    tmp_path: Path,
) -> None:
    gate = Gate()
    gate.open.set()
    graph = gated_graph(gate)
    trace = soma.Trace()
    graph.forward(1, trace=trace)
    path = tmp_path / "trace.html"
    soma.report(trace, path, graph=graph)
    page = path.read_text()
    assert page.count('<g class="span">') == 3
    assert 'class="node state-finished" data-node="held"' in page


def test_a_report_refuses_a_run_still_running(view: Any) -> None:
    gate = Gate()
    worker = threading.Thread(target=gated_graph(gate).forward, args=(1,))
    worker.start()
    try:
        assert gate.began.wait(DEADLINE)
        with pytest.raises(ValueError, match="still running"):
            soma.report(view.runs()[0], os.devnull)
    finally:
        gate.open.set()
        worker.join(DEADLINE)


def test_python_m_soma_view_serves_until_ctrl_c() -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "soma.view", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killer = threading.Timer(30, child.kill)
    killer.start()
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.startswith("soma.view: watching runs at http://127.0.0.1:"), first
        url = first.split(" at ", 1)[1].strip()
        assert get(url + "api/runs") == (200, "[]")
        os.kill(child.pid, signal.SIGINT)
        _, err = child.communicate()
        assert child.returncode == 0, err
    finally:
        killer.cancel()
        if child.poll() is None:
            child.kill()
            child.wait()


# ---------------------------------------------------------------------------------------------
# A real headless Chromium (Debian's, installed by .ci/chromium-from-debian.sh)

CHROMIUM = shutil.which("chromium")
# A page shows what it is sent within a tick; a headless Chromium on a busy machine takes
# seconds to start and lay a page out, so the browser's waits have a deadline of their own.
BROWSER_DEADLINE = 30.0
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser() -> Iterator[Any]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip(
            "Debian's chromium and chromium-driver are not installed and could not be "
            "(.ci/chromium-from-debian.sh, which `make test` runs, needs root and apt)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    options.add_argument("--window-size=1200,900")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def box_state(driver: Any, node: str) -> str:
    classes: str = driver.execute_script(
        'const g = document.querySelector(`#plan g[data-node="${arguments[0]}"]`);'
        "return g ? g.getAttribute('class') : '';",
        node,
    )
    return next((c[len("state-") :] for c in classes.split() if c.startswith("state-")), "")


def wait_for(driver: Any, what: str, condition: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, BROWSER_DEADLINE, poll_frequency=0.02).until(
        lambda d: condition(d), message=f"the page never showed {what}"
    )


def test_chromium_shows_node_states_change_on_a_runs_page_as_the_run_goes(
    view: Any, browser: Any
) -> None:
    gate = Gate()

    def talks(x: int, ctx: soma.Ctx) -> int:
        for step in range(5):
            ctx.emit({"loss": 1.0 / (step + 1)})
        return x

    graph = soma.Graph.somatize(
        soma.node(lambda x: x + 1).named("first")
        >> (soma.node(gate).named("held") | soma.node(talks).named("talks"))
        >> soma.node(lambda xs: xs).named("last")
    )
    worker = threading.Thread(target=graph.forward, args=(1,))
    worker.start()
    try:
        assert gate.began.wait(DEADLINE)
        browser.get(address(view, "/runs/1"))
        wait_for(browser, "held running", lambda d: box_state(d, "held") == "running")
        wait_for(browser, "talks finished", lambda d: box_state(d, "talks") == "finished")
        assert box_state(browser, "first") == "finished"
        assert box_state(browser, "last") == "waiting"
        wait_for(browser, "the emitted values", lambda d: "loss" in d.page_source)
        browser.save_screenshot(str(SCREENSHOTS / "view-run-running.png"))
        gate.open.set()
        wait_for(browser, "last finished", lambda d: box_state(d, "last") == "finished")
        wait_for(
            browser,
            "the run finished",
            lambda d: d.find_element("id", "status").text == "finished",
        )
        browser.find_element("css selector", '#plan g[data-node="held"]').click()
        wait_for(
            browser,
            "the node's detail",
            lambda d: d.find_element("id", "detail").get_attribute("data-node") == "held",
        )
        browser.save_screenshot(str(SCREENSHOTS / "view-run-finished.png"))
    finally:
        gate.open.set()
        worker.join(DEADLINE)


def test_chromium_shows_the_runs_page_live_and_a_failed_runs_error_as_text(
    view: Any, browser: Any
) -> None:
    browser.get(address(view, "/"))
    wait_for(browser, "the stream open", lambda d: d.find_element("id", "live").text == "live")
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    gate = Gate()
    gate.open.set()
    gated_graph(gate).forward(1)
    wait_for(
        browser,
        "both runs",
        lambda d: len(d.find_elements("css selector", "#runs tbody tr")) == 2,
    )
    # No alert ran: the markup in the error is text on the page.
    assert EVIL_MESSAGE in browser.find_element("css selector", "#runs tbody").text
    browser.save_screenshot(str(SCREENSHOTS / "view-runs.png"))
    browser.get(address(view, "/runs/1"))
    wait_for(browser, "the failed node", lambda d: box_state(d, "fails") == "failed")
    browser.find_element("css selector", '#plan g[data-node="fails"]').click()
    wait_for(browser, "the traceback", lambda d: "Traceback" in d.find_element("id", "detail").text)
    browser.save_screenshot(str(SCREENSHOTS / "view-run-failed.png"))


def test_chromium_lists_no_more_runs_than_the_recorder_keeps(
    view: Any, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "FINISHED_KEPT", 5)
    browser.get(address(view, "/"))
    wait_for(browser, "the stream open", lambda d: d.find_element("id", "live").text == "live")
    graph = soma.Graph.somatize(soma.node(lambda x: x).named("one"))
    for _ in range(12):
        graph.forward(1)
    wait_for(
        browser,
        "the newest run",
        lambda d: bool(d.find_elements("css selector", '#runs tbody tr[data-run="12"]')),
    )
    rows = browser.find_elements("css selector", "#runs tbody tr")
    assert len(rows) == 5
    assert rows[0].get_attribute("data-run") == "12"


def test_chromium_opens_more_live_pages_in_one_tab_than_it_keeps_connections_each_at_once(
    view: Any, browser: Any
) -> None:
    # A browser opens at most six connections to one server, and keeps pages gone back from in
    # memory: a page that kept its stream open there made the seventh page wait until one timed
    # out (28 to 40 s). Each page here must go live well within that.
    from selenium.webdriver.support.ui import WebDriverWait

    graph = soma.Graph.somatize(soma.node(lambda x: x).named("one"))
    graph.forward(1)
    run_page = address(view, f"/runs/{view.runs()[0].id}")
    for page in [address(view, "/"), run_page] * 5:
        start = time.monotonic()
        browser.get(page)
        WebDriverWait(browser, 10.0, poll_frequency=0.02).until(
            lambda d: d.find_element("id", "live").text == "live",
            message=f"{page} never went live",
        )
        assert time.monotonic() - start < 10.0, f"{page} took {time.monotonic() - start:.1f} s"


def test_chromium_shows_a_page_gone_back_to_live_again(view: Any, browser: Any) -> None:
    graph = soma.Graph.somatize(soma.node(lambda x: x).named("one"))
    graph.forward(1)
    browser.get(address(view, "/"))
    wait_for(browser, "the runs page live", lambda d: d.find_element("id", "live").text == "live")
    browser.get(address(view, f"/runs/{view.runs()[0].id}"))
    wait_for(browser, "the run's page live", lambda d: d.find_element("id", "live").text == "live")
    browser.back()
    wait_for(browser, "the runs page again", lambda d: d.find_elements("id", "runs"))
    wait_for(
        browser, "the runs page live again", lambda d: d.find_element("id", "live").text == "live"
    )
    graph.forward(2)
    newest = view.runs()[0].id
    wait_for(
        browser,
        "the run begun since",
        lambda d: bool(d.find_elements("css selector", f'#runs tbody tr[data-run="{newest}"]')),
    )


def test_chromium_opens_the_offline_report_from_a_file_with_each_nodes_state(
    view: Any, browser: Any, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    path = tmp_path / "run.html"
    soma.report(view.runs()[0], path)
    view.close()  # no server: the file alone
    browser.get(path.as_uri())
    assert box_state(browser, "fails") == "failed"
    assert box_state(browser, EVIL_ID) == "finished"
    assert EVIL_MESSAGE in browser.find_element("id", "run-error").text
    browser.save_screenshot(str(SCREENSHOTS / "view-report.png"))


def test_chromium_inflates_a_large_reports_drawings_from_the_file_alone(
    view: Any, browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "INLINE_DRAWINGS", 10)
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    path = tmp_path / "run.html"
    soma.report(view.runs()[0], path)
    view.close()
    browser.get(path.as_uri())
    wait_for(browser, "the plan inflated", lambda d: box_state(d, "fails") == "failed")
    assert box_state(browser, EVIL_ID) == "finished"


def test_chromium_draws_a_large_plan_a_tile_at_a_time_each_box_with_its_nodes_state(
    view: Any, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from soma.view import drawing

    monkeypatch.setattr(drawing, "TILED_BOXES", 10)
    gate = Gate()
    expr: Any = soma.node(lambda x: x).named("step_0")
    for index in range(1, 80):
        expr = expr >> soma.node(lambda x: x).named(f"step_{index}")
    graph = soma.Graph.somatize(expr >> soma.node(gate).named("held"))
    worker = threading.Thread(target=graph.forward, args=(1,))
    worker.start()
    try:
        assert gate.began.wait(DEADLINE)
        browser.get(address(view, "/runs/1"))
        wait_for(browser, "step_0 finished", lambda d: box_state(d, "step_0") == "finished")
        # 81 boxes side by side, some 9,000 px: the far end is not in the page until scrolled to.
        assert browser.execute_script("return document.getElementById('plan-tiles') === null")
        assert box_state(browser, "held") == ""
        browser.execute_script(
            "const p = document.getElementById('plan'); p.scrollLeft = p.scrollWidth"
        )
        wait_for(browser, "held running", lambda d: box_state(d, "held") == "running")
        assert box_state(browser, "step_79") == "finished"
        gate.open.set()
        wait_for(browser, "held finished", lambda d: box_state(d, "held") == "finished")
        assert (
            browser.execute_script("return document.querySelectorAll('#plan g.node').length") < 81
        )
    finally:
        gate.open.set()
        worker.join(DEADLINE)


def test_chromium_opens_a_large_report_with_its_plan_drawn_and_its_table_listed_on_opening(
    view: Any, browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from soma.view import drawing

    monkeypatch.setattr(drawing, "TILED_BOXES", 1)
    with pytest.raises(ValueError, match="alert"):
        failing_graph().forward(1)
    path = tmp_path / "run.html"
    soma.report(view.runs()[0], path)
    view.close()
    browser.get(path.as_uri())
    wait_for(browser, "the plan drawn", lambda d: box_state(d, "fails") == "failed")
    assert box_state(browser, EVIL_ID) == "finished"
    assert browser.find_elements("css selector", "#nodes tbody tr") == []
    for summary in browser.find_elements("css selector", "details > summary"):
        summary.click()
    wait_for(
        browser,
        "the nodes listed",
        lambda d: len(d.find_elements("css selector", "#nodes tbody tr")) == 2,
    )
    wait_for(
        browser,
        "the timeline drawn",
        lambda d: len(d.find_elements("css selector", "#timeline g.span")) == 2,
    )
    assert EVIL_ID in browser.find_element("id", "nodes").text
