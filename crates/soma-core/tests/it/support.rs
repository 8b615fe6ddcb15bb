//! What the questionnaire's modules share: nodes that say where data came from, a log that
//! records who ran when and on which thread, meeting points with a deadline, and the battery of
//! named topologies every invariant is checked over.
//!
//! Concurrency is proven here by meeting, never by sleeping: a [`Rendezvous`] resolves only when
//! every party is in flight at the same time, and gives up after [`DEADLINE`] so that a run that
//! is secretly sequential fails instead of hanging.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use soma_core::{node_arc, Catalog, Ctx, Expr, Graph, Node, NodeError, Plan, Transition, Value};

/// Long enough that no loaded machine reaches it when the parties do meet; it is only ever
/// spent in full by a test that is failing.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// A meeting point for a fixed number of parties, with a deadline.
///
/// `std::sync::Barrier` would hang forever if the parties never overlap; this one answers
/// `false` instead, so the failure is reported and the run still ends.
pub struct Rendezvous {
    parties: usize,
    arrived: Mutex<usize>,
    all_here: Condvar,
}

impl Rendezvous {
    pub fn new(parties: usize) -> Arc<Self> {
        Arc::new(Rendezvous {
            parties,
            arrived: Mutex::new(0),
            all_here: Condvar::new(),
        })
    }

    /// Arrives and waits for the others; `false` when [`DEADLINE`] passed before they came.
    pub fn meet(&self) -> bool {
        let deadline = Instant::now() + DEADLINE;
        let mut arrived = self.arrived.lock().unwrap();
        *arrived += 1;
        if *arrived >= self.parties {
            self.all_here.notify_all();
            return true;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            arrived = self.all_here.wait_timeout(arrived, left).unwrap().0;
            if *arrived >= self.parties {
                return true;
            }
        }
    }
}

/// A one-shot signal with a deadline: once opened, every waiter passes.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    pub fn new() -> Arc<Self> {
        Arc::new(Gate::default())
    }

    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    /// Whether the gate is open now, without waiting.
    pub fn is_open(&self) -> bool {
        *self.open.lock().unwrap()
    }

    /// Waits until the gate is open; `false` when [`DEADLINE`] passed first.
    pub fn wait(&self) -> bool {
        let open = self.open.lock().unwrap();
        let (open, _) = self
            .opened
            .wait_timeout_while(open, DEADLINE, |open| !*open)
            .unwrap();
        *open
    }
}

/// Opens its gate when dropped — during a panic's unwinding too, which is how a test learns that
/// a panic is on its way out without racing it.
pub struct OpenOnDrop(pub Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

thread_local! {
    static AT_THREAD_EXIT: RefCell<Vec<OpenOnDrop>> = const { RefCell::new(Vec::new()) };
}

/// Opens `gate` once the calling thread has ended. Called from a node of a spawned branch, it
/// fires only after that branch has returned and the executor has recorded how it ended, which
/// is the one moment a sibling can safely assume "that branch has already failed".
pub fn open_when_this_thread_ends(gate: &Arc<Gate>) {
    AT_THREAD_EXIT.with(|pending| pending.borrow_mut().push(OpenOnDrop(Arc::clone(gate))));
}

/// Whether a log entry marks the start or the end of a call to `forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Start,
    End,
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub node: String,
    pub phase: Phase,
    pub thread: ThreadId,
}

/// What ran, in the order it really ran, and on which thread. A `Mutex<Vec>` because the point
/// is to observe the real interleaving of threads, which any buffering would hide.
#[derive(Default)]
pub struct Log(Mutex<Vec<Entry>>);

impl Log {
    pub fn new() -> Arc<Self> {
        Arc::new(Log::default())
    }

    pub fn record(&self, node: &str, phase: Phase) {
        self.0.lock().unwrap().push(Entry {
            node: node.to_owned(),
            phase,
            thread: thread::current().id(),
        });
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.0.lock().unwrap().clone()
    }

    /// How many calls of `node` started.
    pub fn starts(&self, node: &str) -> usize {
        self.entries()
            .iter()
            .filter(|e| e.node == node && e.phase == Phase::Start)
            .count()
    }

    pub fn ran(&self, node: &str) -> bool {
        self.starts(node) > 0
    }

    pub fn finished(&self, node: &str) -> bool {
        self.entries()
            .iter()
            .any(|e| e.node == node && e.phase == Phase::End)
    }

    /// Where in the log `node` first reached `phase`.
    pub fn position(&self, node: &str, phase: Phase) -> Option<usize> {
        self.entries()
            .iter()
            .position(|e| e.node == node && e.phase == phase)
    }

    /// The thread `node` started on.
    pub fn thread_of(&self, node: &str) -> ThreadId {
        self.entries()
            .iter()
            .find(|e| e.node == node && e.phase == Phase::Start)
            .map_or_else(|| panic!("`{node}` never ran"), |e| e.thread)
    }
}

/// The output of a traced node: its id around what it read, so a result spells out the whole
/// path data took — `d(b(a(x)),c(a(x)))` — and a wrong wiring shows in the value itself.
pub fn traced(id: &str, input: &Value) -> Value {
    Value::text(format!("{id}({})", describe(input)))
}

fn describe(value: &Value) -> String {
    match value {
        Value::Text(text) => text.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Map(pairs) => pairs
            .iter()
            .map(|(_, v)| describe(v))
            .collect::<Vec<_>>()
            .join(","),
        other => other.kind().to_owned(),
    }
}

/// Answers [`traced`], for any id: one implementation can serve a whole graph.
pub struct Trace;

impl Node for Trace {
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Ok(Transition::Done(traced(ctx.node().as_str(), input)))
    }
}

/// A body for [`logged`] that answers [`traced`].
#[allow(clippy::unnecessary_wraps)] // Its signature is the one every body shares.
pub fn trace(id: &str, input: &Value) -> Result<Value, NodeError> {
    Ok(traced(id, input))
}

/// A node that logs the start and the end of every call around `body`.
pub struct Logged<F> {
    log: Arc<Log>,
    body: F,
}

pub fn logged<F>(log: &Arc<Log>, body: F) -> Logged<F>
where
    F: Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync,
{
    Logged {
        log: Arc::clone(log),
        body,
    }
}

impl<F> Node for Logged<F>
where
    F: Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync,
{
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let id = ctx.node().as_str();
        self.log.record(id, Phase::Start);
        let out = (self.body)(id, input);
        self.log.record(id, Phase::End);
        out.map(Transition::Done)
    }
}

/// A node that answers what `body` answers, unobserved.
pub struct Plain<F>(F);

pub fn plain<F>(body: F) -> Plain<F>
where
    F: Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync,
{
    Plain(body)
}

impl<F> Node for Plain<F>
where
    F: Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync,
{
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        (self.0)(ctx.node().as_str(), input).map(Transition::Done)
    }
}

/// A body that meets the other parties of `rendezvous` before answering; it fails, naming its
/// node, when it waited alone until the deadline.
pub fn meet(
    rendezvous: &Arc<Rendezvous>,
) -> impl Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync + 'static {
    let rendezvous = Arc::clone(rendezvous);
    move |id, input| {
        if rendezvous.meet() {
            trace(id, input)
        } else {
            Err(NodeError::new(format!(
                "`{id}` waited alone at the rendezvous until the deadline: it was not in flight at the same time as the others"
            )))
        }
    }
}

/// A body that waits for `gate` before answering.
pub fn after(
    gate: &Arc<Gate>,
) -> impl Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync + 'static {
    let gate = Arc::clone(gate);
    move |id, input| {
        if gate.wait() {
            trace(id, input)
        } else {
            Err(NodeError::new(format!(
                "`{id}` waited for its gate until the deadline"
            )))
        }
    }
}

/// A body that fails ("not yet") on its first `failures` calls, and passes its input on after:
/// a flaky node for a retry policy to try again.
pub fn fails_first(
    failures: u32,
) -> impl Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync + 'static {
    let calls = AtomicU32::new(0);
    move |_, x| {
        if calls.fetch_add(1, Ordering::SeqCst) < failures {
            Err(NodeError::new("not yet"))
        } else {
            Ok(x.clone())
        }
    }
}

/// A body that fails with `message`.
pub fn fail(
    message: &'static str,
) -> impl Fn(&str, &Value) -> Result<Value, NodeError> + Send + Sync + 'static {
    move |_, _| Err(NodeError::new(message))
}

/// A one-node expression whose node answers [`traced`].
pub fn n(id: &str) -> Expr {
    node_arc(id, Arc::new(Trace))
}

/// A graph built the long way, with `add_node` and `add_edge`, in the order given.
pub fn graph(nodes: &[&str], edges: &[(&str, &str)]) -> Graph {
    let mut graph = Graph::new();
    for id in nodes {
        graph.add_node(*id).expect("a fresh, valid id");
    }
    for (from, to) in edges {
        graph.add_edge(from, to).expect("an edge of a DAG");
    }
    graph
}

/// A catalog in which `implementation` serves every node of `graph`.
pub fn catalog_of(graph: &Graph, implementation: &Arc<dyn Node>) -> Catalog {
    let mut catalog = Catalog::new();
    for id in graph.nodes() {
        catalog.insert(id, Arc::clone(implementation));
    }
    catalog
}

pub fn exec(node: &str, from: &[&str]) -> Plan {
    Plan::Execute {
        node: node.into(),
        from: from.iter().map(|&id| id.into()).collect(),
    }
}

pub fn seq(steps: Vec<Plan>) -> Plan {
    Plan::Sequence(steps)
}

pub fn wave(branches: Vec<Plan>) -> Plan {
    Plan::Wave(branches)
}

/// The plan there was before waves, built by hand: every node in topological order, in a row.
pub fn flat_plan(graph: &Graph) -> Plan {
    let steps: Vec<Plan> = graph
        .topological_sort()
        .iter()
        .map(|id| Plan::Execute {
            node: id.clone(),
            from: graph
                .predecessors(id.as_str())
                .expect("a node of the graph")
                .into_iter()
                .cloned()
                .collect(),
        })
        .collect();
    match steps.len() {
        0 => Plan::Empty,
        _ => Plan::Sequence(steps),
    }
}

fn dsl(expr: Expr) -> Graph {
    expr.somatize()
        .expect("an expression with fresh, valid ids")
        .0
}

/// Named topologies, chosen so that each invariant meets every case `compile` distinguishes:
/// empty, single, series, parallel, both nested, non-series-parallel alone and in company.
pub fn battery() -> Vec<(&'static str, Graph)> {
    vec![
        ("empty", Graph::new()),
        ("one node", graph(&["a"], &[])),
        (
            "chain",
            graph(&["a", "b", "c", "d"], &[("a", "b"), ("b", "c"), ("c", "d")]),
        ),
        (
            "fan-out",
            graph(&["a", "b", "c", "d"], &[("a", "b"), ("a", "c"), ("a", "d")]),
        ),
        (
            "fan-in, edges declared out of insertion order",
            graph(&["a", "b", "c", "j"], &[("c", "j"), ("a", "j"), ("b", "j")]),
        ),
        ("diamond", dsl(n("a") >> (n("b") | n("c")) >> n("d"))),
        (
            "a wave of two sequences",
            dsl(n("a") >> ((n("b") >> n("b2") >> n("b3")) | (n("c") >> n("c2"))) >> n("d")),
        ),
        (
            "the barrier counterexample",
            dsl(((n("a") >> n("a2")) | n("b")) >> (n("c") | n("d"))),
        ),
        (
            "a wave inside a branch",
            dsl(n("a") >> ((n("b") >> (n("c") | n("d")) >> n("e")) | n("f")) >> n("g")),
        ),
        (
            "two unrelated long chains",
            dsl((n("a1") >> n("a2") >> n("a3") >> n("a4") >> n("a5"))
                | (n("b1") >> n("b2") >> n("b3") >> n("b4") >> n("b5"))),
        ),
        (
            "the N",
            graph(&["a", "b", "c", "d"], &[("a", "c"), ("a", "d"), ("b", "d")]),
        ),
        (
            "the N beside a chain",
            graph(
                &["a", "b", "c", "d", "x", "y"],
                &[("a", "c"), ("a", "d"), ("b", "d"), ("x", "y")],
            ),
        ),
        (
            "waves around an N",
            graph(
                &["p1", "p2", "a", "b", "c", "d", "q1", "q2"],
                &[
                    ("p1", "a"),
                    ("p1", "b"),
                    ("p2", "a"),
                    ("p2", "b"),
                    ("a", "c"),
                    ("a", "d"),
                    ("b", "d"),
                    ("c", "q1"),
                    ("c", "q2"),
                    ("d", "q1"),
                    ("d", "q2"),
                ],
            ),
        ),
        (
            "a tangle inserted against its topological order",
            graph(
                &["f", "e", "d", "c", "b", "a"],
                &[
                    ("a", "b"),
                    ("a", "c"),
                    ("b", "d"),
                    ("c", "d"),
                    ("b", "e"),
                    ("d", "f"),
                    ("e", "f"),
                    ("a", "f"),
                ],
            ),
        ),
    ]
}

/// Runs `body` on a thread with a 256 KiB stack: recursion once per level of a deep plan or a
/// deep value overflows it and aborts the test binary, so a test that passes here proves the
/// walk keeps its own stack.
pub fn on_a_small_stack<T: Send + 'static>(body: impl FnOnce() -> T + Send + 'static) -> T {
    thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(body)
        .expect("a thread")
        .join()
        .expect("no panic")
}
