//! What a Python node returns and receives: `Await`, `Done` and `Ctx`.
//!
//! Defined in Rust so that telling an `Await` from a plain value, on every call of every node,
//! is a type-pointer comparison and not an attribute lookup.

use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use soma_core::NodeId;

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

/// Calls `soma.journal._calls.<name>(*args)`: where a call's effects and questions are kept,
/// which only Python can reach (its run's journal is found through a context variable).
fn in_journal<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyString>,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    crate::py_modules::journal_calls(py)?
        .getattr(name)?
        .call1(args)
}

/// What a node knows about the call it is in.
#[pyclass(frozen, module = "soma", name = "Ctx")]
pub struct PyCtx {
    /// The node's id: shared with the engine's, where a copy of its text would cost every call
    /// of a node that takes a `ctx` an allocation.
    pub node: NodeId,
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
    /// The node's input in this call: what a run's journal tells one call of a node from
    /// another by (its content), read only when the node makes an effect or asks.
    pub input: Py<PyAny>,
    /// The run with a journal this call is part of (`soma.journal._active.ACTIVE`), taken
    /// where the call began, so that an effect made from a thread the node starts (whose
    /// context is fresh) is the run's too; `None` outside such a run.
    pub run: Option<Py<PyAny>>,
    /// This call's place in its run's journal (`soma.journal._calls.Call`): made by the first
    /// `effect` or `ask`, so that each numbers its effects and questions from the start.
    pub call: PyOnceLock<Py<PyAny>>,
}

/// How many runs with a journal this process holds (begun and not yet ended, a stream's from
/// the call that made it to its end): while it holds none, no call can be part of one, and a
/// node's call that takes a `ctx` does not read the context variable that would say which (a
/// Python call on every such call), as [`crate::observer::watched`] reads nothing while
/// nothing watches.
static JOURNAL_RUNS: AtomicUsize = AtomicUsize::new(0);

/// Counts a run with a journal held by this process (`held`), or no longer: called by the
/// journal where it begins holding a run and where it ends one, once each. Not API.
#[pyfunction]
pub fn _journal_run_held(held: bool) {
    // Release and acquire: a run's calls, made after it began, see it counted.
    if held {
        JOURNAL_RUNS.fetch_add(1, Ordering::Release);
    } else {
        JOURNAL_RUNS.fetch_sub(1, Ordering::Release);
    }
}

/// The run with a journal the call beginning here is part of (see [`PyCtx::run`]); `None` at
/// the cost of a counter's read while the process holds no such run.
pub(crate) fn journal_run(py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
    static ACTIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if JOURNAL_RUNS.load(Ordering::Acquire) == 0 {
        return Ok(None);
    }
    let run = ACTIVE
        .get_or_try_init(py, || {
            crate::py_modules::journal_active(py)?
                .getattr("ACTIVE")
                .map(Bound::unbind)
        })?
        .bind(py)
        .call_method0(intern!(py, "get"))?;
    Ok((!run.is_none()).then(|| run.unbind()))
}

#[pymethods]
impl PyCtx {
    /// The node's id.
    #[getter]
    fn node(&self) -> &str {
        self.node.as_str()
    }

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

    /// Runs `function(*args, **kwargs)` once per run and returns its result: inside a run with
    /// a journal, a resumed or retried call gets the result recorded the first time back instead
    /// of running it again (see the guide's "Runs that survive"); outside one, it simply runs.
    #[pyo3(signature = (function, /, *args, **kwargs))]
    fn effect<'py>(
        slf: &Bound<'py, Self>,
        function: &Bound<'py, PyAny>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        in_journal(py, intern!(py, "effect"), (slf, function, args, kwargs))
    }

    /// `effect` for an async function: awaits `function(*args, **kwargs)` once per run.
    #[pyo3(signature = (function, /, *args, **kwargs))]
    fn aeffect<'py>(
        slf: &Bound<'py, Self>,
        function: &Bound<'py, PyAny>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        in_journal(py, intern!(py, "aeffect"), (slf, function, args, kwargs))
    }

    /// Asks a person `question` and returns the answer: the run pauses (`forward` raises
    /// `soma.Paused`) until it is resumed with one (`Graph.resume(..., answers=...)`).
    fn ask<'py>(
        slf: &Bound<'py, Self>,
        question: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        in_journal(py, intern!(py, "ask"), (slf, question))
    }

    /// `ask` for an async node: awaitable.
    fn aask<'py>(
        slf: &Bound<'py, Self>,
        question: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        in_journal(py, intern!(py, "aask"), (slf, question))
    }

    /// This call's place in its run's journal, made when first asked for (not API).
    #[getter]
    fn _call<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.call
            .get_or_try_init(py, || {
                crate::py_modules::journal_calls(py)?
                    .getattr(intern!(py, "Call"))?
                    .call1((
                        self.node.as_str(),
                        self.input.bind(py),
                        self.turn,
                        self.run.as_ref().map(|run| run.bind(py)),
                    ))
                    .map(Bound::unbind)
            })
            .map(|call| call.bind(py).clone())
    }

    fn __repr__(&self) -> String {
        format!("Ctx(node={:?}, turn={})", self.node.as_str(), self.turn)
    }
}
