//! Decomposition: the plan is the series-parallel tree recovered from the graph — `Empty`, one
//! `Execute`, a `Wave` per set of connected components, a `Sequence` per series cut, and a walk
//! in topological order for what has no tree. And `compile` refuses a graph it cannot run.

use std::sync::Arc;

use soma_core::{compile, decompose, Catalog, CompileError, Graph, Node, Plan};

use crate::support::{catalog_of, exec, flat_plan, graph, n, seq, wave, Trace};

fn plan_of(expr: soma_core::Expr) -> Plan {
    let (graph, catalog) = expr.somatize().expect("fresh, valid ids");
    compile(&graph, &catalog).expect("every node is implemented")
}

#[test]
fn an_empty_graph_is_empty() {
    assert_eq!(decompose(&Graph::new()), Plan::Empty);
}

#[test]
fn one_node_is_one_execute() {
    assert_eq!(plan_of(n("a")), exec("a", &[]));
}

#[test]
fn a_chain_is_a_flat_sequence_of_executes() {
    assert_eq!(
        plan_of(n("a") >> n("b") >> n("c") >> n("d")),
        seq(vec![
            exec("a", &[]),
            exec("b", &["a"]),
            exec("c", &["b"]),
            exec("d", &["c"]),
        ])
    );
}

#[test]
fn a_chain_compiles_identically_to_before_waves() {
    // Everything closed before waves is a chain: its plan must be exactly the walk there was.
    let chain = graph(
        &["e", "d", "c", "b", "a"],
        &[("a", "b"), ("b", "c"), ("c", "d"), ("d", "e")],
    );
    assert_eq!(decompose(&chain), flat_plan(&chain));
}

#[test]
fn a_fan_out_is_its_root_then_a_wave() {
    assert_eq!(
        plan_of(n("a") >> (n("b") | n("c"))),
        seq(vec![
            exec("a", &[]),
            wave(vec![exec("b", &["a"]), exec("c", &["a"])]),
        ])
    );
}

#[test]
fn a_fan_in_is_a_wave_then_its_join() {
    assert_eq!(
        plan_of((n("a") | n("b")) >> n("c")),
        seq(vec![
            wave(vec![exec("a", &[]), exec("b", &[])]),
            exec("c", &["a", "b"]),
        ])
    );
}

#[test]
fn a_diamond_is_its_root_a_wave_and_its_join() {
    assert_eq!(
        plan_of(n("a") >> (n("b") | n("c")) >> n("d")),
        seq(vec![
            exec("a", &[]),
            wave(vec![exec("b", &["a"]), exec("c", &["a"])]),
            exec("d", &["b", "c"]),
        ])
    );
}

#[test]
fn branches_of_several_nodes_make_a_wave_of_two_sequences() {
    let plan = plan_of(n("a") >> ((n("b") >> n("b2") >> n("b3")) | (n("c") >> n("c2"))) >> n("d"));
    assert_eq!(
        plan,
        seq(vec![
            exec("a", &[]),
            wave(vec![
                seq(vec![
                    exec("b", &["a"]),
                    exec("b2", &["b"]),
                    exec("b3", &["b2"])
                ]),
                seq(vec![exec("c", &["a"]), exec("c2", &["c"])]),
            ]),
            exec("d", &["b3", "c2"]),
        ])
    );
    assert_eq!(
        plan.shape(),
        "Sequence([Execute, Wave([Sequence([Execute, Execute, Execute]), Sequence([Execute, Execute])]), Execute])"
    );
}

#[test]
fn a_branch_is_not_split_at_a_barrier() {
    // The counterexample to cutting at barrier nodes: that rule gives
    // Sequence([Wave([a, b]), a2, Wave([c, d])]) and tears `a >> a2` apart.
    assert_eq!(
        plan_of(((n("a") >> n("a2")) | n("b")) >> (n("c") | n("d"))),
        seq(vec![
            wave(vec![
                seq(vec![exec("a", &[]), exec("a2", &["a"])]),
                exec("b", &[])
            ]),
            wave(vec![exec("c", &["a2", "b"]), exec("d", &["a2", "b"])]),
        ])
    );
}

#[test]
fn two_pairs_in_series_are_two_waves_not_one_of_four() {
    assert_eq!(
        plan_of((n("a") | n("b")) >> (n("c") | n("d"))),
        seq(vec![
            wave(vec![exec("a", &[]), exec("b", &[])]),
            wave(vec![exec("c", &["a", "b"]), exec("d", &["a", "b"])]),
        ])
    );
}

#[test]
fn a_wave_can_sit_inside_another_waves_branch() {
    assert_eq!(
        plan_of(n("a") >> ((n("b") >> (n("c") | n("d")) >> n("e")) | n("f")) >> n("g")),
        seq(vec![
            exec("a", &[]),
            wave(vec![
                seq(vec![
                    exec("b", &["a"]),
                    wave(vec![exec("c", &["b"]), exec("d", &["b"])]),
                    exec("e", &["c", "d"]),
                ]),
                exec("f", &["a"]),
            ]),
            exec("g", &["e", "f"]),
        ])
    );
}

#[test]
fn two_unrelated_long_graphs_are_two_branches() {
    let chain = |p: &str| {
        (1..=5)
            .map(|i| n(&format!("{p}{i}")))
            .reduce(|expr, next| expr >> next)
            .unwrap()
    };
    let branch = |p: &str| {
        seq((1..=5)
            .map(|i| {
                let node = format!("{p}{i}");
                let from = format!("{p}{}", i - 1);
                if i == 1 {
                    exec(&node, &[])
                } else {
                    exec(&node, &[&from])
                }
            })
            .collect())
    };
    assert_eq!(
        plan_of(chain("a") | chain("b")),
        wave(vec![branch("a"), branch("b")])
    );
}

#[test]
fn unrelated_branches_come_in_declaration_order() {
    let graph = graph(&["z", "a", "z2"], &[("z", "z2")]);
    assert_eq!(
        decompose(&graph),
        wave(vec![
            seq(vec![exec("z", &[]), exec("z2", &["z"])]),
            exec("a", &[])
        ])
    );
}

#[test]
fn a_branch_declared_back_to_front_still_comes_in_declaration_order() {
    // `c` is declared before its predecessor `b`, so the branch `b >> c` is declared second,
    // by `c`, and comes before `a` although `a` is ready first.
    let graph = graph(&["x", "c", "a", "b"], &[("b", "c")]);
    assert_eq!(
        decompose(&graph),
        wave(vec![
            exec("x", &[]),
            seq(vec![exec("b", &[]), exec("c", &["b"])]),
            exec("a", &[])
        ])
    );
}

fn the_n() -> [(&'static str, &'static str); 3] {
    [("a", "c"), ("a", "d"), ("b", "d")]
}

#[test]
fn the_n_is_walked_in_a_valid_order() {
    let graph = graph(&["a", "b", "c", "d"], &the_n());
    assert_eq!(
        decompose(&graph),
        seq(vec![
            exec("a", &[]),
            exec("b", &[]),
            exec("c", &["a"]),
            exec("d", &["a", "b"]),
        ])
    );
}

#[test]
fn the_n_does_not_spoil_the_parallelism_beside_it() {
    let mut edges = the_n().to_vec();
    edges.push(("x", "y"));
    let graph = graph(&["a", "b", "c", "d", "x", "y"], &edges);
    assert_eq!(
        decompose(&graph),
        wave(vec![
            seq(vec![
                exec("a", &[]),
                exec("b", &[]),
                exec("c", &["a"]),
                exec("d", &["a", "b"]),
            ]),
            seq(vec![exec("x", &[]), exec("y", &["x"])]),
        ])
    );
}

#[test]
fn an_n_in_series_keeps_the_cuts_around_it() {
    let mut edges = the_n().to_vec();
    edges.extend([("p", "a"), ("p", "b"), ("c", "q"), ("d", "q")]);
    let graph = graph(&["p", "a", "b", "c", "d", "q"], &edges);
    assert_eq!(
        decompose(&graph),
        seq(vec![
            exec("p", &[]),
            exec("a", &["p"]),
            exec("b", &["p"]),
            exec("c", &["a"]),
            exec("d", &["a", "b"]),
            exec("q", &["c", "d"]),
        ])
    );
}

#[test]
fn the_waves_before_and_after_an_n_survive_it() {
    let mut edges = the_n().to_vec();
    for p in ["p1", "p2"] {
        edges.extend([(p, "a"), (p, "b")]);
    }
    for q in ["q1", "q2"] {
        edges.extend([("c", q), ("d", q)]);
    }
    let graph = graph(&["p1", "p2", "a", "b", "c", "d", "q1", "q2"], &edges);
    assert_eq!(
        decompose(&graph),
        seq(vec![
            wave(vec![exec("p1", &[]), exec("p2", &[])]),
            exec("a", &["p1", "p2"]),
            exec("b", &["p1", "p2"]),
            exec("c", &["a"]),
            exec("d", &["a", "b"]),
            wave(vec![exec("q1", &["c", "d"]), exec("q2", &["c", "d"])]),
        ])
    );
}

#[test]
fn an_edge_leaving_an_interior_node_is_not_a_series_cut() {
    // After {a, b}, the sink `b` reaches both sources `c` and `d` — but so does the interior
    // `a`, into `c`. Counting sink-to-source edges alone would cut there and launch `c` and `d`
    // as a wave; this graph is no series composition, so it is walked.
    let graph = graph(
        &["a", "b", "c", "d"],
        &[("a", "b"), ("b", "c"), ("b", "d"), ("a", "c")],
    );
    assert_eq!(
        decompose(&graph),
        seq(vec![
            exec("a", &[]),
            exec("b", &["a"]),
            exec("c", &["b", "a"]),
            exec("d", &["b"]),
        ])
    );
}

#[test]
fn compile_is_decompose_once_every_node_is_implemented() {
    let graph = graph(&["a", "b", "c"], &[("a", "b"), ("a", "c")]);
    let catalog = catalog_of(&graph, &(Arc::new(Trace) as Arc<dyn Node>));
    assert_eq!(compile(&graph, &catalog), Ok(decompose(&graph)));
}

#[test]
fn a_missing_implementation_names_the_first_missing_node_in_insertion_order() {
    // `y` comes first in topological order, `z` first in insertion order.
    let graph = graph(&["z", "y", "ok"], &[("y", "z")]);
    let mut catalog = Catalog::new();
    catalog.insert("ok", Arc::new(Trace));
    let error = compile(&graph, &catalog).unwrap_err();
    assert_eq!(
        error,
        CompileError::MissingImplementation { node: "z".into() }
    );
    assert!(error.to_string().contains("`z`"), "{error}");
}

#[test]
fn a_missing_implementation_is_found_past_a_prefix_registered_in_the_graph_order() {
    // The catalog matches the graph entry by entry up to `c`, then misses it.
    let graph = graph(&["a", "b", "c", "d"], &[("a", "b"), ("b", "c"), ("c", "d")]);
    let mut catalog = Catalog::new();
    for id in ["a", "b", "d"] {
        catalog.insert(id, Arc::new(Trace));
    }
    assert_eq!(
        compile(&graph, &catalog),
        Err(CompileError::MissingImplementation { node: "c".into() })
    );
}

#[test]
fn a_catalog_filled_in_another_order_than_its_graph_covers_it_all_the_same() {
    let graph = graph(&["a", "b", "c"], &[("a", "b"), ("a", "c")]);
    let mut catalog = Catalog::new();
    for id in ["c", "a", "b"] {
        catalog.insert(id, Arc::new(Trace));
    }
    assert_eq!(compile(&graph, &catalog), Ok(decompose(&graph)));
    // Ids equal by name, not shared with the graph's, count as well.
    let mut by_name = Catalog::new();
    for id in ["a", "b", "c"] {
        by_name.insert(String::from(id).as_str(), Arc::new(Trace));
    }
    assert_eq!(compile(&graph, &by_name), Ok(decompose(&graph)));
}

#[test]
fn a_plan_shows_its_tree_with_and_without_ids() {
    let plan = plan_of(n("a") >> (n("b") | n("c")));
    assert_eq!(
        plan.compact(),
        "Sequence([Execute(a), Wave([Execute(b), Execute(c)])])"
    );
    assert_eq!(
        plan.shape(),
        "Sequence([Execute, Wave([Execute, Execute])])"
    );
    assert_eq!(Plan::Empty.shape(), "Empty");
}

#[test]
fn a_plan_names_its_variant() {
    let kinds = [
        Plan::Empty.kind(),
        exec("a", &[]).kind(),
        seq(vec![]).kind(),
        wave(vec![]).kind(),
    ];
    assert_eq!(kinds, ["Empty", "Execute", "Sequence", "Wave"]);
}

#[test]
fn a_plans_steps_come_in_the_order_a_sequential_run_takes_them() {
    let plan = plan_of(n("a") >> ((n("b") >> n("b2")) | n("c")) >> n("d"));
    let steps: Vec<&str> = plan.steps().iter().map(|(node, _)| node.as_str()).collect();
    assert_eq!(steps, ["a", "b", "b2", "c", "d"]);
}

#[test]
fn a_plans_leaves_are_the_steps_nobody_reads() {
    let plan = plan_of(n("a") >> ((n("b") >> n("b2")) | n("c")));
    let leaves: Vec<&str> = plan.leaves().iter().map(|id| id.as_str()).collect();
    assert_eq!(leaves, ["b2", "c"]);
}
