//! The event loop's side of a run with async nodes: what the engine's [`Tasks`] hook asks of
//! asyncio, and how an asyncio task drives one of the engine's [`Task`]s.
//!
//! The engine walks the run (`soma_core::Executor::start`); this module only hands it what
//! only the loop can give. Each of the engine's tasks — the run, a wave's branch, an `each`
//! item — is driven by an asyncio task through a [`Stepper`], an object with the coroutine
//! protocol (`send`, `throw`, `close`): each step polls the engine's task once, on the loop's
//! thread, inside the asyncio task's step — so an async node's coroutine, stepped from there
//! ([`crate::node`]), runs in that task, with its context, `asyncio.current_task()` and
//! cancellation exactly as if the task awaited it. What the coroutine yields (the future it
//! waits on) the stepper yields to the asyncio task; when the engine waits on anything else —
//! sync work lent to a crew thread, its children's join, a retry's pause — the stepper yields
//! a future of its own (`soma._run.loop.Wait`) that the engine's waker completes, from whichever
//! thread, coalesced into one `call_soon_threadsafe` per batch ([`Mailbox`]).
//!
//! Cancellation comes from asyncio: cancelling the asyncio task throws `CancelledError` into
//! the stepper. Thrown in while the task waits on the engine, it is the run's: the stepper
//! tells the engine's task ([`Task::cancel`]: it stops at its next node boundary and cancels its
//! children). Thrown in while an async node's coroutine awaits, it goes on into the coroutine,
//! and may be the node's own — its `asyncio.timeout` or `TaskGroup` cancels the very task the
//! run's cancellation does — so it is told apart once the node's call has ended, by what came
//! out of it, as asyncio tells it for a coroutine a task awaits ([`Stepping::tell_handed`]). A
//! `Wait` refuses to be cancelled itself — the cancellation then reaches the stepper once the
//! engine's wait is over, and a piece running on a crew thread is never left behind by the task
//! that lent it. A time limit ([`Tasks::interrupt_after`]) cancels the asyncio task the same
//! way, and is told apart here by the timer that fired it.
//!
//! A node's `BaseException` (`KeyboardInterrupt`, `SystemExit`) is the node's outcome, carried
//! to the run's caller: no stepper ever raises anything into the loop but `StopIteration` and,
//! for the run of an `aforward`, the run's own outcome into the coroutine that awaits it.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};
use std::thread::{self, ThreadId};
use std::time::Duration;

use pyo3::exceptions::PyStopIteration;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use soma_core::{Interrupt, Pause, RunError, Settled, Spawned, Task, Tasks};

use crate::convert::to_python;
use crate::errors::{panic_error, run_error};
use crate::exit;
use crate::torch_state;
use crate::watch::SignalWatch;

thread_local! {
    /// What the task being polled on this thread was resumed with: an exception to throw into
    /// the coroutine it awaits, taken by that coroutine's step ([`resumed_with`]).
    static RESUME: RefCell<Option<PyErr>> = const { RefCell::new(None) };
    /// The future the awaited coroutine yielded during this poll, for the stepper to yield on
    /// to the asyncio task ([`yielded`]).
    static YIELDED: RefCell<Option<Py<PyAny>>> = const { RefCell::new(None) };
    /// The time limits armed by the task being polled on this thread ([`Tasks::interrupt_after`]).
    static INTERRUPTS: RefCell<Option<Arc<Interrupts>>> = const { RefCell::new(None) };
    /// How an async node's call that was thrown a cancellation ended, during this poll
    /// ([`ended_after_cancellation`]).
    static ENDED_AFTER_CANCELLATION: Cell<Option<CallEnded>> = const { Cell::new(None) };
}

/// How an async node's call ended after a cancellation was thrown into it: what tells the
/// node's own cancellation from the run's ([`Stepping::tell_handed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallEnded {
    /// It returned: it swallowed the cancellation, or took back its own.
    Returned,
    /// It let a `CancelledError` out.
    Cancelled,
    /// It raised an error of its own (the `TimeoutError` of its `asyncio.timeout`, the
    /// `ExceptionGroup` of its `TaskGroup`, ...).
    Failed,
}

/// Whether `error` is an `asyncio.CancelledError`.
pub fn is_cancellation(py: Python<'_>, error: &PyErr) -> bool {
    cancelled_error_type(py).is_ok_and(|cancelled| error.is_instance(py, cancelled.as_any()))
}

/// Tells the stepper polling now how the async node's call it awaited ended, after a
/// cancellation was thrown into it: whether that cancellation was the run's can be told now.
pub fn ended_after_cancellation(py: Python<'_>, raised: Option<&PyErr>) {
    let ended = match raised {
        None => CallEnded::Returned,
        Some(error) if is_cancellation(py, error) => CallEnded::Cancelled,
        Some(_) => CallEnded::Failed,
    };
    ENDED_AFTER_CANCELLATION.with(|cell| cell.set(Some(ended)));
}

/// Takes what the task polled now was resumed with, if anything: for an async node's call, which
/// throws it into its coroutine instead of sending `None`.
pub fn resumed_with() -> Option<PyErr> {
    RESUME.with(|resume| resume.borrow_mut().take())
}

/// Hands the future an async node's coroutine yielded to the stepper polling it, to be yielded
/// on to its asyncio task.
pub fn yielded(future: Py<PyAny>) {
    YIELDED.with(|yielded| *yielded.borrow_mut() = Some(future));
}

/// `soma._run.loop`, where the Python side of this module lives: the `Wait` future, the kept loop.
fn aio_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    crate::py_modules::kept_loop(py)
}

/// `asyncio.current_task()`.
fn current_task(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static CURRENT: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    CURRENT.import(py, "asyncio", "current_task")?.call0()
}

/// How many cancellations of the current asyncio task are pending (`Task.cancelling()`), or
/// `None` outside any task.
fn pending_cancellations(py: Python<'_>) -> PyResult<Option<usize>> {
    let task = current_task(py)?;
    if task.is_none() {
        return Ok(None);
    }
    task.call_method0(intern!(py, "cancelling"))?
        .extract()
        .map(Some)
}

/// `asyncio.CancelledError`.
fn cancelled_error_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static CANCELLED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    CANCELLED.import(py, "asyncio", "CancelledError")
}

/// The running event loop of this thread, if there is one.
pub fn running_loop(py: Python<'_>) -> PyResult<Option<Bound<'_, PyAny>>> {
    static GET: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let found = GET
        .import(py, "asyncio.events", "_get_running_loop")?
        .call0()?;
    Ok(Some(found).filter(|found| !found.is_none()))
}

/// Where the engine's wake-ups for one loop meet: completed on the loop's thread directly, or
/// queued from any other and completed by one `call_soon_threadsafe` per batch, so that ten
/// thousand pieces finishing on crew threads cost the loop a handful of wake-ups, not ten
/// thousand.
pub struct Mailbox {
    event_loop: Py<PyAny>,
    /// The loop's thread, once a task has been polled there.
    loop_thread: OnceLock<ThreadId>,
    posted: Mutex<Vec<Py<PyAny>>>,
}

impl Mailbox {
    fn new(event_loop: Py<PyAny>) -> Arc<Self> {
        Arc::new(Mailbox {
            event_loop,
            loop_thread: OnceLock::new(),
            posted: Mutex::new(Vec::new()),
        })
    }

    fn posted(&self) -> MutexGuard<'_, Vec<Py<PyAny>>> {
        self.posted.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Completes `waiter` (a `Wait`), on the loop's thread.
    fn post(self: &Arc<Self>, waiter: Py<PyAny>) {
        crate::exit::attach(|py| {
            if self.loop_thread.get() == Some(&thread::current().id()) {
                complete(py, waiter.bind(py));
                return;
            }
            let first = {
                let mut posted = self.posted();
                posted.push(waiter);
                posted.len() == 1
            };
            if first {
                let drain = Drain {
                    mailbox: Arc::clone(self),
                };
                // A closed loop refuses: its run is over, nobody waits for the wake-up. Through
                // the exit's door: writing to the loop's wake-up socket lets the GIL go.
                let _ = crate::exit::call_method(
                    self.event_loop.bind(py),
                    intern!(py, "call_soon_threadsafe"),
                    (drain,),
                );
            }
        });
    }
}

/// Sets `waiter`'s result unless it is done already.
fn complete(py: Python<'_>, waiter: &Bound<'_, PyAny>) {
    let done = waiter
        .call_method0(intern!(py, "done"))
        .and_then(|done| done.is_truthy())
        .unwrap_or(true);
    if !done {
        if let Err(error) = waiter.call_method1(intern!(py, "set_result"), (py.None(),)) {
            error.write_unraisable(py, None);
        }
    }
}

/// Completes, on the loop's thread, every waiter posted from other threads since the last.
#[pyclass(frozen, module = "soma._soma")]
struct Drain {
    mailbox: Arc<Mailbox>,
}

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) {
        let posted = std::mem::take(&mut *self.mailbox.posted());
        for waiter in posted {
            complete(py, waiter.bind(py));
        }
    }
}

/// The waker of one engine task: completes the `Wait` its stepper yielded, or, woken before the
/// stepper yielded one, tells it to step again at once.
///
/// No Python runs while its lock is held: a crew thread waking the task holds the GIL.
pub(crate) struct Wake {
    mailbox: Arc<Mailbox>,
    state: Mutex<WakeState>,
}

struct WakeState {
    waiter: Option<Py<PyAny>>,
    woken: bool,
}

impl Wake {
    pub(crate) fn new(mailbox: Arc<Mailbox>) -> Arc<Self> {
        Arc::new(Wake {
            mailbox,
            state: Mutex::new(WakeState {
                waiter: None,
                woken: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, WakeState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Before a poll: no waiter yet, no wake-up seen.
    pub(crate) fn rearm(&self) {
        let old = {
            let mut state = self.lock();
            state.woken = false;
            state.waiter.take()
        };
        drop(old);
    }

    /// After a poll that must wait: the `Wait` to yield, or `None` when a wake-up came during
    /// the poll (the stepper then yields nothing, and the asyncio task steps again at once).
    ///
    /// The `Wait` is made with the lock let go: making it runs Python, which may hand the GIL
    /// to a crew thread that wakes this very task, and would wait for the lock holding the GIL.
    pub(crate) fn arm(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if std::mem::take(&mut self.lock().woken) {
            return Ok(None);
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item(intern!(py, "loop"), self.mailbox.event_loop.bind(py))?;
        let waiter = aio_module(py)?
            .getattr(intern!(py, "Wait"))?
            .call((), Some(&kwargs))?
            .unbind();
        // What `Future.__await__` sets before it yields itself: the task then waits on it,
        // rather than refusing a bare `yield` of a future.
        waiter.setattr(py, intern!(py, "_asyncio_future_blocking"), true)?;
        let mut state = self.lock();
        if std::mem::take(&mut state.woken) {
            return Ok(None);
        }
        state.waiter = Some(waiter.clone_ref(py));
        Ok(Some(waiter))
    }
}

impl std::task::Wake for Wake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let waiter = {
            let mut state = self.lock();
            let waiter = state.waiter.take();
            state.woken = waiter.is_none();
            waiter
        };
        if let Some(waiter) = waiter {
            self.mailbox.post(waiter);
        }
    }
}

/// The time limits a task armed, fired and not yet told apart from a real cancellation.
#[derive(Default)]
struct Interrupts {
    fired: AtomicUsize,
}

impl Interrupts {
    /// Whether a fired time limit is what cancelled the task, counting it off if so.
    fn take_one(&self) -> bool {
        self.fired
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |fired| {
                fired.checked_sub(1)
            })
            .is_ok()
    }
}

/// What the run of an `aforward` keeps for its caller: its outcome, its watch, its timeout.
struct Root {
    settled: Arc<Settled>,
    watch: Arc<SignalWatch>,
    timeout: Option<Duration>,
    /// The deadline's timer, when it has a timeout.
    deadline: Option<Py<Deadline>>,
    /// The cancellation thrown in, re-raised once the run has stopped.
    cancelled: Option<PyErr>,
}

/// The deadline of an `aforward(timeout=)`: at it, the run is cancelled as a whole.
#[pyclass(frozen, module = "soma._soma")]
struct Deadline {
    /// The caller's task, which awaits the run.
    task: Py<PyAny>,
    settled: Arc<Settled>,
    /// The nodes running when it passed, once it has.
    running: Mutex<Option<Vec<soma_core::NodeId>>>,
    /// The timer, to stop once the run is over.
    handle: Mutex<Option<Py<PyAny>>>,
    /// The stepper's, set before it cancels the caller's task.
    cancelled_by_soma: Mutex<Option<Arc<AtomicBool>>>,
}

#[pymethods]
impl Deadline {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = Some(self.settled.running());
        if let Some(flag) = &*self
            .cancelled_by_soma
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            flag.store(true, Ordering::Release);
        }
        self.task.bind(py).call_method0(intern!(py, "cancel"))?;
        Ok(())
    }
}

/// Drives one of the engine's tasks from an asyncio task: an object with the coroutine
/// protocol, each `send` or `throw` one poll of the engine's task (see the module's header).
#[pyclass(frozen, module = "soma._soma")]
pub struct Stepper {
    state: Mutex<Option<Stepping>>,
}

struct Stepping {
    task: Task,
    wake: Arc<Wake>,
    interrupts: Arc<Interrupts>,
    root: Option<Root>,
    /// The context each step runs in, entered around it: for the run of an `aforward`, a copy
    /// of its caller's, so that what its nodes set never reaches the caller (a task of Soma's
    /// own has one of its own already).
    context: Option<Py<PyAny>>,
    /// torch's state for the task's next step (`torch_state.rs`), when torch is loaded: the
    /// state of the thread that started the run or spawned the task, then what the task's nodes
    /// left set — set around each step and the loop's thread's own put back after, as a
    /// stream item carries it from stage to stage. So an async node, and the sync work it lends
    /// a crew thread (captured inside the step), runs in the caller's grad mode, inference mode
    /// and autocast under `forward` too, where the loop runs on a thread of its own; and what a
    /// task's nodes change is the task's, as its `contextvars` are.
    torch: Option<torch_state::Carried>,
    /// Whether the stepper's last yield was an async node's: a cancellation thrown in then goes
    /// to the node's coroutine first, which may take it back (an `asyncio.timeout` or a
    /// `TaskGroup` of its own), and is told apart once the call has ended.
    node_awaits: bool,
    /// The first cancellation handed to the node's coroutine, until its call ends, with how
    /// many cancellations of the task were pending before it.
    handed: Option<(PyErr, usize)>,
    /// Set by Soma before it cancels the asyncio task for the run: the engine cancelling a
    /// branch or an item ([`SpawnedTask`]), `forward`'s caller stopping ([`Started::cancel`]),
    /// the deadline of an `aforward` ([`Deadline`]).
    cancelled_by_soma: Arc<AtomicBool>,
}

impl Stepper {
    fn new(
        task: Task,
        mailbox: Arc<Mailbox>,
        root: Option<Root>,
        context: Option<Py<PyAny>>,
        torch: Option<torch_state::Carried>,
    ) -> Self {
        Stepper {
            state: Mutex::new(Some(Stepping {
                task,
                wake: Wake::new(mailbox),
                interrupts: Arc::default(),
                root,
                context,
                torch,
                node_awaits: false,
                handed: None,
                cancelled_by_soma: Arc::default(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Stepping>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What Soma sets before it cancels this stepper's task for the run.
    fn cancelled_by_soma(&self) -> Arc<AtomicBool> {
        self.lock().as_ref().map_or_else(Arc::default, |stepping| {
            Arc::clone(&stepping.cancelled_by_soma)
        })
    }

    fn step(&self, py: Python<'_>, incoming: Option<PyErr>) -> PyResult<Py<PyAny>> {
        // Counted inside the interpreter, as a crew thread's branch is, so that the exit waits
        // for a step in progress, and a loop thread that steps once the exit has begun lets the
        // GIL go and parks rather than enter an interpreter that is shutting down (`exit.rs`).
        let _inside = exit::enter_holding(py);
        // Counted, for an `aforward` started inside this step to know how deep it would nest.
        let _nested = crate::reentry::Stepping::enter();
        let mut state = self.lock();
        let Some(stepping) = state.as_mut() else {
            return Err(PyStopIteration::new_err((py.None(),)));
        };
        let _ = stepping
            .wake
            .mailbox
            .loop_thread
            .set(thread::current().id());
        if let Some(error) = incoming {
            stepping.received(py, &error)?;
            RESUME.with(|resume| *resume.borrow_mut() = Some(error));
        }
        let waker = Waker::from(Arc::clone(&stepping.wake));
        stepping.wake.rearm();
        let outer = INTERRUPTS.with(|armed| armed.replace(Some(Arc::clone(&stepping.interrupts))));
        let entered = match &stepping.context {
            Some(context) => Some(enter(py, context.bind(py))?),
            None => None,
        };
        let polled = stepping.poll(py, &mut Context::from_waker(&waker));
        if let Some(entered) = entered {
            leave(py, &entered)?;
        }
        INTERRUPTS.with(|armed| *armed.borrow_mut() = outer);
        RESUME.with(|resume| resume.borrow_mut().take());
        let yielded = YIELDED.with(|yielded| yielded.borrow_mut().take());
        stepping.node_awaits = polled.is_pending() && yielded.is_some();
        if let Some(ended) = ENDED_AFTER_CANCELLATION.with(Cell::take) {
            // The node's call ended, holding its outcome back until this is told (it woke the
            // task, which steps again at once and hands the outcome on).
            stepping.tell_handed(py, ended)?;
        }
        match polled {
            Poll::Ready(()) => {
                let done = state.take().expect("a task polled to its end was there");
                drop(state);
                Err(done.finish(py))
            }
            Poll::Pending => match yielded {
                Some(future) => Ok(future),
                None => Ok(stepping.wake.arm(py)?.unwrap_or_else(|| py.None())),
            },
        }
    }
}

impl Stepping {
    /// Polls the engine's task once, in the task's torch state if it carries one.
    fn poll(&mut self, py: Python<'_>, cx: &mut Context<'_>) -> Poll<()> {
        let Stepping { task, torch, .. } = self;
        match torch {
            Some(torch) => {
                let mut polled = Poll::Pending;
                torch.carry(py, &mut || polled = task.poll(cx));
                polled
            }
            None => task.poll(cx),
        }
    }

    /// The asyncio task threw `error` in: a fired time limit of the node it awaits, the node's
    /// own cancellation (its `asyncio.timeout`, its `TaskGroup`), or the run's. One handed to
    /// an async node's coroutine is told apart once its call has ended
    /// ([`Stepping::tell_handed`]); one thrown in while the task waits on the engine (a piece,
    /// its children, a retry's pause) can only be the run's.
    fn received(&mut self, py: Python<'_>, error: &PyErr) -> PyResult<()> {
        if !is_cancellation(py, error) {
            // Not a cancellation (asyncio refusing what was yielded, say): the coroutine the
            // task awaits, if any, gets it.
            return Ok(());
        }
        if self.interrupts.take_one() {
            // The node's time limit, never the run's: the node's call alone ends.
            current_task(py)?.call_method0(intern!(py, "uncancel"))?;
            return Ok(());
        }
        if !self.node_awaits {
            self.cancel_run(py, error);
            return Ok(());
        }
        if self.handed.is_none() {
            // Counted already among the pending ones: those before it are not its own.
            let before = pending_cancellations(py)?.map_or(0, |pending| pending.saturating_sub(1));
            self.handed = Some((error.clone_ref(py), before));
        }
        Ok(())
    }

    /// The one place a cancellation handed to an async node is told to be the run's or the
    /// node's own, by how the node's call `ended`, as asyncio tells it for a coroutine a task
    /// awaits: what comes out of the call is what its awaiter gets. A `CancelledError` let out
    /// is the run's cancellation; an error of the node's own (its `asyncio.timeout`'s
    /// `TimeoutError`, its `TaskGroup`'s `ExceptionGroup`) is the node's outcome, to fail or
    /// retry; a call that returned swallowed the run's cancellation if Soma sent one, or, for
    /// the run of an `aforward`, if its caller's task still has more pending than before it
    /// (`Task.cancelling()`: what the node's own `asyncio.timeout` or `TaskGroup` cancelled it
    /// for, they took back with `Task.uncancel()`), and the run stops all the same.
    fn tell_handed(&mut self, py: Python<'_>, ended: CallEnded) -> PyResult<()> {
        let Some((error, before)) = self.handed.take() else {
            return Ok(());
        };
        let the_runs = match ended {
            CallEnded::Cancelled => true,
            CallEnded::Failed => false,
            // A cancellation the call swallowed is the run's when Soma sent one; for the run of
            // an `aforward`, when its caller's task still has more pending than before it too
            // (a failing `TaskGroup` leaves its task's count raised on Python 3.11 and 3.12,
            // which is why Soma's own tasks go by what Soma sent).
            CallEnded::Returned => {
                self.cancelled_by_soma.load(Ordering::Acquire)
                    || (self.root.is_some()
                        && pending_cancellations(py)?.is_none_or(|now| now > before))
            }
        };
        if the_runs {
            self.cancel_run(py, &error);
        }
        Ok(())
    }

    /// The run was cancelled: its task stops at its next node boundary and cancels its
    /// children, and the run of an `aforward` raises `error` once it has stopped.
    fn cancel_run(&mut self, py: Python<'_>, error: &PyErr) {
        self.task.cancel();
        if let Some(root) = &mut self.root {
            if root.cancelled.is_none() {
                root.cancelled = Some(error.clone_ref(py));
            }
        }
    }

    /// What the stepper raises when its task is done: `StopIteration` — with the run's result,
    /// for the run of an `aforward` — or the run's error.
    fn finish(self, py: Python<'_>) -> PyErr {
        let Some(root) = self.root else {
            return PyStopIteration::new_err((py.None(),));
        };
        if let Some(deadline) = &root.deadline {
            if let Some(handle) = deadline
                .get()
                .handle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
            {
                let _ = handle.bind(py).call_method0(intern!(py, "cancel"));
            }
        }
        let outcome = root
            .settled
            .take()
            .expect("a run whose task is done has settled");
        let fired = root.deadline.as_ref().and_then(|deadline| {
            deadline
                .get()
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        });
        if let Some(running) = fired {
            // The deadline cancelled the caller's task: that cancellation was ours.
            if let Ok(task) = current_task(py) {
                let _ = task.call_method0(intern!(py, "uncancel"));
            }
            return aforward_timed_out(&RunError::Cancelled { running }, root.timeout);
        }
        // The deadline passed before its timer fired (a run that never waited on the loop):
        // the run stopped at a boundary, or finished late.
        if root.watch.timed_out() {
            let error = match outcome {
                Ok(Err(error)) => error,
                Ok(Ok(_)) | Err(_) => RunError::PastDeadline,
            };
            return aforward_timed_out(&error, root.timeout);
        }
        if let Some(cancelled) = root.cancelled {
            return cancelled;
        }
        match outcome {
            Ok(Ok(value)) => match to_python(py, &value) {
                Ok(value) => PyStopIteration::new_err((value.unbind(),)),
                Err(error) => error,
            },
            Ok(Err(RunError::PastDeadline)) => {
                aforward_timed_out(&RunError::PastDeadline, root.timeout)
            }
            Ok(Err(error)) => run_error(py, &error, root.watch.take_raised()),
            Err(payload) => panic_error(py, &*payload),
        }
    }
}

/// A copy of this thread's current context (`contextvars.copy_context()`).
pub(crate) fn copy_context(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: the GIL is held; `PyContext_CopyCurrent` returns a new reference, or null with
    // an exception set.
    #[allow(unsafe_code)]
    unsafe {
        Bound::from_owned_ptr_or_err(py, crate::context::contextvars_c::PyContext_CopyCurrent())
    }
}

/// Enters `context` on this thread, for one step.
pub(crate) fn enter<'py>(
    py: Python<'py>,
    context: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: the GIL is held and `context` is a `contextvars.Context`, entered by no thread
    // (a stepper's steps never overlap, nor an async node's call's, and the context of
    // either is its own).
    #[allow(unsafe_code)]
    let entered = unsafe { crate::context::contextvars_c::PyContext_Enter(context.as_ptr()) };
    if entered != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(context.clone())
}

/// Leaves `context`, entered by [`enter`] on this thread.
pub(crate) fn leave(py: Python<'_>, context: &Bound<'_, PyAny>) -> PyResult<()> {
    // SAFETY: the GIL is held and this thread entered `context`; every context a node entered
    // since it has left again, so it is the current one.
    #[allow(unsafe_code)]
    let left = unsafe { crate::context::contextvars_c::PyContext_Exit(context.as_ptr()) };
    if left != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(())
}

/// The `TimeoutError` of an `aforward` past its timeout.
fn aforward_timed_out(error: &RunError, timeout: Option<Duration>) -> PyErr {
    crate::stopped::past_timeout("aforward", timeout, &crate::stopped::left_behind(error))
}

#[pymethods]
impl Stepper {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.step(py, None)
    }

    fn send(&self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.step(py, None)
    }

    #[pyo3(signature = (kind, value=None, _traceback=None))]
    fn throw(
        &self,
        py: Python<'_>,
        kind: &Bound<'_, PyAny>,
        value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let error = match value.filter(|value| !value.is_none()) {
            Some(value) => PyErr::from_value(value.clone()),
            None if kind.is_instance_of::<PyType>() => PyErr::from_value(kind.call0()?),
            None => PyErr::from_value(kind.clone()),
        };
        self.step(py, Some(error))
    }

    /// Closed before its end (its coroutine abandoned): the run is cancelled, and what runs of
    /// it stops at its next node boundary, on its own.
    fn close(&self) {
        let stepping = self.lock().take();
        if let Some(stepping) = stepping {
            stepping.task.cancel();
        }
    }
}

/// How the run keeps a task it spawned: cancelled through asyncio, as any task is.
struct SpawnedTask {
    task: Py<PyAny>,
    cancelled_by_soma: Arc<AtomicBool>,
}

impl Spawned for SpawnedTask {
    fn cancel(&self) {
        self.cancelled_by_soma.store(true, Ordering::Release);
        crate::exit::attach(|py| {
            if let Err(error) = self.task.bind(py).call_method0(intern!(py, "cancel")) {
                error.write_unraisable(py, None);
            }
        });
    }
}

/// How many times [`Started::cancel`] tries a cancel that a signal handler's exception broke off.
const CANCEL_TRIES: usize = 3;

/// A run handed to the loop Soma keeps, from the calling thread (`soma._run.loop.Started`):
/// held from before it is handed over, so that it can always be cancelled.
pub(crate) struct Started {
    started: Py<PyAny>,
    cancelled_by_soma: Arc<AtomicBool>,
}

impl Started {
    /// Hands `stepper` to `tasks`' loop. An error alone: nothing was handed over. An error
    /// beside the run: what a signal handler raised while it was handed over (Ctrl-C, landing
    /// in the Python that hands it) — the run may be on the loop all the same, and is the
    /// caller's to cancel.
    pub(crate) fn begin(
        py: Python<'_>,
        tasks: &LoopTasks,
        stepper: Stepper,
    ) -> PyResult<(Self, Option<PyErr>)> {
        let cancelled_by_soma = stepper.cancelled_by_soma();
        let started = aio_module(py)?
            .getattr(intern!(py, "Started"))?
            .call1((tasks.loop_object().bind(py),))?
            .unbind();
        // Through the exit's door, as each call that hands work to the loop from another
        // thread: it writes to the loop's wake-up socket, letting the GIL go.
        let raised =
            crate::exit::call_method(started.bind(py), intern!(py, "begin"), (stepper,)).err();
        Ok((
            Started {
                started,
                cancelled_by_soma,
            },
            raised,
        ))
    }

    /// Cancels the run, tried again when a signal handler's exception (a second Ctrl-C) broke
    /// it off: that exception is returned, for the caller to raise once the run is stopped.
    pub(crate) fn cancel(&self, py: Python<'_>) -> Option<PyErr> {
        self.cancelled_by_soma.store(true, Ordering::Release);
        let mut raised = None;
        for _ in 0..CANCEL_TRIES {
            match crate::exit::call_method(self.started.bind(py), intern!(py, "cancel"), ()) {
                Ok(_) => break,
                Err(error) => {
                    raised.get_or_insert(error);
                }
            }
        }
        raised
    }
}

impl Spawned for Started {
    fn cancel(&self) {
        crate::exit::attach(|py| {
            // Cancelled from the engine, where nothing can be raised: shown, not lost.
            if let Some(raised) = Started::cancel(self, py) {
                raised.write_unraisable(py, None);
            }
        });
    }
}

/// The engine's [`Tasks`] hook on one asyncio loop.
pub struct LoopTasks {
    mailbox: Arc<Mailbox>,
}

impl LoopTasks {
    pub fn new(event_loop: Py<PyAny>) -> Arc<Self> {
        Arc::new(LoopTasks {
            mailbox: Mailbox::new(event_loop),
        })
    }

    /// Where this loop's wake-ups meet, for a waiter of its own on the loop (a stream's reader).
    pub(crate) fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }

    /// The loop.
    pub(crate) fn loop_object(&self) -> &Py<PyAny> {
        &self.mailbox.event_loop
    }

    fn event_loop<'py>(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.mailbox.event_loop.bind(py)
    }

    /// The stepper of the run of an `aforward`, awaited by the caller's coroutine: it returns
    /// the run's result, or raises its error. With `timeout`, the caller's task is cancelled at
    /// the deadline and the stepper raises `TimeoutError` once the run has stopped.
    pub fn root(
        &self,
        py: Python<'_>,
        task: Task,
        settled: Arc<Settled>,
        watch: Arc<SignalWatch>,
        timeout: Option<Duration>,
    ) -> PyResult<Stepper> {
        let deadline = match timeout {
            None => None,
            Some(limit) => {
                let deadline = Py::new(
                    py,
                    Deadline {
                        task: current_task(py)?.unbind(),
                        settled: Arc::clone(&settled),
                        running: Mutex::new(None),
                        handle: Mutex::new(None),
                        cancelled_by_soma: Mutex::new(None),
                    },
                )?;
                let handle = self.event_loop(py).call_method1(
                    intern!(py, "call_later"),
                    (limit.as_secs_f64(), deadline.clone_ref(py)),
                )?;
                *deadline
                    .get()
                    .handle
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(handle.unbind());
                Some(deadline)
            }
        };
        let context = copy_context(py)?;
        let deadline_of = deadline.as_ref().map(|deadline| deadline.clone_ref(py));
        let stepper = Stepper::new(
            task,
            Arc::clone(&self.mailbox),
            Some(Root {
                settled,
                watch,
                timeout,
                deadline,
                cancelled: None,
            }),
            Some(context.unbind()),
            torch_state::capture(py),
        );
        if let Some(deadline) = deadline_of {
            *deadline
                .get()
                .cancelled_by_soma
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(stepper.cancelled_by_soma());
        }
        Ok(stepper)
    }

    /// The stepper of a run of `forward` on the kept loop: its outcome goes to its `Settled`,
    /// where the calling thread waits for it. Made on the calling thread, whose torch state
    /// the run's steps carry onto the loop's.
    pub fn background(&self, task: Task) -> Stepper {
        let torch = crate::exit::attach(torch_state::capture);
        Stepper::new(task, Arc::clone(&self.mailbox), None, None, torch)
    }
}

impl Tasks for LoopTasks {
    fn spawn(&self, task: Task) -> Result<Box<dyn Spawned>, String> {
        crate::exit::attach(|py| {
            // Spawned inside a step of the task that spawns it: its torch state, carried.
            let torch = torch_state::capture(py);
            let stepper = Stepper::new(task, Arc::clone(&self.mailbox), None, None, torch);
            let cancelled_by_soma = stepper.cancelled_by_soma();
            self.event_loop(py)
                .call_method1(intern!(py, "create_task"), (stepper,))
                .map(|task| {
                    Box::new(SpawnedTask {
                        task: task.unbind(),
                        cancelled_by_soma,
                    }) as Box<dyn Spawned>
                })
                .map_err(|error| error.to_string())
        })
    }

    fn sleep(&self, pause: Duration) -> Pause {
        Box::pin(Sleep {
            pause,
            event_loop: crate::exit::attach(|py| self.mailbox.event_loop.clone_ref(py)),
            timer: None,
        })
    }

    fn interrupt_after(&self, limit: Duration) -> Box<dyn Interrupt> {
        crate::exit::attach(|py| {
            let armed = INTERRUPTS.with(|armed| armed.borrow().clone());
            let fired = Arc::new(AtomicBool::new(false));
            let fire = Fire {
                task: current_task(py).ok().map(Bound::unbind),
                fired: Arc::clone(&fired),
                interrupts: armed,
            };
            let handle = Py::new(py, fire).and_then(|fire| {
                self.event_loop(py)
                    .call_method1(intern!(py, "call_later"), (limit.as_secs_f64(), fire))
            });
            let handle = handle
                .map_err(|error| error.write_unraisable(py, None))
                .ok()
                .map(Bound::unbind);
            Box::new(TimeLimit { handle, fired }) as Box<dyn Interrupt>
        })
    }
}

/// A time limit's timer callback: marks the limit fired, and cancels the task awaiting the node.
#[pyclass(frozen, module = "soma._soma")]
struct Fire {
    task: Option<Py<PyAny>>,
    fired: Arc<AtomicBool>,
    interrupts: Option<Arc<Interrupts>>,
}

#[pymethods]
impl Fire {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        self.fired.store(true, Ordering::Release);
        if let (Some(task), Some(interrupts)) = (&self.task, &self.interrupts) {
            interrupts.fired.fetch_add(1, Ordering::AcqRel);
            task.bind(py).call_method0(intern!(py, "cancel"))?;
        }
        Ok(())
    }
}

/// A time limit armed around one node's call.
struct TimeLimit {
    handle: Option<Py<PyAny>>,
    fired: Arc<AtomicBool>,
}

impl Interrupt for TimeLimit {
    fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

impl Drop for TimeLimit {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            crate::exit::attach(|py| {
                let _ = handle.bind(py).call_method0(intern!(py, "cancel"));
            });
        }
    }
}

/// A retry's pause on the loop: `call_later`, waking the task that awaits it.
struct Sleep {
    pause: Duration,
    event_loop: Py<PyAny>,
    timer: Option<(Py<PyAny>, Arc<WakeUp>)>,
}

/// What the timer of a [`Sleep`] sets, and whom it wakes.
struct WakeUp {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl WakeUp {
    fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl std::future::Future for Sleep {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some((_, wake_up)) = &self.timer {
            if wake_up.fired.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            *wake_up.waker.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(cx.waker().clone());
            return Poll::Pending;
        }
        let pause = self.pause;
        let scheduled = crate::exit::attach(|py| -> PyResult<(Py<PyAny>, Arc<WakeUp>)> {
            let wake_up = Arc::new(WakeUp {
                fired: AtomicBool::new(false),
                waker: Mutex::new(Some(cx.waker().clone())),
            });
            let callback = Py::new(py, WakeUpRef(Arc::clone(&wake_up)))?;
            let handle = self
                .event_loop
                .bind(py)
                .call_method1(intern!(py, "call_later"), (pause.as_secs_f64(), callback))?;
            Ok((handle.unbind(), wake_up))
        });
        match scheduled {
            Ok(timer) => {
                self.timer = Some(timer);
                Poll::Pending
            }
            // A loop that refuses a timer (closed): the pause is over at once.
            Err(_) => Poll::Ready(()),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((handle, _)) = self.timer.take() {
            crate::exit::attach(|py| {
                let _ = handle.bind(py).call_method0(intern!(py, "cancel"));
            });
        }
    }
}

/// What `call_later` calls for a [`Sleep`]: its shared [`WakeUp`].
#[pyclass(frozen, module = "soma._soma")]
struct WakeUpRef(Arc<WakeUp>);

#[pymethods]
impl WakeUpRef {
    fn __call__(&self) {
        self.0.fire();
    }
}
