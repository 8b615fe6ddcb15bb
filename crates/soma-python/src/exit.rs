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
//!
//! A thread still inside the interpreter when finalizing begins asks for the GIL again soon
//! enough — Python code asks every few milliseconds, a call that let the GIL go asks on its way
//! back — and Python ends it there. Such a thread parks for good instead, wherever it was asked:
//! in a node's call, an async node's step, a driver's `perform`, or Soma's own calls that run
//! the user's Python for as long as a node may — the cache's digest, the observer's `begin` and
//! `end` ([`call_method`]), the user's iterables it reads ([`next`]), and the hand-overs of
//! work to the loop Soma keeps from another thread, which write to its wake-up socket and let
//! the GIL go — each made through `c/exit.c`, whose C cleanup handler stops the forced
//! unwinding in its own frame; or taking the GIL for a branch ([`attach`], [`detach`], whose
//! guard parks the thread as the unwinding passes). Soma's other calls into Python are short
//! (asyncio's bookkeeping on the loop's thread, torch's switches) and are made plainly.

use std::sync::{Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyString, PyTuple};

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
/// closed the door, parks this thread for good instead of returning. For a thread that does
/// not hold the GIL: one that does parks by [`enter_holding`].
pub fn enter() -> Inside {
    match try_enter() {
        Some(inside) => inside,
        None => park_for_good(),
    }
}

/// [`enter`] for a thread that holds the GIL (an async node's step, on the thread that runs the
/// loop): once the door is closed, it lets the GIL go before it parks, or the exit, waiting to
/// take it back, would wait for good.
pub fn enter_holding(py: Python<'_>) -> Inside {
    match try_enter() {
        Some(inside) => inside,
        None => detach(py, park_for_good),
    }
}

/// This thread counted inside, unless the door is closed: checked and counted under one lock,
/// so that the exit either waits for the thread or finds it gone. `None` is for a caller with
/// nothing it must do inside (an observer's span nobody will read) to leave by itself.
pub fn try_enter() -> Option<Inside> {
    let mut door = door();
    if door.closed {
        return None;
    }
    door.inside += 1;
    Some(Inside)
}

/// The end of a thread that came to the closed door: the process is ending. It never returns;
/// typed as what its callers return, for [`detach`], whose result type cannot be `!`.
fn park_for_good() -> Inside {
    loop {
        thread::park();
    }
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

/// The calls of `c/exit.c`: the interpreter's own, each inside a cleanup handler that parks a
/// thread the exiting interpreter ends, before its forced unwinding reaches a Rust frame.
mod parking {
    use std::ffi::c_int;

    use pyo3::ffi::PyObject;

    extern "C" {
        /// `PyObject_Vectorcall`, which the limited API an abi3-py311 build sees has only from
        /// 3.12 on; Python 3.11 exports it with the same signature.
        pub(super) fn soma_vectorcall(
            callable: *mut PyObject,
            args: *const *mut PyObject,
            nargsf: usize,
            kwnames: *mut PyObject,
        ) -> *mut PyObject;
        /// `PyIter_Send`: `0` returned, `1` yielded, `-1` raised.
        pub(super) fn soma_iter_send(
            iter: *mut PyObject,
            arg: *mut PyObject,
            presult: *mut *mut PyObject,
        ) -> c_int;
        /// `PyGILState_Ensure`.
        pub(super) fn soma_gil_ensure() -> c_int;
    }
}

/// `callable(*args)` by the interpreter's vectorcall, for a call of the user's code (a node, a
/// driver's `perform`): arguments handed over as an array, where `call1` under the stable ABI
/// builds a tuple on every call (which cost a chain of trivial nodes about a fifth of its time,
/// `benches/python/abi3.py`); and a thread the exiting interpreter ends inside it parks.
// Inlined into a node's call, the hot path of every run.
#[allow(clippy::inline_always)]
#[inline(always)]
pub fn call<'py>(
    callable: &Bound<'py, PyAny>,
    args: &[*mut pyo3::ffi::PyObject],
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the GIL is held (a `Bound` is proof of it); the caller passes borrowed pointers
    // of live objects, alive until the call returns, and no keyword names. It returns a new
    // reference, or null with an exception set, which is what `from_owned_ptr_or_err` takes.
    #[allow(unsafe_code)]
    unsafe {
        let out = parking::soma_vectorcall(
            callable.as_ptr(),
            args.as_ptr(),
            args.len(),
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(callable.py(), out)
    }
}

/// `object.method(*args)` as [`call`] makes a node's call, for Soma's own Python that runs on a
/// thread the exiting interpreter may end as it may a node's: the cache's methods, which digest
/// and pickle the user's values, the observer's (telemetry, events), and the hand-overs to the
/// kept loop from another thread, which let the GIL go. The attribute is looked up first, then
/// called by the parking vectorcall with the tuple's items.
pub fn call_method<'py>(
    object: &Bound<'py, PyAny>,
    method: &Bound<'py, PyString>,
    args: impl IntoPyObject<'py, Output = Bound<'py, PyTuple>, Error: Into<PyErr>>,
) -> PyResult<Bound<'py, PyAny>> {
    let callable = object.getattr(method)?;
    let args = args.into_pyobject(object.py()).map_err(Into::into)?;
    // Borrowed: the tuple holds each item until the call returns.
    let pointers: Vec<*mut pyo3::ffi::PyObject> = args.iter().map(|item| item.as_ptr()).collect();
    call(&callable, &pointers)
}

/// What one step of a coroutine or a generator did: sent into ([`send`]), or thrown into.
pub enum Sent<'py> {
    Returned(Bound<'py, PyAny>),
    Yielded(Bound<'py, PyAny>),
}

/// Sends `None` into `iterator` (a coroutine, an awaitable's iterator) by `PyIter_Send`; a
/// thread the exiting interpreter ends inside it parks.
pub fn send<'py>(iterator: &Bound<'py, PyAny>) -> PyResult<Sent<'py>> {
    let py = iterator.py();
    let mut result: *mut pyo3::ffi::PyObject = std::ptr::null_mut();
    // SAFETY: the GIL is held; `iterator` is a live object; `PyIter_Send` stores a new
    // reference in `result` for a return or a yield, and sets an exception for an error.
    #[allow(unsafe_code)]
    let sent = unsafe {
        parking::soma_iter_send(iterator.as_ptr(), pyo3::ffi::Py_None(), &raw mut result)
    };
    match sent {
        // SAFETY: a new reference, per `PyIter_Send`'s contract.
        #[allow(unsafe_code)]
        0 => Ok(Sent::Returned(unsafe { Bound::from_owned_ptr(py, result) })),
        // SAFETY: as above.
        #[allow(unsafe_code)]
        1 => Ok(Sent::Yielded(unsafe { Bound::from_owned_ptr(py, result) })),
        _ => Err(PyErr::fetch(py)),
    }
}

/// The next item of `iterator`, as [`Bound::<PyIterator>::next`] gives it, by [`send`]: for the
/// user's iterables Soma reads itself (a stream's inputs, an `each` step's items), whose
/// `__next__` (a generator reading files, say) runs as long as a node may. `None` at the end; a
/// generator's return value is dropped there, as `next` drops it.
pub fn next<'py>(iterator: &Bound<'py, PyIterator>) -> Option<PyResult<Bound<'py, PyAny>>> {
    match send(iterator.as_any()) {
        Ok(Sent::Yielded(item)) => Some(Ok(item)),
        Ok(Sent::Returned(_)) => None,
        Err(raised) => Some(Err(raised)),
    }
}

/// Takes the GIL for this thread, making its thread state if it has none, as
/// `PyGILState_Ensure` does, whose count it keeps; a thread the exiting interpreter ends while
/// it waits parks.
///
/// # Safety
/// The interpreter is initialized, and the caller pairs it with a release, as
/// `PyGILState_Ensure`'s own callers do.
#[allow(unsafe_code)]
pub unsafe fn gil_ensure() {
    // SAFETY: the caller's.
    unsafe {
        parking::soma_gil_ensure();
    }
}

/// [`Python::attach`], for every thread Soma's code runs on: should the interpreter end this
/// thread while it waits for the GIL or runs Python inside (Python 3.11 ends a thread that asks
/// for the GIL once finalizing has begun with `pthread_exit`), the thread parks for good
/// instead, before that forced unwinding reaches a frame that catches unwinds (a fan-out's
/// branch, a `PyO3` method) and aborts the process. The process is ending; nobody waits for the
/// thread's work. `clippy.toml` keeps the glue from calling `Python::attach` itself.
#[allow(clippy::disallowed_methods)] // The one place the glue takes the GIL.
pub fn attach<F, R>(call: F) -> R
where
    F: for<'py> FnOnce(Python<'py>) -> R,
{
    parked_if_ended(|| Python::attach(call))
}

/// [`Python::detach`], which takes the GIL back on its way out, for the same reason as
/// [`attach`].
#[allow(clippy::disallowed_methods)] // The one place the glue lets the GIL go.
pub fn detach<T, F>(py: Python<'_>, call: F) -> T
where
    F: pyo3::marker::Ungil + FnOnce() -> T,
    T: pyo3::marker::Ungil,
{
    parked_if_ended(|| py.detach(call))
}

/// Runs `call`; should the thread be unwound out of it other than by a Rust panic — the
/// interpreter's `pthread_exit` — parks it for good instead. This relies on the unwinding
/// reaching the guard through frames that let it pass, as they have in every case tried
/// (`tests/test_deadlines.py`); the calls of the user's code go through `c/exit.c` instead,
/// which stops it in a C frame.
// Inlined into every `attach`, a node's call among them: left to the compiler, a sync node's
// call became three calls of their own, 32 instructions a node more
// (`benches/python/instructions.py`).
#[allow(clippy::inline_always)]
#[inline(always)]
fn parked_if_ended<T>(call: impl FnOnce() -> T) -> T {
    /// Dropped only by an unwinding out of `call`: a Rust panic, or the forced unwinding of a
    /// thread ended by the interpreter — the one that is not a panic. A return forgets it, so
    /// that the way out of every node's call has no drop to make.
    struct Ending;
    impl Drop for Ending {
        fn drop(&mut self) {
            if !thread::panicking() {
                park_for_good();
            }
        }
    }
    let ending = Ending;
    let value = call();
    std::mem::forget(ending);
    value
}

/// Whether the exit has closed the door: a thread that ends now leaves its thread state alone.
pub fn closed() -> bool {
    door().closed
}

/// The `atexit` hook; see the module docs. Not API.
#[pyfunction]
pub fn _at_exit(py: Python<'_>) {
    detach(py, || {
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
