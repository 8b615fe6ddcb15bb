//! A run's board ([`soma_core::Board`]) handed to Python: what the browser's view reads a run's
//! node states from, in bulk, on its own thread, instead of being told each node's call.
//!
//! Made for a run of `forward` or `aforward` while the view alone listens (`_soma.observe(...,
//! boards=True)`), handed to the view with the run's beginning; the engine writes it as the
//! run goes. This module only carries what the board reads into Python values.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use soma_core::{Board, NodeState};

/// A run's node states, as the engine keeps them: read by the view, never written here.
#[pyclass(frozen, module = "soma", name = "Board")]
pub struct PyBoard {
    pub(crate) board: Arc<Board>,
}

/// One record as `read` gives it: index, state, attempt, thread, started, ended.
type Read = (usize, &'static str, u32, u64, f64, Option<f64>);

/// A state as the view names it (`soma.view.record.NodeState`'s values).
fn state_name(state: NodeState) -> &'static str {
    match state {
        NodeState::Waiting => "waiting",
        NodeState::Running => "running",
        NodeState::Finished => "finished",
        NodeState::Cached => "cached",
        NodeState::Failed => "failed",
        NodeState::Retrying => "retrying",
        NodeState::TimedOut => "timed_out",
        NodeState::Stopped => "stopped",
    }
}

#[pymethods]
impl PyBoard {
    /// Whether a node's record changed since the last read.
    #[getter]
    fn changed(&self) -> bool {
        self.board.changed()
    }

    /// The program the run resolved, as a number: the same for every run of a graph not
    /// changed since, while a board of it is alive.
    #[getter]
    fn program(&self) -> usize {
        Arc::as_ptr(self.board.program()) as usize
    }

    /// How many of the run's own nodes (not those inside its steps) are done: finished, or
    /// answered by the cache.
    #[getter]
    fn done(&self) -> usize {
        self.board.done()
    }

    /// Each node's id and device (`None` when unplaced), by index.
    fn nodes<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.board
            .nodes()
            .into_iter()
            .map(|(id, device)| {
                let device = device.map(|device| device.to_string());
                PyTuple::new(
                    py,
                    [
                        id.as_str().into_pyobject(py)?.into_any(),
                        device.into_pyobject(py)?,
                    ],
                )
            })
            .collect()
    }

    /// The records changed since the last read, each as `(index, state, attempt, thread,
    /// started, ended)`: its state's name, its last attempt from 0, the thread it ran on (as
    /// `threading.get_ident` names it, on x86-64 Linux), its start and end in seconds since the run was made (`ended` `None`
    /// while it runs).
    fn read(&self, py: Python<'_>) -> Vec<Read> {
        let board = Arc::clone(&self.board);
        crate::exit::detach(py, move || board.read())
            .into_iter()
            .map(|change| {
                (
                    change.index,
                    state_name(change.state),
                    change.attempt,
                    change.thread,
                    change.started,
                    change.ended,
                )
            })
            .collect()
    }

    /// Waits at most `timeout` seconds, the GIL given up, for a change since the last read;
    /// whether there is one.
    fn wait(&self, py: Python<'_>, timeout: f64) -> bool {
        let timeout = Duration::try_from_secs_f64(timeout.max(0.0)).unwrap_or(Duration::MAX);
        let board = Arc::clone(&self.board);
        crate::exit::detach(py, move || board.wait(timeout))
    }

    fn __len__(&self) -> usize {
        self.board.len()
    }
}
