//! A run's timeout, and the errors of a run stopped early: its time ran out (`TimeoutError`) or
//! its stop flag was set (`soma.CancelledError`), each naming what the run left behind.
//!
//! What a run left behind is worded here once ([`left_behind`]) for a forward, a flow and an
//! async run alike, so that the message says the same of the same situation wherever it is
//! raised.

use std::time::Duration;

use pyo3::exceptions::{PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use soma_core::{NodeId, RunError};

use crate::errors::cancelled_error;

/// Checks a `timeout=` given where it is given (`amap`'s, before its first item): a finite
/// number of seconds, 0 or more, as every run's timeout is.
#[pyfunction]
pub fn checked_timeout(seconds: &Bound<'_, PyAny>) -> PyResult<f64> {
    let refused = || {
        PyValueError::new_err(format!(
            "timeout must be a finite number of seconds, 0 or more, not {seconds}"
        ))
    };
    if seconds.is_instance_of::<pyo3::types::PyBool>() {
        return Err(refused());
    }
    let value: f64 = seconds.extract().map_err(|_| refused())?;
    time_limit(value)?;
    Ok(value)
}

/// A `timeout` in seconds as a duration: finite and not negative; one past what a duration
/// holds is no deadline ([`crate::seconds`]).
pub(crate) fn time_limit(seconds: f64) -> PyResult<Duration> {
    crate::seconds::as_duration(seconds).ok_or_else(|| {
        PyValueError::new_err(format!(
            "timeout must be a finite number of seconds, 0 or more, not {seconds}"
        ))
    })
}

/// The `TimeoutError` of a run whose time ran out, naming what was still running.
pub(crate) fn timed_out(error: &RunError, timeout: Option<Duration>) -> PyErr {
    past_timeout("forward", timeout, &left_behind(error))
}

/// The `TimeoutError` of `what` (`forward`, `aforward`, `the stream`) that did not finish
/// within `timeout`, `still` saying what it left behind (`; still running: …`): one wording
/// for every kind of run, so that the same situation reads the same wherever it is raised.
pub(crate) fn past_timeout(what: &str, timeout: Option<Duration>, still: &str) -> PyErr {
    let limit = timeout.map_or(0.0, |t| t.as_secs_f64());
    PyTimeoutError::new_err(format!(
        "{what} did not finish within its timeout of {limit} s{still}\nhint: the graph can run again at once; a node that waits for something that may not come should wait with a timeout of its own"
    ))
}

/// The `TimeoutError` of a run on hosts past its timeout, `still` saying what it left where:
/// worded as every run's ([`past_timeout`]).
#[pyfunction]
#[pyo3(signature = (timeout, still))]
pub fn hosts_past_timeout(py: Python<'_>, timeout: Option<f64>, still: &str) -> Py<PyAny> {
    let timeout = timeout.and_then(crate::seconds::as_duration);
    past_timeout("forward", timeout, still)
        .into_value(py)
        .into_any()
}

/// The `soma.CancelledError` of a run whose stop flag was set, naming what was still running.
pub(crate) fn cancelled(py: Python<'_>, error: &RunError) -> PyErr {
    let still = left_behind(error);
    cancelled_error(py, format!("the run was stopped by its stop flag{still}"))
}

/// How many of the nodes a stopped run left running its message names.
const NAMED_LEFT_BEHIND: usize = 8;

/// The nodes a stopped run left running, as its message names them: a wave of thousands of
/// stuck branches names a few and counts the rest, so the message stays one readable line.
fn named_left_behind(running: &[NodeId]) -> String {
    let mut names: Vec<String> = running
        .iter()
        .take(NAMED_LEFT_BEHIND)
        .map(|id| format!("`{id}`"))
        .collect();
    if running.len() > NAMED_LEFT_BEHIND {
        names.push(format!("and {} more", running.len() - NAMED_LEFT_BEHIND));
    }
    names.join(", ")
}

/// What a run stopped early (its time ran out, its stop flag was set) left behind, as the
/// end of its message.
pub(crate) fn left_behind(error: &RunError) -> String {
    match error {
        RunError::Abandoned { running } if !running.is_empty() => format!(
            "; still running: {} (left to finish in the background, their results dropped)",
            named_left_behind(running)
        ),
        RunError::Abandoned { .. } => "; branches were left to finish in the background".to_owned(),
        RunError::Cancelled { running } if !running.is_empty() => {
            format!("; still running: {} (cancelled)", named_left_behind(running))
        }
        RunError::Cancelled { .. } | RunError::Interrupted => {
            "; every branch stopped at a node boundary".to_owned()
        }
        RunError::PastDeadline => {
            "; it finished after it, so its result was dropped (a deadline is never reported as met)"
                .to_owned()
        }
        other => format!("; the run had failed too: {other}"),
    }
}
