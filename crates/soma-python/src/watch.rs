//! Ctrl-C during a run.
//!
//! Python runs signal handlers only on the main thread, and only when something there asks.
//! During `forward` the calling thread is inside the engine — running nodes, or waiting on a
//! wave with the GIL released — so the engine's [`Watch`] hook asks for it: at every node
//! boundary (where the thread holds the GIL, so the check is a flag read) and every few
//! milliseconds while it waits. A `KeyboardInterrupt` raised there is kept, every branch stops
//! at its next node boundary, and `forward` raises it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use soma_core::Watch;

pub struct SignalWatch {
    /// The calling thread, told apart by the address of a thread-local: cheaper on every node
    /// boundary than comparing `thread::current().id()`, which clones a handle.
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
    #[allow(clippy::redundant_closure_for_method_calls)] // The method is generic over a lifetime.
    fn interrupted(&self) -> bool {
        if self.stopped.load(Ordering::Acquire) {
            return true;
        }
        if this_thread() != self.caller {
            return false;
        }
        if let Err(raised) = Python::attach(|py| py.check_signals()) {
            *self
                .raised
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(raised);
            self.stopped.store(true, Ordering::Release);
            return true;
        }
        false
    }
}

thread_local! {
    static MARK: u8 = const { 0 };
}

/// A number that differs between threads alive at the same time.
fn this_thread() -> usize {
    MARK.with(|mark| std::ptr::from_ref(mark) as usize)
}
