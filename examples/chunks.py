"""Split a document into chunks, route each chunk by its kind, retry a flaky step.

    Split >> each(switch(kind, {"heading": None, "code": Measure(), "prose": Summarize()}))
          >> Report

`each` runs the switch on every chunk, chunks in flight together; `switch` sends a chunk to the
case its kind names, and no other case is called for it; `Summarize` stands for an async
client's call to a service that drops the first request for each chunk, so it is retried. An
async node inside the step makes `forward` walk it on the event loop Soma keeps, the chunks in
flight as tasks, no thread each. The plan shows the `Map` step holding the `Switch` and its
cases; the trace counts the attempts. Run it with `.venv/bin/python examples/chunks.py` after
`make setup`.
"""

import asyncio

import soma

DOCUMENT = """# Soma

Soma runs a graph of nodes, branches at the same time.

def forward(self, x):
    return x + 1

A step can decide as it runs: each item, one case, a body until done.
"""


class Split(soma.Node):
    """The document's paragraphs, in order."""

    def forward(self, document: str) -> list[str]:
        return [part.strip("\n") for part in document.split("\n\n") if part.strip()]


def kind(chunk: str) -> str:
    if chunk.startswith("#"):
        return "heading"
    if chunk.startswith("def "):
        return "code"
    return "prose"


class Measure(soma.Node):
    def forward(self, chunk: str) -> str:
        return f"code, {len(chunk.splitlines())} lines"


class Summarize(soma.Node):
    """The first words of a chunk, from a service that drops each chunk's first request."""

    def __init__(self) -> None:
        self.seen: set[str] = set()  # Read and written on one event loop: no lock needed.

    async def forward(self, chunk: str) -> str:
        await asyncio.sleep(0.001)  # The request, on the wire.
        first_time = chunk not in self.seen
        self.seen.add(chunk)
        if first_time:
            raise ConnectionError("the service dropped the request")
        return "prose: " + " ".join(chunk.split()[:4]) + " ..."


class Report(soma.Node):
    def forward(self, parts: list[str]) -> str:
        return "\n".join(f"{at}. {part}" for at, part in enumerate(parts, 1))


route = soma.switch(
    kind,
    {
        "heading": None,  # passed on as it is
        "code": Measure(),
        "prose": Summarize().retry(2, backoff=0.01, on=(ConnectionError,)),
    },
).named("route")
g = soma.Graph.somatize(Split() >> soma.each(route).named("chunks") >> Report())
print(g.plan())
trace = soma.Trace()
print(g.forward(DOCUMENT, trace=trace))
attempts = [span for span in trace.spans if span.node == "chunks/route/prose/summarize"]
failed = [span for span in attempts if span.error is not None]
print(f"summarize: {len(attempts)} attempts, {len(failed)} retried")
