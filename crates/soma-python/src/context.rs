//! Every branch runs in its caller's context: the caller's `contextvars`, a copy per branch (as
//! `asyncio.to_thread` does), and, when torch is loaded, its grad mode, inference mode and
//! autocast state (as torch's own `DataParallel` does for its threads).
//!
//! Both are per thread in the interpreter, and a branch runs on a thread lent to it: without
//! this, a branch would see whatever its thread last held — a crew thread's own empty context,
//! torch's defaults — instead of `with torch.no_grad(): g.forward(x)`.
//!
//! [`capture`] runs once per wave, on the thread that reached it, with the GIL; [`Caller::enter`]
//! runs once per branch, on the thread that runs it, the caller's own included: each branch gets
//! a fresh copy of the captured context, so what one branch sets is seen neither by its siblings
//! nor by the code after the wave, and whatever torch state a branch changes is put back when it
//! ends (threads are reused between branches and graphs). Without torch the cost of a branch is
//! a context copy, entered and left: no Python call. torch is never imported here: it is carried
//! only when `sys.modules` already holds it, and then through `soma._torch_state`, which reads
//! and sets torch's state in Python.

use pyo3::ffi;
use pyo3::prelude::*;
use soma_core::Captured;

/// The context a wave was reached in.
pub struct Caller {
    /// A `contextvars.Context`, copied again for each branch: a context can be entered by one
    /// thread at a time, and a branch's changes must stay its own.
    context: Py<PyAny>,
    /// torch's state, as `soma._torch_state.capture()` returned it: called on a branch's thread,
    /// it sets that state and returns what puts the thread's own back. `None` without torch.
    torch: Option<Py<PyAny>>,
}

/// The context of the thread that reached a wave, to be entered by each of its branches.
pub fn capture() -> Option<Box<dyn Captured>> {
    Python::attach(|py| {
        // SAFETY: the GIL is held; `PyContext_CopyCurrent` returns a new reference, or null
        // with an exception set (out of memory).
        #[allow(unsafe_code)]
        let context = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyContext_CopyCurrent()) };
        let context = match context {
            Ok(context) => context.unbind(),
            Err(error) => {
                // Branches then run in what their thread holds, as before there was a context
                // to carry; the error is reported, not raised where no node could catch it.
                error.write_unraisable(py, None);
                return None;
            }
        };
        let torch = torch_loaded(py).then(|| capture_torch(py)).flatten();
        Some(Box::new(Caller { context, torch }) as Box<dyn Captured>)
    })
}

/// Whether torch has been imported by someone: looked up in `sys.modules`, never imported.
fn torch_loaded(py: Python<'_>) -> bool {
    // SAFETY: the GIL is held; `PyImport_GetModuleDict` returns a borrowed reference to the
    // interpreter's `sys.modules`, alive as long as the interpreter.
    #[allow(unsafe_code)]
    let modules = unsafe { Bound::from_borrowed_ptr_or_opt(py, ffi::PyImport_GetModuleDict()) };
    modules.is_some_and(|modules| {
        modules
            .cast::<pyo3::types::PyDict>()
            .is_ok_and(|modules| matches!(modules.get_item("torch"), Ok(Some(_))))
    })
}

fn capture_torch(py: Python<'_>) -> Option<Py<PyAny>> {
    let captured = py
        .import("soma._torch_state")
        .and_then(|module| module.call_method0("capture"));
    match captured {
        Ok(captured) if captured.is_none() => None,
        Ok(captured) => Some(captured.unbind()),
        Err(error) => {
            error.write_unraisable(py, None);
            None
        }
    }
}

impl Captured for Caller {
    fn enter(&self, run: &mut dyn FnMut()) {
        Python::attach(|py| {
            // SAFETY: the GIL is held and `self.context` is a `contextvars.Context`;
            // `PyContext_Copy` returns a new reference, or null with an exception set.
            #[allow(unsafe_code)]
            let copy = unsafe {
                Bound::from_owned_ptr_or_err(py, ffi::PyContext_Copy(self.context.as_ptr()))
            };
            let copy = match copy {
                Ok(copy) => copy,
                Err(error) => {
                    error.write_unraisable(py, None);
                    return run();
                }
            };
            // SAFETY: the GIL is held; the copy was made just now, so no thread has entered it
            // and entering cannot fail.
            #[allow(unsafe_code)]
            let entered = unsafe { ffi::PyContext_Enter(copy.as_ptr()) } == 0;
            if !entered {
                PyErr::fetch(py).write_unraisable(py, None);
            }
            let restore = self.torch.as_ref().and_then(|enter| match enter.call0(py) {
                Ok(restore) => Some(restore),
                Err(error) => {
                    error.write_unraisable(py, None);
                    None
                }
            });
            run();
            if let Some(restore) = restore {
                if let Err(error) = restore.call0(py) {
                    error.write_unraisable(py, None);
                }
            }
            if entered {
                // SAFETY: the GIL is held and this thread entered `copy` above; every context a
                // node entered since (`Context.run`) it has left again, so `copy` is current.
                #[allow(unsafe_code)]
                if unsafe { ffi::PyContext_Exit(copy.as_ptr()) } != 0 {
                    PyErr::fetch(py).write_unraisable(py, None);
                }
            }
        });
    }
}
