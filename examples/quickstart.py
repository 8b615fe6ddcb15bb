"""Soma in one screen: the seed's graph, its plan, and a run.

    Source >> ((Encoder >> Bottleneck) | (Other >> Other2)) >> Join

The branches share the work of a variance: one computes the mean of the squares of 1..n, the
other their mean, and the join puts the two together as E[x^2] - E[x]^2. Run it with
`make demo`, or with `.venv/bin/python examples/quickstart.py` once `make demo` has set up .venv.
"""

import soma


class Source(soma.Node):
    """The numbers 1..n."""

    def forward(self, n: int) -> list[int]:
        return list(range(1, n + 1))


class Encoder(soma.Node):
    """Each number squared."""

    def forward(self, xs: list[int]) -> list[int]:
        return [x * x for x in xs]


class Bottleneck(soma.Node):
    """Many numbers down to one: their mean."""

    def forward(self, xs: list[int]) -> float:
        return sum(xs) / len(xs)


class Other(soma.Node):
    """The sum and the count, as a tuple (it reaches Other2 as the same tuple)."""

    def forward(self, xs: list[int]) -> tuple[int, int]:
        return sum(xs), len(xs)


class Other2(soma.Node):
    """The mean, from the sum and the count."""

    def forward(self, sum_and_count: tuple[int, int]) -> float:
        total, count = sum_and_count
        return total / count


class Join(soma.Node):
    """Both branches, keyed by the id of the node each came from."""

    def forward(self, branches: dict[str, float]) -> dict[str, float]:
        mean_of_squares, mean = branches["bottleneck"], branches["other2"]
        return {
            "mean": mean,
            "mean_of_squares": mean_of_squares,
            "variance": mean_of_squares - mean * mean,
        }


def main() -> None:
    g = soma.Graph.somatize(
        Source() >> ((Encoder() >> Bottleneck()) | (Other() >> Other2())) >> Join()
    )
    print("nodes:", g.nodes())
    print("edges:", g.edges())

    plan = g.plan()
    print("plan: ", repr(plan))
    print("shape:", plan.shape())

    result = g.forward(10)
    print("result:", result)
    assert result == {"mean": 5.5, "mean_of_squares": 38.5, "variance": 8.25}


if __name__ == "__main__":
    main()
