//! Values across the boundary: Python objects travel untouched, natives convert on demand.
//!
//! A Python object enters the engine wrapped, not converted ([`PyValue`] inside
//! `Value::Opaque`), so the next Python node receives the very same object — an int stays an
//! int, a tensor the same tensor, with no copy. Conversion to native values happens only where
//! a Rust node reads its input ([`to_native`]), and back where Python reads a native value
//! ([`to_python`]).

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use soma_core::Value;

/// A Python object carried through the engine as it is.
pub struct PyValue(pub Py<PyAny>);

/// Wraps a Python object for the engine, without converting it.
pub fn wrap(object: Bound<'_, PyAny>) -> Value {
    Value::Opaque(Arc::new(PyValue(object.unbind())))
}

/// What Python sees of a value: a wrapped object is itself; natives become Python natives;
/// a map becomes a `dict` in the same order.
pub fn to_python<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(x) => PyFloat::new(py, *x).into_any(),
        Value::Text(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::List(items) => {
            let items = items
                .iter()
                .map(|item| to_python(py, item))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Map(pairs) => {
            let dict = PyDict::new(py);
            for (key, item) in pairs.iter() {
                dict.set_item(&**key, to_python(py, item)?)?;
            }
            dict.into_any()
        }
        Value::Opaque(inner) => match inner.downcast_ref::<PyValue>() {
            Some(PyValue(object)) => object.bind(py).clone(),
            None => {
                return Err(PyTypeError::new_err(
                    "a Rust node produced an opaque value that Python cannot read\nhint: have the Rust node return a native value",
                ))
            }
        },
    })
}

/// Whether reading `value` natively needs the interpreter.
pub fn holds_python(value: &Value) -> bool {
    match value {
        Value::Null
        | Value::Bool(_)
        | Value::Int(_)
        | Value::Float(_)
        | Value::Text(_)
        | Value::Bytes(_) => false,
        Value::List(items) => items.iter().any(holds_python),
        Value::Map(pairs) => pairs.iter().any(|(_, item)| holds_python(item)),
        Value::Opaque(inner) => inner.is::<PyValue>(),
    }
}

/// The native value of `value`, converting any Python object inside it.
///
/// # Errors
/// `TypeError` naming the Python type that has no native form, and what to do instead.
pub fn to_native(py: Python<'_>, value: &Value) -> PyResult<Value> {
    Ok(match value {
        Value::List(items) => Value::List(
            items
                .iter()
                .map(|item| to_native(py, item))
                .collect::<PyResult<Vec<_>>>()?
                .into(),
        ),
        Value::Map(pairs) => Value::Map(
            pairs
                .iter()
                .map(|(key, item)| Ok((Arc::clone(key), to_native(py, item)?)))
                .collect::<PyResult<Vec<_>>>()?
                .into(),
        ),
        Value::Opaque(inner) => match inner.downcast_ref::<PyValue>() {
            Some(PyValue(object)) => from_python(object.bind(py))?,
            None => value.clone(),
        },
        Value::Null
        | Value::Bool(_)
        | Value::Int(_)
        | Value::Float(_)
        | Value::Text(_)
        | Value::Bytes(_) => value.clone(),
    })
}

/// The native form of a Python object.
fn from_python(object: &Bound<'_, PyAny>) -> PyResult<Value> {
    if object.is_none() {
        return Ok(Value::Null);
    }
    // `bool` before `int`: in Python a bool is an int, and it must stay a bool.
    if let Ok(b) = object.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if object.is_instance_of::<PyInt>() {
        return object.extract::<i64>().map(Value::Int).map_err(|_| {
            PyTypeError::new_err(
                "a Rust node cannot read an `int` outside the 64-bit range\nhint: keep big integers in Python nodes",
            )
        });
    }
    if let Ok(x) = object.cast::<PyFloat>() {
        return Ok(Value::Float(x.value()));
    }
    if let Ok(s) = object.cast::<PyString>() {
        return Ok(Value::Text(s.to_str()?.into()));
    }
    if let Ok(b) = object.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().into()));
    }
    if object.is_instance_of::<PyList>() || object.is_instance_of::<PyTuple>() {
        let items = object
            .try_iter()?
            .map(|item| from_python(&item?))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(Value::List(items.into()));
    }
    if let Ok(dict) = object.cast::<PyDict>() {
        let mut pairs = Vec::with_capacity(dict.len());
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast::<PyString>() else {
                return Err(PyTypeError::new_err(format!(
                    "a Rust node cannot read a `dict` with `{}` keys\nhint: use str keys",
                    key.get_type().name()?
                )));
            };
            pairs.push((Arc::<str>::from(key.to_str()?), from_python(&item)?));
        }
        return Ok(Value::Map(pairs.into()));
    }
    Err(PyTypeError::new_err(format!(
        "a Rust node cannot read a value of type `{}`\nhint: Rust nodes read None, bool, int, float, str, bytes, lists and tuples of those, and dicts with str keys; convert it in a Python node first",
        object.get_type().name()?
    )))
}
