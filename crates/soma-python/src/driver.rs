//! Python objects as drivers: anything with `perform(requests) -> list`.
//!
//! One driver serves every branch at once; the interpreter is attached only while `perform`
//! runs, so a driver that waits with the GIL released (sockets, `time.sleep`, a queue) serves
//! several branches' requests at the same time.

use pyo3::exceptions::{PyKeyboardInterrupt, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use soma_core::{Driver, DriverError, Value};

use crate::convert::{to_python, wrap};
use crate::watch::note_interrupt;

pub struct PythonDriver {
    perform: Py<PyAny>,
    /// The driver's type name, for messages.
    name: String,
}

impl PythonDriver {
    /// # Errors
    /// `TypeError` when the object has no callable `perform`.
    pub fn new(object: &Bound<'_, PyAny>) -> PyResult<Self> {
        let perform = object
            .getattr("perform")
            .ok()
            .filter(PyAnyMethods::is_callable);
        let name = type_name(object);
        let Some(perform) = perform else {
            return Err(PyTypeError::new_err(format!(
                "a driver needs a callable `perform(requests)`, and `{name}` has none\nhint: pass an object whose `perform` takes a list of requests and returns a list of results"
            )));
        };
        Ok(PythonDriver {
            perform: perform.unbind(),
            name,
        })
    }

    fn call(&self, py: Python<'_>, requests: &[Value]) -> PyResult<Vec<Value>> {
        let requests = requests
            .iter()
            .map(|r| to_python(py, r))
            .collect::<PyResult<Vec<_>>>()?;
        let requests = PyList::new(py, requests)?;
        let answered = crate::exit::call(self.perform.bind(py), &[requests.as_ptr()])?;
        // Only a list or a tuple, read item by item and never through its `__iter__`: any other
        // iterable would be taken apart wrongly (a `str` into characters, a `dict` into keys),
        // and an endless generator would be read until memory ran out, inside `forward`.
        if let Ok(list) = answered.cast::<PyList>() {
            return Ok(list.iter().map(wrap).collect());
        }
        if let Ok(tuple) = answered.cast::<PyTuple>() {
            return Ok(tuple.iter().map(wrap).collect());
        }
        // It reaches the user as the cause of a `DriverError`, which names the node and quotes
        // this message, hint included.
        Err(PyTypeError::new_err(format!(
            "`{}.perform` returned a `{}`, not a list of results\nhint: return a `list` or a `tuple` holding one result per request, in order; other iterables are refused unread",
            self.name,
            type_name(&answered)
        )))
    }
}

/// The name of an object's type, for a message.
fn type_name(object: &Bound<'_, PyAny>) -> String {
    object
        .get_type()
        .name()
        .map_or_else(|_| "?".to_string(), |name| name.to_string())
}

impl Driver for PythonDriver {
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError> {
        crate::exit::attach(|py| {
            self.call(py, requests).inspect_err(|raised| {
                if raised.is_instance_of::<PyKeyboardInterrupt>(py) {
                    note_interrupt();
                }
            })
        })
        .map_err(DriverError::from_cause)
    }
}
