//! Depth costs no stack: a graph nested 100,000 levels deep — `(((a >> b) | c) >> d) | e …`,
//! each level wrapping the expression so far — compiles, distributes over hosts, draws, clones,
//! compares and drops on a 256 KiB thread stack, as a flat one does. (Running it is the executor's business, not asked
//! here.)
//!
//! The graphs are built with `add_node`/`add_edge` in a loop: the DSL would write the same
//! topology, but gluing an expression that deep is not what these tests ask about.

use std::sync::Arc;

use soma_core::{compile, decompose, Graph, Node, NodeError, NodeId, Plan, Value};

use crate::support::{catalog_of, on_a_small_stack};

/// Levels of the deep graph: each one a level of the plan, which alternates `Wave` and
/// `Sequence` all the way down.
const LEVELS: usize = 100_000;

/// Levels for the text drawings. Each line of the tree, of Mermaid and of DOT is indented by
/// its depth, so those texts grow with the square of it: at 100,000 levels the tree alone would
/// be about 60 GB. 2,000 levels is 25 MB of tree, and enough to overflow this stack with any of
/// those drawings, or `{:#?}`, recursing per level.
const TEXT_LEVELS: usize = 2_000;

/// Levels for the graph that has no series-parallel tree: the general decomposition visits a
/// node once per level, so 100,000 levels would be 10^10 visits. 2,000 overflowed its recursive
/// version on this stack.
const GENERAL_LEVELS: usize = 2_000;

/// `n0`, then `>> n1`, `| n2`, `>> n3`, `| n4` …: level `k` adds node `n{k}`, after everything so
/// far when `k` is odd, beside it when `k` is even. With `n_below`, the N (`na -> nc`,
/// `na -> nd`, `nb -> nd`, the smallest graph with no series-parallel tree) stands for `n0`.
fn nested(levels: usize, n_below: bool) -> Graph {
    let mut graph = Graph::new();
    let mut sinks: Vec<String> = if n_below {
        for id in ["na", "nb", "nc", "nd"] {
            graph.add_node(id).expect("a fresh, valid id");
        }
        for (from, to) in [("na", "nc"), ("na", "nd"), ("nb", "nd")] {
            graph.add_edge(from, to).expect("an edge of a DAG");
        }
        vec!["nc".into(), "nd".into()]
    } else {
        graph.add_node("n0").expect("a fresh, valid id");
        vec!["n0".into()]
    };
    for level in 1..=levels {
        let id = format!("n{level}");
        graph.add_node(id.as_str()).expect("a fresh, valid id");
        if level % 2 == 1 {
            for sink in &sinks {
                graph.add_edge(sink, &id).expect("an edge of a DAG");
            }
            sinks = vec![id];
        } else {
            sinks.push(id);
        }
    }
    graph
}

fn compiled(graph: &Graph) -> Plan {
    let identity: Arc<dyn Node> =
        Arc::new(|x: &Value| -> Result<Value, NodeError> { Ok(x.clone()) });
    compile(graph, &catalog_of(graph, &identity)).expect("every node implemented")
}

/// The plan of level `level` of [`nested`]: `[the level below, n{level}]`, a `Sequence` when
/// `level` is odd (`n{level}` reading what the level below ends with), a `Wave` when it is even
/// (`n{level}` reading the input); `n0` at the bottom. Checked from the top down, in a loop.
fn assert_nested(plan: &Plan, levels: usize) {
    let mut at = plan;
    for level in (1..=levels).rev() {
        let (Plan::Sequence(children) | Plan::Wave(children)) = at else {
            panic!("level {level} is a {}", at.kind());
        };
        let expected = if level % 2 == 1 { "Sequence" } else { "Wave" };
        assert_eq!(at.kind(), expected, "level {level}");
        assert_eq!(children.len(), 2, "level {level}");
        let Plan::Execute { node, from } = &children[1] else {
            panic!("level {level} ends with a {}", children[1].kind());
        };
        assert_eq!(node.as_str(), format!("n{level}"));
        let reads: Vec<String> = match level {
            1 => vec!["n0".into()],
            _ if level % 2 == 1 => vec![format!("n{}", level - 2), format!("n{}", level - 1)],
            _ => Vec::new(),
        };
        assert_eq!(from.iter().map(NodeId::as_str).collect::<Vec<_>>(), reads);
        at = &children[0];
    }
    assert!(matches!(at, Plan::Execute { node, from } if node.as_str() == "n0" && from.is_empty()));
}

#[test]
fn a_hundred_thousand_levels_compile_on_a_small_stack() {
    on_a_small_stack(|| {
        let graph = nested(LEVELS, false);
        let plan = compiled(&graph);
        // The top: `(… >> n99999) | n100000`.
        let Plan::Wave(branches) = &plan else {
            panic!("the root is a {}", plan.kind());
        };
        assert_eq!(branches.len(), 2);
        assert!(matches!(&branches[0], Plan::Sequence(steps) if steps.len() == 2));
        assert_nested(&plan, LEVELS);
        assert_eq!(plan.steps().len(), LEVELS + 1);
        assert!(decompose(&graph) == plan);
        drop((plan, graph));
    });
}

#[test]
fn a_deep_graph_without_a_tree_compiles_on_a_small_stack() {
    on_a_small_stack(|| {
        let graph = nested(GENERAL_LEVELS, true);
        let plan = compiled(&graph);
        // Everything has its tree but the N, which is walked in order at the bottom.
        let mut at = &plan;
        for _ in 1..GENERAL_LEVELS {
            let (Plan::Sequence(children) | Plan::Wave(children)) = at else {
                panic!("a {} above the bottom", at.kind());
            };
            at = &children[0];
        }
        assert_eq!(
            at.compact(),
            "Sequence([Execute(na), Execute(nb), Execute(nc), Execute(nd), Execute(n1)])"
        );
        assert_eq!(plan.steps().len(), GENERAL_LEVELS + 4);
        drop((plan, graph));
    });
}

#[test]
fn a_hundred_thousand_levels_draw_on_a_small_stack() {
    on_a_small_stack(|| {
        let graph = nested(LEVELS, false);
        let plan = compiled(&graph);
        let shape = plan.shape();
        assert!(shape.starts_with("Wave([Sequence([Wave([Sequence([Wave(["));
        assert!(shape.ends_with("Execute]), Execute]), Execute]), Execute])"));
        let compact = plan.compact();
        assert!(compact.starts_with("Wave([Sequence([Wave([Sequence([Wave(["));
        assert!(compact.ends_with("Execute(n99998)]), Execute(n99999)]), Execute(n100000)])"));
        for svg in [plan.to_svg(), graph.to_svg()] {
            assert_eq!(svg.matches("<g class=\"node\">").count(), LEVELS + 1);
            assert_eq!(
                svg.matches("<g class=\"edge\">").count(),
                graph.edges().len()
            );
        }
        assert_eq!(
            plan.to_svg().matches("<g class=\"wave\">").count(),
            LEVELS / 2
        );
        drop((plan, graph));
    });
}

#[test]
fn a_deep_plan_draws_as_text_on_a_small_stack() {
    on_a_small_stack(|| {
        let graph = nested(TEXT_LEVELS, false);
        let plan = compiled(&graph);
        // A line per plan: every node, and every level's `Sequence` or `Wave`.
        let tree = plan.to_string();
        assert_eq!(tree.lines().count(), 2 * TEXT_LEVELS + 1);
        assert!(tree.starts_with("Wave\n├── Sequence\n│   ├── Wave\n"));
        let deepest = "│   ".repeat(TEXT_LEVELS - 1);
        assert!(tree.contains(&format!(
            "\n{deepest}├── n0 <- (input)\n{deepest}└── n1 <- n0\n"
        )));
        for mermaid in [plan.to_mermaid(), graph.to_mermaid()] {
            assert_eq!(
                mermaid.matches("subgraph soma_wave_").count(),
                TEXT_LEVELS / 2
            );
            assert_eq!(mermaid.matches(" --> ").count(), graph.edges().len());
        }
        for dot in [plan.to_dot(), graph.to_dot()] {
            assert_eq!(
                dot.matches("subgraph cluster_wave_").count(),
                TEXT_LEVELS / 2
            );
            assert_eq!(dot.matches(" -> ").count(), graph.edges().len());
        }
        drop((plan, graph));
    });
}

#[test]
fn a_deep_plan_clones_compares_and_drops_on_a_small_stack() {
    on_a_small_stack(|| {
        let graph = nested(LEVELS, false);
        let plan = compiled(&graph);
        let mut copy = plan.clone();
        assert!(copy == plan);
        assert_nested(&copy, LEVELS);
        // A difference at the very bottom is found.
        let mut at = &mut copy;
        while let Plan::Sequence(children) | Plan::Wave(children) = at {
            at = &mut children[0];
        }
        *at = Plan::Empty;
        assert!(copy != plan);
        drop((copy, plan, graph));
    });
}

#[test]
fn a_deep_plan_debug_prints_on_a_small_stack() {
    on_a_small_stack(|| {
        let plan = compiled(&nested(LEVELS, false));
        let printed = format!("{plan:?}");
        assert!(printed.starts_with("Wave([Sequence([Wave([Sequence([Wave(["));
        assert!(printed.contains(
            "Sequence([Execute { node: \"n0\", from: [] }, Execute { node: \"n1\", from: [\"n0\"] }])"
        ));
        assert!(printed.ends_with("Execute { node: \"n100000\", from: [] }])"));
        // Pretty, each line indented by its depth: as for the text drawings, a shallower plan.
        let pretty = format!("{:#?}", compiled(&nested(TEXT_LEVELS, false)));
        assert!(pretty.starts_with("Wave(\n    [\n        Sequence(\n            [\n"));
        assert!(pretty.ends_with("        },\n    ],\n)"));
    });
}

#[test]
fn a_deep_plan_distributes_draws_clones_and_drops_on_a_small_stack() {
    use soma_core::{distribute, HostName, HostPlacement};
    on_a_small_stack(|| {
        let graph = nested(LEVELS, false);
        let plan = compiled(&graph);
        let (one, two): (HostName, HostName) = ("one".parse().unwrap(), "two".parse().unwrap());
        // Every node but the last on one host: one slice as deep as the plan, under the top.
        let mut deep = HostPlacement::new();
        // Alternating hosts: a slice at every level.
        let mut alternating = HostPlacement::new();
        for (at, node) in graph.nodes().iter().enumerate() {
            if at < LEVELS {
                deep.place(node.clone(), one.clone());
            }
            let host = if at % 2 == 0 { &one } else { &two };
            alternating.place(node.clone(), host.clone());
        }
        for hosts in [deep, alternating] {
            let distributed = distribute(&plan, &hosts);
            assert_eq!(distributed.steps(), plan.steps());
            assert!(distributed.to_svg().contains("class=\"host\""));
            let _ = format!("{distributed:?}");
            let copy = distributed.clone();
            assert!(copy == distributed && copy != plan);
            drop((copy, distributed));
        }
    });
}
