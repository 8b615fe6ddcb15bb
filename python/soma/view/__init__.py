"""Watching runs in the browser: ``soma.view()`` serves a page of this process's runs, live, and
``soma.report(run_or_trace, "run.html")`` writes one finished run as a page that opens offline.

The pieces, each a module:

- :mod:`soma.view.record` — the listener the engine's observer tells each work to: a record per
  run of each node's state, its spans and what it emits, bounded. It is installed only while a
  view is open, so a process with none pays nothing.
- :mod:`soma.view.drawing` — the engine's own drawings (``Plan.to_svg``, ``Trace.to_svg``),
  each box tagged with its node so that a page colours it; nothing is drawn twice.
- :mod:`soma.view.pages` — the HTML, every run's text escaped; ``static/`` holds the pages'
  script and style, shipped in the wheel, loaded from the server (no network needed).
- :mod:`soma.view.server` — Starlette on uvicorn (the extra ``soma[view]``), on a thread of its
  own, imported only when a view starts; it pushes what changed to each page by server-sent
  events, coalesced per tick.

What comes later slots in without changing these: the page reads runs through
``record.RunSource`` (``runs()``, ``run(id)``, ``changes``), so a journal of runs recorded by
other processes (the durable-runs issue) is a second source beside this process's recorder; and
a run's status and a node's state already have ``paused`` reserved, for the runs that wait for
an answer, which nothing sets yet (there is no answering form yet).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from soma import _soma
from soma._run import observe as _observe
from soma.view.record import NodeState, Recorder, RunRecord, RunSource, RunStatus

if TYPE_CHECKING:
    from soma._graph import Graph
    from soma.journal import Journal
    from soma.view.server import Serving

__all__ = ["NodeState", "RunRecord", "RunStatus", "View", "report", "view"]

_open_views: list[View] = []
_opening = threading.Lock()


def _loopback(host: str) -> bool:
    import ipaddress  # here, not at `import soma`, which imports this package

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class View:
    """A view being served: its runs page's address (``url``, with the token when one is
    needed) and ``close()``. Also a context manager that closes it."""

    def __init__(self, recorder: Recorder, serving: Serving, host: str, token: str | None) -> None:
        self._recorder = recorder
        self._serving = serving
        self.host = host
        self.port = serving.port
        self.token = token
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/" + ("" if token is None else f"?token={token}")
        self._closed = False

    def runs(self) -> list[RunRecord]:
        """The runs this view has recorded and keeps, newest first."""
        return self._recorder.runs()

    def close(self) -> None:
        """Stops recording runs and serving pages. Closing twice is closing once."""
        with _opening:
            if self._closed:
                return
            self._closed = True
            _open_views.remove(self)
            # The next open view, if any, records from now on; else nothing listens.
            _observe.set_watcher(_open_views[-1]._recorder if _open_views else None)
        self._serving.close()

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"View({self.url!r})" if not self._closed else "View(closed)"


def view(
    port: int = 0, host: str = "127.0.0.1", *, journal: Journal | None = None, quiet: bool = False
) -> View:
    """Starts a local web server of this process's runs, prints its address, and returns the
    handle. ``port=0`` takes a free port. Bound to anything but loopback, every request needs
    the token printed with the address (``?token=`` or the ``X-Soma-Token`` header).

    Runs started from now on are recorded (their nodes' states, timeline and emitted values,
    never their outputs), while the view is open. With ``journal``, every run recorded there, by
    any process, is listed too, and a paused run's page links to a form answering its questions
    (the run is resumed here when this process ran it, else the answers wait in the journal).
    Needs the extra ``soma[view]``.

    Args:
        port: the port to serve on; 0 takes a free one.
        host: the address to bind; beyond loopback, a token is needed.
        journal: a :class:`soma.Journal` whose runs are shown beside this process's.
        quiet: print nothing.
    """
    try:
        from soma.view.server import Serving, application
    except ImportError as error:
        raise ImportError(
            f"soma.view needs Starlette and uvicorn ({error})\nhint: pip install 'soma-graph[view]'"
        ) from error
    import secrets

    token = None if _loopback(host) else secrets.token_urlsafe(18)
    recorder = Recorder()
    closing = threading.Event()
    source: RunSource = recorder
    if journal is not None:
        from soma.view.journaled import JournalSource

        source = JournalSource(recorder, journal)
    serving = Serving(application(source, token, closing), host, port, closing)
    opened = View(recorder, serving, host, token)
    with _opening:
        _open_views.append(opened)
        _observe.set_watcher(recorder)
    if not quiet:
        print(f"soma.view: watching runs at {opened.url}", file=sys.stdout, flush=True)
    return opened


def report(
    run_or_trace: RunRecord | _soma.Trace,
    path: str | os.PathLike[str],
    *,
    graph: Graph | None = None,
) -> None:
    """Writes one self-contained HTML file of a finished run — its plan with each node's state,
    its timeline, its errors — that opens with no server and no network.

    Args:
        run_or_trace: A run a view recorded (``view.runs()``), or a ``soma.Trace`` a run
            recorded into (``forward(..., trace=trace)``).
        path: The file to write (written over if it exists).
        graph: For a trace, the graph whose plan is drawn beside it; ``None`` (the default)
            draws no plan. A run a view recorded knows its graph.

    Raises:
        ValueError: ``run_or_trace`` is a run still running.
        TypeError: ``run_or_trace`` is neither a recorded run nor a ``soma.Trace``."""
    from soma.view import drawing, pages

    plan_svg: str | None
    if isinstance(run_or_trace, RunRecord):
        run = run_or_trace
        if run.status is RunStatus.RUNNING:
            raise ValueError(f"run {run.id} is still running: a report is of a finished run")
        rows: list[dict[str, Any]] = run.nodes_json(detail=True)
        plan = drawing.run_plan(run)
        states = {str(row["id"]): str(row["state"]) for row in rows}
        plan_svg = None if plan is None else drawing.plan_svg(plan, states)
        timeline = drawing.run_trace(run).to_svg()
        title = f"Soma: run {run.id} ({run.status.value}, {run.elapsed():.3f} s)"
        error = run.traceback or run.error
    elif isinstance(run_or_trace, _soma.Trace):
        trace = run_or_trace
        rows = pages.trace_rows(trace)
        states = {str(row["id"]): str(row["state"]) for row in rows}
        plan_svg = None if graph is None else drawing.plan_svg(graph.plan(), states)
        timeline = trace.to_svg()
        failed = [row for row in rows if row["error"] is not None]
        title = f"Soma: trace of {len(rows)} nodes"
        error = "\n".join(f"{row['id']}: {row['error']}" for row in failed) or None
    else:
        raise TypeError(
            "soma.report writes a run a view recorded or a soma.Trace, "
            f"not {type(run_or_trace).__name__}"
        )
    text = pages.report(title, plan_svg, timeline, rows, error)
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)
