//! The hooks an embedder's event loop gives an async run ([`crate::Executor::start`]): what
//! only the loop can give a task — more tasks ([`Tasks::spawn`]), a pause, an interruption —
//! kept beside the [`Task`] they take, above the hooks every run has (`run/hooks.rs`), which
//! name no walk.

use super::task::Task;

/// How an embedder's event loop takes part in a run that has async nodes
/// ([`crate::Executor::start`]): the run is a [`crate::Task`] the embedder drives — polls it
/// from a task of its loop, on the loop's thread, until it is done — and the run asks here for
/// what only the loop can give: more tasks, a pause, an interruption.
///
/// Every method is called on the loop's thread, from inside a task's poll.
pub trait Tasks: Send + Sync {
    /// Starts `task` beside the one polling now, as a task of the loop's own that polls it
    /// until it is done, in a copy of the current task's context: a wave's branch, an `each`
    /// item. Returns how to cancel it.
    ///
    /// # Errors
    /// Why the loop refused the task (it is closed, say); the task is dropped unpolled, and
    /// its branch fails with [`crate::RunError::NoTask`].
    fn spawn(&self, task: Task) -> Result<Box<dyn Spawned>, String>;

    /// A future that is ready once `pause` has passed (a retry's backoff), waking the task
    /// that polls it then; dropping it stops the timer.
    fn sleep(&self, pause: std::time::Duration) -> Pause;

    /// Interrupts the async node call that the task polling now awaits (cancels it, as the
    /// loop cancels) once `limit` has passed: a node's time limit. Dropping what it returns
    /// stops the timer; [`Interrupt::fired`] says whether it fired.
    fn interrupt_after(&self, limit: std::time::Duration) -> Box<dyn Interrupt>;
}

/// What [`Tasks::sleep`] returns: a future ready once the pause has passed.
pub type Pause = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A task started by [`Tasks::spawn`], as the run keeps it: to cancel it when the result of
/// its branch can no longer matter (an earlier sibling failed, the run was cancelled).
pub trait Spawned: Send {
    /// Cancels the task as the loop cancels its tasks: the node call it awaits is interrupted,
    /// and the task is told ([`crate::Task::cancel`]) so that its walk stops at its next node
    /// boundary. Called on the loop's thread.
    fn cancel(&self);
}

/// A time limit's timer ([`Tasks::interrupt_after`]).
pub trait Interrupt: Send {
    /// Whether the limit passed and the call was interrupted.
    fn fired(&self) -> bool;
}
