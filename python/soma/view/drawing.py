"""The engine's drawings, made ready for the view's pages: the plan's SVG (``Plan.to_svg``) with
each node's box tagged with its id, so that a page colours a box by its node's state, and a
finished run's timeline drawn by a trace (``Trace.to_svg``).

Nothing is drawn twice: the boxes, waves and arrows are the engine's; this module only adds a
``data-node`` attribute (and, for an offline report, the state's class) to each box, found by
the label the engine wrote in it — a node's id, then `` @ device`` when it is placed.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any, Final

from soma import _soma
from soma.view.record import RunRecord, walk_plan_nodes

# A node's box as `Plan.to_svg` writes it (soma-core's observe/layout.rs): its group, and the
# label in its text.
_BOX = re.compile(r'<g class="(node(?: cached)?)">(<rect [^>]*/><text [^>]*>)([^<]*)(</text></g>)')


def plan_svg(plan: _soma.Plan, states: Mapping[str, str] | None = None) -> str:
    """``plan``'s drawing with each box tagged ``data-node="id"``, and, when ``states`` is
    given, classed ``state-<state>`` for the node's state (``waiting`` for one not told)."""
    ids = set(walk_plan_nodes(plan))

    def tagged(box: re.Match[str]) -> str:
        label = html.unescape(box.group(3))
        node = label
        if node not in ids and " @ " in label:
            node = label.rsplit(" @ ", 1)[0]
        if node not in ids:
            return box.group(0)
        classes = box.group(1)
        if states is not None:
            classes += f" state-{states.get(node, 'waiting')}"
        return (
            f'<g class="{classes}" data-node="{html.escape(node)}">'
            f"{box.group(2)}{box.group(3)}{box.group(4)}"
        )

    return _BOX.sub(tagged, plan.to_svg())


# A plan of more boxes than this is drawn a tile at a time by the page (`static/tiles.js`).
TILED_BOXES: Final = 1_000


def run_plan(run: RunRecord) -> _soma.Plan | None:
    """The plan of ``run``'s graph, if the run told its graph and the graph plans now."""
    if run.graph is None:
        return None
    try:
        plan: _soma.Plan = run.graph.plan()
    except Exception:
        # A graph changed since its run so that it no longer compiles: no plan to draw.
        return None
    return plan


def run_trace(run: RunRecord) -> _soma.Trace:
    """A trace holding ``run``'s kept spans, one thread number per timeline row, so that the
    trace's own timeline draws the run."""
    rows: dict[str, int] = {}
    spans: list[Any] = []
    for node, start, end, row_name, state, _attempt in run.spans.since(0)[0]:
        row = rows.setdefault(row_name or "?", len(rows))
        failed = state in ("failed", "timed_out", "retrying", "stopped")
        spans.append((node, start, end, row, [], 1, state if failed else None, None, False))
    trace = _soma.Trace()
    trace._record(spans, 0.0, [])
    return trace
