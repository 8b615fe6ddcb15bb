//! A [`Task`]: one branch of an async run as a future the embedder's loop polls (the join a
//! task waits on for its children is `join.rs`; a piece of sync work lent to the crew is
//! waited for on a [`crate::run::latch`] delivery, whose header says why no wake-up is lost
//! there). A task is polled by one thread at a time, the loop's.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread;

use crate::run::branch::Branch;
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
