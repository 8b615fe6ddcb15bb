//! Hosts, as Python sees them: a host name read the one way the core reads it, and the refusal
//! of one written on a step. Which node runs on which host is kept with the graph's other
//! settings (`GraphCore.place_at`), which cuts its plan by them (`GraphCore.distributed_plan`).
//! What a host *is* (a Ray node) is Python's business (`soma.remote`); the glue only carries
//! names and plans.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use soma_core::{HostName, SettingError};

/// `soma._soma.parse_host`: `text` if it is a host name; a `soma.HostError` where it is not.
#[pyfunction]
pub fn parse_host(py: Python<'_>, text: &str) -> PyResult<String> {
    read(py, text).map(|host| host.to_string())
}

/// `text` as a host name; a `soma.HostError` where it is not one.
pub(crate) fn read(py: Python<'_>, text: &str) -> PyResult<HostName> {
    text.parse::<HostName>()
        .map_err(|error| crate::errors::host_error(py, &error))
}

/// `soma._soma.host_refused`: the `soma.HostError` (not raised) for `.at()` written on the
/// `kind` step (`each`, `switch`, `loop`) `node` when `own`, else on node `node` inside one, as
/// [`soma_core::Decisions::refusal`] refuses a host written on a built graph's step.
#[pyfunction]
pub fn host_refused(py: Python<'_>, kind: &str, node: &str, own: bool) -> PyResult<Py<PyAny>> {
    let kind = match kind {
        "each" => "each",
        "switch" => "switch",
        "loop" => "loop",
        other => return Err(PyValueError::new_err(format!("no step is a `{other}`"))),
    };
    let refused = SettingError::RunsHere {
        node: node.to_owned(),
        kind,
        own,
    };
    Ok(crate::errors::setting_error(py, &refused)
        .into_value(py)
        .into_any())
}
