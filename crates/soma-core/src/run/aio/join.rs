//! The [`Join`] a task waits on for its children: the tasks of a wave's branches or a `Map`'s
//! items report their outcomes to it, and it keeps what cancels them.
//!
//! # Who touches what
//! A [`Join`] is reported to by its children's tasks, on the loop's thread. It keeps its state
//! under one mutex, and the waker it holds is woken after that mutex is let go (a waker may
//! take locks of its own, the embedder's). A task that is woken polls again and finds the
//! join's state under the same mutex, so a wake-up is never lost: either the reporter saw the
//! waker stored and woke it, or the poller sees the outcomes.

use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Poll, Waker};

use super::hooks::Spawned;
use crate::run::branch::Branch;
use crate::run::settle::Outcome;

/// Where the children of a wave or a `Map` report, and their parent waits.
pub(crate) struct Join {
    state: Mutex<JoinState>,
}

struct JoinState {
    /// Each child's outcome, by index, once it reported; `None` for one never started.
    outcomes: Vec<Option<Outcome<()>>>,
    /// Children that have not reported, nor been skipped.
    left: usize,
    /// Each child's task, to cancel it, by index; `None` once it reported.
    spawned: Vec<Option<Box<dyn Spawned>>>,
    /// The parent's waker, while it waits, and how many children must have reported or been
    /// skipped for it to be woken: a wave's parent wakes once, when all have, not once a child.
    waker: Option<(Waker, usize)>,
    /// Whether every child was cancelled already.
    cancelled: bool,
}

impl Join {
    pub(crate) fn new(children: usize) -> Arc<Self> {
        Arc::new(Join {
            state: Mutex::new(JoinState {
                outcomes: (0..children).map(|_| None).collect(),
                left: children,
                spawned: (0..children).map(|_| None).collect(),
                waker: None,
                cancelled: false,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JoinState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps child `index`'s task, to cancel it. A child that reported already (it finished in
    /// its first poll) is not kept; one kept after the join was cancelled is cancelled at once.
    pub(crate) fn keep(&self, index: usize, spawned: Box<dyn Spawned>) {
        let mut state = self.lock();
        if state.outcomes[index].is_some() {
            return;
        }
        if state.cancelled {
            drop(state);
            spawned.cancel();
            return;
        }
        state.spawned[index] = Some(spawned);
    }

    /// Child `index` is done with `outcome`.
    pub(crate) fn report(&self, index: usize, outcome: Outcome<()>) {
        let mut state = self.lock();
        state.spawned[index] = None;
        state.outcomes[index] = Some(outcome);
        Self::one_less(state);
    }

    /// A child will never start: an earlier one failed, or the parent was cancelled.
    pub(crate) fn skip(&self) {
        Self::one_less(self.lock());
    }

    fn one_less(mut state: std::sync::MutexGuard<'_, JoinState>) {
        state.left -= 1;
        let done = state.outcomes.len() - state.left;
        let waker = match state.waker.take() {
            Some((waker, wanted)) if done >= wanted => Some(waker),
            kept => {
                state.waker = kept;
                None
            }
        };
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Cancels the children declared after `index` that have not reported: their outcomes can
    /// no longer be the one reported.
    pub(crate) fn cancel_after(&self, index: usize) {
        let later: Vec<Box<dyn Spawned>> = {
            let mut state = self.lock();
            state.spawned[index + 1..]
                .iter_mut()
                .filter_map(Option::take)
                .collect()
        };
        for spawned in later {
            spawned.cancel();
        }
    }

    /// Cancels every child that has not reported, and any kept from now on.
    fn cancel_all(&self) {
        let all: Vec<Box<dyn Spawned>> = {
            let mut state = self.lock();
            state.cancelled = true;
            state.spawned.iter_mut().filter_map(Option::take).collect()
        };
        for spawned in all {
            spawned.cancel();
        }
    }

    /// Waits until more than `reported` children have reported or been skipped, and returns
    /// how many have; or, once the parent's `branch` is cancelled, cancels the children and
    /// returns at once.
    pub(crate) async fn more_than(self: &Arc<Self>, branch: &Branch, reported: usize) -> usize {
        std::future::poll_fn(|cx| {
            if branch.is_cancelled() {
                self.cancel_all();
            }
            let mut state = self.lock();
            let done = state.outcomes.len() - state.left;
            if done > reported || state.cancelled {
                return Poll::Ready(done);
            }
            state.waker = Some((cx.waker().clone(), reported + 1));
            Poll::Pending
        })
        .await
    }

    /// Waits until every child has reported or been skipped, and gives their outcomes by
    /// index; when the parent's `branch` is cancelled meanwhile, cancels the children first,
    /// and still waits for them to end.
    pub(crate) async fn joined(self: &Arc<Self>, branch: &Branch) -> Vec<Option<Outcome<()>>> {
        let mut cancelled = false;
        std::future::poll_fn(|cx| {
            if !cancelled && branch.is_cancelled() {
                cancelled = true;
                self.cancel_all();
            }
            let mut state = self.lock();
            if state.left == 0 {
                return Poll::Ready(std::mem::take(&mut state.outcomes));
            }
            let all = state.outcomes.len();
            state.waker = Some((cx.waker().clone(), all));
            Poll::Pending
        })
        .await
    }
}
