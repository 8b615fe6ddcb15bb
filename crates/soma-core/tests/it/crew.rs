//! A program's standing threads: each branch keeps one from run to run, and no thread — nor what
//! it keeps in thread-local storage — ever passes from one branch to another.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::{self, ThreadId};

use soma_core::{compile, node_arc, Catalog, Executor, Expr, NodeError, Plan, Program, Value};

use crate::support::{meet, open_when_this_thread_ends, plain, trace, Gate, Rendezvous, DEADLINE};

thread_local! {
    static LEFT_BEHIND: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// For each node, in run order: the thread it ran on and what it found in `LEFT_BEHIND`.
type Sightings = Arc<Mutex<Vec<(String, ThreadId, Option<&'static str>)>>>;

/// A node that records where it ran and what it found, then leaves its own mark behind.
fn marking(id: &'static str, seen: &Sightings) -> Expr {
    let seen = Arc::clone(seen);
    node_arc(
        id,
        Arc::new(plain(move |node, input| {
            let found = LEFT_BEHIND.with(Cell::get);
            seen.lock()
                .unwrap()
                .push((node.to_string(), thread::current().id(), found));
            LEFT_BEHIND.with(|cell| cell.set(Some(id)));
            Ok(input.clone())
        })),
    )
}

fn program_of(expr: Expr) -> (Catalog, Plan, Program) {
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    (catalog, plan, program)
}

/// `a >> (b | c) >> m >> (d | e) >> z`: two waves in a row, the caller's nodes around them.
fn two_waves(seen: &Sightings) -> Expr {
    marking("a", seen)
        >> (marking("b", seen) | marking("c", seen))
        >> marking("m", seen)
        >> (marking("d", seen) | marking("e", seen))
        >> marking("z", seen)
}

fn runs(seen: &Sightings) -> Vec<Vec<(String, ThreadId, Option<&'static str>)>> {
    seen.lock().unwrap().chunks(7).map(<[_]>::to_vec).collect()
}

#[test]
fn a_program_counts_the_branches_of_all_its_waves() {
    let seen = Sightings::default();
    let (_, _, program) = program_of(two_waves(&seen));
    assert_eq!(program.branches(), 4);
    let (_, _, chain) = program_of(marking("a", &seen) >> marking("b", &seen));
    assert_eq!(chain.branches(), 0);
}

#[test]
fn each_branch_of_a_program_runs_on_the_same_thread_in_every_run() {
    let seen = Sightings::default();
    let (_, _, program) = program_of(two_waves(&seen));
    let executor = Executor::new();
    for _ in 0..3 {
        executor.run_program(&program, Value::Int(0)).unwrap();
    }
    let mut threads: HashMap<String, Vec<ThreadId>> = HashMap::new();
    for (node, thread, _) in seen.lock().unwrap().iter() {
        threads.entry(node.clone()).or_default().push(*thread);
    }
    for branch in ["b", "c", "d", "e"] {
        let used = &threads[branch];
        assert!(
            used.iter().all(|t| *t == used[0]),
            "`{branch}` moved between threads: {used:?}"
        );
    }
    let firsts: Vec<ThreadId> = ["a", "b", "c", "d", "e"]
        .iter()
        .map(|n| threads[*n][0])
        .collect();
    for (i, t) in firsts.iter().enumerate() {
        assert!(
            !firsts[i + 1..].contains(t),
            "two branches, or a branch and the caller, shared a thread: {firsts:?}"
        );
    }
}

#[test]
fn thread_local_state_a_branch_leaves_is_seen_only_by_that_branch_in_a_later_run() {
    let seen = Sightings::default();
    let (_, _, program) = program_of(two_waves(&seen));
    let executor = Executor::new();
    for _ in 0..3 {
        executor.run_program(&program, Value::Int(0)).unwrap();
    }
    let runs = runs(&seen);
    assert_eq!(runs.len(), 3);
    for (number, run) in runs.iter().enumerate() {
        let found = |id: &str| run.iter().find(|(node, _, _)| node == id).unwrap().2;
        for branch in ["b", "c", "d", "e"] {
            let expected = if number == 0 { None } else { Some(branch) };
            assert_eq!(found(branch), expected, "run {number}: {run:?}");
        }
        assert_eq!(found("m"), Some("a"), "the caller keeps its own: {run:?}");
        assert_eq!(found("z"), Some("m"), "and sees no branch's: {run:?}");
    }
}

#[test]
fn two_runs_of_one_program_at_once_run_all_their_branches_at_the_same_time() {
    // Four parties: both branches of both runs must be in flight together, so the second run
    // cannot be waiting for the first one's threads.
    let everyone = Rendezvous::new(4);
    let expr = node_arc("b", Arc::new(plain(meet(&everyone))))
        | node_arc("c", Arc::new(plain(meet(&everyone))));
    let (_, _, program) = program_of(expr);
    let program = &program;
    let outs: Vec<Value> = thread::scope(|scope| {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(move || {
                    Executor::new()
                        .run_program(program, Value::text("x"))
                        .unwrap()
                })
            })
            .collect();
        runs.into_iter().map(|run| run.join().unwrap()).collect()
    });
    for out in outs {
        assert_eq!(
            out,
            Value::map([("b", Value::text("b(x)")), ("c", Value::text("c(x)"))])
        );
    }
}

#[test]
fn a_branch_can_run_its_own_program_again_from_inside() {
    // `outer` runs the program once more from inside branch `b`: `b`'s thread is busy with the
    // outer run, so the inner `b` needs another one, and `c` reuses its own, now idle.
    let program: Arc<OnceLock<Program>> = Arc::default();
    let inner = Arc::clone(&program);
    let reenter = plain(move |_, input: &Value| {
        if input.as_int() == Some(1) {
            return Ok(Value::Int(10));
        }
        let program = inner.get().expect("set before the run");
        let out = Executor::new()
            .run_program(program, Value::Int(1))
            .map_err(|e| NodeError::new(e.to_string()))?;
        let leaves = out.as_map().map_or(0, <[_]>::len);
        Ok(Value::Int(i64::try_from(leaves).expect("a few leaves")))
    });
    let expr = node_arc("b", Arc::new(reenter))
        | node_arc("c", Arc::new(plain(|_, input| Ok(input.clone()))));
    let (_, _, built) = program_of(expr);
    let _ = program.set(built);
    let (done, outcome) = mpsc::channel();
    let runner = {
        let program = Arc::clone(&program);
        thread::spawn(move || {
            let built = program.get().unwrap();
            let _ = done.send(Executor::new().run_program(built, Value::Int(0)));
        })
    };
    let out = outcome
        .recv_timeout(DEADLINE)
        .expect("the nested run finished before the deadline")
        .unwrap();
    runner.join().unwrap();
    assert_eq!(
        out,
        Value::map([("b", Value::Int(2)), ("c", Value::Int(0))])
    );
    // And the program still runs from outside afterwards.
    let again = Executor::new()
        .run_program(program.get().unwrap(), Value::Int(1))
        .unwrap();
    assert_eq!(
        again,
        Value::map([("b", Value::Int(10)), ("c", Value::Int(1))])
    );
}

#[test]
fn a_panicking_branch_keeps_its_thread_for_the_next_run() {
    let threads: Arc<Mutex<Vec<ThreadId>>> = Arc::default();
    let log = Arc::clone(&threads);
    let flaky = plain(move |_, input: &Value| {
        log.lock().unwrap().push(thread::current().id());
        assert!(input.as_int() != Some(0), "panicked on purpose");
        Ok(input.clone())
    });
    let expr =
        node_arc("b", Arc::new(flaky)) | node_arc("c", Arc::new(plain(|_, x| Ok(x.clone()))));
    let (_, _, program) = program_of(expr);
    let executor = Executor::new();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        executor.run_program(&program, Value::Int(0))
    }));
    assert!(panicked.is_err(), "the branch's panic is re-raised");
    let out = executor.run_program(&program, Value::Int(1)).unwrap();
    assert_eq!(
        out,
        Value::map([("b", Value::Int(1)), ("c", Value::Int(1))])
    );
    let threads = threads.lock().unwrap();
    assert_eq!(threads.len(), 2);
    assert_eq!(
        threads[0], threads[1],
        "the member survived its branch's panic"
    );
}

/// `b | c`, where `b` opens the returned gate once the thread it ran on has ended.
fn a_branch_that_reports_its_thread_ending() -> (Arc<Gate>, Catalog, Plan, Program) {
    let ended = Gate::new();
    let gate = Arc::clone(&ended);
    let b = plain(move |id, input| {
        open_when_this_thread_ends(&gate);
        trace(id, input)
    });
    let expr = node_arc("b", Arc::new(b)) | node_arc("c", Arc::new(plain(trace)));
    let (catalog, plan, program) = program_of(expr);
    (ended, catalog, plan, program)
}

#[test]
fn dropping_a_program_ends_its_threads() {
    let (ended, _, _, program) = a_branch_that_reports_its_thread_ending();
    Executor::new()
        .run_program(&program, Value::text("x"))
        .unwrap();
    drop(program);
    assert!(ended.wait(), "`b`'s thread outlived its program");
}

#[test]
fn a_one_off_run_of_a_plan_ends_its_branch_threads_with_it() {
    let (ended, catalog, plan, _program) = a_branch_that_reports_its_thread_ending();
    Executor::new()
        .run(&plan, &catalog, Value::text("x"))
        .unwrap();
    assert!(ended.wait(), "`b`'s thread outlived the run");
}

#[test]
fn a_wave_of_a_thousand_branches_runs_every_branch_at_once_on_its_own_thread() {
    const WIDTH: usize = 1_000;
    let everyone = Rendezvous::new(WIDTH);
    let threads: Arc<Mutex<Vec<ThreadId>>> = Arc::default();
    let mut expr: Option<Expr> = None;
    for i in 0..WIDTH {
        let (meet, log) = (meet(&everyone), Arc::clone(&threads));
        let body = plain(move |id, input| {
            log.lock().unwrap().push(thread::current().id());
            meet(id, input)
        });
        let branch = node_arc(format!("b{i}").as_str(), Arc::new(body));
        expr = Some(match expr {
            None => branch,
            Some(expr) => expr | branch,
        });
    }
    let (_, _, program) = program_of(expr.unwrap());
    let executor = Executor::new();
    for _ in 0..2 {
        let out = executor.run_program(&program, Value::Null).unwrap();
        assert_eq!(out.as_map().map(<[_]>::len), Some(WIDTH));
    }
    let mut threads = threads.lock().unwrap().clone();
    threads.sort_by_key(|t| format!("{t:?}"));
    threads.dedup();
    assert_eq!(
        threads.len(),
        WIDTH,
        "one thread per branch, kept for the second run"
    );
}
