"""A run to watch in the browser: `soma.view()` serves this process's runs, live.

A small training-like graph: a data node, two branches that each report a loss with
`ctx.emit` at every step, a node that fails once and is retried, and a summary. Open the
printed address while it runs to see each node's state change, the timeline and the losses as
they come; the run's page of a finished run stays there until the process ends. It then writes
`run.html`, the same run as one page that opens offline.

    python examples/watch.py            # runs for about two seconds, writes run.html, exits
    python examples/watch.py --keep     # then keeps serving until Ctrl-C
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

import soma


class Data(soma.Node):
    def forward(self, n: int) -> list[float]:
        return [float(i) for i in range(n)]


class Train(soma.Node):
    """Pretends to train for `steps` steps, telling its loss at each."""

    def __init__(self, steps: int, rate: float) -> None:
        self.steps = steps
        self.rate = rate

    def forward(self, data: list[float], ctx: soma.Ctx) -> float:
        loss = 1.0
        for _ in range(self.steps):
            time.sleep(0.05)
            loss *= 1.0 - self.rate
            ctx.emit({"loss": round(loss, 4)})
        return loss


class Flaky(soma.Node):
    """Fails on its first call, as a remote service might: the graph retries it."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def forward(self, data: list[float]) -> int:
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            raise ConnectionError("the service was not ready")
        return len(data)


class Summary(soma.Node):
    def forward(self, losses: dict[str, float]) -> str:
        return ", ".join(f"{name} {value:.3f}" for name, value in sorted(losses.items()))


def main() -> None:
    view = soma.view(port=0)
    graph = soma.Graph.somatize(
        Data().named("data")
        >> (
            Train(steps=20, rate=0.1).named("small")
            | Train(steps=30, rate=0.05).named("large")
            | Flaky().named("count")
        )
        >> Summary().named("summary")
    )
    graph.retry("count", times=2, backoff=0.2)
    print("result:", graph.forward(100))
    run = view.runs()[0]
    print(f"run {run.id}: {run.status.value}, {run.done} of {run.total} nodes done")
    soma.report(run, "run.html")
    print("wrote run.html")
    if "--keep" in sys.argv:
        print("serving until Ctrl-C")
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    view.close()


if __name__ == "__main__":
    main()
