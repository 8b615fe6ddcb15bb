//! Python objects as nodes.
//!
//! A node's call attaches to the interpreter; a branch thread already holds the GIL from one
//! Python node to the next (see `graph.rs`) and gives it back wherever the engine blocks, so the
//! branches of a wave take turns at the GIL and really overlap wherever a node's work releases it
//! (numpy, torch, I/O, a driver's wait).

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use soma_core::{Ctx, Node, NodeError, Transition, Value};

use crate::convert::{to_python, wrap};
use crate::device;
use crate::protocol::{Await, Done, PyCtx};
use crate::watch::note_interrupt;

/// `callable(arg, ...)`, its arguments handed over as an array (the interpreter's vectorcall):
/// what `call1` does with an interpreter's own ABI. Under the stable ABI (abi3, which the wheel is
/// built for) `call1` builds a tuple of them on every call instead, which cost a chain of trivial
/// nodes about a fifth of its time (`benches/python/abi3.py`).
macro_rules! call {
    ($callable:expr, $($arg:expr),+) => {{
        let callable: &Bound<'_, PyAny> = $callable;
        let args = [$($arg.as_ptr()),+];
        // SAFETY: the GIL is held (a `Bound` is proof of it); each argument is a `Bound` borrowed
        // at the call site, alive until the call returns, and `args` holds exactly `args.len()`
        // of them, with no keyword names. It returns a new reference, or null with an exception
        // set, which is what `from_owned_ptr_or_err` takes.
        #[allow(unsafe_code)]
        unsafe {
            let out = vectorcall::PyObject_Vectorcall(
                callable.as_ptr(),
                args.as_ptr(),
                args.len(),
                std::ptr::null_mut(),
            );
            Bound::from_owned_ptr_or_err(callable.py(), out)
        }
    }};
}

/// The interpreter's vectorcall, declared here because the limited API an abi3-py311 build sees
/// has it only from 3.12 on (`pyo3::ffi` leaves it out). Python 3.11 exports the same function
/// with the same signature (`Include/cpython/abstract.h`), and 3.12 made it part of the stable
/// ABI.
mod vectorcall {
    use pyo3::ffi::PyObject;

    extern "C" {
        pub(super) fn PyObject_Vectorcall(
            callable: *mut PyObject,
            args: *const *mut PyObject,
            nargsf: usize,
            kwnames: *mut PyObject,
        ) -> *mut PyObject;
    }
}

/// A Python object with a `forward(x)` or `forward(x, ctx)` method.
pub struct PythonNode {
    callee: Callee,
    takes_ctx: bool,
}

/// What a node calls, looked up once at registration; it keeps the object alive.
enum Callee {
    /// A method bound the ordinary way, kept as its function and the object it is bound to and
    /// called as `function(object, x)`, which is what calling the bound method does: without
    /// reading the bound method's memory on every call (a cache miss per node once a graph is
    /// larger than the caches), and without keeping a bound method per node, one more object
    /// for the garbage collector to walk in a graph of a million nodes.
    Method {
        function: Py<PyAny>,
        object: Py<PyAny>,
    },
    /// Any other callable: a function set on the instance, a `staticmethod`, an object with
    /// `__call__`.
    Other(Py<PyAny>),
}

impl PythonNode {
    /// The node calling `forward`, the object's `forward` as registration looked it up.
    pub fn new(forward: Bound<'_, PyAny>, takes_ctx: bool) -> PyResult<Self> {
        // Looked up once: importing `types` for every node cost registration about 1 µs.
        static BOUND_METHOD: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        let py = forward.py();
        let bound_method = BOUND_METHOD.import(py, "types", "MethodType")?;
        let callee = if forward.get_type().is(bound_method) {
            Callee::Method {
                function: forward.getattr(intern!(py, "__func__"))?.unbind(),
                object: forward.getattr(intern!(py, "__self__"))?.unbind(),
            }
        } else {
            Callee::Other(forward.unbind())
        };
        Ok(PythonNode { callee, takes_ctx })
    }

    /// Shows the garbage collector the Python references this node holds.
    pub fn traverse(&self, visit: &pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        match &self.callee {
            Callee::Method { function, object } => {
                visit.call(function)?;
                visit.call(object)
            }
            Callee::Other(forward) => visit.call(forward),
        }
    }

    fn call(&self, py: Python<'_>, input: &Value, ctx: &Ctx<'_>) -> PyResult<Transition> {
        let Some(placed) = ctx.device() else {
            return self.call_here(py, input, ctx);
        };
        // The node's device is current while it runs, and what was before is put back whether
        // it returned or raised.
        let restore = device::enter(py, placed)?;
        let out = self.call_here(py, input, ctx);
        let restored = restore.map(|restore| restore.call0()).transpose();
        // The node's own error first: putting the device back failing is the lesser news.
        let out = out?;
        restored?;
        if let Transition::Done(value) = &out {
            device::check(py, ctx.node().as_str(), placed, &to_python(py, value)?)?;
        }
        Ok(out)
    }

    fn call_here(&self, py: Python<'_>, input: &Value, ctx: &Ctx<'_>) -> PyResult<Transition> {
        let x = to_python(py, input)?;
        let out = if self.takes_ctx {
            let results = ctx
                .results()
                .iter()
                .map(|r| to_python(py, r))
                .collect::<PyResult<Vec<_>>>()?;
            let ctx = PyCtx {
                node: ctx.node().to_string(),
                turn: ctx.turn(),
                results: PyTuple::new(py, results)?.unbind(),
                device: ctx.device().map(|device| device.to_string()),
            };
            let ctx = Bound::new(py, ctx)?;
            match &self.callee {
                Callee::Method { function, object } => {
                    call!(function.bind(py), object.bind(py), x, ctx)?
                }
                Callee::Other(forward) => call!(forward.bind(py), x, ctx)?,
            }
        } else {
            match &self.callee {
                Callee::Method { function, object } => {
                    call!(function.bind(py), object.bind(py), x)?
                }
                Callee::Other(forward) => call!(forward.bind(py), x)?,
            }
        };
        Ok(interpret(out))
    }
}

/// What a node's return value means: an `Await`, a `Done`, or the output itself.
///
/// Neither class can be subclassed, so each is told by its exact type: one pointer comparison,
/// where an instance check walks the type's bases for every plain output.
pub fn interpret(out: Bound<'_, PyAny>) -> Transition {
    if let Ok(asked) = out.cast_exact::<Await>() {
        let py = out.py();
        return Transition::Await(
            asked
                .get()
                .requests
                .iter()
                .map(|r| wrap(r.bind(py).clone()))
                .collect(),
        );
    }
    if let Ok(done) = out.cast_exact::<Done>() {
        return Transition::Done(wrap(done.get().value.bind(out.py()).clone()));
    }
    Transition::Done(wrap(out))
}

impl Node for PythonNode {
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Python::attach(|py| {
            self.call(py, input, ctx).inspect_err(|raised| {
                if raised.is_instance_of::<PyKeyboardInterrupt>(py) {
                    note_interrupt();
                }
            })
        })
        .map_err(NodeError::from_cause)
    }

    /// The object the call passes as `self`, whose reference count the call changes first: in
    /// a graph of 100,000 nodes, waiting for it took about a third of each node's time.
    fn prefetch(&self) {
        let object = match &self.callee {
            Callee::Method { object, .. } => object,
            Callee::Other(forward) => forward,
        };
        soma_core::prefetch_line(object.as_ptr());
    }
}
