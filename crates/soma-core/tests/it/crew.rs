//! The threads a program lends its waves: as many as branches are in flight, never one per
//! branch of the graph; the thread that reaches a wave runs a branch of it; idle threads capped,
//! and gone when the program is.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::thread::{self, ThreadId};
use std::time::Instant;

use soma_core::{
    compile, node_arc, Catalog, Executor, Expr, Host, NodeError, Plan, Program, RunError, Value,
};

use crate::support::{meet, open_when_this_thread_ends, plain, trace, Gate, Rendezvous, DEADLINE};

fn program_of(expr: Expr) -> (Catalog, Plan, Program) {
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    (catalog, plan, program)
}

/// The threads nodes ran on, by node.
type Threads = Arc<Mutex<Vec<(String, ThreadId)>>>;

/// A node that records its thread, then does `body`.
fn seen(
    id: &str,
    threads: &Threads,
    body: impl Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync + 'static,
) -> Expr {
    let threads = Arc::clone(threads);
    node_arc(
        id,
        Arc::new(plain(move |node, input| {
            threads
                .lock()
                .unwrap()
                .push((node.to_owned(), thread::current().id()));
            body(node, input)
        })),
    )
}

fn thread_of(threads: &Threads, node: &str) -> ThreadId {
    threads
        .lock()
        .unwrap()
        .iter()
        .find(|(n, _)| n == node)
        .unwrap_or_else(|| panic!("`{node}` ran"))
        .1
}

/// `b0 | b1 | …`: `width` branches that all meet before any answers.
fn meeting_wave(width: usize, threads: &Threads) -> Expr {
    let everyone = Rendezvous::new(width);
    (0..width)
        .map(|i| seen(&format!("b{i}"), threads, meet(&everyone)))
        .reduce(|wave, branch| wave | branch)
        .expect("at least one branch")
}

/// A wave of `width` branches that do nothing.
fn quick_wave(width: usize) -> Expr {
    (0..width)
        .map(|i| node_arc(format!("b{i}").as_str(), Arc::new(plain(trace))))
        .reduce(|wave, branch| wave | branch)
        .expect("at least one branch")
}

/// Waits until `done` holds, or the deadline passes; whether it held.
fn eventually(done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if done() {
            return true;
        }
        thread::yield_now();
    }
    done()
}

#[test]
fn the_thread_that_reaches_a_wave_runs_its_first_branch_itself() {
    let threads = Threads::default();
    let (_, _, program) = program_of(
        seen("a", &threads, trace)
            >> (seen("b", &threads, trace) | seen("c", &threads, trace))
            >> seen("d", &threads, trace),
    );
    Executor::new()
        .run_program(&program, Value::Int(0))
        .unwrap();
    assert_eq!(thread_of(&threads, "a"), thread::current().id());
    assert_eq!(thread_of(&threads, "b"), thread::current().id());
    assert_eq!(thread_of(&threads, "d"), thread::current().id());
}

#[test]
fn branches_in_flight_at_the_same_time_run_on_different_threads() {
    let threads = Threads::default();
    let (_, _, program) = program_of(meeting_wave(3, &threads));
    Executor::new()
        .run_program(&program, Value::Int(0))
        .unwrap();
    let distinct: HashSet<ThreadId> = threads.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert_eq!(distinct.len(), 3);
}

#[test]
fn a_branch_waiting_for_its_inner_wave_runs_one_of_that_waves_branches_itself() {
    // `b` reaches the inner wave `c | d` and runs `c`; `d` and `e` meet `c`, so all three are in
    // flight, and `b`'s thread was not left idle waiting for them.
    let threads = Threads::default();
    let together = Rendezvous::new(3);
    let (_, _, program) = program_of(
        (seen("b", &threads, trace)
            >> (seen("c", &threads, meet(&together)) | seen("d", &threads, meet(&together))))
            | seen("e", &threads, meet(&together)),
    );
    Executor::new()
        .run_program(&program, Value::Int(0))
        .unwrap();
    assert_eq!(thread_of(&threads, "b"), thread_of(&threads, "c"));
    assert_ne!(thread_of(&threads, "c"), thread_of(&threads, "d"));
}

#[test]
fn a_wave_of_branches_that_meet_uses_one_thread_per_branch_and_no_more() {
    const WIDTH: usize = 64;
    let threads = Threads::default();
    let (_, _, program) = program_of(meeting_wave(WIDTH, &threads));
    let executor = Executor::new();
    for _ in 0..2 {
        let out = executor.run_program(&program, Value::Null).unwrap();
        assert_eq!(out.as_map().map(<[_]>::len), Some(WIDTH));
    }
    // The caller runs one branch; the crew lends a thread to each of the others, and the second
    // run finds them again instead of starting more.
    assert!(program.threads() < WIDTH, "{} threads", program.threads());
    let distinct: HashSet<ThreadId> = threads.lock().unwrap().iter().map(|(_, t)| *t).collect();
    assert!(
        distinct.len() <= WIDTH + WIDTH / 2,
        "{} threads",
        distinct.len()
    );
}

#[test]
fn a_wave_of_ten_thousand_quick_branches_runs_on_a_handful_of_threads() {
    const WIDTH: usize = 10_000;
    let (_, _, program) = program_of(quick_wave(WIDTH));
    let out = Executor::new().run_program(&program, Value::Null).unwrap();
    assert_eq!(out.as_map().map(<[_]>::len), Some(WIDTH));
    // Threads come only when a branch waits with no thread free: not one per branch.
    assert!(program.threads() < 100, "{} threads", program.threads());
}

#[test]
fn idle_threads_beyond_the_limit_end() {
    let threads = Threads::default();
    let (_, _, program) = program_of(meeting_wave(16, &threads));
    program.set_idle_threads(2);
    Executor::new().run_program(&program, Value::Null).unwrap();
    assert!(
        eventually(|| program.threads() <= 2),
        "{} threads stayed",
        program.threads()
    );
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
}

#[test]
fn a_panicking_branch_leaves_the_program_usable() {
    let together = Rendezvous::new(2);
    let flaky = {
        let meet = meet(&together);
        plain(move |id, input: &Value| {
            let out = meet(id, input);
            assert!(input.as_int() != Some(0), "panicked on purpose");
            out
        })
    };
    let steady = {
        let meet = meet(&together);
        plain(move |id, input: &Value| meet(id, input))
    };
    let (_, _, program) =
        program_of(node_arc("b", Arc::new(steady)) | node_arc("c", Arc::new(flaky)));
    let executor = Executor::new();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        executor.run_program(&program, Value::Int(0))
    }));
    assert!(panicked.is_err(), "the branch's panic is re-raised");
    let out = executor.run_program(&program, Value::Int(1)).unwrap();
    assert_eq!(out.as_map().map(<[_]>::len), Some(2));
}

/// `b | c`, meeting, where `c` — which runs on a crew thread, since `b` waits for it on the
/// caller's — opens the returned gate once the thread it ran on has ended.
fn a_branch_that_reports_its_thread_ending() -> (Arc<Gate>, Catalog, Plan, Program) {
    let ended = Gate::new();
    let gate = Arc::clone(&ended);
    let together = Rendezvous::new(2);
    let c = {
        let meet = meet(&together);
        plain(move |id, input| {
            open_when_this_thread_ends(&gate);
            meet(id, input)
        })
    };
    let expr = node_arc("b", Arc::new(plain(meet(&together)))) | node_arc("c", Arc::new(c));
    let (catalog, plan, program) = program_of(expr);
    (ended, catalog, plan, program)
}

#[test]
fn dropping_a_program_ends_its_threads() {
    let (ended, _, _, program) = a_branch_that_reports_its_thread_ending();
    Executor::new()
        .run_program(&program, Value::text("x"))
        .unwrap();
    assert_eq!(program.threads(), 1);
    drop(program);
    assert!(ended.wait(), "`c`'s thread outlived its program");
}

#[test]
fn a_one_off_run_of_a_plan_ends_its_threads_after_it() {
    let (ended, catalog, plan, _program) = a_branch_that_reports_its_thread_ending();
    Executor::new()
        .run(&plan, &catalog, Value::text("x"))
        .unwrap();
    assert!(ended.wait(), "`c`'s thread outlived the run");
}

#[test]
fn a_thread_the_system_refuses_is_a_run_error_and_the_program_stays_usable() {
    let (_, _, program) = program_of(quick_wave(2));
    program.refuse_next_threads(1);
    let error = Executor::new()
        .run_program(&program, Value::Null)
        .unwrap_err();
    assert!(matches!(&error, RunError::NoThread { .. }), "{error:?}");
    assert!(error.to_string().contains("refused"), "{error}");
    let out = Executor::new().run_program(&program, Value::Null).unwrap();
    assert_eq!(out.as_map().map(<[_]>::len), Some(2));
}

thread_local! {
    static IN_BRANCH: Cell<bool> = const { Cell::new(false) };
}

/// A host that marks, for the length of each branch it wraps, that its thread is in one.
struct Marking;

impl Host for Marking {
    fn branch(&self, run: &mut dyn FnMut()) {
        let before = IN_BRANCH.with(|mark| mark.replace(true));
        run();
        IN_BRANCH.with(|mark| mark.set(before));
    }

    fn blocking(&self, run: &mut (dyn FnMut() + Send)) {
        run();
    }
}

#[test]
fn the_host_wraps_each_branch_a_crew_thread_runs_and_puts_its_thread_back_after() {
    let marks: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
    let together = Rendezvous::new(2);
    let marked = |id: &str| {
        let (marks, meet) = (Arc::clone(&marks), meet(&together));
        node_arc(
            id,
            Arc::new(plain(move |node, input| {
                let mark = IN_BRANCH.with(Cell::get);
                marks.lock().unwrap().push((node.to_owned(), mark));
                meet(node, input)
            })),
        )
    };
    let (_, _, program) = program_of(marked("b") | marked("c"));
    Executor::new()
        .with_host(Arc::new(Marking))
        .run_program(&program, Value::Null)
        .unwrap();
    let marks = marks.lock().unwrap().clone();
    // `b` runs on the caller, inside whatever the caller already holds; `c` on a crew thread,
    // inside the host's branch.
    assert!(marks.contains(&("b".to_owned(), false)), "{marks:?}");
    assert!(marks.contains(&("c".to_owned(), true)), "{marks:?}");
    assert!(!IN_BRANCH.with(Cell::get));
}

/// `a >> ((b >> c) | d | (e >> (f | g))) >> h`, chained `blocks` times: eight nodes, two waves
/// and four branches in flight at most per block.
fn nested_blocks(blocks: usize) -> (soma_core::Graph, Catalog) {
    let mut graph = soma_core::Graph::new();
    let mut catalog = Catalog::new();
    let pass: Arc<dyn soma_core::Node> =
        Arc::new(|x: &Value| -> Result<Value, NodeError> { Ok(x.clone()) });
    let first: Arc<dyn soma_core::Node> = Arc::new(|x: &Value| -> Result<Value, NodeError> {
        Ok(x.as_map().map_or(Value::Null, |m| m[0].1.clone()))
    });
    let mut previous: Option<String> = None;
    for k in 0..blocks {
        let id = |c: char| format!("{c}{k}");
        for c in "abcdefgh".chars() {
            graph.add_node(id(c).as_str()).unwrap();
            let body = if c == 'h' { &first } else { &pass };
            catalog.insert(id(c).as_str(), Arc::clone(body));
        }
        if let Some(previous) = &previous {
            graph.add_edge(previous, &id('a')).unwrap();
        }
        for (s, t) in ["ab", "bc", "ad", "ae", "ef", "eg", "ch", "dh", "fh", "gh"]
            .iter()
            .map(|pair| (pair.chars().next().unwrap(), pair.chars().nth(1).unwrap()))
        {
            graph.add_edge(&id(s), &id(t)).unwrap();
        }
        previous = Some(id('h'));
    }
    (graph, catalog)
}

#[test]
fn a_million_node_nested_graph_compiles_and_runs_on_a_handful_of_threads() {
    let (graph, catalog) = nested_blocks(125_000);
    assert_eq!(graph.len(), 1_000_000);
    let plan = compile(&graph, &catalog).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    let out = Executor::new()
        .run_program(&program, Value::Int(7))
        .unwrap();
    assert_eq!(out, Value::Int(7));
    // The widest point is four branches at once; the caller is one of the threads.
    assert!(program.threads() <= 3, "{} threads", program.threads());
}

#[test]
fn a_graph_nested_a_hundred_thousand_levels_deep_runs_without_a_deep_stack() {
    // `(((n0 >> n1) | n2) >> n3) | n4 …`: every second level a wave around all that came before.
    const LEVELS: usize = 100_000;
    let outcome = thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(|| {
            let mut graph = soma_core::Graph::new();
            let mut catalog = Catalog::new();
            // A join passes one of its inputs on, so that values stay flat however deep the graph.
            let pass: Arc<dyn soma_core::Node> =
                Arc::new(|x: &Value| -> Result<Value, NodeError> {
                    Ok(x.as_map().map_or_else(|| x.clone(), |m| m[0].1.clone()))
                });
            let mut terminals = vec!["n0".to_owned()];
            graph.add_node("n0").unwrap();
            catalog.insert("n0", Arc::clone(&pass));
            for level in 1..LEVELS {
                let id = format!("n{level}");
                graph.add_node(id.as_str()).unwrap();
                catalog.insert(id.as_str(), Arc::clone(&pass));
                if level % 2 == 1 {
                    for terminal in &terminals {
                        graph.add_edge(terminal, &id).unwrap();
                    }
                    terminals = vec![id];
                } else {
                    terminals.push(id);
                }
            }
            let plan = compile(&graph, &catalog).unwrap();
            let program = Program::new(&plan, &catalog).unwrap();
            let out = Executor::new()
                .run_program(&program, Value::Int(3))
                .unwrap();
            drop(program);
            out
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    // The last level is a series: one leaf, which received the input passed down every level.
    assert_eq!(outcome, Value::Int(3));
}

#[test]
fn a_lent_thread_runs_a_task_while_its_caller_goes_on() {
    let (_, _, program) = program_of(quick_wave(2));
    let (done, finished) = mpsc::channel();
    let caller = thread::current().id();
    let (release, released) = mpsc::channel::<()>();
    program
        .lend(
            move || {
                // The caller is not waiting: it releases the task only after `lend` returned.
                released.recv_timeout(DEADLINE).expect("the caller went on");
                done.send(thread::current().id()).unwrap();
            },
            None,
        )
        .unwrap();
    release.send(()).unwrap();
    let ran_on = finished.recv_timeout(DEADLINE).expect("the task ran");
    assert_ne!(ran_on, caller);
    let out = Executor::new().run_program(&program, Value::Null).unwrap();
    assert_eq!(out.as_map().map(<[_]>::len), Some(2));
}

#[test]
fn a_lent_task_the_system_refuses_a_thread_for_is_an_error_and_is_not_run() {
    let (_, _, program) = program_of(quick_wave(2));
    program.refuse_next_threads(1);
    let ran = Arc::new(Mutex::new(false));
    let flag = Arc::clone(&ran);
    // A new program has no idle thread: the task needs a new one, which is refused.
    let refused = program.lend(move || *flag.lock().unwrap() = true, None);
    assert!(refused.is_err());
    assert!(!*ran.lock().unwrap());
    let out = Executor::new().run_program(&program, Value::Null).unwrap();
    assert_eq!(out.as_map().map(<[_]>::len), Some(2));
}
