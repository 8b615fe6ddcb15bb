//! Every branch runs in the context its wave was reached in: a host's [`Captured`] is taken once
//! per wave on the thread that reached it and entered by each branch on its own thread, the
//! caller's included; what a branch changes stays its own.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::Duration;

use soma_core::{
    compile, node_arc, Captured, Catalog, Executor, Expr, Host, Node, NodeError, Program, Value,
};

use crate::support::{plain, Rendezvous};

thread_local! {
    /// The context a [`Carrying`] host carries: one number per thread.
    static CONTEXT: Cell<u32> = const { Cell::new(0) };
}

/// A host that carries [`CONTEXT`] from the thread that reaches a wave into its branches.
struct Carrying;

struct Snapshot(u32);

impl Host for Carrying {
    fn branch(&self, run: &mut dyn FnMut()) {
        run();
    }

    fn blocking(&self, run: &mut (dyn FnMut() + Send)) {
        run();
    }

    fn capture(&self) -> Option<Box<dyn Captured>> {
        Some(Box::new(Snapshot(CONTEXT.with(Cell::get))))
    }
}

impl Captured for Snapshot {
    fn enter(&self, run: &mut dyn FnMut()) {
        let had = CONTEXT.with(|context| context.replace(self.0));
        run();
        CONTEXT.with(|context| context.set(had));
    }
}

/// What each node saw: its id, the context, its thread.
type Seen = Arc<Mutex<Vec<(String, u32, ThreadId)>>>;

/// Where the branches of a wave meet; replaced between runs, since a rendezvous serves once.
type Meeting = Arc<Mutex<Arc<Rendezvous>>>;

fn meeting(parties: usize) -> Meeting {
    Arc::new(Mutex::new(Rendezvous::new(parties)))
}

/// A node that sets the context to `set` (if any), meets `meet` (if any), then records what it
/// sees.
fn probe(id: &str, seen: &Seen, set: Option<u32>, meet: Option<&Meeting>) -> Expr {
    node_arc(id, probe_node(seen, set, meet))
}

fn probe_node(seen: &Seen, set: Option<u32>, meet: Option<&Meeting>) -> Arc<dyn Node> {
    let (seen, meet) = (Arc::clone(seen), meet.cloned());
    Arc::new(plain(move |node, _| -> Result<Value, NodeError> {
        if let Some(value) = set {
            CONTEXT.with(|context| context.set(value));
        }
        if let Some(meet) = &meet {
            let rendezvous = Arc::clone(&meet.lock().unwrap());
            assert!(rendezvous.meet(), "the branches of the wave never met");
        }
        let context = CONTEXT.with(Cell::get);
        seen.lock()
            .unwrap()
            .push((node.to_owned(), context, thread::current().id()));
        Ok(Value::Int(i64::from(context)))
    }))
}

fn run(expr: Expr, caller_context: u32) {
    let (graph, catalog) = expr.somatize().unwrap();
    run_graph(&graph, &catalog, caller_context);
}

fn run_graph(graph: &soma_core::Graph, catalog: &Catalog, caller_context: u32) {
    let plan = compile(graph, catalog).unwrap();
    let program = Program::new(&plan, catalog).unwrap();
    CONTEXT.with(|context| context.set(caller_context));
    Executor::new()
        .with_host(Arc::new(Carrying))
        .run_program(&program, Value::Null)
        .unwrap();
}

fn context_of(seen: &Seen, node: &str) -> u32 {
    seen.lock()
        .unwrap()
        .iter()
        .find(|(n, _, _)| n == node)
        .unwrap_or_else(|| panic!("`{node}` ran"))
        .1
}

fn thread_of(seen: &Seen, node: &str) -> ThreadId {
    seen.lock()
        .unwrap()
        .iter()
        .find(|(n, _, _)| n == node)
        .unwrap_or_else(|| panic!("`{node}` ran"))
        .2
}

#[test]
fn every_branch_runs_in_the_context_of_the_thread_that_reached_its_wave() {
    let seen = Seen::default();
    let together = meeting(2);
    let wave = probe("b", &seen, None, Some(&together)) | probe("c", &seen, None, Some(&together));
    run(wave, 7);
    assert_ne!(thread_of(&seen, "b"), thread_of(&seen, "c"));
    assert_eq!((context_of(&seen, "b"), context_of(&seen, "c")), (7, 7));
}

#[test]
fn what_a_branch_changes_is_seen_neither_by_its_siblings_nor_after_the_wave() {
    let seen = Seen::default();
    let together = meeting(2);
    // Both set before they meet, read after: each sees its own.
    let expr = (probe("b", &seen, Some(1), Some(&together))
        | probe("c", &seen, Some(2), Some(&together)))
        >> probe("d", &seen, None, None);
    run(expr, 7);
    assert_eq!((context_of(&seen, "b"), context_of(&seen, "c")), (1, 2));
    assert_eq!(
        context_of(&seen, "d"),
        7,
        "after the wave, the caller's context again"
    );
    assert_eq!(
        CONTEXT.with(Cell::get),
        7,
        "the caller's own context is untouched"
    );
}

#[test]
fn a_nested_wave_runs_in_the_context_of_the_branch_around_it() {
    let seen = Seen::default();
    let inner = meeting(2);
    let expr = (probe("b", &seen, Some(5), None)
        >> (probe("c", &seen, None, Some(&inner)) | probe("d", &seen, None, Some(&inner))))
        | probe("e", &seen, None, None);
    run(expr, 7);
    assert_eq!((context_of(&seen, "c"), context_of(&seen, "d")), (5, 5));
    assert_eq!(context_of(&seen, "e"), 7);
}

#[test]
fn the_next_branch_a_thread_is_lent_finds_the_captured_context_not_what_the_last_one_left() {
    let seen = Seen::default();
    let together = meeting(2);
    let (graph, catalog) = (probe("b", &seen, None, Some(&together))
        | (probe("c", &seen, None, Some(&together)) >> probe("leaves", &seen, Some(9), None)))
    .somatize()
    .unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    let mut crew_threads = BTreeSet::new();
    for caller_context in [7, 8] {
        *together.lock().unwrap() = Rendezvous::new(2);
        CONTEXT.with(|context| context.set(caller_context));
        Executor::new()
            .with_host(Arc::new(Carrying))
            .run_program(&program, Value::Null)
            .unwrap();
        let runs = seen.lock().unwrap().drain(..).collect::<Vec<_>>();
        let c = runs.iter().find(|(n, _, _)| n == "c").unwrap();
        assert_eq!(c.1, caller_context, "{runs:?}");
        assert_ne!(c.2, thread::current().id(), "`c` ran on a crew thread");
        crew_threads.insert(format!("{:?}", c.2));
    }
    assert_eq!(
        crew_threads.len(),
        1,
        "the second run reused the crew's thread"
    );
}

#[test]
fn a_wave_moved_to_a_fresh_stack_runs_in_the_context_it_was_reached_in() {
    // `(((n0 >> n1) | n2) >> n3) | n4 …`: deeper than the waves one stack takes, so the walk
    // moves to a fresh thread on the way down.
    const LEVELS: usize = 1_000;
    let seen = Seen::default();
    let mut graph = soma_core::Graph::new();
    let mut catalog = Catalog::new();
    let mut terminals: Vec<String> = Vec::new();
    for level in 0..LEVELS {
        let id = format!("n{level}");
        graph.add_node(id.as_str()).unwrap();
        catalog.insert(id.as_str(), probe_node(&seen, None, None));
        if level % 2 == 1 {
            for terminal in &terminals {
                graph.add_edge(terminal, &id).unwrap();
            }
            terminals = vec![id];
        } else {
            terminals.push(id);
        }
    }
    run_graph(&graph, &catalog, 7);
    let contexts = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(_, context, _)| *context)
        .collect::<BTreeSet<_>>();
    assert_eq!(contexts, BTreeSet::from([7]));
    assert_eq!(seen.lock().unwrap().len(), LEVELS);
}

/// A host whose captured context asks for its waves' branches in order, on the thread that
/// reached the wave ([`Captured::in_order`]).
struct InOrder;

struct InOrderSnapshot;

impl Host for InOrder {
    fn branch(&self, run: &mut dyn FnMut()) {
        run();
    }

    fn blocking(&self, run: &mut (dyn FnMut() + Send)) {
        run();
    }

    fn capture(&self) -> Option<Box<dyn Captured>> {
        Some(Box::new(InOrderSnapshot))
    }
}

impl Captured for InOrderSnapshot {
    fn enter(&self, run: &mut dyn FnMut()) {
        run();
    }

    fn in_order(&self) -> bool {
        true
    }
}

#[test]
fn a_context_that_asks_for_order_runs_every_branch_on_the_reaching_thread_in_declared_order() {
    // The first branch waits a while for a sibling to run, as branches side by side would: in
    // order, none has run yet, and it waits its while out.
    let (sibling_ran, first_hears) = mpsc::channel::<()>();
    let first_hears = Arc::new(Mutex::new(first_hears));
    let ran: Arc<Mutex<Vec<(String, ThreadId)>>> = Arc::default();
    let node = |id: &str| {
        let (ran, first_hears) = (Arc::clone(&ran), Arc::clone(&first_hears));
        let sibling_ran = Mutex::new(sibling_ran.clone());
        node_arc(
            id,
            Arc::new(plain(move |node, _| -> Result<Value, NodeError> {
                if node == "a" {
                    let _ = first_hears
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_millis(500));
                } else {
                    let _ = sibling_ran.lock().unwrap().send(());
                }
                ran.lock()
                    .unwrap()
                    .push((node.to_owned(), thread::current().id()));
                Ok(Value::Null)
            })),
        )
    };
    let (graph, catalog) = (node("a") | node("b") | node("c") | node("d"))
        .somatize()
        .unwrap();
    let program = Program::new(&compile(&graph, &catalog).unwrap(), &catalog).unwrap();
    Executor::new()
        .with_host(Arc::new(InOrder))
        .run_program(&program, Value::Null)
        .unwrap();
    let here = thread::current().id();
    assert_eq!(
        *ran.lock().unwrap(),
        ["a", "b", "c", "d"].map(|id| (id.to_owned(), here))
    );
}
