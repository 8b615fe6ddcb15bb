"""Soma in one screen: the README's example, which prints what the README says it prints.

    Source >> ((Encoder >> Bottleneck) | (Other >> Other2)) >> Join

The branches share the work of a variance: one computes the mean of the squares of 1..n, the
other their mean, and the join puts the two together as E[x^2] - E[x]^2. Run it with
`make demo`, or with `.venv/bin/python examples/quickstart.py` once `make demo` has set up .venv.
tests/test_examples.py holds this file to the README: its code is the README's block, and what
it prints is the README's.
"""

import soma


class Source(soma.Node):
    def forward(self, n: int) -> list[int]:
        return list(range(1, n + 1))


class Encoder(soma.Node):
    def forward(self, xs: list[int]) -> list[int]:
        return [x * x for x in xs]


class Bottleneck(soma.Node):
    def forward(self, xs: list[int]) -> float:
        return sum(xs) / len(xs)


class Other(soma.Node):
    def forward(self, xs: list[int]) -> tuple[int, int]:
        return sum(xs), len(xs)


class Other2(soma.Node):
    def forward(self, sum_and_count: tuple[int, int]) -> float:
        return sum_and_count[0] / sum_and_count[1]


class Join(soma.Node):
    def forward(self, branches: dict[str, float]) -> float:
        # Several inputs arrive as a dict keyed by the id of the node each came from.
        return branches["bottleneck"] - branches["other2"] ** 2


g = soma.Graph.somatize(Source() >> ((Encoder() >> Bottleneck()) | (Other() >> Other2())) >> Join())
print(repr(g.plan()))
print(g.plan().shape())
print(g.forward(10))  # the variance of 1..10
