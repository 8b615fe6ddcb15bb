//! Ctrl-C during a run.
//!
//! Python runs signal handlers only on the main thread, and only when something there asks.
//! During `forward` the calling thread is inside the engine, and three things ask:
//! - the interpreter itself, on entering the next Python function — so a run of Python nodes
//!   raises `KeyboardInterrupt` inside the node that runs when the signal comes, or the next;
//! - every Rust node, when it returns ([`crate::native`]);
//! - this watch, every few milliseconds while the calling thread waits for a wave's branches
//!   with the GIL released.
//!
//! Node boundaries themselves only read a flag: looking for signals on each one would cost a
//! good part of a small node. A `KeyboardInterrupt` seen while waiting is kept, every branch
//! stops at its next node boundary, and `forward` raises it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use soma_core::Watch;

pub struct SignalWatch {
    /// The calling thread, the only one where Python runs signal handlers: told apart by the
    /// address of a thread-local.
    caller: usize,
    stopped: AtomicBool,
    raised: Mutex<Option<PyErr>>,
}

impl SignalWatch {
    /// A watch for a run called from the current thread.
    pub fn new() -> Self {
        SignalWatch {
            caller: this_thread(),
            stopped: AtomicBool::new(false),
            raised: Mutex::new(None),
        }
    }

    /// The exception a signal handler raised during the run, if one did.
    pub fn take_raised(&self) -> Option<PyErr> {
        self.raised
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

impl Watch for SignalWatch {
    fn interrupted(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    #[allow(clippy::redundant_closure_for_method_calls)] // The method is generic over a lifetime.
    fn poll(&self) {
        if this_thread() != self.caller || self.stopped.load(Ordering::Acquire) {
            return;
        }
        if let Err(raised) = Python::attach(|py| py.check_signals()) {
            *self
                .raised
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(raised);
            self.stopped.store(true, Ordering::Release);
        }
    }
}

thread_local! {
    static MARK: u8 = const { 0 };
}

/// A number that differs between threads alive at the same time.
fn this_thread() -> usize {
    MARK.with(|mark| std::ptr::from_ref(mark) as usize)
}
