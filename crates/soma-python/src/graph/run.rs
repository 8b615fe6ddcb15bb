//! Running a graph from Python: the executor a forward or a stream of it runs with, a forward of
//! a graph with async nodes on the event loop Soma keeps, and what a run's outcome is in Python —
//! its value, or the exception it raises.
//!
//! The entry points themselves are methods of the class ([`super::methods`]); what they share
//! with one another and with streams and flows (`stream.rs`, `flow.rs`) is here, so that every
//! run gets the same hooks and ends in the same exceptions.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use soma_core::{Executor, NodeId, Program, Reading, RunError, Watch, STOP_GRACE, WATCH_INTERVAL};

use super::interpreter::interpreter_at;
use super::GraphCore;
use crate::aio;
use crate::cache::{Implementations, PythonCache};
use crate::convert::to_python;
use crate::driver::PythonDriver;
use crate::errors::{panic_error, run_error};
use crate::reading::PythonReading;
use crate::reentry;
use crate::stopped::{cancelled, timed_out};
use crate::trace::PyTrace;
use crate::watch::SignalWatch;

/// What `forward` returns or raises for a run's `outcome`: its result, or its error — a
/// `TimeoutError` past its timeout, a `soma.CancelledError` when its stop flag stopped it, a
/// node's own exception — or a `soma.PanicError`.
pub(super) fn forward_outcome<'py>(
    py: Python<'py>,
    outcome: std::thread::Result<Result<soma_core::Value, RunError>>,
    watch: &SignalWatch,
    timeout: Option<Duration>,
) -> PyResult<Bound<'py, PyAny>> {
    match outcome {
        Ok(Ok(value)) => to_python(py, &value),
        Ok(Err(error)) if watch.timed_out() || matches!(error, RunError::PastDeadline) => {
            Err(timed_out(&error, timeout))
        }
        // A node's own error, met before the flag was seen, is the run's, as it would be
        // without the flag.
        Ok(Err(
            error @ (RunError::Interrupted
            | RunError::Abandoned { .. }
            | RunError::Cancelled { .. }),
        )) if watch.cancelled() => Err(cancelled(py, &error)),
        Ok(Err(error)) => Err(run_error(py, &error, watch.take_raised())),
        Err(payload) => Err(panic_error(py, &*payload)),
    }
}

/// Refuses `what` (`forward`, a stream) of `program`, which has async nodes, on a thread whose
/// event loop is running: it would block the loop, and the nodes could never run on it.
pub(crate) fn refuse_inside_loop(py: Python<'_>, what: &str, program: &Program) -> PyResult<()> {
    if aio::running_loop(py)?.is_none() {
        return Ok(());
    }
    let node = program
        .first_async()
        .map(|node| node.to_string())
        .unwrap_or_default();
    Err(PyRuntimeError::new_err(format!(
        "{what} of a graph with async nodes (`{node}`) was called inside a running event loop, which it would block\nhint: `await g.aforward(x)` runs the graph on this loop without blocking it"
    )))
}

/// `forward` of a graph with async nodes: the run started as a task on the event loop Soma
/// keeps for the process (`soma._run.loop.kept_loop`), in a copy of the caller's context, while the
/// caller waits on the run's outcome — never on the loop — a few milliseconds at a time,
/// looking for Ctrl-C and its deadline between. Stopped (Ctrl-C, the deadline, the stop flag),
/// the run is cancelled; what has not stopped after a short grace is left to finish, its
/// result dropped, and `forward` raises at once, whatever a node does on the loop.
pub(super) fn forward_on_loop<'py>(
    py: Python<'py>,
    program: &Arc<Program>,
    executor: &Executor,
    input: soma_core::Value,
    watch: &Arc<SignalWatch>,
    timeout: Option<Duration>,
) -> PyResult<Bound<'py, PyAny>> {
    refuse_inside_loop(py, "forward", program)?;
    let event_loop = crate::py_modules::kept_loop(py)?
        .getattr(intern!(py, "kept_loop"))?
        .call0()?;
    let tasks = aio::LoopTasks::new(event_loop.unbind());
    let (task, settled) = executor.start(
        program,
        input,
        Arc::clone(&tasks) as Arc<dyn soma_core::Tasks>,
    );
    let (started, raised) = aio::Started::begin(py, &tasks, tasks.background(task))?;
    if let Some(raised) = raised {
        // Ctrl-C landed while the run was handed over: it stops the run, as one seen while
        // waiting does.
        watch.keep(raised);
    }
    // When the watch stopped the run, and what was running then.
    let mut stopped: Option<(std::time::Instant, Vec<NodeId>)> = None;
    loop {
        if crate::exit::detach(py, || settled.wait(WATCH_INTERVAL)) {
            break;
        }
        watch.poll();
        if !watch.interrupted() {
            continue;
        }
        let (since, running) = stopped.get_or_insert_with(|| {
            // Stopped: the run's tasks are cancelled, their async nodes' calls interrupted.
            let running = settled.running();
            if let Some(raised) = started.cancel(py) {
                watch.keep(raised);
            }
            (std::time::Instant::now(), running)
        });
        if since.elapsed() >= STOP_GRACE {
            let error = RunError::Cancelled {
                running: std::mem::take(running),
            };
            return forward_outcome(py, Ok(Err(error)), watch, timeout);
        }
    }
    let outcome = settled.take().expect("a run that is done has settled");
    let outcome = match (stopped, outcome) {
        // What a run stopped by its watch ends with is the stop's doing — a node's own
        // `CancelledError` among it — unless a node failed for a reason of its own.
        (Some((_, running)), Ok(Err(error))) if stopped_by_cancel(py, &error) => {
            Ok(Err(RunError::Cancelled { running }))
        }
        (_, outcome) => outcome,
    };
    forward_outcome(py, outcome, watch, timeout)
}

/// Whether `error` is what cancelling a run leaves: its branches stopped at a boundary, or an
/// async node's call ended by the `CancelledError` thrown into it (past the run's deadline, the
/// engine calls that the deadline's).
fn stopped_by_cancel(py: Python<'_>, error: &RunError) -> bool {
    match error {
        RunError::Interrupted
        | RunError::Cancelled { .. }
        | RunError::Abandoned { .. }
        | RunError::PastDeadline => true,
        RunError::NodeFailed { error, .. } => error
            .cause()
            .and_then(|cause| cause.downcast_ref::<PyErr>())
            .is_some_and(|raised| {
                py.import("asyncio")
                    .and_then(|asyncio| asyncio.getattr("CancelledError"))
                    .is_ok_and(|cancelled| raised.is_instance(py, &cancelled))
            }),
        RunError::Retried { last, .. } => stopped_by_cancel(py, last),
        RunError::NoDriver { .. }
        | RunError::DriverFailed { .. }
        | RunError::WrongResultCount { .. }
        | RunError::TurnLimit { .. }
        | RunError::Invalid(_)
        | RunError::NoThread { .. }
        | RunError::NoTask { .. }
        | RunError::TimeLimit { .. }
        | RunError::NotAList { .. }
        | RunError::UnknownCase { .. }
        | RunError::LoopLimit { .. }
        | RunError::NeedsLoop { .. } => false,
    }
}

/// The executor of a forward or a stream of `program` (of `graph`): `forward`'s own arguments,
/// its cache among them (one run's, or each item's, keyed on its own input), the run's watch,
/// the interpreter as host at this thread's nesting depth, and the reading of Python values when
/// the program has steps that decide; for one run (`one_run`: `forward`'s, `aforward`'s), a
/// board of its nodes' states when the observer installed keeps boards.
#[allow(clippy::too_many_arguments)] // `forward`'s own keywords, each passed through.
pub(crate) fn executor_for(
    program: &Arc<Program>,
    one_run: bool,
    graph: &Bound<'_, GraphCore>,
    watch: &Arc<SignalWatch>,
    driver: Option<&Bound<'_, PyAny>>,
    turn_limit: u32,
    trace: Option<&Bound<'_, PyTrace>>,
    cache: Option<&Bound<'_, PyAny>>,
) -> PyResult<Executor> {
    let mut executor = Executor::new()
        .with_turn_limit(turn_limit)
        .with_watch(Arc::clone(watch) as Arc<dyn soma_core::Watch>)
        .with_host(interpreter_at(reentry::depth()));
    // Only a program that decides reads values through it: any other runs as it did.
    if program.decides() {
        executor = executor.with_reading(python_reading());
    }
    if let Some(driver) = driver {
        executor = executor.with_driver(Arc::new(PythonDriver::new(driver)?));
    }
    if let Some(trace) = trace {
        executor = executor.with_trace(Arc::clone(&trace.get().trace));
    }
    executor =
        crate::observer::observed(executor, graph.as_any(), watch, one_run.then_some(program))?;
    if let Some(cache) = cache {
        executor = executor.with_cache(Arc::new(GraphCore::run_cache(graph, cache)?));
    }
    Ok(executor)
}

/// The one reading of Python values every executor shares.
fn python_reading() -> Arc<dyn Reading> {
    static READING: OnceLock<Arc<dyn Reading>> = OnceLock::new();
    Arc::clone(READING.get_or_init(|| Arc::new(PythonReading)))
}

impl GraphCore {
    /// The run cache `cache` (a `soma.Cache`) opens for one run of this graph, which finds its
    /// nodes by their ids here.
    pub(crate) fn run_cache(
        slf: &Bound<'_, Self>,
        cache: &Bound<'_, PyAny>,
    ) -> PyResult<PythonCache> {
        let core = slf.clone().unbind();
        let implementations: Implementations =
            Box::new(move |py, id| core.get().implementation(py, id).ok());
        PythonCache::of(cache, slf.as_any(), implementations)
    }
}
