//! A run's board ([`soma_core::Board`]) handed to Python, with what the browser's view lists of
//! the run: what the view reads a run's node states from, in bulk, on its own thread, instead
//! of being told each node's call — and the run itself, instead of being told it begins and
//! ends.
//!
//! Made for a run of `forward` or `aforward`, and by the engine for each item's run of a stream
//! (`map`), while the view alone listens (`_soma.observe(..., boards=(runs, nodes))`), the
//! engine writes the board as the run goes.
//! As the run begins, the glue (`observer.rs`) puts the board in the ledger
//! ([`boarded_runs`]) with the run's own facts — its number, graph, node count, when it began,
//! the run it was started in — and as it ends, its outcome: a run that returns calls no
//! Python for the view at all, and the view makes its record of the run when it next reads
//! (`soma.view.record.Recorder`). The ledger keeps at most twice what the view keeps of
//! finished runs, so that a view nobody reads holds no more.
//!
//! This module only carries what the board and the run's facts hold into Python values.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use soma_core::{Board, NodeState};

/// A run's node states, as the engine keeps them, and the run's facts: read by the view, never
/// written here.
#[pyclass(frozen, module = "soma", name = "Board")]
pub struct PyBoard {
    pub(crate) board: Arc<Board>,
    /// The run's number among this process's runs ([`run_number`]).
    number: u64,
    /// The graph the run is of (`GraphCore`), whose plan the view draws.
    graph: Py<PyAny>,
    /// When the board was made, just before its run began.
    made: Instant,
    /// The same, in seconds since the epoch.
    made_at: f64,
    /// What the run told as it began.
    begun: OnceLock<RunBegun>,
    /// How the run ended, once it has.
    ended: OnceLock<RunEnded>,
    /// What a node's `ctx.emit` reports through, made the first time one asks
    /// (`soma._run.observe.board_watched`).
    watched: OnceLock<Py<PyAny>>,
}

/// What a run tells the view as it begins.
struct RunBegun {
    /// The index of the streamed item whose run it is; `None` for a whole run.
    item: Option<u64>,
    nodes: usize,
    asynchronous: bool,
    /// The run whose node started this one (`soma._run.observe.current_run` as it began:
    /// the view's record of it, or its board), or `None`.
    parent: Option<Py<PyAny>>,
    /// The nodes that stand for nothing the user wrote (`soma._run.observe.hidden`).
    hidden: Py<PyAny>,
    /// The journal's run it is (`soma.journal._active.ACTIVE`), or `None`.
    journal: Option<Py<PyAny>>,
}

/// How a run ended, as the observer's `end` would be told it.
struct RunEnded {
    outcome: u8,
    error: Option<Py<PyAny>>,
    /// Seconds from the board's making to the run's end.
    seconds: f64,
}

/// One record as `read` gives it: index, state, attempt, thread, started, ended.
type Read = (usize, &'static str, u32, u64, f64, Option<f64>);

/// The number the next run of this process is listed by: the view numbers every run, with a
/// board or without, from this one count, so that its list keeps the order runs began in.
static RUN_NUMBERS: AtomicU64 = AtomicU64::new(1);

/// A number for a run the view lists, from this process's one count.
#[pyfunction]
pub fn run_number() -> u64 {
    RUN_NUMBERS.fetch_add(1, Ordering::Relaxed)
}

/// The boards of runs begun since the view last took them ([`boarded_runs`]), and how much it
/// keeps of finished runs: once it holds twice that, the oldest finished boards go until it
/// holds that (a run in flight is kept, however many are).
struct Ledger {
    boards: VecDeque<Py<PyBoard>>,
    /// The nodes the boards hold, in all.
    nodes: usize,
    runs_kept: usize,
    nodes_kept: usize,
    /// The observer the boards are for: one installed in its place starts an empty ledger.
    owner: usize,
}

impl Ledger {
    /// Lets go of the oldest boards of finished runs until those left are within what it keeps,
    /// the runs in flight not counted (each is kept, however many are): the boards let go of,
    /// to be dropped once the lock is released.
    fn trimmed(&mut self) -> Vec<Py<PyBoard>> {
        let ended = |board: &Py<PyBoard>| board.get().ended.get().is_some();
        let mut finished = 0;
        let mut finished_nodes = 0;
        for board in self.boards.iter().filter(|board| ended(board)) {
            finished += 1;
            finished_nodes += board.get().board.len();
        }
        let mut gone = Vec::new();
        let mut at = 0;
        while finished > 1 && (finished > self.runs_kept || finished_nodes > self.nodes_kept) {
            let Some(found) = self.boards.range(at..).position(ended) else {
                break;
            };
            let Some(board) = self.boards.remove(at + found) else {
                break;
            };
            at += found;
            let nodes = board.get().board.len();
            finished -= 1;
            finished_nodes -= nodes;
            self.nodes -= nodes;
            gone.push(board);
        }
        gone
    }
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger {
    boards: VecDeque::new(),
    nodes: 0,
    runs_kept: usize::MAX,
    nodes_kept: usize::MAX,
    owner: 0,
});

/// The observer `owner` (by address) keeps boards, and at most `runs` finished runs of
/// `nodes` nodes in all: what the ledger keeps for it until it takes them. Boards kept for
/// another observer are let go.
pub(crate) fn keep_for(owner: usize, runs: usize, nodes: usize) {
    let gone = {
        let mut ledger = LEDGER.lock().unwrap_or_else(PoisonError::into_inner);
        ledger.runs_kept = runs.max(1);
        ledger.nodes_kept = nodes;
        if ledger.owner == owner {
            return;
        }
        ledger.owner = owner;
        ledger.nodes = 0;
        std::mem::take(&mut ledger.boards)
    };
    // Dropped outside the lock: a board's graph may be the last reference to Python objects.
    drop(gone);
}

/// The boards of the runs begun since the last call, in the order they began; the ledger is
/// left empty.
#[pyfunction]
pub fn boarded_runs() -> Vec<Py<PyBoard>> {
    let mut ledger = LEDGER.lock().unwrap_or_else(PoisonError::into_inner);
    ledger.nodes = 0;
    ledger.boards.drain(..).collect()
}

impl PyBoard {
    /// The board of a run of `graph` about to begin, numbered now.
    pub(crate) fn new(board: Arc<Board>, graph: Py<PyAny>) -> PyBoard {
        let made_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_secs_f64();
        PyBoard {
            board,
            number: run_number(),
            graph,
            made: Instant::now(),
            made_at,
            begun: OnceLock::new(),
            ended: OnceLock::new(),
            watched: OnceLock::new(),
        }
    }

    /// Its run begins, telling what it tells (see [`RunBegun`]): the board goes in the ledger
    /// (`slf`, this board), and the oldest finished boards out of it past what it keeps.
    pub(crate) fn begins(
        slf: &Bound<'_, PyBoard>,
        item: Option<u64>,
        nodes: usize,
        asynchronous: bool,
        parent: Option<Py<PyAny>>,
        hidden: Py<PyAny>,
        journal: Option<Py<PyAny>>,
    ) {
        let this = slf.get();
        let _ = this.begun.set(RunBegun {
            item,
            nodes,
            asynchronous,
            parent,
            hidden,
            journal,
        });
        let mut gone = Vec::new();
        {
            let mut ledger = LEDGER.lock().unwrap_or_else(PoisonError::into_inner);
            ledger.nodes += this.board.len();
            ledger.boards.push_back(slf.clone().unbind());
            // Trimmed once it holds twice what it keeps, down to what it keeps: a look at each
            // board once per so many runs, not at every run.
            if ledger.boards.len() > 2 * ledger.runs_kept || ledger.nodes > 2 * ledger.nodes_kept {
                gone = ledger.trimmed();
            }
        }
        drop(gone);
    }

    /// Its run ended as `outcome` (the observer's numbers), with `error` (`None` when it
    /// returned). Told once; the first telling stands.
    pub(crate) fn ends(&self, outcome: u8, error: Option<Py<PyAny>>) {
        let seconds = self.made.elapsed().as_secs_f64();
        let _ = self.ended.set(RunEnded {
            outcome,
            error,
            seconds,
        });
    }

    /// What a node's `ctx.emit` in its run reports through: made once, by `make`.
    pub(crate) fn watched(
        &self,
        py: Python<'_>,
        make: impl FnOnce() -> PyResult<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        if let Some(watched) = self.watched.get() {
            return Ok(watched.clone_ref(py));
        }
        let watched = make()?;
        Ok(self.watched.get_or_init(|| watched).clone_ref(py))
    }
}

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

    /// The run's number among this process's runs.
    #[getter]
    fn number(&self) -> u64 {
        self.number
    }

    /// The graph the run is of (`GraphCore`).
    #[getter]
    fn graph(&self, py: Python<'_>) -> Py<PyAny> {
        self.graph.clone_ref(py)
    }

    /// When the run began, in seconds since the epoch.
    #[getter]
    fn started_at(&self) -> f64 {
        self.made_at
    }

    /// Seconds since the run began (since its board was made, just before).
    #[getter]
    fn elapsed(&self) -> f64 {
        self.made.elapsed().as_secs_f64()
    }

    /// What the run told as it began: `(nodes, asynchronous, parent, hidden, journal_run,
    /// item)` (`item`: the streamed item's index, `None` for a whole run), or `None` before it
    /// began.
    #[getter]
    fn begun<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(begun) = self.begun.get() else {
            return Ok(None);
        };
        let none = || py.None();
        let begun = PyTuple::new(
            py,
            [
                begun.nodes.into_pyobject(py)?.into_any().unbind(),
                pyo3::types::PyBool::new(py, begun.asynchronous)
                    .to_owned()
                    .into_any()
                    .unbind(),
                begun.parent.as_ref().map_or_else(none, |p| p.clone_ref(py)),
                begun.hidden.clone_ref(py),
                begun
                    .journal
                    .as_ref()
                    .map_or_else(none, |j| j.clone_ref(py)),
                begun.item.into_pyobject(py)?.into_any().unbind(),
            ],
        )?;
        Ok(Some(begun))
    }

    /// How the run ended: `(outcome, error, seconds)`, the outcome in the observer's numbers,
    /// `error` `None` when it returned, and the seconds it took; `None` while it runs.
    #[getter]
    fn ended(&self, py: Python<'_>) -> Option<(u8, Option<Py<PyAny>>, f64)> {
        self.ended.get().map(|ended| {
            (
                ended.outcome,
                ended.error.as_ref().map(|error| error.clone_ref(py)),
                ended.seconds,
            )
        })
    }

    /// Whether the run has ended.
    #[getter]
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.get().is_some()
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
    /// `threading.get_ident` names it, on x86-64 Linux), its start and end in seconds since
    /// the run was made (`ended` `None` while it runs).
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

    fn __len__(&self) -> usize {
        self.board.len()
    }
}
