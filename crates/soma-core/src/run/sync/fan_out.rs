//! Fan-out: work a frame lends the crew all at once — a wave's branches, a `Map`'s items — each
//! run as a branch, and their outcomes settled into one by one rule.
//!
//! Waves and `each` steps are the same mechanism with different work: both lend their branches
//! what they share from the frame that reached them (through the crew, which owns it meanwhile
//! and leaves it to the run's remains when the caller gives up, [`crate::run::detach`]), run each
//! branch in a copy of the context that frame was in, stop the branches declared after a failing
//! one at their next node boundary, and report the first declared failure. Both walks settle by
//! [`settle`](crate::run::settle): the async walk's branches and items are tasks, not lent
//! threads, but end the same. A captured context that asks for order
//! ([`Captured::in_order`]) has the thread that reached the fan-out run every branch itself,
//! one after another in declared order, the crew offered none.

use std::panic::{self, AssertUnwindSafe};
use std::thread;

use super::lane::Lane;
use crate::run::branch::{Halt, WaveState};
use crate::run::executor::Executor;
use crate::run::hooks::Captured;
use crate::run::settle::Outcome;

/// One fan-out as its branches see it, lent from the frame that reached it: its `locals`,
/// the state through which a failing branch stops its later siblings, the lane around the
/// fan-out, and the context each branch enters a copy of.
pub(super) struct FanOut<'s, L> {
    pub(super) locals: L,
    state: WaveState,
    lane: Lane<'s>,
    captured: Option<Box<dyn Captured>>,
}

impl Executor {
    /// Lends `locals` to one branch for each of `parts`, `task(lent, index, part)` each, on the
    /// crew, and waits for them (polling the watch, the host's hold given up meanwhile); returns
    /// the locals back and what each task returned, in order, a panic or a refused thread as
    /// `Err`. [`Halt::Abandoned`] when the run's caller gave up waiting: the crew then left the
    /// locals to the run's remains for the branches still running.
    ///
    /// A task runs its branches with [`FanOut::branch`]; it may run more than one, one
    /// after another (a `Map`'s items with fewer lanes than items).
    pub(super) fn fan_out<'s, L, P, T>(
        &self,
        lane: Lane<'s>,
        locals: L,
        parts: impl IntoIterator<Item = P>,
        task: &(impl Fn(&FanOut<'s, L>, usize, P) -> T + Sync),
    ) -> Result<(L, Vec<thread::Result<T>>), Halt>
    where
        L: Send + Sync,
        P: Send,
        T: Send,
    {
        let fan = FanOut {
            locals,
            state: WaveState::new(),
            lane,
            captured: self.host.as_ref().and_then(|host| host.capture()),
        };
        if fan.captured.as_deref().is_some_and(Captured::in_order) {
            // Every branch here, one after another, as the crew's owner runs those it claims:
            // nothing is lent elsewhere, so nothing outlives this frame.
            let outcomes = parts
                .into_iter()
                .enumerate()
                .map(|(index, part)| {
                    panic::catch_unwind(AssertUnwindSafe(|| task(&fan, index, part)))
                })
                .collect();
            return Ok((fan.locals, outcomes));
        }
        // This thread runs its share with whatever it holds of the host (the GIL, say) and gives
        // it back only to sleep until the branches run elsewhere are done.
        let fanned = lane.walk.crew.run(
            fan,
            parts,
            task,
            self.host.as_ref(),
            lane.walk.detached,
            |until_done| {
                let mut gave_up = false;
                self.blocking(&mut || gave_up = self.wait(&lane, until_done));
                gave_up
            },
        );
        match fanned {
            Some((fan, outcomes)) => Ok((fan.locals, outcomes)),
            None => Err(Halt::Abandoned),
        }
    }
}

impl<L> FanOut<'_, L> {
    /// Runs `walk` as branch `index` of this fan-out: along a lane of its own in it, in a copy
    /// of the context the fan-out was reached in, a panic caught inside that context (so that
    /// entering it is always matched by leaving it). On failure, a panic or its caller gone,
    /// tells the branches declared after it to stop.
    pub(super) fn branch<R>(
        &self,
        index: usize,
        walk: impl FnOnce(Lane<'_>) -> Result<R, Halt>,
    ) -> Outcome<R> {
        let lane = self.lane.branch(&self.state, index);
        let mut walk = Some(walk);
        let mut outcome = None;
        let mut run = || {
            let walk = walk.take().expect("the context runs the branch once");
            outcome = Some(panic::catch_unwind(AssertUnwindSafe(|| walk(lane))));
        };
        match self.captured.as_deref() {
            Some(captured) => captured.enter(&mut run),
            None => run(),
        }
        let outcome = outcome.expect("the context ran the branch");
        if !matches!(outcome, Ok(Ok(_) | Err(Halt::Cancelled))) {
            self.state.fail(index);
        }
        outcome
    }

    /// Whether a branch declared before `index` has failed: a task that runs several branches
    /// starts no later one then.
    pub(super) fn failed_before(&self, index: usize) -> bool {
        self.state.failed_before(index)
    }
}
