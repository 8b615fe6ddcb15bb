//! How `each`, `switch` and `loop` steps read Python values: a sized iterable's items, a
//! selector's key, a predicate's truth, each read as Python reads it.
//!
//! The engine cannot look inside a Python object; the executor of every forward and stream
//! is given this reading ([`soma_core::Executor::with_reading`]). Every call is made on a
//! thread that runs a step, which holds the interpreter already: attaching costs a check.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString};
use soma_core::{NodeError, NotItems, Reading, Value};

use crate::convert::{to_python, wrap};

/// The reading of Python values; see the module docs.
pub struct PythonReading;

/// The name of `object`'s type, as an error message names it.
fn type_of(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .qualname()
        .map_or_else(|_| "object".to_owned(), |name| name.to_string())
}

impl Reading for PythonReading {
    fn items(&self, value: &Value) -> Result<Vec<Value>, NotItems> {
        // What reading the items raised is the step's failure, the exception as itself.
        let failed = |raised: PyErr| NotItems::Failed(NodeError::from_cause(raised));
        crate::exit::attach(|py| {
            let object = to_python(py, value).map_err(failed)?;
            // Text and bytes are sequences of characters and bytes, which is never what a
            // list of items to map over is meant to be; a mapping iterates over its keys only.
            let refused = object.is_instance_of::<PyString>()
                || object.is_instance_of::<PyBytes>()
                || object.is_instance_of::<PyByteArray>()
                || object.hasattr("keys").unwrap_or(false)
                || !object.hasattr("__len__").unwrap_or(false);
            if refused {
                return Err(NotItems::NotAList(type_of(&object)));
            }
            // Not iterable is no list; an iterable that raises something else is a failure.
            let iterator = object.try_iter().map_err(|raised| {
                if raised.is_instance_of::<PyTypeError>(py) {
                    NotItems::NotAList(type_of(&object))
                } else {
                    failed(raised)
                }
            })?;
            let mut items = Vec::with_capacity(object.len().map_err(failed)?);
            // Read as a stream's inputs are: a sequence of the user's may compute its items.
            while let Some(item) = crate::exit::next(&iterator) {
                items.push(wrap(item.map_err(failed)?));
            }
            Ok(items)
        })
    }

    fn collect(&self, results: Vec<Value>) -> Value {
        crate::exit::attach(|py| {
            let objects: Vec<Bound<'_, PyAny>> = results
                .iter()
                .map(|value| to_python(py, value).unwrap_or_else(|_| py.None().into_bound(py)))
                .collect();
            match PyList::new(py, objects) {
                Ok(list) => wrap(list.into_any()),
                Err(_) => Value::List(results.into()),
            }
        })
    }

    fn key(&self, value: &Value) -> Result<String, String> {
        crate::exit::attach(|py| {
            let object = to_python(py, value).map_err(|e| e.to_string())?;
            object.extract::<String>().map_err(|_| type_of(&object))
        })
    }

    fn done(&self, value: &Value) -> bool {
        crate::exit::attach(|py| {
            to_python(py, value)
                .and_then(|object| object.is_truthy())
                .unwrap_or(false)
        })
    }

    fn type_name(&self, value: &Value) -> String {
        crate::exit::attach(|py| {
            to_python(py, value).map_or_else(|_| "object".to_owned(), |object| type_of(&object))
        })
    }
}
