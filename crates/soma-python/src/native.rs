//! Nodes implemented in Rust, offered to Python as `soma.native`.
//!
//! They exist so that a graph can mix Python and Rust steps, and so that the boundary itself
//! can be exercised: a Rust node reads native values, so a Python object reaching one is
//! converted — or refused with a `TypeError` naming its type — right there, and nowhere else.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use soma_core::{Ctx, Node, NodeError, Transition, Value};

use crate::convert::{holds_python, to_native, to_python, wrap};
use crate::errors::{panic_message, NodePanic};

/// A Rust implementation, ready to be registered in a graph.
#[pyclass(frozen, module = "soma._soma", name = "NativeNode")]
pub struct NativeNode {
    name: String,
    inner: Arc<dyn Node>,
}

impl NativeNode {
    /// The implementation, wrapped so that Python inputs are converted before it reads them.
    pub fn implementation(&self) -> Arc<dyn Node> {
        Arc::new(ReadsNatively(Arc::clone(&self.inner)))
    }

    fn new(name: String, inner: impl Node + 'static) -> Self {
        NativeNode {
            name,
            inner: Arc::new(inner),
        }
    }
}

#[pymethods]
impl NativeNode {
    /// Adds `k` to an int or a float.
    #[staticmethod]
    fn add(k: i64) -> Self {
        NativeNode::new(format!("Add({k})"), Add(k))
    }

    /// Returns its input.
    #[staticmethod]
    fn identity() -> Self {
        NativeNode::new("Identity()".into(), Identity)
    }

    /// Sums the numbers of a dict (a fan-in), a list, or a single number.
    #[staticmethod]
    fn sum() -> Self {
        NativeNode::new("Sum()".into(), Sum)
    }

    /// Panics with `message`: a Rust bug on demand, to see that a panic surfaces as an error.
    #[staticmethod]
    fn panic(message: String) -> Self {
        NativeNode::new("Panic()".into(), Panic(message))
    }

    /// Runs the node once on `x`, outside any graph.
    fn forward<'py>(&self, py: Python<'py>, x: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let input = to_native(py, &wrap(x))?;
        let id = soma_core::NodeId::from(self.name.as_str());
        let out = py.detach(|| self.inner.forward(&input, &Ctx::new(&id, 0, &[])));
        match out {
            Ok(Transition::Done(value)) => to_python(py, &value),
            Ok(Transition::Await(_)) => Err(PyRuntimeError::new_err(format!(
                "native node `{}` awaited outside a graph\nhint: run it in a graph, with a driver: `soma.Graph.somatize(node).forward(x, driver=...)`",
                self.name
            ))),
            Err(error) => Err(PyValueError::new_err(error.to_string())),
        }
    }

    fn __repr__(&self) -> String {
        format!("NativeNode({})", self.name)
    }
}

/// Converts any Python object in the input to its native form, then runs the Rust node; a
/// panic in it goes on as a [`NodePanic`] that names the node.
struct ReadsNatively(Arc<dyn Node>);

impl Node for ReadsNatively {
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let run =
            |input: &Value| panic::catch_unwind(AssertUnwindSafe(|| self.0.forward(input, ctx)));
        // Runs detached: a Rust node never holds the GIL, so Python branches go on meanwhile.
        let outcome = Python::attach(|py| {
            let outcome = if holds_python(input) {
                let native = to_native(py, input).map_err(NodeError::from_cause)?;
                py.detach(|| run(&native))
            } else {
                py.detach(|| run(input))
            };
            // A signal that came while the node ran detached is handled here, at its end: no
            // Python code may run before the next boundary to notice it (see `crate::watch`).
            py.check_signals().map_err(NodeError::from_cause)?;
            Ok(outcome)
        })?;
        // Re-raised as a payload that names the node; the executor joins the wave, then the
        // graph's `forward` turns it into a `PanicError` (`crate::errors::panic_error`).
        outcome.unwrap_or_else(|payload| {
            panic::resume_unwind(Box::new(NodePanic {
                node: ctx.node().clone(),
                message: panic_message(&*payload),
            }))
        })
    }
}

fn number(node: &str, value: &Value) -> Result<Value, NodeError> {
    match value {
        Value::Int(_) | Value::Float(_) => Ok(value.clone()),
        Value::Null
        | Value::Bool(_)
        | Value::Text(_)
        | Value::Bytes(_)
        | Value::List(_)
        | Value::Map(_)
        | Value::Opaque(_) => Err(NodeError::new(format!(
            "`{node}` reads an int or a float, not a `{}`\nhint: give it numbers; convert the value in a node before it",
            value.kind()
        ))),
    }
}

fn plus(a: &Value, b: &Value) -> Value {
    #[allow(clippy::cast_precision_loss)] // Python's own int + float semantics.
    match (a.as_int(), b.as_int()) {
        (Some(a), Some(b)) => Value::Int(a.wrapping_add(b)),
        _ => Value::Float(
            a.as_float()
                .unwrap_or_else(|| a.as_int().unwrap_or(0) as f64)
                + b.as_float()
                    .unwrap_or_else(|| b.as_int().unwrap_or(0) as f64),
        ),
    }
}

struct Add(i64);

impl Node for Add {
    fn forward(&self, input: &Value, _ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Ok(Transition::Done(plus(
            &number("Add", input)?,
            &Value::Int(self.0),
        )))
    }
}

struct Identity;

impl Node for Identity {
    fn forward(&self, input: &Value, _ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Ok(Transition::Done(input.clone()))
    }
}

struct Sum;

impl Node for Sum {
    fn forward(&self, input: &Value, _ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let total = match input {
            Value::Map(pairs) => pairs.iter().try_fold(Value::Int(0), |acc, (_, v)| {
                Ok(plus(&acc, &number("Sum", v)?))
            })?,
            Value::List(items) => items
                .iter()
                .try_fold(Value::Int(0), |acc, v| Ok(plus(&acc, &number("Sum", v)?)))?,
            Value::Null
            | Value::Bool(_)
            | Value::Int(_)
            | Value::Float(_)
            | Value::Text(_)
            | Value::Bytes(_)
            | Value::Opaque(_) => number("Sum", input)?,
        };
        Ok(Transition::Done(total))
    }
}

struct Panic(String);

impl Node for Panic {
    fn forward(&self, _input: &Value, _ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        panic!("{}", self.0)
    }
}
