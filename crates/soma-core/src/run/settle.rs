//! How the branches of a fan-out settle into one outcome, for both walks: a wave's branches
//! and a `Map`'s items, lent threads of the crew in the sync walk, tasks in the async walk, end
//! the same and are settled by the one rule here.
//!
//! # How a fan-out settles
//!
//! Its outcomes in declaration order: a panic is re-raised, the first declared; else the first
//! declared failure is the fan-out's (a branch that never got a thread or a task failed there);
//! else the first declared stop (cancelled, its caller gone, or never started); else every
//! value, in order.

use std::any::Any;
use std::panic;
use std::thread;

use super::branch::Halt;
use super::crew::Refused;
use super::error::RunError;

/// One branch's outcome: its walk's, a panic caught as `Err`.
pub(super) type Outcome<R> = thread::Result<Result<R, Halt>>;

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
