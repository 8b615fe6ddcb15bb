//! The interpreter's exit, with Soma's threads still at work.
//!
//! A thread Python did not start must never ask for the GIL once the interpreter is finalizing:
//! Python 3.11 ends such a thread with `pthread_exit`, whose forced unwinding cannot cross a
//! Rust thread's first frame, and the process aborts. A node left running by a run that timed
//! out, or a stage of a stream left open, may still be inside Python when the program ends.
//!
//! So, before finalizing begins (an `atexit` hook registered when `soma._soma` is imported, and
//! so run after every hook registered later — the one that closes open streams among them),
//! [`at_exit`] closes the door: from then on a Soma thread about to enter the interpreter
//! parks for good instead (the process is ending; nobody waits for its work), and a thread that
//! ends leaves its thread state to the interpreter's own teardown. Then it waits, the GIL given
//! up, for the threads already inside to come out — for [`EXIT_WAIT`] at most, so that a node
//! that never returns does not hold the exit. A node that is still inside after that and
//! returns in the few milliseconds finalizing takes is the one case left: the guide says so.

use std::sync::{Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// How long the exit waits for Soma's threads to come out of the interpreter.
const EXIT_WAIT: Duration = Duration::from_millis(250);

/// How many Soma threads are inside the interpreter (a branch or a stage between its first and
/// last node), and whether the door is closed.
struct Door {
    inside: usize,
    closed: bool,
}

static DOOR: Mutex<Door> = Mutex::new(Door {
    inside: 0,
    closed: false,
});
static LEFT: Condvar = Condvar::new();

fn door() -> std::sync::MutexGuard<'static, Door> {
    DOOR.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts this thread inside the interpreter until the guard is dropped; once the exit has
/// closed the door, parks this thread for good instead of returning.
pub fn enter() -> Inside {
    let mut door = door();
    if door.closed {
        drop(door);
        loop {
            thread::park();
        }
    }
    door.inside += 1;
    Inside
}

/// A Soma thread inside the interpreter; see [`enter`].
pub struct Inside;

impl Drop for Inside {
    fn drop(&mut self) {
        let mut door = door();
        door.inside -= 1;
        if door.inside == 0 {
            LEFT.notify_all();
        }
    }
}

/// Whether the exit has closed the door: a thread that ends now leaves its thread state alone.
pub fn closed() -> bool {
    door().closed
}

/// The `atexit` hook; see the module docs. Not API.
#[pyfunction]
pub fn _at_exit(py: Python<'_>) {
    py.detach(|| {
        let deadline = Instant::now() + EXIT_WAIT;
        let mut door = door();
        door.closed = true;
        while door.inside > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            door = LEFT
                .wait_timeout(door, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    });
}

/// Registers [`_at_exit`] with `atexit`, when the module is first imported.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let hook = wrap_pyfunction!(_at_exit, module)?;
    module.add_function(hook.clone())?;
    module
        .py()
        .import("atexit")?
        .call_method1("register", (hook,))?;
    Ok(())
}
