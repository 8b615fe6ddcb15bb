"""Two branches on two threads: the seed's shape with numpy work that releases the GIL.

    RandomMatrix >> ((TriangularFactor >> SingularValues)
                     | (Inverse >> SingularValues)) >> ConditionNumber

The same shape as Source >> ((Encoder >> Bottleneck) | (Other >> Other2)) >> Join. Both
branches compute the condition number of one random matrix A, in two ways: from the singular
values of R in A = QR, and from the singular values of A's inverse. Each is about a third of a
second of LAPACK, which runs with the GIL released, so the wave's two threads really overlap.
The script times the graph against the same node objects called one after the other in plain
Python, and prints the ratio: close to 2x on a machine with two cores or more, about 1x on one.
Run it with `.venv/bin/python examples/branches.py` after `make demo`.
"""

import os

# One BLAS thread per branch, set before numpy loads OpenBLAS: the speed-up measured is then
# the wave's two threads, not BLAS spreading a single call over every core.
for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"

import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import cast  # noqa: E402

import numpy as np  # noqa: E402

import soma  # noqa: E402

SIZE = 1000
REPEATS = 3


class RandomMatrix(soma.Node):
    """A seeded SIZE x SIZE matrix with standard normal entries."""

    def forward(self, seed: int) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal((SIZE, SIZE))


class TriangularFactor(soma.Node):
    """R in A = QR: the same singular values as A, in a triangle."""

    def forward(self, a: np.ndarray) -> np.ndarray:
        # numpy's stubs say QRResult for every mode; mode="r" returns R alone.
        return cast("np.ndarray", np.linalg.qr(a, mode="r"))


class Inverse(soma.Node):
    """A's inverse, whose singular values are the reciprocals of A's."""

    def forward(self, a: np.ndarray) -> np.ndarray:
        return np.linalg.inv(a)


class SingularValues(soma.Node):
    """The singular values, largest first."""

    def forward(self, m: np.ndarray) -> np.ndarray:
        return np.linalg.svd(m, compute_uv=False)


class ConditionNumber(soma.Node):
    """The largest singular value over the smallest, from each branch."""

    def forward(self, branches: dict[str, np.ndarray]) -> dict[str, float]:
        of_r, of_inverse = branches["sigma_of_r"], branches["sigma_of_inverse"]
        return {
            "from_qr": float(of_r[0] / of_r[-1]),
            "from_inverse": float(of_inverse[0] / of_inverse[-1]),
        }


def best_of(repeats: int, run: Callable[[], dict[str, float]]) -> tuple[float, dict[str, float]]:
    """The shortest wall time of `repeats` runs, after one untimed warm-up, and the result."""
    result = run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    source = RandomMatrix()
    factor, sigma_of_r = TriangularFactor(), SingularValues().named("sigma_of_r")
    inverse, sigma_of_inverse = Inverse(), SingularValues().named("sigma_of_inverse")
    join = ConditionNumber()

    g = soma.Graph.somatize(
        source >> ((factor >> sigma_of_r) | (inverse >> sigma_of_inverse)) >> join
    )
    print("plan: ", repr(g.plan()))
    print("shape:", g.plan().shape())

    def in_a_row() -> dict[str, float]:
        a = source.forward(0)
        return join.forward(
            {
                "sigma_of_r": sigma_of_r.forward(factor.forward(a)),
                "sigma_of_inverse": sigma_of_inverse.forward(inverse.forward(a)),
            }
        )

    wave, by_graph = best_of(REPEATS, lambda: g.forward(0))
    row, by_hand = best_of(REPEATS, in_a_row)

    for key, value in by_graph.items():
        assert np.isclose(value, by_hand[key], rtol=1e-9), (key, value, by_hand[key])
    print(
        f"condition number of A: {by_graph['from_qr']:.6g} from R, "
        f"{by_graph['from_inverse']:.6g} from the inverse"
    )
    print(
        f"two branches on two threads: {wave:.2f} s; "
        f"the same nodes in a row: {row:.2f} s; {row / wave:.2f}x"
    )


if __name__ == "__main__":
    main()
