//! The modules of the `soma` package that the glue calls back into, named here and nowhere
//! else: the Python side's part of a run (the kept event loop, the observer's dispatch, torch's
//! state, device queues), the exception hierarchy, and the stages the glue hands a run to (the
//! hosts). The package imports `_soma`, never the other way at import time; the glue imports
//! these lazily, when a run first needs one, so that importing `soma` costs what it did.
//!
//! Each is looked up once per process and kept: a module object in `sys.modules` is the same
//! object for the life of the interpreter, and what a test patches on it is seen through it.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

/// `name`, imported once and kept in `cell`.
fn kept<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyModule>>,
    name: &str,
) -> PyResult<&'py Bound<'py, PyModule>> {
    cell.get_or_try_init(py, || py.import(name).map(Bound::unbind))
        .map(|module| module.bind(py))
}

/// A function `name(py)` answering the module `path`, kept after its first import.
macro_rules! package_module {
    ($(#[$doc:meta])* $name:ident = $path:literal) => {
        $(#[$doc])*
        pub(crate) fn $name(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
            static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
            kept(py, &MODULE, $path)
        }
    };
}

package_module! {
    /// `soma.errors`: the exception classes the glue raises by name.
    errors = "soma.errors"
}

package_module! {
    /// `soma._run.loop`: the event loop Soma keeps for async nodes under `forward` and `map`.
    kept_loop = "soma._run.loop"
}

package_module! {
    /// `soma._run.observe`: where what a node emits goes.
    observe = "soma._run.observe"
}

package_module! {
    /// `soma.cache._fingerprint`: the fingerprints Python remembered by node.
    fingerprint = "soma.cache._fingerprint"
}

package_module! {
    /// `soma.devices`: a device made current around a placed node.
    devices = "soma.devices"
}

package_module! {
    /// `soma.devices._device_queues`: the queues of the devices of a run's branches.
    device_queues = "soma.devices._device_queues"
}

package_module! {
    /// `soma.devices._torch_state`: torch's grad mode, inference mode and autocast, carried.
    torch_state = "soma.devices._torch_state"
}

package_module! {
    /// `soma.remote`: the runners of a graph with nodes on hosts.
    remote = "soma.remote"
}

package_module! {
    /// `soma.journal._calls`: a node's effects and questions, in its run's journal.
    journal_calls = "soma.journal._calls"
}
