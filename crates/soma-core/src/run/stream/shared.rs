//! What a stream's caller and its stages' workers share: one mutex over the inboxes, the outbox
//! and the figures, a condvar per stage and one for the caller, and the few flags a worker reads
//! between items without the lock.
//!
//! One lock for everything keeps the rules simple — nothing runs, no value is dropped and no
//! host is waited for while it is held — and the module docs of [`super`] say why that is
//! enough: a stage takes every item waiting for it under one lock, and the caller every result.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::figures::StageFigures;
use super::inbox::Inbox;
use super::item::Item;
use super::STOP_GRACE;
use crate::run::hooks::Watch;
use crate::run::latch::{sleep_on, wait_watching};

/// What the stream's caller and its workers share under the one lock.
pub(super) struct StreamState {
    pub(super) inboxes: Vec<Inbox>,
    /// Items done with every stage, keyed by index.
    pub(super) outbox: BTreeMap<u64, Box<Item>>,
    /// Set by the caller once the inputs have run out.
    pub(super) inputs_done: bool,
    /// Set when the stream closes: every worker returns before its next item.
    pub(super) closed: bool,
    /// With [`OnError::Stop`](super::OnError::Stop), the smallest index that failed: no stage
    /// runs an item after it.
    pub(super) stop_after: u64,
    /// Workers not yet returned (or dropped unrun).
    pub(super) alive: usize,
    /// Why a worker never got a thread, until the caller reports it.
    pub(super) lost: Option<String>,
    /// A node's panic, until the caller re-raises it.
    pub(super) panic: Option<Box<dyn Any + Send>>,
    pub(super) caller: Caller,
    pub(super) figures: Vec<StageFigures>,
}

/// Where the caller is, as the last stage sees it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Caller {
    /// Not asleep: it looks at the outbox before it sleeps again.
    Awake,
    /// Asleep on `out_ready`.
    Asleep,
    /// Woken, and not yet back under the lock: waking it again would be a wasted system call.
    Woken,
}

impl StreamState {
    /// Whether stage `at` has an item still to come from before it: one in its inbox or an
    /// earlier one, or held by an earlier stage's worker.
    pub(super) fn upstream(&self, at: usize) -> bool {
        self.inboxes
            .iter()
            .take(at + 1)
            .enumerate()
            .any(|(stage, inbox)| !inbox.items.is_empty() || (stage < at && inbox.held > 0))
    }

    /// Wakes the caller if it sleeps and nobody woke it yet.
    pub(super) fn wake_caller(&mut self, out_ready: &Condvar) {
        match self.caller {
            Caller::Asleep => {
                self.caller = Caller::Woken;
                out_ready.notify_one();
            }
            Caller::Awake | Caller::Woken => {}
        }
    }
}

/// What the stream's caller and its workers share: the state under its lock, the condvars they
/// sleep on, and the flags read without the lock.
pub(super) struct StreamShared {
    pub(super) state: Mutex<StreamState>,
    /// One per stage: where its workers sleep while their inbox has nothing for them.
    pub(super) stage_ready: Box<[Condvar]>,
    /// Where the caller sleeps: for its next result, or for the workers to return.
    pub(super) out_ready: Condvar,
    /// `StreamState::closed`, read by a worker between the items of a batch without the lock.
    pub(super) closed: AtomicBool,
    /// `StreamState::stop_after`, read likewise.
    pub(super) stop_after: AtomicU64,
    /// Whether the caller is reading an input now: a stage idle meanwhile waits for input.
    pub(super) reading: AtomicBool,
    /// Per stage, how many of its workers are running an item now: what a stream that stopped
    /// waiting for them names.
    pub(super) busy: Box<[AtomicUsize]>,
}

impl StreamShared {
    pub(super) fn lock(&self) -> MutexGuard<'_, StreamState> {
        // Nothing that can panic runs under the lock; a poisoned state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every worker has returned, or until `deadline`; with a watch, polls it, and
    /// once it says stop waits [`STOP_GRACE`] more at most.
    pub(super) fn wait_for_workers(&self, watch: Option<&dyn Watch>, deadline: Option<Instant>) {
        let mut returned = |timeout: Option<Duration>| {
            let mut state = self.lock();
            if state.alive > 0 {
                state = sleep_on(&self.out_ready, state, timeout);
            }
            state.alive == 0
        };
        let mut stopping_since: Option<Instant> = None;
        let mut past_grace = || {
            watch.is_some_and(Watch::interrupted)
                && stopping_since.get_or_insert_with(Instant::now).elapsed() >= STOP_GRACE
        };
        let stop: Option<&mut dyn FnMut() -> bool> = match watch {
            Some(_) => Some(&mut past_grace),
            None => None,
        };
        wait_watching(&mut returned, watch, stop, deadline);
    }

    /// Tells every worker to stop, and the caller to look.
    pub(super) fn close(&self, state: &mut StreamState) {
        state.closed = true;
        self.closed.store(true, Ordering::Relaxed);
        for ready in &self.stage_ready {
            ready.notify_all();
        }
        self.out_ready.notify_all();
    }
}
