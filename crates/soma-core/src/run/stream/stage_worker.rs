//! One worker of one stage of a stream, on a thread lent by the program's crew for the stream's
//! life: it takes the items its inbox lets it, runs its stage on each inside the item's own
//! context, and hands each on the moment it is done.
//!
//! The worker is where an item's run happens: the stage walked by the executor over the item's
//! table, a node's panic caught and handed to the caller, a failure under
//! [`OnError::Stop`](super::OnError::Stop) keeping every stage from the items after it. Its
//! idle time, and why it was idle, go to its stage's figures ([`super::figures`]).

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::figures::{Idle, Sleep};
use super::item::Item;
use super::settings::{OnError, StreamSettings};
use super::shared::StreamShared;
use super::stages::stages;
use crate::run::executor::Executor;
use crate::run::hooks::Captured;
use crate::run::program::{Op, Program};
use crate::run::sync::Start;
use crate::run::table::Frame;

/// One worker of one stage, on a lent thread; counted alive until it is dropped, run or not.
pub(super) struct StageWorker {
    pub(super) shared: Arc<StreamShared>,
    pub(super) program: Arc<Program>,
    pub(super) settings: Arc<StreamSettings>,
    pub(super) stage: usize,
    /// The caller's context (as the host captured it when the stream started), entered by the
    /// worker around its whole life on its thread, as a wave's branch enters its wave's.
    pub(super) captured: Option<Arc<dyn Captured>>,
    /// Whether it got a thread: dropped without, it tells the caller, which would wait forever.
    pub(super) ran: bool,
}

impl Drop for StageWorker {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.alive -= 1;
        if !self.ran && !state.closed && state.lost.is_none() {
            state.lost = Some("no thread was free for a stage of the stream".to_owned());
        }
        self.shared.out_ready.notify_all();
    }
}

impl StageWorker {
    pub(super) fn run(&mut self) {
        self.ran = true;
        match self.captured.clone() {
            Some(captured) => captured.enter(&mut || self.serve()),
            None => self.serve(),
        }
    }

    /// Takes, runs and passes on items until the stream closes. Never unwinds: a node's panic
    /// is caught and handed to the caller.
    ///
    /// A serial stage takes every item waiting for it at once (one lock for the lot), and hands
    /// each on the moment it is done: the next item may be a slow one, and the next stage must
    /// not wait for it.
    fn serve(&self) {
        let executor = &self.settings.executor;
        let all = stages(&self.program);
        let (op, drops) = all[self.stage];
        let last = self.stage + 1 == all.len();
        let mut batch = VecDeque::new();
        let mut idle = Idle::default();
        while self.take(executor, &mut batch, &mut idle) {
            let mut started = Instant::now();
            while let Some(mut item) = batch.pop_front() {
                if self.shared.closed.load(Ordering::Relaxed) {
                    // The caller has taken the inboxes away: what this worker holds is dropped
                    // here, out of the lock.
                    drop((item, std::mem::take(&mut batch)));
                    return;
                }
                if item.index > self.shared.stop_after.load(Ordering::Relaxed) {
                    // An earlier item failed and the stream stops there: this one is never
                    // handed back.
                    drop(item);
                    self.pass(None, Duration::ZERO, &mut idle);
                    started = Instant::now();
                    continue;
                }
                if item.failed.is_none() {
                    let busy = &self.shared.busy[self.stage];
                    busy.fetch_add(1, Ordering::Relaxed);
                    let ran = self.run_in_context(&mut item, executor, op, drops, last);
                    busy.fetch_sub(1, Ordering::Relaxed);
                    if let Err(payload) = ran {
                        self.panicked(payload);
                        drop((item, std::mem::take(&mut batch)));
                        return;
                    }
                }
                // One clock reading an item: where one ends the next begins.
                let now = Instant::now();
                self.pass(Some(item), now - started, &mut idle);
                started = now;
            }
        }
    }

    /// Records a node's panic for the caller (the first one: a later one is dropped, out of
    /// the lock) and closes the stream.
    fn panicked(&self, payload: Box<dyn Any + Send>) {
        let mut state = self.shared.lock();
        let later = match state.panic {
            None => {
                state.panic = Some(payload);
                None
            }
            Some(_) => Some(payload),
        };
        self.shared.close(&mut state);
        drop(state);
        drop(later);
    }

    /// Runs this stage on `item` inside the item's own context, if it has one; a node's panic
    /// is caught inside the context, and handed back.
    fn run_in_context(
        &self,
        item: &mut Item,
        executor: &Executor,
        op: &Op,
        drops: &[usize],
        last: bool,
    ) -> Result<(), Box<dyn Any + Send>> {
        let mut context = item.context.take();
        let mut ran = Ok(());
        let mut run = || {
            ran = panic::catch_unwind(AssertUnwindSafe(|| {
                self.run_item(executor, op, drops, last, item);
            }));
        };
        match &mut context {
            Some(context) => context.enter(&mut run),
            None => run(),
        }
        item.context = context;
        ran
    }

    fn run_item(&self, executor: &Executor, op: &Op, drops: &[usize], last: bool, item: &mut Item) {
        let mut frame = Frame {
            base: 0,
            own: &mut item.table,
            shared: None,
        };
        let start = Start {
            crew: &self.program.crew,
            caller: thread::current().id(),
            detached: None,
            awaited_by: None,
            program: &self.program,
            keys: item.keys.as_ref(),
            prefetching: self.program.prefetching(),
            board: item.board.as_ref().map(|board| &*board.0),
        };
        let walked = executor.walk_from(
            &start,
            std::slice::from_ref(op),
            &[],
            0..1,
            &item.input,
            &mut frame,
        );
        match walked {
            Ok(()) if !last => {
                for &slot in drops {
                    item.table[slot] = None;
                }
            }
            walked => {
                // The last stage, or a failure: what a run would have returned.
                let input = &item.input;
                match Executor::finish(&self.program, walked, &mut item.table, || input.clone()) {
                    Ok(value) => item.result = Some(value),
                    Err(error) => item.failed = Some(error),
                }
                item.table = Box::new([]);
            }
        }
    }

    /// Fills `batch` with the items this stage runs next; `false` once closed. The time it
    /// sleeps for want of items goes to `idle`, as waiting or blocked.
    fn take(&self, executor: &Executor, batch: &mut VecDeque<Box<Item>>, idle: &mut Idle) -> bool {
        let (shared, at) = (&*self.shared, self.stage);
        let mut slept: Option<Sleep> = None;
        loop {
            let mut state = shared.lock();
            if state.closed {
                return false;
            }
            state.inboxes[at].take(batch);
            if let Some(first) = batch.front() {
                let read_at = first.read_at;
                drop(state);
                if let Some(sleep) = slept {
                    idle.add(sleep, Some(read_at));
                }
                return true;
            }
            // Why it is about to be idle: an item is still to come from before it (or from the
            // inputs being read), or everything in flight is past it and the caller reads no
            // more for now.
            let blocked = !state.upstream(at)
                && !state.inputs_done
                && !shared.reading.load(Ordering::Relaxed);
            drop(state);
            if let Some(sleep) = slept.take() {
                idle.add(sleep, None);
            }
            let from = Instant::now();
            // Asleep with the host's lock given back, so the stages before can run.
            executor.blocking(&mut || {
                let mut state = shared.lock();
                state.inboxes[at].sleeping += 1;
                while !state.closed && !state.inboxes[at].ready() {
                    state = shared.stage_ready[at]
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                let inbox = &mut state.inboxes[at];
                inbox.sleeping -= 1;
                inbox.waking = inbox.waking.saturating_sub(1);
            });
            slept = Some(Sleep {
                from,
                to: Instant::now(),
                blocked,
            });
        }
    }

    /// Hands `item` to the next stage, or to the caller after the last (`None`: one dropped
    /// after a failure that stops the stream), and counts it and the time spent on it in the
    /// stage's figures.
    fn pass(&self, item: Option<Box<Item>>, busy: Duration, idle: &mut Idle) {
        let shared = &*self.shared;
        let mut state = shared.lock();
        let figures = &mut state.figures[self.stage];
        figures.busy += busy;
        figures.waiting += std::mem::take(&mut idle.waiting);
        figures.blocked += std::mem::take(&mut idle.blocked);
        if state.closed {
            // The caller has taken the inboxes away: the item is dropped out of the lock.
            drop(state);
            drop(item);
            return;
        }
        state.inboxes[self.stage].held -= 1;
        let Some(item) = item else {
            return;
        };
        state.figures[self.stage].items += 1;
        if item.failed.is_some() && self.settings.on_error == OnError::Stop {
            state.stop_after = state.stop_after.min(item.index);
            shared.stop_after.store(state.stop_after, Ordering::Relaxed);
        }
        let next = self.stage + 1;
        if next < state.inboxes.len() {
            let inbox = &mut state.inboxes[next];
            inbox.items.insert(item.index, item);
            inbox.wake(&shared.stage_ready[next]);
        } else {
            state.outbox.insert(item.index, item);
            state.wake_caller(&shared.out_ready);
        }
    }
}
