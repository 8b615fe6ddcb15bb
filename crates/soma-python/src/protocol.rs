//! What a Python node returns and receives: `Await`, `Done` and `Ctx`.
//!
//! Defined in Rust so that telling an `Await` from a plain value, on every call of every node,
//! is a type-pointer comparison and not an attribute lookup.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};

/// Asks the driver: the node is called again with one result per request in `ctx.results`.
#[pyclass(frozen, module = "soma", name = "Await")]
pub struct Await {
    pub requests: Vec<Py<PyAny>>,
}

#[pymethods]
impl Await {
    #[new]
    fn new(requests: &Bound<'_, PyAny>) -> PyResult<Self> {
        let Ok(items) = requests.try_iter() else {
            return Err(PyTypeError::new_err(format!(
                "`Await` takes a list of requests, not an object of type `{}`\nhint: wrap a single request in a list: `soma.Await([request])`",
                requests.get_type().name()?
            )));
        };
        let requests = items
            .map(|item| item.map(Bound::unbind))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Await { requests })
    }

    /// The requests, in order.
    #[getter]
    fn requests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.requests.iter().map(|r| r.bind(py)))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Await({})", self.requests(py)?.repr()?))
    }
}

/// A node's output, said explicitly; returning the value itself means the same.
#[pyclass(frozen, module = "soma", name = "Done")]
pub struct Done {
    pub value: Py<PyAny>,
}

#[pymethods]
impl Done {
    #[new]
    fn new(value: Py<PyAny>) -> Self {
        Done { value }
    }

    /// The output.
    #[getter]
    fn value(&self, py: Python<'_>) -> Py<PyAny> {
        self.value.clone_ref(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("Done({})", self.value.bind(py).repr()?))
    }
}

/// What a node knows about the call it is in.
#[pyclass(frozen, module = "soma", name = "Ctx")]
pub struct PyCtx {
    /// The node's id.
    #[pyo3(get)]
    pub node: String,
    /// 0 on the first call, one more after each answered `Await`.
    #[pyo3(get)]
    pub turn: u32,
    pub results: Py<PyTuple>,
    /// The device the node is placed on (`cuda:1`), `None` when unplaced.
    #[pyo3(get)]
    pub device: Option<String>,
    /// What watches this call (`soma._run.observe.Watched`), taken where the call began, so that
    /// an emit from any thread the node starts reaches it; `None` when nothing watched then.
    pub watched: Option<Py<PyAny>>,
}

#[pymethods]
impl PyCtx {
    /// The driver's answers to the previous `Await`, in order; empty on turn 0.
    #[getter]
    fn results<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.results.bind(py).iter())
    }

    /// Sends `value` (a token, a metric) to whoever watches the run as it goes: the event
    /// stream of `Graph.events`, as an `"emitted"` event naming this node, and the telemetry,
    /// as an event on this call's span — from any thread, while the call runs; once it has
    /// returned, counted as dropped. Nothing happens when nobody watches.
    fn emit(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        static EMITTED: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let Some(watched) = &self.watched else {
            return Ok(());
        };
        EMITTED
            .get_or_try_init(py, || {
                crate::py_modules::observe(py)?
                    .getattr("emitted")
                    .map(Bound::unbind)
            })?
            .bind(py)
            .call1((self.node.as_str(), value, watched.bind(py)))?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("Ctx(node={:?}, turn={})", self.node, self.turn)
    }
}
