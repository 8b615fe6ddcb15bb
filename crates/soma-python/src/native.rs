//! Nodes implemented in Rust, offered to Python as `soma.native`.
//!
//! They exist so that a graph can mix Python and Rust steps, and so that the boundary itself
//! can be exercised: a Rust node reads native values, so a Python object reaching one is
//! converted — or refused with a `TypeError` naming its type — right there, and nowhere else.
//!
//! Their integers are Rust's `i64`, and their arithmetic is checked: a sum outside the 64-bit
//! range raises `OverflowError` naming the node, where unchecked arithmetic would wrap around
//! to a number of the opposite sign and hand it on as if it were right.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use soma_core::{Ctx, Node, NodeError, NodeId, Transition, Value};

use crate::convert::{holds_python, to_native, to_python, wrap};
use crate::errors::{panic_message, NodePanic};

/// A Rust implementation, ready to be registered in a graph.
#[pyclass(frozen, module = "soma._soma", name = "NativeNode")]
pub struct NativeNode {
    recipe: Recipe,
    inner: Arc<dyn Node>,
}

/// Which node, and with what: what `repr` shows and what a pickle carries, since the node
/// itself is Rust code that a pickle cannot hold.
#[derive(Clone)]
enum Recipe {
    Add(i64),
    Identity,
    Sum,
    Panic(String),
}

impl NativeNode {
    /// The implementation, wrapped so that Python inputs are converted before it reads them.
    pub fn implementation(&self) -> Arc<dyn Node> {
        Arc::new(ReadsNatively(Arc::clone(&self.inner)))
    }

    fn new(recipe: Recipe) -> Self {
        let inner: Arc<dyn Node> = match &recipe {
            Recipe::Add(k) => Arc::new(Add(*k)),
            Recipe::Identity => Arc::new(Identity),
            Recipe::Sum => Arc::new(Sum),
            Recipe::Panic(message) => Arc::new(Panic(message.clone())),
        };
        NativeNode { recipe, inner }
    }

    /// The name a message gives the node: its constructor as Python spells it.
    fn name(&self) -> String {
        match &self.recipe {
            Recipe::Add(k) => format!("Add({k})"),
            Recipe::Identity => "Identity()".into(),
            Recipe::Sum => "Sum()".into(),
            Recipe::Panic(_) => "Panic()".into(),
        }
    }
}

#[pymethods]
impl NativeNode {
    /// Adds `k` to an int or a float.
    #[staticmethod]
    fn add(k: i64) -> Self {
        NativeNode::new(Recipe::Add(k))
    }

    /// Returns its input.
    #[staticmethod]
    fn identity() -> Self {
        NativeNode::new(Recipe::Identity)
    }

    /// Sums the numbers of a dict (a fan-in), a list, or a single number.
    #[staticmethod]
    fn sum() -> Self {
        NativeNode::new(Recipe::Sum)
    }

    /// Panics with `message`: a Rust bug on demand, to see that a panic surfaces as an error.
    #[staticmethod]
    fn panic(message: String) -> Self {
        NativeNode::new(Recipe::Panic(message))
    }

    /// How a pickle makes the node again: the constructor that made it, with its arguments.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let class = slf.get_type();
        let (constructor, arguments) = match &slf.get().recipe {
            Recipe::Add(k) => ("add", PyTuple::new(py, [*k])?),
            Recipe::Identity => ("identity", PyTuple::empty(py)),
            Recipe::Sum => ("sum", PyTuple::empty(py)),
            Recipe::Panic(message) => ("panic", PyTuple::new(py, [message.as_str()])?),
        };
        Ok((class.getattr(constructor)?, arguments))
    }

    /// Runs the node once on `x`, outside any graph.
    fn forward<'py>(&self, py: Python<'py>, x: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let input = to_native(py, &wrap(x))?;
        let name = self.name();
        let id = NodeId::from(name.as_str());
        let out = crate::exit::detach(py, || self.inner.forward(&input, &Ctx::new(&id, 0, &[])));
        match out {
            Ok(Transition::Done(value)) => to_python(py, &value),
            Ok(Transition::Await(_)) => Err(PyRuntimeError::new_err(format!(
                "native node `{name}` awaited outside a graph\nhint: run it in a graph, with a driver: `soma.Graph.somatize(node).forward(x, driver=...)`",
            ))),
            // An exception the node chose (an `OverflowError`) comes out as itself.
            Err(error) => Err(error
                .cause()
                .and_then(|cause| cause.downcast_ref::<PyErr>())
                .map_or_else(
                    || PyValueError::new_err(error.to_string()),
                    |raised| raised.clone_ref(py),
                )),
        }
    }

    /// Itself: a native node is immutable, so a copy could never differ from it (and a graph
    /// copied with `copy.deepcopy` may share it).
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Itself, as [`NativeNode::__copy__`].
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    fn __repr__(&self) -> String {
        format!("NativeNode({})", self.name())
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
        let outcome = crate::exit::attach(|py| {
            let outcome = if holds_python(input) {
                let native = to_native(py, input).map_err(NodeError::from_cause)?;
                crate::exit::detach(py, || run(&native))
            } else {
                crate::exit::detach(py, || run(input))
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

/// The `OverflowError` for an int result outside 64 bits (`what`, say `1 + 2`) in `node`. It
/// travels as the cause, so the graph's `forward` raises this very exception, with the note
/// naming the node that every node's error gets.
fn overflow(node: &NodeId, what: &str) -> NodeError {
    NodeError::from_cause(PyOverflowError::new_err(format!(
        "`{node}` overflowed: {what} is outside the 64-bit range of a Rust node's ints\nhint: keep integers this large in Python nodes, or give the Rust node floats"
    )))
}

struct Add(i64);

impl Node for Add {
    #[allow(clippy::cast_precision_loss)] // Python's own int + float semantics.
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let k = self.0;
        let sum = match number("Add", input)? {
            Value::Int(x) => x
                .checked_add(k)
                .map(Value::Int)
                .ok_or_else(|| overflow(ctx.node(), &format!("{x} + {k}")))?,
            Value::Float(x) => Value::Float(x + k as f64),
            other => other,
        };
        Ok(Transition::Done(sum))
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
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let total = match input {
            Value::Map(pairs) => total(ctx.node(), pairs.iter().map(|(_, v)| v))?,
            Value::List(items) => total(ctx.node(), items.iter())?,
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

/// The sum of `values`, in order, as Python's `sum` computes it: ints exactly until the first
/// float, floats from there on. The ints add up in 128 bits, which no sequence of 64-bit ints
/// short of 2^64 of them can overflow, so only a total that does not fit in 64 bits is refused —
/// not one whose running sum merely strayed outside on the way.
#[allow(clippy::cast_precision_loss)] // Python's own int + float semantics.
fn total<'a>(node: &NodeId, values: impl Iterator<Item = &'a Value>) -> Result<Value, NodeError> {
    let mut ints: i128 = 0;
    let mut float: Option<f64> = None;
    for value in values {
        match (number("Sum", value)?, &mut float) {
            (Value::Int(x), Some(sum)) => *sum += x as f64,
            (Value::Int(x), None) => ints += i128::from(x),
            (Value::Float(x), sum) => *sum = Some(sum.unwrap_or(ints as f64) + x),
            _ => {} // `number` lets nothing else through.
        }
    }
    match float {
        Some(sum) => Ok(Value::Float(sum)),
        None => i64::try_from(ints)
            .map(Value::Int)
            .map_err(|_| overflow(node, &format!("the sum {ints}"))),
    }
}

struct Panic(String);

impl Node for Panic {
    fn forward(&self, _input: &Value, _ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        panic!("{}", self.0)
    }
}
