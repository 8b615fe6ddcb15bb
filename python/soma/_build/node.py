"""``soma.Node``: the base class of Python nodes; ``>>`` and ``|`` come from the DSL's base."""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Self

from soma import _soma
from soma._build.dsl import Composable
from soma._build.policy import (
    RetryPolicy,
    checked_concurrency,
    checked_retry,
    checked_time_limit,
)


class Node(Composable, abc.ABC):
    """A unit of work. Subclasses define ``forward(self, x)`` or ``forward(self, x, ctx)``,
    either of them ``async def`` for an async node (see :meth:`soma.Graph.aforward`).

    ``forward`` returns the node's output — or ``soma.Done(value)``, or ``soma.Await(requests)``
    to ask the driver, after which the node is called again with ``ctx.turn`` one higher and
    the answers in ``ctx.results``.
    """

    _soma_id: str | None = None
    _soma_device: str | None = None
    _soma_host: str | None = None
    _soma_retry: RetryPolicy | None = None
    _soma_time_limit: float | None = None
    _soma_concurrency: int | None = None

    if TYPE_CHECKING:
        # Either signature is accepted, sync or async; the graph looks at the method once, at
        # registration.
        forward: Callable[..., Any]
    else:

        @abc.abstractmethod
        def forward(self, x, *args):
            """Computes the output from ``x`` (and ``ctx``, when the method takes it: ``*args``
            is that one ``soma.Ctx`` or nothing). What it raises comes out of ``forward`` as
            itself, with a note naming the node."""

    def concurrency(self, workers: int) -> Self:
        """Lets a stream (:meth:`soma.Graph.map`, :meth:`soma.Graph.amap`) run this node on up
        to ``workers`` items at once, for a node that keeps no state between items (I/O, a
        remote call). Results keep their order. Unset, a sync node takes one item at a time and
        an async node as many as the stream's ``in_flight``. As ``Graph.concurrency`` once it
        is registered; the node's own ``.concurrency`` wins over an expression's around it."""
        self._soma_concurrency = checked_concurrency(workers)
        return self

    def named(self, node_id: str) -> Self:
        """Gives this node the id ``node_id`` instead of one derived from its class; the id is
        read when the node is registered (an invalid one is a ``soma.InvalidIdError`` there).
        Returns the node."""
        self._soma_id = node_id
        return self

    def on(self, device: str) -> Self:
        """Places this node on ``device`` (``"cuda:1"``, ``"cpu"``, ``"meta"``), as
        ``Graph.place`` would once it is registered; read now, so a device that cannot be is a
        ``soma.DeviceError`` here. The node's own ``.on`` wins over an expression's around it.
        """
        self._soma_device = _soma.parse_device(device)
        return self

    def at(self, host: str) -> Self:
        """Runs this node on ``host`` (a name such as ``"gpu-box"``), as ``Graph.place_at``
        would once it is registered; read now, so a name that cannot be is a
        ``soma.HostError`` here. The node's own ``.at`` wins over an expression's around it.
        """
        self._soma_host = _soma.parse_host(host)
        return self

    def retry(
        self,
        times: int,
        backoff: float = 0.5,
        on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    ) -> Self:
        """Retries a failing call of this node up to ``times`` more times, the first after
        ``backoff`` seconds, each next pause doubled (at most 128 s, up to a quarter longer at
        random), only for exceptions of the types in ``on``; the error of the last attempt
        notes how many were made. As ``Graph.retry`` once it is registered; the node's own
        ``.retry`` wins over an expression's around it. Returns the node.

        Args:
            times: how many more attempts after the first, an int of at least 0.
            backoff: seconds before the first retry (0.5 unless given), at least 0; each next
                pause is doubled.
            on: the exception class, or a tuple of them, that a retry is made for (any
                ``Exception`` unless given); another one fails the call at once.

        Raises:
            ValueError: ``times`` or ``backoff`` is not a number it can be.
            TypeError: ``on`` holds something that is no exception class.
        """
        self._soma_retry = checked_retry(times, backoff, on)
        return self

    def time_limit(self, seconds: float) -> Self:
        """Fails a call of this node still running after ``seconds`` with a
        ``soma.TimeLimitError`` (a ``TimeoutError``) naming it; the call is left to finish in
        the background. As ``Graph.time_limit`` once it is registered; the node's own
        ``.time_limit`` wins over an expression's around it. Returns the node.

        Args:
            seconds: the limit, a number of seconds above 0.

        Raises:
            ValueError: ``seconds`` is not a finite number above 0.
        """
        self._soma_time_limit = checked_time_limit(seconds)
        return self
