//! `soma._soma.StreamCore`: a Python iterable streamed through a graph's program.
//!
//! The engine's [`Stream`] does the work; this is the glue. The Python iterable is read on the
//! thread that asks for the next result, with the GIL that thread holds already, so a generator
//! is never touched by two threads. The wait for a result gives the GIL back and polls for
//! signals ([`SignalWatch`]), so Ctrl-C while iterating raises `KeyboardInterrupt` within a few
//! milliseconds; a `timeout` is a deadline for the whole stream, read by the same watch, and
//! comes out as a `TimeoutError` naming what was still running. `python/soma/_run/stream.py` turns
//! what `__next__` answers into results, `Failed` records or raised exceptions, as the user's
//! `on_error` asks.

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::Duration;

use pyo3::exceptions::{PyException, PyRuntimeError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyList, PyTuple};
use pyo3::PyTraverseError;
use soma_core::{NodeId, OnError, RunError, Stream, StreamError, StreamSettings, Value};

use crate::convert::{to_python, wrap};
use crate::device_queues::Scope;
use crate::errors::{panic_error, run_error};
use crate::graph::{executor_for, GraphCore};
use crate::trace::PyTrace;
use crate::watch::SignalWatch;

/// The user's iterable, read one item at a time; an exception it raises is kept for the caller
/// and ends the input, so the items before it still come out first.
struct PyInputs {
    iterator: Py<PyIterator>,
    raised: Arc<Mutex<Option<PyErr>>>,
}

impl Iterator for PyInputs {
    type Item = Value;

    fn next(&mut self) -> Option<Value> {
        // The engine reads inputs on the thread that asked for a result, which holds the GIL.
        crate::exit::attach(|py| match crate::exit::next(self.iterator.bind(py)) {
            None => None,
            Some(Ok(item)) => Some(wrap(item)),
            Some(Err(raised)) => {
                *self.raised.lock().unwrap_or_else(PoisonError::into_inner) = Some(raised);
                None
            }
        })
    }
}

struct Running {
    stream: Stream<PyInputs>,
    watch: Arc<SignalWatch>,
    raised: Arc<Mutex<Option<PyErr>>>,
    /// The stream's time limit, for its error.
    timeout: Option<Duration>,
}

#[pyclass(frozen, module = "soma._soma", name = "StreamCore")]
pub struct StreamCore {
    running: Mutex<Option<Running>>,
}

fn busy() -> PyErr {
    PyRuntimeError::new_err(
        "this stream is being read by another thread\nhint: read a stream from one thread at a time",
    )
}

#[pymethods]
impl StreamCore {
    #[new]
    #[pyo3(signature = (graph, inputs, in_flight, ordered, stop_on_error, concurrency, driver=None, turn_limit=soma_core::DEFAULT_TURN_LIMIT, trace=None, timeout=None, cache=None))]
    #[allow(clippy::too_many_arguments)] // Python's keywords, passed on as they are.
    #[allow(clippy::fn_params_excessive_bools)]
    fn new(
        py: Python<'_>,
        graph: &Bound<'_, GraphCore>,
        inputs: &Bound<'_, PyAny>,
        in_flight: usize,
        ordered: bool,
        stop_on_error: bool,
        concurrency: Vec<(String, usize)>,
        driver: Option<&Bound<'_, PyAny>>,
        turn_limit: u32,
        trace: Option<&Bound<'_, PyTrace>>,
        timeout: Option<f64>,
        cache: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let timeout = timeout.map(crate::stopped::time_limit).transpose()?;
        let program = graph.get().program(py)?;
        let iterator = inputs.try_iter()?.unbind();
        let watch = Arc::new(SignalWatch::new(timeout, None));
        let executor = executor_for(
            &program, false, graph, &watch, driver, turn_limit, trace, cache,
        )?;
        let mut settings = StreamSettings::default()
            .with_in_flight(in_flight)
            .with_on_error(if stop_on_error {
                OnError::Stop
            } else {
                OnError::Continue
            })
            // Its stages run at the depth of the run that opened it, as a wave's branches do.
            .with_executor(executor);
        if !ordered {
            settings = settings.unordered();
        }
        for (node, workers) in concurrency {
            settings = settings.with_concurrency(NodeId::from(node.as_str()), workers);
        }
        let raised = Arc::new(Mutex::new(None));
        let inputs = PyInputs {
            iterator,
            raised: Arc::clone(&raised),
        };
        // Its stages capture the caller's context when it starts: without the device queues of
        // a forward this stream may be opened in.
        let outside = Scope::outside();
        let stream = Stream::start(program, inputs, settings);
        drop(outside);
        Ok(StreamCore {
            running: Mutex::new(Some(Running {
                stream,
                watch,
                raised,
                timeout,
            })),
        })
    }

    /// The next item as `(index, value, None)`, or `(index, None, (exception, node, input))`
    /// for an item that failed; `None` at the end. Raises what stops the whole stream.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let mut guard = match self.running.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(busy()),
        };
        let Some(running) = guard.as_mut() else {
            return Ok(None);
        };
        let next = panic::catch_unwind(AssertUnwindSafe(|| running.stream.next()));
        // A `KeyboardInterrupt` (or `SystemExit`) from the inputs stops the stream at once; an
        // ordinary exception waits for the items read before it to come out.
        let stop_now = running
            .raised
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|raised| !raised.is_instance_of::<PyException>(py));
        if stop_now || matches!(next, Ok(None)) {
            let raised = running
                .raised
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some(raised) = raised {
                running.stream.close();
                return Err(raised);
            }
        }
        match next {
            Err(payload) => Err(panic_error(py, &*payload)),
            Ok(None) => Ok(None),
            Ok(Some(Ok((index, value)))) => {
                let value = to_python(py, &value)?;
                Ok(Some(PyTuple::new(
                    py,
                    [
                        index.into_pyobject(py)?.into_any(),
                        value,
                        py.None().into_bound(py),
                    ],
                )?))
            }
            Ok(Some(Err(StreamError::Item(failed)))) => {
                let exception = run_error(py, &failed.error, running.watch.take_raised());
                let node = match failed.error.node() {
                    Some(node) => node.as_str().into_pyobject(py)?.into_any(),
                    None => py.None().into_bound(py),
                };
                let failure = PyTuple::new(
                    py,
                    [
                        exception.into_value(py).into_bound(py).into_any(),
                        node,
                        to_python(py, &failed.input)?,
                    ],
                )?;
                Ok(Some(PyTuple::new(
                    py,
                    [
                        failed.index.into_pyobject(py)?.into_any(),
                        py.None().into_bound(py),
                        failure.into_any(),
                    ],
                )?))
            }
            Ok(Some(Err(StreamError::Stopped(error)))) if running.watch.timed_out() => {
                Err(timed_out(&error, &running.stream, running.timeout))
            }
            Ok(Some(Err(StreamError::Stopped(error)))) => {
                Err(run_error(py, &error, running.watch.take_raised()))
            }
        }
    }

    /// Shows the garbage collector the inputs the stream reads (inputs that hold their own
    /// stream make a cycle). Skipped while another thread
    /// reads the stream: the collector then keeps it alive this time, which is safe.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(running) = self.running.try_lock() {
            if let Some(running) = running.as_ref() {
                visit.call(&running.stream.inputs().iterator)?;
            }
        }
        Ok(())
    }

    /// Closes the stream and lets go of its inputs, breaking the cycle the collector found.
    fn __clear__(&self) {
        let taken = match self.running.try_lock() {
            Ok(mut running) => running.take(),
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().take(),
            Err(TryLockError::WouldBlock) => None,
        };
        drop(taken);
    }

    /// Stops the stream as dropping it does: waits a second at most for a node still running,
    /// then leaves it to finish on its thread, and never looks for signals (for the exit of the
    /// interpreter, which a stuck node must not hold, nor a Ctrl-C meant for it be taken).
    fn abandon(&self) -> PyResult<()> {
        let taken = match self.running.try_lock() {
            Ok(mut running) => running.take(),
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner().take(),
            Err(TryLockError::WouldBlock) => return Err(busy()),
        };
        drop(taken);
        Ok(())
    }

    /// Stops the stream and gives its threads back; what was in flight is dropped.
    fn close(&self) -> PyResult<()> {
        let mut guard = match self.running.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(busy()),
        };
        if let Some(running) = guard.as_mut() {
            running.stream.close();
            // Ctrl-C while closing waited for a node: it comes out here.
            if let Some(raised) = running.watch.take_raised() {
                return Err(raised);
            }
        }
        Ok(())
    }

    /// The stream's figures so far, as a dict; `None` while another thread reads the stream.
    fn figures<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let figures = match self.running.try_lock() {
            Ok(guard) => guard.as_ref().map(|running| running.stream.figures()),
            Err(TryLockError::Poisoned(poisoned)) => {
                poisoned.into_inner().as_ref().map(|r| r.stream.figures())
            }
            Err(TryLockError::WouldBlock) => None,
        };
        let Some(figures) = figures else {
            return Ok(None);
        };
        let dict = PyDict::new(py);
        dict.set_item("read", figures.read)?;
        dict.set_item("succeeded", figures.succeeded)?;
        dict.set_item("failed", figures.failed)?;
        dict.set_item("in_flight", figures.in_flight)?;
        dict.set_item("waiting", figures.waiting.as_secs_f64())?;
        let stages = PyList::empty(py);
        for stage in &figures.stages {
            let entry = PyDict::new(py);
            let nodes: Vec<&str> = stage.nodes.iter().map(NodeId::as_str).collect();
            entry.set_item("nodes", nodes)?;
            entry.set_item("workers", stage.workers)?;
            entry.set_item("items", stage.items)?;
            entry.set_item("busy", stage.busy.as_secs_f64())?;
            entry.set_item("waiting", stage.waiting.as_secs_f64())?;
            entry.set_item("blocked", stage.blocked.as_secs_f64())?;
            stages.append(entry)?;
        }
        dict.set_item("stages", stages)?;
        Ok(Some(dict))
    }
}

/// The `TimeoutError` of a stream whose time ran out, naming what was still running: each
/// stage left running, one node, or a wave of which one or more nodes were.
fn timed_out<I: Iterator<Item = Value>>(
    error: &RunError,
    stream: &Stream<I>,
    timeout: Option<Duration>,
) -> PyErr {
    let named = |nodes: &[NodeId]| -> String {
        let names: Vec<String> = nodes.iter().map(|id| format!("`{id}`")).collect();
        match names.as_slice() {
            [one] => one.clone(),
            several => format!("one or more of the wave {}", several.join(", ")),
        }
    };
    let still = match error {
        RunError::Abandoned { .. } | RunError::Interrupted if !stream.left_running().is_empty() => {
            let stages: Vec<String> = stream.left_running().iter().map(|s| named(s)).collect();
            format!(
                "; still running: {} (left to finish in the background, their items dropped)",
                stages.join("; ")
            )
        }
        RunError::Abandoned { .. } | RunError::Interrupted => {
            "; every stage stopped at a node boundary".to_owned()
        }
        other => format!("; the stream had failed too: {other}"),
    };
    crate::stopped::past_timeout("the stream", timeout, &still)
}
