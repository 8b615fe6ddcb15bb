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
use std::time::Instant;

use super::figures::StageFigures;
use super::inbox::Inbox;
use super::item::Item;
use super::{STOP_GRACE, WATCH_INTERVAL};
use crate::run::hooks::Watch;

pub(super) struct State {
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

impl State {
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

pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// One per stage: where its workers sleep while their inbox has nothing for them.
    pub(super) stage_ready: Box<[Condvar]>,
    /// Where the caller sleeps: for its next result, or for the workers to return.
    pub(super) out_ready: Condvar,
    /// `State::closed`, read by a worker between the items of a batch without the lock.
    pub(super) closed: AtomicBool,
    /// `State::stop_after`, read likewise.
    pub(super) stop_after: AtomicU64,
    /// Whether the caller is reading an input now: a stage idle meanwhile waits for input.
    pub(super) reading: AtomicBool,
    /// Per stage, how many of its workers are running an item now: what a stream that stopped
    /// waiting for them names.
    pub(super) busy: Box<[AtomicUsize]>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing that can panic runs under the lock; a poisoned state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every worker has returned; with a watch, polls it, and once it says stop
    /// waits [`STOP_GRACE`] more at most.
    pub(super) fn wait_for_workers(&self, watch: Option<&dyn Watch>) {
        let mut stopping_since: Option<Instant> = None;
        let mut state = self.lock();
        while state.alive > 0 {
            let Some(watch) = watch else {
                state = self
                    .out_ready
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            state = self
                .out_ready
                .wait_timeout(state, WATCH_INTERVAL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if state.alive == 0 {
                break;
            }
            drop(state);
            // Out of the lock: a watch may take the host's lock to look for signals.
            watch.poll();
            if watch.interrupted()
                && stopping_since.get_or_insert_with(Instant::now).elapsed() >= STOP_GRACE
            {
                return;
            }
            state = self.lock();
        }
    }

    /// Waits until every worker has returned, or until `until`.
    pub(super) fn wait_for_workers_until(&self, until: Instant) {
        let mut state = self.lock();
        while state.alive > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            state = self
                .out_ready
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Tells every worker to stop, and the caller to look.
    pub(super) fn close(&self, state: &mut State) {
        state.closed = true;
        self.closed.store(true, Ordering::Relaxed);
        for ready in &self.stage_ready {
            ready.notify_all();
        }
        self.out_ready.notify_all();
    }
}
