//! Running a plan: what each node reads, what a run returns, and who is blamed when it fails.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use soma_core::{
    compile, node, Catalog, Executor, Graph, Node, NodeError, Plan, Program, ProgramError,
    RunError, Transition, Value, Watch,
};

use crate::support::{catalog_of, exec, fail, graph, logged, n, seq, trace, wave, Log, Trace};

fn run(graph: &Graph, input: Value) -> Result<Value, RunError> {
    let catalog = catalog_of(graph, &(Arc::new(Trace) as Arc<dyn Node>));
    let plan = compile(graph, &catalog).expect("every node is implemented");
    Executor::new().run(&plan, &catalog, input)
}

fn text(s: &str) -> Value {
    Value::text(s)
}

#[test]
fn a_chain_passes_each_output_to_the_next_node() {
    let graph = graph(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
    assert_eq!(run(&graph, text("x")).unwrap(), text("c(b(a(x)))"));
}

#[test]
fn a_single_leaf_is_returned_as_is_not_in_a_map() {
    let graph = graph(&["a"], &[]);
    assert_eq!(run(&graph, text("x")).unwrap(), text("a(x)"));
}

#[test]
fn a_fan_out_returns_a_map_of_its_leaves() {
    let graph = graph(&["a", "b", "c"], &[("a", "b"), ("a", "c")]);
    assert_eq!(
        run(&graph, text("x")).unwrap(),
        Value::map([("b", text("b(a(x))")), ("c", text("c(a(x))"))])
    );
}

#[test]
fn a_fan_in_node_reads_a_map_keyed_by_source_id_in_edge_declaration_order() {
    let seen = Arc::new(std::sync::Mutex::new(None));
    let record = Arc::clone(&seen);
    let join = move |input: &Value| -> Result<Value, NodeError> {
        *record.lock().unwrap() = Some(input.clone());
        Ok(Value::Null)
    };
    let graph = graph(&["a", "b", "c", "j"], &[("c", "j"), ("a", "j"), ("b", "j")]);
    let mut catalog = catalog_of(&graph, &(Arc::new(Trace) as Arc<dyn Node>));
    catalog.insert("j", Arc::new(join));
    let plan = compile(&graph, &catalog).unwrap();
    Executor::new().run(&plan, &catalog, text("x")).unwrap();
    assert_eq!(
        seen.lock().unwrap().clone(),
        Some(Value::map([
            ("c", text("c(x)")),
            ("a", text("a(x)")),
            ("b", text("b(x)"))
        ]))
    );
}

#[test]
fn a_diamond_runs_each_node_once_and_joins_both_sides() {
    let log = Log::new();
    let graph = graph(
        &["a", "b", "c", "d"],
        &[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")],
    );
    let catalog = catalog_of(&graph, &(Arc::new(logged(&log, trace)) as Arc<dyn Node>));
    let plan = compile(&graph, &catalog).unwrap();
    let out = Executor::new().run(&plan, &catalog, text("x"));
    assert_eq!(out.unwrap(), text("d(b(a(x)),c(a(x)))"));
    for id in ["a", "b", "c", "d"] {
        assert_eq!(log.starts(id), 1, "`{id}`");
    }
}

#[test]
fn several_leaves_give_a_map_keyed_by_leaf_id_in_step_order() {
    let graph = graph(
        &["r", "l2", "l1", "m"],
        &[("r", "m"), ("m", "l1"), ("r", "l2")],
    );
    let out = run(&graph, text("x")).unwrap();
    let keys: Vec<&str> = out.as_map().unwrap().iter().map(|(k, _)| &**k).collect();
    assert_eq!(keys, ["l2", "l1"]);
    assert_eq!(out.get("l1"), Some(&text("l1(m(r(x)))")));
    assert_eq!(out.get("l2"), Some(&text("l2(r(x))")));
}

#[test]
fn an_empty_graph_returns_its_input() {
    let input = Value::opaque("untouched");
    assert_eq!(run(&Graph::new(), input.clone()).unwrap(), input);
}

#[test]
fn every_root_gets_the_input() {
    let graph = graph(&["a", "b", "j"], &[("a", "j"), ("b", "j")]);
    assert_eq!(run(&graph, text("x")).unwrap(), text("j(a(x),b(x))"));
}

#[test]
fn a_node_failure_is_attributed_to_the_node() {
    let expr = n("a") >> node("b", |_: &Value| Err(NodeError::new("no good"))) >> n("c");
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let error = Executor::new()
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    let RunError::NodeFailed { node, error: cause } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(node, "b");
    assert_eq!(cause.message(), "no good");
    assert_eq!(error.node().map(soma_core::NodeId::as_str), Some("b"));
    assert!(error.to_string().contains("`b`"), "{error}");
}

#[test]
fn no_node_after_a_failure_runs() {
    let log = Log::new();
    let expr = node("a", logged(&log, trace))
        >> node("b", logged(&log, fail("no good")))
        >> node("c", logged(&log, trace));
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    assert!(Executor::new().run(&plan, &catalog, Value::Null).is_err());
    assert!(log.ran("a") && log.ran("b"));
    assert!(!log.ran("c"));
}

#[derive(Debug)]
struct Underneath;

impl fmt::Display for Underneath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the error underneath")
    }
}

impl std::error::Error for Underneath {}

#[test]
fn a_node_errors_cause_travels_untouched_to_the_caller() {
    let expr = node("a", |_: &Value| Err(NodeError::from_cause(Underneath)));
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let error = Executor::new()
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    let node_error = std::error::Error::source(&error).expect("the node's error");
    let cause = node_error.source().expect("its cause");
    assert!(cause.is::<Underneath>());
    assert!(error.to_string().contains("the error underneath"));
}

#[test]
fn a_plan_step_the_catalog_lacks_is_not_in_catalog() {
    let plan = exec("ghost", &[]);
    let error = Executor::new()
        .run(&plan, &Catalog::new(), Value::Null)
        .unwrap_err();
    assert!(
        matches!(&error, RunError::Invalid(ProgramError::NotInCatalog { node }) if node == "ghost")
    );
    assert!(error.to_string().contains("`ghost`"));
}

#[test]
fn each_step_runs_its_own_implementation_whatever_order_the_catalog_was_filled_in() {
    let plan = seq(vec![exec("a", &[]), exec("b", &["a"]), exec("c", &["b"])]);
    let mut catalog = Catalog::new();
    // Registered back to front, then `b` replaced: the lookup that tries the next entry first
    // must fall back to the index, and find the replacement.
    for (id, add) in [("c", 100), ("b", 0), ("a", 1)] {
        catalog.insert(
            id,
            Arc::new(move |x: &Value| Ok(Value::Int(x.as_int().unwrap_or(0) + add))),
        );
    }
    catalog.insert(
        "b",
        Arc::new(|x: &Value| Ok(Value::Int(x.as_int().unwrap_or(0) * 10))),
    );
    let out = Executor::new().run(&plan, &catalog, Value::Int(4)).unwrap();
    assert_eq!(out, Value::Int((4 + 1) * 10 + 100));
}

#[test]
fn a_step_reading_a_node_that_produced_nothing_is_missing_input() {
    let mut catalog = Catalog::new();
    catalog.insert("b", Arc::new(Trace));
    let plan = seq(vec![exec("b", &["a"])]);
    let error = Executor::new()
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    assert!(
        matches!(&error, RunError::Invalid(ProgramError::MissingInput { node, from }) if node == "b" && from == "a"),
        "{error:?}"
    );
    assert!(error.to_string().contains("`b`") && error.to_string().contains("`a`"));
}

#[test]
fn a_step_reading_a_sibling_branch_is_refused_before_anything_runs() {
    // `b` and `c` run at the same time: `c` cannot read what `b` produces.
    let log = Log::new();
    let mut catalog = Catalog::new();
    for id in ["a", "b", "c"] {
        catalog.insert(id, Arc::new(logged(&log, trace)));
    }
    let plan = seq(vec![
        exec("a", &[]),
        wave(vec![exec("b", &["a"]), exec("c", &["b"])]),
    ]);
    let error = Program::new(&plan, &catalog).err().expect("refused");
    assert_eq!(
        error,
        ProgramError::MissingInput {
            node: "c".into(),
            from: "b".into()
        }
    );
    let error = Executor::new()
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    assert!(matches!(error, RunError::Invalid(_)), "{error:?}");
    assert!(!log.ran("a"));
}

#[test]
fn a_step_may_read_what_ran_before_its_wave_and_before_it_in_its_branch() {
    let mut catalog = Catalog::new();
    for id in ["a", "b", "b2", "c", "d"] {
        catalog.insert(id, Arc::new(Trace));
    }
    let plan = seq(vec![
        exec("a", &[]),
        wave(vec![
            seq(vec![exec("b", &["a"]), exec("b2", &["b", "a"])]),
            exec("c", &["a"]),
        ]),
        exec("d", &["b2", "c"]),
    ]);
    Program::new(&plan, &catalog).expect("every input ran before the step reading it");
    // Each step got what it named, in the order it named it: `b2` what its branch ran before
    // it and what ran before the wave.
    assert_eq!(
        Executor::new().run(&plan, &catalog, text("x")).unwrap(),
        text("d(b2(b(a(x)),a(x)),c(a(x)))")
    );
}

#[test]
fn a_plan_running_a_node_twice_is_refused_before_anything_runs() {
    let log = Log::new();
    let mut catalog = Catalog::new();
    catalog.insert("a", Arc::new(logged(&log, trace)));
    let plan = seq(vec![exec("a", &[]), exec("a", &[])]);
    let error = Executor::new()
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    assert!(
        matches!(&error, RunError::Invalid(ProgramError::StepTwice { node }) if node == "a"),
        "{error:?}"
    );
    assert!(!log.ran("a"));
}

#[test]
fn an_empty_plan_returns_the_input_without_a_catalog_entry() {
    assert_eq!(
        Executor::new()
            .run(&Plan::Empty, &Catalog::new(), Value::Int(5))
            .unwrap(),
        Value::Int(5)
    );
}

struct Flag(AtomicBool);

impl Watch for Flag {
    fn interrupted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn an_interrupted_watch_stops_the_run_with_interrupted() {
    let log = Log::new();
    let (graph, catalog) = (node("a", logged(&log, trace)) >> node("b", logged(&log, trace)))
        .somatize()
        .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let watch = Flag(AtomicBool::new(true));
    let error = Executor::new()
        .with_watch(Arc::new(watch))
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    assert!(matches!(error, RunError::Interrupted), "{error:?}");
    assert_eq!(error.node(), None);
    assert!(!log.ran("a"), "the watch is asked before the first node");
}

#[test]
fn an_interruption_stops_the_run_at_the_next_node_boundary() {
    let log = Log::new();
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let raise = Arc::clone(&watch);
    let (graph, catalog) = (node("a", logged(&log, trace))
        >> node(
            "b",
            logged(&log, move |id, input| {
                raise.0.store(true, Ordering::SeqCst);
                trace(id, input)
            }),
        )
        >> node("c", logged(&log, trace)))
    .somatize()
    .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let result = Executor::new()
        .with_watch(watch.clone())
        .run(&plan, &catalog, Value::Null);
    assert!(matches!(result, Err(RunError::Interrupted)), "{result:?}");
    assert!(log.finished("b"), "a node in flight is not cut short");
    assert!(!log.ran("c"));
}

#[test]
fn a_watch_that_never_interrupts_changes_nothing() {
    let (graph, catalog) = (n("a") >> (n("b") | n("c")) >> n("d")).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let watch = Flag(AtomicBool::new(false));
    assert_eq!(
        Executor::new()
            .with_watch(Arc::new(watch))
            .run(&plan, &catalog, text("x"))
            .unwrap(),
        Executor::new().run(&plan, &catalog, text("x")).unwrap()
    );
}

#[test]
fn a_catalog_replaces_an_implementation_and_returns_the_old_one() {
    let mut catalog = Catalog::new();
    let first: Arc<dyn Node> = Arc::new(Trace);
    assert!(catalog.insert("a", Arc::clone(&first)).is_none());
    let replaced = catalog.insert("a", Arc::new(Trace)).expect("the first one");
    assert!(Arc::ptr_eq(&replaced, &first));
    assert_eq!(catalog.len(), 1);
}

#[test]
fn cloning_a_catalog_shares_its_nodes() {
    let mut catalog = Catalog::new();
    catalog.insert("a", Arc::new(Trace));
    let copy = catalog.clone();
    assert!(Arc::ptr_eq(
        catalog.get("a").unwrap(),
        copy.get("a").unwrap()
    ));
    assert!(copy.contains("a") && !copy.contains("b"));
    assert!(Catalog::new().is_empty());
}

/// A node that logs its calls and the prefetches asked of it.
struct Hinted {
    id: &'static str,
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Node for Hinted {
    fn forward(
        &self,
        input: &Value,
        _ctx: &soma_core::Ctx<'_>,
    ) -> Result<soma_core::Transition, NodeError> {
        self.log.lock().unwrap().push(format!("run {}", self.id));
        Ok(soma_core::Transition::Done(input.clone()))
    }

    fn prefetch(&self) {
        self.log
            .lock()
            .unwrap()
            .push(format!("prefetch {}", self.id));
    }
}

#[test]
fn a_first_run_asks_each_next_node_to_prefetch_before_it_runs_the_current_one_and_a_later_run_of_a_small_program_does_not(
) {
    let graph = graph(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
    let log = Arc::default();
    let mut catalog = Catalog::new();
    for id in ["a", "b", "c"] {
        let hinted = Hinted {
            id,
            log: Arc::clone(&log),
        };
        catalog.insert(id, Arc::new(hinted) as Arc<dyn Node>);
    }
    let plan = compile(&graph, &catalog).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    Executor::new().run_program(&program, Value::Null).unwrap();
    assert_eq!(
        std::mem::take(&mut *log.lock().unwrap()),
        ["prefetch b", "run a", "prefetch c", "run b", "run c"]
    );
    // Its memory is in the caches now: prefetching would cost and save nothing.
    Executor::new().run_program(&program, Value::Null).unwrap();
    assert_eq!(*log.lock().unwrap(), ["run a", "run b", "run c"]);
}

/// A node that takes what `forward_taking` lets it take: the input left in another's place.
struct Taker;

impl Node for Taker {
    fn forward(&self, input: &Value, _ctx: &soma_core::Ctx<'_>) -> Result<Transition, NodeError> {
        Ok(Transition::Done(input.clone()))
    }

    fn forward_taking(
        &self,
        input: &mut Value,
        _ctx: &soma_core::Ctx<'_>,
    ) -> Result<Transition, NodeError> {
        let taken = std::mem::replace(input, text("taken by a reader"));
        Ok(Transition::Done(taken))
    }
}

#[test]
fn what_one_reader_takes_from_its_input_no_other_reader_of_that_value_sees() {
    let graph = graph(&["a", "b", "c"], &[("a", "b"), ("a", "c")]);
    let catalog = catalog_of(&graph, &(Arc::new(Taker) as Arc<dyn Node>));
    // Both readers one after the other in a row (the first reads a copy, the second takes the
    // value from the table), and in a wave.
    let plans = [
        crate::support::flat_plan(&graph),
        compile(&graph, &catalog).expect("every node is implemented"),
    ];
    for plan in plans {
        let out = Executor::new().run(&plan, &catalog, text("x")).unwrap();
        assert_eq!(
            out,
            Value::map([("b", text("x")), ("c", text("x"))]),
            "{plan:?}"
        );
    }
}
