//! Awaiting nodes and the driver: a node asks, the driver answers, the node is called again —
//! within a turn limit, and every failure on the way is blamed on the node that asked.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use soma_core::{
    compile, node, Ctx, Driver, DriverError, Executor, Node, NodeError, RunError, Transition,
    Value, DEFAULT_TURN_LIMIT,
};

use crate::support::n;

/// Answers every request with the request doubled, and keeps what it was asked.
#[derive(Default)]
struct Doubler {
    asked: Mutex<Vec<Vec<Value>>>,
}

impl Driver for Doubler {
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError> {
        self.asked.lock().unwrap().push(requests.to_vec());
        Ok(requests
            .iter()
            .map(|r| Value::Int(r.as_int().unwrap_or(0) * 2))
            .collect())
    }
}

/// Awaits on turns `0..awaits` and is done on the next, keeping what each call saw.
struct Asker {
    awaits: u32,
    calls: AtomicU32,
    seen: Mutex<Vec<(u32, Vec<Value>)>>,
}

impl Asker {
    fn new(awaits: u32) -> Arc<Self> {
        Arc::new(Asker {
            awaits,
            calls: AtomicU32::new(0),
            seen: Mutex::new(Vec::new()),
        })
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Node for Asker {
    fn forward(&self, _input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let turn = ctx.turn();
        self.seen
            .lock()
            .unwrap()
            .push((turn, ctx.results().to_vec()));
        if turn < self.awaits {
            let t = i64::from(turn);
            Ok(Transition::Await(vec![Value::Int(t), Value::Int(t + 100)]))
        } else {
            Ok(Transition::Done(Value::list(ctx.results().iter().cloned())))
        }
    }
}

/// Runs `implementation` as the one node `asker`, served by `driver` (or by none) under `limit` (or the default).
fn run_one(
    implementation: Arc<dyn Node>,
    driver: Option<Arc<dyn Driver>>,
    limit: Option<u32>,
    input: Value,
) -> Result<Value, RunError> {
    let (graph, catalog) = soma_core::node_arc("asker", implementation)
        .somatize()
        .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let mut executor = Executor::new();
    if let Some(driver) = driver {
        executor = executor.with_driver(driver);
    }
    if let Some(limit) = limit {
        executor = executor.with_turn_limit(limit);
    }
    executor.run(&plan, &catalog, input)
}

#[test]
fn an_awaiting_node_is_called_again_with_the_drivers_answers() {
    let asker = Asker::new(1);
    let driver = Arc::new(Doubler::default());
    let out = run_one(asker.clone(), Some(driver.clone()), None, Value::Null);
    assert_eq!(out.unwrap(), Value::list([Value::Int(0), Value::Int(200)]));
    assert_eq!(asker.calls(), 2);
}

#[test]
fn each_turn_sees_the_answers_to_its_own_previous_requests() {
    let asker = Asker::new(3);
    let driver = Arc::new(Doubler::default());
    run_one(asker.clone(), Some(driver.clone()), None, Value::Null).unwrap();
    let int = |pairs: [i64; 2]| pairs.map(Value::Int).to_vec();
    assert_eq!(
        *asker.seen.lock().unwrap(),
        [
            (0, vec![]),
            (1, int([0, 200])),
            (2, int([2, 202])),
            (3, int([4, 204]))
        ]
    );
}

#[test]
fn the_driver_receives_each_turns_requests_in_order() {
    let driver = Arc::new(Doubler::default());
    run_one(Asker::new(2), Some(driver.clone()), None, Value::Null).unwrap();
    let int = |pairs: [i64; 2]| pairs.map(Value::Int).to_vec();
    assert_eq!(
        *driver.asked.lock().unwrap(),
        [int([0, 100]), int([1, 101])]
    );
}

#[test]
fn the_default_turn_limit_is_64() {
    assert_eq!(DEFAULT_TURN_LIMIT, 64);
    assert_eq!(Executor::new().turn_limit(), 64);
}

#[test]
fn a_node_that_never_finishes_gets_exactly_the_default_limit_of_calls() {
    let asker = Asker::new(u32::MAX);
    let error = run_one(
        asker.clone(),
        Some(Arc::new(Doubler::default())),
        None,
        Value::Null,
    )
    .unwrap_err();
    assert_eq!(asker.calls(), 64);
    assert!(
        matches!(&error, RunError::TurnLimit { node, limit: 64 } if node == "asker"),
        "{error:?}"
    );
}

#[test]
fn the_turn_limit_can_be_set() {
    assert_eq!(Executor::new().with_turn_limit(3).turn_limit(), 3);
    let asker = Asker::new(u32::MAX);
    let error = run_one(
        asker.clone(),
        Some(Arc::new(Doubler::default())),
        Some(3),
        Value::Null,
    );
    assert_eq!(asker.calls(), 3);
    assert!(matches!(error, Err(RunError::TurnLimit { limit: 3, .. })));
}

#[test]
fn a_node_that_needs_exactly_the_limit_of_calls_finishes() {
    let asker = Asker::new(2);
    let out = run_one(
        asker.clone(),
        Some(Arc::new(Doubler::default())),
        Some(3),
        Value::Null,
    );
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(asker.calls(), 3);
}

#[test]
fn a_node_that_needs_one_call_more_than_the_limit_is_stopped() {
    let asker = Asker::new(3);
    let out = run_one(
        asker.clone(),
        Some(Arc::new(Doubler::default())),
        Some(3),
        Value::Null,
    );
    assert!(matches!(out, Err(RunError::TurnLimit { .. })), "{out:?}");
    assert_eq!(asker.calls(), 3);
}

#[test]
fn a_turn_limit_of_zero_allows_no_call_at_all() {
    let asker = Asker::new(0);
    let out = run_one(asker.clone(), None, Some(0), Value::Null);
    assert!(
        matches!(out, Err(RunError::TurnLimit { limit: 0, .. })),
        "{out:?}"
    );
    assert_eq!(asker.calls(), 0);
}

#[test]
fn a_turn_limit_error_names_the_node_and_the_limit() {
    let error = run_one(
        Asker::new(9),
        Some(Arc::new(Doubler::default())),
        Some(2),
        Value::Null,
    )
    .unwrap_err();
    let shown = error.to_string();
    assert!(shown.contains("`asker`") && shown.contains('2'), "{shown}");
    assert_eq!(error.node().map(soma_core::NodeId::as_str), Some("asker"));
}

#[test]
fn an_awaiting_node_without_a_driver_is_no_driver_naming_it() {
    let error = run_one(Asker::new(1), None, None, Value::Null).unwrap_err();
    assert!(
        matches!(&error, RunError::NoDriver { node } if node == "asker"),
        "{error:?}"
    );
    assert!(error.to_string().contains("`asker`"));
}

#[derive(Debug)]
struct Unreachable;

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("host unreachable")
    }
}

impl std::error::Error for Unreachable {}

struct Failing;

impl Driver for Failing {
    fn perform(&self, _: &[Value]) -> Result<Vec<Value>, DriverError> {
        Err(DriverError::from_cause(Unreachable))
    }
}

#[test]
fn a_driver_failure_is_attributed_to_the_node_that_asked() {
    let (graph, catalog) = (n("before") >> soma_core::node_arc("asker", Asker::new(1)))
        .somatize()
        .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let error = Executor::new()
        .with_driver(Arc::new(Failing))
        .run(&plan, &catalog, Value::Null)
        .unwrap_err();
    let RunError::DriverFailed { node, error: cause } = &error else {
        panic!("{error:?}");
    };
    assert_eq!(node, "asker");
    assert_eq!(cause.message(), "host unreachable");
    assert!(error.to_string().contains("`asker`"), "{error}");
}

#[test]
fn a_driver_failures_cause_travels_untouched_to_the_caller() {
    let error = run_one(Asker::new(1), Some(Arc::new(Failing)), None, Value::Null).unwrap_err();
    let driver_error = std::error::Error::source(&error).expect("the driver's error");
    assert!(driver_error
        .source()
        .expect("its cause")
        .is::<Unreachable>());
}

/// Answers one result fewer than it was asked for.
struct Short;

impl Driver for Short {
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError> {
        Ok(requests.iter().skip(1).cloned().collect())
    }
}

#[test]
fn a_wrong_result_count_is_refused_naming_the_node() {
    let error = run_one(Asker::new(1), Some(Arc::new(Short)), None, Value::Null).unwrap_err();
    assert!(
        matches!(&error, RunError::WrongResultCount { node, asked: 2, got: 1 } if node == "asker"),
        "{error:?}"
    );
    assert!(error.to_string().contains("`asker`"));
}

/// Answers an even number at once; for an odd one, asks the driver to double it.
struct EvenAtOnce;

impl Node for EvenAtOnce {
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let x = input.as_int().ok_or_else(|| NodeError::new("not an int"))?;
        match (x % 2, ctx.turn()) {
            (0, _) => Ok(Transition::Done(input.clone())),
            (_, 0) => Ok(Transition::Await(vec![input.clone()])),
            (_, _) => Ok(Transition::Done(ctx.results()[0].clone())),
        }
    }
}

#[test]
fn a_node_that_answers_at_once_needs_no_driver() {
    assert_eq!(
        run_one(Arc::new(EvenAtOnce), None, None, Value::Int(4)).unwrap(),
        Value::Int(4)
    );
}

#[test]
fn the_same_node_awaits_the_driver_on_other_inputs() {
    assert!(matches!(
        run_one(Arc::new(EvenAtOnce), None, None, Value::Int(3)),
        Err(RunError::NoDriver { .. })
    ));
    assert_eq!(
        run_one(
            Arc::new(EvenAtOnce),
            Some(Arc::new(Doubler::default())),
            None,
            Value::Int(3)
        )
        .unwrap(),
        Value::Int(6)
    );
}

#[test]
fn every_node_of_a_chain_can_await_and_the_chain_still_composes() {
    let (graph, catalog) =
        (node("a", EvenAtOnce) >> node("b", EvenAtOnce) >> node("c", EvenAtOnce))
            .somatize()
            .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let driver = Arc::new(Doubler::default());
    let out = Executor::new()
        .with_driver(driver.clone())
        .run(&plan, &catalog, Value::Int(3));
    // 3 is odd and asks; 6 is even and answers at once, downstream too.
    assert_eq!(out.unwrap(), Value::Int(6));
    assert_eq!(driver.asked.lock().unwrap().len(), 1);
}
