//! The graph: construction refuses what would make it invalid and changes nothing when it does;
//! queries answer in orders that depend on the graph alone.

use soma_core::{Graph, GraphError, NodeId};

use crate::support::graph;

/// Everything a query can see, so that "nothing changed" compares all of it at once.
fn snapshot(graph: &Graph) -> String {
    let around: Vec<String> = graph
        .nodes()
        .iter()
        .map(|id| {
            format!(
                "{id}: preds {:?} succs {:?}",
                graph.predecessors(id.as_str()).unwrap(),
                graph.successors(id.as_str()).unwrap()
            )
        })
        .collect();
    format!(
        "{graph:?} {around:?} roots {:?} leaves {:?} order {:?}",
        graph.roots(),
        graph.leaves(),
        graph.topological_sort()
    )
}

fn ids(list: &[&NodeId]) -> Vec<String> {
    list.iter().map(ToString::to_string).collect()
}

#[test]
fn an_empty_graph_has_no_node_edge_root_or_leaf() {
    let graph = Graph::new();
    assert!(graph.is_empty());
    assert_eq!(graph.len(), 0);
    assert_eq!(graph.edges().len(), 0);
    assert!(graph.roots().is_empty());
    assert!(graph.leaves().is_empty());
    assert!(graph.topological_sort().is_empty());
}

#[test]
fn a_one_node_graph_has_that_node_as_its_only_root_and_leaf() {
    let graph = graph(&["a"], &[]);
    assert_eq!(graph.len(), 1);
    assert!(graph.contains("a"));
    assert_eq!(ids(&graph.roots()), ["a"]);
    assert_eq!(ids(&graph.leaves()), ["a"]);
    assert_eq!(graph.topological_sort(), [NodeId::from("a")]);
}

#[test]
fn add_node_returns_the_id_it_stored() {
    let mut graph = Graph::new();
    assert_eq!(graph.add_node("a").unwrap(), &NodeId::from("a"));
}

#[test]
fn a_duplicate_node_is_refused_and_changes_nothing() {
    let mut graph = graph(&["a", "b"], &[("a", "b")]);
    let before = snapshot(&graph);
    assert_eq!(
        graph.add_node("a"),
        Err(GraphError::DuplicateNode { id: "a".into() })
    );
    assert_eq!(snapshot(&graph), before);
}

#[test]
fn an_invalid_id_is_refused_and_nothing_is_half_added() {
    for bad in [
        "",
        "two words",
        "tab\there",
        "line\nbreak",
        "bell\u{7}",
        " ",
    ] {
        let mut graph = graph(&["a"], &[]);
        let before = snapshot(&graph);
        assert_eq!(
            graph.add_node(bad),
            Err(GraphError::InvalidId { id: bad.into() }),
            "{bad:?} should be refused"
        );
        assert!(!graph.contains(bad));
        assert_eq!(snapshot(&graph), before);
    }
}

#[test]
fn an_id_is_valid_when_it_is_a_non_empty_name_without_whitespace_control_characters_or_slash() {
    for good in ["a", "layer_1", "encoder.block-2", "ñandú", "x:y.z"] {
        assert!(NodeId::from(good).is_valid(), "{good:?}");
    }
    for bad in ["", "a b", "a\u{a0}b", "a\u{0}b", "\t", "x/y", "/", "a/"] {
        assert!(!NodeId::from(bad).is_valid(), "{bad:?}");
    }
}

#[test]
fn an_id_holding_the_separator_is_refused_naming_it_and_nothing_is_added() {
    for bad in ["a/b", "/a", "a/", "m/a/b"] {
        let mut graph = graph(&["a"], &[]);
        let before = snapshot(&graph);
        assert_eq!(
            graph.add_node(bad),
            Err(GraphError::SeparatorInId { id: bad.into() }),
            "{bad:?} should be refused"
        );
        assert_eq!(snapshot(&graph), before);
    }
}

#[test]
fn refusal_says_what_add_node_would_refuse_and_changes_nothing() {
    let graph = graph(&["a"], &[]);
    assert_eq!(graph.refusal("b"), None);
    assert_eq!(
        graph.refusal("a"),
        Some(GraphError::DuplicateNode { id: "a".into() })
    );
    assert_eq!(
        graph.refusal("a/b"),
        Some(GraphError::SeparatorInId { id: "a/b".into() })
    );
    assert_eq!(
        graph.refusal("a b"),
        Some(GraphError::InvalidId { id: "a b".into() })
    );
    assert_eq!(graph.len(), 1);
}

#[test]
fn embed_adds_the_inner_nodes_and_edges_under_the_prefix_in_their_orders() {
    let inner = graph(&["x", "y", "z"], &[("x", "y"), ("x", "z")]);
    let mut outer = graph(&["split"], &[]);
    outer.embed("chunks", &inner).unwrap();
    let nodes: Vec<String> = outer.nodes().iter().map(ToString::to_string).collect();
    assert_eq!(nodes, ["split", "chunks/x", "chunks/y", "chunks/z"]);
    let edges: Vec<(String, String)> = outer
        .edges()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(
        edges,
        [
            ("chunks/x".to_owned(), "chunks/y".to_owned()),
            ("chunks/x".to_owned(), "chunks/z".to_owned())
        ]
    );
    assert_eq!(
        ids(&outer.successors("chunks/x").unwrap()),
        ["chunks/y", "chunks/z"]
    );
    assert_eq!(ids(&outer.predecessors("chunks/z").unwrap()), ["chunks/x"]);
    assert_eq!(ids(&outer.roots()), ["split", "chunks/x"]);
    // The embedded edges are known to the graph's own checks.
    assert_eq!(
        outer.add_edge("chunks/x", "chunks/y"),
        Err(GraphError::DuplicateEdge {
            from: "chunks/x".into(),
            to: "chunks/y".into()
        })
    );
    assert!(matches!(
        outer.add_edge("chunks/z", "chunks/x"),
        Err(GraphError::WouldCycle { .. })
    ));
}

#[test]
fn embed_refuses_an_id_the_graph_holds_naming_it_and_changes_nothing() {
    let inner = graph(&["x", "y"], &[("x", "y")]);
    let mut outer = Graph::new();
    outer.embed("m", &graph(&["y"], &[])).unwrap();
    let before = snapshot(&outer);
    assert_eq!(
        outer.embed("m", &inner),
        Err(GraphError::DuplicateNode { id: "m/y".into() })
    );
    assert_eq!(snapshot(&outer), before);
}

#[test]
fn embed_refuses_a_prefix_that_is_no_id_and_an_empty_graph_adds_nothing() {
    let mut outer = Graph::new();
    assert_eq!(
        outer.embed("two words", &graph(&["x"], &[])),
        Err(GraphError::InvalidId {
            id: "two words".into()
        })
    );
    assert!(outer.is_empty());
    outer.embed("two words", &Graph::new()).unwrap();
    assert!(outer.is_empty());
}

#[test]
fn embedding_twice_nests_the_paths() {
    let mut middle = Graph::new();
    middle.embed("inner", &graph(&["x"], &[])).unwrap();
    let mut outer = Graph::new();
    outer.embed("outer", &middle).unwrap();
    assert_eq!(outer.nodes(), [NodeId::from("outer/inner/x")]);
    let inside = NodeId::within("outer/inner/x", "outer");
    assert_eq!(inside, Some("inner/x"));
    assert_eq!(NodeId::within("inner/x", "inner"), Some("x"));
    assert_eq!(
        NodeId::step_and_rest("outer/inner/x"),
        Some(("outer", "inner/x"))
    );
    let prefixes: Vec<&str> = NodeId::prefixes("outer/inner/x").collect();
    assert_eq!(prefixes, ["outer", "outer/inner"]);
}

#[test]
fn a_path_is_read_within_its_prefix_only_at_a_separator() {
    assert_eq!(NodeId::within("chunks/clean", "chunks"), Some("clean"));
    assert_eq!(NodeId::within("chunksx/clean", "chunks"), None);
    assert_eq!(NodeId::within("chunks", "chunks"), None);
    assert_eq!(NodeId::step_and_rest("split"), None);
    assert_eq!(NodeId::prefixes("split").count(), 0);
}

#[test]
fn an_edge_from_or_to_an_unknown_node_is_refused_naming_it() {
    let mut graph = graph(&["a"], &[]);
    let before = snapshot(&graph);
    assert_eq!(
        graph.add_edge("ghost", "a"),
        Err(GraphError::UnknownNode { id: "ghost".into() })
    );
    assert_eq!(
        graph.add_edge("a", "ghost"),
        Err(GraphError::UnknownNode { id: "ghost".into() })
    );
    assert_eq!(snapshot(&graph), before);
}

#[test]
fn neighbours_of_an_unknown_node_are_refused_naming_it() {
    let graph = graph(&["a"], &[]);
    let unknown = Err(GraphError::UnknownNode { id: "ghost".into() });
    assert_eq!(graph.predecessors("ghost"), unknown);
    assert_eq!(graph.successors("ghost"), unknown);
}

#[test]
fn a_duplicate_edge_is_refused_and_changes_nothing() {
    let mut graph = graph(&["a", "b"], &[("a", "b")]);
    let before = snapshot(&graph);
    assert_eq!(
        graph.add_edge("a", "b"),
        Err(GraphError::DuplicateEdge {
            from: "a".into(),
            to: "b".into()
        })
    );
    assert_eq!(snapshot(&graph), before);
}

#[test]
fn a_self_loop_is_refused_with_the_path_a_a() {
    let mut graph = graph(&["a"], &[]);
    assert_eq!(
        graph.add_edge("a", "a"),
        Err(GraphError::WouldCycle {
            path: vec!["a".into(), "a".into()]
        })
    );
}

#[test]
fn an_edge_closing_a_cycle_is_refused_with_the_cycle_it_would_close() {
    let mut graph = graph(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
    assert_eq!(
        graph.add_edge("c", "a"),
        Err(GraphError::WouldCycle {
            path: vec!["c".into(), "a".into(), "b".into(), "c".into()]
        })
    );
}

#[test]
fn a_refused_edge_changes_nothing() {
    // Both ends already have neighbours, so the refusal comes from the full search, after the
    // graph was inspected most deeply.
    let mut graph = graph(
        &["a", "b", "c", "d"],
        &[("a", "b"), ("b", "c"), ("c", "d"), ("a", "c")],
    );
    let before = snapshot(&graph);
    assert!(matches!(
        graph.add_edge("d", "b"),
        Err(GraphError::WouldCycle { .. })
    ));
    assert!(graph.add_edge("c", "c").is_err());
    assert!(graph.add_edge("a", "b").is_err());
    assert_eq!(snapshot(&graph), before);
    graph
        .add_edge("b", "d")
        .expect("an edge that closes no cycle");
}

#[test]
fn a_shortcut_edge_along_an_existing_path_is_accepted() {
    let mut graph = graph(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
    assert_eq!(graph.add_edge("a", "c"), Ok(()));
    assert_eq!(graph.edges().len(), 3);
}

#[test]
fn edges_come_in_declaration_order() {
    let graph = graph(&["a", "b", "c"], &[("b", "c"), ("a", "c"), ("a", "b")]);
    let edges: Vec<(String, String)> = graph
        .edges()
        .map(|(from, to)| (from.to_string(), to.to_string()))
        .collect();
    assert_eq!(
        edges,
        [
            ("b".to_owned(), "c".to_owned()),
            ("a".to_owned(), "c".to_owned()),
            ("a".to_owned(), "b".to_owned())
        ]
    );
}

#[test]
fn nodes_come_in_insertion_order() {
    let graph = graph(&["z", "a", "m"], &[]);
    assert_eq!(graph.nodes(), [NodeId::from("z"), "a".into(), "m".into()]);
}

#[test]
fn roots_and_leaves_come_in_insertion_order() {
    let graph = graph(
        &["r2", "mid", "l2", "r1", "l1"],
        &[("r1", "mid"), ("r2", "mid"), ("mid", "l1"), ("mid", "l2")],
    );
    assert_eq!(ids(&graph.roots()), ["r2", "r1"]);
    assert_eq!(ids(&graph.leaves()), ["l2", "l1"]);
}

#[test]
fn predecessors_and_successors_come_in_edge_declaration_order() {
    let graph = graph(
        &["a", "b", "c", "x", "y", "z"],
        &[("c", "x"), ("a", "x"), ("b", "x"), ("x", "z"), ("x", "y")],
    );
    assert_eq!(ids(&graph.predecessors("x").unwrap()), ["c", "a", "b"]);
    assert_eq!(ids(&graph.successors("x").unwrap()), ["z", "y"]);
    assert!(graph.predecessors("a").unwrap().is_empty());
    assert!(graph.successors("z").unwrap().is_empty());
}

#[test]
fn a_node_with_many_neighbours_keeps_them_in_edge_declaration_order() {
    // Past the few a node keeps in place, its neighbours move to the heap; the order must not
    // change when they do.
    let mut graph = Graph::new();
    graph.add_node("hub").unwrap();
    let names: Vec<String> = (0..20).rev().map(|i| format!("n{i}")).collect();
    for (k, name) in names.iter().enumerate() {
        graph.add_node(name.as_str()).unwrap();
        if k % 2 == 0 {
            graph.add_edge(name, "hub").unwrap();
        } else {
            graph.add_edge("hub", name).unwrap();
        }
    }
    let sources: Vec<&str> = names.iter().step_by(2).map(String::as_str).collect();
    let targets: Vec<&str> = names
        .iter()
        .skip(1)
        .step_by(2)
        .map(String::as_str)
        .collect();
    assert_eq!(ids(&graph.predecessors("hub").unwrap()), sources);
    assert_eq!(ids(&graph.successors("hub").unwrap()), targets);
    let order = graph.topological_sort();
    let at = |id: &str| order.iter().position(|n| n.as_str() == id).unwrap();
    assert!(sources.iter().all(|s| at(s) < at("hub")));
    assert!(targets.iter().all(|t| at(t) > at("hub")));
}

#[test]
fn topological_sort_puts_every_node_after_its_predecessors() {
    let graph = graph(
        &["f", "e", "d", "c", "b", "a"],
        &[
            ("a", "b"),
            ("b", "c"),
            ("a", "d"),
            ("d", "e"),
            ("c", "f"),
            ("e", "f"),
        ],
    );
    let order = graph.topological_sort();
    assert_eq!(order.len(), graph.len());
    let at = |id: &NodeId| order.iter().position(|o| o == id).unwrap();
    for (from, to) in graph.edges() {
        assert!(at(from) < at(to), "`{from}` -> `{to}` in {order:?}");
    }
}

#[test]
fn topological_sort_breaks_ties_by_insertion_order() {
    let graph = graph(&["c", "b", "a"], &[]);
    assert_eq!(
        graph.topological_sort(),
        [NodeId::from("c"), "b".into(), "a".into()]
    );

    // `x` is inserted first but waits for `z`; `y` and `z` are ready together, `y` first.
    let graph = crate::support::graph(&["x", "y", "z"], &[("z", "x")]);
    assert_eq!(
        graph.topological_sort(),
        [NodeId::from("y"), "z".into(), "x".into()]
    );
}

#[test]
fn topological_sort_is_a_function_of_the_graph() {
    let build = || {
        graph(
            &["p", "q", "r", "s", "t"],
            &[("p", "s"), ("q", "s"), ("r", "t"), ("q", "t")],
        )
    };
    let (one, two) = (build(), build());
    assert_eq!(one.topological_sort(), one.topological_sort());
    assert_eq!(one.topological_sort(), two.topological_sort());
    assert_eq!(one.topological_sort(), one.clone().topological_sort());
}

#[test]
fn free_id_gives_the_base_when_it_is_free() {
    assert_eq!(graph(&["y"], &[]).free_id("x"), "x");
}

#[test]
fn free_id_gives_x_2_then_x_3() {
    let mut graph = graph(&["x"], &[]);
    assert_eq!(graph.free_id("x"), "x_2");
    graph.add_node("x_2").unwrap();
    assert_eq!(graph.free_id("x"), "x_3");
}

#[test]
fn free_id_gives_the_same_id_until_it_is_taken() {
    let mut graph = graph(&["x", "x_2"], &[]);
    assert_eq!(graph.free_id("x"), "x_3");
    assert_eq!(graph.free_id("x"), "x_3");
    graph.add_node("x_4").unwrap();
    graph.add_node("x_3").unwrap();
    assert_eq!(graph.free_id("x"), "x_5");
    assert_eq!(graph.free_id("y"), "y");
}

#[test]
fn free_id_fills_the_first_gap() {
    assert_eq!(graph(&["x", "x_3"], &[]).free_id("x"), "x_2");
}

#[test]
fn a_graph_error_names_its_nodes_in_backticks() {
    let cases = [
        (
            GraphError::InvalidId {
                id: "bad id".into(),
            },
            vec!["`bad id`"],
        ),
        (GraphError::DuplicateNode { id: "a".into() }, vec!["`a`"]),
        (
            GraphError::UnknownNode { id: "ghost".into() },
            vec!["`ghost`"],
        ),
        (
            GraphError::DuplicateEdge {
                from: "a".into(),
                to: "b".into(),
            },
            vec!["`a` -> `b`"],
        ),
        (
            GraphError::WouldCycle {
                path: vec!["c".into(), "a".into(), "b".into(), "c".into()],
            },
            vec!["`c` -> `a`", "`c` -> `a` -> `b` -> `c`"],
        ),
        (
            GraphError::SeparatorInId { id: "a/b".into() },
            vec!["`a/b`", "`/` separates a step's id", "`a_b`"],
        ),
        (
            GraphError::SeparatorInKey {
                step: "route".into(),
                key: "a/b".to_owned(),
            },
            vec!["`a/b`", "`route`", "`/`"],
        ),
    ];
    for (error, expected) in cases {
        let shown = error.to_string();
        for part in expected {
            assert!(shown.contains(part), "{shown:?} lacks {part:?}");
        }
    }
}

#[test]
fn a_node_id_clones_without_copying_its_text() {
    let id = NodeId::from("encoder");
    let copy = id.clone();
    assert!(std::sync::Arc::ptr_eq(&id.shared(), &copy.shared()));
    assert_eq!(copy.as_str(), "encoder");
    assert_eq!(format!("{id} {id:?}"), "encoder \"encoder\"");
}

/// Whether `to` can be reached from `from` along the graph's edges: the slow, obvious way.
fn reaches(graph: &Graph, from: &str, to: &str) -> bool {
    let mut seen = vec![from.to_owned()];
    let mut stack = vec![from.to_owned()];
    while let Some(at) = stack.pop() {
        if at == to {
            return true;
        }
        for next in graph.successors(&at).unwrap() {
            if !seen.contains(&next.to_string()) {
                seen.push(next.to_string());
                stack.push(next.to_string());
            }
        }
    }
    false
}

/// What `id` is inside `prefix`, which it must be under.
fn within<'a>(id: &'a NodeId, prefix: &str) -> &'a str {
    NodeId::within(id.as_str(), prefix).expect("under the prefix")
}

/// Ids the proptests below embed: names, some of them paths (a graph that holds steps).
fn an_id() -> impl proptest::strategy::Strategy<Value = String> {
    proptest::string::string_regex("[a-z_.:-]{1,4}(/[a-z_.:-]{1,4}){0,2}").expect("a regex")
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 256,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x43_59_43),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    #[test]
    fn an_edge_is_refused_exactly_when_it_closes_a_cycle_and_names_one_that_exists(
        edges in proptest::collection::vec((0_usize..12, 0_usize..12), 0..40),
        tried in proptest::collection::vec((0_usize..12, 0_usize..12), 1..20),
    ) {
        let names: Vec<String> = (0..12).map(|i| format!("n{i}")).collect();
        let mut graph = Graph::new();
        for name in &names {
            graph.add_node(name.as_str()).unwrap();
        }
        // Forward edges only: a DAG to start from.
        for (a, b) in edges.into_iter().filter(|(a, b)| a < b) {
            let _ = graph.add_edge(&names[a], &names[b]);
        }
        for (a, b) in tried {
            let (from, to) = (&names[a], &names[b]);
            let closes = reaches(&graph, to, from);
            match graph.add_edge(from, to) {
                Err(GraphError::WouldCycle { path }) => {
                    proptest::prop_assert!(closes);
                    proptest::prop_assert_eq!(path.first().map(NodeId::as_str), Some(from.as_str()));
                    proptest::prop_assert_eq!(path.get(1).map(NodeId::as_str), Some(to.as_str()));
                    proptest::prop_assert_eq!(path.last().map(NodeId::as_str), Some(from.as_str()));
                    for pair in path[1..].windows(2) {
                        let next = graph.successors(pair[0].as_str()).unwrap();
                        proptest::prop_assert!(next.contains(&&pair[1]), "{path:?}");
                    }
                }
                Err(GraphError::DuplicateEdge { .. }) => proptest::prop_assert!(!closes),
                Ok(()) => proptest::prop_assert!(!closes),
                Err(other) => proptest::prop_assert!(false, "{other}"),
            }
        }
    }

    #[test]
    fn an_embedded_graph_reads_back_within_its_prefix_as_it_was(
        ids in proptest::collection::btree_set(an_id(), 1..12),
        edges in proptest::collection::vec((0_usize..12, 0_usize..12), 0..24),
        prefix in an_id(),
    ) {
        let ids: Vec<String> = ids.into_iter().collect();
        let mut inner = Graph::new();
        // Paths as a graph holding steps has them: each embedded under its own prefix.
        for id in &ids {
            match id.rsplit_once(NodeId::SEPARATOR) {
                Some((at, name)) => inner.embed(at, &crate::support::graph(&[name], &[])).unwrap(),
                None => {
                    inner.add_node(id.as_str()).unwrap();
                }
            }
        }
        for (a, b) in edges {
            let (a, b) = (a % ids.len(), b % ids.len());
            if a < b {
                let _ = inner.add_edge(&ids[a], &ids[b]);
            }
        }
        let mut outer = Graph::new();
        outer.embed(&prefix, &inner).unwrap();
        let back: Vec<&str> = outer.nodes().iter().map(|id| within(id, &prefix)).collect();
        let was: Vec<&str> = inner.nodes().iter().map(NodeId::as_str).collect();
        proptest::prop_assert_eq!(back, was);
        let back: Vec<(&str, &str)> = outer
            .edges()
            .map(|(a, b)| (within(a, &prefix), within(b, &prefix)))
            .collect();
        let was: Vec<(&str, &str)> = inner.edges().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        proptest::prop_assert_eq!(back, was);
        // The outermost step is the prefix's first name, whatever the prefix holds.
        let first = NodeId::step_and_rest(&prefix).map_or(prefix.as_str(), |(step, _)| step);
        for id in outer.nodes() {
            let step = NodeId::step_and_rest(id.as_str()).map(|(step, _)| step);
            proptest::prop_assert_eq!(step, Some(first));
        }
    }
}
