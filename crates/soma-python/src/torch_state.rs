//! torch's per-thread state — grad mode, inference mode, autocast — carried from the thread that
//! reached a wave into each of its branches, and put back on the branch's thread when it ends;
//! carried by each item of a stream from one stage's thread to the next ([`Carried::carry`]); and
//! carried by each task of an async run from one of its steps on the loop's thread to the next,
//! the same way (`aio.rs`: under `forward` the loop runs on a thread of its own).
//!
//! torch is never imported here: it is carried only when `sys.modules` already holds it. The
//! usual state — inference mode off, autocast off everywhere, grad mode on or off — is read and
//! set here by calling torch's own functions (looked up once): five calls into torch a branch,
//! no Python frame. Any other state, and a branch's thread found in another, goes through
//! `soma.devices._torch_state`, which reads and sets all of it in Python (about a microsecond a
//! branch).

use std::sync::atomic::{AtomicIsize, Ordering};

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

/// torch's state on the thread that reached a wave, as each of its branches sets it.
pub enum Carried {
    /// Inference mode off and autocast off everywhere, and grad mode as given.
    Usual { grad: bool },
    /// Any other: what `soma.devices._torch_state.capture()` returned, which sets it on the thread
    /// that calls it and returns what puts that thread's own back.
    Other(Py<PyAny>),
}

/// torch's own functions that read and set the usual state: `is_grad_enabled`,
/// `is_inference_mode_enabled`, `_C._is_any_autocast_enabled`, `_C._set_grad_enabled`.
struct Functions {
    grad: Py<PyAny>,
    inference: Py<PyAny>,
    any_autocast: Py<PyAny>,
    set_grad: Py<PyAny>,
}

/// Looked up the first time torch is found loaded; `None` for a torch without one of them (the
/// autocast check is private), which is then carried in Python only.
static FUNCTIONS: PyOnceLock<Option<Functions>> = PyOnceLock::new();

impl Functions {
    fn of(py: Python<'_>, torch: &Bound<'_, PyAny>) -> Option<&'static Functions> {
        FUNCTIONS
            .get_or_init(py, || {
                let internals = torch.getattr(intern!(py, "_C")).ok()?;
                Some(Functions {
                    grad: torch.getattr(intern!(py, "is_grad_enabled")).ok()?.unbind(),
                    inference: torch
                        .getattr(intern!(py, "is_inference_mode_enabled"))
                        .ok()?
                        .unbind(),
                    any_autocast: internals
                        .getattr(intern!(py, "_is_any_autocast_enabled"))
                        .ok()?
                        .unbind(),
                    set_grad: internals
                        .getattr(intern!(py, "_set_grad_enabled"))
                        .ok()?
                        .unbind(),
                })
            })
            .as_ref()
    }

    fn ask(py: Python<'_>, function: &Py<PyAny>) -> PyResult<bool> {
        function.bind(py).call0()?.is_truthy()
    }

    /// This thread's grad mode, if it is in the usual state otherwise; `None` if not.
    fn usual_grad(&self, py: Python<'_>) -> PyResult<Option<bool>> {
        if Self::ask(py, &self.inference)? || Self::ask(py, &self.any_autocast)? {
            return Ok(None);
        }
        Self::ask(py, &self.grad).map(Some)
    }

    fn set_grad(&self, py: Python<'_>, on: bool) -> PyResult<()> {
        self.set_grad.bind(py).call1((on,)).map(drop)
    }

    /// Puts back a thread's usual state with grad mode `grad`, whatever a branch's nodes
    /// switched and left: grad mode, and autocast (in Python, since switching it off touches
    /// every device type).
    fn put_back(&self, py: Python<'_>, grad: bool) -> PyResult<()> {
        if Self::ask(py, &self.any_autocast)? {
            crate::py_modules::torch_state(py)?.call_method0(intern!(py, "switch_autocast_off"))?;
        }
        if Self::ask(py, &self.grad)? != grad {
            self.set_grad(py, grad)?;
        }
        Ok(())
    }
}

/// Whether torch is loaded and asked for deterministic algorithms
/// (`torch.use_deterministic_algorithms(True)`): a wave then runs its branches on the thread that
/// reached it, in declared order (`Captured::in_order`), since backward sums the gradients a
/// value gets from several branches in the order of numbers torch's autograd counts per thread.
pub fn deterministic(py: Python<'_>) -> bool {
    let Some(torch) = loaded(py) else {
        return false;
    };
    // A module loaded as `torch` without the function (a stand-in a test made, a release
    // before it) asks for nothing.
    let Ok(asked) = torch.getattr(intern!(py, "are_deterministic_algorithms_enabled")) else {
        return false;
    };
    asked
        .call0()
        .and_then(|enabled| enabled.is_truthy())
        .map_err(|error| error.write_unraisable(py, None))
        .unwrap_or(false)
}

/// torch's state on this thread, to carry, if torch has been imported by someone.
pub fn capture(py: Python<'_>) -> Option<Carried> {
    let torch = loaded(py)?;
    if let Some(functions) = Functions::of(py, &torch) {
        match functions.usual_grad(py) {
            Ok(Some(grad)) => return Some(Carried::Usual { grad }),
            Ok(None) => {}
            Err(error) => error.write_unraisable(py, None),
        }
    }
    in_python(py, intern!(py, "capture"), ()).map(Carried::Other)
}

/// Runs `run` on this thread, and puts back torch's state as this thread had it before, whatever
/// `run`'s nodes changed: a whole forward, whose nodes outside every wave run on the caller's
/// thread, in the caller's state already — so nothing is set, only put back.
pub fn kept(py: Python<'_>, run: &mut dyn FnMut()) {
    match capture(py) {
        None => run(),
        Some(Carried::Usual { grad }) => {
            run();
            report(py, Carried::functions(py).put_back(py, grad));
        }
        Some(Carried::Other(enter)) => entered(py, enter.bind(py), run),
    }
}

impl Carried {
    /// The same state, for a stream item of its own.
    pub fn clone_ref(&self, py: Python<'_>) -> Carried {
        match self {
            Carried::Usual { grad } => Carried::Usual { grad: *grad },
            Carried::Other(enter) => Carried::Other(enter.clone_ref(py)),
        }
    }

    /// Runs `run` with this state set on this thread, then keeps what `run`'s nodes left set in
    /// its place and puts the thread's own back: how a stream item carries torch's state from
    /// one stage's thread to the next, as a forward's nodes share their one thread's.
    pub fn carry(&mut self, py: Python<'_>, run: &mut dyn FnMut()) {
        if let Carried::Usual { grad } = *self {
            let functions = Carried::functions(py);
            if let Ok(Some(had)) = functions.usual_grad(py) {
                return self.carry_usual(py, functions, grad, had, run);
            }
        }
        let mut left = None;
        self.run_in(py, &mut || {
            run();
            left = capture(py);
        });
        if let Some(left) = left {
            *self = left;
        }
    }

    /// [`Carried::carry`] of the usual state `grad` on a thread in the usual state `had` — an
    /// async task's step on the loop's thread, as a rule: the three calls that tell whether the
    /// state `run` left is the usual one read it too, where capturing it and putting the
    /// thread's back would read it twice.
    fn carry_usual(
        &mut self,
        py: Python<'_>,
        functions: &Functions,
        grad: bool,
        had: bool,
        run: &mut dyn FnMut(),
    ) {
        if had != grad {
            report(py, functions.set_grad(py, grad));
        }
        run();
        match functions.usual_grad(py) {
            Ok(Some(left)) => {
                *self = Carried::Usual { grad: left };
                if left != had {
                    report(py, functions.set_grad(py, had));
                }
            }
            // The nodes left another state (autocast on, say): kept in Python, and the thread's
            // usual one put back, as `run_in` does.
            Ok(None) => {
                if let Some(left) = in_python(py, intern!(py, "capture"), ()) {
                    *self = Carried::Other(left);
                }
                report(py, functions.put_back(py, had));
            }
            Err(error) => {
                error.write_unraisable(py, None);
                report(py, functions.put_back(py, had));
            }
        }
    }

    /// torch's functions, which read every usual state ever captured.
    fn functions(py: Python<'_>) -> &'static Functions {
        FUNCTIONS
            .get(py)
            .and_then(Option::as_ref)
            .expect("a usual state was read with torch's functions")
    }

    /// Runs `run` with this state set on this thread, and puts the thread's own back after.
    pub fn run_in(&self, py: Python<'_>, run: &mut dyn FnMut()) {
        match self {
            Carried::Other(enter) => entered(py, enter.bind(py), run),
            Carried::Usual { grad } => {
                let functions = Carried::functions(py);
                match functions.usual_grad(py) {
                    Ok(Some(had)) => {
                        if had != *grad {
                            report(py, functions.set_grad(py, *grad));
                        }
                        run();
                        report(py, functions.put_back(py, had));
                    }
                    // The thread is in another state (a node left inference mode on, say):
                    // the general path, which puts all of it back.
                    Ok(None) => match in_python(py, intern!(py, "usual"), (*grad,)) {
                        Some(enter) => entered(py, enter.bind(py), run),
                        None => run(),
                    },
                    Err(error) => {
                        error.write_unraisable(py, None);
                        run();
                    }
                }
            }
        }
    }
}

/// Runs `run` after `enter` (from `soma.devices._torch_state`), and calls what it returned after.
fn entered(py: Python<'_>, enter: &Bound<'_, PyAny>, run: &mut dyn FnMut()) {
    let restore = enter
        .call0()
        .map_err(|error| error.write_unraisable(py, None))
        .ok();
    run();
    if let Some(restore) = restore {
        report(py, restore.call0().map(drop));
    }
}

/// Reports a failure to carry torch's state where no node could catch it: as Python reports an
/// exception in a destructor. The branch runs anyway.
fn report(py: Python<'_>, outcome: PyResult<()>) {
    if let Err(error) = outcome {
        error.write_unraisable(py, None);
    }
}

/// `soma.devices._torch_state.<function>(*args)`; `None`, the error reported, if it failed.
fn in_python<'py>(
    py: Python<'py>,
    function: &Bound<'py, pyo3::types::PyString>,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> Option<Py<PyAny>> {
    crate::py_modules::torch_state(py)
        .and_then(|module| module.getattr(function)?.call1(args))
        .map(Bound::unbind)
        .map_err(|error| error.write_unraisable(py, None))
        .ok()
}

/// `len(sys.modules)` when `torch` was last found absent from it (no such key), or -1.
///
/// A key is added to `sys.modules` only by an import (or by hand), and importing torch adds
/// hundreds: while the length is what it was, torch is still absent, and the lookup — a miss in
/// a dict of hundreds of modules, on every forward and every wave of a program without torch —
/// is skipped. A key present with the value `None` (an import blocked) is looked up every time,
/// since putting torch back in its place keeps the length.
static ABSENT_AT: AtomicIsize = AtomicIsize::new(-1);

/// The torch module, if someone has imported it: looked up in `sys.modules`, never imported.
fn loaded(py: Python<'_>) -> Option<Bound<'_, PyAny>> {
    // SAFETY: the GIL is held; `PyImport_GetModuleDict` returns a borrowed reference to the
    // interpreter's `sys.modules`, alive as long as the interpreter.
    #[allow(unsafe_code)]
    let modules = unsafe { Bound::from_borrowed_ptr_or_opt(py, ffi::PyImport_GetModuleDict()) }?;
    let modules = modules.cast_into::<PyDict>().ok()?;
    let length = isize::try_from(modules.len()).unwrap_or(-1);
    if length == ABSENT_AT.load(Ordering::Relaxed) {
        return None;
    }
    // `None` there is how a program blocks an import: torch is not loaded then either.
    match modules.get_item(intern!(py, "torch")) {
        Ok(Some(torch)) if !torch.is_none() => Some(torch),
        Ok(Some(_)) | Err(_) => None,
        Ok(None) => {
            ABSENT_AT.store(length, Ordering::Relaxed);
            None
        }
    }
}
