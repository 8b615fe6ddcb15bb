"""Run, edit a node, run again: only the edited node and what follows it are computed.

    Load >> Smooth >> Score

A pipeline of three slow-ish nodes is written to a module file (`pipeline.py`, in the current
folder), run in a fresh process with a `soma.Cache` folder, then run again unchanged (every node
a hit), then again after `Smooth`'s helper method is edited in the file (`Load` a hit, `Smooth`
and `Score` computed). Each run is its own process, as a researcher's runs are: what they share
is the cache folder. The script checks what each run called, and exits non-zero if a run called
more or less than that. Run it with `.venv/bin/python examples/rerun.py` after `make demo`.
"""

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PIPELINE = textwrap.dedent("""
    import sys
    import time

    import numpy as np

    import soma


    def called(name):
        # Each call said on stderr: a node's key covers the module-level values its code reads,
        # so a list of calls it appended to would be read as part of what it computes.
        print(name, file=sys.stderr, flush=True)


    class Load(soma.Node):
        def forward(self, n):
            called("load")
            time.sleep(0.2)  # reading a large file, say
            return np.random.default_rng(0).random(n)


    class Smooth(soma.Node):
        def __init__(self, width):
            self.width = width

        def kernel(self):
            return np.ones(self.width) / self.width

        def forward(self, x):
            called("smooth")
            return np.convolve(x, self.kernel(), mode="valid")


    class Score(soma.Node):
        def forward(self, x):
            called("score")
            return round(float(x.std()), 6)


    graph = soma.Graph.somatize(Load() >> Smooth(5) >> Score())
    cache = soma.Cache(sys.argv[1])
    score = graph.forward(100_000, cache=cache)
    stats = cache.stats()
    print(f"score {score}  hits {stats.hits}  saved {stats.seconds_saved:.2f} s")
""")


def run(folder: Path, cache: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(folder / "pipeline.py"), str(cache)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    called = done.stderr.split()
    print(f"{done.stdout.strip()}  called {called}")
    return called


def main() -> int:
    folder = Path(tempfile.mkdtemp())
    cache = folder / "cache"
    (folder / "pipeline.py").write_text(PIPELINE)
    print("first run:")
    first = run(folder, cache)
    print("again, unchanged:")
    again = run(folder, cache)
    edited = PIPELINE.replace("np.ones(self.width) / self.width", "np.hanning(self.width)")
    (folder / "pipeline.py").write_text(edited)
    print("after editing Smooth.kernel:")
    after_edit = run(folder, cache)
    expected = (["load", "smooth", "score"], [], ["smooth", "score"])
    if (first, again, after_edit) != expected:
        print(f"expected calls {expected}, got {(first, again, after_edit)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
