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
//! every stage runs the item inside that copy
//! ([`ItemContext::enter`](crate::run::hooks::ItemContext::enter)). What a stage's nodes set
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
//!
//! # Where its pieces are
//! [`Stream`] itself — the caller's side: reading inputs, handing results back, closing — is
//! here. How it is set up is in [`settings`]; where a program is cut is
//! [`stages`](mod@stages); what travels through them is an [`item`], ordered by each stage's
//! [`inbox`]; what the caller and the stages share, under one lock, is [`shared`]; a stage's
//! worker is [`stage_worker`]; the figures, and how idle time is split, are [`figures`]; what
//! is handed back instead of a result is [`failure`].

mod failure;
mod figures;
mod inbox;
mod item;
mod settings;
mod shared;
mod stage_worker;
mod stages;

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::panic;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::error::RunError;
use super::hooks::Captured;
use super::observer::Ended;
use crate::model::id::NodeId;
use crate::model::value::Value;
use crate::run::board::HeldBoard;
use crate::run::program::Program;
pub use failure::{Failed, StreamError};
pub use figures::{StageFigures, StreamFigures};
use inbox::Inbox;
use item::Item;
pub use settings::{OnError, StreamSettings, DEFAULT_IN_FLIGHT};
use shared::{Caller, StreamShared, StreamState};
use stage_worker::StageWorker;
use stages::{nodes_of, stages};

use super::detach::STOP_GRACE;
use super::hooks::Watch;
use super::latch::wait_watching;

/// How long dropping a stream waits for a node still running before it leaves the node to
/// finish on its thread: a drop cannot be interrupted, and has nobody to hand a signal to.
const DROP_GRACE: Duration = Duration::from_secs(1);

/// Items through a program, overlapped stage by stage; an iterator of `(index, result)`. See
/// the module docs.
pub struct Stream<I: Iterator<Item = Value>> {
    shared: Arc<StreamShared>,
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
        let shared = Arc::new(StreamShared {
            stage_ready: (0..inboxes.len()).map(|_| Condvar::new()).collect(),
            out_ready: Condvar::new(),
            closed: AtomicBool::new(false),
            stop_after: AtomicU64::new(u64::MAX),
            reading: AtomicBool::new(false),
            busy: (0..inboxes.len()).map(|_| AtomicUsize::new(0)).collect(),
            state: Mutex::new(StreamState {
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
                let mut worker = StageWorker {
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
        // Until every stage has stopped, polling the watch; once it says stop, `STOP_GRACE`
        // more at most.
        let watch = self.settings.executor.watch.clone();
        self.stop(watch.as_deref(), None);
    }

    /// The nodes of each stage that was still running an item when closing stopped waiting
    /// for it (the watch said stop, or the stream was dropped), in plan order; empty when every
    /// stage had stopped. A stage of several nodes (a wave) is named whole: one or more of its
    /// nodes were running.
    pub fn left_running(&self) -> &[Vec<NodeId>] {
        &self.left_running
    }

    /// Closes the stream, waiting for its stages as [`StreamShared::wait_for_workers`] does with
    /// `watch` and `deadline`.
    fn stop(&mut self, watch: Option<&dyn Watch>, deadline: Option<Instant>) {
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
        executor.blocking(&mut || shared.wait_for_workers(watch, deadline));
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
            let executor = &self.settings.executor;
            let board = executor.item_board(&self.program);
            let opened = executor.begin_run(
                &self.program,
                Some(self.read),
                board.as_ref(),
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
                board: board.map(HeldBoard),
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

    /// Sleeps until something the caller can take may be there, polling the watch; returns at
    /// once when it says stop.
    fn wait(&mut self) {
        let started = Instant::now();
        let (shared, settings) = (&self.shared, &self.settings);
        let (ordered, next_out) = (settings.ordered, self.next_out);
        let executor = &settings.executor;
        let watch = executor.watch.as_deref();
        let ready = |state: &StreamState| {
            let ready = if ordered {
                state.outbox.contains_key(&next_out)
            } else {
                !state.outbox.is_empty()
            };
            ready || state.panic.is_some() || state.lost.is_some()
        };
        executor.blocking(&mut || {
            let mut arrived = |timeout: Option<Duration>| {
                let mut state = shared.lock();
                if ready(&state) {
                    return true;
                }
                state.caller = Caller::Asleep;
                state = match timeout {
                    Some(timeout) => {
                        shared
                            .out_ready
                            .wait_timeout(state, timeout)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0
                    }
                    None => shared
                        .out_ready
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner),
                };
                state.caller = Caller::Awake;
                false
            };
            let mut interrupted = || watch.is_some_and(Watch::interrupted);
            let stop: Option<&mut dyn FnMut() -> bool> = match watch {
                Some(_) => Some(&mut interrupted),
                None => None,
            };
            wait_watching(&mut arrived, watch, stop, None);
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
                        board,
                        ..
                    } = *item;
                    let ended = Ended::failed_with(failed.as_ref());
                    self.settings.executor.end_work(opened, &ended);
                    drop(board); // Its run is over: its clock may stop.
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
        // `DROP_GRACE` at most, without polling the watch: a watch's poll may take a signal
        // meant for the caller (Ctrl-C), and a drop could not hand it on.
        self.stop(None, Some(Instant::now() + DROP_GRACE));
    }
}
