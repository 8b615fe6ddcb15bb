//! Policies written with the Rust builder — `expr.retry(..)`, `expr.retry_with(..)`,
//! `expr.time_limit(..)` — on a node, on an expression (every node inside that has none, the
//! innermost winning) and through decision steps, run with the `Policies` made from what
//! `somatize_with_policies` hands back: no id named by hand.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use soma_core::{
    compile_decided, each, node, repeat, switch, AttemptError, Clock, Ctx, Driver, DriverError,
    Executor, Expr, Node, NodeError, Placement, Policies, Program, RetryPolicy, RunError, Trace,
    Transition, Value, WrittenPolicies,
};

use crate::policies::{within_deadline, Recorded};
use crate::support::{after, plain, trace, Gate};

/// Runs `expr` on `input` with the policies written on it, every pause through `clock`.
fn run_on(
    expr: Expr,
    input: Value,
    clock: &Arc<dyn Clock>,
    executor: &Executor,
) -> Result<Value, RunError> {
    let (graph, catalog, decisions, written) = expr.somatize_with_policies().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    let policies = Policies::from(&written).with_clock(clock);
    let program = Program::resolved(&plan, &catalog, &Placement::new(), &policies).unwrap();
    executor.run_program(&program, input)
}

/// Runs `expr` on 1, pausing not at all.
fn run(expr: Expr) -> Result<Value, RunError> {
    let clock: Arc<dyn Clock> = Recorded::new(0.0);
    run_on(expr, Value::Int(1), &clock, &Executor::new())
}

/// A node that fails its first `failures` calls with what `error` makes of the call's number,
/// counting every call.
fn failing_first(
    id: &str,
    failures: u32,
    calls: &Arc<AtomicU32>,
    error: fn(u32) -> NodeError,
) -> Expr {
    let calls = Arc::clone(calls);
    node(
        id,
        plain(move |id, input| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            if call < failures {
                Err(error(call))
            } else {
                trace(id, input)
            }
        }),
    )
}

fn numbered(call: u32) -> NodeError {
    NodeError::new(format!("call {call} failed"))
}

fn refused(_: u32) -> NodeError {
    NodeError::from_cause(io::Error::from(io::ErrorKind::ConnectionRefused))
}

fn counter() -> Arc<AtomicU32> {
    Arc::new(AtomicU32::new(0))
}

fn written(expr: Expr) -> WrittenPolicies {
    expr.somatize_with_policies().unwrap().3
}

fn retries_of(written: &WrittenPolicies, id: &str) -> Option<u32> {
    written
        .get(id)
        .and_then(|policy| policy.retry.as_ref())
        .map(RetryPolicy::times)
}

#[test]
fn a_retry_written_on_a_node_lets_a_later_attempt_succeed() {
    let calls = counter();
    let expr = failing_first("a", 2, &calls, numbered).retry(3, Duration::from_millis(500));
    assert_eq!(run(expr).unwrap(), Value::text("a(1)"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn a_written_retry_makes_times_more_attempts_then_reports_the_count_and_the_last_error() {
    let calls = counter();
    let expr = failing_first("a", u32::MAX, &calls, numbered).retry(2, Duration::ZERO);
    let error = run(expr).unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let RunError::Retried { attempts, last } = &error else {
        panic!("not a retried error: {error:?}");
    };
    assert_eq!(*attempts, 3);
    assert!(last.to_string().contains("call 2 failed"), "{last}");
    assert_eq!(error.node().map(ToString::to_string).as_deref(), Some("a"));
    assert!(error.to_string().contains("3 attempts"), "{error}");
}

/// Whether an error underneath a node's is an `io::Error`.
fn from_io(cause: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    cause.is::<io::Error>()
}

/// Retries a node's error only when an `io::Error` is underneath it.
fn network_only() -> RetryPolicy {
    RetryPolicy::new(5, Duration::ZERO).on(|failed| match failed {
        AttemptError::Node(error) => error.cause().is_some_and(from_io),
        AttemptError::TimeLimit(_) => false,
    })
}

#[test]
fn only_the_node_errors_a_retry_policy_accepts_are_retried() {
    let calls = counter();
    let counted = Arc::clone(&calls);
    // The first call fails as the network does, the second as a bug does.
    let expr = node(
        "a",
        plain(move |_, _| match counted.fetch_add(1, Ordering::SeqCst) {
            0 => Err(refused(0)),
            _ => Err(NodeError::new("a bug")),
        }),
    )
    .retry_with(&network_only());
    let error = run(expr).unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let RunError::NodeFailed { error, .. } = &error else {
        panic!("a refused failure is raised as it is: {error:?}");
    };
    assert_eq!(error.message(), "a bug");
}

#[test]
fn a_retry_policy_retries_the_accepted_errors_until_its_times_run_out() {
    let calls = counter();
    let expr = failing_first("a", u32::MAX, &calls, refused).retry_with(&network_only());
    let error = run(expr).unwrap_err();
    assert!(
        matches!(error, RunError::Retried { attempts: 6, .. }),
        "{error:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

#[test]
fn the_pauses_of_a_written_retry_double_from_its_backoff_up_to_the_maximum_with_jitter() {
    let calls = counter();
    let recorded = Recorded::new(1.0);
    let clock: Arc<dyn Clock> = recorded.clone();
    let expr = failing_first("a", 9, &calls, numbered).retry(9, Duration::from_secs(1));
    run_on(expr, Value::Int(1), &clock, &Executor::new()).unwrap();
    // Each pause a full quarter longer (the clock's jitter is 1): 1 s, 2 s, ... 128 s, 128 s.
    let millis: Vec<u128> = recorded.pauses().iter().map(Duration::as_millis).collect();
    assert_eq!(
        millis,
        [1_250, 2_500, 5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 160_000]
    );
}

#[test]
fn each_attempt_of_a_written_retry_is_a_span_of_its_own() {
    let calls = counter();
    let spans = Arc::new(Trace::new());
    let clock: Arc<dyn Clock> = Recorded::new(0.0);
    let expr = failing_first("a", 2, &calls, numbered).retry(3, Duration::ZERO);
    let executor = Executor::new().with_trace(Arc::clone(&spans));
    run_on(expr, Value::Int(1), &clock, &executor).unwrap();
    let failed: Vec<(String, bool)> = spans
        .spans()
        .iter()
        .map(|span| (span.node.to_string(), span.error.is_some()))
        .collect();
    let expected = [true, true, false].map(|failed| ("a".to_owned(), failed));
    assert_eq!(failed, expected);
}

#[test]
fn a_call_past_a_written_time_limit_fails_naming_its_node() {
    let gate = Gate::new();
    let expr = node("slow", plain(after(&gate))).time_limit(Duration::from_millis(50));
    let error = within_deadline(move || run(expr)).unwrap_err();
    gate.open();
    let RunError::TimeLimit { node, limit } = &error else {
        panic!("not a time limit: {error:?}");
    };
    assert_eq!(node.as_str(), "slow");
    assert_eq!(*limit, Duration::from_millis(50));
}

/// A node whose first call waits for `gate` (past any limit), and whose later calls answer.
fn overrunning_once(id: &str, gate: &Arc<Gate>, calls: &Arc<AtomicU32>) -> Expr {
    let (body, counted) = (after(gate), Arc::clone(calls));
    node(
        id,
        plain(move |id, input| {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                body(id, input)
            } else {
                trace(id, input)
            }
        }),
    )
}

#[test]
fn a_written_retry_retries_a_call_that_overran_its_written_time_limit() {
    let (gate, calls) = (Gate::new(), counter());
    let expr = overrunning_once("a", &gate, &calls)
        .time_limit(Duration::from_millis(50))
        .retry(1, Duration::ZERO);
    let out = within_deadline(move || run(expr));
    gate.open();
    assert_eq!(out.unwrap(), Value::text("a(1)"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn a_retry_policy_that_refuses_time_limits_does_not_retry_an_overrun() {
    let (gate, calls) = (Gate::new(), counter());
    let expr = overrunning_once("a", &gate, &calls)
        .time_limit(Duration::from_millis(50))
        .retry_with(&network_only());
    let error = within_deadline(move || run(expr)).unwrap_err();
    gate.open();
    assert!(matches!(error, RunError::TimeLimit { .. }), "{error:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_retry_on_an_expression_retries_each_of_its_nodes_on_its_own() {
    let (first, second) = (counter(), counter());
    let expr = (failing_first("a", 1, &first, numbered)
        >> failing_first("b", 1, &second, numbered))
    .retry(1, Duration::ZERO);
    assert_eq!(run(expr).unwrap(), Value::text("b(a(1))"));
    // Not the expression again as a whole: `a` is not called a third time when `b` fails.
    assert_eq!(first.load(Ordering::SeqCst), 2);
    assert_eq!(second.load(Ordering::SeqCst), 2);
}

#[test]
fn the_innermost_retry_and_time_limit_win() {
    let calls = counter();
    let inner = failing_first("a", u32::MAX, &calls, numbered)
        .retry(0, Duration::ZERO)
        .time_limit(Duration::from_secs(5));
    let expr = (inner | failing_first("b", 0, &counter(), numbered))
        .retry(3, Duration::ZERO)
        .time_limit(Duration::from_secs(1));
    let policies = written(expr.clone());
    assert_eq!(retries_of(&policies, "a"), Some(0));
    assert_eq!(retries_of(&policies, "b"), Some(3));
    let limit = |id: &str| policies.get(id).and_then(|policy| policy.time_limit);
    assert_eq!(limit("a"), Some(Duration::from_secs(5)));
    assert_eq!(limit("b"), Some(Duration::from_secs(1)));
    let error = run(expr).unwrap_err();
    assert!(
        matches!(error, RunError::Retried { attempts: 1, .. }),
        "{error:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_second_retry_on_the_same_node_leaves_the_first() {
    let expr = node("a", plain(trace))
        .retry(1, Duration::ZERO)
        .retry(5, Duration::ZERO);
    assert_eq!(retries_of(&written(expr), "a"), Some(1));
}

/// Awaits once, counting its calls.
struct Awaiting(Arc<AtomicU32>);

impl Node for Awaiting {
    fn forward(&self, _: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        if ctx.turn() == 0 {
            Ok(Transition::Await(vec![Value::Null]))
        } else {
            Ok(Transition::Done(Value::Null))
        }
    }
}

/// A driver that fails every request.
struct Unreachable;

impl Driver for Unreachable {
    fn perform(&self, _: &[Value]) -> Result<Vec<Value>, DriverError> {
        Err(DriverError::new("host unreachable"))
    }
}

#[test]
fn a_drivers_failure_is_never_retried_whatever_the_filter_says() {
    let calls = counter();
    let expr = node("asker", Awaiting(Arc::clone(&calls)))
        .retry_with(&RetryPolicy::new(3, Duration::ZERO).on(|_| true));
    let clock: Arc<dyn Clock> = Recorded::new(0.0);
    let executor = Executor::new().with_driver(Arc::new(Unreachable));
    let error = run_on(expr, Value::Null, &clock, &executor).unwrap_err();
    assert!(matches!(error, RunError::DriverFailed { .. }), "{error:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn policies_written_on_either_side_of_a_glue_are_kept() {
    let one = |id: &str| node(id, plain(trace));
    let small = one("a").retry(1, Duration::ZERO);
    let large = (one("b") >> one("c")).retry(2, Duration::ZERO);
    for expr in [small.clone() >> large.clone(), large | small] {
        let policies = written(expr);
        assert_eq!(retries_of(&policies, "a"), Some(1));
        assert_eq!(retries_of(&policies, "c"), Some(2));
    }
}

#[test]
fn a_retry_on_a_map_step_reaches_the_nodes_its_body_runs() {
    let calls = counter();
    let body = failing_first("f", 1, &calls, numbered) >> node("g", plain(trace));
    let expr = each("m", body, None).unwrap().retry(1, Duration::ZERO);
    let policies = written(expr.clone());
    assert_eq!(retries_of(&policies, "m/f"), Some(1));
    assert_eq!(retries_of(&policies, "m/g"), Some(1));
    assert_eq!(
        retries_of(&policies, "m"),
        None,
        "the step runs no call itself"
    );
    let items = Value::list([Value::Int(1), Value::Int(2)]);
    let clock: Arc<dyn Clock> = Recorded::new(0.0);
    let out = run_on(expr, items, &clock, &Executor::new()).unwrap();
    assert_eq!(
        out,
        Value::list([Value::text("m/g(m/f(1))"), Value::text("m/g(m/f(2))")])
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "one item's call failed once"
    );
}

#[test]
fn a_retry_written_inside_a_map_wins_over_one_around_the_step() {
    let calls = counter();
    let body = failing_first("f", u32::MAX, &calls, numbered).retry(0, Duration::ZERO);
    let split = node("split", plain(|_, _| Ok(Value::list([Value::Int(1)]))));
    let expr = (split >> each("m", body, None).unwrap()).retry(4, Duration::ZERO);
    let policies = written(expr.clone());
    assert_eq!(retries_of(&policies, "m/f"), Some(0));
    assert_eq!(retries_of(&policies, "split"), Some(4));
    let error = run(expr).unwrap_err();
    assert!(
        matches!(error, RunError::Retried { attempts: 1, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.node().map(ToString::to_string).as_deref(),
        Some("m/f")
    );
}

#[test]
fn a_time_limit_around_a_map_step_fires_naming_the_node_inside() {
    let gate = Gate::new();
    let expr = each("m", node("slow", plain(after(&gate))), None)
        .unwrap()
        .time_limit(Duration::from_millis(50));
    let clock: Arc<dyn Clock> = Recorded::new(0.0);
    let items = Value::list([Value::Int(1)]);
    let error = within_deadline(move || run_on(expr, items, &clock, &Executor::new())).unwrap_err();
    gate.open();
    let RunError::TimeLimit { node, .. } = &error else {
        panic!("not a time limit: {error:?}");
    };
    assert_eq!(node.as_str(), "m/slow");
}

#[test]
fn policies_reach_the_cases_of_a_switch_and_the_body_of_a_repeat_not_their_own_nodes() {
    let calls = counter();
    let selector = plain(|_, _| Ok(Value::text("x")));
    let cases = vec![
        ("x".to_owned(), failing_first("flaky", 1, &calls, numbered)),
        ("y".to_owned(), node("other", plain(trace))),
    ];
    let route = switch("route", selector, cases)
        .unwrap()
        .retry(1, Duration::ZERO);
    let until = plain(|_, _| Ok(Value::Bool(true)));
    let again = repeat("again", node("step", plain(trace)), until, 3)
        .unwrap()
        .time_limit(Duration::from_secs(1));
    let policies = written(route.clone() >> again.clone());
    assert_eq!(retries_of(&policies, "route/x/flaky"), Some(1));
    assert_eq!(retries_of(&policies, "route/y/other"), Some(1));
    assert!(policies.get("route").is_none(), "the selector has none");
    assert_eq!(
        policies.get("again/step").and_then(|p| p.time_limit),
        Some(Duration::from_secs(1))
    );
    assert!(policies.get("again").is_none(), "the predicate has none");
    assert_eq!(run(route).unwrap(), Value::text("route/x/flaky(1)"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
#[should_panic(expected = "a time limit of zero fails every call")]
fn a_time_limit_of_zero_is_refused_where_it_is_written() {
    let _ = node("a", plain(trace)).time_limit(Duration::ZERO);
}
