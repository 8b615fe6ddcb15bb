//! `Flow`: a stream of items through a program that has async nodes, each item a run of its
//! own on the embedder's loop, without a thread per item or per stage.
//!
//! A stream of sync nodes ([`crate::Stream`]) gives each node a stage of threads. A program
//! with async nodes instead runs each item as a whole run ([`Executor::start`]): its async
//! nodes awaited on the loop, its sync pieces lent to the crew, while the items in flight
//! overlap. What a stream promises holds the same way:
//! - **bounded**: at most `in_flight` items started and not handed back ([`Flow::has_room`]);
//!   the embedder reads its inputs lazily, only while there is room;
//! - **each node at its concurrency**: a node works on as many items at once as it allows
//!   ([`Limits`]); unless told, an async node as many as `in_flight`, a sync node one;
//! - **order**: results are handed back in input order, or as they finish when unordered;
//! - **errors**: with [`OnError::Stop`], the first failure handed back ends the flow, the items
//!   still in flight cancelled and their results dropped; with [`OnError::Continue`] the others
//!   go on.
//!
//! The embedder spawns each item's task on its loop ([`Flow::start`], [`Flow::keep`]) and asks
//! for results from wherever it waits: the loop's thread ([`Flow::next`] with a waker), or
//! another thread ([`Flow::wait`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::thread;
use std::time::Duration;

use super::hooks::{Spawned, Tasks};
use super::limits::Limits;
use super::{Settled, Task};
use crate::model::id::NodeId;
use crate::model::value::Value;
use crate::run::error::RunError;
use crate::run::executor::Executor;
use crate::run::program::Program;
use crate::run::stream::OnError;

/// How a [`Flow`] runs: its bound, order, error rule and each node's concurrency.
#[derive(Clone, Debug)]
pub struct FlowSettings {
    in_flight: usize,
    ordered: bool,
    on_error: OnError,
    concurrency: HashMap<NodeId, usize>,
}

impl FlowSettings {
    /// At most `in_flight` items at once (at least 1), in input order, stopping at the first
    /// failure, each node at its default concurrency: `in_flight` items at once for a step
    /// that awaits (an async node's, or a step that decides holding one), one for any other.
    pub fn new(in_flight: usize) -> Self {
        FlowSettings {
            in_flight: in_flight.max(1),
            ordered: true,
            on_error: OnError::Stop,
            concurrency: HashMap::new(),
        }
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

    /// Lets `node` work on up to `items` items at once.
    #[must_use]
    pub fn with_concurrency(mut self, node: NodeId, items: usize) -> Self {
        self.concurrency.insert(node, items.max(1));
        self
    }
}

/// An item's outcome, or the panic its run raised.
pub type ItemOutcome = thread::Result<Result<Value, RunError>>;

/// A stream of items through a program with async nodes; see the module's header.
pub struct Flow {
    executor: Executor,
    program: Arc<Program>,
    tasks: Arc<dyn Tasks>,
    limits: Arc<Limits>,
    settings: FlowSettings,
    state: Mutex<FlowState>,
    changed: Arc<Condvar>,
}

struct FlowState {
    /// How many items were started: the index of the next.
    started: u64,
    /// Items started and not handed back, by index.
    pending: BTreeMap<u64, Item>,
    /// No item starts any more: one failed (with `OnError::Stop`), or the flow was cancelled.
    stopped: bool,
    /// The reader on the loop waiting for a result, if one is.
    waker: Option<Waker>,
    /// The items a cancellation cancelled, for a reader that waits for them to end.
    cancelled: Vec<Arc<Settled>>,
}

struct Item {
    input: Value,
    settled: Arc<Settled>,
    spawned: Option<Box<dyn Spawned>>,
}

impl Flow {
    /// A flow of `program`'s runs with `executor`'s hooks, on the loop `tasks` is the side of.
    pub fn new(
        executor: Executor,
        program: &Arc<Program>,
        settings: FlowSettings,
        tasks: Arc<dyn Tasks>,
    ) -> Arc<Self> {
        let limits = Arc::new(Limits::new(program, settings.in_flight, |slot| {
            settings.concurrency.get(&program.ids[slot]).copied()
        }));
        Arc::new(Flow {
            executor,
            program: Arc::clone(program),
            tasks,
            limits,
            settings,
            state: Mutex::new(FlowState {
                started: 0,
                pending: BTreeMap::new(),
                stopped: false,
                waker: None,
                cancelled: Vec::new(),
            }),
            changed: Arc::new(Condvar::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, FlowState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether another item may start now: fewer than `in_flight` are started and not handed
    /// back, and the flow has not stopped.
    pub fn has_room(&self) -> bool {
        let state = self.lock();
        !state.stopped && state.pending.len() < self.settings.in_flight
    }

    /// Whether no item is started and not handed back.
    pub fn is_empty(&self) -> bool {
        self.lock().pending.is_empty()
    }

    /// Whether the flow has stopped: no item starts any more.
    pub fn is_stopped(&self) -> bool {
        self.lock().stopped
    }

    /// Starts the next item, on `input`: its index, and its task, for the embedder to spawn
    /// on the loop (in a copy of the reader's context) and [`Flow::keep`].
    pub fn start(self: &Arc<Self>, input: Value) -> (u64, Task) {
        let wake = {
            let (changed, flow) = (Arc::clone(&self.changed), Arc::downgrade(self));
            move || {
                // Taken under the state's lock, which the reader holds while it decides to
                // wait: a finish is never lost between its look and its sleep.
                if let Some(flow) = flow.upgrade() {
                    let waker = flow.lock().waker.take();
                    changed.notify_all();
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                }
            }
        };
        let index = {
            let mut state = self.lock();
            state.started += 1;
            state.started - 1
        };
        let (task, settled) = self.executor.start_run(
            &self.program,
            input.clone(),
            Arc::clone(&self.tasks),
            Some(Arc::clone(&self.limits)),
            Some(Box::new(wake)),
            Some(index),
        );
        let mut state = self.lock();
        state.pending.insert(
            index,
            Item {
                input,
                settled,
                spawned: None,
            },
        );
        (index, task)
    }

    /// Keeps item `index`'s task, to cancel it; a flow stopped meanwhile cancels it at once.
    pub fn keep(&self, index: u64, spawned: Box<dyn Spawned>) {
        let mut state = self.lock();
        let stopped = state.stopped;
        match state.pending.get_mut(&index) {
            Some(item) if !stopped => item.spawned = Some(spawned),
            Some(_) | None => {
                drop(state);
                spawned.cancel();
            }
        }
    }

    /// The next item to hand back, if one is ready — the first in input order, or the first
    /// finished when unordered: its index, its input and its outcome. A failure handed back
    /// with [`OnError::Stop`] stops the flow, and cancels the items still in flight.
    pub fn next(&self) -> Option<(u64, Value, ItemOutcome)> {
        let mut state = self.lock();
        let ready = if self.settings.ordered {
            state
                .pending
                .first_key_value()
                .filter(|(_, item)| item.settled.is_done())
                .map(|(&index, _)| index)
        } else {
            state
                .pending
                .iter()
                .find(|(_, item)| item.settled.is_done())
                .map(|(&index, _)| index)
        }?;
        let item = state
            .pending
            .remove(&ready)
            .expect("the ready item is pending");
        let outcome = item.settled.take().expect("a done item has its outcome");
        let failed = !matches!(outcome, Ok(Ok(_)));
        let cancelled = if failed && self.settings.on_error == OnError::Stop {
            Self::stop(&mut state)
        } else {
            Vec::new()
        };
        drop(state);
        for spawned in cancelled {
            spawned.cancel();
        }
        Some((ready, item.input, outcome))
    }

    /// Stops the flow and takes the tasks of its items in flight, whose results are dropped.
    fn stop(state: &mut FlowState) -> Vec<Box<dyn Spawned>> {
        state.stopped = true;
        std::mem::take(&mut state.pending)
            .into_values()
            .filter_map(|item| item.spawned)
            .collect()
    }

    /// Cancels the flow: no item starts any more, the items in flight are cancelled and their
    /// results dropped. Returns the nodes that were running, innermost (see
    /// [`Settled::running`]), each once, in the order of the items.
    pub fn cancel(&self) -> Vec<NodeId> {
        let running = self.running();
        let (cancelled, settled) = {
            let mut state = self.lock();
            let settled: Vec<Arc<Settled>> = state
                .pending
                .values()
                .map(|item| Arc::clone(&item.settled))
                .collect();
            (Self::stop(&mut state), settled)
        };
        for spawned in cancelled {
            spawned.cancel();
        }
        self.lock().cancelled.extend(settled);
        running
    }

    /// Blocks until the items a [`Flow::cancel`] cancelled have ended, or `timeout` has passed:
    /// for a reader on another thread that closes the flow. Says whether they all ended.
    /// A `timeout` too large to be a point in time waits for as long as it takes.
    pub fn wait_cancelled(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now().checked_add(timeout);
        let cancelled = std::mem::take(&mut self.lock().cancelled);
        cancelled.iter().all(|settled| {
            if let Some(deadline) = deadline {
                return settled.wait(deadline.saturating_duration_since(std::time::Instant::now()));
            }
            while !settled.wait(Duration::from_secs(1)) {}
            true
        })
    }

    /// The nodes running now in the items in flight, each once.
    pub fn running(&self) -> Vec<NodeId> {
        let state = self.lock();
        let mut seen = std::collections::HashSet::new();
        state
            .pending
            .values()
            .flat_map(|item| item.settled.running())
            .filter(|id| seen.insert(id.clone()))
            .collect()
    }

    /// Blocks until an item may be ready or `timeout` has passed: for a reader on another
    /// thread than the loop's, which waits a few milliseconds at a time (polling for signals
    /// between).
    pub fn wait(&self, timeout: Duration) {
        let state = self.lock();
        let ready = |state: &FlowState| {
            state.pending.values().any(|item| item.settled.is_done()) || state.pending.is_empty()
        };
        if ready(&state) {
            return;
        }
        let _ = self
            .changed
            .wait_timeout(state, timeout)
            .unwrap_or_else(PoisonError::into_inner);
    }

    /// Wakes `waker` once every item a [`Flow::cancel`] cancelled has ended (at once when they
    /// have), and says whether they have: for a reader on the loop that closes the flow.
    pub fn wake_when_cancelled_ended(&self, waker: &Waker) -> bool {
        let mut state = self.lock();
        state.cancelled.retain(|settled| !settled.is_done());
        if state.cancelled.is_empty() {
            return true;
        }
        state.waker = Some(waker.clone());
        false
    }

    /// Wakes `waker` once an item finishes: for a reader on the loop, which polls
    /// [`Flow::next`] again then. Woken at once when one is done already.
    pub fn wake_when_ready(&self, waker: &Waker) {
        let mut state = self.lock();
        if state.pending.values().any(|item| item.settled.is_done()) || state.pending.is_empty() {
            drop(state);
            waker.wake_by_ref();
            return;
        }
        state.waker = Some(waker.clone());
    }
}
