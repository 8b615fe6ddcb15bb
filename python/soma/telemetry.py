"""OpenTelemetry for Soma's runs: ``soma.telemetry.enable()`` and every run from then on emits
spans to the global tracer provider (or the one passed), until ``soma.telemetry.disable()``.

One span per run (``soma.run``; a stream's item is a run of its own, ``soma.item``), one per
attempt of a node's call (named by the node's id), one per ``each`` item, ``switch`` case and
``loop`` iteration (``step[part]``), and a zero-length one for a node the cache answered. Each
is made current for the work it wraps, so it is parented under what is current where that work
starts — the caller's span for a run, the run's span for its nodes, a part's for the nodes
inside it — on whichever thread or task the work runs: Soma carries the caller's context into
every branch, item and async task, and the engine tells each work where it runs. Spans a node
makes itself are children of its call's span.

A slice of the graph placed on a host (``.at("box")``) runs there as one call of its stand-in
node (``box#0``); its nodes' spans come back with its result and are emitted here, as children
of that call's span, timed on this process's clock: one exporter configured in this process
sees the whole run, and a host needs no telemetry of its own. What a host's nodes do there is
therefore known once the slice is back; spans a node makes itself on a host are the host's.

A span that fails records its exception (``exception.*``) and sets its status to an error.
Attributes: ``soma.node``, ``soma.branch`` (the branch's index in each wave, ``"0.1"``),
``soma.attempt``, ``soma.cached`` and ``soma.async`` (set, true, only for a node the cache
answered and an async node or run), ``soma.device``, ``soma.outcome``
(``"returned"``, ``"failed"``, ``"retrying"``, ``"stopped"``), ``soma.retry_in`` (seconds),
``soma.item``, ``soma.case``, ``soma.iteration``, ``soma.nodes`` (a run's), and OpenTelemetry's
own ``thread.id`` and ``code.function`` (what a call runs,
``module.Class.forward``); ``soma.host`` for a node that ran on a host. What a
node sends with ``ctx.emit(value)`` is an event (``soma.emitted``) on its span, the value's
``repr`` in ``soma.value``.

Needs ``opentelemetry-api`` (``pip install 'soma-graph[otel]'``), imported by ``enable`` and
never before: a process that does not enable telemetry does not import it, and its runs cost
what they did.
"""

from __future__ import annotations

import contextvars
import reprlib
import threading
from typing import Any

from soma._run import observe as _observe

__all__ = ["disable", "enable", "enabled"]

_OUTCOMES = ("returned", "failed", "stopped")
# How much of an emitted value's repr an event keeps.
_VALUE_LIMIT = 1000


class _Spans:
    """The telemetry listener: a span per work, made current where the work runs."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        self._tracer = tracer
        self._attach = context.attach
        self._detach = context.detach
        self._in_context = trace.set_span_in_context
        self._error = StatusCode.ERROR
        self._status = Status

    def begin(self, work: _observe.Work) -> Any:
        kind, node, part, number, device, branch, awaited, function = work
        # Only what says something: the SDK checks every attribute, at a cost per attribute
        # that shows on a node (see BENCHMARKS.md, "Watching a run").
        attributes: dict[str, Any] = {"thread.id": threading.get_ident()}
        if awaited:
            attributes["soma.async"] = True
        if kind == _observe.RUN:
            attributes["soma.nodes"] = number
            if part is None:
                name = "soma.run"
            else:
                name = "soma.item"
                attributes["soma.item"] = part
        else:
            assert node is not None
            attributes["soma.node"] = node
            attributes["soma.branch"] = ".".join(map(str, branch)) if branch else "main"
            if kind == _observe.CALL or kind == _observe.CACHED:
                name = node
                attributes["soma.attempt"] = number
                if kind == _observe.CACHED:
                    attributes["soma.cached"] = True
                if device is not None:
                    attributes["soma.device"] = device
                if function is not None:
                    attributes["code.function"] = function
            else:
                name = f"{node}[{part}]"
                attributes[_PART_NAMES[kind]] = part
        span = self._tracer.start_span(name, attributes=attributes)
        if kind == _observe.CACHED:
            return (span, None, None)
        return (span, self._attach(self._in_context(span)), _ATTACHED_HERE.set(None))

    def end(
        self, opened: Any, outcome: int, error: BaseException | None, retry_in: float | None
    ) -> None:
        span, token, here = opened
        if token is not None and _still_here(here):
            self._detach(token)
        if outcome in (_observe.FAILED, _observe.TIMED_OUT):
            span.set_attribute("soma.outcome", "retrying" if retry_in is not None else "failed")
            if retry_in is not None:
                span.set_attribute("soma.retry_in", retry_in)
            if error is not None:
                span.record_exception(error)
                span.set_status(self._status(self._error, f"{type(error).__name__}: {error}"))
        else:
            span.set_attribute("soma.outcome", _OUTCOMES[outcome])
        span.end()

    def adopt(self, spans: list[Any], host: str, sent_ns: int) -> None:
        """The spans of a slice's nodes, shipped back from ``host``: emitted here, under the
        span current here — the slice's call — with their times on this process's clock."""
        for node, start, end, thread, branch, _turns, error, device, cached in spans:
            attributes: dict[str, Any] = {
                "soma.node": node,
                "soma.host": host,
                "soma.branch": ".".join(map(str, branch)) if branch else "main",
                "soma.cached": cached,
                "soma.outcome": "failed" if error is not None else "returned",
                "thread.id": thread,
            }
            if device is not None:
                attributes["soma.device"] = device
            span = self._tracer.start_span(
                node, attributes=attributes, start_time=sent_ns + int(start * 1e9)
            )
            if error is not None:
                span.set_status(self._status(self._error, error))
            span.end(end_time=sent_ns + int(end * 1e9))

    def emit(self, node: str, value: Any, watched: _observe.Watched) -> None:
        """An event on the call's span (``watched.span``, taken where the call began: the
        emit may come from a thread the node started, where no span is current)."""
        watched.span.add_event("soma.emitted", {"soma.node": node, "soma.value": shown(value)})

    def emitted_late(self, node: str) -> None:
        """The call's span has ended: nothing to add the value to."""

    def span_of(self, opened: Any) -> Any:
        return opened[0]


def shown(value: Any) -> str:
    """``value``'s repr for an event, at most ``_VALUE_LIMIT`` characters and built no larger:
    each container shows its first items and each string its ends (``reprlib``), so a list of
    millions costs what its first few do. A ``repr`` that raises is shown by a placeholder
    naming the type and the error: watching never fails the node that emitted."""
    try:
        text = _SHOWN.repr(value)
    except Exception as failure:  # The user's `__repr__`: anything.
        text = f"<{type(value).__qualname__}: repr raised {type(failure).__name__}>"
    if len(text) > _VALUE_LIMIT:
        text = text[:_VALUE_LIMIT] + "..."
    return text


def _bounded_repr() -> reprlib.Repr:
    """A ``reprlib.Repr`` whose output of any value stays near ``_VALUE_LIMIT`` characters:
    a few items of each container, a few levels deep, long strings cut in the middle."""
    limits = reprlib.Repr()
    limits.maxlevel = 4
    for name in (
        "maxtuple",
        "maxlist",
        "maxarray",
        "maxdict",
        "maxset",
        "maxfrozenset",
        "maxdeque",
    ):
        setattr(limits, name, 20)
    limits.maxstring = _VALUE_LIMIT
    limits.maxlong = _VALUE_LIMIT
    # An object of the user's, shown by its own `repr`, cut as a whole after it.
    limits.maxother = _VALUE_LIMIT
    return limits


_SHOWN = _bounded_repr()


# Set beside each attach, so that a work's end can tell whether it runs in the very context its
# begin attached the span in. A streamed item or a micro-batch slice ends on another thread than
# the one it began on, outside the item's context, which goes with the item: nothing is left
# attached there, and OpenTelemetry's `detach` of a token from another context logs an error
# with a traceback (it catches the `ValueError` itself), once per item.
_ATTACHED_HERE: contextvars.ContextVar[None] = contextvars.ContextVar("soma_span_attached_here")


def _still_here(here: contextvars.Token[None] | None) -> bool:
    """Whether this is the context ``here`` was set in: resetting a token raises
    ``ValueError`` in any other context, a copy of it included, and costs nothing to ask."""
    if here is None:
        return False
    try:
        _ATTACHED_HERE.reset(here)
    except ValueError:
        return False
    return True


_PART_NAMES = {
    _observe.ITEM: "soma.item",
    _observe.CASE: "soma.case",
    _observe.ITERATION: "soma.iteration",
}


def enable(tracer_provider: Any = None) -> None:
    """Emits spans for every run from now on, to ``tracer_provider`` (an OpenTelemetry
    ``TracerProvider``), or the global one — the one ``opentelemetry.trace.set_tracer_provider``
    set — when none is passed. Enabling again replaces the provider.

    Raises ``ImportError`` with a hint when ``opentelemetry-api`` is not installed."""
    try:
        from opentelemetry import trace
    except ImportError as missing:
        raise ImportError(
            "soma.telemetry needs OpenTelemetry's API\nhint: pip install 'soma-graph[otel]'"
        ) from missing
    from importlib.metadata import PackageNotFoundError, version

    try:
        soma_version = version("soma-graph")
    except PackageNotFoundError:
        soma_version = None
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    tracer = provider.get_tracer("soma", soma_version)
    _observe.set_telemetry(_Spans(tracer))


def disable() -> None:
    """Stops emitting spans: runs started from now on emit none (a run already going on
    finishes its own)."""
    _observe.set_telemetry(None)


def enabled() -> bool:
    """Whether runs emit spans."""
    return _observe.dispatch.telemetry is not None
