//! `Stream`: a sequence of items through one program, its stages overlapped, in bounded memory.
//!
//! A loop of runs leaves every node but one idle: while the last node works on item 7, the
//! first waits for item 8. A stream cuts the program into *stages* — the steps of its top-level
//! sequence, each a node or a whole wave — and lends each stage a thread of the program's crew
//! for the stream's life. A stage takes items one at a time and in input order, so a node never
//! sees two items at once (a stateful node needs no lock), while stage *k* works on item *i* and
//! stage *k + 1* on item *i − 1*. A wave inside a stage still runs its branches side by side,
//! for each item, exactly as a run does.
//!
//! ```
//! use std::sync::Arc;
//! use soma_core::{compile, node, NodeError, Program, Stream, StreamSettings, Value};
//!
//! let add = |x: &Value| -> Result<Value, NodeError> { Ok(Value::Int(x.as_int().unwrap_or(0) + 1)) };
//! let (graph, catalog) = (node("a", add) >> node("b", add)).somatize()?;
//! let program = Arc::new(Program::new(&compile(&graph, &catalog)?, &catalog)?);
//! let stream = Stream::start(program, (0..5).map(Value::Int), StreamSettings::default());
//! let out: Vec<Value> = stream.map(|item| item.map(|(_, value)| value)).collect::<Result<_, _>>()?;
//! assert_eq!(out, (2..7).map(Value::Int).collect::<Vec<_>>());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Bounded memory
//! The caller reads inputs lazily, on its own thread, and only while fewer than
//! [`StreamSettings::with_in_flight`] items have been read and not yet handed back. So a stream
//! holds at most that many items however long its input, and a consumer that stops reading stops
//! the stream instead of filling memory. The bound is where items enter, so a stage never holds
//! a finished item back: what the stages after it (or the consumer) hold up shows as the time it
//! sits idle with every item in flight past it and no input being read —
//! [`StageFigures::blocked`], beside [`StageFigures::waiting`] for an item still to come.
//!
//! # Order
//! Items carry their index. Each stage's inbox is keyed by index, and a stage of one worker takes
//! only the next index, so its nodes see items in input order even after a stage of several
//! workers ([`StreamSettings::with_concurrency`]) finished them out of order. Results come out in
//! input order, or as they finish ([`StreamSettings::unordered`]).
//!
//! # Errors
//! An item that fails carries its error through the remaining stages, which skip it, to its place
//! in the output. With [`OnError::Stop`] stages run no item after it and the stream ends once its
//! error has been handed back; with [`OnError::Continue`] the others go on.
//!
//! # Context
//! A run's nodes see what the nodes before them set in the host's context (a `contextvars`
//! variable, say): they run on one thread, or in a wave whose branches each get a copy. A
//! stream's stages run on threads of their own, so the context travels with the item instead:
//! each item gets a copy of the caller's context as it is read ([`Captured::for_item`]), and
//! every stage runs the item inside that copy ([`ItemContext::enter`]). What a stage's nodes set
//! there, the item's later stages see; no other item sees it, and neither does the caller.
//!
//! # Closing
//! [`Stream::close`] tells every stage to stop before its next item, waits until their threads
//! are back with the crew, then drops what was still in flight on the caller's thread. A node
//! already running finishes first, unless the watch says stop (Ctrl-C, a deadline): then closing
//! waits [`STOP_GRACE`] more at most and leaves a node that has not returned to finish on its
//! thread ([`Stream::left_running`] names it). Dropping a stream closes it too, but waits
//! [`DROP_GRACE`] at most for such a node and never polls the watch: a drop cannot be interrupted, and a signal
//! it took would be lost. A stream that ends closes itself.
//!
//! # Threads, and who touches what
//! A stage of *n* workers holds *n* crew threads ([`crate::run::crew`]'s `lend`): a stream of
//! *S* one-worker stages holds *S* threads and the caller's, plus what the waves inside its
//! stages borrow, and gives them back when it ends. They are the crew's, not the stream's: the
//! next run or stream finds them idle.
//!
//! One mutex guards the inboxes, the outbox and the figures; each stage's workers and the caller
//! sleep on a condvar of their own, woken only when something they can take arrived, and once:
//! a wake-up is a system call, and trivial items arrive faster than a woken thread gets back
//! under the lock. A serial stage takes every item waiting for it under one lock and the
//! caller every result ready for it, so the locks an item costs do not grow with the items in
//! flight; a stage hands each item on the moment it is done, never holding a finished item
//! while it runs the next (which may be slow). Nothing is
//! run, no value dropped and no host (an interpreter lock) waited for while it is held: a host's
//! lock is taken around whole stages and given back only in the host's blocking wait, so a
//! thread that waited for it under this mutex could deadlock with one that holds it.
//!
//! # Later variants
//! A stage is a step of the plan and the executor its worker runs it with, nothing more: a
//! stage placed on a device enters it where its worker starts (the host's `branch`), and a
//! remote slice is a stage whose step runs elsewhere — each one more kind of stage, with the
//! same inboxes, order, bound and error rules. Finer stages (a chain inside a wave's branch
//! overlapping across items) would split an item's table between threads as a wave does.

use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::error::RunError;
use super::executor::Executor;
use super::hooks::{Captured, ItemContext, Watch};
use super::keys::RunKeys;
use super::lane::Lane;
use super::observer::{Ended, Opened};
use super::table::Frame;
use crate::model::id::NodeId;
use crate::model::value::Value;
use crate::run::program::{Op, Program};

/// How many items a stream holds at once unless told otherwise: enough to keep a few dozen
/// stage workers busy, few enough that a stream of large items stays small.
pub const DEFAULT_IN_FLIGHT: usize = 64;

/// How often a caller waiting for the next result asks the [`Watch`] whether to stop.
const WATCH_INTERVAL: Duration = Duration::from_millis(5);

/// Once the watch has asked the stream to stop (Ctrl-C, a deadline), how long closing lets the
/// stages reach a node boundary before it stops waiting for those that have not: short, so
/// that a deadline's error comes out within a tenth of a second of it.
const STOP_GRACE: Duration = Duration::from_millis(50);

/// How long dropping a stream waits for a node still running before it leaves the node to
/// finish on its thread: a drop cannot be interrupted, and has nobody to hand a signal to.
const DROP_GRACE: Duration = Duration::from_secs(1);

/// What a stream does after an item fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// Hands back the items before it, then its error, and ends.
    Stop,
    /// Hands back its error in its place and goes on with the others.
    Continue,
}

/// How a stream runs: its bound, order, error rule, stage workers, and the executor whose hooks
/// (driver, watch, host, trace, turn limit) every stage runs its items with.
#[derive(Clone)]
pub struct StreamSettings {
    in_flight: usize,
    ordered: bool,
    on_error: OnError,
    concurrency: HashMap<NodeId, usize>,
    executor: Executor,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            in_flight: DEFAULT_IN_FLIGHT,
            ordered: true,
            on_error: OnError::Stop,
            concurrency: HashMap::new(),
            executor: Executor::new(),
        }
    }
}

impl StreamSettings {
    /// Holds at most `items` items at once (at least 1).
    #[must_use]
    pub fn with_in_flight(mut self, items: usize) -> Self {
        self.in_flight = items.max(1);
        self
    }

    /// Hands results back as they finish instead of in input order.
    #[must_use]
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// What to do after an item fails ([`OnError::Stop`] unless set).
    #[must_use]
    pub fn with_on_error(mut self, rule: OnError) -> Self {
        self.on_error = rule;
        self
    }

    /// Lets `node` work on up to `workers` items at once, for a node that keeps no state between
    /// items. A stage gets the fewest workers any of its nodes allows, so a node in a stage with
    /// others (a wave) keeps one unless they all allow more.
    #[must_use]
    pub fn with_concurrency(mut self, node: NodeId, workers: usize) -> Self {
        self.concurrency.insert(node, workers.max(1));
        self
    }

    /// Runs every stage's items with `executor`'s hooks: its driver, watch (consulted at node
    /// boundaries and while the caller waits), host (around each stage and each blocking wait),
    /// trace (a span for every node of every item) and turn limit (per node, per item).
    #[must_use]
    pub fn with_executor(mut self, executor: Executor) -> Self {
        self.executor = executor;
        self
    }
}

/// An item that failed: where it was, what it was, and why.
#[derive(Clone, Debug)]
pub struct Failed {
    /// Its position in the input, from 0.
    pub index: u64,
    /// The input it was.
    pub input: Value,
    /// What stopped it (naming the node, when a node is to blame).
    pub error: RunError,
}

/// Why a stream handed back an error instead of a result.
#[derive(Clone, Debug)]
pub enum StreamError {
    /// One item failed.
    Item(Failed),
    /// The stream as a whole stopped: its watch said so, or a stage never got a thread.
    Stopped(RunError),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Item(failed) => write!(f, "item {}: {}", failed.index, failed.error),
            StreamError::Stopped(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for StreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StreamError::Item(failed) => Some(&failed.error),
            StreamError::Stopped(error) => Some(error),
        }
    }
}

/// Where one stage's time went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageFigures {
    /// Its nodes, in plan order.
    pub nodes: Vec<NodeId>,
    /// How many items it may work on at once.
    pub workers: usize,
    /// Items it has passed on, failed ones included.
    pub items: u64,
    /// Time its workers spent running items, summed over workers.
    pub busy: Duration,
    /// Time its workers spent idle with an item still to come from before them (the stages
    /// before, or the inputs being read), summed over workers.
    pub waiting: Duration,
    /// Time its workers spent idle because what came after held the stream back: every item in
    /// flight was past this stage and the caller read no input, because the stream was at its
    /// bound or the consumer had not asked for the next result. Summed over workers.
    pub blocked: Duration,
}

/// A stream's figures so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamFigures {
    /// Inputs read.
    pub read: u64,
    /// Results handed back.
    pub succeeded: u64,
    /// Failed items handed back.
    pub failed: u64,
    /// Items read and not yet handed back.
    pub in_flight: usize,
    /// Time the caller spent waiting for the next result.
    pub waiting: Duration,
    /// Each stage, in plan order.
    pub stages: Vec<StageFigures>,
}

/// One item on its way through the stages.
struct Item {
    index: u64,
    input: Value,
    /// When the caller began reading its input: a stage that slept until it came was held up
    /// by what came after it before then, and waited for its input from then on.
    read_at: Instant,
    /// The values its steps produced: the run's table.
    table: Box<[Option<Value>]>,
    /// Why it failed, once it has; the stages after skip it.
    failed: Option<RunError>,
    /// What the last stage made of it.
    result: Option<Value>,
    /// Its own context, copied from the caller's when it was read, entered around each stage
    /// it goes through: what a stage's nodes set there, its next stages see, and no other item
    /// does. `None` when the host carries no context.
    context: Option<Box<dyn ItemContext>>,
    /// The identities of its values, when the stream runs with a cache: each item is a run of
    /// its own, keyed on its own input.
    keys: Option<RunKeys>,
    /// What the executor's observer opened as the item was read, when there is one.
    opened: Option<Opened>,
}

/// Items waiting for one stage, keyed by index. Boxed: a map's node shifts its entries as the
/// first is taken, and an item is large.
struct Inbox {
    items: BTreeMap<u64, Box<Item>>,
    /// One worker: it takes only the next index, so its nodes see the input order.
    serial: bool,
    /// For a serial stage, the index it takes next.
    expected: u64,
    /// Workers asleep on the stage's condvar.
    sleeping: usize,
    /// Wake-ups sent and not yet taken up: a worker already woken is not woken again (each
    /// wake-up is a system call), however many items arrive before it is back under the lock.
    waking: usize,
    /// Items its workers have taken and not yet passed on.
    held: usize,
}

impl Inbox {
    fn ready(&self) -> bool {
        match self.items.first_key_value() {
            None => false,
            Some((&index, _)) => !self.serial || index == self.expected,
        }
    }

    /// Moves the items this stage may run next into `batch`: for a serial stage every item
    /// that follows in index order, for a stage of several workers one (its nodes are slow,
    /// and the others take the rest).
    fn take(&mut self, batch: &mut VecDeque<Box<Item>>) {
        while self.ready() {
            let Some((_, item)) = self.items.pop_first() else {
                break;
            };
            self.expected += 1;
            self.held += 1;
            batch.push_back(item);
            if !self.serial {
                break;
            }
        }
    }

    /// After items arrived: wakes a sleeping worker if one can take them and none is on its way.
    fn wake(&mut self, ready: &Condvar) {
        if self.sleeping > self.waking && self.ready() {
            self.waking += 1;
            ready.notify_one();
        }
    }
}

struct State {
    inboxes: Vec<Inbox>,
    /// Items done with every stage, keyed by index.
    outbox: BTreeMap<u64, Box<Item>>,
    /// Set by the caller once the inputs have run out.
    inputs_done: bool,
    /// Set when the stream closes: every worker returns before its next item.
    closed: bool,
    /// With [`OnError::Stop`], the smallest index that failed: no stage runs an item after it.
    stop_after: u64,
    /// Workers not yet returned (or dropped unrun).
    alive: usize,
    /// Why a worker never got a thread, until the caller reports it.
    lost: Option<String>,
    /// A node's panic, until the caller re-raises it.
    panic: Option<Box<dyn Any + Send>>,
    caller: Caller,
    figures: Vec<StageFigures>,
}

/// Where the caller is, as the last stage sees it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// Not asleep: it looks at the outbox before it sleeps again.
    Awake,
    /// Asleep on `out_ready`.
    Asleep,
    /// Woken, and not yet back under the lock: waking it again would be a wasted system call.
    Woken,
}

impl State {
    /// Whether stage `at` has an item still to come from before it: one in its inbox or an
    /// earlier one, or held by an earlier stage's worker.
    fn upstream(&self, at: usize) -> bool {
        self.inboxes
            .iter()
            .take(at + 1)
            .enumerate()
            .any(|(stage, inbox)| !inbox.items.is_empty() || (stage < at && inbox.held > 0))
    }

    /// Wakes the caller if it sleeps and nobody woke it yet.
    fn wake_caller(&mut self, out_ready: &Condvar) {
        match self.caller {
            Caller::Asleep => {
                self.caller = Caller::Woken;
                out_ready.notify_one();
            }
            Caller::Awake | Caller::Woken => {}
        }
    }
}

struct Shared {
    state: Mutex<State>,
    /// One per stage: where its workers sleep while their inbox has nothing for them.
    stage_ready: Box<[Condvar]>,
    /// Where the caller sleeps: for its next result, or for the workers to return.
    out_ready: Condvar,
    /// `State::closed`, read by a worker between the items of a batch without the lock.
    closed: AtomicBool,
    /// `State::stop_after`, read likewise.
    stop_after: AtomicU64,
    /// Whether the caller is reading an input now: a stage idle meanwhile waits for input.
    reading: AtomicBool,
    /// Per stage, how many of its workers are running an item now: what a stream that stopped
    /// waiting for them names.
    busy: Box<[AtomicUsize]>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing that can panic runs under the lock; a poisoned state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every worker has returned; with a watch, polls it, and once it says stop
    /// waits [`STOP_GRACE`] more at most.
    fn wait_for_workers(&self, watch: Option<&dyn Watch>) {
        let mut stopping_since: Option<Instant> = None;
        let mut state = self.lock();
        while state.alive > 0 {
            let Some(watch) = watch else {
                state = self
                    .out_ready
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            state = self
                .out_ready
                .wait_timeout(state, WATCH_INTERVAL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if state.alive == 0 {
                break;
            }
            drop(state);
            // Out of the lock: a watch may take the host's lock to look for signals.
            watch.poll();
            if watch.interrupted()
                && stopping_since.get_or_insert_with(Instant::now).elapsed() >= STOP_GRACE
            {
                return;
            }
            state = self.lock();
        }
    }

    /// Waits until every worker has returned, or until `until`.
    fn wait_for_workers_until(&self, until: Instant) {
        let mut state = self.lock();
        while state.alive > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = self
                .out_ready
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Tells every worker to stop, and the caller to look.
    fn close(&self, state: &mut State) {
        state.closed = true;
        self.closed.store(true, Ordering::Relaxed);
        for ready in &self.stage_ready {
            ready.notify_all();
        }
        self.out_ready.notify_all();
    }
}

/// The stages of a program: the steps of its top-level sequence, each with the slots to drop
/// after it; a program of one step or one wave is one stage.
fn stages(program: &Program) -> Vec<(&Op, &[usize])> {
    match &program.root {
        Op::Sequence {
            steps, drop_after, ..
        } => steps
            .iter()
            .enumerate()
            .map(|(at, step)| (step, drop_after.get(at).map_or(&[][..], |d| &**d)))
            .collect(),
        whole @ (Op::Empty
        | Op::Execute(_)
        | Op::Wave { .. }
        | Op::Map(_)
        | Op::Switch(_)
        | Op::Loop(_)) => vec![(whole, &[][..])],
    }
}

/// The nodes of a stage, in plan order; walked with a stack, however deep the stage nests.
fn nodes_of(op: &Op, ids: &[NodeId]) -> Vec<(usize, NodeId)> {
    let mut found = Vec::new();
    let mut pending = vec![op];
    while let Some(op) = pending.pop() {
        match op {
            Op::Empty => {}
            Op::Execute(step) => found.push((step.slot(), ids[step.slot()].clone())),
            Op::Map(op) => found.push((op.step.slot(), ids[op.step.slot()].clone())),
            Op::Switch(op) => found.push((op.step.slot(), ids[op.step.slot()].clone())),
            Op::Loop(op) => found.push((op.step.slot(), ids[op.step.slot()].clone())),
            Op::Sequence { steps, .. } => pending.extend(steps.iter()),
            Op::Wave { branches, .. } => pending.extend(branches.iter()),
        }
    }
    found.sort_unstable_by_key(|&(slot, _)| slot);
    found
}

/// Items through a program, overlapped stage by stage; an iterator of `(index, result)`. See
/// the module docs.
pub struct Stream<I: Iterator<Item = Value>> {
    shared: Arc<Shared>,
    program: Arc<Program>,
    settings: Arc<StreamSettings>,
    inputs: I,
    read: u64,
    in_flight: usize,
    /// For an ordered stream, the index handed back next.
    next_out: u64,
    /// Results taken from the outbox in one go and not yet handed back (still in flight).
    ready: VecDeque<Box<Item>>,
    inputs_done: bool,
    /// Set once the stream has ended or closed: `next` answers `None` from then on.
    finished: bool,
    succeeded: u64,
    failed: u64,
    waiting: Duration,
    /// The caller's context, as the host captured it when the stream started: each item gets a
    /// copy of its own as it is read ([`Captured::for_item`]).
    captured: Option<Arc<dyn Captured>>,
    /// The nodes of each stage still running an item when closing stopped waiting for them.
    left_running: Vec<Vec<NodeId>>,
}

/// How long closing waits for the stages to stop.
#[derive(Clone, Copy)]
enum Wait {
    /// Until every stage has stopped, polling the watch; once it says stop, [`STOP_GRACE`] more
    /// at most.
    ForStages,
    /// [`DROP_GRACE`] at most, without polling the watch: a watch's poll may take a signal
    /// meant for the caller (Ctrl-C), and a drop could not hand it on.
    Briefly,
}

/// What the caller found when it looked at the shared state.
enum Found {
    Panic(Box<dyn Any + Send>),
    Lost(String),
    Interrupted,
    Item(Box<Item>),
    End,
    Nothing,
}

impl<I: Iterator<Item = Value>> Stream<I> {
    /// Starts streaming `inputs` through `program`: lends each stage its workers and returns at
    /// once. Inputs are read by the caller's thread as results are asked for, never more than
    /// the bound ahead.
    pub fn start(program: Arc<Program>, inputs: I, settings: StreamSettings) -> Stream<I> {
        let settings = Arc::new(settings);
        let mut inboxes = Vec::new();
        let mut figures = Vec::new();
        for (op, _) in stages(&program) {
            let nodes: Vec<NodeId> = nodes_of(op, &program.ids)
                .into_iter()
                .map(|(_, id)| id)
                .collect();
            let workers = nodes
                .iter()
                .map(|id| settings.concurrency.get(id).copied().unwrap_or(1))
                .min()
                .unwrap_or(1);
            inboxes.push(Inbox {
                items: BTreeMap::new(),
                serial: workers == 1,
                expected: 0,
                sleeping: 0,
                waking: 0,
                held: 0,
            });
            figures.push(StageFigures {
                nodes,
                workers,
                ..StageFigures::default()
            });
        }
        let workers: usize = figures.iter().map(|stage| stage.workers).sum();
        // On the caller's thread: every stage runs in its context, as a wave's branches do.
        let captured: Option<Arc<dyn Captured>> = settings
            .executor
            .host
            .as_ref()
            .and_then(|host| host.capture())
            .map(Arc::from);
        let shared = Arc::new(Shared {
            stage_ready: (0..inboxes.len()).map(|_| Condvar::new()).collect(),
            out_ready: Condvar::new(),
            closed: AtomicBool::new(false),
            stop_after: AtomicU64::new(u64::MAX),
            reading: AtomicBool::new(false),
            busy: (0..inboxes.len()).map(|_| AtomicUsize::new(0)).collect(),
            state: Mutex::new(State {
                inboxes,
                outbox: BTreeMap::new(),
                inputs_done: false,
                closed: false,
                stop_after: u64::MAX,
                alive: workers,
                lost: None,
                panic: None,
                caller: Caller::Awake,
                figures: figures.clone(),
            }),
        });
        let tasks: Vec<_> = figures
            .iter()
            .enumerate()
            .flat_map(|(stage, figures)| (0..figures.workers).map(move |_| stage))
            .map(|stage| {
                let mut worker = Worker {
                    shared: Arc::clone(&shared),
                    program: Arc::clone(&program),
                    settings: Arc::clone(&settings),
                    stage,
                    captured: captured.clone(),
                    ran: false,
                };
                move || worker.run()
            })
            .collect();
        if let Err(refused) = program.crew.lend(tasks, settings.executor.host.as_ref()) {
            shared.lock().lost = Some(refused.to_string());
        }
        Stream {
            shared,
            program,
            settings,
            inputs,
            read: 0,
            in_flight: 0,
            next_out: 0,
            ready: VecDeque::new(),
            inputs_done: false,
            finished: false,
            succeeded: 0,
            failed: 0,
            waiting: Duration::ZERO,
            captured,
            left_running: Vec::new(),
        }
    }

    /// The inputs the stream reads (for an embedder that must show what they hold to a garbage
    /// collector).
    pub fn inputs(&self) -> &I {
        &self.inputs
    }

    /// The stream's figures so far: items read, handed back and failed, and each stage's time.
    pub fn figures(&self) -> StreamFigures {
        let stages = self.shared.lock().figures.clone();
        StreamFigures {
            read: self.read,
            succeeded: self.succeeded,
            failed: self.failed,
            in_flight: self.in_flight,
            waiting: self.waiting,
            stages,
        }
    }

    /// Stops the stream: every stage stops before its next item, and this returns once their
    /// threads are back with the crew (a node already running finishes first). What was in
    /// flight is dropped here. Closing twice does nothing.
    ///
    /// Once the watch says stop (Ctrl-C, a deadline), this waits 50 ms more at most: a
    /// node that does not return by then (one waiting for an event that will not come) is left
    /// to finish on its thread, which then goes back to the crew; its item is dropped, and
    /// [`Stream::left_running`] names it.
    pub fn close(&mut self) {
        self.stop(Wait::ForStages);
    }

    /// The nodes of each stage that was still running an item when closing stopped waiting
    /// for it (the watch said stop, or the stream was dropped), in plan order; empty when every
    /// stage had stopped. A stage of several nodes (a wave) is named whole: one or more of its
    /// nodes were running.
    pub fn left_running(&self) -> &[Vec<NodeId>] {
        &self.left_running
    }

    fn stop(&mut self, wait: Wait) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.inputs_done = true;
        let shared = &self.shared;
        let mut state = shared.lock();
        shared.close(&mut state);
        drop(state);
        let executor = &self.settings.executor;
        let watch = self.settings.executor.watch.as_deref();
        executor.blocking(&mut || match wait {
            Wait::ForStages => shared.wait_for_workers(watch),
            Wait::Briefly => shared.wait_for_workers_until(Instant::now() + DROP_GRACE),
        });
        // Dropped out of the lock, on this thread: a value's drop may need the host. A worker
        // left running finds the stream closed and drops its item itself.
        let mut state = shared.lock();
        let inboxes = std::mem::take(&mut state.inboxes);
        let outbox = std::mem::take(&mut state.outbox);
        self.left_running = shared
            .busy
            .iter()
            .zip(&state.figures)
            .filter(|(busy, _)| busy.load(Ordering::Relaxed) > 0)
            .map(|(_, stage)| stage.nodes.clone())
            .collect();
        drop(state);
        drop((inboxes, outbox, std::mem::take(&mut self.ready)));
    }

    /// Reads inputs while fewer than the bound are in flight, handing each to the first stage
    /// as soon as it is read (the next input may be slow to come).
    fn feed(&mut self) {
        while !self.inputs_done && self.in_flight < self.settings.in_flight {
            self.shared.reading.store(true, Ordering::Relaxed);
            let read_at = Instant::now();
            let input = self.inputs.next();
            self.shared.reading.store(false, Ordering::Relaxed);
            let Some(input) = input else {
                self.inputs_done = true;
                self.shared.lock().inputs_done = true;
                break;
            };
            let mut context = self
                .captured
                .as_ref()
                .and_then(|captured| captured.for_item());
            let opened = self.settings.executor.begin_run(
                &self.program,
                Some(self.read),
                context.as_deref_mut(),
            );
            let item = Box::new(Item {
                index: self.read,
                input,
                read_at,
                table: vec![None; self.program.len()].into(),
                failed: None,
                result: None,
                context,
                keys: self.settings.executor.run_keys(&self.program),
                opened,
            });
            self.read += 1;
            self.in_flight += 1;
            let mut state = self.shared.lock();
            let Some(first) = state.inboxes.first_mut() else {
                // Closed meanwhile; the item is dropped out of the lock.
                drop(state);
                drop(item);
                break;
            };
            first.items.insert(item.index, item);
            first.wake(&self.shared.stage_ready[0]);
        }
    }

    fn look(&mut self) -> Found {
        if self
            .settings
            .executor
            .watch
            .as_ref()
            .is_some_and(|w| w.interrupted())
        {
            return Found::Interrupted;
        }
        if let Some(item) = self.ready.pop_front() {
            return Found::Item(item);
        }
        let mut state = self.shared.lock();
        if let Some(payload) = state.panic.take() {
            return Found::Panic(payload);
        }
        if let Some(reason) = state.lost.take() {
            return Found::Lost(reason);
        }
        // Every result there is taken at once: one lock for the lot.
        if self.settings.ordered {
            let mut next = self.next_out;
            while let Some(entry) = state.outbox.first_entry() {
                if *entry.key() != next {
                    break;
                }
                self.ready.push_back(entry.remove());
                next += 1;
            }
        } else {
            self.ready
                .extend(std::mem::take(&mut state.outbox).into_values());
        }
        drop(state);
        match self.ready.pop_front() {
            Some(item) => Found::Item(item),
            None if self.inputs_done && self.in_flight == 0 => Found::End,
            None => Found::Nothing,
        }
    }

    /// Sleeps until something the caller can take may be there, polling the watch.
    fn wait(&mut self) {
        let started = Instant::now();
        let (shared, settings) = (&self.shared, &self.settings);
        let (ordered, next_out) = (settings.ordered, self.next_out);
        let executor = &settings.executor;
        executor.blocking(&mut || loop {
            let mut state = shared.lock();
            let ready = if ordered {
                state.outbox.contains_key(&next_out)
            } else {
                !state.outbox.is_empty()
            };
            if ready || state.panic.is_some() || state.lost.is_some() {
                return;
            }
            state.caller = Caller::Asleep;
            state = match &settings.executor.watch {
                Some(_) => {
                    shared
                        .out_ready
                        .wait_timeout(state, WATCH_INTERVAL)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
                None => shared
                    .out_ready
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner),
            };
            state.caller = Caller::Awake;
            drop(state);
            // Out of the lock: a watch may take the host's lock to look for signals.
            if let Some(watch) = &settings.executor.watch {
                watch.poll();
                if watch.interrupted() {
                    return;
                }
            }
        });
        self.waiting += started.elapsed();
    }
}

impl<I: Iterator<Item = Value>> Iterator for Stream<I> {
    type Item = Result<(u64, Value), StreamError>;

    /// The next result: in input order unless the stream is unordered.
    ///
    /// # Panics
    /// Re-raises a node's panic, once every stage has stopped.
    fn next(&mut self) -> Option<Self::Item> {
        if self.finished {
            return None;
        }
        self.feed();
        loop {
            match self.look() {
                Found::Nothing => self.wait(),
                Found::Panic(payload) => {
                    self.close();
                    panic::resume_unwind(payload);
                }
                Found::Lost(reason) => {
                    self.close();
                    return Some(Err(StreamError::Stopped(RunError::NoThread { reason })));
                }
                Found::Interrupted => {
                    self.close();
                    let running: Vec<NodeId> =
                        self.left_running.iter().flatten().cloned().collect();
                    return Some(Err(StreamError::Stopped(if running.is_empty() {
                        RunError::Interrupted
                    } else {
                        RunError::Abandoned { running }
                    })));
                }
                Found::End => {
                    self.close();
                    return None;
                }
                Found::Item(item) => {
                    self.in_flight -= 1;
                    self.next_out += 1;
                    let Item {
                        index,
                        input,
                        failed,
                        result,
                        opened,
                        ..
                    } = *item;
                    let ended = Ended::failed_with(failed.as_ref());
                    self.settings.executor.end_work(opened, &ended);
                    return Some(match failed {
                        None => {
                            self.succeeded += 1;
                            Ok((index, result.expect("the last stage made every result")))
                        }
                        Some(error) => {
                            self.failed += 1;
                            if self.settings.on_error == OnError::Stop {
                                self.close();
                            }
                            Err(StreamError::Item(Failed {
                                index,
                                input,
                                error,
                            }))
                        }
                    });
                }
            }
        }
    }
}

impl<I: Iterator<Item = Value>> Drop for Stream<I> {
    /// Closes the stream, waiting a second at most for a node still running, and never polling
    /// the watch (see the module docs).
    fn drop(&mut self) {
        self.stop(Wait::Briefly);
    }
}

/// One worker of one stage, on a lent thread; counted alive until it is dropped, run or not.
struct Worker {
    shared: Arc<Shared>,
    program: Arc<Program>,
    settings: Arc<StreamSettings>,
    stage: usize,
    /// The caller's context (as the host captured it when the stream started), entered by the
    /// worker around its whole life on its thread, as a wave's branch enters its wave's.
    captured: Option<Arc<dyn Captured>>,
    /// Whether it got a thread: dropped without, it tells the caller, which would wait forever.
    ran: bool,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.alive -= 1;
        if !self.ran && !state.closed && state.lost.is_none() {
            state.lost = Some("no thread was free for a stage of the stream".to_owned());
        }
        self.shared.out_ready.notify_all();
    }
}

impl Worker {
    fn run(&mut self) {
        self.ran = true;
        match self.captured.clone() {
            Some(captured) => captured.enter(&mut || self.serve()),
            None => self.serve(),
        }
    }

    /// Takes, runs and passes on items until the stream closes. Never unwinds: a node's panic
    /// is caught and handed to the caller.
    ///
    /// A serial stage takes every item waiting for it at once (one lock for the lot), and hands
    /// each on the moment it is done: the next item may be a slow one, and the next stage must
    /// not wait for it.
    fn serve(&self) {
        let executor = &self.settings.executor;
        let all = stages(&self.program);
        let (op, drops) = all[self.stage];
        let last = self.stage + 1 == all.len();
        let mut batch = VecDeque::new();
        let mut idle = Idle::default();
        while self.take(executor, &mut batch, &mut idle) {
            let mut started = Instant::now();
            while let Some(mut item) = batch.pop_front() {
                if self.shared.closed.load(Ordering::Relaxed) {
                    // The caller has taken the inboxes away: what this worker holds is dropped
                    // here, out of the lock.
                    drop((item, std::mem::take(&mut batch)));
                    return;
                }
                if item.index > self.shared.stop_after.load(Ordering::Relaxed) {
                    // An earlier item failed and the stream stops there: this one is never
                    // handed back.
                    drop(item);
                    self.pass(None, Duration::ZERO, &mut idle);
                    started = Instant::now();
                    continue;
                }
                if item.failed.is_none() {
                    let busy = &self.shared.busy[self.stage];
                    busy.fetch_add(1, Ordering::Relaxed);
                    let ran = self.run_in_context(&mut item, executor, op, drops, last);
                    busy.fetch_sub(1, Ordering::Relaxed);
                    if let Err(payload) = ran {
                        self.panicked(payload);
                        drop((item, std::mem::take(&mut batch)));
                        return;
                    }
                }
                // One clock reading an item: where one ends the next begins.
                let now = Instant::now();
                self.pass(Some(item), now - started, &mut idle);
                started = now;
            }
        }
    }

    /// Records a node's panic for the caller (the first one: a later one is dropped, out of
    /// the lock) and closes the stream.
    fn panicked(&self, payload: Box<dyn Any + Send>) {
        let mut state = self.shared.lock();
        let later = match state.panic {
            None => {
                state.panic = Some(payload);
                None
            }
            Some(_) => Some(payload),
        };
        self.shared.close(&mut state);
        drop(state);
        drop(later);
    }

    /// Runs this stage on `item` inside the item's own context, if it has one; a node's panic
    /// is caught inside the context, and handed back.
    fn run_in_context(
        &self,
        item: &mut Item,
        executor: &Executor,
        op: &Op,
        drops: &[usize],
        last: bool,
    ) -> Result<(), Box<dyn Any + Send>> {
        let mut context = item.context.take();
        let mut ran = Ok(());
        let mut run = || {
            ran = panic::catch_unwind(AssertUnwindSafe(|| {
                self.run_item(executor, op, drops, last, item);
            }));
        };
        match &mut context {
            Some(context) => context.enter(&mut run),
            None => run(),
        }
        item.context = context;
        ran
    }

    fn run_item(&self, executor: &Executor, op: &Op, drops: &[usize], last: bool, item: &mut Item) {
        let mut frame = Frame {
            base: 0,
            own: &mut item.table,
            shared: None,
        };
        let lane = Lane::root(&self.program.crew, &self.program, None, item.keys.as_ref());
        match executor.walk(op, &item.input, &mut frame, lane) {
            Ok(()) if !last => {
                for &slot in drops {
                    item.table[slot] = None;
                }
            }
            walked => {
                // The last stage, or a failure: what a run would have returned.
                let input = &item.input;
                match Executor::finish(&self.program, walked, &mut item.table, || input.clone()) {
                    Ok(value) => item.result = Some(value),
                    Err(error) => item.failed = Some(error),
                }
                item.table = Box::new([]);
            }
        }
    }

    /// Fills `batch` with the items this stage runs next; `false` once closed. The time it
    /// sleeps for want of items goes to `idle`, as waiting or blocked.
    fn take(&self, executor: &Executor, batch: &mut VecDeque<Box<Item>>, idle: &mut Idle) -> bool {
        let (shared, at) = (&*self.shared, self.stage);
        let mut slept: Option<Sleep> = None;
        loop {
            let mut state = shared.lock();
            if state.closed {
                return false;
            }
            state.inboxes[at].take(batch);
            if let Some(first) = batch.front() {
                let read_at = first.read_at;
                drop(state);
                if let Some(sleep) = slept {
                    idle.add(sleep, Some(read_at));
                }
                return true;
            }
            // Why it is about to be idle: an item is still to come from before it (or from the
            // inputs being read), or everything in flight is past it and the caller reads no
            // more for now.
            let blocked = !state.upstream(at)
                && !state.inputs_done
                && !shared.reading.load(Ordering::Relaxed);
            drop(state);
            if let Some(sleep) = slept.take() {
                idle.add(sleep, None);
            }
            let from = Instant::now();
            // Asleep with the host's lock given back, so the stages before can run.
            executor.blocking(&mut || {
                let mut state = shared.lock();
                state.inboxes[at].sleeping += 1;
                while !state.closed && !state.inboxes[at].ready() {
                    state = shared.stage_ready[at]
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                let inbox = &mut state.inboxes[at];
                inbox.sleeping -= 1;
                inbox.waking = inbox.waking.saturating_sub(1);
            });
            slept = Some(Sleep {
                from,
                to: Instant::now(),
                blocked,
            });
        }
    }

    /// Hands `item` to the next stage, or to the caller after the last (`None`: one dropped
    /// after a failure that stops the stream), and counts it and the time spent on it in the
    /// stage's figures.
    fn pass(&self, item: Option<Box<Item>>, busy: Duration, idle: &mut Idle) {
        let shared = &*self.shared;
        let mut state = shared.lock();
        let figures = &mut state.figures[self.stage];
        figures.busy += busy;
        figures.waiting += std::mem::take(&mut idle.waiting);
        figures.blocked += std::mem::take(&mut idle.blocked);
        if state.closed {
            // The caller has taken the inboxes away: the item is dropped out of the lock.
            drop(state);
            drop(item);
            return;
        }
        state.inboxes[self.stage].held -= 1;
        let Some(item) = item else {
            return;
        };
        state.figures[self.stage].items += 1;
        if item.failed.is_some() && self.settings.on_error == OnError::Stop {
            state.stop_after = state.stop_after.min(item.index);
            shared.stop_after.store(state.stop_after, Ordering::Relaxed);
        }
        let next = self.stage + 1;
        if next < state.inboxes.len() {
            let inbox = &mut state.inboxes[next];
            inbox.items.insert(item.index, item);
            inbox.wake(&shared.stage_ready[next]);
        } else {
            state.outbox.insert(item.index, item);
            state.wake_caller(&shared.out_ready);
        }
    }
}

/// Time a worker has spent idle and not yet counted in its stage's figures.
#[derive(Default)]
struct Idle {
    waiting: Duration,
    blocked: Duration,
}

/// One stretch of a worker's sleep, and whether it began held up by what comes after it.
#[derive(Clone, Copy)]
struct Sleep {
    from: Instant,
    to: Instant,
    blocked: bool,
}

impl Idle {
    /// Counts `sleep`, ended by an item whose input the caller began reading at `read_at`: a
    /// sleep that began held up stayed so until then, and waited for that item after.
    fn add(&mut self, sleep: Sleep, read_at: Option<Instant>) {
        let Sleep { from, to, blocked } = sleep;
        if !blocked {
            self.waiting += to - from;
            return;
        }
        let held_until = read_at.map_or(to, |read_at| read_at.clamp(from, to));
        self.blocked += held_until - from;
        self.waiting += to - held_until;
    }
}

#[cfg(test)]
mod tests {
    //! How a worker's sleep is split between waiting and blocked, on made-up instants: the rule
    //! itself, which the figures of a real stream follow (`benches/python/stream.py` shows them
    //! on a slow consumer and a slow input; timing has no place in a test).

    use std::time::{Duration, Instant};

    use super::{Idle, Sleep};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_sleep_begun_with_an_item_still_to_come_is_all_waiting() {
        let from = Instant::now();
        let mut idle = Idle::default();
        let sleep = Sleep {
            from,
            to: from + ms(30),
            blocked: false,
        };
        idle.add(sleep, Some(from + ms(10)));
        assert_eq!((idle.waiting, idle.blocked), (ms(30), ms(0)));
    }

    #[test]
    fn a_sleep_begun_held_up_is_blocked_until_the_next_input_is_read_and_waiting_after() {
        let from = Instant::now();
        let mut idle = Idle::default();
        let sleep = Sleep {
            from,
            to: from + ms(30),
            blocked: true,
        };
        idle.add(sleep, Some(from + ms(20)));
        assert_eq!((idle.waiting, idle.blocked), (ms(10), ms(20)));
    }

    #[test]
    fn a_sleep_begun_held_up_and_ended_without_an_item_is_all_blocked() {
        let from = Instant::now();
        let mut idle = Idle::default();
        let sleep = Sleep {
            from,
            to: from + ms(30),
            blocked: true,
        };
        idle.add(sleep, None);
        assert_eq!((idle.waiting, idle.blocked), (ms(0), ms(30)));
    }

    #[test]
    fn an_input_read_outside_the_sleep_is_taken_as_its_nearest_end() {
        let before = Instant::now();
        let from = before + ms(50);
        let after = from + ms(80);
        let mut idle = Idle::default();
        idle.add(
            Sleep {
                from,
                to: from + ms(30),
                blocked: true,
            },
            Some(before),
        );
        assert_eq!((idle.waiting, idle.blocked), (ms(30), ms(0)));
        idle.add(
            Sleep {
                from,
                to: from + ms(30),
                blocked: true,
            },
            Some(after),
        );
        assert_eq!((idle.waiting, idle.blocked), (ms(30), ms(30)));
    }
}
