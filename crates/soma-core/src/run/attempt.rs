//! The policy's side of a node's call: what a [`Policy`] says once an attempt ended — that is
//! the call's outcome, or pause this long and try again — and the error of a call whose pause
//! was cut short. Pure decisions, for both walks: the sync walk pauses on the retry's clock
//! (`run/call.rs`), the async walk on the loop's timer.

use std::time::Duration;

use super::error::RunError;
use super::observer::Ended;
use super::policy::{Policy, JITTER};
use crate::model::value::Value;

/// What to do after an attempt of a call under a policy.
pub(super) enum Next {
    /// The call is done: this is its outcome.
    Done(Result<Value, RunError>),
    /// Pause this long, then try again; the error is the call's if the pause is cut short.
    Pause(Duration, RunError),
}

impl Next {
    /// How the attempt that led here ended, as an observer is told: a pause is a failure the
    /// call's retry takes.
    pub(super) fn ended(&self) -> Ended<'_> {
        match self {
            Next::Done(outcome) => Ended::of(outcome),
            Next::Pause(pause, error) => Ended::Failed {
                error,
                retry_in: Some(*pause),
            },
        }
    }
}

/// What a policy says after attempt `attempt` (from 0) ended with `outcome`: that is the
/// call's outcome, or pause this long and try again — for a failure its retry retries
/// (`on`), while attempts are left, after a backoff that doubles each time, with jitter.
pub(super) fn next_attempt(
    policy: &Policy,
    attempt: u32,
    outcome: Result<Value, RunError>,
) -> Next {
    let error = match outcome {
        Ok(value) => return Next::Done(Ok(value)),
        Err(error) => error,
    };
    let Some(retry) = policy.retry.as_ref() else {
        return Next::Done(Err(error));
    };
    if !(retry.on)(&error) {
        return Next::Done(Err(error));
    }
    if attempt >= retry.times() {
        return Next::Done(Err(RunError::Retried {
            attempts: attempt + 1,
            last: Box::new(error),
        }));
    }
    let pause = retry.pause_before(attempt);
    let pause = pause.mul_f64(1.0 + JITTER * retry.clock.jitter().clamp(0.0, 1.0));
    Next::Pause(pause, error)
}

/// The error of a call whose retry's pause was ended early: its own, when an earlier
/// sibling failed (`cancelled`), whose error is the one reported; otherwise the watch
/// stopped the run (Ctrl-C, a deadline), which is why the node did not finish.
pub(super) fn stopped_pausing(cancelled: bool, error: RunError) -> RunError {
    if cancelled {
        error
    } else {
        RunError::Interrupted
    }
}
