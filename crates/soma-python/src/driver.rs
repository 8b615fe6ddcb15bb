//! Python objects as drivers: anything with `perform(requests) -> list`.
//!
//! One driver serves every branch at once; the interpreter is attached only while `perform`
//! runs, so a driver that waits with the GIL released (sockets, `time.sleep`, a queue) serves
//! several branches' requests at the same time.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyList;
use soma_core::{Driver, DriverError, Value};

use crate::convert::{to_python, wrap};

pub struct PythonDriver {
    perform: Py<PyAny>,
}

impl PythonDriver {
    /// # Errors
    /// `TypeError` when the object has no callable `perform`.
    pub fn new(object: &Bound<'_, PyAny>) -> PyResult<Self> {
        let perform = object
            .getattr("perform")
            .ok()
            .filter(PyAnyMethods::is_callable);
        let Some(perform) = perform else {
            return Err(PyTypeError::new_err(format!(
                "a driver needs a callable `perform(requests)`, and `{}` has none\nhint: pass an object whose `perform` takes a list of requests and returns a list of results",
                object.get_type().name()?
            )));
        };
        Ok(PythonDriver {
            perform: perform.unbind(),
        })
    }

    fn call(&self, py: Python<'_>, requests: &[Value]) -> PyResult<Vec<Value>> {
        let requests = requests
            .iter()
            .map(|r| to_python(py, r))
            .collect::<PyResult<Vec<_>>>()?;
        let answered = self.perform.bind(py).call1((PyList::new(py, requests)?,))?;
        // No hint line of its own: it reaches the user as the cause of a `DriverError`, whose
        // message quotes it and gives the hint.
        let Ok(results) = answered.try_iter() else {
            return Err(PyTypeError::new_err(format!(
                "a driver's `perform` must return a list of results, one per request, not a `{}`",
                answered.get_type().name()?
            )));
        };
        results.map(|item| item.map(wrap)).collect()
    }
}

impl Driver for PythonDriver {
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError> {
        Python::attach(|py| self.call(py, requests)).map_err(DriverError::from_cause)
    }
}
