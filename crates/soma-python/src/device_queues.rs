//! Device queues per branch: where a forward's waves fork and join the queues of the devices
//! its nodes are placed on, so that two branches on one GPU put their work on device queues of
//! their own and values pass between queues by events (`soma.devices._device_queues` holds the
//! rules, in Python, beside the device backends that drive them). A device queue is what CUDA calls
//! a stream; "stream" in Soma means only a stream of items (`stream.rs`).
//!
//! Each thread has a *scope*: the Python object whose queues its placed nodes run on — the
//! caller's own for the nodes outside every wave, a branch's inside one. A forward sets its
//! caller's scope ([`Scope::for_forward`]), each wave forks the scope of the thread that reached
//! it ([`fork`]), and each branch runs in a scope of its own ([`in_branch`]), closed when it
//! ends. Only a forward whose graph places a node on a device whose backend offers queues has a
//! scope at all: for any other, this costs a check of an empty thread-local per wave and per
//! branch, and no Python call.

use std::cell::RefCell;

use pyo3::intern;
use pyo3::prelude::*;
use soma_core::Device;

thread_local! {
    /// This thread's scope: `soma.devices._device_queues.Root` or
    /// `soma.devices._device_queues.Branch`; `None` outside a forward with device queues.
    static SCOPE: RefCell<Option<Py<PyAny>>> = const { RefCell::new(None) };
}

/// A thread's scope, set for a while and put back when dropped.
pub struct Scope {
    before: Option<Py<PyAny>>,
}

impl Scope {
    /// The caller's scope for a forward whose nodes are placed on `placed`: its queues on each
    /// of those devices, if a backend offers queues for one; none otherwise (an error
    /// reported).
    pub fn for_forward(py: Python<'_>, placed: &[Device]) -> Scope {
        let root = if placed.is_empty() {
            None
        } else {
            let placed: Vec<String> = placed.iter().map(ToString::to_string).collect();
            let root = crate::py_modules::device_queues(py)
                .and_then(|module| module.call_method1(intern!(py, "root"), (placed,)));
            match root {
                Ok(root) if root.is_none() => None,
                Ok(root) => Some(root.unbind()),
                Err(error) => {
                    error.write_unraisable(py, None);
                    None
                }
            }
        };
        Scope::set(root)
    }

    /// No scope, for what must not fork this thread's device queues: a stream of items
    /// (`g.map`), whose stages pass items from thread to thread at any time, not at a wave's
    /// joins, and so run on the device queues their threads have, as without Soma.
    pub fn outside() -> Scope {
        Scope::set(None)
    }

    fn set(scope: Option<Py<PyAny>>) -> Scope {
        Scope {
            before: SCOPE.with(|current| current.replace(scope)),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let before = self.before.take();
        // The scope left is dropped here, with the GIL: every scope is set and dropped inside
        // the interpreter's hold on the thread.
        drop(SCOPE.with(|current| current.replace(before)));
    }
}

/// This thread's scope, if it has one; not borrowed, since Python code run in it may set
/// another (a nested forward).
fn current(py: Python<'_>) -> Option<Py<PyAny>> {
    SCOPE.with(|current| current.borrow().as_ref().map(|scope| scope.clone_ref(py)))
}

/// A wave about to start on this thread: an event on each of this scope's queues, for its
/// branches to wait on (`soma.devices._device_queues.Wave`); `None` without queues.
pub fn fork(py: Python<'_>) -> Option<Py<PyAny>> {
    let scope = current(py)?;
    match scope.call_method0(py, intern!(py, "fork")) {
        Ok(wave) => Some(wave),
        Err(error) => {
            error.write_unraisable(py, None);
            None
        }
    }
}

/// Runs one branch of `wave` (from [`fork`]) in a scope of its own, and closes it when `run`
/// returns: the queues the wave was reached on wait on the branch's work.
pub fn in_branch(py: Python<'_>, wave: &Py<PyAny>, run: &mut dyn FnMut()) {
    let branch = match wave.call_method0(py, intern!(py, "branch")) {
        Ok(branch) => branch,
        Err(error) => {
            error.write_unraisable(py, None);
            return run();
        }
    };
    let scope = Scope::set(Some(branch.clone_ref(py)));
    run();
    drop(scope);
    if let Err(error) = branch.call_method0(py, intern!(py, "close")) {
        error.write_unraisable(py, None);
    }
}

/// Makes `device` current for a placed node about to run on this thread, with this scope's
/// queues when it has some; returns what puts back the thread's own, or `None` when there is
/// nothing to put back.
pub fn enter<'py>(py: Python<'py>, device: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    let restore = match current(py) {
        Some(scope) => scope
            .bind(py)
            .call_method1(intern!(py, "enter"), (device,))?,
        None => crate::py_modules::devices(py)?
            .getattr(intern!(py, "_enter"))?
            .call1((device,))?,
    };
    Ok((!restore.is_none()).then_some(restore))
}
