//! Per-node policies: retries (how many, which failures, the pauses between, the error that
//! says how many attempts were made) and time limits (a call past its limit fails naming its
//! node, and can be retried), each attempt traced, inside waves and under a run's deadline.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use soma_core::{
    compile, node_arc, Clock, Executor, Expr, NodeError, Placement, Policies, Program, Retry,
    RunError, Trace, Value, Watch, MAX_BACKOFF,
};

use crate::support::{after, plain, trace, Gate, DEADLINE};

/// A clock that pauses not at all and records each pause asked of it, with a fixed jitter.
pub(crate) struct Recorded {
    pauses: Mutex<Vec<Duration>>,
    jitter: f64,
}

impl Recorded {
    pub(crate) fn new(jitter: f64) -> Arc<Self> {
        Arc::new(Recorded {
            pauses: Mutex::new(Vec::new()),
            jitter,
        })
    }

    pub(crate) fn pauses(&self) -> Vec<Duration> {
        self.pauses.lock().unwrap().clone()
    }
}

impl Clock for Recorded {
    fn pause(&self, pause: Duration, _stop: &dyn Fn() -> bool) -> bool {
        self.pauses.lock().unwrap().push(pause);
        true
    }

    fn jitter(&self) -> f64 {
        self.jitter
    }
}

/// A node that fails its first `failures` calls, counting every call.
fn flaky(id: &str, failures: u32, calls: &Arc<AtomicU32>) -> Expr {
    let calls = Arc::clone(calls);
    node_arc(
        id,
        Arc::new(plain(move |id, input| {
            let call = calls.fetch_add(1, Ordering::SeqCst);
            if call < failures {
                Err(NodeError::new(format!("call {call} failed")))
            } else {
                trace(id, input)
            }
        })),
    )
}

/// Runs `expr` on 1 with `policies`, through `executor`.
fn run_with(
    expr: Expr,
    policies: &Policies,
    executor: &Executor,
) -> Result<Value, soma_core::RunError> {
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let program = Program::resolved(&plan, &catalog, &Placement::default(), policies).unwrap();
    executor.run_program(&program, Value::Int(1))
}

fn retrying(node: &str, retry: Retry) -> Policies {
    let mut policies = Policies::default();
    policies.set_retry(node, Some(retry));
    policies
}

/// Runs `work` on a thread of its own and waits for it until [`DEADLINE`]: a hang fails.
pub(crate) fn within_deadline<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        let _ = sender.send(work());
    });
    receiver
        .recv_timeout(DEADLINE)
        .expect("the run hung past the test's deadline")
}

#[test]
fn a_failing_call_is_retried_until_it_succeeds_within_its_retries() {
    let calls = Arc::new(AtomicU32::new(0));
    let clock = Recorded::new(0.0);
    let retry = Retry::new(3, Duration::from_millis(500)).with_clock(clock.clone());
    let out = run_with(
        flaky("a", 2, &calls),
        &retrying("a", retry),
        &Executor::new(),
    );
    assert_eq!(out.unwrap(), Value::text("a(1)"));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn a_call_failing_every_attempt_reports_the_attempts_and_the_last_error() {
    let calls = Arc::new(AtomicU32::new(0));
    let retry = Retry::new(2, Duration::ZERO).with_clock(Recorded::new(0.0));
    let error = run_with(
        flaky("a", u32::MAX, &calls),
        &retrying("a", retry),
        &Executor::new(),
    )
    .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let RunError::Retried { attempts, last } = &error else {
        panic!("not a retried error: {error:?}");
    };
    assert_eq!(*attempts, 3);
    assert!(last.to_string().contains("call 2 failed"), "{last}");
    assert_eq!(error.node().map(ToString::to_string).as_deref(), Some("a"));
    assert!(error.to_string().contains("3 attempts"), "{error}");
}

#[test]
fn only_the_failures_a_retry_accepts_are_retried() {
    let calls = Arc::new(AtomicU32::new(0));
    let retry = Retry::new(5, Duration::ZERO)
        .with_clock(Recorded::new(0.0))
        .only(Arc::new(|error| error.to_string().contains("never")));
    let error = run_with(
        flaky("a", u32::MAX, &calls),
        &retrying("a", retry),
        &Executor::new(),
    )
    .unwrap_err();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(matches!(error, RunError::NodeFailed { .. }), "{error:?}");
}

#[test]
fn pauses_start_at_the_backoff_and_double_each_retry_up_to_the_maximum() {
    let calls = Arc::new(AtomicU32::new(0));
    let clock = Recorded::new(0.0);
    let retry = Retry::new(10, Duration::from_secs(1)).with_clock(clock.clone());
    run_with(
        flaky("a", 10, &calls),
        &retrying("a", retry),
        &Executor::new(),
    )
    .unwrap();
    let seconds: Vec<u64> = clock.pauses().iter().map(Duration::as_secs).collect();
    assert_eq!(seconds, [1, 2, 4, 8, 16, 32, 64, 128, 128, 128]);
    assert_eq!(MAX_BACKOFF, Duration::from_secs(128));
}

#[test]
fn a_first_backoff_past_the_longest_pause_is_the_longest_pause() {
    // Past the maximum at once, and so far past it that doubling it overflows a `Duration`.
    for backoff in [MAX_BACKOFF + Duration::from_secs(1), Duration::MAX] {
        let calls = Arc::new(AtomicU32::new(0));
        let clock = Recorded::new(0.0);
        let retry = Retry::new(3, backoff).with_clock(clock.clone());
        run_with(
            flaky("a", 3, &calls),
            &retrying("a", retry),
            &Executor::new(),
        )
        .unwrap();
        assert_eq!(clock.pauses(), [MAX_BACKOFF; 3], "backoff {backoff:?}");
    }
}

#[test]
fn jitter_lengthens_a_pause_by_up_to_a_quarter() {
    let calls = Arc::new(AtomicU32::new(0));
    let clock = Recorded::new(1.0);
    let retry = Retry::new(2, Duration::from_millis(400)).with_clock(clock.clone());
    run_with(
        flaky("a", 2, &calls),
        &retrying("a", retry),
        &Executor::new(),
    )
    .unwrap();
    assert_eq!(
        clock.pauses(),
        [Duration::from_millis(500), Duration::from_secs(1)]
    );
}

#[test]
fn the_machines_jitter_is_a_fraction_below_one() {
    let jitters: Vec<f64> = (0..100).map(|_| soma_core::SystemClock.jitter()).collect();
    assert!(
        jitters.iter().all(|j| (0.0..1.0).contains(j)),
        "{jitters:?}"
    );
    assert!(jitters
        .windows(2)
        .any(|pair| (pair[0] - pair[1]).abs() > f64::EPSILON));
}

/// A watch that says stop once its flag is set.
struct Flag(Arc<AtomicBool>);

impl Watch for Flag {
    fn interrupted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn a_pause_between_attempts_ends_when_the_watch_stops_the_run() {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    // The node fails and asks the run to stop: the hour-long pause that follows must end.
    let expr = node_arc(
        "a",
        Arc::new(plain(move |_, _| {
            flag.store(true, Ordering::SeqCst);
            Err(NodeError::new("down"))
        })),
    );
    let error = within_deadline(move || {
        run_with(
            expr,
            &retrying("a", Retry::new(3, Duration::from_secs(3600))),
            &Executor::new().with_watch(Arc::new(Flag(stop))),
        )
    })
    .unwrap_err();
    assert!(matches!(error, RunError::Interrupted), "{error:?}");
}

fn time_limited(node: &str, limit: Duration) -> Policies {
    let mut policies = Policies::default();
    policies.set_time_limit(node, Some(limit));
    policies
}

#[test]
fn a_call_past_its_time_limit_fails_naming_the_node_and_its_thread_finishes_later() {
    let gate = Gate::new();
    let finished = Arc::new(AtomicBool::new(false));
    let (body, done) = (after(&gate), Arc::clone(&finished));
    let expr = node_arc(
        "slow",
        Arc::new(plain(move |id, input| {
            let out = body(id, input);
            done.store(true, Ordering::SeqCst);
            out
        })),
    );
    let error = within_deadline(move || {
        run_with(
            expr,
            &time_limited("slow", Duration::from_millis(50)),
            &Executor::new(),
        )
    })
    .unwrap_err();
    let RunError::TimeLimit { node, limit } = &error else {
        panic!("not a time limit: {error:?}");
    };
    assert_eq!(node.as_str(), "slow");
    assert_eq!(*limit, Duration::from_millis(50));
    assert!(
        error.to_string().contains("`slow` ran past its time limit"),
        "{error}"
    );
    // Left running, not killed: it finishes once what it waits for comes.
    assert!(!finished.load(Ordering::SeqCst));
    gate.open();
    let start = Instant::now();
    while !finished.load(Ordering::SeqCst) && start.elapsed() < DEADLINE {
        thread::yield_now();
    }
    assert!(finished.load(Ordering::SeqCst));
}

#[test]
fn a_call_within_its_time_limit_returns_its_value() {
    let out = run_with(
        node_arc("a", Arc::new(plain(trace))) >> node_arc("b", Arc::new(plain(trace))),
        &time_limited("a", Duration::from_secs(60)),
        &Executor::new(),
    );
    assert_eq!(out.unwrap(), Value::text("b(a(1))"));
}

#[test]
fn a_call_past_its_time_limit_is_retried_and_the_retry_can_succeed() {
    let gate = Gate::new();
    let calls = Arc::new(AtomicU32::new(0));
    let (body, counted) = (after(&gate), Arc::clone(&calls));
    let expr = node_arc(
        "a",
        Arc::new(plain(move |id, input| {
            if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                body(id, input) // The first call waits past the limit.
            } else {
                trace(id, input)
            }
        })),
    );
    let mut policies = time_limited("a", Duration::from_millis(50));
    policies.set_retry(
        "a",
        Some(Retry::new(1, Duration::ZERO).with_clock(Recorded::new(0.0))),
    );
    let out = within_deadline(move || run_with(expr, &policies, &Executor::new()));
    gate.open();
    assert_eq!(out.unwrap(), Value::text("a(1)"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[test]
fn each_attempt_is_a_span_of_its_own() {
    let calls = Arc::new(AtomicU32::new(0));
    let retry = Retry::new(3, Duration::ZERO).with_clock(Recorded::new(0.0));
    let trace = Arc::new(Trace::new());
    run_with(
        flaky("a", 2, &calls),
        &retrying("a", retry),
        &Executor::new().with_trace(Arc::clone(&trace)),
    )
    .unwrap();
    let spans = trace.spans();
    assert_eq!(spans.len(), 3);
    assert!(spans.iter().all(|span| span.node == "a"));
    let failed: Vec<bool> = spans.iter().map(|span| span.error.is_some()).collect();
    assert_eq!(failed, [true, true, false]);
}

#[test]
fn in_a_wave_the_first_declared_branchs_error_wins_over_a_retried_later_one() {
    let (first, second) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let expr = flaky("b", u32::MAX, &first) | flaky("c", u32::MAX, &second);
    let mut policies = Policies::default();
    for node in ["b", "c"] {
        policies.set_retry(
            node,
            Some(Retry::new(2, Duration::ZERO).with_clock(Recorded::new(0.0))),
        );
    }
    let error = run_with(expr, &policies, &Executor::new()).unwrap_err();
    assert_eq!(error.node().map(ToString::to_string).as_deref(), Some("b"));
    assert!(matches!(error, RunError::Retried { attempts: 3, .. }));
}

#[test]
fn a_time_limited_call_under_a_run_deadline_still_ends_by_the_deadline() {
    let gate = Gate::new();
    let expr = node_arc("stuck", Arc::new(plain(after(&gate))));
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let program = Arc::new(
        Program::resolved(
            &plan,
            &catalog,
            &Placement::default(),
            &time_limited("stuck", Duration::from_secs(3600)),
        )
        .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_millis(100);
    let error = within_deadline(move || {
        Executor::new()
            .with_watch(Arc::new(Deadline(deadline)))
            .run_detachable(&program, Value::Int(1))
    })
    .unwrap_err();
    gate.open();
    // Named as still running, as a node running past the deadline itself would be.
    let RunError::Abandoned { running } = &error else {
        panic!("not given up on: {error:?}");
    };
    assert_eq!(running, &["stuck"]);
}

/// A watch with a deadline, as a caller's `forward(timeout=…)` has.
struct Deadline(Instant);

impl Watch for Deadline {
    fn interrupted(&self) -> bool {
        Instant::now() >= self.0
    }

    fn deadline(&self) -> Option<Instant> {
        Some(self.0)
    }
}

#[test]
fn policies_change_nothing_when_they_are_removed() {
    let mut policies = retrying("a", Retry::new(1, Duration::ZERO));
    policies.set_time_limit("a", Some(Duration::from_secs(1)));
    policies.set_retry("a", None);
    assert!(!policies.is_empty());
    policies.set_time_limit("a", None);
    assert!(policies.is_empty());
}

#[test]
fn a_later_branch_waiting_on_a_time_limited_call_stops_when_an_earlier_one_fails() {
    // The first branch fails only once the second's call is under way, so the second is
    // waiting on its call, not between nodes, when it learns of it.
    let (gate, started) = (Gate::new(), Gate::new());
    let (waits_for, opens) = (Arc::clone(&started), Arc::clone(&started));
    let stuck_body = after(&gate);
    let expr = node_arc(
        "fails",
        Arc::new(plain(move |_, _| {
            assert!(waits_for.wait(), "the second branch's call never started");
            Err(NodeError::new("first"))
        })),
    ) | node_arc(
        "stuck",
        Arc::new(plain(move |id, input| {
            opens.open();
            stuck_body(id, input)
        })),
    );
    let error = within_deadline(move || {
        run_with(
            expr,
            &time_limited("stuck", Duration::from_secs(3600)),
            &Executor::new(),
        )
    })
    .unwrap_err();
    gate.open();
    assert_eq!(
        error.node().map(ToString::to_string).as_deref(),
        Some("fails")
    );
}

#[test]
fn a_later_branch_pausing_between_attempts_stops_when_an_earlier_one_fails() {
    let started = Gate::new();
    let (waits_for, opens) = (Arc::clone(&started), Arc::clone(&started));
    let expr = node_arc(
        "fails",
        Arc::new(plain(move |_, _| {
            assert!(waits_for.wait(), "the second branch never failed");
            Err(NodeError::new("first"))
        })),
    ) | node_arc(
        "flaky",
        Arc::new(plain(move |_, _| {
            opens.open();
            Err(NodeError::new("again"))
        })),
    );
    // An hour's pause on the machine's clock: only the earlier branch's failure can end it.
    let policies = retrying("flaky", Retry::new(3, Duration::from_secs(3600)));
    let error = within_deadline(move || run_with(expr, &policies, &Executor::new())).unwrap_err();
    assert_eq!(
        error.node().map(ToString::to_string).as_deref(),
        Some("fails")
    );
}
