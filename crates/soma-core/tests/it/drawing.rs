//! Drawing: the indented tree (`Display`), the one-line form (`compact`), Mermaid, DOT, and the
//! SVG of a plan and of a graph — exact for small plans, by placement for shapes, escaped for
//! any id, the same bytes every time, and flat on the stack for a chain of any length.

use soma_core::{decompose, Graph, Plan};

use crate::support::{exec, graph, n, seq, wave};

/// The seed's graph: `source >> ((encoder >> bottleneck) | (other >> other2)) >> join`.
fn seed() -> Graph {
    let expr = n("source")
        >> ((n("encoder") >> n("bottleneck")) | (n("other") >> n("other2")))
        >> n("join");
    expr.somatize().expect("fresh, valid ids").0
}

fn diamond() -> Plan {
    seq(vec![
        exec("a", &[]),
        wave(vec![exec("b", &["a"]), exec("c", &["a"])]),
        exec("d", &["b", "c"]),
    ])
}

/// The N: `a->c, a->d, b->d`, the smallest graph that is not series-parallel.
fn the_n() -> Graph {
    graph(&["a", "b", "c", "d"], &[("a", "c"), ("a", "d"), ("b", "d")])
}

/// Each node's box in an SVG, as `(id as written, x, y)`, in drawing order.
fn boxes(svg: &str) -> Vec<(String, i64, i64)> {
    svg.split("<g class=\"node\">")
        .skip(1)
        .map(|node| {
            let text = &node[node.find("<text").expect("a label")..];
            let id =
                &text[text.find('>').expect("a tag") + 1..text.find("</text>").expect("an end")];
            (id.to_owned(), attribute(node, "x"), attribute(node, "y"))
        })
        .collect()
}

/// The first integer attribute `name` in `element`.
fn attribute(element: &str, name: &str) -> i64 {
    let key = format!(" {name}=\"");
    let start = element.find(&key).expect("the attribute") + key.len();
    let end = start + element[start..].find('"').expect("a closing quote");
    element[start..end].parse().expect("an integer")
}

fn at(boxes: &[(String, i64, i64)], id: &str) -> (i64, i64) {
    let found = boxes.iter().find(|(name, _, _)| name == id);
    let (_, x, y) = found.unwrap_or_else(|| panic!("no box for `{id}` in {boxes:?}"));
    (*x, *y)
}

// ---------------------------------------------------------------------------------------------
// The tree and the one-line form

#[test]
fn the_tree_of_a_chain_lists_its_steps_in_order() {
    let plan = seq(vec![exec("a", &[]), exec("b", &["a"]), exec("c", &["b"])]);
    assert_eq!(
        plan.to_string(),
        "Sequence\n\
         ├── a <- (input)\n\
         ├── b <- a\n\
         └── c <- b"
    );
}

#[test]
fn the_tree_nests_each_branch_of_a_wave_under_it() {
    assert_eq!(
        decompose(&seed()).to_string(),
        "Sequence\n\
         ├── source <- (input)\n\
         ├── Wave\n\
         │   ├── Sequence\n\
         │   │   ├── encoder <- source\n\
         │   │   └── bottleneck <- encoder\n\
         │   └── Sequence\n\
         │       ├── other <- source\n\
         │       └── other2 <- other\n\
         └── join <- bottleneck, other2"
    );
}

#[test]
fn the_tree_of_a_single_step_or_of_nothing_is_one_line() {
    assert_eq!(exec("only", &[]).to_string(), "only <- (input)");
    assert_eq!(Plan::Empty.to_string(), "Empty");
}

#[test]
fn compact_keeps_the_one_line_form_with_ids() {
    assert_eq!(
        diamond().compact(),
        "Sequence([Execute(a), Wave([Execute(b), Execute(c)]), Execute(d)])"
    );
    assert_eq!(Plan::Empty.compact(), "Empty");
}

// ---------------------------------------------------------------------------------------------
// Mermaid and DOT

#[test]
fn mermaid_is_a_left_to_right_flowchart_with_a_subgraph_per_wave() {
    assert_eq!(
        diamond().to_mermaid(),
        "flowchart LR\n\
         \x20   a[\"a\"]\n\
         \x20   subgraph soma_wave_0 [wave]\n\
         \x20       b[\"b\"]\n\
         \x20       c[\"c\"]\n\
         \x20   end\n\
         \x20   d[\"d\"]\n\
         \x20   a --> b\n\
         \x20   a --> c\n\
         \x20   b --> d\n\
         \x20   c --> d\n"
    );
}

#[test]
fn mermaid_renames_the_ids_it_cannot_read_and_keeps_them_as_labels() {
    let plan = seq(vec![
        exec("end", &[]),
        exec("a-b", &["end"]),
        exec("soma_x", &["a-b"]),
        exec("x\"y#1", &["soma_x"]),
        exec("Ok_2", &["x\"y#1"]),
    ]);
    assert_eq!(
        plan.to_mermaid(),
        "flowchart LR\n\
         \x20   soma_n0[\"end\"]\n\
         \x20   soma_n1[\"a-b\"]\n\
         \x20   soma_n2[\"soma_x\"]\n\
         \x20   soma_n3[\"x#quot;y#35;1\"]\n\
         \x20   Ok_2[\"Ok_2\"]\n\
         \x20   soma_n0 --> soma_n1\n\
         \x20   soma_n1 --> soma_n2\n\
         \x20   soma_n2 --> soma_n3\n\
         \x20   soma_n3 --> Ok_2\n"
    );
}

#[test]
fn dot_is_a_left_to_right_digraph_with_a_cluster_per_wave() {
    assert_eq!(
        diamond().to_dot(),
        "digraph plan {\n\
         \x20   rankdir=LR;\n\
         \x20   node [shape=box, style=\"rounded,filled\", fillcolor=\"#e8f0fe\", color=\"#3366aa\", fontname=\"monospace\"];\n\
         \x20   \"a\";\n\
         \x20   subgraph cluster_wave_0 {\n\
         \x20       label=\"wave\"; style=\"dashed,rounded\"; color=\"#b7791f\";\n\
         \x20       \"b\";\n\
         \x20       \"c\";\n\
         \x20   }\n\
         \x20   \"d\";\n\
         \x20   \"a\" -> \"b\";\n\
         \x20   \"a\" -> \"c\";\n\
         \x20   \"b\" -> \"d\";\n\
         \x20   \"c\" -> \"d\";\n\
         }\n"
    );
}

#[test]
fn dot_quotes_every_id_and_escapes_quotes_and_backslashes() {
    let dot = seq(vec![exec("a\"b", &[]), exec("c\\d", &["a\"b"])]).to_dot();
    assert!(dot.contains("    \"a\\\"b\";\n"), "{dot}");
    assert!(dot.contains("    \"a\\\"b\" -> \"c\\\\d\";\n"), "{dot}");
}

// ---------------------------------------------------------------------------------------------
// SVG

#[test]
fn the_svg_of_a_two_step_chain_is_exactly_two_boxes_and_an_arrow() {
    assert_eq!(
        seq(vec![exec("a", &[]), exec("b", &["a"])]).to_svg(),
        concat!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"216\" height=\"72\" viewBox=\"0 0 216 72\" font-family=\"Menlo, Consolas, DejaVu Sans Mono, monospace\" font-size=\"13\">\n",
            "<rect class=\"background\" x=\"0\" y=\"0\" width=\"216\" height=\"72\" fill=\"#fcfcfc\"/>\n",
            "<g class=\"edge\"><title>a -&gt; b</title><path d=\"M84,36 C104,36 104,36 124,36\" fill=\"none\" stroke=\"#666666\" stroke-width=\"1.4\"/><path d=\"M132,36 L124,32 L124,40 Z\" fill=\"#666666\"/></g>\n",
            "<g class=\"node\"><rect x=\"20\" y=\"20\" width=\"64\" height=\"32\" rx=\"6\" fill=\"#e8f0fe\" stroke=\"#3366aa\" stroke-width=\"1.2\"/><text x=\"52\" y=\"40\" text-anchor=\"middle\" fill=\"#1a1a1a\">a</text></g>\n",
            "<g class=\"node\"><rect x=\"132\" y=\"20\" width=\"64\" height=\"32\" rx=\"6\" fill=\"#e8f0fe\" stroke=\"#3366aa\" stroke-width=\"1.2\"/><text x=\"164\" y=\"40\" text-anchor=\"middle\" fill=\"#1a1a1a\">b</text></g>\n",
            "</svg>\n",
        )
    );
}

#[test]
fn a_series_is_drawn_left_to_right_on_one_level() {
    let svg = seq(vec![exec("a", &[]), exec("b", &["a"]), exec("c", &["b"])]).to_svg();
    let boxes = boxes(&svg);
    let (a, b, c) = (at(&boxes, "a"), at(&boxes, "b"), at(&boxes, "c"));
    assert!(a.0 < b.0 && b.0 < c.0, "{boxes:?}");
    assert!(a.1 == b.1 && b.1 == c.1, "{boxes:?}");
}

#[test]
fn a_wave_is_drawn_with_its_branches_stacked() {
    let svg = diamond().to_svg();
    let boxes = boxes(&svg);
    let (a, b, c, d) = (
        at(&boxes, "a"),
        at(&boxes, "b"),
        at(&boxes, "c"),
        at(&boxes, "d"),
    );
    assert_eq!(b.0, c.0, "the branches start together: {boxes:?}");
    assert!(b.1 < c.1, "the first branch on top: {boxes:?}");
    assert!(a.0 < b.0 && c.0 < d.0, "{boxes:?}");
    assert_eq!(a.1, d.1, "the steps around the wave are level: {boxes:?}");
}

#[test]
fn a_plan_frames_each_wave_and_a_graph_frames_nothing() {
    let graph = seed();
    let plan = decompose(&graph).to_svg();
    assert_eq!(plan.matches("<g class=\"wave\">").count(), 1, "{plan}");
    let drawn = graph.to_svg();
    assert!(!drawn.contains("class=\"wave\""), "{drawn}");
    assert_eq!(boxes(&plan).len(), 6);
    assert_eq!(boxes(&drawn).len(), 6);
}

#[test]
fn the_part_that_is_not_series_parallel_is_drawn_in_topological_columns() {
    let graph = the_n();
    for svg in [graph.to_svg(), decompose(&graph).to_svg()] {
        let boxes = boxes(&svg);
        let (a, b, c, d) = (
            at(&boxes, "a"),
            at(&boxes, "b"),
            at(&boxes, "c"),
            at(&boxes, "d"),
        );
        assert!(a.0 == b.0 && c.0 == d.0 && a.0 < c.0, "{boxes:?}");
        assert!(a.1 < b.1 && c.1 < d.1, "{boxes:?}");
    }
}

#[test]
fn a_plan_frames_the_stretch_it_walks_in_order() {
    let svg = decompose(&the_n()).to_svg();
    assert_eq!(svg.matches("<g class=\"in-order\">").count(), 1, "{svg}");
    let series = decompose(&seed()).to_svg();
    assert!(!series.contains("in-order"), "{series}");
}

#[test]
fn the_graph_drawing_has_a_box_per_node_and_an_arrow_per_edge() {
    let graph = the_n();
    let svg = graph.to_svg();
    assert_eq!(boxes(&svg).len(), graph.len());
    assert_eq!(
        svg.matches("<g class=\"edge\">").count(),
        graph.edges().len()
    );
    for (from, to) in graph.edges() {
        let title = format!("<title>{from} -&gt; {to}</title>");
        assert!(svg.contains(&title), "no arrow {from} -> {to} in {svg}");
    }
}

#[test]
fn an_arrow_that_would_cross_a_box_on_its_level_goes_over_it() {
    let plan = seq(vec![
        exec("a", &[]),
        exec("b", &["a"]),
        exec("c", &["b", "a"]),
    ]);
    let svg = plan.to_svg();
    let arrow = svg
        .split("<g class=\"edge\">")
        .find(|edge| edge.starts_with("<title>a -&gt; c</title>"))
        .expect("an arrow a -> c");
    // Up, across above the boxes (whose top is at y = 20), and down, in quarter turns.
    assert!(arrow.contains(" Q"), "{arrow}");
    assert!(arrow.contains(",15 L"), "{arrow}");
}

#[test]
fn ids_are_escaped_in_svg() {
    let id = "a<b&\"c'>";
    let plan = seq(vec![exec(id, &[]), exec("z", &[id])]);
    let mut graph = Graph::new();
    graph.add_node(id).expect("a valid id");
    graph.add_node("z").expect("a valid id");
    graph.add_edge(id, "z").expect("an edge");
    for svg in [plan.to_svg(), graph.to_svg()] {
        assert!(
            svg.contains(">a&lt;b&amp;&quot;c&apos;&gt;</text>"),
            "the id as text: {svg}"
        );
        assert!(
            svg.contains("<title>a&lt;b&amp;&quot;c&apos;&gt; -&gt; z</title>"),
            "{svg}"
        );
        assert!(!svg.contains(id), "the raw id: {svg}");
    }
}

#[test]
fn a_box_is_wide_enough_for_its_id() {
    let long = "a_rather_long_node_identifier";
    let svg = exec(long, &[]).to_svg();
    let node = svg.split("<g class=\"node\">").nth(1).expect("a box");
    let width = attribute(node, "width");
    let needed = i64::try_from(long.len()).expect("a short id") * 8;
    assert!(width >= needed, "{width} < {needed}");
}

#[test]
fn an_empty_plan_and_an_empty_graph_draw_a_card_that_says_so() {
    for svg in [Plan::Empty.to_svg(), Graph::new().to_svg()] {
        assert!(svg.starts_with("<svg "), "{svg}");
        assert!(svg.contains(">Empty</text>"), "{svg}");
        assert!(svg.ends_with("</svg>\n"), "{svg}");
    }
}

#[test]
fn every_drawing_has_an_opaque_light_background_and_explicit_colours() {
    let svg = seed().to_svg();
    assert!(svg.contains("<rect class=\"background\" x=\"0\" y=\"0\""));
    assert!(svg.contains("fill=\"#fcfcfc\""));
    assert!(!svg.contains("currentColor"));
    assert!(
        !svg.contains("url("),
        "no reference outside the drawing: {svg}"
    );
}

#[test]
fn drawings_are_the_same_bytes_every_time() {
    let (first, second) = (seed(), seed());
    assert_eq!(first.to_svg(), second.to_svg());
    let (p, q) = (decompose(&first), decompose(&second));
    assert_eq!(p.to_svg(), q.to_svg());
    assert_eq!(p.to_mermaid(), q.to_mermaid());
    assert_eq!(p.to_dot(), q.to_dot());
    assert_eq!(p.to_string(), q.to_string());
}

#[test]
fn drawing_a_100000_node_chain_does_not_overflow_the_stack() {
    const LEN: usize = 100_000;
    let ids: Vec<String> = (0..LEN).map(|i| format!("n{i}")).collect();
    let mut graph = Graph::new();
    for id in &ids {
        graph.add_node(id.as_str()).expect("a fresh id");
    }
    for pair in ids.windows(2) {
        graph.add_edge(&pair[0], &pair[1]).expect("a chain edge");
    }
    // A stack far smaller than a thread's default: recursion per step would need megabytes.
    let drawn = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            let plan = decompose(&graph);
            [
                plan.to_string(),
                plan.to_mermaid(),
                plan.to_dot(),
                plan.to_svg(),
                graph.to_svg(),
            ]
        })
        .expect("a thread")
        .join()
        .expect("no overflow");
    let [tree, mermaid, dot, svg, graph_svg] = drawn;
    assert_eq!(tree.lines().count(), LEN + 1);
    assert_eq!(mermaid.matches(" --> ").count(), LEN - 1);
    assert_eq!(dot.matches(" -> ").count(), LEN - 1);
    assert_eq!(svg.matches("<g class=\"node\">").count(), LEN);
    assert_eq!(graph_svg.matches("<g class=\"edge\">").count(), LEN - 1);
}

#[test]
fn a_graph_draws_as_mermaid_and_dot_exactly_as_its_plan_does() {
    let graph = seed();
    let plan = decompose(&graph);
    assert_eq!(graph.to_mermaid(), plan.to_mermaid());
    assert_eq!(graph.to_dot(), plan.to_dot());
}
