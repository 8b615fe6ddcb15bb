//! A [`Task`]: one branch of an async run as a future the embedder's loop polls, and the join
//! a task waits on for its children. (A piece of sync work lent to the crew is waited for on a
//! [`crate::run::latch`] delivery, whose header says why no wake-up is lost there.)
//!
//! # Who touches what
//! A task is polled by one thread at a time, the loop's. A [`Join`] is reported to by its
//! children's tasks, on the loop's thread too. It keeps its state under one mutex, and the
//! waker it holds is woken after that mutex is let go (a waker may take locks of its own, the
//! embedder's). A task that is woken polls again and finds the join's state under the same
//! mutex, so a wake-up is never lost: either the reporter saw the waker stored and woke it, or
//! the poller sees the outcomes.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread;

use super::hooks::Spawned;
use crate::run::branch::Branch;
use crate::run::settle::Outcome;
use crate::run::trace::{set_thread_role, ThreadRole};

/// One branch of an async run — the whole run, a wave's branch, an `each` item — as a future
/// the embedder polls on its loop's thread until it is done ([`crate::Tasks`]). Where the
/// branch stands in the plan lives in the future itself: a task waiting on an async node, or on
/// sync work lent to a thread, holds no thread.
pub struct Task {
    future: Pin<Box<dyn Future<Output = ()> + Send>>,
    branch: Arc<Branch>,
}

impl Task {
    pub(crate) fn new(
        branch: Arc<Branch>,
        future: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        Task {
            future: Box::pin(future),
            branch,
        }
    }

    /// Walks the branch on until it must wait, or is done. A node's panic does not unwind out
    /// of here: it is the branch's outcome, re-raised where the branch is joined.
    pub fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        // The thread is an event loop's while it polls (its spans' track says so), and what
        // it was before after: the thread may be a caller's between polls.
        let was = set_thread_role(ThreadRole::EventLoop);
        let polled = self.future.as_mut().poll(cx);
        set_thread_role(was);
        polled
    }

    /// Tells the task that its embedder cancelled it: its walk stops at its next node
    /// boundary, its children are cancelled in turn, and whatever it waits on that is not an
    /// async node's call (sync work on a thread, its children) it waits out, so that it ends
    /// only once nothing of it runs. Deliver the cancellation to the node call it awaits, if it
    /// awaits one, before polling it again.
    pub fn cancel(&self) {
        self.branch.cancel();
    }

    /// Whether the task was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.branch.is_cancelled()
    }
}

/// A future whose panic, if it raises one, is its outcome.
pub(crate) struct CatchUnwind<F>(pub(crate) Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match panic::catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

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
