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
//! stops at its next node boundary, and `forward` raises it. A `KeyboardInterrupt` that a
//! Python node on the calling thread raised (the signal came while it ran) stops the run the
//! same way ([`note_interrupt`]), so that the caller does not wait on siblings that will not stop.
//!
//! A deadline (`forward(timeout=…)`) is one more reason to stop, read from the clock at node
//! boundaries and while waiting; a [`StopFlag`] set from another thread is the last one: it is
//! how a host stops a slice whose caller gave up on the run (Ctrl-C, a timeout, a sibling's
//! error there), since a slice runs on a thread where no signal ever arrives. Either way,
//! branches that do not reach a boundary soon are left running and the caller returns
//! ([`soma_core::Executor::run_detachable`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use soma_core::Watch;

pub struct SignalWatch {
    /// The calling thread, the only one where Python runs signal handlers: told apart by the
    /// address of a thread-local.
    caller: usize,
    stopped: AtomicBool,
    raised: Mutex<Option<PyErr>>,
    /// The time limit it was given, if any, and when the run must stop then.
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    timed_out: AtomicBool,
    /// Set from another thread to stop the run, if it was given one.
    stop: Option<Arc<AtomicBool>>,
    cancelled: AtomicBool,
}

impl SignalWatch {
    /// A watch for a run called from the current thread, stopping it after `timeout` if given,
    /// or once `stop` is set.
    pub fn new(timeout: Option<Duration>, stop: Option<&StopFlag>) -> Self {
        INTERRUPTED_IN_NODE.with(|seen| seen.set(false));
        SignalWatch {
            caller: this_thread(),
            stopped: AtomicBool::new(false),
            raised: Mutex::new(None),
            timeout,
            // A timeout too far off to be a point in time is no deadline worth counting.
            deadline: timeout.and_then(|timeout| Instant::now().checked_add(timeout)),
            timed_out: AtomicBool::new(false),
            stop: stop.map(|flag| Arc::clone(&flag.set)),
            cancelled: AtomicBool::new(false),
        }
    }

    /// Whether the run was stopped because its stop flag was set.
    pub fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Whether the run was stopped because its time ran out.
    pub fn timed_out(&self) -> bool {
        self.timed_out.load(Ordering::Acquire)
    }

    /// The time limit the run was given (`forward(timeout=…)`), if any.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Keeps `raised`, what a signal handler raised on the calling thread, and stops the run:
    /// `forward` raises it once the run has stopped. The first one kept is the one raised.
    pub fn keep(&self, raised: PyErr) {
        self.raised
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert(raised);
        self.stopped.store(true, Ordering::Release);
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
        if self.stopped.load(Ordering::Acquire) {
            return true;
        }
        if let Some(stop) = &self.stop {
            if stop.load(Ordering::Acquire) {
                self.cancelled.store(true, Ordering::Release);
                self.stopped.store(true, Ordering::Release);
                return true;
            }
        }
        match self.deadline {
            Some(deadline) if Instant::now() >= deadline => {
                self.timed_out.store(true, Ordering::Release);
                self.stopped.store(true, Ordering::Release);
                true
            }
            Some(_) | None => false,
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    #[allow(clippy::redundant_closure_for_method_calls)] // The method is generic over a lifetime.
    fn poll(&self) {
        if this_thread() != self.caller || self.interrupted() {
            return;
        }
        if INTERRUPTED_IN_NODE.with(|seen| seen.replace(false)) {
            self.stopped.store(true, Ordering::Release);
            return;
        }
        if let Err(raised) = crate::exit::attach(|py| py.check_signals()) {
            self.keep(raised);
        }
    }
}

thread_local! {
    static MARK: u8 = const { 0 };
    /// Whether a Python node or driver on this thread let a `KeyboardInterrupt` out since the
    /// run began.
    static INTERRUPTED_IN_NODE: Cell<bool> = const { Cell::new(false) };
}

/// Records that a node or driver on this thread raised `KeyboardInterrupt`: on the calling
/// thread, where signals are handled, that is Ctrl-C, and the run's watch stops the run.
pub fn note_interrupt() {
    INTERRUPTED_IN_NODE.with(|seen| seen.set(true));
}

/// Forgets that a node on this thread raised `KeyboardInterrupt`: its retry lists it, so the
/// node raised it as a failure to try again, and the run goes on.
pub fn forget_interrupt() {
    INTERRUPTED_IN_NODE.with(|seen| seen.set(false));
}

/// A number that differs between threads alive at the same time.
fn this_thread() -> usize {
    MARK.with(|mark| std::ptr::from_ref(mark) as usize)
}

/// `soma._soma.StopFlag`: stops the run it is given to (`forward(stop=…)`) at its next node
/// boundary once set, from any thread. Set stays set: one flag per run.
#[pyclass(frozen, module = "soma._soma")]
#[derive(Default)]
pub struct StopFlag {
    set: Arc<AtomicBool>,
}

#[pymethods]
impl StopFlag {
    #[new]
    fn py_new() -> Self {
        StopFlag::default()
    }

    /// Stops the run at its next node boundary; a run that has not started stops at its first.
    fn set(&self) {
        self.set.store(true, Ordering::Release);
    }

    /// Whether the flag was set.
    #[getter]
    fn is_set(&self) -> bool {
        self.set.load(Ordering::Acquire)
    }
}
