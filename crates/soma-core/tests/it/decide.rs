//! Steps that decide as they run, built with the Rust builder: `each` (a `Map`), `switch` and
//! `repeat` (a `Loop`) — their plans, what they compute, what runs at once, which error wins.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use soma_core::{
    compile_decided, distribute, each, node, repeat, switch, Catalog, Decision, Decisions,
    Executor, Expr, Graph, GraphError, HostPlacement, Node, NodeError, NodeId, Placement, Policies,
    Program, Retry, RunError, Setting, SettingError, Value,
};

use crate::support::{meet, on_a_small_stack, plain, Rendezvous};

fn add(k: i64) -> impl Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync + 'static {
    move |_, x| {
        x.as_int()
            .map(|x| Value::Int(x + k))
            .ok_or_else(|| NodeError::new("not an int"))
    }
}

fn ints(values: &[i64]) -> Value {
    Value::list(values.iter().map(|&x| Value::Int(x)))
}

/// Compiles and runs `expr` on `input`.
fn run(expr: Expr, input: Value) -> Result<Value, RunError> {
    let (graph, catalog, decisions) = expr.somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    Executor::new().run(&plan, &catalog, input)
}

#[test]
fn a_map_runs_its_body_on_every_item_and_keeps_their_order() {
    let body = node("a", plain(add(1))) >> node("b", plain(add(10)));
    let out = run(each("m", body, None).unwrap(), ints(&[1, 2, 3])).unwrap();
    assert_eq!(out, ints(&[12, 13, 14]));
}

#[test]
fn a_map_is_a_plan_step_holding_its_body_with_namespaced_ids() {
    let body = node("a", plain(add(1))) >> node("b", plain(add(10)));
    let expr = node("split", plain(add(0))) >> each("m", body, Some(4)).unwrap();
    let (graph, catalog, decisions) = expr.somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    assert_eq!(
        plan.compact(),
        "Sequence([Execute(split), Map(m, [Sequence([Execute(m/a), Execute(m/b)])])])"
    );
    assert_eq!(plan.children()[1].kind(), "Map");
}

#[test]
fn a_node_named_as_a_node_inside_a_step_is_refused_whichever_is_written_first() {
    let step = || each("m", node("a", plain(add(1))), None).unwrap();
    let after = step() >> node("m/a", plain(add(100)));
    let before = node("m/a", plain(add(100))) >> step();
    for expr in [after, before] {
        match expr.somatize_decided() {
            Err(GraphError::SeparatorInId { id }) => assert_eq!(id.as_str(), "m/a"),
            other => panic!(
                "expected `m/a` refused for its `/`, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}

#[test]
fn a_step_whose_id_holds_the_separator_is_refused_naming_it() {
    let expr = node("split", plain(add(0))) >> each("m/x", node("a", plain(add(1))), None).unwrap();
    assert_eq!(
        expr.somatize_decided().err(),
        Some(GraphError::SeparatorInId { id: "m/x".into() })
    );
}

#[test]
fn a_switch_key_holding_the_separator_is_refused_naming_the_step_and_the_key() {
    let selector = plain(|_: &str, _: &Value| Ok(Value::text("a/b")));
    let refused = switch(
        "route",
        selector,
        vec![("a/b".to_owned(), node("x", plain(add(1))))],
    );
    assert_eq!(
        refused.err(),
        Some(GraphError::SeparatorInKey {
            step: "route".into(),
            key: "a/b".to_owned()
        })
    );
}

#[test]
fn decisions_embedded_under_a_prefix_have_their_ids_and_graphs_under_it() {
    let expr = each("m", node("a", plain(add(1))), None).unwrap();
    let (_, _, inner) = expr.somatize_decided().unwrap();
    let mut decisions = Decisions::new();
    decisions.embed("outer", &inner).unwrap();
    assert!(decisions.get("m").is_none());
    let Some(Decision::Map { body, .. }) = decisions.get("outer/m") else {
        panic!("`outer/m` is no `each` step");
    };
    assert_eq!(body.nodes(), [NodeId::from("outer/m/a")]);
}

#[test]
fn a_catalog_embedded_under_a_prefix_refuses_a_taken_id_and_changes_nothing() {
    let implementation: Arc<dyn Node> = Arc::new(plain(add(1)));
    let mut inner = Catalog::new();
    inner.insert("a", Arc::clone(&implementation));
    inner.insert("b", Arc::clone(&implementation));
    let mut catalog = Catalog::new();
    catalog.insert("m/b", Arc::clone(&implementation));
    assert_eq!(
        catalog.embed("m", &inner).err(),
        Some(GraphError::DuplicateNode { id: "m/b".into() })
    );
    assert_eq!(catalog.len(), 1);
    catalog.embed("n", &inner).unwrap();
    assert!(catalog.contains("n/a") && catalog.contains("n/b"));
}

#[test]
fn a_placement_embedded_under_a_prefix_places_the_nodes_under_it() {
    let mut inner = Placement::new();
    inner.place("a", "cuda:1".parse().unwrap());
    let mut placement = Placement::new();
    placement.embed("m", &inner);
    assert_eq!(placement.device("m/a"), Some("cuda:1".parse().unwrap()));
    assert_eq!(placement.device("a"), None);
}

#[test]
fn the_items_of_a_map_are_in_flight_together() {
    let rendezvous = Rendezvous::new(3);
    let body = node("meet", plain(meet(&rendezvous)));
    let out = run(each("m", body, None).unwrap(), ints(&[1, 2, 3])).unwrap();
    assert_eq!(out.as_list().map(<[Value]>::len), Some(3));
}

#[test]
fn the_first_failing_item_by_index_is_the_error_of_a_map() {
    let body = node(
        "f",
        plain(|_: &str, x: &Value| match x.as_int() {
            Some(1) => Err(NodeError::new("item one")),
            Some(3) => Err(NodeError::new("item three")),
            _ => Ok(x.clone()),
        }),
    );
    let error = run(each("m", body, None).unwrap(), ints(&[0, 1, 2, 3])).unwrap_err();
    assert!(error.to_string().contains("item one"), "{error}");
    assert_eq!(error.node().map(soma_core::NodeId::as_str), Some("m/f"));
}

#[test]
fn a_map_of_ten_thousand_trivial_items_lends_far_fewer_threads_than_items() {
    let body = node("a", plain(add(1))) >> node("b", plain(add(1))) >> node("c", plain(add(1)));
    let (graph, catalog, decisions) = each("m", body, None).unwrap().somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    let items: Vec<i64> = (0..10_000).collect();
    let out = Executor::new().run_program(&program, ints(&items)).unwrap();
    assert_eq!(out.as_list().unwrap()[9_999], Value::Int(10_002));
    // Lent as items are in flight, not one per item; how few depends on the machine's load
    // (the benchmark counts them), so the bound here is only far below the items'.
    assert!(program.threads() <= 64, "{} threads", program.threads());
}

#[test]
fn a_switch_runs_only_the_case_its_selector_names() {
    let called = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&called);
    let other = plain(move |_: &str, x: &Value| {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok(x.clone())
    });
    let selector = plain(|_: &str, x: &Value| {
        Ok(Value::text(if x.as_int() > Some(0) {
            "up"
        } else {
            "down"
        }))
    });
    let expr = switch(
        "s",
        selector,
        vec![
            ("up".to_owned(), node("n", plain(add(100)))),
            ("down".to_owned(), node("n", other)),
        ],
    )
    .unwrap();
    assert_eq!(run(expr, Value::Int(5)).unwrap(), Value::Int(105));
    assert_eq!(called.load(Ordering::SeqCst), 0);
}

#[test]
fn an_unknown_case_names_its_key_and_the_known_ones() {
    let selector = plain(|_: &str, _: &Value| Ok(Value::text("pdf")));
    let cases = vec![
        ("ocr".to_owned(), node("a", plain(add(0)))),
        ("text".to_owned(), node("b", plain(add(0)))),
    ];
    let error = run(switch("route", selector, cases).unwrap(), Value::Int(0)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "`switch` step `route` has no case for key `pdf`; its cases: `ocr`, `text`\nhint: make the selector return one of these keys, or add a case for it"
    );
}

#[test]
fn a_retry_reaches_a_node_inside_a_map_by_its_namespaced_id() {
    let failed = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&failed);
    let flaky = plain(move |_: &str, x: &Value| {
        if count.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(NodeError::new("dropped"));
        }
        Ok(x.clone())
    });
    let expr = each("m", node("flaky", flaky), None).unwrap();
    let inner: Vec<String> = expr.inner_ids().map(ToString::to_string).collect();
    assert_eq!(inner, ["m/flaky"]);
    let (graph, catalog, decisions) = expr.somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    let mut policies = Policies::default();
    policies.set_retry("m/flaky", Some(Retry::new(1, Duration::ZERO)));
    let program = Program::resolved(&plan, &catalog, &Placement::new(), &policies).unwrap();
    let out = Executor::new().run_program(&program, ints(&[7])).unwrap();
    assert_eq!(out, ints(&[7]));
    assert_eq!(failed.load(Ordering::SeqCst), 2);
}

#[test]
fn a_loop_runs_its_body_until_its_predicate_says_done() {
    let done = plain(|_: &str, x: &Value| Ok(Value::Bool(x.as_int() >= Some(10))));
    let expr = repeat("l", node("step", plain(add(3))), done, 100).unwrap();
    assert_eq!(run(expr, Value::Int(0)).unwrap(), Value::Int(12));
}

#[test]
fn a_loop_past_its_bound_names_it_and_the_last_output_type() {
    let never = plain(|_: &str, _: &Value| Ok(Value::Bool(false)));
    let expr = repeat("l", node("step", plain(add(1))), never, 3).unwrap();
    let error = run(expr, Value::Int(0)).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("`loop` step `l` ran its body 3 times and `until` still said not done; the last output was a `Int`"),
        "{error}"
    );
}

/// How deep the deep nestings below go: far past what one stack would take of them.
const DEEP: usize = 1_000;

/// `depth` steps nested one inside another around a node adding 1: `each` inside `each` when
/// `mixed` is false; else `each`, `switch` and `loop` in turn (a switch whose other case adds
/// nothing, a loop done after one iteration). Returns its graph, catalog and decisions, an
/// input, and what it computes from it.
///
/// Made as `each`, `switch` and `repeat` would make it, outermost first: gluing expressions
/// renames every id inside once per level around it, which a thousand levels make slow.
fn nested_steps(depth: usize, mixed: bool) -> (Graph, Catalog, Decisions, Value, Value) {
    // A graph of one node, `id`: a node inside a step is embedded under the step's path.
    let one = |id: &str| {
        let mut graph = Graph::new();
        match id.rsplit_once(NodeId::SEPARATOR) {
            Some((prefix, name)) => {
                let mut leaf = Graph::new();
                leaf.add_node(name).unwrap();
                graph.embed(prefix, &leaf).unwrap();
            }
            None => {
                graph.add_node(id).unwrap();
            }
        }
        graph
    };
    let (mut catalog, mut decisions) = (Catalog::new(), Decisions::new());
    let (mut input, mut output) = (Value::Int(1), Value::Int(2));
    let mut step = String::from(if mixed {
        ["m", "s", "l"][(depth - 1) % 3]
    } else {
        "m"
    });
    let graph = one(&step);
    for level in (0..depth).rev() {
        let kind = if mixed { level % 3 } else { 0 };
        let inner = match kind {
            1 => format!("{step}/on/"),
            _ => format!("{step}/"),
        };
        let inner = if level == 0 {
            format!("{inner}leaf")
        } else {
            let next = if mixed { (level - 1) % 3 } else { 0 };
            format!("{inner}{}", ["m", "s", "l"][next])
        };
        match kind {
            1 => {
                let selector = plain(|_: &str, _: &Value| Ok(Value::text("on")));
                catalog.insert(step.clone(), Arc::new(selector));
                let same = format!("{step}/off/same");
                catalog.insert(same.clone(), Arc::new(plain(add(0))));
                let cases = vec![
                    ("on".to_owned(), one(&inner)),
                    ("off".to_owned(), one(&same)),
                ];
                decisions.insert(step.clone(), Decision::Switch { cases });
            }
            2 => {
                let done = plain(|_: &str, _: &Value| Ok(Value::Bool(true)));
                catalog.insert(step.clone(), Arc::new(done));
                let body = one(&inner);
                let max_iterations = 2;
                decisions.insert(
                    step.clone(),
                    Decision::Loop {
                        body,
                        max_iterations,
                    },
                );
            }
            _ => {
                catalog.insert(step.clone(), Arc::new(plain(add(0))));
                input = Value::list([input]);
                output = Value::list([output]);
                let body = one(&inner);
                decisions.insert(
                    step.clone(),
                    Decision::Map {
                        body,
                        in_flight: None,
                    },
                );
            }
        }
        step = inner;
    }
    catalog.insert(step, Arc::new(plain(add(1))));
    (graph, catalog, decisions, input, output)
}

#[test]
fn steps_nested_a_thousand_deep_compile_draw_and_run_on_a_small_stack() {
    for mixed in [false, true] {
        let (got, expected) = on_a_small_stack(move || {
            let (graph, catalog, decisions, input, expected) = nested_steps(DEEP, mixed);
            let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
            // Every step, the deepest too, in every drawing.
            assert_eq!(plan.all_steps().len(), catalog.len());
            let deepest = plan.all_steps().into_iter().map(|(node, _)| node.as_str());
            let deepest = deepest.max_by_key(|node| node.len()).unwrap();
            assert!(deepest.ends_with("/leaf"), "{deepest}");
            for drawing in [
                plan.to_string(),
                plan.to_mermaid(),
                plan.to_dot(),
                plan.to_svg(),
            ] {
                assert!(drawing.contains(deepest));
            }
            let copy = plan.clone();
            assert!(copy == plan);
            let _ = format!("{copy:?}{copy:#?}");
            assert!(distribute(&plan, &HostPlacement::new()) == plan);
            let program = Program::new(&plan, &catalog).unwrap();
            let got = Executor::new().run_program(&program, input);
            drop((program, copy, plan, graph, catalog, decisions));
            (got, expected)
        });
        assert_eq!(got.unwrap(), expected, "mixed: {mixed}");
    }
}

#[test]
fn every_drawing_of_a_plan_frames_a_decision_around_what_it_runs() {
    let selector = plain(|_: &str, _: &Value| Ok(Value::text("a")));
    let route = switch(
        "route",
        selector,
        vec![
            ("a".to_owned(), node("x", plain(add(1)))),
            ("b".to_owned(), node("y", plain(add(2)))),
        ],
    )
    .unwrap();
    let (graph, catalog, decisions) = each("chunks", route, None)
        .unwrap()
        .somatize_decided()
        .unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    assert_eq!(
        plan.to_string(),
        "Map chunks <- (input), each item:\n└── Switch chunks/route <- (input), the case it names:\n    ├── case a: chunks/route/a/x <- (input)\n    └── case b: chunks/route/b/y <- (input)"
    );
    for drawing in [plan.to_mermaid(), plan.to_dot(), plan.to_svg()] {
        for label in [
            "each chunks",
            "switch chunks/route (a | b)",
            "chunks/route/b/y",
        ] {
            assert!(drawing.contains(label), "{label} not in {drawing}");
        }
    }
}

#[test]
fn with_a_cache_a_map_rerun_calls_its_body_only_for_the_items_it_has_not_seen() {
    use soma_core::{Key, MemoryCache};
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let body = node(
        "a",
        plain(move |_: &str, x: &Value| {
            counted.fetch_add(1, Ordering::Relaxed);
            add(1)("a", x)
        }),
    );
    let (graph, catalog, decisions) = each("m", body, None).unwrap().somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    let cache = Arc::new(MemoryCache::new(|_| Some(Key::of_bytes(b"unchanged"))));
    let executor = Executor::new().with_cache(cache.clone());
    assert_eq!(
        executor.run_program(&program, ints(&[1, 2, 3])).unwrap(),
        ints(&[2, 3, 4])
    );
    assert_eq!(calls.swap(0, Ordering::Relaxed), 3);
    assert_eq!(
        executor.run_program(&program, ints(&[1, 20, 3])).unwrap(),
        ints(&[2, 21, 4])
    );
    assert_eq!(calls.swap(0, Ordering::Relaxed), 1);
    assert_eq!((cache.hits(), cache.misses()), (2, 4));
}

/// The decisions of `each(items: [switch(pick: ...)])`, as the builder makes them.
fn nested_decisions() -> Decisions {
    let selector = plain(|_: &str, _: &Value| Ok(Value::from("d")));
    let cases = vec![("d".to_owned(), node("inc", plain(add(1))))];
    let pick = switch("pick", selector, cases).unwrap();
    let (_, _, decisions) = each("items", pick, None)
        .unwrap()
        .somatize_decided()
        .expect("a valid graph");
    decisions
}

#[test]
fn an_each_steps_id_refuses_a_device_a_retry_and_a_time_limit_and_a_switchs_takes_them() {
    let decisions = nested_decisions();
    for setting in [Setting::Device, Setting::Retry, Setting::TimeLimit] {
        assert_eq!(
            decisions.refusal("items", setting),
            Some(SettingError::NothingToCall {
                step: "items".to_owned(),
                setting
            })
        );
        assert_eq!(decisions.refusal("items/pick", setting), None);
        assert_eq!(decisions.refusal("items/pick/d/inc", setting), None);
    }
}

#[test]
fn a_step_takes_a_concurrency_and_every_node_inside_one_refuses_it_naming_the_innermost_step() {
    let decisions = nested_decisions();
    assert_eq!(decisions.refusal("items", Setting::Concurrency), None);
    assert_eq!(
        decisions.refusal("items/pick", Setting::Concurrency),
        Some(SettingError::NotAStage {
            node: "items/pick".to_owned(),
            step: "items".to_owned(),
            kind: "each",
        })
    );
    assert_eq!(
        decisions.refusal("items/pick/d/inc", Setting::Concurrency),
        Some(SettingError::NotAStage {
            node: "items/pick/d/inc".to_owned(),
            step: "items/pick".to_owned(),
            kind: "switch",
        })
    );
    assert_eq!(decisions.refusal("elsewhere", Setting::Concurrency), None);
    assert_eq!(
        decisions.refusal("items-and-more", Setting::Concurrency),
        None
    );
}

#[test]
fn a_step_and_every_node_inside_one_refuse_a_host_naming_the_innermost_steps_kind() {
    let decisions = nested_decisions();
    let runs_here = |node: &str, kind, own| SettingError::RunsHere {
        node: node.to_owned(),
        kind,
        own,
    };
    assert_eq!(
        decisions.refusal("items", Setting::Host),
        Some(runs_here("items", "each", true))
    );
    assert_eq!(
        decisions.refusal("items/pick", Setting::Host),
        Some(runs_here("items/pick", "switch", true))
    );
    assert_eq!(
        decisions.refusal("items/pick/d/inc", Setting::Host),
        Some(runs_here("items/pick/d/inc", "switch", false))
    );
    assert_eq!(decisions.refusal("elsewhere", Setting::Host), None);
    assert_eq!(decisions.refusal("items-and-more", Setting::Host), None);
}
