//! Fan-out: work a frame lends the crew all at once — a wave's branches, a `Map`'s items — each
//! run as a branch, and their outcomes settled into one by one rule.
//!
//! Waves and `each` steps are the same mechanism with different work: both lend their branches
//! what they share from the frame that reached them (through the crew, which owns it meanwhile
//! and leaves it to the run's remains when the caller gives up, [`crate::run::detach`]), run each
//! branch in a copy of the context that frame was in, stop the branches declared after a failing
//! one at their next node boundary, and report the first declared failure. Both walks settle by
//! [`settle`]: the async walk's branches and items are tasks, not lent threads, but end the same.
//! A captured context that asks for order ([`Captured::in_order`]) has the thread that reached
//! the fan-out run every branch itself, one after another in declared order, the crew offered
//! none.
//!
//! # How a fan-out settles
//!
//! Its outcomes in declaration order: a panic is re-raised, the first declared; else the first
//! declared failure is the fan-out's (a branch that never got a thread or a task failed there);
//! else the first declared stop (cancelled, its caller gone, or never started); else every
//! value, in order.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use super::crew::Refused;
use super::error::RunError;
use super::executor::{Executor, Halt};
use super::hooks::Captured;
use super::lane::{Lane, WaveState};

/// One fan-out as its branches see it, lent from the frame that reached it: its `locals`,
/// the state through which a failing branch stops its later siblings, the lane around the
/// fan-out, and the context each branch enters a copy of.
pub(super) struct FanOut<'s, L> {
    pub(super) locals: L,
    state: WaveState,
    lane: Lane<'s>,
    captured: Option<Box<dyn Captured>>,
}

/// One branch's outcome: its walk's, a panic caught as `Err`.
pub(super) type Outcome<R> = thread::Result<Result<R, Halt>>;

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
            state: WaveState {
                first_failed: AtomicUsize::new(usize::MAX),
            },
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
            self.state.first_failed.fetch_min(index, Ordering::AcqRel);
        }
        outcome
    }

    /// Whether a branch declared before `index` has failed: a task that runs several branches
    /// starts no later one then.
    pub(super) fn failed_before(&self, index: usize) -> bool {
        self.state.first_failed.load(Ordering::Acquire) < index
    }
}

/// A fan-out's outcomes, by declared index, settled into one as the module docs say; `None`
/// for a branch never started, which counts as stopped (it was not started because one before
/// it failed, or because the fan-out was stopped).
pub(super) fn settle<R>(
    outcomes: impl IntoIterator<Item = Option<Outcome<R>>>,
) -> Result<Vec<R>, Halt> {
    let outcomes = outcomes.into_iter();
    let mut values = Vec::with_capacity(outcomes.size_hint().0);
    let (mut failed, mut stopped) = (None, None);
    for outcome in outcomes {
        let Some(outcome) = outcome else {
            stopped.get_or_insert(Halt::Cancelled);
            continue;
        };
        // A panic is re-raised here, at the first one declared, whatever failed before it.
        match outcome.unwrap_or_else(|payload| Err(refused_or_raised(payload))) {
            Ok(value) => values.push(value),
            Err(Halt::Failed(error)) => {
                failed.get_or_insert(error);
            }
            Err(halt @ (Halt::Cancelled | Halt::Abandoned)) => {
                stopped.get_or_insert(halt);
            }
        }
    }
    match (failed, stopped) {
        (Some(error), _) => Err(Halt::Failed(error)),
        (None, Some(halt)) => Err(halt),
        (None, None) => Ok(values),
    }
}

/// What a branch that did not return left in its outcome: the failure of a branch that never
/// got a thread, or else a panic, re-raised here.
pub(super) fn refused_or_raised(payload: Box<dyn Any + Send>) -> Halt {
    match payload.downcast::<Refused>() {
        Ok(refused) => Halt::Failed(RunError::NoThread { reason: refused.0 }),
        Err(payload) => panic::resume_unwind(payload),
    }
}

#[cfg(test)]
mod tests {
    //! The settle rule against its statement, on random outcomes: each kind of outcome found by
    //! its first position, not by the order `settle` happens to read them in.

    use std::panic::{self, AssertUnwindSafe};

    use proptest::prelude::*;

    use super::{settle, Halt, Outcome, Refused, RunError};

    /// One branch's outcome, as data the test can make many of.
    #[derive(Clone, Copy, Debug)]
    enum Made {
        Value(u8),
        Failed(u8),
        Cancelled,
        Abandoned,
        Panicked(u8),
        NoThread,
        NeverStarted,
    }

    fn made() -> impl Strategy<Value = Made> {
        prop_oneof![
            4 => any::<u8>().prop_map(Made::Value),
            1 => any::<u8>().prop_map(Made::Failed),
            1 => Just(Made::Cancelled),
            1 => Just(Made::Abandoned),
            1 => any::<u8>().prop_map(Made::Panicked),
            1 => Just(Made::NoThread),
            1 => Just(Made::NeverStarted),
        ]
    }

    fn failure(tag: u8) -> RunError {
        RunError::NoThread {
            reason: format!("failure {tag}"),
        }
    }

    fn outcome(made: Made) -> Option<Outcome<u8>> {
        match made {
            Made::Value(value) => Some(Ok(Ok(value))),
            Made::Failed(tag) => Some(Ok(Err(Halt::Failed(failure(tag))))),
            Made::Cancelled => Some(Ok(Err(Halt::Cancelled))),
            Made::Abandoned => Some(Ok(Err(Halt::Abandoned))),
            Made::Panicked(tag) => Some(Err(Box::new(tag))),
            Made::NoThread => Some(Err(Box::new(Refused("no thread".to_owned())))),
            Made::NeverStarted => None,
        }
    }

    /// What the rule says `made` settles into: `Err(tag)` for a panic re-raised.
    fn expected(made: &[Made]) -> Result<Result<Vec<u8>, String>, u8> {
        if let Some(tag) = made.iter().find_map(|m| match m {
            Made::Panicked(tag) => Some(*tag),
            _ => None,
        }) {
            return Err(tag);
        }
        if let Some(error) = made.iter().find_map(|m| match m {
            Made::Failed(tag) => Some(failure(*tag).to_string()),
            Made::NoThread => Some(
                RunError::NoThread {
                    reason: "no thread".to_owned(),
                }
                .to_string(),
            ),
            _ => None,
        }) {
            return Ok(Err(error));
        }
        if let Some(stop) = made.iter().find_map(|m| match m {
            Made::Cancelled | Made::NeverStarted => Some("cancelled"),
            Made::Abandoned => Some("abandoned"),
            _ => None,
        }) {
            return Ok(Err(stop.to_owned()));
        }
        Ok(Ok(made
            .iter()
            .filter_map(|m| match m {
                Made::Value(value) => Some(*value),
                _ => None,
            })
            .collect()))
    }

    fn settled(made: &[Made]) -> Result<Result<Vec<u8>, String>, u8> {
        let outcomes: Vec<_> = made.iter().copied().map(outcome).collect();
        match panic::catch_unwind(AssertUnwindSafe(|| settle(outcomes))) {
            Ok(Ok(values)) => Ok(Ok(values)),
            Ok(Err(Halt::Failed(error))) => Ok(Err(error.to_string())),
            Ok(Err(Halt::Cancelled)) => Ok(Err("cancelled".to_owned())),
            Ok(Err(Halt::Abandoned)) => Ok(Err("abandoned".to_owned())),
            Err(payload) => Err(*payload.downcast::<u8>().expect("the branch's own payload")),
        }
    }

    proptest! {
        #[test]
        fn a_fan_out_settles_into_the_first_panic_else_failure_else_stop_else_every_value(
            made in proptest::collection::vec(made(), 0..12)
        ) {
            // `resume_unwind` calls no panic hook: a re-raised panic prints nothing here.
            prop_assert_eq!(settled(&made), expected(&made));
        }
    }
}
