"""A dataset through a graph: 120 documents compressed, checksummed and measured, streamed.

    Load >> Compress >> Checksum >> Measure

Each document is a 300 kB page of seeded pseudo-text. `zlib` and `hashlib` both release the
GIL on buffers this size, so while `Compress` works on document *i*, `Checksum` works on *i-1*
and `Load` on *i+1*, each stage on its own thread: `g.map` overlaps them, where a loop of
`g.forward` runs one stage at a time. Each node still sees the documents one at a time and in
order, except `Compress`, which keeps no state and is allowed two at once (`.concurrency(2)`);
the results still come out in order. The script draws a progress bar (tqdm when installed, a
line on stderr otherwise), prints where the time went, stage by stage, and the speed-up over a
loop of `forward`: about the number of stages that can run at once, up to the machine's cores.
Run it with `.venv/bin/python examples/stream.py` after `make demo`.
"""

from __future__ import annotations

import hashlib
import random
import time
import zlib

import soma

DOCUMENTS = 120
WORDS = ["graph", "stream", "node", "wave", "stage", "item", "order", "bound", "thread", "plan"]


# Seeded pseudo-text, about 300 kB, made once; each document is a rotation of it.
CORPUS = " ".join(random.Random(0).choices(WORDS, k=50_000)).encode()


class Load(soma.Node):
    """Document `seed`: the corpus rotated by a seeded offset, as bytes."""

    def forward(self, seed: int) -> bytes:
        at = random.Random(seed).randrange(len(CORPUS))
        return CORPUS[at:] + CORPUS[:at]


class Compress(soma.Node):
    """The document and its zlib-compressed form."""

    def forward(self, text: bytes) -> tuple[bytes, bytes]:
        return text, zlib.compress(text, 6)


class Checksum(soma.Node):
    """Adds a SHA-256 chained over the document a few times, as an archive's manifest would."""

    def forward(self, pair: tuple[bytes, bytes]) -> tuple[int, bytes, str]:
        text, packed = pair
        digest = hashlib.sha256(packed).digest()
        for _ in range(8):
            digest = hashlib.sha256(digest + text).digest()
        return len(text), packed, digest.hex()


class Measure(soma.Node):
    """How well the document compressed, and its checksum's first characters."""

    def forward(self, record: tuple[int, bytes, str]) -> tuple[float, str]:
        size, packed, digest = record
        return size / len(packed), digest[:12]


def main() -> None:
    # Compressing is the slowest step and keeps no state: two documents at once.
    g = soma.Graph.somatize(Load() >> Compress().concurrency(2) >> Checksum() >> Measure())

    started = time.perf_counter()
    looped = [g.forward(seed) for seed in range(DOCUMENTS)]
    loop_time = time.perf_counter() - started

    started = time.perf_counter()
    stream = g.map(range(DOCUMENTS), progress=True)
    streamed = list(stream)
    stream_time = time.perf_counter() - started

    assert streamed == looped, "a stream gives what a loop of forward gives, in the same order"
    ratio = sum(r for r, _ in streamed) / DOCUMENTS
    print(f"{DOCUMENTS} documents, compressed {ratio:.2f}x on average")
    print(f"a loop of forward: {loop_time:.2f} s; g.map: {stream_time:.2f} s", end="")
    print(f" ({loop_time / stream_time:.1f}x)")
    figures = stream.figures()
    assert figures is not None
    for stage in figures.stages:
        print(f"  stage {', '.join(stage.nodes):<10} busy {stage.busy:5.2f} s", end="")
        print(f"  waiting for input {stage.waiting:5.2f} s", end="")
        print(f"  blocked on output {stage.blocked:5.2f} s")
    print(f"bottleneck: {figures.bottleneck}")


if __name__ == "__main__":
    main()
