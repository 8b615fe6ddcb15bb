//! The DSL: `>>` in series, `|` side by side — the same graph, catalog and plan as the long way,
//! and errors that survive gluing until `somatize` reports them.

use std::sync::Arc;

use soma_core::{compile, node_arc, Graph, GraphError, Node, NodeId};

use crate::support::{graph, n, Trace};

fn edges(graph: &Graph) -> Vec<(String, String)> {
    graph
        .edges()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn the_dsl_builds_the_same_graph_as_add_node_and_add_edge() {
    let (from_dsl, catalog) = (n("a") >> ((n("b") >> n("b2")) | n("c")) >> n("d"))
        .somatize()
        .unwrap();
    let by_hand = graph(
        &["a", "b", "b2", "c", "d"],
        &[("b", "b2"), ("a", "b"), ("a", "c"), ("b2", "d"), ("c", "d")],
    );
    assert_eq!(from_dsl.nodes(), by_hand.nodes());
    assert_eq!(edges(&from_dsl), edges(&by_hand));
    assert_eq!(catalog.len(), 5);
    assert!(from_dsl
        .nodes()
        .iter()
        .all(|id| catalog.contains(id.as_str())));
}

#[test]
fn the_dsl_and_add_edge_compile_to_the_same_plan() {
    let (from_dsl, catalog) = (n("a") >> ((n("b") >> n("b2")) | n("c")) >> n("d"))
        .somatize()
        .unwrap();
    let mut by_hand = Graph::new();
    for id in ["a", "b", "b2", "c", "d"] {
        by_hand.add_node(id).unwrap();
    }
    for (from, to) in [("b", "b2"), ("a", "b"), ("a", "c"), ("b2", "d"), ("c", "d")] {
        by_hand.add_edge(from, to).unwrap();
    }
    assert_eq!(compile(&from_dsl, &catalog), compile(&by_hand, &catalog));
}

#[test]
fn series_connects_every_terminal_to_every_head() {
    let (graph, _) = ((n("a") | n("b")) >> (n("c") | n("d"))).somatize().unwrap();
    assert_eq!(
        edges(&graph),
        [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")].map(|(a, b)| (a.to_owned(), b.to_owned()))
    );
}

#[test]
fn side_by_side_adds_no_edge() {
    let (graph, _) = (n("a") | n("b") | n("c")).somatize().unwrap();
    assert_eq!(graph.len(), 3);
    assert_eq!(graph.edges().len(), 0);
}

#[test]
fn series_binds_tighter_than_side_by_side() {
    let (written, _) = (n("a") >> n("b") | n("c")).somatize().unwrap();
    let (grouped, _) = ((n("a") >> n("b")) | n("c")).somatize().unwrap();
    let (other_way, _) = (n("a") >> (n("b") | n("c"))).somatize().unwrap();
    assert_eq!(edges(&written), edges(&grouped));
    assert_ne!(edges(&written), edges(&other_way));
}

#[test]
fn a_wire_lists_its_ids_in_declaration_order() {
    let expr = (n("z") | n("a")) >> n("m");
    let ids: Vec<&NodeId> = expr.ids().collect();
    assert_eq!(ids, [&NodeId::from("z"), &"a".into(), &"m".into()]);
}

#[test]
fn a_duplicate_id_in_a_wire_is_a_graph_error_from_somatize() {
    let result = (n("a") >> n("b") >> n("a")).somatize();
    assert_eq!(
        result.err(),
        Some(GraphError::DuplicateNode { id: "a".into() })
    );
}

#[test]
fn an_invalid_id_survives_gluing_and_is_reported_by_somatize() {
    let expr = n("a") >> (n("bad id") | n("c")) >> n("d");
    let glued = (expr | n("e")) >> n("f");
    assert_eq!(
        glued.somatize().err(),
        Some(GraphError::InvalidId {
            id: "bad id".into()
        })
    );
}

#[test]
fn somatize_reports_the_first_error_in_declaration_order() {
    let result = (n("a") >> n("no good") >> n("a") >> n("also bad")).somatize();
    assert_eq!(
        result.err(),
        Some(GraphError::InvalidId {
            id: "no good".into()
        })
    );
}

#[test]
fn node_arc_registers_the_very_implementation_it_was_given() {
    let shared: Arc<dyn Node> = Arc::new(Trace);
    let (_, catalog) = (node_arc("a", Arc::clone(&shared)) >> node_arc("b", Arc::clone(&shared)))
        .somatize()
        .unwrap();
    assert!(Arc::ptr_eq(catalog.get("a").unwrap(), &shared));
    assert!(Arc::ptr_eq(catalog.get("b").unwrap(), &shared));
}

#[test]
fn a_wire_can_be_cloned_and_used_twice() {
    let expr = n("a") >> n("b");
    let (one, _) = expr.clone().somatize().unwrap();
    let (two, _) = expr.somatize().unwrap();
    assert_eq!(edges(&one), edges(&two));
}

#[test]
fn a_chain_and_a_wave_grown_on_either_side_keep_their_declaration_order() {
    let names: Vec<String> = (0..1_000).map(|i| format!("n{i}")).collect();
    let mut appended = n(&names[0]);
    let mut prepended = n(&names[999]);
    let mut wave_appended = n(&names[0]);
    let mut wave_prepended = n(&names[999]);
    for i in 1..1_000 {
        appended = appended >> n(&names[i]);
        prepended = n(&names[999 - i]) >> prepended;
        wave_appended = wave_appended | n(&names[i]);
        wave_prepended = n(&names[999 - i]) | wave_prepended;
    }
    let chain: Vec<(String, String)> = names
        .windows(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    let (appended, _) = appended.somatize().unwrap();
    let (prepended, _) = prepended.somatize().unwrap();
    let (wave_appended, _) = wave_appended.somatize().unwrap();
    let (wave_prepended, _) = wave_prepended.somatize().unwrap();
    for graph in [&appended, &prepended, &wave_appended, &wave_prepended] {
        let ids: Vec<String> = graph.nodes().iter().map(ToString::to_string).collect();
        assert_eq!(ids, names);
    }
    assert_eq!(edges(&appended), chain);
    // Grown at the front, each new edge comes last, as `a >> (b >> c)` declares it.
    let mut backwards = chain.clone();
    backwards.reverse();
    assert_eq!(edges(&prepended), backwards);
    assert!(edges(&wave_appended).is_empty() && edges(&wave_prepended).is_empty());
    assert_eq!(wave_appended.roots().len(), 1_000);
}
