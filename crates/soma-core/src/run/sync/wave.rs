//! A wave: its branches handed to threads at once, joined, and settled into one outcome.
//!
//! Every branch runs in the context its wave was reached in: the host captures it once per
//! wave, on the thread that reached it ([`crate::Host::capture`]), and each branch enters a copy
//! of its own on the thread that runs it — the caller's own thread too, so that what one branch
//! changes is seen neither by its siblings nor by the code after the wave.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::lane::Lane;
use super::prefetch_ahead;
use crate::model::value::Value;
use crate::run::branch::Halt;
use crate::run::detach::{Detached, Kept};
use crate::run::error::RunError;
use crate::run::executor::Executor;
use crate::run::hooks::Captured;
use crate::run::latch::{wait_watching, Delivery, Waited};
use crate::run::program::Op;
use crate::run::settle::{refused_or_raised, settle};
use crate::run::table::{Frame, Shared};
use crate::run::trace::{set_thread_role, ThreadRole};

thread_local! {
    /// Waves this thread is inside of, one in another, since its stack began.
    static NESTED: Cell<u32> = const { Cell::new(0) };
    /// How many it may be inside of before the next runs on a fresh stack.
    static ROOM: Cell<u32> = const { Cell::new(WAVES_PER_STACK) };
}

/// How many waves a thread walks into, one inside another, before the next runs on a fresh
/// stack: few enough that their frames fit the smallest stack a branch may run on (a thread of
/// the caller's with 2 MiB). A level takes about 3 to 5 kB in a release build (the walk fits
/// a 1 MiB stack); a debug build keeps a slot for every local of what the plain call inlines
/// into the sequence's loop, 20 to 40 kB a level, and hops four times as often.
const WAVES_PER_STACK: u32 = if cfg!(debug_assertions) { 48 } else { 192 };

/// The stack of a thread started to go deeper: reserved, not used, until the walk gets there.
const FRESH_STACK: usize = 256 << 20;

/// How many waves a thread started to go deeper walks into before it starts the next one, so
/// that a graph nested a hundred thousand levels deep uses a handful of them.
const WAVES_PER_FRESH_STACK: u32 = if cfg!(debug_assertions) {
    4_096
} else {
    16_384
};

/// How many waves a `Map`, `Switch` or `Loop` step counts for, one inside another: an item, a
/// case or an iteration runs through more frames than a branch does (the step, its item, the
/// run of its sub-program), about as many as this many waves take in a debug build.
const WAVES_PER_DECISION: u32 = 16;

/// Counts the levels it stands for left, on return or unwind.
struct LevelsEntered(u32);

impl LevelsEntered {
    /// `levels` more levels entered on this thread.
    fn enter(levels: u32) -> LevelsEntered {
        NESTED.with(|nested| nested.set(nested.get() + levels));
        LevelsEntered(levels)
    }
}

impl Drop for LevelsEntered {
    fn drop(&mut self) {
        NESTED.with(|nested| nested.set(nested.get() - self.0));
    }
}

/// Whether `levels` more fit on this thread's stack before the walk moves to a fresh one.
fn fits(levels: u32) -> bool {
    NESTED.with(Cell::get) + levels <= ROOM.with(Cell::get)
}

impl Executor {
    pub(super) fn wave(
        &self,
        branches: &[Op],
        bounds: &[usize],
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        if let [only] = branches {
            return self.walk(only, input, frame, lane);
        }
        if !fits(1) {
            return self.on_a_fresh_stack(frame, lane, &|frame| {
                self.wave(branches, bounds, input, frame, lane)
            });
        }
        let _out = LevelsEntered::enter(1);
        // Split the table: everything before the wave becomes read-only for its branches, and
        // the wave's range is cut into one disjoint mutable part per branch.
        let (lo, hi) = (bounds[0], bounds[bounds.len() - 1]);
        let (before, after) = frame.own.split_at_mut(lo - frame.base);
        let shared = Shared {
            base: frame.base,
            cells: before,
            outer: frame.shared,
        };
        let mut remaining = &mut after[..hi - lo];
        let parts = bounds.windows(2).map(move |window| {
            let (own, tail) = std::mem::take(&mut remaining).split_at_mut(window[1] - window[0]);
            remaining = tail;
            (window[0], own)
        });
        let prefetching = lane.prefetching;
        let (_, outcomes) = self.fan_out(lane, shared, parts, &|fan, index, (base, own)| {
            // Whoever takes this branch likely takes the next one after it.
            if prefetching {
                prefetch_ahead(branches.get(index + 1), branches.get(index + 2));
            }
            let mut own = Frame {
                base,
                own,
                shared: Some(&fan.locals),
            };
            fan.branch(index, |lane| {
                self.walk(&branches[index], input, &mut own, lane)
            })
        })?;
        settle(
            outcomes
                .into_iter()
                .map(|ended| Some(ended.and_then(|walked| walked))),
        )
        .map(drop)
    }

    /// Runs a `Map`, `Switch` or `Loop` step — `decide`, on `frame` — here, or on a fresh
    /// stack when this one holds as many levels as it has room for: an item, a case or an
    /// iteration runs inline, as a wave's first branch does, so steps nested in steps add
    /// frames to one stack as waves nested in waves do, and hop the same way.
    pub(super) fn decision_level(
        &self,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
        decide: &(dyn Fn(&mut Frame<'_>) -> Result<(), Halt> + Sync),
    ) -> Result<(), Halt> {
        if !fits(WAVES_PER_DECISION) {
            return self.on_a_fresh_stack(frame, lane, decide);
        }
        let _out = LevelsEntered::enter(WAVES_PER_DECISION);
        decide(frame)
    }

    /// Runs `walk` — a wave, or a step that decides — on a thread of its own, started for it
    /// with a stack of its own, while this thread waits (polling the watch if it started the
    /// run, the host's lock given up).
    ///
    /// A wave's first branch runs inline, so every level of waves nested in one another adds
    /// frames to one stack; a graph nested a hundred thousand levels deep would overflow any
    /// stack. Every [`WAVES_PER_STACK`] levels (then every [`WAVES_PER_FRESH_STACK`]) the walk
    /// moves to a fresh stack instead: a deep graph costs one short-lived, waiting thread per
    /// that many levels, and no stack grows with depth. The deeper thread reaches the wave in
    /// the context this thread reached it in, captured here and owned by that thread.
    fn on_a_fresh_stack(
        &self,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
        walk: &(dyn Fn(&mut Frame<'_>) -> Result<(), Halt> + Sync),
    ) -> Result<(), Halt> {
        // The deeper thread borrows the frame itself: kept on the heap, like a wave's locals,
        // in case this thread is the caller and stops waiting.
        let mut kept = Kept::new(frame.reborrow());
        let deeper_frame = kept.get_mut();
        // Where the deeper thread leaves its outcome, and the caller what it left when it
        // stopped waiting, kept until that thread is done.
        let meeting: Arc<Delivery<thread::Result<Result<(), Halt>>>> = Arc::new(Delivery::new());
        let until_done = |timeout: Option<Duration>| meeting.wait(timeout);
        let theirs = Arc::clone(&meeting);
        let captured = self.host.as_ref().and_then(|host| host.capture());
        let deeper = move || {
            ROOM.with(|room| room.set(WAVES_PER_FRESH_STACK));
            let mut outcome = None;
            let mut wave = || {
                outcome = Some(panic::catch_unwind(AssertUnwindSafe(|| walk(deeper_frame))));
            };
            self.on_a_thread_of_its_own(captured.as_deref(), &mut wave);
            // Delivered once out of the host's hold and the context, and last: the waiter may
            // leave, and let go of what this thread borrows, as soon as it sees it, and what
            // the caller left on the delivery, which may include everything this thread
            // borrowed, is let go of as it is delivered.
            theirs.deliver(outcome.expect("the host ran the deeper walk"));
        };
        let mut outcome = None;
        // The whole wait is without the host's lock: the deeper thread takes it to run its
        // nodes, and needs it once more to end (a host may keep state per thread).
        let mut deeper = Some(deeper);
        self.blocking(&mut || {
            let spawned = thread::Builder::new()
                .name("soma-deeper".to_owned())
                .stack_size(FRESH_STACK);
            let mut deeper = deeper.take().expect("the host runs the wait once");
            // SAFETY: the thread borrows from this frame and the ones above it. This function
            // either joins it before returning, or — when the run's caller gives up — leaves
            // the one borrowed part of this frame, `kept`, to the run's remains, as every wave
            // above it on this thread does with its own, so that all it borrows outlives it.
            #[allow(unsafe_code)]
            let spawned = unsafe {
                spawned.spawn_unchecked(move || {
                    // Its spans' track: a thread Soma started, as a crew's is.
                    set_thread_role(ThreadRole::Crew);
                    deeper();
                })
            };
            outcome = Some(match spawned {
                Err(refused) => Err(Halt::Failed(RunError::NoThread {
                    reason: refused.to_string(),
                })),
                Ok(handle) => {
                    if self.wait(&lane, &until_done) {
                        // Detached: it ends on its own once its branches do.
                        drop(handle);
                        Err(Halt::Abandoned)
                    } else {
                        handle
                            .join()
                            .unwrap_or_else(|payload| panic::resume_unwind(payload));
                        meeting
                            .take()
                            .expect("the deeper thread recorded its outcome")
                            .unwrap_or_else(|payload| panic::resume_unwind(payload))
                    }
                }
            });
        });
        let outcome = outcome.expect("the host ran the wait");
        if let Some(remains) = outcome
            .as_ref()
            .err()
            .and_then(|halt| halt.remains_if_given_up(lane.walk.detached))
        {
            kept.leave(&remains);
            meeting.leave(&remains);
        }
        outcome
    }

    /// Walks `op` on a thread the crew lends while this thread — the run's caller — only waits,
    /// polling the watch, as it waits for a wave: for a run with a deadline, whose caller must
    /// return by it whatever a node does. The lent thread walks in the context this thread is
    /// in, captured here as for a wave's branches, and holds the host (the GIL) as a branch's
    /// thread does; unlike a branch it adds no wave to the path its spans report.
    pub(super) fn walk_elsewhere(
        &self,
        op: &Op,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        // What the lent thread borrows from this frame: the crew owns it meanwhile, in case the
        // caller stops waiting.
        let lent = (
            frame.reborrow(),
            self.host.as_ref().and_then(|host| host.capture()),
        );
        let task = move |(lent_frame, captured): &mut (Frame<'_>, Option<Box<dyn Captured>>)| {
            // Caught inside the context, so that entering it is always matched by leaving it.
            let mut walked = None;
            let mut walk = || {
                walked = Some(panic::catch_unwind(AssertUnwindSafe(|| {
                    self.walk(op, input, lent_frame, lane)
                })));
            };
            match captured.as_deref() {
                Some(captured) => captured.enter(&mut walk),
                None => walk(),
            }
            walked
                .expect("the context ran the walk")
                .unwrap_or_else(|payload| panic::resume_unwind(payload))
        };
        // The host's hold (the GIL) is given up before the task is offered, not after: the lent
        // thread takes it at once instead of sleeping until this thread lets go.
        let (mut handed, mut outcome) = (Some((lent, task)), None);
        self.blocking(&mut || {
            let (lent, task) = handed.take().expect("the host runs the hand-off once");
            outcome = Some(lane.walk.crew.hand_off(
                lent,
                task,
                self.host.as_ref(),
                lane.walk.detached,
                |until_done| self.wait(&lane, until_done),
            ));
        });
        let Some((_, outcome)) = outcome.expect("the host ran the hand-off") else {
            return Err(Halt::Abandoned);
        };
        outcome.unwrap_or_else(|payload| Err(refused_or_raised(payload)))
    }

    /// Runs `work` as a thread that is not the wave's runs a branch: inside the host's hold on
    /// the thread, in a copy of `captured`.
    fn on_a_thread_of_its_own(&self, captured: Option<&dyn Captured>, work: &mut dyn FnMut()) {
        let mut run = || match captured {
            Some(captured) => captured.enter(work),
            None => work(),
        };
        match &self.host {
            Some(host) => host.branch(&mut run),
            None => run(),
        }
    }

    /// Blocks until the branches finish. The thread that started the run also polls the watch
    /// while it waits, so that an interruption only it can see (a signal, on a host's main
    /// thread) reaches the branches; every other thread sleeps until there is something to do.
    ///
    /// Returns whether it gave up instead: only the caller of a detachable run does, once the
    /// watch has asked the run to stop and branches are still running after
    /// [`STOP_GRACE`](crate::run::detach::STOP_GRACE).
    pub(super) fn wait(
        &self,
        lane: &Lane<'_>,
        until_done: &(dyn Fn(Option<Duration>) -> bool + Sync),
    ) -> bool {
        let walk = lane.walk;
        match self.watch.as_deref() {
            Some(watch) if thread::current().id() == walk.caller => {
                // A wave the caller reaches again while leaving one it gave up on is given up
                // at once.
                if walk.detached.is_some_and(Detached::given_up) {
                    return true;
                }
                let mut give_up = || walk.detached.is_some_and(|run| run.give_up(watch));
                let waited = wait_watching(
                    &mut |timeout| until_done(timeout),
                    Some(watch),
                    Some(&mut give_up),
                    None,
                );
                waited == Waited::Stopped
            }
            Some(_) | None => {
                wait_watching(&mut |timeout| until_done(timeout), None, None, None);
                false
            }
        }
    }
}
