//! Every error message, word for word: one inline snapshot per variant, each error produced the
//! way a user meets it wherever the API allows.
//!
//! The convention they follow: the node (or the edge, or the path) between backticks, and a
//! `hint:` line saying what to do. A variant that wraps another error's message
//! ([`RunError::NodeFailed`], [`RunError::DriverFailed`]) shows it as it is.
//!
//! To change a message, change it in `src/`, run `cargo test`, and copy the new text in; with
//! `cargo insta` installed, `cargo insta test --accept` rewrites the snapshots in place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use soma_core::{
    compile, distribute, node, switch, Catalog, Ctx, Driver, DriverError, Executor, Graph,
    GraphError, HostName, HostPlacement, Node, NodeError, Plan, RunError, Transition, Value, Watch,
};

use crate::support::{exec, graph, n, plain, seq};

fn refused(result: Result<impl std::fmt::Debug, GraphError>) -> String {
    result.unwrap_err().to_string()
}

// --- GraphError ------------------------------------------------------------------------------

#[test]
fn invalid_id() {
    let mut g = Graph::new();
    insta::assert_snapshot!(refused(g.add_node("two words")), @r"
    invalid node id `two words`
    hint: an id is a non-empty name without spaces or control characters
    ");
}

#[test]
fn separator_in_id() {
    let mut g = Graph::new();
    insta::assert_snapshot!(refused(g.add_node("load/parse")), @r"
    invalid node id `load/parse`: `/` separates a step's id from the ids of the nodes inside it (`chunks/clean`), and cannot be in an id
    hint: use another character, as in `load_parse`
    ");
}

#[test]
fn separator_in_key() {
    let refused = switch(
        "route",
        plain(|_: &str, _: &Value| Ok(Value::text("a/b"))),
        vec![("a/b".to_owned(), n("x"))],
    );
    insta::assert_snapshot!(refused.err().unwrap().to_string(), @r"
    invalid key `a/b` of switch step `route`: `/` separates the levels of the ids inside a case (`route/key/node`), and cannot be in a key
    hint: use another character, as in `a_b`
    ");
}

#[test]
fn duplicate_node() {
    let mut g = graph(&["encoder"], &[]);
    insta::assert_snapshot!(refused(g.add_node("encoder")), @r"
    a node `encoder` is already in the graph
    hint: give the new node another id, or let Soma derive one
    ");
}

#[test]
fn unknown_node() {
    let mut g = graph(&["a"], &[]);
    insta::assert_snapshot!(refused(g.add_edge("a", "ghost")), @r"
    no node `ghost` in the graph
    hint: add it with `node` before connecting it
    ");
}

#[test]
fn duplicate_edge() {
    let mut g = graph(&["a", "b"], &[("a", "b")]);
    insta::assert_snapshot!(refused(g.add_edge("a", "b")), @r"
    the edge `a` -> `b` is already in the graph
    hint: an edge is declared once
    ");
}

#[test]
fn would_cycle_shows_the_path() {
    let mut g = graph(&["a", "b", "c"], &[("a", "b"), ("b", "c")]);
    insta::assert_snapshot!(refused(g.add_edge("c", "a")), @r"
    the edge `c` -> `a` would close a cycle: `c` -> `a` -> `b` -> `c`
    hint: a graph is acyclic; remove an edge of that path
    ");
}

#[test]
fn would_cycle_on_a_self_loop() {
    let mut g = graph(&["a"], &[]);
    insta::assert_snapshot!(refused(g.add_edge("a", "a")), @r"
    the edge `a` -> `a` would close a cycle: `a` -> `a`
    hint: a graph is acyclic; remove an edge of that path
    ");
}

// --- CompileError ----------------------------------------------------------------------------

#[test]
fn missing_implementation() {
    let g = graph(&["a", "b"], &[("a", "b")]);
    let mut catalog = Catalog::new();
    catalog.insert("a", std::sync::Arc::new(|x: &Value| Ok(x.clone())));
    insta::assert_snapshot!(compile(&g, &catalog).unwrap_err(), @r"
    node `b` has no implementation
    hint: register one for `b` in the catalog before compiling
    ");
}

// --- RunError --------------------------------------------------------------------------------

/// Runs `node` alone, under the id `id`, on `Null`.
fn run_alone(
    id: &str,
    implementation: impl Node + 'static,
    driver: Option<Arc<dyn Driver>>,
) -> String {
    let (graph, catalog) = node(id, implementation).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let mut executor = Executor::new();
    if let Some(driver) = driver {
        executor = executor.with_driver(driver);
    }
    executor
        .run(&plan, &catalog, Value::Null)
        .unwrap_err()
        .to_string()
}

/// Awaits one request on every turn.
struct AwaitsForever;

impl Node for AwaitsForever {
    fn forward(&self, _input: &Value, _ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Ok(Transition::Await(vec![Value::Int(1)]))
    }
}

/// Answers with `answers` results whatever it is asked, or fails with `failure`.
struct Answers {
    answers: usize,
    failure: Option<&'static str>,
}

impl Driver for Answers {
    fn perform(&self, _requests: &[Value]) -> Result<Vec<Value>, DriverError> {
        match self.failure {
            Some(message) => Err(DriverError::new(message)),
            None => Ok(vec![Value::Null; self.answers]),
        }
    }
}

#[test]
fn node_failed_shows_the_nodes_own_message() {
    let fails = |_: &Value| -> Result<Value, NodeError> { Err(NodeError::new("negative input")) };
    insta::assert_snapshot!(run_alone("check", fails, None), @"node `check` failed: negative input");
}

#[test]
fn no_driver() {
    insta::assert_snapshot!(run_alone("lookup", AwaitsForever, None), @r"
    node `lookup` awaited, but no driver was given
    hint: pass a driver that serves its requests
    ");
}

#[test]
fn driver_failed_shows_the_drivers_own_message() {
    let driver = Answers {
        answers: 1,
        failure: Some("connection refused"),
    };
    insta::assert_snapshot!(run_alone("lookup", AwaitsForever, Some(Arc::new(driver))), @r"
    the driver failed serving node `lookup`: connection refused
    hint: the driver's own error is the cause; fix the driver, or the requests `lookup` makes
    ");
}

#[test]
fn wrong_result_count() {
    let driver = Answers {
        answers: 3,
        failure: None,
    };
    insta::assert_snapshot!(run_alone("lookup", AwaitsForever, Some(Arc::new(driver))), @r"
    the driver answered 3 result(s) to the 1 request(s) of node `lookup`
    hint: a driver returns exactly one result per request, in order
    ");
}

#[test]
fn turn_limit() {
    let driver = Answers {
        answers: 1,
        failure: None,
    };
    insta::assert_snapshot!(run_alone("lookup", AwaitsForever, Some(Arc::new(driver))), @r"
    node `lookup` was still awaiting after 64 turns
    hint: make it finish, or raise the turn limit
    ");
}

#[test]
fn not_in_catalog() {
    let error = Executor::new()
        .run(&exec("a", &[]), &Catalog::new(), Value::Null)
        .unwrap_err();
    insta::assert_snapshot!(error, @r"
    node `a` has no implementation in the catalog
    hint: run a plan with the catalog it was compiled against
    ");
}

#[test]
fn missing_input() {
    // Only a plan made by hand can read a node before it ran.
    let (_, catalog) = (n("a") >> n("b")).somatize().unwrap();
    let backwards: Plan = seq(vec![exec("b", &["a"]), exec("a", &[])]);
    let error = Executor::new()
        .run(&backwards, &catalog, Value::Null)
        .unwrap_err();
    insta::assert_snapshot!(error, @r"
    node `b` reads `a`, which no step before it produces
    hint: run plans made by `compile`; a step sees the steps before it in its branch and before its wave, never a sibling branch's
    ");
}

#[test]
fn step_twice() {
    let (_, catalog) = n("a").somatize().unwrap();
    let twice: Plan = seq(vec![exec("a", &[]), exec("a", &[])]);
    let error = Executor::new()
        .run(&twice, &catalog, Value::Null)
        .unwrap_err();
    insta::assert_snapshot!(error, @r"
    node `a` is run twice by the plan
    hint: run plans made by `compile`, where each node is one step
    ");
}

#[test]
fn remote_slice() {
    // A distributed plan runs through a transport; a program refuses its slices.
    let (graph, catalog) = (n("a") >> n("b")).somatize().unwrap();
    let mut hosts = HostPlacement::new();
    hosts.place("b", "gpu-box".parse().unwrap());
    let sliced = distribute(&compile(&graph, &catalog).unwrap(), &hosts);
    let error = Executor::new()
        .run(&sliced, &catalog, Value::Null)
        .unwrap_err();
    insta::assert_snapshot!(error, @r"
    node `b` is in a slice for host `gpu-box`, and a program runs every step in this process
    hint: resolve the plan `compile` made, before `distribute`; a transport (Soma's Python front runs slices on Ray) runs distributed plans
    ");
}

#[test]
fn invalid_host_name() {
    let error = "gpu box".parse::<HostName>().unwrap_err();
    insta::assert_snapshot!(error, @r"
    `gpu box` is not a host name
    hint: name a host with 1 to 63 ASCII letters, digits, `-`, `_` or `.`, starting with a letter or a digit: `gpu-box`, `node_2`
    ");
}

struct Stop(AtomicBool);

impl Watch for Stop {
    fn interrupted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn interrupted_names_no_node() {
    let (graph, catalog) = n("a").somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let stop = Stop(AtomicBool::new(true));
    let error = Executor::new()
        .with_watch(Arc::new(stop))
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    assert!(matches!(error, RunError::Interrupted));
    insta::assert_snapshot!(error, @r"
    the run was interrupted
    hint: its watch asked it to stop (Ctrl-C, a deadline); every branch stopped at a node boundary, and the run can be started again
    ");
}

#[test]
fn turn_limit_of_zero() {
    let (graph, catalog) = node("lookup", AwaitsForever).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let error = Executor::new()
        .with_turn_limit(0)
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    assert_eq!(error.node(), None, "no node was called, so none is blamed");
    insta::assert_snapshot!(error, @r"
    a turn limit of 0 lets no node run, so none was called
    hint: the turn limit is the number of calls each node gets; pass at least 1, or leave it out for the default of 64
    ");
}

// --- Steps that decide as they run -------------------------------------------------------------

/// Runs `expr`, whose steps may decide, on `input`, and returns the error it stops with.
fn decided_error(expr: soma_core::Expr, input: Value) -> String {
    let (graph, catalog, decisions) = expr.somatize_decided().unwrap();
    let plan = soma_core::compile_decided(&graph, &catalog, &decisions).unwrap();
    Executor::new()
        .run(&plan, &catalog, input)
        .unwrap_err()
        .to_string()
}

#[test]
fn not_a_list() {
    let expr = soma_core::each("chunks", n("clean"), None).unwrap();
    insta::assert_snapshot!(decided_error(expr, Value::Int(3)), @r"
    `each` step `chunks` read a `Int`, not a list of items
    hint: the step before it returns the items, a list (any sized sequence); wrap a single item in one
    ");
}

#[test]
fn unknown_case() {
    let selector = crate::support::plain(|_: &str, _: &Value| Ok(Value::text("pdf")));
    let cases = vec![("ocr".to_owned(), n("a")), ("text".to_owned(), n("b"))];
    let expr = soma_core::switch("route", selector, cases).unwrap();
    insta::assert_snapshot!(decided_error(expr, Value::Null), @r"
    `switch` step `route` has no case for key `pdf`; its cases: `ocr`, `text`
    hint: make the selector return one of these keys, or add a case for it
    ");
}

#[test]
fn loop_limit() {
    let never = crate::support::plain(|_: &str, _: &Value| Ok(Value::Bool(false)));
    let expr = soma_core::repeat("again", n("ask"), never, 2).unwrap();
    insta::assert_snapshot!(decided_error(expr, Value::Null), @r"
    `loop` step `again` ran its body 2 times and `until` still said not done; the last output was a `Text`
    hint: raise `max_iterations`, or check that `until` can become true
    ");
}

#[test]
fn stream_on_hosts() {
    let host: HostName = "one".parse().unwrap();
    let refused = soma_core::Route::of(true, Some(("b".into(), host)), || false);
    insta::assert_snapshot!(refused.unwrap_err().to_string(), @r#"
    node `b` is placed on host `one`, and streams do not run slices on hosts yet
    hint: run each item with `forward`, or bring the nodes back here with `g.place_at("b", None)`
    "#);
}

#[test]
fn concurrency_inside_a_step() {
    let refused = soma_core::SettingError::NotAStage {
        node: "items/fetch".to_owned(),
        step: "items".to_owned(),
        kind: "each",
    };
    insta::assert_snapshot!(refused.to_string(), @r#"
    `items/fetch` is inside the `each` step `items`: a stream limits the graph's own steps only, so a concurrency has nothing to apply to there
    hint: set it on the step, `g.concurrency("items", n)`, which then takes that many items at once
    "#);
}
