//! A detachable run: when its watch asks it to stop, the caller stops waiting for branches that
//! do not stop, reports the nodes it left running, and what those branches borrow lives until
//! the last of them finishes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use soma_core::{compile, node, Executor, Expr, NodeError, Program, RunError, Value, Watch};

use crate::support::{after, meet, n, plain, Gate, Rendezvous};

/// A watch the test raises by hand, or a node raises from inside the run.
struct Flag(AtomicBool);

impl Watch for Flag {
    fn interrupted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Opens its gate when the run lets go of it: how a test sees what the run left being freed.
struct OpensWhenFreed(Arc<Gate>);

impl Drop for OpensWhenFreed {
    fn drop(&mut self) {
        self.0.open();
    }
}

fn program(expr: Expr) -> Arc<Program> {
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    Arc::new(Program::new(&plan, &catalog).unwrap())
}

/// A node that meets the others at `all_in`, raises the watch and fails.
fn stops_the_run(id: &str, all_in: &Arc<Rendezvous>, watch: &Arc<Flag>) -> Expr {
    let (all_in, watch) = (meet(all_in), Arc::clone(watch));
    node(
        id,
        plain(move |id, input| {
            all_in(id, input)?;
            watch.0.store(true, Ordering::SeqCst);
            Err(NodeError::new("stopping"))
        }),
    )
}

/// A node that meets the others at `all_in`, then waits for `gate`.
fn stuck(id: &str, all_in: &Arc<Rendezvous>, gate: &Arc<Gate>) -> Expr {
    let (all_in, until_open) = (meet(all_in), after(gate));
    node(
        id,
        plain(move |id, input| {
            all_in(id, input)?;
            until_open(id, input)
        }),
    )
}

#[test]
fn a_detachable_run_nobody_stops_returns_what_an_ordinary_run_returns() {
    let program = program(n("a") >> ((n("b") >> n("c")) | n("d")) >> n("e"));
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let executor = Executor::new().with_watch(watch);
    for _ in 0..100 {
        assert_eq!(
            executor.run_detachable(&program, Value::text("x")).unwrap(),
            executor.run_program(&program, Value::text("x")).unwrap()
        );
    }
}

#[test]
fn a_stopped_run_stops_waiting_for_a_branch_that_does_not_stop_and_names_its_node() {
    let (all_in, gate) = (Rendezvous::new(2), Gate::new());
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let program =
        program(n("a") >> (stops_the_run("f", &all_in, &watch) | stuck("stuck", &all_in, &gate)));
    let out = Executor::new()
        .with_watch(Arc::clone(&watch) as Arc<dyn Watch>)
        .run_detachable(&program, Value::Null);
    let Err(RunError::Abandoned { running }) = &out else {
        panic!("{out:?}");
    };
    assert_eq!(running, &["stuck"]);
    gate.open();
}

#[test]
fn what_a_given_up_run_lent_its_branches_is_freed_once_the_last_of_them_finishes() {
    let (all_in, gate, freed) = (Rendezvous::new(2), Gate::new(), Gate::new());
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let program = program(stops_the_run("f", &all_in, &watch) | stuck("stuck", &all_in, &gate));
    let input = Value::opaque(OpensWhenFreed(Arc::clone(&freed)));
    let out = Executor::new()
        .with_watch(Arc::clone(&watch) as Arc<dyn Watch>)
        .run_detachable(&program, input);
    assert!(matches!(out, Err(RunError::Abandoned { .. })), "{out:?}");
    // The branch left running still reads the run's input; only when it finishes may it go.
    assert!(!freed.is_open());
    gate.open();
    assert!(
        freed.wait(),
        "the input was never freed after the last branch finished"
    );
}

#[test]
fn a_caller_that_gives_up_inside_a_nested_wave_gives_up_on_the_waves_around_it_too() {
    let (all_in, inner, outer) = (Rendezvous::new(3), Gate::new(), Gate::new());
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let program = program(
        (n("x") >> (stops_the_run("f", &all_in, &watch) | stuck("inner", &all_in, &inner)))
            | stuck("outer", &all_in, &outer),
    );
    let out = Executor::new()
        .with_watch(Arc::clone(&watch) as Arc<dyn Watch>)
        .run_detachable(&program, Value::Null);
    let Err(RunError::Abandoned { running }) = &out else {
        panic!("{out:?}");
    };
    let mut running: Vec<&str> = running.iter().map(soma_core::NodeId::as_str).collect();
    running.sort_unstable();
    assert_eq!(running, ["inner", "outer"]);
    inner.open();
    outer.open();
}

#[test]
fn a_program_runs_again_while_a_branch_of_a_run_it_gave_up_on_still_runs() {
    let (all_in, gate) = (Rendezvous::new(2), Gate::new());
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let program = program(stops_the_run("f", &all_in, &watch) | stuck("stuck", &all_in, &gate));
    let out = Executor::new()
        .with_watch(Arc::clone(&watch) as Arc<dyn Watch>)
        .run_detachable(&program, Value::Null);
    assert!(matches!(out, Err(RunError::Abandoned { .. })), "{out:?}");
    // A second run of the same program: its own branches, on threads of their own, meet.
    let again = Arc::new(Flag(AtomicBool::new(false)));
    let second = std::thread::spawn({
        let program = Arc::clone(&program);
        move || {
            Executor::new()
                .with_watch(again)
                .run_detachable(&program, Value::Null)
        }
    });
    // Its `f` fails only after meeting its `stuck`, which the open gate lets through.
    gate.open();
    let second = second.join().unwrap();
    assert!(
        matches!(&second, Err(RunError::NodeFailed { node, .. }) if node.as_str() == "f"),
        "{second:?}"
    );
}

#[test]
fn a_caller_gives_up_on_a_wave_nested_deeper_than_one_stack_holds() {
    // Three hundred waves, one inside another's first branch: past a couple of hundred the walk
    // moves to a fresh stack, and the caller waits for that thread instead of a wave.
    let (all_in, gate, freed) = (Rendezvous::new(2), Gate::new(), Gate::new());
    let watch = Arc::new(Flag(AtomicBool::new(false)));
    let mut expr = stops_the_run("f", &all_in, &watch) | stuck("stuck", &all_in, &gate);
    for level in 0..300 {
        expr = (expr >> n(&format!("after{level}"))) | n(&format!("beside{level}"));
    }
    let program = program(expr);
    let input = Value::opaque(OpensWhenFreed(Arc::clone(&freed)));
    let out = Executor::new()
        .with_watch(Arc::clone(&watch) as Arc<dyn Watch>)
        .run_detachable(&program, input);
    let Err(RunError::Abandoned { running }) = &out else {
        panic!("{out:?}");
    };
    assert_eq!(running, &["stuck"]);
    gate.open();
    assert!(
        freed.wait(),
        "the input was never freed after the last branch finished"
    );
}

/// A watch with a deadline: says stop once it has passed, as a caller's `forward(timeout=…)`
/// does.
struct Deadline(std::time::Instant);

impl Watch for Deadline {
    fn interrupted(&self) -> bool {
        std::time::Instant::now() >= self.0
    }

    fn deadline(&self) -> Option<std::time::Instant> {
        Some(self.0)
    }
}

fn deadline_in(millis: u64) -> Arc<dyn Watch> {
    Arc::new(Deadline(
        std::time::Instant::now() + std::time::Duration::from_millis(millis),
    ))
}

/// A node that records the thread it ran on.
fn records_its_thread(
    id: &str,
    threads: &Arc<std::sync::Mutex<Vec<std::thread::ThreadId>>>,
) -> Expr {
    let threads = Arc::clone(threads);
    node(
        id,
        plain(move |id, input| {
            threads.lock().unwrap().push(std::thread::current().id());
            crate::support::trace(id, input)
        }),
    )
}

#[test]
fn a_run_with_a_deadline_runs_no_node_on_its_callers_thread() {
    let threads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let program = program(
        records_its_thread("a", &threads)
            >> (records_its_thread("b", &threads) | records_its_thread("c", &threads))
            >> records_its_thread("d", &threads),
    );
    let expected = Executor::new().run_program(&program, Value::text("x"));
    threads.lock().unwrap().clear();
    let out = Executor::new()
        .with_watch(deadline_in(60_000))
        .run_detachable(&program, Value::text("x"));
    assert_eq!(out.unwrap(), expected.unwrap());
    let ran_on = threads.lock().unwrap();
    assert_eq!(ran_on.len(), 4);
    assert!(
        !ran_on.contains(&std::thread::current().id()),
        "a node ran on the caller's thread, where it could not be left behind"
    );
}

#[test]
fn a_run_with_a_deadline_returns_by_it_when_its_only_node_never_does() {
    let gate = Gate::new();
    let program = program(node("stuck", plain(after(&gate))));
    let out = Executor::new()
        .with_watch(deadline_in(50))
        .run_detachable(&program, Value::Null);
    let Err(RunError::Abandoned { running }) = &out else {
        panic!("{out:?}");
    };
    assert_eq!(running, &["stuck"]);
    gate.open();
}

#[test]
fn a_run_that_ends_past_its_deadline_is_not_a_success() {
    // The only node returns 5 ms past the deadline: within the caller's grace, so the run ends
    // on its own, late.
    let program = program(node(
        "late",
        plain(|id, input| {
            std::thread::sleep(std::time::Duration::from_millis(25));
            crate::support::trace(id, input)
        }),
    ));
    let out = Executor::new()
        .with_watch(deadline_in(20))
        .run_detachable(&program, Value::Null);
    assert!(
        matches!(
            out,
            Err(RunError::PastDeadline | RunError::Abandoned { .. })
        ),
        "{out:?}"
    );
}
