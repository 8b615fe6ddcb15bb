//! Every branch runs in its caller's context: the caller's `contextvars`, a copy per branch (as
//! `asyncio.to_thread` does), and, when torch is loaded, its grad mode, inference mode and
//! autocast state (as torch's own `DataParallel` does for its threads).
//!
//! Both are per thread in the interpreter, and a branch runs on a thread lent to it: without
//! this, a branch would see whatever its thread last held — a crew thread's own empty context,
//! torch's defaults — instead of `with torch.no_grad(): g.forward(x)`.
//!
//! [`isolated`] runs a whole forward in a copy of the caller's context, so nothing a node sets
//! reaches the caller. [`capture`] runs once per wave, on the thread that reached it, with the
//! GIL — the caller for an outermost wave, the enclosing branch for a nested one, so a branch's
//! own changes reach its nested waves; [`Caller::enter`] runs once per branch, on the thread that
//! runs it, the caller's own included: each branch gets a fresh copy of the captured context, so
//! what one branch sets is seen neither by its siblings nor by the code after the wave, and
//! whatever torch state a branch changes is put back when it ends (threads are reused between
//! branches and graphs). Without torch the cost is a context copy, entered and left, per
//! forward, per wave and per branch — tens of nanoseconds each, no Python call. torch's state is
//! carried by `torch_state.rs`, only when torch is already loaded. With torch's deterministic
//! algorithms asked for (`torch.use_deterministic_algorithms(True)`) where a wave is reached,
//! the captured context asks the engine to run the wave's branches on that thread, in declared
//! order (`Captured::in_order`): backward sums what several branches give one tensor in the
//! order of numbers torch's autograd counts per thread, which branches on the crew's threads
//! would make differ from run to run, and the gradients' last bits with it.
//!
//! The same per-wave capture and per-branch entry carry a forward's device queues (CUDA's
//! streams), when it has some (`device_queues.rs`): each branch runs on queues of its own,
//! forked from and joined back into those the wave was reached on.
//!
//! A stream (`g.map`) runs each stage of an item on a thread of that stage, so a forward's way —
//! one thread from node to node — does not carry what a node sets to the item's next node. Each
//! item gets a copy of the caller's context as it is read instead ([`Captured::for_item`]), and
//! every stage runs the item in it ([`Item`]): the copy, with the item's torch state, travels
//! with the item from stage to stage as a forward's context goes from node to node. Without torch
//! that is a context copy per item, and one entered and left per item per stage.

use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::prelude::*;
use soma_core::{Captured, ItemContext};

use crate::device_queues;
use crate::torch_state;

/// Whether contexts are carried at all: always, except while the benchmark measures what carrying
/// them costs (`_carry_context`, not part of the API).
static CARRY: AtomicBool = AtomicBool::new(true);

/// Switches context carry off or on for every run in the process, and returns whether it was
/// on: for the benchmark, which times the same wave with and without it in one run. Not API —
/// with it off, branches run in whatever their threads hold, which is the defect carry fixes.
#[pyfunction]
pub fn _carry_context(on: bool) -> bool {
    CARRY.swap(on, Ordering::Relaxed)
}

/// The context a wave was reached in.
pub struct Caller {
    /// A `contextvars.Context`, copied again for each branch: a context can be entered by one
    /// thread at a time, and a branch's changes must stay its own.
    context: Py<PyAny>,
    /// torch's state, to set on each branch's thread and put back after; `None` without torch.
    torch: Option<torch_state::Carried>,
    /// The wave's fork of the device queues it was reached on (`device_queues.rs`): each branch
    /// runs on queues of its own, joined back when it ends. `None` in a forward without them.
    queues: Option<Py<PyAny>>,
    /// Whether torch's deterministic algorithms were asked for where the wave was reached: its
    /// branches then run there, in declared order ([`Captured::in_order`]).
    in_order: bool,
}

/// The context of the thread that reached a wave, to be entered by each of its branches.
pub fn capture() -> Option<Box<dyn Captured>> {
    if !CARRY.load(Ordering::Relaxed) {
        return None;
    }
    crate::exit::attach(|py| {
        let context = copy_current(py)?.unbind();
        let torch = torch_state::capture(py);
        let queues = device_queues::fork(py);
        let in_order = torch.is_some() && torch_state::deterministic(py);
        Some(Box::new(Caller {
            context,
            torch,
            queues,
            in_order,
        }) as Box<dyn Captured>)
    })
}

/// Runs a whole graph in a copy of the caller's context, as each branch runs in a copy of its
/// wave's: what its nodes set never reaches the caller, with or without a wave. One copy, made
/// and entered here, since nobody else enters it.
pub fn isolated(run: &mut dyn FnMut()) {
    if !CARRY.load(Ordering::Relaxed) {
        return run();
    }
    crate::exit::attach(|py| match copy_current(py) {
        Some(context) => run_in(py, &context, None, &mut || torch_state::kept(py, run)),
        None => run(),
    });
}

/// One stream item's own context: a copy of the caller's, and torch's state as the item's nodes
/// left it, entered around each stage of the item on that stage's thread.
struct Item {
    /// Entered by one thread at a time: an item is in one stage at a time.
    context: Py<PyAny>,
    /// torch's state for the item's next stage: the caller's at first, then what the item's
    /// nodes left set. `None` without torch.
    torch: Option<torch_state::Carried>,
}

impl ItemContext for Item {
    fn enter(&mut self, run: &mut dyn FnMut()) {
        crate::exit::attach(|py| {
            let context = self.context.bind(py);
            match &mut self.torch {
                Some(torch) => run_in(py, context, None, &mut || torch.carry(py, run)),
                None => run_in(py, context, None, run),
            }
        });
    }
}

impl Captured for Caller {
    fn for_item(&self) -> Option<Box<dyn ItemContext>> {
        crate::exit::attach(|py| {
            let context = copy_of(py, &self.context)?.unbind();
            let torch = self.torch.as_ref().map(|torch| torch.clone_ref(py));
            Some(Box::new(Item { context, torch }) as Box<dyn ItemContext>)
        })
    }

    fn in_order(&self) -> bool {
        self.in_order
    }

    fn enter(&self, run: &mut dyn FnMut()) {
        crate::exit::attach(|py| {
            let copy = copy_of(py, &self.context);
            let in_context = |run: &mut dyn FnMut()| match &copy {
                Some(copy) => run_in(py, copy, self.torch.as_ref(), run),
                None => run(),
            };
            match &self.queues {
                Some(wave) => device_queues::in_branch(py, wave, &mut || in_context(run)),
                None => in_context(run),
            }
        });
    }
}

/// The four calls of the interpreter's `contextvars` C API that carrying a context needs,
/// declared here because they are not in the limited API an abi3 wheel is built against
/// (`pyo3::ffi` leaves them out there). Every Python from 3.7 on exports them with these
/// signatures (`Include/cpython/context.h`, 3.14's too), and the Python calls that would stand in
/// for them (`copy_context()`, `Context.run`) cost a Python call each per branch; an interpreter
/// that lacked one would refuse to import the module (an undefined symbol), never run it wrongly.
pub(crate) mod contextvars_c {
    use std::os::raw::c_int;

    use pyo3::ffi::PyObject;

    extern "C" {
        pub(crate) fn PyContext_Copy(context: *mut PyObject) -> *mut PyObject;
        pub(crate) fn PyContext_CopyCurrent() -> *mut PyObject;
        pub(crate) fn PyContext_Enter(context: *mut PyObject) -> c_int;
        pub(crate) fn PyContext_Exit(context: *mut PyObject) -> c_int;
    }
}

/// A copy of `context`, a `contextvars.Context`; `None`, the error reported, if none could be
/// made (out of memory), as for [`copy_current`].
fn copy_of<'py>(py: Python<'py>, context: &Py<PyAny>) -> Option<Bound<'py, PyAny>> {
    // SAFETY: the GIL is held and `context` is a `contextvars.Context`; `PyContext_Copy`
    // returns a new reference, or null with an exception set.
    #[allow(unsafe_code)]
    let copy = unsafe {
        Bound::from_owned_ptr_or_err(py, contextvars_c::PyContext_Copy(context.as_ptr()))
    };
    copy.map_err(|error| error.write_unraisable(py, None)).ok()
}

/// A copy of the calling thread's context; `None`, the error reported, if none could be made
/// (out of memory): the work then runs in what its thread holds, as if there were nothing to
/// carry, rather than fail where no node could catch it.
fn copy_current(py: Python<'_>) -> Option<Bound<'_, PyAny>> {
    // SAFETY: the GIL is held; `PyContext_CopyCurrent` returns a new reference, or null with an
    // exception set.
    #[allow(unsafe_code)]
    let context =
        unsafe { Bound::from_owned_ptr_or_err(py, contextvars_c::PyContext_CopyCurrent()) };
    context
        .map_err(|error| error.write_unraisable(py, None))
        .ok()
}

/// Runs `run` with `context` entered on this thread, and torch's state `torch` set if given;
/// puts back what the thread had when `run` returns. `context` must be one that no thread has
/// entered.
fn run_in(
    py: Python<'_>,
    context: &Bound<'_, PyAny>,
    torch: Option<&torch_state::Carried>,
    run: &mut dyn FnMut(),
) {
    // SAFETY: the GIL is held; `context` is a context nobody has entered (the caller's promise),
    // so entering it succeeds.
    #[allow(unsafe_code)]
    let entered = unsafe { contextvars_c::PyContext_Enter(context.as_ptr()) } == 0;
    if !entered {
        PyErr::fetch(py).write_unraisable(py, None);
    }
    match torch {
        Some(torch) => torch.run_in(py, run),
        None => run(),
    }
    if entered {
        // SAFETY: the GIL is held and this thread entered `context` above; every context a node
        // entered since (`Context.run`) it has left again, so `context` is the current one.
        #[allow(unsafe_code)]
        if unsafe { contextvars_c::PyContext_Exit(context.as_ptr()) } != 0 {
            PyErr::fetch(py).write_unraisable(py, None);
        }
    }
}
