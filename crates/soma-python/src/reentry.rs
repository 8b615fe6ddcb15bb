//! Forwards inside forwards: how deep they nest, and where that ends.
//!
//! A node may call a graph's `forward` — its own graph's (a recursive model) or another's — and
//! that nested run is an ordinary call: it runs on the node's thread, its waves borrow threads as
//! any run does, and each level costs about what a top-level forward costs. Every level also
//! holds a few kilobytes of native stack (the executor, the node's call, the interpreter's
//! frames) on whichever thread runs it, so nesting without end would overflow a thread's stack
//! and take the process down — and a level that runs in a wave's branch on a lent thread starts
//! a fresh Python recursion count there, so Python's own recursion limit cannot see it either.
//!
//! So the depth travels with the run: a forward started on a thread at depth `d` runs at `d + 1`,
//! and each of its branches, on whichever thread, runs at that depth ([`Nested::carry`]). A
//! forward that would run deeper than [`MAX_NESTED_FORWARDS`] raises `RecursionError` before it
//! starts, and unwinds through every level like any exception, leaving each graph usable.
//!
//! An `aforward` awaited by an async node nests the same way on the loop's thread: the inner
//! run's steps are taken inside the step of the node's coroutine, itself inside the outer run's
//! step ([`crate::aio`]), about 11 KiB of native stack a level — more than Python's recursion
//! limit counts for it, so that a recursion through `aforward` overflowed the stack (at about
//! 750 levels on 8 MiB) before any `RecursionError`. The steps nested on a thread are counted
//! ([`Stepping::enter`]), and an `aforward` that would start deeper than
//! [`MAX_NESTED_AFORWARDS`] raises `RecursionError` before it starts.

use std::cell::Cell;

use pyo3::exceptions::PyRecursionError;
use pyo3::PyResult;

/// The deepest that forwards may nest, on one thread or across the threads of their branches.
/// Python's default recursion limit ends a recursion through `forward` on one thread at about
/// half this; the limit is here for deeper limits and for nesting across threads. At a few
/// kilobytes of native stack a level, it leaves most of a thread's 8 MiB to the nodes.
pub const MAX_NESTED_FORWARDS: usize = 1_000;

/// The deepest that `aforward` runs may nest on one thread, one inside an async node of the
/// other: about 2.2 MiB of native stack at the 11 KiB a level measured (3.11, a release build),
/// which leaves most of a thread's 8 MiB to the nodes.
pub const MAX_NESTED_AFORWARDS: usize = 200;

thread_local! {
    /// The depth of the run this thread is in: 0 outside any forward.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// How many steps of async runs are nested on this thread: 0 outside any.
    static STEPS: Cell<usize> = const { Cell::new(0) };
}

/// A step of an async run taken on this thread, counted while it lasts.
pub struct Stepping {
    _outer: RestoreSteps,
}

impl Stepping {
    /// Counts a step of an async run on this thread, inside those it is taken in.
    pub fn enter() -> Stepping {
        let outer = STEPS.get();
        STEPS.set(outer + 1);
        Stepping {
            _outer: RestoreSteps(outer),
        }
    }

    /// Refuses an `aforward` started inside [`MAX_NESTED_AFORWARDS`] steps on this thread.
    ///
    /// # Errors
    /// `RecursionError` naming how deep it would have run.
    pub fn check_aforward() -> PyResult<()> {
        let depth = STEPS.get() + 1;
        if depth > MAX_NESTED_AFORWARDS {
            return Err(PyRecursionError::new_err(format!(
                "`aforward` nested {depth} deep: an async node awaits a graph's `aforward`, which reaches a node that awaits one again, {MAX_NESTED_AFORWARDS} levels down and on\nhint: give the recursion a base case; a recursion deeper than {MAX_NESTED_AFORWARDS} levels belongs in a loop"
            )));
        }
        Ok(())
    }
}

/// Puts back a thread's count of nested steps when dropped.
struct RestoreSteps(usize);

impl Drop for RestoreSteps {
    fn drop(&mut self) {
        STEPS.set(self.0);
    }
}

/// The depth of the run this thread is in: 0 outside any forward.
pub fn depth() -> usize {
    DEPTH.get()
}

/// One level of nesting entered on this thread; dropping it puts back the depth it found.
pub struct Nested {
    _outer: Restore,
}

impl Nested {
    /// Enters a forward on this thread, one level deeper than the run the thread is in.
    ///
    /// # Errors
    /// `RecursionError` when that would be deeper than [`MAX_NESTED_FORWARDS`].
    pub fn enter() -> PyResult<Nested> {
        let outer = DEPTH.get();
        let depth = outer + 1;
        if depth > MAX_NESTED_FORWARDS {
            return Err(PyRecursionError::new_err(format!(
                "`forward` nested {depth} deep: a node calls a graph's `forward`, which reaches a node that calls one again, {MAX_NESTED_FORWARDS} levels down and on\nhint: give the recursion a base case; a recursion deeper than {MAX_NESTED_FORWARDS} levels belongs in a loop"
            )));
        }
        DEPTH.set(depth);
        Ok(Nested {
            _outer: Restore(outer),
        })
    }

    /// Runs `run` (a branch of a forward at `depth`) at that depth on this thread, then puts
    /// back the depth the thread had.
    pub fn carry(depth: usize, run: impl FnOnce()) {
        let outer = DEPTH.replace(depth);
        // Put back even if `run` unwinds: a crew thread outlives the branch.
        let _restore = Restore(outer);
        run();
    }
}

/// Puts back a thread's depth when dropped.
struct Restore(usize);

impl Drop for Restore {
    fn drop(&mut self) {
        DEPTH.set(self.0);
    }
}
