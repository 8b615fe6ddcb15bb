//! A run its caller can stop waiting for: what the caller's frames lend to branches lives on
//! the heap, and is freed by whoever finishes last.
//!
//! The branches of a wave borrow from the frames of the thread that reached it: the table of
//! values, the wave's shared state, the lane, the work list. Normally that thread waits until
//! every branch has finished, and the borrows end with its frames. But a branch may never finish
//! — it waits for an event a failed sibling was to set, or for a lock, or for the network — and
//! the caller must still get out when Ctrl-C comes or a deadline passes. So, in a run started
//! with [`crate::Executor::run_detachable`], every part of the caller's frames that a branch can
//! borrow is allocated as a [`Kept`] value: freed on return as usual, or, when the caller gives
//! up, handed to the run's [`Remains`], which every wave left unfinished keeps alive and the last
//! branch to finish drops. Only the run's calling thread gives up; every other thread waits for
//! its own waves as before, so what it lends stays alive on its own stack.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::hooks::Watch;
use crate::model::id::NodeId;

/// How long a caller lets a run it stopped (Ctrl-C, a deadline, closing a stream) reach its node
/// boundaries before it stops waiting for those that have not: every walk's and every stream's
/// caller, sync or async, in the engine and in an embedder's waits. Short enough that a run past
/// its deadline reports it within a tenth of a second, polling and the GIL included; long enough
/// for nodes of a few milliseconds to reach their boundary and stop cleanly.
pub const STOP_GRACE: Duration = Duration::from_millis(50);

/// Where `value` lives, for comparing by identity.
fn address<P>(value: &P) -> usize {
    std::ptr::from_ref(value) as usize
}

/// One detachable run's bookkeeping, shared by all its branches.
pub(super) struct Detached {
    /// What the caller left behind when it gave up, freed when the last wave it left finishes.
    /// Weak: the caller holds it for the whole run, and this struct is itself among the parts.
    remains: Weak<Remains>,
    /// Per step slot, whether its node is running: what a deadline's error names.
    running: Box<[AtomicBool]>,
    /// The nodes running inside the run's `Map`, `Switch` and `Loop` steps, by their
    /// namespaced ids (`chunks/embed`), once for each call in flight: kept only for a run with
    /// async nodes (`track_inside`), whose message at a deadline names the async nodes it
    /// cancelled; a sync run names the step, at no cost per node inside it.
    inside: Mutex<Vec<NodeId>>,
    track_inside: bool,
    /// Where the program whose steps `running` is about lives, compared by identity: the
    /// sub-programs of its `Map`, `Switch` and `Loop` steps number slots of their own, and
    /// their steps are not marked (the step that runs them is).
    program_at: usize,
    /// When the caller first saw the watch ask to stop while it waited.
    stop_seen: Mutex<Option<Instant>>,
    /// Set once the caller gave up: every wave it is still inside gives up at once.
    given_up: AtomicBool,
}

impl Detached {
    /// The bookkeeping of a run of `program`, which has `slots` steps. Generic over what a
    /// program is, so that this module need not import the program's, which imports the crew,
    /// which imports this one.
    pub(super) fn new<P>(program: &P, slots: usize, remains: Weak<Remains>) -> Self {
        Self::keeping(program, slots, remains, false)
    }

    /// The bookkeeping of a run of `program`, naming the nodes inside its steps that decide as
    /// running when `inside` says so (see [`Detached::running`]).
    pub(super) fn keeping<P>(
        program: &P,
        slots: usize,
        remains: Weak<Remains>,
        inside: bool,
    ) -> Self {
        Detached {
            remains,
            running: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            inside: Mutex::new(Vec::new()),
            track_inside: inside,
            program_at: address(program),
            stop_seen: Mutex::new(None),
            given_up: AtomicBool::new(false),
        }
    }

    /// Marks node `id`, in `slot` of `program`, as running or not: by its slot when `program`
    /// is the run's own (`Relaxed`: the list it feeds is a report read after the fact, never a
    /// decision), by its id when it is a sub-program's.
    // Inlined: the run's own steps, every step of a chain, pay a comparison and a store.
    #[inline]
    pub(super) fn set_running<P>(&self, program: &P, slot: usize, id: &NodeId, running: bool) {
        if address(program) == self.program_at {
            self.running[slot].store(running, Ordering::Relaxed);
            return;
        }
        if self.track_inside {
            self.set_running_inside(id, running);
        }
    }

    /// [`Detached::set_running`] for a node inside a step that decides.
    #[cold]
    #[inline(never)]
    fn set_running_inside(&self, id: &NodeId, running: bool) {
        let mut inside = self.inside.lock().unwrap_or_else(PoisonError::into_inner);
        if running {
            inside.push(id.clone());
        } else if let Some(at) = inside.iter().position(|running| running == id) {
            inside.swap_remove(at);
        }
    }

    /// The ids of the nodes running now, innermost: the run's own in slot order, a step that
    /// decides replaced by the nodes running inside it (each once, in the order they began).
    pub(super) fn running(&self, ids: &[NodeId]) -> Vec<NodeId> {
        let mut inside = self
            .inside
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut seen = std::collections::HashSet::new();
        inside.retain(|id| seen.insert(id.clone()));
        let mut found: Vec<NodeId> = Vec::new();
        for (running, id) in self.running.iter().zip(ids) {
            if !running.load(Ordering::Relaxed) {
                continue;
            }
            if !holds_inner(&inside, id) {
                found.push(id.clone());
                continue;
            }
            // Innermost: the nodes under this step that hold no running node themselves.
            found.extend(
                inside
                    .iter()
                    .filter(|inner| NodeId::within(inner.as_str(), id.as_str()).is_some())
                    .filter(|inner| !holds_inner(&inside, inner))
                    .cloned(),
            );
        }
        found
    }

    /// Asked by the waiting caller between polls of `watch`: whether to stop waiting. Yes once
    /// the watch has asked the run to stop for [`STOP_GRACE`], and from then on at every level.
    pub(super) fn give_up(&self, watch: &dyn Watch) -> bool {
        if self.given_up.load(Ordering::Relaxed) {
            return true;
        }
        if !watch.interrupted() {
            return false;
        }
        let mut seen = self
            .stop_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let since = *seen.get_or_insert_with(Instant::now);
        if since.elapsed() < STOP_GRACE {
            return false;
        }
        self.given_up.store(true, Ordering::Relaxed);
        true
    }

    /// Whether the caller gave up on the run.
    pub(super) fn given_up(&self) -> bool {
        self.given_up.load(Ordering::Relaxed)
    }

    /// The run's remains, for the caller leaving its parts there: it holds them until the run
    /// returns, so they are there.
    pub(super) fn remains(&self) -> Arc<Remains> {
        self.remains
            .upgrade()
            .expect("the caller holds the remains for the whole run")
    }
}

/// What a caller that gave up left behind: the heap parts its frames lent to branches still
/// running. Dropped — and the parts freed — when the last holder lets go: the caller itself,
/// and every wave it left unfinished until its last branch finishes.
pub(crate) struct Remains {
    parts: Mutex<Vec<Leftover>>,
}

impl Remains {
    pub(super) fn new() -> Self {
        Remains {
            parts: Mutex::new(Vec::new()),
        }
    }
}

/// One [`Kept`] value left over to the remains, with the function that frees it.
struct Leftover {
    at: *mut (),
    free: unsafe fn(*mut ()),
}

// SAFETY: a leftover is only ever a `Kept<T>` with `T: Send` (see `Kept::leave`), freed once.
#[allow(unsafe_code)]
unsafe impl Send for Leftover {}

impl Drop for Remains {
    fn drop(&mut self) {
        let parts = std::mem::take(self.parts.get_mut().unwrap_or_else(PoisonError::into_inner));
        // Inner parts were left first; free them first too, as unwinding frames would.
        for part in parts {
            // SAFETY: every holder has let go, so no branch borrows from the part any more, and
            // `free` is the one matching its type.
            #[allow(unsafe_code)]
            unsafe {
                (part.free)(part.at);
            }
        }
    }
}

/// A value lent to branches from a frame of a detachable run's caller: on the heap, freed when
/// dropped, or left to the run's [`Remains`] by [`Kept::leave`].
///
/// Its address is taken once, as a raw pointer, and every borrow is made from that pointer:
/// handing the value over therefore never moves or re-borrows it while branches hold borrows.
pub(super) struct Kept<T> {
    at: *mut T,
}

#[allow(unsafe_code)]
impl<T> Kept<T> {
    pub(super) fn new(value: T) -> Self {
        Kept {
            at: Box::into_raw(Box::new(value)),
        }
    }

    /// The raw address, from which the caller makes the borrows it lends.
    pub(super) fn as_ptr(&self) -> *mut T {
        self.at
    }

    pub(super) fn get(&self) -> &T {
        // SAFETY: alive until `self` is dropped, taken back or left, none of which can happen
        // while this borrow of `self` lasts.
        unsafe { &*self.at }
    }

    pub(super) fn get_mut(&mut self) -> &mut T {
        // SAFETY: as in `get`, and `&mut self` makes the borrow unique.
        unsafe { &mut *self.at }
    }

    /// The value back, once nothing borrows from it.
    pub(super) fn into_inner(self) -> T {
        let at = self.at;
        std::mem::forget(self);
        // SAFETY: made by `Box::into_raw` in `new`, and `self` is forgotten, so freed once.
        *unsafe { Box::from_raw(at) }
    }
}

#[allow(unsafe_code)]
impl<T: Send> Kept<T> {
    /// Hands the value to `remains`, to be freed when the last holder of `remains` lets go.
    /// For a caller that stops waiting while branches may still borrow from it.
    pub(super) fn leave(self, remains: &Remains) {
        /// Frees a `Kept<T>`'s value.
        ///
        /// # Safety
        /// `at` came from `Box::into_raw` of a `T`, and is freed once.
        unsafe fn free<T>(at: *mut ()) {
            // SAFETY: forwarded from the caller.
            drop(unsafe { Box::from_raw(at.cast::<T>()) });
        }
        let part = Leftover {
            at: self.at.cast(),
            free: free::<T>,
        };
        std::mem::forget(self);
        remains
            .parts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(part);
    }
}

impl<T> Drop for Kept<T> {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` in `new`; `into_inner` and `leave` forget `self`, so
        // this is the one place it is freed on the ordinary path.
        #[allow(unsafe_code)]
        drop(unsafe { Box::from_raw(self.at) });
    }
}

/// Whether some node in `inside` runs inside step `step` (its id under `step/`).
fn holds_inner(inside: &[NodeId], step: &NodeId) -> bool {
    inside
        .iter()
        .any(|id| NodeId::within(id.as_str(), step.as_str()).is_some())
}
