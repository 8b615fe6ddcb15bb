"""The view's web server: Starlette served by uvicorn on a thread of its own, reading a
:class:`~soma.view.record.RunSource` and pushing what changed to each open page by server-sent
events.

Each page's stream is a loop of its own that sends, at most once a :data:`TICK`, what
changed since it last sent — each changed node once, with its latest state, the spans ended
and the values emitted since — so a run that changes a node 100,000 times a second costs a page
one message per tick, bounded by the run's size, and the run itself never waits for a page: it
only appends to its log, which the page's stream folds into the nodes' records at each poll
(``soma.view.record.RunRecord.fold``). A page that fell behind a log's window is
sent the whole state again.

Imported only by ``soma.view(...)``: ``import soma`` never imports Starlette or uvicorn.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from soma.errors import JournalError
from soma.view import pages
from soma.view.journaled import JournalSource
from soma.view.record import RunRecord, RunSource, span_json

# A page's stream looks for changes every POLL seconds and sends what changed at most once a
# TICK: a state change reaches an open page within a tick and the time to send it. Each look
# takes the interpreter from the runs for a moment, so a stream looks no more often than it may
# send: at 10 ms, an open page that had nothing to send cost a chain of trivial nodes 2 to 3% (the
# GIL handed over a hundred times a second). A running run's times move on: its row is sent at
# least every HEARTBEAT.
POLL: Final = 0.05
TICK: Final = 0.05
HEARTBEAT: Final = 0.25
# The runs page's stream looks and sends at most once a RUNS_TICK: a list of runs, whose rows
# change as runs begin and end, which a person reads at a glance; the node states of a run are a
# run's page's, at every TICK.
RUNS_TICK: Final = 0.2
# How many of a run's kept spans a page's first message carries (the timeline's latest; the
# page draws as many).
SPANS_SENT: Final = 500
# How many of the runs that began or ended since the last tick a runs page is sent (the newest),
# besides the runs in flight: a process that runs thousands of short runs a second costs its
# page's stream a bounded message a tick, and its runs a bounded share of the interpreter.
RUNS_SENT: Final = 20
# A comment sent on an idle stream this often, so that a page sees a closed server.
KEEPALIVE: Final = 15.0
STATIC: Final = Path(__file__).parent / "static"
# The pages run only the scripts and styles the server ships: should a run's text ever slip
# through unescaped, a browser would still refuse to run it.
PAGE_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _event(kind: str, data: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class _TokenGate:
    """Refuses every request without the token (``?token=`` or the ``X-Soma-Token`` header),
    when the server has one: bound beyond loopback, a page could resume runs (the durable-runs
    issue) and shows what runs do."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is not None and scope["type"] == "http":
            request = Request(scope)
            given = request.query_params.get("token") or request.headers.get("x-soma-token", "")
            if not secrets.compare_digest(given.encode(), self.token.encode()):
                response = Response("a token is needed: the one printed at start\n", 403)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def application(source: RunSource, token: str | None, closing: threading.Event) -> ASGIApp:
    """The view's ASGI application over ``source``; its streams end once ``closing`` is set."""

    def found(request: Request) -> RunRecord | None:
        return source.run(request.path_params["run_id"])

    async def runs_page(request: Request) -> Response:
        status = request.query_params.get("status")
        return HTMLResponse(pages.runs_page(source.runs(), status, token), headers=PAGE_HEADERS)

    async def run_page(request: Request) -> Response:
        run = found(request)
        if run is None:
            missing = pages.missing(request.path_params["run_id"], token)
            return HTMLResponse(missing, 404, headers=PAGE_HEADERS)
        # The plan is drawn on the server's thread, off the run's.
        drawing = await asyncio.to_thread(pages.run_drawing, run)
        return HTMLResponse(pages.run_page(run, drawing, token), headers=PAGE_HEADERS)

    async def runs_json(request: Request) -> Response:
        status = request.query_params.get("status")
        rows = [run.as_json() for run in source.runs() if status in (None, run.status.value)]
        return JSONResponse(rows)

    async def run_json(request: Request) -> Response:
        run = found(request)
        if run is None:
            return JSONResponse({"error": "no such run"}, 404)
        return JSONResponse(_snapshot(run))

    async def node_json(request: Request) -> Response:
        run = found(request)
        node = None if run is None else run.node_json(request.path_params["node"], detail=True)
        if node is None:
            return JSONResponse({"error": "no such node in this run, or not begun"}, 404)
        return JSONResponse(node)

    async def answer_page(request: Request) -> Response:
        return await _answer(request, source, token)

    async def runs_events(request: Request) -> Response:
        return _streamed(_runs_stream(source, closing))

    async def run_events(request: Request) -> Response:
        run = found(request)
        if run is None:
            return JSONResponse({"error": "no such run"}, 404)
        return _streamed(_run_stream(run, closing))

    app = Starlette(
        routes=[
            Route("/", runs_page),
            Route("/runs/{run_id}", run_page),
            Route("/runs/{run_id}/answer", answer_page, methods=["GET", "POST"]),
            Route("/api/runs", runs_json),
            Route("/api/runs/events", runs_events),
            Route("/api/runs/{run_id}", run_json),
            Route("/api/runs/{run_id}/events", run_events),
            Route("/api/runs/{run_id}/nodes/{node:path}", node_json),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
    return _TokenGate(app, token)


async def _answer(request: Request, source: RunSource, token: str | None) -> Response:
    """A paused run's form (GET), and its answers (POST): recorded in the run's journal, the run
    resumed where this process holds its graph, and the browser sent to the run's page."""
    run_id = request.path_params["run_id"]
    if not isinstance(source, JournalSource):
        return HTMLResponse(pages.missing(run_id, token), 404, headers=PAGE_HEADERS)
    journal = source.journal
    try:
        run = await asyncio.to_thread(journal.run, run_id)
    except JournalError:
        return HTMLResponse(pages.missing(run_id, token), 404, headers=PAGE_HEADERS)
    if request.method == "GET":
        page = pages.answer_page(run_id, run.questions, token)
        return HTMLResponse(page, headers=PAGE_HEADERS)
    body = (await request.body()).decode("utf-8", "replace")
    answers = {path: values[-1] for path, values in urllib.parse.parse_qs(body).items()}
    try:
        await asyncio.to_thread(source.answer, run_id, answers)
    except JournalError as refused:
        page = pages.answer_page(run_id, run.questions, token, str(refused))
        return HTMLResponse(page, 409, headers=PAGE_HEADERS)
    back = pages.with_token(f"/runs/{urllib.parse.quote(run_id, safe='')}", token)
    return RedirectResponse(back, 303)


def _streamed(stream: AsyncIterator[str]) -> Response:
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _snapshot(run: RunRecord) -> dict[str, Any]:
    spans = run.spans.since(0)[0]
    return {
        "run": run.as_json(),
        "nodes": run.nodes_json(),
        "spans": [span_json(span) for span in spans[-SPANS_SENT:]],
        "emits": run.emits.since(0)[0],
    }


async def _runs_stream(source: RunSource, closing: threading.Event) -> AsyncIterator[str]:
    position = source.changes.position
    yield _event("runs", [run.as_json() for run in source.runs()])
    sent = time.monotonic()
    while not closing.is_set():
        await asyncio.sleep(RUNS_TICK)
        now = time.monotonic()
        running = source.running()
        if source.changes.position == position and not (running and now - sent >= HEARTBEAT):
            if now - sent >= KEEPALIVE:
                sent = now
                yield ": idle\n\n"
            continue
        changed, position, lost = source.changes.since(position)
        sent = now
        if lost:
            yield _event("runs", [run.as_json() for run in source.runs()])
            continue
        # The newest runs begun or ended, and the running runs, whose times and counts move on.
        ids = dict.fromkeys(
            [*list(dict.fromkeys(changed))[-RUNS_SENT:], *(run.id for run in running)]
        )
        rows = [run for run in (source.run(run_id) for run_id in ids) if run is not None]
        yield _event("update", [run.as_json() for run in rows])


async def _run_stream(run: RunRecord, closing: threading.Event) -> AsyncIterator[str]:
    # Folded before the logs' positions are read: what the snapshot shows is not sent again.
    run.fold()
    changes, spans, emits = run.changes.position, run.spans.position, run.emits.position
    yield _event("snapshot", _snapshot(run))
    told_end = run.status.value != "running"
    sent = time.monotonic()
    while not closing.is_set():
        await asyncio.sleep(POLL)
        now = time.monotonic()
        if now - sent < TICK:
            continue
        ended = run.status.value != "running"
        # What the run told since, folded here, on the server's thread, once a poll.
        run.fold()
        moved = (
            run.changes.position != changes
            or run.spans.position != spans
            or run.emits.position != emits
            or ended != told_end
        )
        if not moved:
            if not ended and now - sent >= HEARTBEAT:
                sent = now
                yield _event("update", {"run": run.as_json()})
            elif now - sent >= KEEPALIVE:
                sent = now
                yield ": idle\n\n"
            continue
        sent = now
        changed, changes, lost_changes = run.changes.since(changes)
        new_spans, spans, lost_spans = run.spans.since(spans)
        new_emits, emits, _ = run.emits.since(emits)
        if lost_changes or lost_spans:
            yield _event("snapshot", _snapshot(run))
            continue
        told_end = ended
        ids = dict.fromkeys([*changed, *(span[0] for span in new_spans)])
        nodes = [run.node_json(node_id) for node_id in ids]
        yield _event(
            "update",
            {
                "run": run.as_json(),
                "nodes": [node for node in nodes if node is not None],
                "spans": [span_json(span) for span in new_spans[-SPANS_SENT:]],
                "emits": new_emits,
            },
        )


class Serving:
    """uvicorn serving ``app`` on a socket bound now, on a daemon thread."""

    def __init__(self, app: ASGIApp, host: str, port: int, closing: threading.Event) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))
        self.socket.listen(128)
        self.port: int = self.socket.getsockname()[1]
        self.closing = closing
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": [self.socket]},
            name="soma-view",
            daemon=True,
        )
        self.thread.start()

    def close(self, timeout: float = 10.0) -> None:
        self.closing.set()
        self.server.should_exit = True
        self.thread.join(timeout)
        self.socket.close()
