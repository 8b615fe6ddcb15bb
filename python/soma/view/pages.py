"""The view's HTML: the runs page, a run's page, and the offline report of a finished run.

Every text that comes from a run — a node's id, an error, a traceback, an emitted value's repr —
is escaped here (``html.escape``) or set as text by the page's scripts, never as markup. The
pages load their script and style from the server (``static/``, shipped in the wheel); the report
inlines the same style, so that it opens with no server and no network.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import html
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Final
from urllib.parse import quote

from soma import _soma
from soma.view import drawing
from soma.view.record import FINISHED_KEPT, NodeState, RunRecord, RunStatus

STATIC: Final = Path(__file__).parent / "static"
STATUSES: Final = [status.value for status in RunStatus]
# A report's drawings are inlined as they are up to this many characters, gzipped beyond.
INLINE_DRAWINGS: Final = 1_000_000


def _gzipped(text: str) -> str:
    return base64.b64encode(gzip.compress(text.encode("utf-8"), mtime=0)).decode("ascii")


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def with_token(path: str, token: str | None) -> str:
    if token is None:
        return path
    joiner = "&" if "?" in path else "?"
    return f"{path}{joiner}token={quote(token)}"


def _when(started: float) -> str:
    return datetime.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S")


def _head(title: str, token: str | None) -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)}</title>"
        f'<link rel=stylesheet href="{_e(with_token("/static/view.css", token))}">'
        "</head>\n"
    )


def _run_row(run: RunRecord, token: str | None) -> str:
    shown = run.as_json()
    link = with_token(f"/runs/{quote(run.id)}", token)
    item = "" if run.item is None else f" item {run.item}"
    return (
        f'<tr data-run="{_e(run.id)}" data-status="{_e(run.status.value)}">'
        f'<td><a href="{_e(link)}">{_e(run.id)}</a>{_e(item)}</td>'
        f"<td>{_e(shown['graph'])}</td>"
        f'<td class="status status-{_e(run.status.value)}">{_e(run.status.value)}</td>'
        f"<td>{_e(_when(run.started_at))}</td>"
        f"<td>{run.elapsed():.3f} s</td>"
        f"<td>{_e(run.progress())}</td>"
        f'<td class="error">{_e(run.error or "")}</td></tr>'
    )


def runs_page(runs: Iterable[RunRecord], status: str | None, token: str | None) -> str:
    """Every run, newest first, filtered to ``status`` when given; the script keeps it live."""
    options = "".join(
        f'<option value="{_e(value)}"{" selected" if value == status else ""}>{_e(value)}</option>'
        for value in STATUSES
    )
    rows = "".join(
        _run_row(run, token) for run in runs if status is None or run.status.value == status
    )
    return (
        _head("Soma: runs", token)
        + '<body data-page="runs">'
        + "<header><h1>Runs</h1><label>Status <select id=status>"
        + f'<option value="">all</option>{options}</select></label>'
        + '<span id=live class="live">connecting…</span></header>'
        # The page lists no more runs than the recorder keeps finished: the oldest rows go.
        + f"<table id=runs data-kept={FINISHED_KEPT}><thead><tr><th>Run</th><th>Graph</th>"
        + "<th>Status</th><th>Started</th>"
        + "<th>Time</th><th>Nodes done</th><th>Error</th></tr></thead>"
        + f"<tbody>{rows}</tbody></table>"
        + f'<script src="{_e(with_token("/static/live.js", token))}"></script>'
        + f'<script src="{_e(with_token("/static/runs.js", token))}"></script>'
        + "</body></html>\n"
    )


def run_drawing(run: RunRecord) -> str:
    """The run's plan, drawn by the engine with each box tagged by its node — as data the page
    draws a tile at a time (``static/tiles.js``) when it has more than
    :data:`~soma.view.drawing.TILED_BOXES` boxes; a sentence when there is no plan to draw."""
    plan = drawing.run_plan(run)
    if plan is None:
        return "<p class=muted>No plan to draw: the run did not tell its graph.</p>"
    svg = drawing.plan_svg(plan)
    if svg.count('<g class="node') <= drawing.TILED_BOXES:
        return svg
    return _json_script("plan-tiles", svg)


def _json_script(element_id: str, data: object) -> str:
    """``data`` as a JSON block the page's script reads (never run): ``</`` is written
    ``<\\/``, so that nothing in it ends the block."""
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id={element_id}>{text}</script>'


def run_page(run: RunRecord, plan_svg: str, token: str | None) -> str:
    """A run's page: its plan (the engine's SVG, tagged), timeline, emitted values, a node's
    detail and its error; the script fills them and keeps them live."""
    back = with_token("/", token)
    return (
        _head(f"Soma: run {run.id}", token)
        + f'<body data-page="run" data-run="{_e(run.id)}">'
        + f'<header><a href="{_e(back)}">Runs</a><h1>Run {_e(run.id)}</h1>'
        + f'<span id=status class="status status-{_e(run.status.value)}">'
        + f"{_e(run.status.value)}</span>"
        + f"<span id=progress>{_e(run.progress())}</span>"
        + '<span id=live class="live">connecting…</span>'
        + _answer_link(run, token)
        + "</header>"
        + f'<pre id=run-error class="error">{_e(run.error or "")}</pre>'
        + _legend()
        + f"<section><h2>Plan</h2><div id=plan>{plan_svg}</div></section>"
        + "<aside id=detail><h2>Node</h2><p class=muted>Click a node.</p></aside>"
        + "<section><h2>Timeline</h2><div id=timeline></div></section>"
        + "<section><h2>Emitted</h2><ol id=emits></ol></section>"
        + f'<script src="{_e(with_token("/static/tiles.js", token))}"></script>'
        + f'<script src="{_e(with_token("/static/live.js", token))}"></script>'
        + f'<script src="{_e(with_token("/static/run.js", token))}"></script>'
        + "</body></html>\n"
    )


def _answer_link(run: RunRecord, token: str | None) -> str:
    """A link to the form answering a paused run's questions, for a run paused in a journal."""
    if run.status is not RunStatus.PAUSED or not (run.journal_run or hasattr(run, "questions")):
        return ""
    answer = with_token(f"/runs/{quote(run.journal_run or run.id, safe='')}/answer", token)
    return f'<a id=answer href="{_e(answer)}">Answer its questions</a>'


def answer_page(
    run_id: str, questions: dict[str, str], token: str | None, message: str = ""
) -> str:
    """The form answering a paused run's open questions, one field per question by its path;
    submitting records the answers in the run's journal (and resumes the run where this
    process holds its graph)."""
    back = with_token(f"/runs/{quote(run_id, safe='')}", token)
    action = with_token(f"/runs/{quote(run_id, safe='')}/answer", token)
    fields = "".join(
        f'<p><label for="q{index}">{_e(path)}: {_e(question)}</label><br>'
        f'<input id="q{index}" name="{_e(path)}" required></p>'
        for index, (path, question) in enumerate(questions.items())
    )
    body = (
        f'<form method=post action="{_e(action)}">{fields}'
        "<button id=submit type=submit>Answer</button></form>"
        if questions
        else "<p class=muted>No question is open.</p>"
    )
    return (
        _head(f"Soma: answer run {run_id}", token)
        + f'<body data-page="answer"><header><a href="{_e(back)}">Run {_e(run_id)}</a>'
        + f"<h1>Answer run {_e(run_id)}</h1></header>"
        + (f'<p id=message class="error">{_e(message)}</p>' if message else "")
        + body
        + "</body></html>\n"
    )


def missing(run_id: str, token: str | None) -> str:
    return (
        _head("Soma: no such run", token)
        + f"<body><p>No run {_e(run_id)} here (or no longer kept).</p>"
        + f'<a href="{_e(with_token("/", token))}">Runs</a></body></html>\n'
    )


def _legend() -> str:
    items = "".join(
        f'<span class="key state-{_e(state.value)}">{_e(state.value.replace("_", " "))}</span>'
        for state in NodeState
    )
    return f'<div class="legend">{items}</div>'


def report(
    title: str,
    plan_svg: str | None,
    timeline_svg: str,
    rows: list[dict[str, object]],
    error: str | None,
) -> str:
    """One self-contained page of a finished run: its style inline, nothing fetched. Drawings
    of more than :data:`INLINE_DRAWINGS` characters in all are carried gzipped, with the small
    inline script that inflates them (``static/inflate.js``): a 10,000-node plan is megabytes
    of SVG, and a tenth of that gzipped. A run of more than
    :data:`~soma.view.drawing.TILED_BOXES` nodes has its plan drawn a tile at a time
    (``static/tiles.js``), and its timeline and table of nodes put in the page when opened:
    the browser would take seconds to lay out all of them at once."""
    style = (STATIC / "view.css").read_text(encoding="utf-8")
    boxes = 0 if plan_svg is None else plan_svg.count('<g class="node')
    large = max(boxes, len(rows)) > drawing.TILED_BOXES
    packed = large or len(plan_svg or "") + len(timeline_svg) > INLINE_DRAWINGS
    cells = "".join(map(_report_row, rows))

    def held(name: str, text: str, draw: str | None = None, tag: str = "div") -> str:
        if not packed:
            return f"<{tag} id={name}>{text}</{tag}>"
        when = "" if draw is None else f" data-draw={draw}"
        return f'<{tag} id={name} data-gzip="{_gzipped(text)}"{when}></{tag}>'

    plan = ""
    if plan_svg is not None:
        tiled = "tiles" if boxes > drawing.TILED_BOXES else None
        plan = f"<section><h2>Plan</h2>{held('plan', plan_svg, tiled)}</section>"
    head = (
        "<thead><tr><th>Node</th><th>State</th><th>Attempts</th><th>Seconds</th><th>Thread</th>"
        "<th>Device</th><th>Host</th><th>Error</th></tr></thead>"
    )
    if large:
        timeline = (
            "<section><details><summary><h2>Timeline</h2> drawn when opened</summary>"
            f"{held('timeline', timeline_svg, 'open')}</details></section>"
        )
        table = (
            f"<section><details><summary><h2>Nodes</h2> {len(rows):,}, listed when opened"
            f"</summary><table id=nodes>{head}{held('node-rows', cells, 'open', 'tbody')}"
            "</table></details></section>"
        )
    else:
        timeline = f"<section><h2>Timeline</h2>{held('timeline', timeline_svg)}</section>"
        table = (
            f"<section><h2>Nodes</h2><table id=nodes>{head}<tbody>{cells}</tbody></table></section>"
        )
    script = ""
    if packed:
        scripts = [
            (STATIC / name).read_text(encoding="utf-8") for name in ("tiles.js", "inflate.js")
        ]
        script = "".join(f"<script>{text}</script>" for text in scripts)
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)}</title><style>{style}</style></head>\n"
        f'<body data-page="report"><header><h1>{_e(title)}</h1></header>'
        + (f'<pre id=run-error class="error">{_e(error)}</pre>' if error else "")
        + _legend()
        + plan
        + timeline
        + table
        + script
        + "</body></html>\n"
    )


def _report_row(row: dict[str, object]) -> str:
    return (
        f'<tr id="node-{_e(row["id"])}" class="state-{_e(row["state"])}">'
        f"<td>{_e(row['id'])}</td><td>{_e(row['state'])}</td>"
        f"<td>{_e(row.get('attempts') or '')}</td>"
        f"<td>{_e('' if row.get('seconds') is None else format(row['seconds'], '.6f'))}</td>"
        f"<td>{_e(row.get('row') or '')}</td><td>{_e(row.get('device') or '')}</td>"
        f"<td>{_e(row.get('host') or '')}</td>"
        + _error_cell(row.get("traceback") or row.get("error"))
        + "</tr>"
    )


def _error_cell(text: object) -> str:
    return f'<td><pre class="error">{_e(text)}</pre></td>' if text else "<td></td>"


def trace_rows(trace: _soma.Trace) -> list[dict[str, object]]:
    """A trace's spans as the report's rows: each node's last span."""
    rows: dict[str, dict[str, object]] = {}
    for span in trace.spans:
        state = "cached" if span.cached else "failed" if span.error is not None else "finished"
        previous = rows.get(span.node)
        attempts = 1 if previous is None else int(str(previous["attempts"])) + 1
        rows[span.node] = {
            "id": span.node,
            "state": state,
            "attempts": attempts,
            "seconds": span.duration,
            "row": f"thread {span.thread}",
            "device": span.device,
            "host": span.host,
            "error": span.error,
        }
    return list(rows.values())
