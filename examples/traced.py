"""A traced run: where the time went, node by node and thread by thread.

Runs the seed's shape with a little real work in each node, records a `soma.Trace`, prints the
slowest nodes and writes `run.json` — open it in https://ui.perfetto.dev or chrome://tracing to
see the two branches side by side on their own threads.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import soma


class Source(soma.Node):
    def forward(self, n: int) -> bytes:
        return bytes(range(256)) * n


class Digest(soma.Node):
    """Hashes its input `rounds` times; hashlib releases the GIL on large buffers."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def forward(self, data: bytes) -> bytes:
        for _ in range(self.rounds):
            data = hashlib.sha256(data).digest() * 4096
        return data


class Join(soma.Node):
    def forward(self, parts: dict[str, bytes]) -> str:
        return hashlib.sha256(b"".join(parts[k] for k in sorted(parts))).hexdigest()[:16]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("run.json")
    g = soma.Graph.somatize(
        Source()
        >> (
            (Digest(40).named("encoder") >> Digest(20).named("bottleneck"))
            | Digest(60).named("other")
        )
        >> Join()
    )
    trace = soma.Trace()
    print("result:", g.forward(4096, trace=trace))
    print()
    print(trace.summary())
    trace.write_chrome(out)
    threads = {span.thread for span in trace.spans}
    print(f"wrote {out}: {len(trace)} spans on {len(threads)} threads")


if __name__ == "__main__":
    main()
