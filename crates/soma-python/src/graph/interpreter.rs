//! The interpreter as the engine's host: how a crew thread takes the GIL for a branch, gives it
//! back in every blocking wait, and carries the caller's context; and the stack a crew thread
//! gets, as `threading.stack_size()` asks of Python's own threads.
//!
//! What the engine knows of Python is what this host tells it: each branch runs at the nesting
//! depth of its forward, on whichever thread, and waits for the GIL in a queue of its own rather
//! than all at once.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use soma_core::{Captured, Host};

use crate::context;
use crate::exit;
use crate::reentry::{Nested, MAX_NESTED_FORWARDS};
use crate::thread_state;

/// What `threading.stack_size()` asks of Python's own threads, which a crew thread gets too; 0
/// when nothing is asked. The function is looked up once: importing `threading` again for each
/// program cost a first forward about 15 µs.
pub(crate) fn thread_stack_asked(py: Python<'_>) -> usize {
    static STACK_SIZE: PyOnceLock<Option<Py<PyAny>>> = PyOnceLock::new();
    STACK_SIZE
        .get_or_init(py, || {
            py.import("threading")
                .and_then(|threading| threading.getattr("stack_size"))
                .ok()
                .map(Bound::unbind)
        })
        .as_ref()
        .and_then(|stack_size| stack_size.call0(py).ok())
        .and_then(|size| size.extract(py).ok())
        .unwrap_or(0)
}

/// The interpreter as the engine's host: a crew thread holds the GIL for the whole of each
/// branch it runs, with a thread state it keeps for its life (`thread_state.rs`), and every
/// blocking wait gives it back. Each branch runs at the nesting depth of its forward
/// (`reentry.rs`), on whichever thread.
struct Interpreter {
    depth: usize,
}

/// The hosts every run shares, one per nesting depth, each made the first time a run at its
/// depth asks (all thousand at once cost the first forward of a process about 12 µs); a crew
/// thread may still hold one after its run has ended.
static INTERPRETERS: [OnceLock<Arc<dyn Host>>; MAX_NESTED_FORWARDS + 1] =
    [const { OnceLock::new() }; MAX_NESTED_FORWARDS + 1];

/// The host for a run at nesting depth `depth` (`reentry.rs`): its branches run at that depth.
pub(super) fn interpreter_at(depth: usize) -> Arc<dyn Host> {
    let depth = depth.min(MAX_NESTED_FORWARDS);
    Arc::clone(INTERPRETERS[depth].get_or_init(|| Arc::new(Interpreter { depth })))
}

/// Lets one branch thread at a time wait for the GIL to start its branch.
///
/// The interpreter's waiters wake every switch interval to ask for the lock: a wave of a
/// thousand branches, all waiting at once, spends its time waking threads that cannot run
/// (a fan-out of 1,000 one-node branches took 66–87 µs a branch on the 2-core benchmark
/// machine, most of it in the kernel's futex code; 30–45 µs with this queue). Queued here
/// instead, they sleep until it is their turn; the one in front waits for the GIL as any thread
/// does, and takes its turn whenever the holder lets go, so branches still overlap wherever
/// their work releases the GIL.
static STARTING: Mutex<()> = Mutex::new(());

impl Host for Interpreter {
    fn branch(&self, run: &mut dyn FnMut()) {
        // Before the queue: a thread that would enter a finalizing interpreter parks here.
        let _inside = exit::enter();
        let turn = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
        thread_state::keep();
        crate::exit::attach(move |_| {
            drop(turn);
            Nested::carry(self.depth, run);
        });
    }

    fn blocking(&self, run: &mut (dyn FnMut() + Send)) {
        crate::exit::attach(|py| crate::exit::detach(py, run));
    }

    fn capture(&self) -> Option<Box<dyn Captured>> {
        context::capture()
    }
}
