"""Plans and graphs drawn: the indented tree, Mermaid, DOT, and SVG for notebooks, by Soma."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

import soma
from conftest import Pass, build

SVG = "{http://www.w3.org/2000/svg}"


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
        return branches["bottleneck"] - branches["other2"] ** 2


def seed() -> soma.Graph:
    """The seed's graph: ``Source >> ((Encoder >> Bottleneck) | (Other >> Other2)) >> Join``."""
    return soma.Graph.somatize(
        Source() >> ((Encoder() >> Bottleneck()) | (Other() >> Other2())) >> Join()
    )


def texts(svg: str) -> list[str]:
    """The text of every ``<text>`` of an SVG document, parsing it as XML on the way."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return [element.text or "" for element in root.iter(f"{SVG}text")]


def arrows(svg: str) -> list[str]:
    """The title (``source -> target``) of every arrow of an SVG document."""
    root = ET.fromstring(svg)
    return [
        group.findtext(f"{SVG}title") or ""
        for group in root.iter(f"{SVG}g")
        if group.get("class") == "edge"
    ]


def test_str_of_a_plan_is_its_indented_tree() -> None:
    assert str(seed().plan()) == (
        "Sequence\n"
        "├── source <- (input)\n"
        "├── Wave\n"
        "│   ├── Sequence\n"
        "│   │   ├── encoder <- source\n"
        "│   │   └── bottleneck <- encoder\n"
        "│   └── Sequence\n"
        "│       ├── other <- source\n"
        "│       └── other2 <- other\n"
        "└── join <- bottleneck, other2"
    )


def test_repr_of_a_plan_stays_the_one_line_form() -> None:
    assert repr(seed().plan()) == (
        "Sequence([Execute(source), Wave([Sequence([Execute(encoder), Execute(bottleneck)]), "
        "Sequence([Execute(other), Execute(other2)])]), Execute(join)])"
    )


def test_to_mermaid_is_a_flowchart_with_every_node_and_every_edge() -> None:
    g = seed()
    mermaid = g.plan().to_mermaid()
    assert mermaid.startswith("flowchart LR\n")
    for node in g.nodes():
        assert f'{node}["{node}"]' in mermaid
    for source, target in g.edges():
        assert f"{source} --> {target}\n" in mermaid
    assert mermaid.count("subgraph ") == 1


def test_to_dot_is_a_digraph_with_every_node_and_every_edge() -> None:
    g = seed()
    dot = g.plan().to_dot()
    assert dot.startswith("digraph ")
    assert "rankdir=LR;" in dot
    for node in g.nodes():
        assert f'"{node}";' in dot
    for source, target in g.edges():
        assert f'"{source}" -> "{target}";' in dot
    assert dot.count("subgraph cluster_") == 1


def test_a_graph_draws_its_plan_in_mermaid_and_dot() -> None:
    g = seed()
    assert g.to_mermaid() == g.plan().to_mermaid()
    assert g.to_dot() == g.plan().to_dot()


def test_a_plans_svg_is_xml_with_every_node_id_as_text() -> None:
    g = seed()
    svg = g.plan()._repr_svg_()
    shown = texts(svg)
    for node in g.nodes():
        assert node in shown
    assert sorted(arrows(svg)) == sorted(f"{a} -> {b}" for a, b in g.edges())


def test_a_plans_svg_frames_its_wave() -> None:
    root = ET.fromstring(seed().plan().to_svg())
    frames = [group for group in root.iter(f"{SVG}g") if group.get("class") == "wave"]
    assert len(frames) == 1


def test_a_graphs_svg_is_xml_with_every_node_id_as_text_and_one_arrow_per_edge() -> None:
    g = seed()
    svg = g._repr_svg_()
    shown = texts(svg)
    for node in g.nodes():
        assert node in shown
    assert sorted(arrows(svg)) == sorted(f"{a} -> {b}" for a, b in g.edges())
    assert svg == g.to_svg()


def test_a_graph_that_is_not_series_parallel_still_gets_one_arrow_per_edge() -> None:
    g = build(["a", "b", "c", "d"], [("a", "c"), ("a", "d"), ("b", "d")])
    assert sorted(arrows(g._repr_svg_())) == ["a -> c", "a -> d", "b -> d"]


def test_ids_are_escaped_in_the_svg() -> None:
    odd = "a<b&\"c'>"
    g = soma.Graph()
    g.node(odd, Pass())
    g.node("z", Pass())
    g.edge(odd, "z")
    for svg in (g._repr_svg_(), g.plan()._repr_svg_()):
        assert odd in texts(svg)
        assert arrows(svg) == [f"{odd} -> z"]


def test_an_empty_graph_draws_an_svg_that_says_so() -> None:
    g = soma.Graph()
    for svg in (g._repr_svg_(), g.plan()._repr_svg_()):
        assert texts(svg) == ["Empty"]


def test_drawing_needs_no_external_program(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    g = seed()
    assert len(texts(g._repr_svg_())) == len(g)


def test_the_same_graph_is_drawn_with_the_same_bytes() -> None:
    first, second = seed(), seed()
    assert first.to_svg() == second.to_svg()
    assert first.plan().to_svg() == second.plan().to_svg()
