//! A placed Python node's device: made its thread's current device while it runs, and checked
//! against where its output lives.
//!
//! Setting the current device is the business of a backend (torch, or one a user registers), so
//! it is asked of `soma.devices`, in Python, and only for placed nodes: an unplaced node costs
//! nothing here. Set per node and put back right after it, so that what a thread has current
//! between nodes — and after its branch — is what it had before; a node never sees the device
//! of the node before it.
//!
//! The output check reads `.device` from the value a node returned, and from the items of a
//! tuple or list and the values of a dict it returned (one level deep): a torch tensor, a `CuPy`
//! array. A value that does not say where it lives in a spelling Soma reads is not checked.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use soma_core::Device;

use crate::device_queues;

/// Makes `device` current on this thread, through `soma.devices`; returns what puts back the
/// device that was current before, or `None` when there is nothing to put back (no backend
/// handles the device's kind, or it was current already).
/// Inside a branch of a forward with device queues, the branch's queues are made current too
/// (`device_queues.rs`).
pub fn enter(py: Python<'_>, device: Device) -> PyResult<Option<Bound<'_, PyAny>>> {
    device_queues::enter(py, &device.to_string())
}

/// `()` if every value in `out` that says where it lives is on `declared`; else the
/// `soma.WrongDeviceError` that names the node, both devices and the fix.
pub fn check(py: Python<'_>, node: &str, declared: Device, out: &Bound<'_, PyAny>) -> PyResult<()> {
    let found = found_on(out)?;
    if found.is_some() {
        return mismatch(py, node, declared, found, None);
    }
    if let Ok(items) = out.cast::<PyTuple>() {
        for (at, item) in items.iter().enumerate() {
            mismatch(
                py,
                node,
                declared,
                found_on(&item)?,
                Some(format!("[{at}]")),
            )?;
        }
    } else if let Ok(items) = out.cast::<PyList>() {
        for (at, item) in items.iter().enumerate() {
            mismatch(
                py,
                node,
                declared,
                found_on(&item)?,
                Some(format!("[{at}]")),
            )?;
        }
    } else if let Ok(items) = out.cast::<PyDict>() {
        for (key, item) in items.iter() {
            let key = key
                .repr()
                .map_or_else(|_| "?".to_owned(), |k| k.to_string());
            mismatch(
                py,
                node,
                declared,
                found_on(&item)?,
                Some(format!("[{key}]")),
            )?;
        }
    }
    Ok(())
}

/// Where `value` says it lives, read from its `.device` as torch writes it (`cuda:0`) or as
/// `CuPy` does (a device with an integer `.id`, on CUDA); `None` if it does not say, or not in a
/// spelling Soma reads. What reading it raises says nothing either, unless it asks the program
/// to stop (a Ctrl-C met there): that goes on to the caller.
fn found_on(value: &Bound<'_, PyAny>) -> PyResult<Option<Device>> {
    let py = value.py();
    let Some(device) = failure_is_none(py, value.getattr_opt("device"))?.flatten() else {
        return Ok(None);
    };
    if device.is_none() {
        return Ok(None);
    }
    if let Some(text) = failure_is_none(py, device.str())? {
        if let Ok(found) = text.to_str().unwrap_or_default().parse::<Device>() {
            return Ok(Some(found));
        }
    }
    let Some(id) = failure_is_none(py, device.getattr_opt("id"))?.flatten() else {
        return Ok(None);
    };
    Ok(id
        .extract::<u32>()
        .ok()
        .and_then(|id| format!("cuda:{id}").parse().ok()))
}

/// `result`'s value, or `None` for an ordinary failure (an `Exception`); a `BaseException` that
/// asks the program to stop (`KeyboardInterrupt`, `SystemExit`) is kept as the error.
fn failure_is_none<T>(py: Python<'_>, result: PyResult<T>) -> PyResult<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(failure) if failure.is_instance_of::<PyException>(py) => Ok(None),
        Err(stop) => Err(stop),
    }
}

fn mismatch(
    py: Python<'_>,
    node: &str,
    declared: Device,
    found: Option<Device>,
    at: Option<String>,
) -> PyResult<()> {
    let Some(found) = found.filter(|found| !declared.holds(*found)) else {
        return Ok(());
    };
    let what = match at {
        Some(at) => format!("an output (at `{at}`)"),
        None => "its output".to_owned(),
    };
    let message = format!(
        "node `{node}` is placed on `{declared}`, but {what} is on `{found}`\nhint: move it to the node's device before returning it (`x.to(ctx.device)` for a torch tensor), or place the node where its output lives: `g.place(\"{node}\", \"{found}\")`"
    );
    let error = crate::py_modules::errors(py)?
        .getattr("WrongDeviceError")?
        .call1((message,))?;
    error.setattr("node", PyString::new(py, node))?;
    error.setattr("declared", declared.to_string())?;
    error.setattr("found", found.to_string())?;
    Err(PyErr::from_value(error))
}

/// `soma._soma.parse_device`: `text` read as a device and written back the one way Soma writes
/// it; a `soma.DeviceError` where it cannot be read.
#[pyfunction]
pub fn parse_device(py: Python<'_>, text: &str) -> PyResult<String> {
    text.parse::<Device>()
        .map(|device| device.to_string())
        .map_err(|e| crate::errors::device_error(py, &e))
}
