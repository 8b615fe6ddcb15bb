//! `Observer`: what a run tells an embedder while it happens — a node's call begun and ended
//! (each attempt of it, and whether it will be retried), a node answered by the cache, a step's
//! part (an `each` item, a `switch` case, a `loop` iteration) begun and ended, and the run
//! itself — a whole run, or a streamed item's — begun and ended.
//!
//! A [`crate::Trace`] keeps spans for looking at after the run; an observer is told as the run
//! goes, so that an embedder can turn the run into telemetry (OpenTelemetry spans) or live events
//! without a walk of its own. Every call is made where the work runs — on the branch's thread or
//! in the async task, inside the host's hold and the branch's captured context — and a work's
//! end is told on the thread, and in the context, its beginning was: what the observer opens at
//! a beginning (a span made current, say) is current for exactly the work it wraps, and is
//! closed where it was opened. A run begins on the thread that runs it (the caller's; for an
//! async run, in its task), before any of its work; a streamed item's run begins inside the
//! item's own context ([`crate::ItemContext`]), which travels with it from stage to stage, and
//! ends on whichever thread finishes it.
//!
//! One observer per executor ([`crate::Executor::with_observer`]). A run without one checks one
//! `Option` where a traced run would record a span, and does nothing else.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::model::device::Device;
use crate::model::id::NodeId;
use crate::run::board::{Board, NodeState};
use crate::run::error::RunError;

/// Told each work's beginning and end as a run goes (see the module's header for where).
pub trait Observer: Send + Sync {
    /// A work begins. What this returns is handed back to [`Observer::end`] when it ends.
    fn begin(&self, begun: &Begun<'_>) -> Opened;

    /// The work `opened` was returned for ends, as `ended` says.
    fn end(&self, opened: Opened, ended: &Ended<'_>);
}

/// What an observer keeps from a work's beginning to its end.
pub type Opened = Option<Box<dyn Any + Send>>;

/// A work that begins.
#[derive(Clone, Debug)]
pub enum Begun<'a> {
    /// One attempt of a call of `node`: the first is attempt 0, a retry the next.
    Call {
        /// The node.
        node: &'a NodeId,
        /// Which attempt, from 0.
        attempt: u32,
        /// The device it is placed on, if any.
        device: Option<Device>,
        /// Its branch: its index in each enclosing wave, outermost first.
        branch: &'a [usize],
        /// Whether its node is async (a coroutine awaited on the event loop).
        awaited: bool,
        /// What its node runs, as the node describes it ([`crate::Node::described`]).
        described: Option<String>,
        /// For an attempt told only once it failed (a call its run's [`crate::Board`] keeps),
        /// when it began, in seconds since the board was made; `None` for one told as it begins.
        began: Option<f64>,
    },
    /// `node`'s output was found in the run's cache: it is not called. Ends at once.
    Cached {
        /// The node.
        node: &'a NodeId,
        /// The device it is placed on, if any.
        device: Option<Device>,
        /// Its branch.
        branch: &'a [usize],
    },
    /// A part of step `step`.
    Part {
        /// The step that decides (its id).
        step: &'a NodeId,
        /// Which part.
        part: Part<'a>,
        /// The branch the step runs in.
        branch: &'a [usize],
    },
    /// A run: a whole one (`forward`, `aforward`), or one item's of a stream (`map`,
    /// micro-batches), from its input read to its result.
    Run {
        /// The item's index in the stream's input; `None` for a whole run.
        item: Option<u64>,
        /// How many nodes its program has.
        nodes: usize,
        /// Whether it has async nodes.
        asynchronous: bool,
        /// The board the run keeps its nodes' states on, when it keeps one
        /// ([`crate::Executor::with_board`], [`crate::Executor::with_item_boards`]): its
        /// calls then tell the observer only what a board does not hold.
        board: Option<&'a Arc<Board>>,
    },
}

/// Which part of a step that decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part<'a> {
    /// An `each` step's item at this index.
    Item(usize),
    /// A `switch` step's case, by its key.
    Case(&'a str),
    /// A `loop` step's iteration, from 0.
    Iteration(u32),
}

impl std::fmt::Display for Part<'_> {
    /// The part as a trace names it, after its step's id in brackets: the item's index, the
    /// case's key, the iteration's number.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Part::Item(index) => write!(f, "{index}"),
            Part::Iteration(iteration) => write!(f, "{iteration}"),
            Part::Case(key) => f.write_str(key),
        }
    }
}

/// How a work ended.
#[derive(Clone, Copy, Debug)]
pub enum Ended<'a> {
    /// It produced its value (or, for a cached node, was answered).
    Returned,
    /// It failed with `error`; `retry_in` is the pause before the call is tried again, `None`
    /// when this failure is the call's last.
    Failed {
        /// Why: a node's own error, its time limit, ...
        error: &'a RunError,
        /// The backoff before the next attempt, when the call's retry takes this failure.
        retry_in: Option<Duration>,
    },
    /// It stopped without an outcome of its own: an earlier sibling failed, the run was
    /// cancelled or stopped.
    Stopped,
}

impl<'e> Ended<'e> {
    /// The state a call's attempt that ended so leaves its node in, on its run's board.
    pub(crate) fn state(&self) -> NodeState {
        match self {
            Ended::Returned => NodeState::Finished,
            Ended::Failed {
                retry_in: Some(_), ..
            } => NodeState::Retrying,
            Ended::Failed { error, .. } if error.timed_out() => NodeState::TimedOut,
            Ended::Failed { .. } => NodeState::Failed,
            Ended::Stopped => NodeState::Stopped,
        }
    }

    /// How a call that ended with `outcome` ended, as its last attempt.
    pub(crate) fn of<T>(outcome: &'e Result<T, RunError>) -> Self {
        Self::failed_with(outcome.as_ref().err())
    }

    /// How a work ended that failed with `failure`, or returned when there is none.
    pub(crate) fn failed_with(failure: Option<&'e RunError>) -> Self {
        match failure {
            None => Ended::Returned,
            Some(error) => Ended::Failed {
                error,
                retry_in: None,
            },
        }
    }
}
