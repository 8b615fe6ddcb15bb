//! A node's policies as Python sets them: `.retry(times, backoff, on)` and `.time_limit(s)`
//! become the core's [`Retry`] and time limit, and are kept as they were written so that a
//! copy or a pickle of the graph carries them.
//!
//! Which failures a retry retries is decided here, by the Python exception's type: a node's
//! own exception is retried when it is an instance of one of `on`; a time limit when
//! `soma.TimeLimitError` (a `TimeoutError`) is a subclass of one of them; a Rust node's
//! failure, which reaches Python as a `soma.RunError`, when that is. A driver's failure, an
//! interrupt or a deadline is never retried.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};
use soma_core::{NodeId, Policies, Retry, RunError};

use crate::watch::forget_interrupt;

/// A retry as `.retry()` wrote it: `times`, `backoff` in seconds, the exception types.
pub type WrittenRetry = (u32, f64, Py<PyTuple>);

/// What Python asked of each node, as written, beside the core's policies.
#[derive(Default)]
pub struct Written {
    /// `times`, `backoff` in seconds and the exception types, by node.
    pub retries: HashMap<String, WrittenRetry>,
    /// Seconds, by node.
    pub time_limits: HashMap<String, f64>,
    /// The core's policies, made from the two above.
    pub policies: Policies,
}

impl Written {
    /// Takes in `inner`'s policies, every id under `prefix` ([`NodeId::inside`]): a decision
    /// step's sub-graph's, as the graph around it holds them. The core's retries are shared,
    /// not made again from what Python wrote: they were made from it.
    pub fn embed(&mut self, py: Python<'_>, prefix: &str, inner: &Written) {
        for (id, (times, backoff, on)) in &inner.retries {
            let named = NodeId::inside(prefix, id);
            let retry = inner
                .policies
                .get(id)
                .and_then(|policy| policy.retry.clone());
            self.policies.set_retry(named.as_str(), retry);
            self.retries
                .insert(named.to_string(), (*times, *backoff, on.clone_ref(py)));
        }
        for (id, seconds) in &inner.time_limits {
            let named = NodeId::inside(prefix, id);
            let limit = inner.policies.get(id).and_then(|policy| policy.time_limit);
            self.policies.set_time_limit(named.as_str(), limit);
            self.time_limits.insert(named.to_string(), *seconds);
        }
    }
}

/// Whether `class` is a subclass of one of `on`.
fn caught_by(py: Python<'_>, class: &Bound<'_, PyType>, on: &Py<PyTuple>) -> PyResult<bool> {
    for caught in on.bind(py).iter() {
        if class.is_subclass(&caught)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The core's retry for `times` more attempts, pausing `backoff` seconds first, on `on`.
pub fn retry(py: Python<'_>, times: u32, backoff: f64, on: &Py<PyTuple>) -> PyResult<Retry> {
    let errors = crate::py_modules::errors(py)?;
    let time_limit = errors.getattr("TimeLimitError")?.cast_into::<PyType>()?;
    let run_error = errors.getattr("RunError")?.cast_into::<PyType>()?;
    let retries_time_limits = caught_by(py, &time_limit, on)?;
    let retries_rust_failures = caught_by(py, &run_error, on)?;
    let on = on.clone_ref(py);
    // A first pause past the longest pause is the longest pause: pauses never exceed it.
    let backoff = crate::seconds::as_duration(backoff)
        .map(|backoff| backoff.min(soma_core::MAX_BACKOFF))
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "retry's backoff is a number of seconds, at least 0, not {backoff}"
            ))
        })?;
    Ok(
        Retry::new(times, backoff).only(Arc::new(move |error| match error {
            RunError::NodeFailed { error, .. } => {
                match error.cause().and_then(|c| c.downcast_ref::<PyErr>()) {
                    Some(raised) => crate::exit::attach(|py| {
                        let retried = raised
                            .value(py)
                            .is_instance(on.bind(py).as_any())
                            .unwrap_or(false);
                        // Listed, a node's `KeyboardInterrupt` is a failure to retry, not the
                        // Ctrl-C that stops the run.
                        if retried && raised.is_instance_of::<PyKeyboardInterrupt>(py) {
                            forget_interrupt();
                        }
                        retried
                    }),
                    None => retries_rust_failures,
                }
            }
            RunError::TimeLimit { .. } => retries_time_limits,
            RunError::NoDriver { .. }
            | RunError::DriverFailed { .. }
            | RunError::WrongResultCount { .. }
            | RunError::TurnLimit { .. }
            | RunError::Retried { .. }
            | RunError::Invalid(_)
            | RunError::NoThread { .. }
            | RunError::NoTask { .. }
            | RunError::NeedsLoop { .. }
            | RunError::NotAList { .. }
            | RunError::UnknownCase { .. }
            | RunError::LoopLimit { .. }
            | RunError::Interrupted
            | RunError::PastDeadline
            | RunError::Cancelled { .. }
            | RunError::Abandoned { .. } => false,
        })),
    )
}
