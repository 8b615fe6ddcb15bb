//! Running a program that has async nodes: the same executor, its walk suspended wherever a
//! branch waits on a node's call, so that a waiting branch holds no thread.
//!
//! [`Executor::start`] makes a run into a [`Task`] — a future — that the embedder polls on its
//! event loop's thread, from a task of the loop's own, until it is done; the loop's side (what
//! only the loop can give: more tasks, pauses, interruptions) is the embedder's [`Tasks`] hook.
//! Each branch of a wave, each item of a `Map`, is a task of its own; where a branch stands in
//! the plan is kept in its future. A branch's async node is called by polling its
//! [`crate::Call`], on the loop's thread; its sync work is lent, a whole piece at a time, to a
//! thread of the program's crew and walked there by the sync walk, while the task waits without
//! a thread. A program without async nodes is never walked here: the sync walk runs it whole,
//! exactly as before (see `walk.rs` for how the two meet, and `place.rs` for how a task holds
//! its part of the table without borrowing it).
//!
//! Every rule is the floor's both walks stand on: a node's call, its cache key, its policy, its
//! span (`run/call.rs`), a branch's boundary (`run/branch.rs`), how a wave settles
//! (`run/settle.rs`), what a step that decides reads (`run/decision.rs`). Cancellation is the loop's: the
//! embedder tells a task it was cancelled ([`Task::cancel`]) and delivers the cancellation to
//! the node call it awaits; the walk stops at its next boundary and cancels the tasks it
//! spawned. A run's outcome is kept in its [`Settled`], for a caller on the loop (who polled
//! the task to its end) or on another thread (who waits on it, with a deadline of its own).

mod flow;
pub(crate) mod hooks;
mod join;
mod limits;
mod place;
mod task;
mod walk;

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

pub use self::flow::{Flow, FlowSettings, ItemOutcome};
use self::hooks::Tasks;
use self::limits::Limits;
use self::place::{Place, Run, Table, Window};
use self::task::CatchUnwind;
pub use self::task::Task;
use super::branch::{Branch, Halt};
use super::error::RunError;
use super::executor::Executor;
use super::hooks::Watch;
use super::latch::sleep_on;
use super::observer::Ended;
use crate::model::id::NodeId;
use crate::model::value::Value;
use crate::run::program::Program;

/// Where a run started with [`Executor::start`] leaves its outcome, and how its caller follows
/// it: the result, or the error, or the panic a node raised; and which nodes are running now,
/// for the message of a caller that stops waiting.
pub struct Settled {
    outcome: Mutex<Option<thread::Result<Result<Value, RunError>>>>,
    done: Condvar,
    run: Arc<Run>,
    /// Told once the outcome is in, after it is: a [`Flow`]'s reader.
    on_settle: Mutex<Option<OnSettle>>,
}

/// What a [`Settled`] tells once the run's outcome is in.
type OnSettle = Box<dyn FnOnce() + Send>;

impl Settled {
    fn settle(&self, outcome: thread::Result<Result<Value, RunError>>) {
        *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
        self.done.notify_all();
        let told = self
            .on_settle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tell) = told {
            tell();
        }
    }

    /// The run's outcome, once its task is done: `Err` holds a node's panic, to re-raise.
    pub fn take(&self) -> Option<thread::Result<Result<Value, RunError>>> {
        self.outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Whether the run is done.
    pub fn is_done(&self) -> bool {
        self.outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Blocks until the run is done or `timeout` has passed, and says whether it is done: for
    /// a caller on another thread than the loop's, which waits a few milliseconds at a time
    /// (polling for signals between).
    pub fn wait(&self, timeout: Duration) -> bool {
        let outcome = self.outcome.lock().unwrap_or_else(PoisonError::into_inner);
        if outcome.is_some() {
            return true;
        }
        sleep_on(&self.done, outcome, Some(timeout)).is_some()
    }

    /// The run's nodes running now, in program order (a step that decides counts as running
    /// while what it runs does).
    pub fn running(&self) -> Vec<NodeId> {
        self.run.detached.running(&self.run.program.ids)
    }
}

impl Executor {
    /// Starts a run of `program` on `input` as a [`Task`] for the embedder's event loop, whose
    /// side is `tasks`: poll the task on the loop's thread until it is done, then take the
    /// outcome from the [`Settled`]. Works for any program; one without async nodes is lent to
    /// a crew thread whole, and walked there as [`Executor::run_program`] walks it.
    ///
    /// A run with a [deadline](Watch::deadline) that ends past it fails with
    /// [`RunError::PastDeadline`], never with its result, as a detachable run does.
    pub fn start(
        &self,
        program: &Arc<Program>,
        input: Value,
        tasks: Arc<dyn Tasks>,
    ) -> (Task, Arc<Settled>) {
        self.start_run(program, input, tasks, None, None, None)
    }

    /// [`Executor::start`], its steps held to a stream's `limits`, telling `on_settle` once
    /// its outcome is in.
    pub(crate) fn start_run(
        &self,
        program: &Arc<Program>,
        input: Value,
        tasks: Arc<dyn Tasks>,
        limits: Option<Arc<Limits>>,
        on_settle: Option<OnSettle>,
        streamed: Option<u64>,
    ) -> (Task, Arc<Settled>) {
        let run = Arc::new(Run::new(self.clone(), tasks, Arc::clone(program), limits));
        let keys = self.run_keys(program);
        let place = Place {
            run: Arc::clone(&run),
            table: Arc::new(Table::new(program, input, keys)),
            window: Arc::new(Window::whole(program.len())),
            branch: Branch::root(),
            depth: 0,
        };
        let settled = Arc::new(Settled {
            outcome: Mutex::new(None),
            done: Condvar::new(),
            run,
            on_settle: Mutex::new(on_settle),
        });
        let branch = Arc::clone(&place.branch);
        let theirs = Arc::clone(&settled);
        let task = Task::new(branch, async move {
            // Begun inside its own task, so that what the observer makes current is current for
            // this run's nodes (a streamed item's) and no other's.
            let executor = &place.run.executor;
            // An async run keeps the executor's board, if any: a flow's items keep none.
            let opened =
                executor.begin_run(place.table.program(), streamed, executor.run_board(), None);
            let walked = CatchUnwind(Box::pin(walk::walk_root(&place))).await;
            let outcome = walked.map(|walked| place.finish(walked));
            let ended = match &outcome {
                Ok(outcome) => Ended::of(outcome),
                Err(_) => Ended::Stopped,
            };
            executor.end_work(opened, &ended);
            drop(place);
            theirs.settle(outcome);
        });
        (task, settled)
    }
}

impl Place {
    /// A whole run's result, from its walk's outcome and its table, as a sync run's.
    fn finish(&self, walked: Result<(), Halt>) -> Result<Value, RunError> {
        let executor = &self.run.executor;
        let deadline = executor.watch.as_deref().and_then(Watch::deadline);
        let walked = match walked {
            Ok(()) if deadline.is_some_and(|deadline| Instant::now() >= deadline) => {
                return Err(RunError::PastDeadline);
            }
            Ok(()) => Ok(()),
            Err(Halt::Failed(error)) => Err(error),
            // The run's own branch was cancelled (its embedder gave up on it), or the caller
            // stopped waiting: either way it stopped at a boundary, as a watch stops it.
            Err(Halt::Cancelled | Halt::Abandoned) => Err(RunError::Interrupted),
        };
        walked?;
        let program = self.table.program();
        let input = &self.table.input;
        Ok(self.table.with_frame(&self.window, |frame| {
            Executor::result(program, frame.own, || input.clone())
        }))
    }
}
