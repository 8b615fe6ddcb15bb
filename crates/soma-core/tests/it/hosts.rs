//! Hosts: names read and refused where written, and the distribution step that cuts a compiled
//! plan into remote slices — the same steps in the same order, each largest subtree on one host
//! one slice, consecutive same-host steps of a sequence one trip, and a plan without hosts left
//! exactly as it was; and the route a call takes by what it asks and the hosts a graph holds.

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use soma_core::{
    compile, decompose, distribute, HostError, HostName, HostPlacement, NodeId, Plan, Program,
    ProgramError, Route, RouteError,
};

use crate::random_graphs::random_dag;
use crate::support::{catalog_of, exec, graph, seq, wave};

fn host(name: &str) -> HostName {
    name.parse().expect("a valid host name")
}

fn placed(pairs: &[(&str, &str)]) -> HostPlacement {
    let mut hosts = HostPlacement::new();
    for &(node, name) in pairs {
        hosts.place(node, host(name));
    }
    hosts
}

fn remote(name: &str, inner: Plan) -> Plan {
    Plan::Remote {
        host: host(name),
        inner: Box::new(inner),
    }
}

#[test]
fn a_host_name_is_letters_digits_dashes_underscores_and_dots() {
    for good in ["gpu-box", "node_2", "a", "10.0.0.7", &"h".repeat(63)] {
        assert_eq!(
            good.parse::<HostName>().map(|h| h.to_string()),
            Ok(good.to_owned())
        );
    }
}

#[test]
fn a_host_name_that_a_transport_could_not_carry_is_refused_where_it_is_written() {
    for bad in [
        "",
        "gpu box",
        "-lead",
        ".hidden",
        "gpu:0",
        "ü",
        "a/b",
        &"h".repeat(64),
    ] {
        let error = bad.parse::<HostName>().expect_err(bad);
        assert_eq!(
            error,
            HostError::Invalid {
                text: bad.to_owned()
            }
        );
        assert!(
            error.to_string().contains("is not a host name\nhint:"),
            "{error}"
        );
    }
}

#[test]
fn a_plan_without_hosts_is_distributed_into_itself() {
    let plan = seq(vec![
        exec("a", &[]),
        wave(vec![exec("b", &["a"]), exec("c", &["a"])]),
    ]);
    assert_eq!(distribute(&plan, &HostPlacement::new()), plan);
    assert_eq!(distribute(&plan, &placed(&[("elsewhere", "h")])), plan);
}

#[test]
fn consecutive_steps_of_a_sequence_on_one_host_are_one_trip() {
    let plan = seq(vec![
        exec("a", &[]),
        exec("b", &["a"]),
        exec("c", &["b"]),
        exec("d", &["c"]),
    ]);
    let hosts = placed(&[("b", "gpu"), ("c", "gpu")]);
    let expected = seq(vec![
        exec("a", &[]),
        remote("gpu", seq(vec![exec("b", &["a"]), exec("c", &["b"])])),
        exec("d", &["c"]),
    ]);
    assert_eq!(distribute(&plan, &hosts), expected);
}

#[test]
fn a_whole_plan_on_one_host_is_one_slice() {
    let plan = seq(vec![
        exec("a", &[]),
        wave(vec![exec("b", &["a"]), exec("c", &["a"])]),
    ]);
    let hosts = placed(&[("a", "gpu"), ("b", "gpu"), ("c", "gpu")]);
    assert_eq!(distribute(&plan, &hosts), remote("gpu", plan.clone()));
}

#[test]
fn branches_of_a_wave_on_two_hosts_are_two_slices_side_by_side() {
    let plan = seq(vec![
        exec("a", &[]),
        wave(vec![
            seq(vec![exec("b", &["a"]), exec("b2", &["b"])]),
            exec("c", &["a"]),
        ]),
        exec("d", &["b2", "c"]),
    ]);
    let hosts = placed(&[("b", "one"), ("b2", "one"), ("c", "two")]);
    assert_eq!(
        distribute(&plan, &hosts).compact(),
        "Sequence([Execute(a), Wave([Remote@one(Sequence([Execute(b), Execute(b2)])), \
         Remote@two(Execute(c))]), Execute(d)])"
    );
}

#[test]
fn steps_on_different_hosts_in_a_row_are_different_trips() {
    let plan = seq(vec![exec("a", &[]), exec("b", &["a"]), exec("c", &["b"])]);
    let hosts = placed(&[("a", "one"), ("b", "two"), ("c", "one")]);
    assert_eq!(
        distribute(&plan, &hosts).compact(),
        "Sequence([Remote@one(Execute(a)), Remote@two(Execute(b)), Remote@one(Execute(c))])"
    );
}

#[test]
fn a_program_refuses_a_plan_with_a_slice_naming_its_host() {
    let g = graph(&["a", "b"], &[("a", "b")]);
    let implementation: std::sync::Arc<dyn soma_core::Node> =
        std::sync::Arc::new(crate::support::plain(|_: &str, x: &soma_core::Value| {
            Ok(x.clone())
        }));
    let catalog = catalog_of(&g, &implementation);
    let plan = compile(&g, &catalog).unwrap();
    let distributed = distribute(&plan, &placed(&[("b", "gpu")]));
    let Err(error) = Program::new(&distributed, &catalog) else {
        panic!("a program resolved a plan with a remote slice");
    };
    assert_eq!(
        error,
        ProgramError::RemoteSlice {
            node: "b".into(),
            host: host("gpu")
        }
    );
    assert!(
        error
            .to_string()
            .contains("node `b` is in a slice for host `gpu`"),
        "{error}"
    );
}

#[test]
fn every_drawing_shows_a_frame_per_slice_with_its_host() {
    let plan = seq(vec![
        exec("a", &[]),
        wave(vec![exec("b", &["a"]), exec("c", &["a"])]),
    ]);
    let distributed = distribute(&plan, &placed(&[("b", "one"), ("c", "two")]));
    assert_eq!(
        distributed.to_string(),
        "Sequence\n├── a <- (input)\n└── Wave\n    ├── Remote on one\n    │   └── b <- a\n    └── Remote on two\n        └── c <- a"
    );
    let mermaid = distributed.to_mermaid();
    assert!(
        mermaid.contains("subgraph soma_host_0 [\"host one\"]"),
        "{mermaid}"
    );
    assert!(
        mermaid.contains("subgraph soma_host_1 [\"host two\"]"),
        "{mermaid}"
    );
    let dot = distributed.to_dot();
    assert!(dot.contains("subgraph cluster_host_0 {"), "{dot}");
    assert!(dot.contains("label=\"host two\""), "{dot}");
    let svg = distributed.to_svg();
    assert_eq!(svg.matches("<g class=\"host\">").count(), 2, "{svg}");
    assert!(
        svg.contains(">host one</text>") && svg.contains(">host two</text>"),
        "{svg}"
    );
    // The plan compiled for the graph draws no host at all.
    assert!(!plan.to_svg().contains("class=\"host\""));
}

/// Each slice of `plan`: its host and its steps; and whether any slice holds another.
fn slices(plan: &Plan) -> (Vec<(HostName, Vec<String>)>, bool) {
    let mut out = Vec::new();
    let mut nested = false;
    let mut stack = vec![(plan, false)];
    while let Some((plan, inside)) = stack.pop() {
        if let Plan::Remote { host, inner } = plan {
            nested |= inside;
            let steps = inner
                .steps()
                .iter()
                .map(|(node, _)| node.to_string())
                .collect();
            out.push((host.clone(), steps));
        }
        let inside = inside || plan.host().is_some();
        stack.extend(plan.children().iter().map(|child| (child, inside)));
    }
    (out, nested)
}

/// Whether a `Sequence` or `Wave` that is not inside a slice has every step on one host (then
/// it should have been the slice), or a sequence has two same-host slices in a row (then they
/// should have been one trip).
fn a_slice_could_be_larger(plan: &Plan, hosts: &HostPlacement) -> Option<String> {
    let mut stack = vec![plan];
    while let Some(plan) = stack.pop() {
        if plan.host().is_some() {
            continue;
        }
        let steps = plan.steps();
        let mut on = steps.iter().map(|(node, _)| hosts.host(node.as_str()));
        if let Some(Some(first)) = on.next() {
            if on.all(|h| h == Some(first)) {
                return Some(format!("{} is all on `{first}`", plan.compact()));
            }
        }
        if let Plan::Sequence(children) = plan {
            for pair in children.windows(2) {
                if let (Some(a), Some(b)) = (pair[0].host(), pair[1].host()) {
                    if a == b {
                        return Some(format!("two trips to `{a}` in a row in {}", plan.compact()));
                    }
                }
            }
        }
        stack.extend(plan.children());
    }
    None
}

fn config() -> Config {
    Config {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x48_4F_53),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn distribution_keeps_every_step_in_its_order_and_only_wraps(
        dag in random_dag(),
        choices in proptest::collection::vec(0_usize..4, 12),
    ) {
        let graph = dag.graph();
        let plan = decompose(&graph);
        let names = ["one", "two", "three"];
        let mut hosts = HostPlacement::new();
        for (i, node) in graph.nodes().iter().enumerate() {
            if let Some(name) = names.get(choices[i]) {
                hosts.place(node.clone(), host(name));
            }
        }
        let distributed = distribute(&plan, &hosts);
        prop_assert_eq!(distributed.steps(), plan.steps());
        prop_assert_eq!(distribute(&distributed, &hosts), distributed.clone());

        let (slices, nested) = slices(&distributed);
        prop_assert!(!nested, "a slice inside a slice: {}", distributed.compact());
        let mut slice_of: HashMap<String, HostName> = HashMap::new();
        for (slice_host, steps) in slices {
            for step in steps {
                prop_assert_eq!(hosts.host(&step), Some(&slice_host), "`{}` in {}", step, distributed.compact());
                slice_of.insert(step, slice_host.clone());
            }
        }
        for node in graph.nodes() {
            prop_assert_eq!(slice_of.get(node.as_str()), hosts.host(node.as_str()), "`{}`", node);
        }
        prop_assert_eq!(a_slice_could_be_larger(&distributed, &hosts), None);
    }

    #[test]
    fn a_random_plan_without_hosts_is_distributed_into_itself(dag in random_dag()) {
        let plan = decompose(&dag.graph());
        prop_assert_eq!(distribute(&plan, &HostPlacement::new()), plan);
    }
}

#[test]
fn one_run_takes_the_engine_without_hosts_and_the_hosts_with_one_async_or_not() {
    for is_async in [false, true] {
        assert_eq!(Route::of(false, None, || is_async), Ok(Route::Engine));
        let on_a_host = Some((NodeId::from("b"), host("one")));
        assert_eq!(Route::of(false, on_a_host, || is_async), Ok(Route::Hosts));
    }
}

#[test]
fn a_stream_takes_the_engines_stream_or_for_an_async_graph_its_flow() {
    assert_eq!(Route::of(true, None, || false), Ok(Route::Stream));
    assert_eq!(Route::of(true, None, || true), Ok(Route::Flow));
}

#[test]
fn a_stream_of_a_graph_with_a_host_is_refused_naming_the_node_and_its_host() {
    let on_a_host = Some((NodeId::from("b"), host("one")));
    let refused = Route::of(true, on_a_host, || {
        panic!("a refused stream asks nothing more")
    });
    assert_eq!(
        refused,
        Err(RouteError::StreamOnHosts {
            node: NodeId::from("b"),
            host: host("one"),
        })
    );
}

#[test]
fn only_a_stream_without_hosts_asks_whether_the_graph_is_async() {
    let asked = std::cell::Cell::new(0);
    let ask = || {
        asked.set(asked.get() + 1);
        true
    };
    let on_a_host = || Some((NodeId::from("b"), host("one")));
    let _ = Route::of(false, None, ask);
    let _ = Route::of(false, on_a_host(), ask);
    let _ = Route::of(true, on_a_host(), ask);
    assert_eq!(asked.get(), 0);
    let _ = Route::of(true, None, ask);
    assert_eq!(asked.get(), 1);
}
