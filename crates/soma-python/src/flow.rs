//! `soma._soma.FlowCore`: a stream of a graph with async nodes — `map`, `amap`, micro-batches —
//! each item a run of the engine's on an event loop ([`soma_core::Flow`]).
//!
//! The engine keeps the bound, the order, the error rule and each node's concurrency; this is
//! the glue. For `map` (and micro-batches) the reader is a thread of its own: it reads the
//! inputs there, with the GIL it holds, starts each item on the loop Soma keeps
//! (`soma._run.loop.kept_loop`) in a copy of its context, and waits for results a few milliseconds
//! at a time, looking for Ctrl-C and the stream's deadline between — the answers are those of
//! `StreamCore`, so `soma._run.stream.Stream` reads either alike. For `amap` the reader is a
//! coroutine on the running loop (`soma._graph`'s `amap`, which reads inputs that may be async
//! iterables): it starts items on that loop ([`FlowCore::start`]) and awaits the next result
//! ([`FlowCore::next`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::Waker;
use std::time::{Duration, Instant};

use pyo3::exceptions::{PyException, PyRuntimeError, PyStopIteration, PyTimeoutError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyIterator, PyList, PyTuple};
use soma_core::{
    Flow, FlowSettings, ItemOutcome, NodeId, OnError, RunError, Value, Watch, STOP_GRACE,
    WATCH_INTERVAL,
};

use crate::aio::{self, LoopTasks, Started, Wake};
use crate::convert::{to_python, wrap};
use crate::errors::{panic_error, run_error};
use crate::graph::{executor_for, refuse_inside_loop, GraphCore};
use crate::trace::PyTrace;
use crate::watch::SignalWatch;

struct Streaming {
    flow: Arc<Flow>,
    tasks: Arc<LoopTasks>,
    /// The inputs, read by the reader's thread (`map`); `None` once read to their end, or for
    /// `amap`, whose coroutine reads them.
    inputs: Option<Py<PyIterator>>,
    watch: Arc<SignalWatch>,
    timeout: Option<Duration>,
    deadline: Option<Instant>,
    /// An ordinary exception the inputs raised, raised once the items read before it are out.
    raised_later: Option<PyErr>,
    read: u64,
    succeeded: u64,
    failed: u64,
    waiting: Duration,
    ended: bool,
}

#[pyclass(frozen, module = "soma._soma")]
pub struct FlowCore {
    streaming: Mutex<Option<Streaming>>,
}

fn busy() -> PyErr {
    PyRuntimeError::new_err(
        "this stream is being read by another thread\nhint: read a stream from one thread at a time",
    )
}

impl FlowCore {
    fn lock(&self) -> PyResult<MutexGuard<'_, Option<Streaming>>> {
        match self.streaming.try_lock() {
            Ok(guard) => Ok(guard),
            Err(TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => Err(busy()),
        }
    }
}

#[pymethods]
impl FlowCore {
    /// A stream of `graph`'s runs over `inputs` (`None` for `amap`, whose reader starts each
    /// item itself), on the loop Soma keeps, or on the running loop when `on_running_loop`.
    #[new]
    #[pyo3(signature = (graph, inputs, in_flight, ordered, stop_on_error, concurrency, driver=None, turn_limit=soma_core::DEFAULT_TURN_LIMIT, trace=None, timeout=None, cache=None, on_running_loop=false))]
    #[allow(clippy::too_many_arguments)] // Python's keywords, passed on as they are.
    #[allow(clippy::fn_params_excessive_bools)]
    fn new(
        py: Python<'_>,
        graph: &Bound<'_, GraphCore>,
        inputs: Option<&Bound<'_, PyAny>>,
        in_flight: usize,
        ordered: bool,
        stop_on_error: bool,
        concurrency: Vec<(String, usize)>,
        driver: Option<&Bound<'_, PyAny>>,
        turn_limit: u32,
        trace: Option<&Bound<'_, PyTrace>>,
        timeout: Option<f64>,
        cache: Option<&Bound<'_, PyAny>>,
        on_running_loop: bool,
    ) -> PyResult<Self> {
        let timeout = timeout.map(crate::stopped::time_limit).transpose()?;
        let program = graph.get().program(py)?;
        let event_loop = if on_running_loop {
            aio::running_loop(py)?.ok_or_else(|| {
                PyRuntimeError::new_err("amap was iterated with no running event loop")
            })?
        } else {
            refuse_inside_loop(py, "map", &program)?;
            crate::py_modules::kept_loop(py)?
                .getattr(intern!(py, "kept_loop"))?
                .call0()?
        };
        let watch = Arc::new(SignalWatch::new(timeout, None));
        let executor = executor_for(
            &program, false, graph, &watch, driver, turn_limit, trace, cache,
        )?;
        let mut settings = FlowSettings::new(in_flight).with_on_error(if stop_on_error {
            OnError::Stop
        } else {
            OnError::Continue
        });
        if !ordered {
            settings = settings.unordered();
        }
        for (node, items) in concurrency {
            settings = settings.with_concurrency(NodeId::from(node.as_str()), items);
        }
        let tasks = LoopTasks::new(event_loop.unbind());
        let flow = Flow::new(
            executor,
            &program,
            settings,
            Arc::clone(&tasks) as Arc<dyn soma_core::Tasks>,
        );
        Ok(FlowCore {
            streaming: Mutex::new(Some(Streaming {
                flow,
                tasks,
                inputs: inputs
                    .map(|inputs| inputs.try_iter().map(Bound::unbind))
                    .transpose()?,
                watch,
                timeout,
                deadline: timeout.and_then(|timeout| Instant::now().checked_add(timeout)),
                raised_later: None,
                read: 0,
                succeeded: 0,
                failed: 0,
                waiting: Duration::ZERO,
                ended: false,
            })),
        })
    }

    /// The next item as `(index, value, None)`, or `(index, None, (exception, node, input))`
    /// for an item that failed; `None` at the end. Raises what stops the whole stream: the
    /// inputs' exception, Ctrl-C, its deadline's `TimeoutError`.
    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let mut guard = self.lock()?;
        let Some(streaming) = guard.as_mut() else {
            return Ok(None);
        };
        if streaming.ended {
            return Ok(None);
        }
        let next = streaming.next_on_this_thread(py);
        if next.is_err() {
            streaming.stop(py, STOP_GRACE);
        }
        next
    }

    /// The inputs raised `raised` (`amap`, whose coroutine reads them): held as `map` holds
    /// it, and raised by the awaitable of the last item ([`Streaming::inputs_raised`]); raised
    /// here when it stops the stream at once.
    fn inputs_raised(&self, py: Python<'_>, raised: Bound<'_, PyAny>) -> PyResult<()> {
        let raised = PyErr::from_value(raised);
        let mut guard = self.lock()?;
        match guard.as_mut() {
            Some(streaming) if !streaming.ended => streaming.inputs_raised(py, raised),
            Some(_) | None => Err(raised),
        }
    }

    /// Whether another item may start (`amap`).
    fn has_room(&self) -> PyResult<bool> {
        Ok(self
            .lock()?
            .as_ref()
            .is_some_and(|streaming| !streaming.ended && streaming.flow.has_room()))
    }

    /// Starts an item on `input`, as a task of the running loop (`amap`), in a copy of the
    /// current context.
    fn start(&self, input: Bound<'_, PyAny>) -> PyResult<()> {
        let mut guard = self.lock()?;
        let Some(streaming) = guard.as_mut() else {
            return Ok(());
        };
        streaming.read += 1;
        let (index, task) = streaming.flow.start(wrap(input));
        let spawned = soma_core::Tasks::spawn(&*streaming.tasks, task).map_err(|reason| {
            PyRuntimeError::new_err(format!("the loop refused a task: {reason}"))
        })?;
        streaming.flow.keep(index, spawned);
        Ok(())
    }

    /// The next item (`amap`), as `__next__` gives it, or `None` at the end: an awaitable on
    /// the running loop. `inputs_done`: no item will start any more, so an empty flow is the
    /// end.
    fn next(slf: Py<Self>, inputs_done: bool) -> FlowNext {
        FlowNext {
            core: slf,
            awaits: Awaits::Item { inputs_done },
            wake: Mutex::new(None),
        }
    }

    /// The stream stopped (`amap`, leaving early): its items in flight cancelled, and an
    /// awaitable that is done once they have ended.
    fn stopped(slf: Py<Self>, py: Python<'_>) -> PyResult<FlowNext> {
        slf.get().abandon(py)?;
        Ok(FlowNext {
            core: slf,
            awaits: Awaits::Ended,
            wake: Mutex::new(None),
        })
    }

    /// Seconds until the stream's deadline, if it has one (`amap`, to bound its reads).
    fn time_left(&self) -> PyResult<Option<f64>> {
        Ok(self.lock()?.as_ref().and_then(|streaming| {
            streaming.deadline.map(|deadline| {
                deadline
                    .saturating_duration_since(Instant::now())
                    .as_secs_f64()
            })
        }))
    }

    /// The stream past its deadline (`amap`, whose read of an input outlasted it): its items
    /// in flight cancelled; the `TimeoutError` to raise.
    fn timed_out(&self, py: Python<'_>) -> PyResult<PyErr> {
        let mut guard = self.lock()?;
        let Some(streaming) = guard.as_mut() else {
            return Ok(PyTimeoutError::new_err(
                "the stream did not finish within its timeout",
            ));
        };
        let running = streaming.stop(py, Duration::ZERO);
        Ok(streaming.timed_out_with(&RunError::Cancelled { running }))
    }

    /// Stops the stream: its items in flight cancelled, waited for until they end.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = self.lock()?;
        if let Some(streaming) = guard.as_mut() {
            streaming.stop(py, Duration::MAX);
            if let Some(raised) = streaming.watch.take_raised() {
                return Err(raised);
            }
        }
        Ok(())
    }

    /// Stops the stream as dropping it does: its items in flight cancelled, without waiting.
    fn abandon(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = self.lock()?;
        if let Some(streaming) = guard.as_mut() {
            streaming.stop(py, Duration::ZERO);
        }
        Ok(())
    }

    /// The stream's figures so far, as a dict; `None` while another thread reads the stream.
    fn figures<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Ok(guard) = self.lock() else {
            return Ok(None);
        };
        let Some(streaming) = guard.as_ref() else {
            return Ok(None);
        };
        let dict = PyDict::new(py);
        dict.set_item("read", streaming.read)?;
        dict.set_item("succeeded", streaming.succeeded)?;
        dict.set_item("failed", streaming.failed)?;
        dict.set_item(
            "in_flight",
            streaming.read - streaming.succeeded - streaming.failed,
        )?;
        dict.set_item("waiting", streaming.waiting.as_secs_f64())?;
        dict.set_item("stages", PyList::empty(py))?;
        Ok(Some(dict))
    }
}

impl Drop for FlowCore {
    /// Dropped unfinished: its items in flight are cancelled.
    fn drop(&mut self) {
        let streaming = self
            .streaming
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(streaming) = streaming {
            if !streaming.ended {
                streaming.flow.cancel();
            }
        }
    }
}

impl Streaming {
    /// `__next__` for a reader on its own thread.
    fn next_on_this_thread<'py>(
        &mut self,
        py: Python<'py>,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        loop {
            self.check_deadline(py)?;
            self.fill(py)?;
            if let Some((index, input, outcome)) = self.flow.next() {
                return self.handed(py, index, &input, outcome).map(Some);
            }
            if self.flow.is_empty() && (self.inputs.is_none() || self.flow.is_stopped()) {
                return self.end_or_raised().map(|()| None);
            }
            let began = Instant::now();
            let flow = Arc::clone(&self.flow);
            crate::exit::detach(py, || flow.wait(WATCH_INTERVAL));
            self.waiting += began.elapsed();
            self.watch.poll();
            if let Some(raised) = self.watch.take_raised() {
                return Err(raised);
            }
        }
    }

    /// Reads inputs, on this thread, while the flow has room, each item started on the kept
    /// loop in a copy of this thread's context.
    fn fill(&mut self, py: Python<'_>) -> PyResult<()> {
        while self.flow.has_room() {
            let Some(inputs) = &self.inputs else {
                return Ok(());
            };
            let Some(item) = crate::exit::next(inputs.bind(py)) else {
                self.inputs = None;
                return Ok(());
            };
            let item = match item {
                Ok(item) => item,
                Err(raised) => {
                    self.inputs = None;
                    return self.inputs_raised(py, raised);
                }
            };
            self.read += 1;
            let (index, task) = self.flow.start(wrap(item));
            let (started, raised) = Started::begin(py, &self.tasks, self.tasks.background(task))?;
            // Kept before a Ctrl-C that landed while it was handed over is raised: the stream's
            // end cancels it with the rest.
            self.flow.keep(index, Box::new(started));
            if let Some(raised) = raised {
                return Err(raised);
            }
        }
        Ok(())
    }

    /// The inputs raised `raised`, and end there. A `KeyboardInterrupt` (or `SystemExit`)
    /// stops the stream at once: returned to raise now. An ordinary exception waits for the
    /// items read before it to come out ([`Streaming::end_or_raised`]), as a stream of sync
    /// nodes reads an exception as the end of its inputs and raises it after.
    fn inputs_raised(&mut self, py: Python<'_>, raised: PyErr) -> PyResult<()> {
        if !raised.is_instance_of::<PyException>(py) || self.flow.is_empty() {
            return Err(raised);
        }
        self.raised_later = Some(raised);
        Ok(())
    }

    /// At the end of the items: the inputs' exception held until now, if they raised one;
    /// the stream is over either way.
    fn end_or_raised(&mut self) -> PyResult<()> {
        self.ended = true;
        self.raised_later.take().map_or(Ok(()), Err)
    }

    /// Past the deadline, even with results ready: the items in flight cancelled, and the
    /// stream over with a `TimeoutError` naming the nodes that were running.
    fn check_deadline(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.watch.interrupted() || !self.watch.timed_out() {
            return Ok(());
        }
        let running = self.stop(py, STOP_GRACE);
        Err(self.timed_out_with(&RunError::Cancelled { running }))
    }

    fn timed_out_with(&self, error: &RunError) -> PyErr {
        crate::stopped::past_timeout(
            "the stream",
            self.timeout,
            &crate::stopped::left_behind(error),
        )
    }

    /// What `__next__` answers for item `index`.
    fn handed<'py>(
        &mut self,
        py: Python<'py>,
        index: u64,
        input: &Value,
        outcome: ItemOutcome,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let error = match outcome {
            Ok(Ok(value)) => {
                self.succeeded += 1;
                return PyTuple::new(
                    py,
                    [
                        index.into_pyobject(py)?.into_any(),
                        to_python(py, &value)?,
                        py.None().into_bound(py),
                    ],
                );
            }
            Ok(Err(error)) => error,
            Err(payload) => return Err(panic_error(py, &*payload)),
        };
        self.failed += 1;
        let exception = run_error(py, &error, self.watch.take_raised());
        let node = match error.node() {
            Some(node) => node.as_str().into_pyobject(py)?.into_any(),
            None => py.None().into_bound(py),
        };
        let failure = PyTuple::new(
            py,
            [
                exception.into_value(py).into_bound(py).into_any(),
                node,
                to_python(py, input)?,
            ],
        )?;
        PyTuple::new(
            py,
            [
                index.into_pyobject(py)?.into_any(),
                py.None().into_bound(py),
                failure.into_any(),
            ],
        )
    }

    /// Ends the stream: its items in flight cancelled; waits `wait` at most for them to end;
    /// the nodes that were running.
    fn stop(&mut self, py: Python<'_>, wait: Duration) -> Vec<NodeId> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        self.inputs = None;
        let running = self.flow.cancel();
        if !wait.is_zero() {
            let flow = Arc::clone(&self.flow);
            crate::exit::detach(py, || flow.wait_cancelled(wait));
        }
        running
    }
}

/// What an `amap` awaits: the next item, or the end of the items it cancelled.
#[pyclass(frozen, module = "soma._soma")]
pub struct FlowNext {
    core: Py<FlowCore>,
    awaits: Awaits,
    wake: Mutex<Option<Arc<Wake>>>,
}

/// What a [`FlowNext`] waits for.
enum Awaits {
    /// The next item; with `inputs_done`, none will start any more.
    Item { inputs_done: bool },
    /// The cancelled items' end.
    Ended,
}

#[pymethods]
impl FlowNext {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.step(py)
    }

    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.step(py)
    }

    #[pyo3(signature = (kind, value=None, _traceback=None))]
    fn throw(
        &self,
        py: Python<'_>,
        kind: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        // Cancelled (the caller's task, a timeout around it): the stream ends, its items
        // cancelled, and the error goes on.
        let _ = self.core.get().abandon(py);
        Err(match value.filter(|value| !value.is_none()) {
            Some(value) => PyErr::from_value(value.clone()),
            None => PyErr::from_value(kind.call0()?),
        })
    }

    /// Closed before its end: nothing to let go of (the stream ends with its reader).
    #[allow(clippy::unused_self)] // The coroutine protocol's method, on the instance.
    fn close(&self) {}
}

impl FlowNext {
    /// The waker of this awaitable, made on its first wait.
    fn wake(&self, streaming: &Streaming) -> Arc<Wake> {
        Arc::clone(
            self.wake
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert_with(|| Wake::new(Arc::clone(streaming.tasks.mailbox()))),
        )
    }

    fn step(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let core = self.core.get();
        let mut guard = core.lock()?;
        let Some(streaming) = guard.as_mut() else {
            return Err(PyStopIteration::new_err((py.None(),)));
        };
        let inputs_done = match self.awaits {
            Awaits::Item { inputs_done } => inputs_done,
            Awaits::Ended => {
                let wake = self.wake(streaming);
                wake.rearm();
                if streaming
                    .flow
                    .wake_when_cancelled_ended(&Waker::from(Arc::clone(&wake)))
                {
                    return Err(PyStopIteration::new_err((py.None(),)));
                }
                drop(guard);
                return Ok(wake.arm(py)?.unwrap_or_else(|| py.None()));
            }
        };
        if streaming.ended {
            return Err(PyStopIteration::new_err((py.None(),)));
        }
        if streaming.watch.interrupted() && streaming.watch.timed_out() {
            let running = streaming.stop(py, Duration::ZERO);
            return Err(streaming.timed_out_with(&RunError::Cancelled { running }));
        }
        if let Some((index, input, outcome)) = streaming.flow.next() {
            let handed = streaming.handed(py, index, &input, outcome)?;
            return Err(PyStopIteration::new_err((handed.unbind(),)));
        }
        if streaming.flow.is_empty() && (inputs_done || streaming.flow.is_stopped()) {
            streaming.end_or_raised()?;
            return Err(PyStopIteration::new_err((py.None(),)));
        }
        let wake = self.wake(streaming);
        wake.rearm();
        let waker = Waker::from(Arc::clone(&wake));
        streaming.flow.wake_when_ready(&waker);
        let flow_deadline = streaming.deadline;
        let loop_object = streaming.tasks.loop_object().clone_ref(py);
        drop(guard);
        let waiter = wake.arm(py)?;
        if let (Some(waiter), Some(deadline)) = (&waiter, flow_deadline) {
            // Woken at the deadline too, to raise it.
            let left = deadline
                .saturating_duration_since(Instant::now())
                .as_secs_f64();
            let set = crate::py_modules::kept_loop(py)?.getattr(intern!(py, "set_unless_done"))?;
            loop_object
                .bind(py)
                .call_method1(intern!(py, "call_later"), (left, set, waiter.bind(py)))?;
        }
        Ok(waiter.unwrap_or_else(|| py.None()))
    }
}
