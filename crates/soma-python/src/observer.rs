//! The engine's [`Observer`] handed to Python: each work of a run, as it begins and ends,
//! passed to the object `soma._run.observe` installs (`_soma.observe(target)`), which turns it into
//! OpenTelemetry spans and live events. The rules of what is told, and where, are the engine's
//! (`soma_core::Observer`); this module only crosses the boundary.
//!
//! One observer for the process, read once per run when its executor is made: a run made while
//! none is installed costs what it did, one `Option` per node in the engine. One installed to
//! keep boards (the view alone, `boards=(runs, nodes)`) gives each run of `forward` and
//! `aforward` a board ([`soma_core::Board`], `board.rs`) and is told only the calls that fail,
//! steps' parts and async nodes' calls: such a run's own beginning and end are kept with its
//! board, in the ledger the view takes boards from, so that a run that returns calls no Python
//! for the view.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3::{intern, IntoPyObjectExt};
use soma_core::{Begun, Board, Ended, Executor, Observer, Opened, Part, Program, RunError};

use crate::board::{self, PyBoard};

use crate::errors::{python_cause, run_error};
use crate::watch::SignalWatch;

/// The observer installed for the process, if one is.
static INSTALLED: RwLock<Option<Arc<PythonObserver>>> = RwLock::new(None);

/// Whether one is: what a run reads first, so that a process that watches nothing pays a flag
/// read per run, not a lock.
static ANY: AtomicBool = AtomicBool::new(false);

/// What the Python side is told for each work: `begin(kind, node, part, number, device,
/// branch, awaited, function)` — `number` the attempt of a call, the node count of a run;
/// `awaited` whether a call's node, or a run's program, is async; `part` for a call's attempt
/// told only as it failed (a call a run's board keeps), when it began, in seconds since the
/// board was made; `function` what the work runs:
/// the qualified name of a call's, the graph (`GraphCore`) of a run's, so that a watcher can tie
/// a run to its plan — whose return value comes back to
/// `end(opened, outcome, error, retry_in)` exactly once, where the work ends (or, for a work
/// dropped unfinished, when it is dropped, as stopped). The numbers are `soma._run.observe`'s
/// constants.
struct PythonObserver {
    target: Py<PyAny>,
    /// The graph the run is of, told with the run's beginning: set on the copy a run takes
    /// ([`installed_for`]), never on the one installed.
    graph: Option<Py<PyAny>>,
    /// The run's watch, on the copy a run takes: what tells a run its caller stopped waiting
    /// for past its `timeout=` (the engine tells only that it was abandoned) from one stopped
    /// by Ctrl-C, so that the first ends timed out, with the `TimeoutError` its caller raises.
    watch: Option<Arc<SignalWatch>>,
    /// Whether the runs it is installed for keep a board.
    boards: bool,
    /// The run's board, on the copy a run that keeps one takes: its run's beginning and end
    /// are kept there, not told `target`.
    board: Option<Py<PyBoard>>,
}

/// Which work begins, as `begin` is told it.
mod kind {
    pub(super) const CALL: u8 = 0;
    pub(super) const CACHED: u8 = 1;
    pub(super) const ITEM: u8 = 2;
    pub(super) const CASE: u8 = 3;
    pub(super) const ITERATION: u8 = 4;
    pub(super) const RUN: u8 = 5;
}

/// How a work ended, as `end` is told it.
mod outcome {
    pub(super) const RETURNED: u8 = 0;
    pub(super) const FAILED: u8 = 1;
    pub(super) const STOPPED: u8 = 2;
    /// Failed for time running out (`RunError::timed_out`): its time limit, the run's deadline.
    pub(super) const TIMED_OUT: u8 = 3;
}

/// Installs `target` as the process's observer (`None` removes it): runs started from now on
/// tell it their works; runs already started keep the one they had. With `boards` — how many
/// finished runs, of how many nodes in all, the ledger `boarded_runs` takes from keeps until
/// they are taken (the view's own bounds, which it passes) — each run of `forward` and
/// `aforward` keeps a board, which goes in that ledger as the run begins, with the run's
/// beginning and end; the calls of its nodes that are not awaited are told only when they fail.
#[pyfunction]
#[pyo3(signature = (target, boards=None))]
pub fn observe(target: Option<Py<PyAny>>, boards: Option<(usize, usize)>) {
    if let (Some(target), Some((runs, nodes))) = (&target, boards) {
        board::keep_for(target.as_ptr() as usize, runs, nodes);
    }
    let boards = boards.is_some();
    let observer = target.map(|target| {
        Arc::new(PythonObserver {
            target,
            graph: None,
            watch: None,
            boards,
            board: None,
        })
    });
    let mut installed = INSTALLED.write().unwrap_or_else(PoisonError::into_inner);
    ANY.store(observer.is_some(), Ordering::Release);
    *installed = observer;
}

/// What watches the node call beginning here (`soma._run.observe.current_call`, which the
/// observer's `begin` set for it), for its `Ctx` to carry to threads the node starts; `None`
/// at the cost of a flag's read when nothing watches.
pub(crate) fn watched(py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
    static CURRENT_CALL: PyOnceLock<ContextVariable> = PyOnceLock::new();
    if !ANY.load(Ordering::Acquire) {
        return Ok(None);
    }
    let current = ContextVariable::of(py, &CURRENT_CALL, "current_call")?.get(py)?;
    if !current.is_none() {
        return Ok(Some(current.unbind()));
    }
    // A run that keeps a board told Python nothing as it began: what its nodes emit reports
    // through what its board makes, once one asks.
    let run = current_run(py)?.get(py)?;
    let Ok(board) = run.cast::<PyBoard>() else {
        return Ok(None);
    };
    board
        .get()
        .watched(py, || {
            crate::py_modules::observe(py)?
                .call_method1(intern!(py, "board_watched"), (board,))
                .map(Bound::unbind)
        })
        .map(Some)
}

/// A context variable of `soma._run.observe`, its methods bound once: a call through a method
/// looked up at each call makes and frees a method object, and a run that keeps a board calls
/// four as it begins and ends.
struct ContextVariable {
    get: Py<PyAny>,
    set: Py<PyAny>,
    reset: Py<PyAny>,
}

impl ContextVariable {
    /// The context variable `name`, looked up once and kept in `cell`.
    fn of<'a>(
        py: Python<'_>,
        cell: &'a PyOnceLock<ContextVariable>,
        name: &str,
    ) -> PyResult<&'a ContextVariable> {
        cell.get_or_try_init(py, || {
            let variable = crate::py_modules::observe(py)?.getattr(name)?;
            Ok(ContextVariable {
                get: variable.getattr("get")?.unbind(),
                set: variable.getattr("set")?.unbind(),
                reset: variable.getattr("reset")?.unbind(),
            })
        })
    }

    /// Its value here.
    fn get<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.get.bind(py).call0()
    }

    /// Sets it to `value` here: the token that puts the value before back.
    fn set<'py>(&self, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.set.bind(value.py()).call1((value,))
    }

    /// Puts back the value before the `set` that gave `token`.
    fn reset(&self, token: &Bound<'_, PyAny>) -> PyResult<()> {
        self.reset.bind(token.py()).call1((token,)).map(drop)
    }
}

/// `soma._run.observe.current_run`: the run the current work is part of, as the view knows it
/// (its record, or the board of a run that keeps one).
fn current_run(py: Python<'_>) -> PyResult<&'static ContextVariable> {
    static CURRENT_RUN: PyOnceLock<ContextVariable> = PyOnceLock::new();
    ContextVariable::of(py, &CURRENT_RUN, "current_run")
}

/// `executor` with the observer a run of `graph` made now, watched by `watch`, is to tell, if
/// one is installed: the installed one's target, told `graph` with the run's beginning; and,
/// when the observer keeps boards, for one run of `program` (`board`) with the run's board,
/// or, for a stream (`None`), with each item's, made as the item is read.
pub(crate) fn observed(
    executor: Executor,
    graph: &Bound<'_, PyAny>,
    watch: &Arc<SignalWatch>,
    board: Option<&Arc<Program>>,
) -> PyResult<Executor> {
    if !ANY.load(Ordering::Acquire) {
        return Ok(executor);
    }
    let py = graph.py();
    let installed = INSTALLED.read().unwrap_or_else(PoisonError::into_inner);
    let Some(observer) = installed.as_ref() else {
        return Ok(executor);
    };
    let board = match board {
        Some(program) if observer.boards => Some(Arc::new(Board::new(program))),
        Some(_) | None => None,
    };
    let mut executor = executor;
    let mut kept = None;
    if let Some(board) = board {
        executor = executor.with_board(Arc::clone(&board));
        kept = Some(Py::new(py, PyBoard::new(board, graph.clone().unbind()))?);
    } else if observer.boards {
        executor = executor.with_item_boards();
    }
    Ok(executor.with_observer(Arc::new(PythonObserver {
        target: observer.target.clone_ref(py),
        graph: Some(graph.clone().unbind()),
        watch: Some(Arc::clone(watch)),
        boards: observer.boards,
        board: kept,
    })))
}

impl Observer for PythonObserver {
    fn begin(&self, begun: &Begun<'_>) -> Opened {
        if let &Begun::Run {
            item,
            nodes,
            asynchronous,
            board: item_board,
        } = begun
        {
            if self.board.is_some() || item_board.is_some() {
                return crate::exit::attach(|py| {
                    let begins = |board: &Py<PyBoard>| {
                        boarded_run_begins(py, board, item, nodes, asynchronous)
                    };
                    let opened = match (&self.board, item_board, &self.graph) {
                        (Some(board), _, _) => begins(board),
                        // A streamed item's board, made by the engine as the item was read.
                        (None, Some(board), Some(graph)) => {
                            Py::new(py, PyBoard::new(Arc::clone(board), graph.clone_ref(py)))
                                .and_then(|board| begins(&board))
                        }
                        (None, _, _) => return None,
                    };
                    match opened {
                        Ok(opened) => Some(Box::new(opened) as Box<dyn std::any::Any + Send>),
                        Err(error) => {
                            error.write_unraisable(py, Some(self.target.bind(py)));
                            None
                        }
                    }
                });
            }
        }
        crate::exit::attach(|py| {
            let arguments = match begun_arguments(py, begun, self.graph.as_ref()) {
                Ok(arguments) => arguments,
                Err(error) => {
                    error.write_unraisable(py, Some(self.target.bind(py)));
                    return None;
                }
            };
            match crate::exit::call_method(self.target.bind(py), intern!(py, "begin"), arguments) {
                Ok(opened) if opened.is_none() => None,
                Ok(opened) => Some(Box::new(Unended {
                    target: self.target.clone_ref(py),
                    opened: Some(opened.unbind()),
                }) as Box<dyn std::any::Any + Send>),
                // An observer's own failure never fails the run: it is reported as an
                // exception Python could not raise anywhere.
                Err(error) => {
                    error.write_unraisable(py, Some(self.target.bind(py)));
                    None
                }
            }
        })
    }

    fn end(&self, opened: Opened, ended: &Ended<'_>) {
        let Some(opened) = opened else {
            return;
        };
        let mut unended = match opened.downcast::<Unended>() {
            Ok(unended) => unended,
            Err(opened) => {
                if let Ok(mut run) = opened.downcast::<BoardedRun>() {
                    crate::exit::attach(|py| {
                        let (outcome, error, _) = self.ended_values(py, ended);
                        run.ends(py, outcome, (!error.is_none(py)).then_some(error));
                    });
                }
                return;
            }
        };
        let Some(opened) = unended.opened.take() else {
            return;
        };
        crate::exit::attach(|py| {
            let (outcome, error, retry_in) = self.ended_values(py, ended);
            let ended = (opened.bind(py), outcome, error, retry_in);
            if let Err(error) =
                crate::exit::call_method(self.target.bind(py), intern!(py, "end"), ended)
            {
                error.write_unraisable(py, Some(self.target.bind(py)));
            }
        });
    }
}

impl PythonObserver {
    /// What `end` is told of a work that ended as `ended`: its outcome, its error (`None`
    /// when it returned) and the seconds until its retry.
    fn ended_values(&self, py: Python<'_>, ended: &Ended<'_>) -> (u8, Py<PyAny>, Option<f64>) {
        match ended {
            Ended::Returned => (outcome::RETURNED, py.None(), None),
            Ended::Failed { error, .. } if self.past_timeout(error) => (
                outcome::TIMED_OUT,
                crate::stopped::timed_out(error, self.watch.as_ref().and_then(|w| w.timeout()))
                    .into_value(py)
                    .into_any(),
                None,
            ),
            Ended::Failed { error, retry_in } => (
                if error.timed_out() {
                    outcome::TIMED_OUT
                } else {
                    outcome::FAILED
                },
                error_value(py, error),
                retry_in.map(|pause| pause.as_secs_f64()),
            ),
            Ended::Stopped => (outcome::STOPPED, py.None(), None),
        }
    }

    /// Whether `error` is of a work its run's caller stopped waiting for because the run's
    /// `timeout=` passed.
    fn past_timeout(&self, error: &RunError) -> bool {
        matches!(error, RunError::Abandoned { .. } | RunError::Interrupted)
            && self.watch.as_ref().is_some_and(|watch| watch.timed_out())
    }
}

/// A run that keeps a board, begun: its board, and how `soma._run.observe.current_run` is put
/// back as it ends. A run dropped without an end (an async run whose task was dropped, a
/// streamed item in flight when its stream closed) ends stopped when this is dropped.
struct BoardedRun {
    board: Option<Py<PyBoard>>,
    restore: Option<Restore>,
}

/// How a run that keeps a board puts back the run current where it began, as it ends.
enum Restore {
    /// A whole run: with the token of its own `set`, which ends where it began (a run ended in
    /// another context, such as an async run's task, leaves that context as it is).
    Token(Py<PyAny>),
    /// A streamed item's run, which begins inside the item's own context (or the caller's,
    /// where no context is carried) and always ends on the caller's thread, outside it: by
    /// setting the run it began in back (the item's context goes with the item), where a
    /// token, made in another context, would be refused with an exception at every item.
    Value(Py<PyAny>),
}

/// A run of `nodes` nodes that keeps `board` begins: it is the current run where it begins,
/// for the works it tells and what its nodes emit, and its board goes in the ledger with what
/// it tells.
fn boarded_run_begins(
    py: Python<'_>,
    board: &Py<PyBoard>,
    item: Option<u64>,
    nodes: usize,
    asynchronous: bool,
) -> PyResult<BoardedRun> {
    static HIDDEN: PyOnceLock<ContextVariable> = PyOnceLock::new();
    let current = current_run(py)?;
    let parent = current.get(py)?;
    let hidden = ContextVariable::of(py, &HIDDEN, "hidden")?.get(py)?;
    let board = board.bind(py);
    PyBoard::begins(
        board,
        item,
        nodes,
        asynchronous,
        (!parent.is_none()).then(|| parent.clone().unbind()),
        hidden.unbind(),
        crate::protocol::journal_run(py)?,
    );
    let token = current.set(board.as_any())?;
    let restore = match item {
        None => Restore::Token(token.unbind()),
        Some(_) => Restore::Value(parent.unbind()),
    };
    Ok(BoardedRun {
        board: Some(board.clone().unbind()),
        restore: Some(restore),
    })
}

impl BoardedRun {
    /// The run ended as `outcome`, with `error`: its board keeps it, and the run it was
    /// started in is current again — where it began; ended elsewhere (a streamed item, a task
    /// on another thread), the context there is left as it is.
    fn ends(&mut self, py: Python<'_>, outcome: u8, error: Option<Py<PyAny>>) {
        let Some(board) = self.board.take() else {
            return;
        };
        board.get().ends(outcome, error);
        let put_back = match self.restore.take() {
            Some(Restore::Token(token)) => {
                current_run(py).and_then(|current| current.reset(token.bind(py)))
            }
            Some(Restore::Value(parent)) => {
                current_run(py).and_then(|current| current.set(parent.bind(py)).map(drop))
            }
            None => Ok(()),
        };
        if let Err(error) = put_back {
            // A token made in another context: the run ended where it did not begin.
            if !error.is_instance_of::<pyo3::exceptions::PyValueError>(py) {
                error.write_unraisable(py, Some(board.bind(py)));
            }
        }
    }
}

impl Drop for BoardedRun {
    fn drop(&mut self) {
        let Some(board) = &self.board else {
            return;
        };
        if board.get().has_ended() {
            return;
        }
        let Some(_inside) = crate::exit::try_enter() else {
            // The interpreter is ending: nothing may enter it now, and nobody reads the run.
            if let Some(board) = self.board.take() {
                std::mem::forget(board);
            }
            if let Some(restore) = self.restore.take() {
                std::mem::forget(restore);
            }
            return;
        };
        crate::exit::attach(|py| {
            // A streamed item dropped in flight goes wherever its stream is dropped, in a
            // context that need not be the one it began in: nothing is set there.
            if matches!(self.restore, Some(Restore::Value(_))) {
                self.restore = None;
            }
            self.ends(py, outcome::STOPPED, None);
        });
    }
}

impl Drop for PythonObserver {
    /// A run's copy goes with its executor, once the run is over: its board's clock may stop.
    fn drop(&mut self) {
        if let Some(board) = &self.board {
            board.get().board.finished();
        }
    }
}

/// What `begin` returned, until `end` is told: a work dropped without an end (a stream closed
/// with items in flight, an async run whose task was dropped) is ended as stopped when it is
/// dropped, so that nothing the observer opened stays open.
struct Unended {
    target: Py<PyAny>,
    opened: Option<Py<PyAny>>,
}

impl Drop for Unended {
    fn drop(&mut self) {
        let Some(opened) = self.opened.take() else {
            return;
        };
        let Some(_inside) = crate::exit::try_enter() else {
            // The interpreter is ending: nothing may enter it now, and nobody reads the span.
            // Left at once rather than parked: this drop may come on a thread holding the GIL.
            std::mem::forget(opened);
            return;
        };
        crate::exit::attach(|py| {
            let ended = (opened.bind(py), outcome::STOPPED, py.None(), None::<f64>);
            if let Err(error) =
                crate::exit::call_method(self.target.bind(py), intern!(py, "end"), ended)
            {
                error.write_unraisable(py, Some(self.target.bind(py)));
            }
        });
    }
}

/// `begin`'s arguments for `begun`.
fn begun_arguments<'py>(
    py: Python<'py>,
    begun: &Begun<'_>,
    graph: Option<&Py<PyAny>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let nothing = || py.None().into_bound(py);
    let mut function = nothing();
    let (kind, node, part, attempt, device, branch, awaited) = match *begun {
        Begun::Call {
            node,
            attempt,
            device,
            branch,
            awaited,
            ref described,
            began,
        } => {
            function = described.as_deref().into_bound_py_any(py)?;
            (
                kind::CALL,
                node.as_str().into_bound_py_any(py)?,
                // An attempt told only as it failed: when it began (see `begin`'s arguments).
                began.into_bound_py_any(py)?,
                attempt,
                device,
                branch,
                awaited,
            )
        }
        Begun::Cached {
            node,
            device,
            branch,
        } => (
            kind::CACHED,
            node.as_str().into_bound_py_any(py)?,
            nothing(),
            0,
            device,
            branch,
            false,
        ),
        Begun::Part { step, part, branch } => {
            let (kind, part) = match part {
                Part::Item(index) => (kind::ITEM, index.into_bound_py_any(py)?),
                Part::Case(key) => (kind::CASE, key.into_bound_py_any(py)?),
                Part::Iteration(iteration) => (kind::ITERATION, iteration.into_bound_py_any(py)?),
            };
            let step = step.as_str().into_bound_py_any(py)?;
            (kind, step, part, 0, None, branch, false)
        }
        Begun::Run {
            item,
            nodes,
            asynchronous,
            board: _,
        } => {
            if let Some(graph) = graph {
                function = graph.bind(py).clone();
            }
            (
                kind::RUN,
                nothing(),
                item.into_bound_py_any(py)?,
                u32::try_from(nodes).unwrap_or(u32::MAX),
                None,
                &[][..],
                asynchronous,
            )
        }
    };
    let device = match device {
        Some(device) => device.to_string().into_bound_py_any(py)?,
        None => nothing(),
    };
    PyTuple::new(
        py,
        [
            kind.into_bound_py_any(py)?,
            node,
            part,
            attempt.into_bound_py_any(py)?,
            device,
            PyTuple::new(py, branch)?.into_any(),
            awaited.into_bound_py_any(py)?,
            function,
        ],
    )
}

/// The Python exception a work failed with: the node's own, as it raised it (no note added:
/// the run's error adds its own once), or the exception the run's error becomes.
fn error_value(py: Python<'_>, error: &RunError) -> Py<PyAny> {
    let mut error = error;
    // A call whose retries ran out failed, in its last attempt, with that attempt's error.
    while let RunError::Retried { last, .. } = error {
        error = last;
    }
    let raised = if let RunError::NodeFailed { error: failure, .. } = error {
        python_cause(py, failure.cause())
    } else {
        None
    };
    // Taken with its traceback set on it, as Python would hold it, so that a watcher shows
    // where the node failed (on 3.11 an error's traceback is kept beside its value).
    raised
        .unwrap_or_else(|| run_error(py, error, None))
        .into_value(py)
        .into_any()
}
