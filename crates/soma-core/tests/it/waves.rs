//! Waves at run time: the branches of a wave really are in flight at the same time, each start
//! to finish on one thread, and what they produce, how they fail and how they panic comes out
//! the same as if they had run in a row.
//!
//! "At the same time" is proven by a rendezvous with a deadline, never by a clock: were the
//! branches run one after the other, the first to arrive would wait alone until the deadline
//! and fail the run.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use soma_core::{
    compile, node, Catalog, Ctx, Driver, DriverError, Executor, Expr, Node, NodeError, Plan,
    RunError, Transition, Value, Watch,
};

use crate::support::{
    after, battery, catalog_of, exec, fail, logged, meet, n, open_when_this_thread_ends, plain,
    seq, trace, traced, Gate, Log, OpenOnDrop, Phase, Rendezvous,
};

fn compiled(expr: Expr) -> (Catalog, Plan) {
    let (graph, catalog) = expr.somatize().expect("fresh, valid ids");
    let plan = compile(&graph, &catalog).expect("every node is implemented");
    (catalog, plan)
}

fn run(expr: Expr) -> Result<Value, RunError> {
    let (catalog, plan) = compiled(expr);
    Executor::new().run(&plan, &catalog, Value::text("x"))
}

fn the_message(result: &Result<Value, RunError>) -> Option<(&str, &str)> {
    match result {
        Err(RunError::NodeFailed { node, error }) => Some((node.as_str(), error.message())),
        _ => None,
    }
}

#[test]
fn the_real_order_respects_every_edge_with_threads_in_the_way() {
    for (name, graph) in battery() {
        let log = Log::new();
        let catalog = catalog_of(&graph, &(Arc::new(logged(&log, trace)) as Arc<dyn Node>));
        let plan = compile(&graph, &catalog).unwrap();
        Executor::new().run(&plan, &catalog, Value::Null).unwrap();
        for (from, to) in graph.edges() {
            let ended = log.position(from.as_str(), Phase::End).unwrap();
            let started = log.position(to.as_str(), Phase::Start).unwrap();
            assert!(
                ended < started,
                "{name}: `{to}` started before `{from}` ended"
            );
        }
    }
}

/// `a >> (b >> b2 >> b3 | c >> c2) >> d`, every node logged.
fn two_sequences(log: &Arc<Log>) -> Expr {
    let l = |id: &str| node(id, logged(log, trace));
    l("a") >> ((l("b") >> l("b2") >> l("b3")) | (l("c") >> l("c2"))) >> l("d")
}

#[test]
fn every_node_of_a_branch_runs_on_the_same_thread() {
    let log = Log::new();
    run(two_sequences(&log)).unwrap();
    assert_eq!(log.thread_of("b"), log.thread_of("b2"));
    assert_eq!(log.thread_of("b"), log.thread_of("b3"));
    assert_eq!(log.thread_of("c"), log.thread_of("c2"));
}

#[test]
fn two_branches_in_flight_at_once_run_on_two_threads() {
    let log = Log::new();
    let together = Rendezvous::new(2);
    let m = |id: &str| node(id, logged(&log, meet(&together)));
    run(n("a") >> (m("b") | m("c"))).unwrap();
    assert_ne!(log.thread_of("b"), log.thread_of("c"));
}

#[test]
fn two_branches_really_run_at_once() {
    let together = Rendezvous::new(2);
    let out =
        run(n("a") >> (node("b", plain(meet(&together))) | node("c", plain(meet(&together)))));
    assert!(out.is_ok(), "{out:?}");
}

#[test]
fn three_branches_really_run_at_once() {
    let together = Rendezvous::new(3);
    let m = |id: &str| node(id, plain(meet(&together)));
    let out = run((m("b") | m("c") | m("d")) >> n("j"));
    assert_eq!(out.unwrap(), Value::text("j(b(x),c(x),d(x))"));
}

#[test]
fn a_branch_runs_ahead_of_its_siblings_instead_of_in_lockstep() {
    // Run level by level, `b3` (third in its branch) could never overlap `c` (first in its).
    let together = Rendezvous::new(2);
    let m = |id: &str| node(id, plain(meet(&together)));
    let out = run(n("a") >> ((n("b") >> n("b2") >> m("b3")) | m("c")) >> n("d"));
    assert!(out.is_ok(), "{out:?}");
}

#[test]
fn a_wave_inside_a_branch_runs_at_the_same_time_as_that_branchs_siblings() {
    let together = Rendezvous::new(3);
    let m = |id: &str| node(id, plain(meet(&together)));
    let out = run(n("a") >> ((n("b") >> (m("c") | m("d")) >> n("e")) | m("f")) >> n("g"));
    assert!(out.is_ok(), "{out:?}");
}

struct Never;

impl Watch for Never {
    fn interrupted(&self) -> bool {
        false
    }
}

#[test]
fn branches_run_at_once_under_a_watch_too() {
    let together = Rendezvous::new(2);
    let m = |id: &str| node(id, plain(meet(&together)));
    let (catalog, plan) = compiled(m("b") | m("c"));
    let out = Executor::new()
        .with_watch(Arc::new(Never))
        .run(&plan, &catalog, Value::Null);
    assert!(out.is_ok(), "{out:?}");
}

#[test]
fn the_diamond_gives_the_same_result_spread_out_as_in_a_row() {
    let (catalog, spread) = compiled(n("a") >> (n("b") | n("c")) >> n("d"));
    assert!(spread.to_string().contains("Wave"), "{spread}");
    let in_a_row = seq(vec![
        exec("a", &[]),
        exec("b", &["a"]),
        exec("c", &["a"]),
        exec("d", &["b", "c"]),
    ]);
    let executor = Executor::new();
    let out = executor.run(&spread, &catalog, Value::text("x")).unwrap();
    assert_eq!(
        out,
        executor.run(&in_a_row, &catalog, Value::text("x")).unwrap()
    );
    assert_eq!(out, Value::text("d(b(a(x)),c(a(x)))"));
}

#[test]
fn what_a_branch_produces_reaches_whoever_reads_it() {
    assert_eq!(
        run(n("a") >> ((n("b") >> n("b2")) | n("c")) >> n("j")).unwrap(),
        Value::text("j(b2(b(a(x))),c(a(x)))")
    );
    assert_eq!(
        run(n("a") >> ((n("b") >> (n("c") | n("d")) >> n("e")) | n("f")) >> n("g")).unwrap(),
        Value::text("g(e(c(b(a(x))),d(b(a(x)))),f(a(x)))")
    );
}

#[test]
fn a_branch_hands_on_the_very_value_it_produced_not_a_copy() {
    let made = Arc::new(Mutex::new(Value::Null));
    let keep = Arc::clone(&made);
    let produce = move |_: &Value| -> Result<Value, NodeError> {
        let value = Value::opaque(String::from("payload"));
        *keep.lock().unwrap() = value.clone();
        Ok(value)
    };
    let read = Arc::new(Mutex::new(Value::Null));
    let into = Arc::clone(&read);
    let join = move |input: &Value| -> Result<Value, NodeError> {
        *into.lock().unwrap() = input.get("b").cloned().unwrap_or(Value::Null);
        Ok(Value::Null)
    };
    run((n("a") | node("b", produce)) >> node("j", join)).unwrap();
    let made = made.lock().unwrap().clone();
    assert!(matches!(made, Value::Opaque(_)));
    assert_eq!(
        *read.lock().unwrap(),
        made,
        "an opaque value compares by identity"
    );
}

#[test]
fn a_wave_that_is_the_whole_plan_returns_the_map_of_its_leaves() {
    let (catalog, plan) = compiled(n("a") | (n("b") >> n("c")));
    assert_eq!(plan.kind(), "Wave");
    assert_eq!(
        Executor::new()
            .run(&plan, &catalog, Value::text("x"))
            .unwrap(),
        Value::map([("a", Value::text("a(x)")), ("c", Value::text("c(b(x))"))])
    );
}

#[test]
fn two_failing_branches_give_the_first_declared_ones_error_when_the_later_fails_first() {
    let first_failed = Gate::new();
    let (wait, gate) = (after(&first_failed), Arc::clone(&first_failed));
    let a = node(
        "a",
        plain(move |id, input| {
            wait(id, input)?;
            Err(NodeError::new("a failed"))
        }),
    );
    let b = node(
        "b",
        plain(move |_, _| {
            // The gate opens once this branch is over and its failure recorded.
            open_when_this_thread_ends(&gate);
            Err(NodeError::new("b failed"))
        }),
    );
    let out = run(a | b);
    assert_eq!(the_message(&out), Some(("a", "a failed")), "{out:?}");
}

#[test]
fn two_failing_branches_give_the_first_declared_ones_error_when_it_fails_first() {
    // Both meet first, so `b` is in flight — not merely cancelled — when `a` fails.
    let in_flight = Rendezvous::new(2);
    let first_failed = Gate::new();
    let (all_here, gate) = (meet(&in_flight), Arc::clone(&first_failed));
    let a = node(
        "a",
        plain(move |id, input| {
            all_here(id, input)?;
            gate.open();
            Err(NodeError::new("a failed"))
        }),
    );
    let (all_here, wait) = (meet(&in_flight), after(&first_failed));
    let b = node(
        "b",
        plain(move |id, input| {
            all_here(id, input)?;
            wait(id, input)?;
            Err(NodeError::new("b failed"))
        }),
    );
    let out = run(a | b);
    assert_eq!(the_message(&out), Some(("a", "a failed")), "{out:?}");
}

/// `(p1 >> p2) | f | (q1 >> q2)`: `p1`, `f` and `q1` first meet, so all three are in flight;
/// then `f` fails, and `p1` and `q1` return only once `f`'s branch is over — so the failure is
/// known at `p2`'s and `q2`'s boundaries.
fn a_failure_between_two_branches() -> (Arc<Log>, Result<Value, RunError>) {
    let log = Log::new();
    let in_flight = Rendezvous::new(3);
    let failed = Gate::new();
    let (all_here, gate) = (meet(&in_flight), Arc::clone(&failed));
    let f = node(
        "f",
        logged(&log, move |id, input| {
            all_here(id, input)?;
            open_when_this_thread_ends(&gate);
            Err(NodeError::new("f failed"))
        }),
    );
    let wait = |id: &str| {
        let (all_here, until_failed) = (meet(&in_flight), after(&failed));
        node(
            id,
            logged(&log, move |id, input| {
                all_here(id, input)?;
                until_failed(id, input)
            }),
        )
    };
    let expr = (wait("p1") >> node("p2", logged(&log, trace)))
        | f
        | (wait("q1") >> node("q2", logged(&log, trace)));
    let (catalog, plan) = compiled(expr);
    assert_eq!(
        plan.shape(),
        "Wave([Sequence([Execute, Execute]), Execute, Sequence([Execute, Execute])])"
    );
    let out = Executor::new().run(&plan, &catalog, Value::Null);
    (log, out)
}

#[test]
fn a_failing_branch_fails_the_wave_with_its_error() {
    let (_, out) = a_failure_between_two_branches();
    assert_eq!(the_message(&out), Some(("f", "f failed")), "{out:?}");
}

#[test]
fn a_branch_declared_after_a_failing_one_stops_at_its_next_node_boundary() {
    let (log, _) = a_failure_between_two_branches();
    assert!(log.finished("q1"), "the node in flight is not cut short");
    assert!(!log.ran("q2"));
}

#[test]
fn a_branch_declared_before_a_failing_one_runs_on_to_completion() {
    let (log, _) = a_failure_between_two_branches();
    assert!(log.finished("p1"));
    assert!(log.finished("p2"));
}

#[test]
fn a_failure_in_a_nested_wave_stops_the_later_branches_of_the_outer_one() {
    // `z | (a >> (b | f) >> c) | (q1 >> q2)`: `f` fails inside the middle branch's wave; `q1`
    // returns once that whole middle branch is over, its thread (where `a` ran) ended.
    let log = Log::new();
    let in_flight = Rendezvous::new(2);
    let over = Gate::new();
    let gate = Arc::clone(&over);
    let a = node(
        "a",
        logged(&log, move |id, input| {
            open_when_this_thread_ends(&gate);
            trace(id, input)
        }),
    );
    let all_here = meet(&in_flight);
    let f = node(
        "f",
        logged(&log, move |id, input| {
            all_here(id, input)?;
            Err(NodeError::new("f failed"))
        }),
    );
    let (all_here, until_over) = (meet(&in_flight), after(&over));
    let q1 = node(
        "q1",
        logged(&log, move |id, input| {
            all_here(id, input)?;
            until_over(id, input)
        }),
    );
    let l = |id: &str| node(id, logged(&log, trace));
    let out = run(l("z") | (a >> (l("b") | f) >> l("c")) | (q1 >> l("q2")));
    assert_eq!(the_message(&out), Some(("f", "f failed")), "{out:?}");
    assert!(log.finished("q1"));
    assert!(!log.ran("c") && !log.ran("q2"));
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload.downcast_ref::<&str>().copied()
}

#[test]
fn a_panic_inside_a_branch_is_not_swallowed() {
    // One wave panics on the calling thread (first branch), the other on a spawned one.
    let boom = || {
        node("boom", |_: &Value| -> Result<Value, NodeError> {
            panic!("boom")
        })
    };
    for expr in [boom() | n("y"), n("y") | boom()] {
        let (catalog, plan) = compiled(expr);
        let executor = Executor::new();
        let caught = panic::catch_unwind(AssertUnwindSafe(|| {
            executor.run(&plan, &catalog, Value::Null)
        }));
        let payload = caught.expect_err("the panic reaches the caller");
        assert_eq!(payload_text(&*payload), Some("boom"));
    }
}

#[test]
fn a_panic_leaves_the_run_only_after_the_other_branches_were_joined() {
    // `y` meets `boom` first, so it is in flight — not merely cancelled — when `boom` panics,
    // and it can only finish once that panic is unwinding.
    let log = Log::new();
    let in_flight = Rendezvous::new(2);
    let unwinding = Gate::new();
    let (together, gate) = (Arc::clone(&in_flight), Arc::clone(&unwinding));
    let boom = node("boom", move |_: &Value| -> Result<Value, NodeError> {
        let _opens_while_unwinding = OpenOnDrop(Arc::clone(&gate));
        assert!(together.meet(), "`y` never came");
        panic!("boom")
    });
    let (all_here, until_unwinding) = (meet(&in_flight), after(&unwinding));
    let y = node(
        "y",
        logged(&log, move |id, input| {
            all_here(id, input)?;
            until_unwinding(id, input)
        }),
    );
    let (catalog, plan) = compiled(boom | y);
    let executor = Executor::new();
    let caught = panic::catch_unwind(AssertUnwindSafe(|| {
        executor.run(&plan, &catalog, Value::Null)
    }));
    let payload = caught.expect_err("the panic reaches the caller");
    assert_eq!(payload_text(&*payload), Some("boom"));
    assert!(
        log.finished("y"),
        "the panic left while `y` was still in flight"
    );
}

/// Awaits once, asking for its input, and answers what the driver gave back.
struct AwaitOnce;

impl Node for AwaitOnce {
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        match ctx.results() {
            [] => Ok(Transition::Await(vec![input.clone()])),
            [answer, ..] => Ok(Transition::Done(answer.clone())),
        }
    }
}

/// Serves a request only once another request is being served at the same time.
struct BusyDriver(Arc<Rendezvous>);

impl Driver for BusyDriver {
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError> {
        if self.0.meet() {
            Ok(requests.iter().map(|r| traced("served", r)).collect())
        } else {
            Err(DriverError::new("served alone until the deadline"))
        }
    }
}

#[test]
fn two_branches_keep_one_driver_busy_at_the_same_time() {
    let (catalog, plan) = compiled(node("a", AwaitOnce) | node("b", AwaitOnce));
    let driver = Arc::new(BusyDriver(Rendezvous::new(2)));
    let out = Executor::new()
        .with_driver(driver.clone())
        .run(&plan, &catalog, Value::text("x"));
    assert_eq!(
        out.unwrap(),
        Value::map([
            ("a", Value::text("served(x)")),
            ("b", Value::text("served(x)"))
        ])
    );
}

struct Flag(AtomicBool);

impl Watch for Flag {
    fn interrupted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn an_interruption_stops_every_branch_of_a_wave_at_its_next_node_boundary() {
    let log = Log::new();
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let in_flight = Rendezvous::new(2);
    let raised = Gate::new();
    let (all_here, flag, gate) = (meet(&in_flight), Arc::clone(&watch), Arc::clone(&raised));
    let x1 = node(
        "x1",
        logged(&log, move |id, input| {
            all_here(id, input)?;
            flag.0.store(true, Ordering::SeqCst);
            gate.open();
            trace(id, input)
        }),
    );
    let (all_here, until_raised) = (meet(&in_flight), after(&raised));
    let y1 = node(
        "y1",
        logged(&log, move |id, input| {
            all_here(id, input)?;
            until_raised(id, input)
        }),
    );
    let l = |id: &str| node(id, logged(&log, trace));
    let (catalog, plan) = compiled((x1 >> l("x2")) | (y1 >> l("y2")));
    let out = Executor::new()
        .with_watch(watch.clone())
        .run(&plan, &catalog, Value::Null);
    assert!(matches!(out, Err(RunError::Interrupted)), "{out:?}");
    assert!(log.finished("x1") && log.finished("y1"));
    assert!(!log.ran("x2") && !log.ran("y2"));
}

#[test]
fn a_failure_before_a_wave_launches_none_of_its_branches() {
    let log = Log::new();
    let l = |id: &str| node(id, logged(&log, trace));
    let out = run(node("a", logged(&log, fail("a failed"))) >> (l("b") | l("c")));
    assert_eq!(the_message(&out), Some(("a", "a failed")));
    assert!(!log.ran("b") && !log.ran("c"));
}

/// `(p1 >> p2) | w | (q1 >> q2)` as [`a_failure_between_two_branches`] makes it, but `w` waits
/// for an answer ([`NodeError::suspending`]) rather than failing.
fn a_wait_between_two_branches() -> (Arc<Log>, Result<Value, RunError>) {
    let log = Log::new();
    let in_flight = Rendezvous::new(3);
    let waited = Gate::new();
    let (all_here, gate) = (meet(&in_flight), Arc::clone(&waited));
    let w = node(
        "w",
        logged(&log, move |id, input| {
            all_here(id, input)?;
            open_when_this_thread_ends(&gate);
            Err(NodeError::suspending(std::io::Error::other(
                "which colour?",
            )))
        }),
    );
    let wait = |id: &str| {
        let (all_here, until_waited) = (meet(&in_flight), after(&waited));
        node(
            id,
            logged(&log, move |id, input| {
                all_here(id, input)?;
                until_waited(id, input)
            }),
        )
    };
    let expr = (wait("p1") >> node("p2", logged(&log, trace)))
        | w
        | (wait("q1") >> node("q2", logged(&log, trace)));
    let (catalog, plan) = compiled(expr);
    let out = Executor::new().run(&plan, &catalog, Value::Null);
    (log, out)
}

#[test]
fn a_branch_that_waits_for_an_answer_leaves_every_other_branch_to_run_to_completion() {
    let (log, out) = a_wait_between_two_branches();
    for id in ["p1", "p2", "q1", "q2"] {
        assert!(
            log.finished(id),
            "`{id}` was stopped by a sibling that only waits"
        );
    }
    assert!(
        matches!(&out, Err(error) if error.suspends()),
        "the run pauses: {out:?}"
    );
    assert_eq!(the_message(&out), Some(("w", "which colour?")), "{out:?}");
}

#[test]
fn a_later_branchs_failure_comes_out_before_an_earlier_branchs_wait() {
    let answered = Gate::new();
    let (wait, gate) = (after(&answered), Arc::clone(&answered));
    let asks = node(
        "asks",
        plain(move |_, _| {
            // The later branch fails only once this one has asked.
            gate.open();
            Err(NodeError::suspending(std::io::Error::other("go on?")))
        }),
    );
    let fails = node(
        "fails",
        plain(move |id, input| {
            wait(id, input)?;
            Err(NodeError::new("fails failed"))
        }),
    );
    let out = run(asks | fails);
    assert_eq!(
        the_message(&out),
        Some(("fails", "fails failed")),
        "{out:?}"
    );
    assert!(!out.is_err_and(|error| error.suspends()));
}
