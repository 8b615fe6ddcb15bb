//! Ctrl-C during a run.
//!
//! Python runs signal handlers only on the main thread, and only when something there asks.
//! During `forward` the calling thread is inside the engine, detached — running a branch, or
//! waiting on a wave — so the engine's [`Watch`] hook asks for it: at node boundaries and while
//! waiting, the calling thread attaches briefly and checks for pending signals (at most every
//! couple of milliseconds, to keep boundaries cheap). A `KeyboardInterrupt` raised there is kept
//! and every branch stops at its next node boundary; `forward` then raises it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use soma_core::Watch;

/// The least time between two looks at pending signals.
const CHECK_EVERY: Duration = Duration::from_millis(2);

pub struct SignalWatch {
    caller: ThreadId,
    start: Instant,
    /// Nanoseconds after `start` of the last look; only the caller's thread writes it.
    last_look: AtomicU64,
    stopped: AtomicBool,
    raised: Mutex<Option<PyErr>>,
}

impl SignalWatch {
    /// A watch for a run called from the current thread.
    pub fn new() -> Self {
        SignalWatch {
            caller: thread::current().id(),
            start: Instant::now(),
            last_look: AtomicU64::new(0),
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
        if thread::current().id() != self.caller {
            return false;
        }
        let now = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let last = self.last_look.load(Ordering::Relaxed);
        if now.saturating_sub(last) < u64::try_from(CHECK_EVERY.as_nanos()).unwrap_or(0) {
            return false;
        }
        self.last_look.store(now, Ordering::Relaxed);
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
