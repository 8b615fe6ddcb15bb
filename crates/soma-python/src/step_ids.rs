//! The ids of the nodes inside decision steps (`chunks/clean`), as Python makes and reads them:
//! by the core's path ([`NodeId::inside`], [`NodeId::step_and_rest`]), so that Python writes
//! no separator of its own and `/` means one thing wherever an id is made.

use pyo3::prelude::*;
use soma_core::{Decision, NodeId};

use crate::errors::graph_error;

/// The id of node `id` of the sub-graph a step `step` runs, as the graph around the step holds
/// it: `step/id`, or `step/key/id` for the case `key` of a switch; a key holding the separator
/// is the core's `soma.InvalidIdError`.
#[pyfunction]
#[pyo3(signature = (step, id, key=None))]
pub fn node_inside(py: Python<'_>, step: &str, id: &str, key: Option<&str>) -> PyResult<String> {
    let prefix = match key {
        Some(key) => Decision::case_prefix(step, key).map_err(|e| graph_error(py, &e))?,
        None => NodeId::from(step),
    };
    Ok(NodeId::inside(prefix.as_str(), id).to_string())
}

/// The outermost step `id` is inside of and its id inside that step (`("route", "ocr/parse")`
/// for `route/ocr/parse`); `None` for a node of the graph itself.
#[pyfunction]
pub fn step_and_rest(id: &str) -> Option<(&str, &str)> {
    NodeId::step_and_rest(id)
}
