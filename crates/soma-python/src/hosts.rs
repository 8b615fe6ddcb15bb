//! Hosts, as Python sees them: a host name read the one way the core reads it, and a plan cut
//! into remote slices by the core's distribution step. What a host *is* (a Ray node) is
//! Python's business (`soma.remote`); the glue only carries names and plans.

use std::sync::Arc;

use pyo3::prelude::*;
use soma_core::{HostName, HostPlacement};

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
