//! The thread in reserve: taken by the first wave that needs a thread, instead of one started in
//! the middle of its run, and refilled by a crew thread with nothing else to do.
//!
//! A binary of its own: the reserve is one per process, and the questionnaire's other tests,
//! running at the same time, would take it. Here the tests take turns.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};
use std::time::Instant;

use soma_core::{
    compile, keep_a_thread_in_reserve, node_arc, thread_in_reserve, Executor, Expr, NodeError,
    Program, RunError, Value,
};

#[allow(dead_code)] // Shared with the questionnaire, which uses more of it.
#[path = "it/support.rs"]
mod support;

use support::{meet, plain, trace, Rendezvous, DEADLINE};

/// The reserve is the process's: one test at a time uses it.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The thread in reserve, once one waits there; `keep_a_thread_in_reserve` was called.
fn in_reserve() -> ThreadId {
    let start = Instant::now();
    loop {
        if let Some(thread) = thread_in_reserve() {
            return thread;
        }
        assert!(start.elapsed() < DEADLINE, "no thread came to the reserve");
        thread::yield_now();
    }
}

/// The thread in reserve, asked for.
fn reserved() -> ThreadId {
    keep_a_thread_in_reserve().expect("a thread for the reserve");
    in_reserve()
}

/// Runs a fresh [`meeting_pair`] whose threads get a stack of `stack` bytes; the thread that
/// ran its branch off the calling thread, and the program.
fn run_meeting_pair(stack: usize) -> (ThreadId, Program) {
    let threads = Arc::default();
    let program = meeting_pair(&threads);
    program.set_thread_stack(stack);
    Executor::new().run_program(&program, Value::Null).unwrap();
    (helper(&threads), program)
}

/// `a | b`, two branches that meet before either answers, each recording its thread.
fn meeting_pair(threads: &Arc<Mutex<Vec<ThreadId>>>) -> Program {
    let both = Rendezvous::new(2);
    let branch = |id: &str| -> Expr {
        let threads = Arc::clone(threads);
        let meet = meet(&both);
        node_arc(
            id,
            Arc::new(plain(move |node, input| -> Result<Value, NodeError> {
                threads.lock().unwrap().push(thread::current().id());
                meet(node, input)
            })),
        )
    };
    let (graph, catalog) = (branch("a") | branch("b")).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    Program::new(&plan, &catalog).unwrap()
}

/// The thread that ran a branch of `threads` other than the calling one.
fn helper(threads: &Mutex<Vec<ThreadId>>) -> ThreadId {
    let me = thread::current().id();
    let others: Vec<ThreadId> = threads
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|&t| t != me)
        .collect();
    assert_eq!(others.len(), 1, "one branch ran off the calling thread");
    others[0]
}

#[test]
fn the_first_wave_that_needs_a_thread_takes_the_one_in_reserve() {
    let _turn = one_at_a_time();
    let waiting = reserved();
    let (helper, program) = run_meeting_pair(0);
    assert_eq!(helper, waiting);
    assert_eq!(program.threads(), 1);
}

#[test]
fn a_crew_thread_with_nothing_left_to_do_refills_the_reserve() {
    let _turn = one_at_a_time();
    let taken = reserved();
    let (helper, _program) = run_meeting_pair(0);
    assert_eq!(helper, taken);
    assert_ne!(in_reserve(), taken, "the taken thread is the program's now");
}

#[test]
fn a_crew_whose_threads_need_a_larger_stack_starts_its_own() {
    let _turn = one_at_a_time();
    let waiting = reserved();
    let (helper, _program) = run_meeting_pair(64 << 20);
    assert_ne!(helper, waiting);
    assert_eq!(
        thread_in_reserve(),
        Some(waiting),
        "the reserve was left alone"
    );
}

#[test]
fn a_refused_thread_is_still_a_run_error_with_a_thread_in_reserve() {
    let _turn = one_at_a_time();
    let waiting = reserved();
    let quick = node_arc("a", Arc::new(plain(trace))) | node_arc("b", Arc::new(plain(trace)));
    let (graph, catalog) = quick.somatize().unwrap();
    let program = Program::new(&compile(&graph, &catalog).unwrap(), &catalog).unwrap();
    program.refuse_next_threads(1);
    let error = Executor::new()
        .run_program(&program, Value::Null)
        .unwrap_err();
    assert!(matches!(&error, RunError::NoThread { .. }), "{error:?}");
    assert_eq!(
        thread_in_reserve(),
        Some(waiting),
        "a refused run takes nothing"
    );
}
