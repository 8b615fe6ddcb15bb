"""Tokens streamed out of a running graph: two "LLM" branches answer at once, and the terminal
shows each word as it is made, not after the run.

    Prompt >> (Writer("poet") | Writer("critic")) >> Join

Each `Writer` is an async node standing in for a language model: it makes its answer a word at a
time, awaiting between words as a model's client awaits its next token, and sends each word with
`ctx.emit(word)`. `g.aevents(prompt)` yields the run's events as they happen — each node started
and finished, each word emitted — and last the run's result. The two branches are tasks on one
event loop, so their words interleave; the script checks that they did (a run that gave the
words only after it ended would show them one branch after the other) and exits non-zero if not.
Run it with `.venv/bin/python examples/streaming_tokens.py` after `make demo`.
"""

from __future__ import annotations

import asyncio
import itertools
import sys

import soma

ANSWERS = {
    "poet": "the graph hums softly as two voices write at once",
    "critic": "a fine line though the meter wanders near the end",
}


class Prompt(soma.Node):
    def forward(self, text: str) -> str:
        return text


class Writer(soma.Node):
    """A fake model: its answer to any prompt, a word at a time."""

    def __init__(self, voice: str) -> None:
        self.voice = voice

    async def forward(self, prompt: str, ctx: soma.Ctx) -> str:
        words = ANSWERS[self.voice].split()
        for word in words:
            await asyncio.sleep(0.01)  # the next token is on its way
            ctx.emit(word)
        return " ".join(words)


class Join(soma.Node):
    def forward(self, answers: dict[str, str]) -> str:
        return f"poet: {answers['poet']}\ncritic: {answers['critic']}"


async def main() -> int:
    g = soma.Graph.somatize(
        Prompt().named("prompt")
        >> (Writer("poet").named("poet") | Writer("critic").named("critic"))
        >> Join().named("join")
    )
    order: list[str] = []
    async for event in g.aevents("write about a graph"):
        if event.kind == "emitted":
            order.append(str(event.node))
            print(f"[{event.node:>6}] {event.value}", flush=True)
        elif event.kind in ("started", "finished"):
            print(f"  {event.kind} {event.node}", flush=True)
        elif event.kind == "result":
            print(f"\n{event.value}")
        elif event.kind == "error":
            print(f"the run failed: {event.value!r}", file=sys.stderr)
            return 1
    switches = sum(1 for before, after in itertools.pairwise(order) if before != after)
    if switches < 2:
        print("the two branches' words did not interleave", file=sys.stderr)
        return 1
    print(f"\n{len(order)} words streamed, the branches taking turns {switches} times")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
