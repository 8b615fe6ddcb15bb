//! A crew thread's Python thread state, kept for as long as the thread lives.
//!
//! Taking the GIL on a thread that has no thread state makes one — allocated, registered with
//! the interpreter, given a frame stack that is mapped on first use — and letting go of the GIL
//! for good deletes it again, unmapping the stack, which interrupts every other core running the
//! process to flush its address cache. For a small branch that was most of what it cost. So a
//! crew thread makes its state once and keeps it for as long as the thread lives; each branch it
//! runs then only takes the GIL and gives it back.
//!
//! What Python keeps in a thread state (`threading.local` values, a trace function) therefore
//! carries over from one branch a thread runs to the next, exactly like native thread-local
//! state in any thread pool (`soma-core`'s `crew.rs` says which thread takes which branch).
//!
//! The state is deleted when the thread ends — idle threads beyond the graph's limit end, and
//! all of them once the graph is dropped — unless the interpreter is exiting (`exit.rs`): its
//! teardown deletes the state itself, and asking for the GIL then would end the thread badly.

use std::cell::Cell;

use pyo3::ffi;

thread_local! {
    static KEPT: OwnThreadState = const { OwnThreadState { made: Cell::new(false) } };
}

/// Whether this thread holds a thread state of its own, made by [`keep`]; deleted on drop, at
/// the thread's end.
struct OwnThreadState {
    made: Cell<bool>,
}

/// Gives this thread a Python thread state that outlives every `Python::attach` on it, unless it
/// has one already. Waits for the GIL the first time, and does not hold it on return.
pub fn keep() {
    KEPT.with(|kept| {
        if kept.made.get() {
            return;
        }
        // SAFETY: the interpreter is running (this is called from a branch of a graph that
        // Python is running). `PyGILState_Ensure` on a thread without a state makes one, takes
        // the GIL and counts one outstanding ensure; `PyEval_SaveThread` lets the GIL go and
        // keeps the state. The outstanding ensure is what keeps PyO3's own ensure/release
        // pairs, in every later `Python::attach`, from deleting the state.
        #[allow(unsafe_code)]
        unsafe {
            crate::exit::gil_ensure();
            ffi::PyEval_SaveThread();
        }
        kept.made.set(true);
    });
}

impl Drop for OwnThreadState {
    fn drop(&mut self) {
        if !self.made.get() {
            return;
        }
        // SAFETY: this thread made a state in `keep` and holds its outstanding ensure, and does
        // not hold the GIL (every `Python::attach` has returned). When the interpreter has been
        // finalized, the state is gone with it and is left alone. Otherwise: one more ensure
        // takes the GIL with the kept state; releasing it as if the GIL had been held before
        // only counts back down; releasing the original ensure reaches zero, which clears and
        // deletes the state and lets the GIL go.
        #[allow(unsafe_code)]
        unsafe {
            if ffi::Py_IsInitialized() == 0 || crate::exit::closed() {
                return;
            }
            let state = ffi::PyGILState_Ensure();
            ffi::PyGILState_Release(ffi::PyGILState_STATE::PyGILState_LOCKED);
            ffi::PyGILState_Release(state);
        }
    }
}
