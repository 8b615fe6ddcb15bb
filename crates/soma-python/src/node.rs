//! Python objects as nodes.
//!
//! A node's call attaches to the interpreter; a branch thread already holds the GIL from one
//! Python node to the next (see `graph/mod.rs`) and gives it back wherever the engine blocks, so
//! the branches of a wave take turns at the GIL and really overlap wherever a node's work
//! releases it (numpy, torch, I/O, a driver's wait).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pyo3::exceptions::{PyException, PyKeyboardInterrupt, PyStopIteration, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyTuple, PyType};
use pyo3::PyTypeInfo;
use soma_core::{Call, Ctx, Device, Node, NodeError, NodeId, Transition, Value};

use crate::aio;
use crate::convert::{to_python, wrap, wrap_into, wrapped};
use crate::device;
use crate::exit::Sent;
use crate::protocol::{Await, Done, PyCtx};
use crate::watch::note_interrupt;

/// `callable(arg, ...)` by the interpreter's vectorcall ([`crate::exit::call`]).
macro_rules! call {
    ($callable:expr, $($arg:expr),+) => {{
        let callable: &Bound<'_, PyAny> = $callable;
        crate::exit::call(callable, &[$($arg.as_ptr()),+])
    }};
}

/// A Python object with a `forward(x)` or `forward(x, ctx)` method; `async def forward` makes
/// it an async node, whose calls are coroutines the engine steps on the loop ([`Coroutine`]).
pub struct PythonNode {
    callee: Callee,
    takes_ctx: bool,
    is_async: bool,
}

/// What a node calls, looked up once at registration; it keeps the object alive.
enum Callee {
    /// A method bound the ordinary way, kept as its function and the object it is bound to and
    /// called as `function(object, x)`, which is what calling the bound method does: without
    /// reading the bound method's memory on every call (a cache miss per node once a graph is
    /// larger than the caches), and without keeping a bound method per node, one more object
    /// for the garbage collector to walk in a graph of a million nodes.
    Method {
        function: Py<PyAny>,
        object: Py<PyAny>,
    },
    /// Any other callable: a function set on the instance, a `staticmethod`, an object with
    /// `__call__`.
    Other(Py<PyAny>),
}

impl PythonNode {
    /// The node calling `forward`, the object's `forward` as registration looked it up; an
    /// async node when `forward` is a coroutine function.
    pub fn new(forward: Bound<'_, PyAny>, takes_ctx: bool, is_async: bool) -> PyResult<Self> {
        // Looked up once: importing `types` for every node cost registration about 1 µs.
        static BOUND_METHOD: PyOnceLock<Py<PyType>> = PyOnceLock::new();
        let py = forward.py();
        let bound_method = BOUND_METHOD.import(py, "types", "MethodType")?;
        let callee = if forward.get_type().is(bound_method) {
            Callee::Method {
                function: forward.getattr(intern!(py, "__func__"))?.unbind(),
                object: forward.getattr(intern!(py, "__self__"))?.unbind(),
            }
        } else {
            Callee::Other(forward.unbind())
        };
        Ok(PythonNode {
            callee,
            takes_ctx,
            is_async,
        })
    }

    /// A sync node's call, `call`, attached to the interpreter, its exception told to the
    /// engine.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn attached(
        call: impl for<'py> FnOnce(Python<'py>) -> PyResult<Transition>,
    ) -> Result<Transition, NodeError> {
        crate::exit::attach(|py| {
            call(py).map_err(|raised| {
                if raised.is_instance_of::<PyKeyboardInterrupt>(py) {
                    note_interrupt();
                }
                node_failure(py, raised)
            })
        })
    }

    /// Shows the garbage collector the Python references this node holds.
    pub fn traverse(&self, visit: &pyo3::gc::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        match &self.callee {
            Callee::Method { function, object } => {
                visit.call(function)?;
                visit.call(object)
            }
            Callee::Other(forward) => visit.call(forward),
        }
    }

    /// Calls `forward` on `input` with the node's device current, put back after whether it
    /// returned or raised: what it returned.
    // Inlined into `forward`, with `answered`: a sync node's call is the hot path of every run.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn called<'py>(
        &self,
        py: Python<'py>,
        input: &Value,
        ctx: &Ctx<'_>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(placed) = ctx.device() else {
            return self.invoke(py, input, ctx);
        };
        let restore = device::enter(py, placed)?;
        let out = self.invoke(py, input, ctx);
        let restored = restore.map(|restore| restore.call0()).transpose();
        // The node's own error first: putting the device back failing is the lesser news.
        let out = out?;
        restored?;
        Ok(out)
    }

    /// What the node's return value `out` means ([`interpret`]), its output kept in `spare`'s
    /// box if it can be, and checked to be on the node's device.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn answered(
        py: Python<'_>,
        out: Bound<'_, PyAny>,
        spare: Option<&mut Value>,
        ctx: &Ctx<'_>,
    ) -> PyResult<Transition> {
        let out = interpret(out, spare);
        if let (Some(placed), Transition::Done(value)) = (ctx.device(), &out) {
            device::check(py, ctx.node().as_str(), placed, &to_python(py, value)?)?;
        }
        Ok(out)
    }

    /// Calls `forward` on `input`, with `ctx` when it takes one: its return value, which for an
    /// async node is its coroutine.
    // Inlined into `call_here`: a sync node's call is the hot path of every run (measured:
    // left to the compiler, it stayed a call of its own, 40 instructions a node more).
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn invoke<'py>(
        &self,
        py: Python<'py>,
        input: &Value,
        ctx: &Ctx<'_>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // The input as it is held, borrowed for the call: a Python object passed on from node
        // to node changes no reference count on its way in.
        let converted;
        let x = if let Some(object) = wrapped(input) {
            object.bind(py)
        } else {
            converted = to_python(py, input)?;
            &converted
        };
        if self.takes_ctx {
            let results = ctx
                .results()
                .iter()
                .map(|r| to_python(py, r))
                .collect::<PyResult<Vec<_>>>()?;
            let ctx = PyCtx {
                node: ctx.node().clone(),
                turn: ctx.turn(),
                results: PyTuple::new(py, results)?.unbind(),
                device: ctx.device().map(|device| device.to_string()),
                watched: crate::observer::watched(py)?,
                input: x.clone().unbind(),
                run: crate::protocol::journal_run(py)?,
                call: PyOnceLock::new(),
            };
            let ctx = Bound::new(py, ctx)?;
            match &self.callee {
                Callee::Method { function, object } => {
                    call!(function.bind(py), object.bind(py), x, ctx)
                }
                Callee::Other(forward) => call!(forward.bind(py), x, ctx),
            }
        } else {
            match &self.callee {
                Callee::Method { function, object } => {
                    call!(function.bind(py), object.bind(py), x)
                }
                Callee::Other(forward) => call!(forward.bind(py), x),
            }
        }
    }
}

/// What a node's exception is to the engine: a failure, or — for what `soma._run.observe`'s
/// `pausing` says pauses the run (a question for a person, `ctx.ask`, alone or all a group
/// holds) — a call waiting for an answer, which leaves its siblings running
/// (`NodeError::suspending`). Such a signal is never an `Exception`: an ordinary failure is
/// told apart by one instance check, with no Python call.
fn node_failure(py: Python<'_>, raised: PyErr) -> NodeError {
    let pauses = !raised.is_instance_of::<PyException>(py)
        && crate::py_modules::observe(py)
            .and_then(|observe| observe.getattr(intern!(py, "pausing")))
            .and_then(|pausing| pausing.call1((raised.value(py),)))
            .is_ok_and(|found| !found.is_none());
    if pauses {
        NodeError::suspending(raised)
    } else {
        NodeError::from_cause(raised)
    }
}

/// What a node's return value means: an `Await`, a `Done`, or the output itself — kept in the
/// box of `spare`, an input the call is done with, where it can be ([`wrap_into`]).
///
/// Neither class can be subclassed, so each is told by its exact type: one pointer comparison,
/// where an instance check walks the type's bases for every plain output. By the type's raw
/// pointer, which changes no reference count (a cast takes the type object and gives it back,
/// for each of the two, on every call).
// Inlined into a node's call, where the output itself is the answer every time but for a driver.
#[allow(clippy::inline_always)]
#[inline(always)]
fn interpret(out: Bound<'_, PyAny>, spare: Option<&mut Value>) -> Transition {
    let py = out.py();
    let returned = out.get_type_ptr();
    if returned == Await::type_object_raw(py) || returned == Done::type_object_raw(py) {
        return said(out);
    }
    Transition::Done(match spare {
        None => wrap(out),
        Some(spare) => wrap_into(spare, out),
    })
}

/// [`interpret`] of an `Await` or a `Done`.
#[inline(never)]
fn said(out: Bound<'_, PyAny>) -> Transition {
    let py = out.py();
    if let Ok(asked) = out.cast_exact::<Await>() {
        return Transition::Await(
            asked
                .get()
                .requests
                .iter()
                .map(|r| wrap(r.bind(py).clone()))
                .collect(),
        );
    }
    if let Ok(done) = out.cast_exact::<Done>() {
        return Transition::Done(wrap(done.get().value.bind(py).clone()));
    }
    Transition::Done(wrap(out))
}

impl Node for PythonNode {
    fn described(&self) -> Option<String> {
        let function = match &self.callee {
            Callee::Method { function, .. } | Callee::Other(function) => function,
        };
        crate::exit::attach(|py| {
            let function = function.bind(py);
            let name = |attribute| {
                function
                    .getattr(attribute)
                    .and_then(|name| name.extract::<String>())
                    .ok()
            };
            let qualified = name(intern!(py, "__qualname__"))?;
            Some(match name(intern!(py, "__module__")) {
                Some(module) => format!("{module}.{qualified}"),
                None => qualified,
            })
        })
    }

    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Self::attached(|py| {
            let out = self.called(py, input, ctx)?;
            Self::answered(py, out, None, ctx)
        })
    }

    /// A plain output lives in the box the input the call is done with lived in, when the
    /// input was a Python object alone in it: one allocation and one free fewer a call.
    fn forward_taking(&self, input: &mut Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Self::attached(|py| {
            let out = self.called(py, input, ctx)?;
            Self::answered(py, out, Some(input), ctx)
        })
    }

    fn is_async(&self) -> bool {
        self.is_async
    }

    /// The node's coroutine, made on its first poll, inside the task that awaits it.
    fn start(self: Arc<Self>, input: &Value, ctx: &Ctx<'_>) -> Call {
        Box::pin(Coroutine {
            cancelled_into: false,
            node: self,
            state: Stepped::Unstarted {
                input: input.clone(),
                node: ctx.node().clone(),
                device: ctx.device(),
                own_context: ctx.has_own_context(),
            },
        })
    }

    /// The object the call passes as `self`, whose reference count the call changes first: in
    /// a graph of 100,000 nodes, waiting for it took about a third of each node's time.
    fn prefetch(&self) {
        let object = match &self.callee {
            Callee::Method { object, .. } => object,
            Callee::Other(forward) => forward,
        };
        soma_core::prefetch_line(object.as_ptr());
    }
}

/// One call of an async node: its coroutine, stepped on each poll from inside the asyncio task
/// that drives the branch ([`crate::aio`]), with the node's device current around each step.
/// What the coroutine yields is handed to that task to wait on; what the task throws in — its
/// cancellation — is thrown on into the coroutine.
///
/// A cancellation thrown into it may be its own (an `asyncio.timeout` or a `TaskGroup` of the
/// node's, which take it back) or the run's, which only its end tells apart: a call that ends
/// after one was thrown in keeps its outcome one poll longer, for the stepper to tell which
/// before the walk goes on ([`aio::ended_after_cancellation`]).
struct Coroutine {
    node: Arc<PythonNode>,
    state: Stepped,
    /// Whether a cancellation was thrown into the coroutine.
    cancelled_into: bool,
}

enum Stepped {
    /// Not called yet: `forward` is called on the first poll, in the task that awaits it (in a
    /// copy of its context when the call's context is its own).
    Unstarted {
        input: Value,
        node: NodeId,
        device: Option<Device>,
        own_context: bool,
    },
    /// Its coroutine (or the iterator of the awaitable `forward` returned), between steps; and
    /// the context of its own each step runs in, if it has one.
    Running {
        iterator: Py<PyAny>,
        node: NodeId,
        device: Option<Device>,
        context: Option<Py<PyAny>>,
    },
    /// Ended after a cancellation was thrown in: its outcome, given on the next poll.
    Ended(Result<Value, NodeError>),
    Done,
}

impl Future for Coroutine {
    type Output = Result<Value, NodeError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if matches!(this.state, Stepped::Ended(_)) {
            if let Stepped::Ended(outcome) = std::mem::replace(&mut this.state, Stepped::Done) {
                return Poll::Ready(outcome);
            }
        }
        crate::exit::attach(|py| {
            let stepped = match this.step(py) {
                Ok(None) => return Poll::Pending,
                Ok(Some(value)) => Ok(value),
                Err(raised) => Err(raised),
            };
            if this.cancelled_into {
                // Told apart before the walk goes on: the stepper steps again at once.
                aio::ended_after_cancellation(py, stepped.as_ref().err());
            }
            let outcome = stepped.map_err(|raised| node_failure(py, raised));
            if this.cancelled_into {
                this.state = Stepped::Ended(outcome);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            this.state = Stepped::Done;
            Poll::Ready(outcome)
        })
    }
}

impl Coroutine {
    /// One step: `Some` output once the coroutine returned, `None` while it waits (what it
    /// yielded handed to the task), or what it raised.
    fn step(&mut self, py: Python<'_>) -> PyResult<Option<Value>> {
        let state = std::mem::replace(&mut self.state, Stepped::Done);
        let (node, device, context) = match &state {
            Stepped::Done | Stepped::Ended(_) => {
                unreachable!("a finished call is not polled again")
            }
            Stepped::Running {
                node,
                device,
                context,
                ..
            } => (
                node.clone(),
                *device,
                context.as_ref().map(|c| c.clone_ref(py)),
            ),
            Stepped::Unstarted {
                node,
                device,
                own_context,
                ..
            } => {
                let context = match own_context {
                    true => Some(aio::copy_context(py)?.unbind()),
                    false => None,
                };
                (node.clone(), *device, context)
            }
        };
        let resumed = aio::resumed_with();
        if resumed
            .as_ref()
            .is_some_and(|error| aio::is_cancellation(py, error))
        {
            self.cancelled_into = true;
        }
        // One step with the device current, in the call's own context if it has one: the first
        // also calls `forward`.
        let entered = match &context {
            Some(context) => Some(aio::enter(py, context.bind(py))?),
            None => None,
        };
        let stepped = within_device(py, device, || {
            let iterator = match state {
                Stepped::Done | Stepped::Ended(_) => {
                    unreachable!("a finished call is not polled again")
                }
                Stepped::Running { iterator, .. } => iterator.into_bound(py),
                Stepped::Unstarted { input, .. } => {
                    let ctx = Ctx::new(&node, 0, &[]).on(device);
                    awaited(py, &self.node.invoke(py, &input, &ctx)?)?
                }
            };
            let stepped = send_or_throw(py, &iterator, resumed)?;
            Ok((iterator, stepped))
        });
        if let Some(entered) = entered {
            aio::leave(py, &entered)?;
        }
        let (iterator, stepped) = stepped?;
        match stepped {
            Sent::Yielded(future) => {
                aio::yielded(future.unbind());
                self.state = Stepped::Running {
                    iterator: iterator.unbind(),
                    node,
                    device,
                    context,
                };
                Ok(None)
            }
            Sent::Returned(out) => {
                if out.is_exact_instance_of::<Await>() {
                    return Err(PyTypeError::new_err(format!(
                        "async node `{node}` returned soma.Await: a driver serves sync nodes only\nhint: await the call in the node itself, or make the node sync to batch its requests with a driver"
                    )));
                }
                let out = match out.cast_exact::<Done>() {
                    Ok(done) => done.get().value.bind(py).clone(),
                    Err(_) => out,
                };
                if let Some(placed) = device {
                    device::check(py, node.as_str(), placed, &out)?;
                }
                Ok(Some(wrap(out)))
            }
        }
    }
}

/// Runs `step` with `device` current, putting back what was current after, whether it returned
/// or raised; the node's own error first.
fn within_device<T>(
    py: Python<'_>,
    device: Option<Device>,
    step: impl FnOnce() -> PyResult<T>,
) -> PyResult<T> {
    let Some(placed) = device else {
        return step();
    };
    let restore = device::enter(py, placed)?;
    let out = step();
    let restored = restore.map(|restore| restore.call0()).transpose();
    let out = out?;
    restored?;
    Ok(out)
}

/// The iterator to step for what `forward` returned: the coroutine itself, or the iterator of
/// any other awaitable's `__await__`.
fn awaited<'py>(py: Python<'py>, started: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    // Looked up once; told by the exact type, as the stable ABI has no `PyCoro_CheckExact`.
    static COROUTINE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    if started
        .get_type()
        .is(COROUTINE.import(py, "types", "CoroutineType")?)
    {
        return Ok(started.clone());
    }
    started.call_method0(intern!(py, "__await__"))
}

/// Sends `None` into `iterator`, or throws `resumed` into it.
fn send_or_throw<'py>(
    py: Python<'py>,
    iterator: &Bound<'py, PyAny>,
    resumed: Option<PyErr>,
) -> PyResult<Sent<'py>> {
    if let Some(error) = resumed {
        let throw = iterator.getattr(intern!(py, "throw"))?;
        return match call!(&throw, error.into_value(py)) {
            Ok(yielded) => Ok(Sent::Yielded(yielded)),
            Err(raised) if raised.is_instance_of::<PyStopIteration>(py) => {
                Ok(Sent::Returned(stop_value(py, &raised)))
            }
            Err(raised) => Err(raised),
        };
    }
    crate::exit::send(iterator)
}

/// The value a `StopIteration` carries.
fn stop_value<'py>(py: Python<'py>, raised: &PyErr) -> Bound<'py, PyAny> {
    raised
        .value(py)
        .getattr(intern!(py, "value"))
        .unwrap_or_else(|_| py.None().into_bound(py))
}
