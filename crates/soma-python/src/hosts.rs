//! Hosts, as Python sees them: a host name read the one way the core reads it, and a plan cut
//! into remote slices by the core's distribution step. What a host *is* (a Ray node) is
//! Python's business (`soma.remote`); the glue only carries names and plans.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use soma_core::{HostName, HostPlacement, SettingError};

use crate::plan::PyPlan;

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

/// `soma._soma.distribute`: `plan` with every largest subtree on one host wrapped as one
/// `Remote` slice, as `soma_core::distribute` cuts it; `hosts` pairs node ids with host names.
#[pyfunction]
pub fn distribute(py: Python<'_>, plan: &PyPlan, hosts: Vec<(String, String)>) -> PyResult<PyPlan> {
    let mut placement = HostPlacement::new();
    for (node, host) in hosts {
        placement.place(node, read(py, &host)?);
    }
    let distributed = soma_core::distribute(plan.subtree(), &placement);
    Ok(PyPlan::new(Arc::new(distributed), plan.devices()))
}
