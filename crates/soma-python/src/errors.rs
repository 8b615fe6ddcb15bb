//! The one place where core errors become Python exceptions.
//!
//! The exception hierarchy is declared once, in Python (`soma/errors.py`), where multiple
//! inheritance (`CycleError` is also a `ValueError`) is natural; this module instantiates those
//! classes with the error's data as attributes. A Python exception raised inside a node is never
//! wrapped: the very same object comes back out, with a note naming the node. One raised by a
//! driver becomes the `__cause__` of a `soma.DriverError` naming the node, unless it is not an
//! `Exception` (`KeyboardInterrupt`, `SystemExit`, `GeneratorExit`): those come back out as
//! themselves, like a node's, so that `except Exception` never swallows a Ctrl-C.

use pyo3::exceptions::{PyException, PyKeyboardInterrupt, PyTimeoutError};
use pyo3::prelude::*;
use soma_core::{
    CompileError, DeviceError, GraphError, HostError, NodeId, ProgramError, RunError, SettingError,
};

/// An instance of `soma.errors.<class>` with `message`, and `attributes` set on it.
fn soma_error(
    py: Python<'_>,
    class: &str,
    message: String,
    attributes: &[(&str, Bound<'_, PyAny>)],
) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let exception = crate::py_modules::errors(py)?
            .getattr(class)?
            .call1((message,))?;
        for (name, value) in attributes {
            exception.setattr(*name, value)?;
        }
        Ok(PyErr::from_value(exception))
    };
    build().unwrap_or_else(|failure| failure)
}

fn text<'py>(py: Python<'py>, id: &NodeId) -> Bound<'py, PyAny> {
    pyo3::types::PyString::new(py, id.as_str()).into_any()
}

fn none(py: Python<'_>) -> Bound<'_, PyAny> {
    py.None().into_bound(py)
}

pub fn graph_error(py: Python<'_>, error: &GraphError) -> PyErr {
    let message = error.to_string();
    match error {
        GraphError::InvalidId { id } | GraphError::SeparatorInId { id } => {
            soma_error(py, "InvalidIdError", message, &[("node", text(py, id))])
        }
        GraphError::SeparatorInKey { step, .. } => {
            soma_error(py, "InvalidIdError", message, &[("node", text(py, step))])
        }
        GraphError::DuplicateNode { id } => {
            soma_error(py, "DuplicateNodeError", message, &[("node", text(py, id))])
        }
        GraphError::UnknownNode { id } => {
            soma_error(py, "UnknownNodeError", message, &[("node", text(py, id))])
        }
        GraphError::DuplicateEdge { from, to } => soma_error(
            py,
            "DuplicateEdgeError",
            message,
            &[("source", text(py, from)), ("target", text(py, to))],
        ),
        GraphError::WouldCycle { path } => {
            let path: Vec<&str> = path.iter().map(NodeId::as_str).collect();
            let path =
                pyo3::types::PyList::new(py, path).map_or_else(|_| none(py), Bound::into_any);
            soma_error(py, "CycleError", message, &[("path", path)])
        }
    }
}

/// An id that names no node, asked about by a lookup (`place`, `implementation`, a neighbour
/// query) rather than by an edge: the hint says how nodes are named and which ones there are,
/// where an edge's hint says to add the node first.
pub fn unknown_node_error(py: Python<'_>, id: &str, graph: &soma_core::Graph) -> PyErr {
    /// How many of the graph's ids a hint lists before it counts the rest.
    const LISTED: usize = 8;
    let known = graph.nodes();
    let hint = if known.is_empty() {
        "the graph has no node yet: `g.node(obj)` adds one and returns its id".to_owned()
    } else {
        let listed: Vec<String> = known
            .iter()
            .take(LISTED)
            .map(|n| format!("`{n}`"))
            .collect();
        let rest = match known.len().saturating_sub(LISTED) {
            0 => String::new(),
            more => format!(" and {more} more (`g.nodes()` lists them all)"),
        };
        format!(
            "name a node by the id `node()` returned; the graph has {}{rest}",
            listed.join(", ")
        )
    };
    let node = pyo3::types::PyString::new(py, id).into_any();
    soma_error(
        py,
        "UnknownNodeError",
        format!("no node `{id}` in the graph\nhint: {hint}"),
        &[("node", node)],
    )
}

pub fn device_error(py: Python<'_>, error: &DeviceError) -> PyErr {
    let written = match error {
        DeviceError::Malformed { text }
        | DeviceError::UnknownKind { text, .. }
        | DeviceError::Misspelled { text, .. }
        | DeviceError::NeedsIndex { text, .. } => text,
    };
    let written = pyo3::types::PyString::new(py, written).into_any();
    soma_error(py, "DeviceError", error.to_string(), &[("device", written)])
}

/// A host name that cannot be: a `soma.HostError` with `.host`, what was written.
pub fn host_error(py: Python<'_>, error: &HostError) -> PyErr {
    let written = match error {
        HostError::Invalid { text } => text,
    };
    let written = pyo3::types::PyString::new(py, written).into_any();
    soma_error(py, "HostError", error.to_string(), &[("host", written)])
}

/// A setting refused on a step's id, or inside one: a `soma.GraphError` naming the id for a
/// setting it has nothing to apply to, a `soma.HostError` (`.host` None) for a host.
pub fn setting_error(py: Python<'_>, error: &SettingError) -> PyErr {
    let message = error.to_string();
    match error {
        SettingError::NothingToCall { step, .. } => soma_error(
            py,
            "GraphError",
            message,
            &[("node", pyo3::types::PyString::new(py, step).into_any())],
        ),
        SettingError::NotAStage { node, .. } => soma_error(
            py,
            "GraphError",
            message,
            &[("node", pyo3::types::PyString::new(py, node).into_any())],
        ),
        SettingError::RunsHere { node, .. } => soma_error(
            py,
            "HostError",
            message,
            &[
                ("node", pyo3::types::PyString::new(py, node).into_any()),
                ("host", none(py)),
            ],
        ),
    }
}

pub fn compile_error(py: Python<'_>, error: &CompileError) -> PyErr {
    match error {
        CompileError::MissingImplementation { node } => soma_error(
            py,
            "CompileError",
            error.to_string(),
            &[("node", text(py, node))],
        ),
    }
}

/// The Python error a cause carries, if it carries one.
pub(crate) fn python_cause(
    py: Python<'_>,
    cause: Option<&(dyn std::error::Error + Send + Sync + 'static)>,
) -> Option<PyErr> {
    cause
        .and_then(|cause| cause.downcast_ref::<PyErr>())
        .map(|error| error.clone_ref(py))
}

/// Adds a PEP 678 note, `remark`; the exception object stays the same.
fn noted(py: Python<'_>, error: PyErr, remark: String) -> PyErr {
    let value = error.value(py);
    // A forward nested in a forward of the same graph passes the exception up through the same
    // node at every level: one note says it, a thousand repeat it.
    let last = value
        .getattr("__notes__")
        .and_then(|notes| notes.get_item(-1))
        .and_then(|note| note.extract::<String>());
    if last.is_ok_and(|last| last == remark) {
        return error;
    }
    // A note is a courtesy: an exception that refuses one is still raised as it is.
    let _ = value.call_method1("add_note", (remark,));
    error
}

/// A plan that does not fit its catalog: a `soma.RunError` naming the node, as from a run.
pub fn program_error(py: Python<'_>, error: &ProgramError) -> PyErr {
    let node = text(py, error.node());
    soma_error(py, "RunError", error.to_string(), &[("node", node)])
}

/// `interrupt` is what a signal handler raised during the run, for `RunError::Interrupted`.
pub fn run_error(py: Python<'_>, error: &RunError, interrupt: Option<PyErr>) -> PyErr {
    let message = error.to_string();
    match error {
        RunError::NodeFailed { node, error } => match python_cause(py, error.cause()) {
            Some(raised) => noted(py, raised, format!("raised in soma node `{node}`")),
            None => soma_error(py, "RunError", message, &[("node", text(py, node))]),
        },
        RunError::DriverFailed { node, error } => match python_cause(py, error.cause()) {
            // A `BaseException` that is not an `Exception` asks the program to stop (Ctrl-C,
            // `sys.exit()`): wrapped in a `DriverError`, an `Exception`, it would be caught by
            // the handlers meant for ordinary failures, so it goes on as itself.
            Some(raised) if !raised.is_instance_of::<PyException>(py) => noted(
                py,
                raised,
                format!("raised in the driver serving soma node `{node}`"),
            ),
            raised => {
                let failure = soma_error(py, "DriverError", message, &[("node", text(py, node))]);
                if raised.is_some() {
                    failure.set_cause(py, raised);
                }
                failure
            }
        },
        RunError::NoDriver { node } | RunError::WrongResultCount { node, .. } => {
            soma_error(py, "DriverError", message, &[("node", text(py, node))])
        }
        RunError::NotAList { node, .. }
        | RunError::UnknownCase { node, .. }
        | RunError::LoopLimit { node, .. }
        | RunError::NeedsLoop { node } => {
            soma_error(py, "RunError", message, &[("node", text(py, node))])
        }
        // A limit of 0 names no node (`RunError::node`): none was called, none awaited.
        RunError::TurnLimit { limit, .. } => {
            let node = error.node().map_or_else(|| none(py), |node| text(py, node));
            let limit = limit
                .into_pyobject(py)
                .map_or_else(|_| none(py), Bound::into_any);
            soma_error(
                py,
                "TurnLimitError",
                message,
                &[("node", node), ("limit", limit)],
            )
        }
        RunError::TimeLimit { node, limit } => {
            let limit = limit
                .as_secs_f64()
                .into_pyobject(py)
                .map_or_else(|_| none(py), Bound::into_any);
            soma_error(
                py,
                "TimeLimitError",
                message,
                &[("node", text(py, node)), ("limit", limit)],
            )
        }
        // The last attempt's error, as it would have been raised alone, noting the attempts.
        RunError::Retried { attempts, last } => {
            let raised = run_error(py, last, interrupt);
            let node = last
                .node()
                .map_or_else(String::new, |node| format!(" `{node}`"));
            noted(
                py,
                raised,
                format!("soma node{node} failed on each of its {attempts} attempts"),
            )
        }
        RunError::Invalid(error) => program_error(py, error),
        RunError::NoThread { .. } | RunError::NoTask { .. } => {
            soma_error(py, "ThreadError", message, &[])
        }
        RunError::Interrupted => interrupt.unwrap_or_else(|| PyKeyboardInterrupt::new_err(message)),
        RunError::PastDeadline => PyTimeoutError::new_err(message),
        // Ctrl-C, with branches left running: the user's interrupt, noting what was left.
        RunError::Abandoned { .. } | RunError::Cancelled { .. } => match interrupt {
            Some(raised) => noted(py, raised, message),
            None => PyKeyboardInterrupt::new_err(message),
        },
    }
}

/// A `soma.CancelledError`: a run stopped by its stop flag (`forward(stop=…)`).
pub fn cancelled_error(py: Python<'_>, message: String) -> PyErr {
    soma_error(py, "CancelledError", message, &[])
}

/// A panic that escaped a Rust node, carried on with the id of that node so that the Python
/// error can name it ([`crate::native`] catches the panic and re-raises it as this payload).
pub struct NodePanic {
    pub node: NodeId,
    pub message: String,
}

/// The message a panic was raised with.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// A Rust panic that escaped a node, as `soma.PanicError`; the process goes on.
pub fn panic_error(py: Python<'_>, payload: &(dyn std::any::Any + Send)) -> PyErr {
    const HINT: &str = "hint: a panic is a bug in the node's Rust code; the run was stopped once every branch had been joined, and the graph can run again";
    match payload.downcast_ref::<NodePanic>() {
        Some(NodePanic { node, message }) => soma_error(
            py,
            "PanicError",
            format!("node `{node}` panicked: {message}\n{HINT}"),
            &[("node", text(py, node))],
        ),
        None => soma_error(
            py,
            "PanicError",
            format!("a Rust node panicked: {}\n{HINT}", panic_message(payload)),
            &[],
        ),
    }
}
