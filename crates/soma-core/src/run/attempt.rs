//! The executor's side of a node's [`Policy`]: each attempt of a call traced as a span of its
//! own, retried as the policy's [`crate::Retry`] says after a pause that a Ctrl-C or a deadline
//! ends, and held to its time limit.
//!
//! A time-limited call runs on a thread lent by the program's crew while the branch's thread
//! waits with the limit as its deadline, the host's hold (the GIL) given up meanwhile, as
//! `forward(timeout=)` runs a whole plan ([`crate::Executor::run_detachable`]). What the call
//! reads is owned by it — the node, its input and its id are reference-counted, the context it
//! runs in is a copy captured for it — so a call left to finish borrows nothing that can go
//! away under it. What such a call sets in that context is its own: the nodes after it do not
//! see it.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::RunError;
use super::executor::Executor;
use super::hooks::Watch;
use super::lane::Lane;
use super::latch::{wait_watching, Delivery, Waited};
use super::observer::Ended;
use super::policy::{Policy, JITTER};
use super::program::Step;
use crate::model::id::NodeId;
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

impl Executor {
    /// Calls a step's node under its policy: each attempt traced as a span of its own, retried
    /// as the policy says, each attempt within the time limit.
    #[cold]
    #[inline(never)]
    pub(super) fn call_with_policy(
        &self,
        step: &Step,
        id: &NodeId,
        input: &Value,
        lane: Lane<'_>,
    ) -> Result<Value, RunError> {
        let policy: &Policy = lane.program.policies[step.slot()]
            .as_deref()
            .expect("a step marked as having a policy has one");
        let mut attempt = 0_u32;
        loop {
            let opened = self.begin_call(step, id, attempt, || lane.path());
            let outcome = self.attempt(policy.time_limit, step, id, input, lane);
            let next = Self::next_attempt(policy, attempt, outcome);
            self.end_work(opened, &next.ended());
            let (pause, error) = match next {
                Next::Done(outcome) => return outcome,
                Next::Pause(pause, error) => (pause, error),
            };
            let retry = policy.retry.as_ref().expect("only a retry pauses");
            let stopping = || lane.cancelled() || self.stopped();
            let mut waited = true;
            self.blocking(&mut || waited = retry.clock.pause(pause, &stopping));
            if !waited {
                return Err(Self::stopped_pausing(lane.cancelled(), error));
            }
            attempt += 1;
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

    /// One attempt, traced when a trace was asked for.
    fn attempt(
        &self,
        limit: Option<Duration>,
        step: &Step,
        id: &NodeId,
        input: &Value,
        lane: Lane<'_>,
    ) -> Result<Value, RunError> {
        let Some(trace) = self.trace.as_deref() else {
            let mut turns = 0;
            return self.within(limit, step, id, input, lane, &mut turns);
        };
        Self::spanned(trace, step, id, lane, |turns| {
            self.within(limit, step, id, input, lane, turns)
        })
    }

    /// One call, on a lent thread and within `limit` when there is one.
    fn within(
        &self,
        limit: Option<Duration>,
        step: &Step,
        id: &NodeId,
        input: &Value,
        lane: Lane<'_>,
        turns: &mut u32,
    ) -> Result<Value, RunError> {
        // A limit too far off to be a point in time is no limit worth counting.
        let Some((limit, deadline)) =
            limit.and_then(|limit| Some((limit, Instant::now().checked_add(limit)?)))
        else {
            return self.execute(&*step.node, step.device, id, input, turns);
        };
        // Where the call leaves its outcome for the branch that waits for it.
        let outcome = Arc::new(Delivery::new());
        let task = {
            let (executor, node, device) = (self.clone(), Arc::clone(&step.node), step.device);
            let (id, input, outcome) = (id.clone(), input.clone(), Arc::clone(&outcome));
            let captured = self.host.as_ref().and_then(|host| host.capture());
            move || {
                let mut result = None;
                let mut call = || {
                    let mut turns = 0;
                    result = Some(panic::catch_unwind(AssertUnwindSafe(|| {
                        executor.execute(&*node, device, &id, &input, &mut turns)
                    })));
                };
                match &captured {
                    Some(captured) => captured.enter(&mut call),
                    None => call(),
                }
                outcome.deliver(result.expect("the context ran the call"));
            }
        };
        *turns = 1;
        if let Err(refused) = lane.walk.crew.lend(vec![task], self.host.as_ref()) {
            return Err(RunError::NoThread {
                reason: refused.to_string(),
            });
        }
        // A run its caller may leave (`forward(timeout=)`) names the nodes still running when
        // it gives up: this one waits on as if it ran the call itself, so that it is named, and
        // leaves the watch to that caller. A run whose caller is this thread's stops here, at
        // Ctrl-C.
        let watch = match lane.walk.detached {
            Some(_) => None,
            None => self.watch.as_deref(),
        };
        let mut waited = Waited::Done;
        self.blocking(&mut || {
            // An earlier sibling failed: its error is the wave's, and this call's result could
            // not be used, so the branch stops waiting for it (as it would stop at its next node
            // boundary) instead of holding the wave up to the limit.
            let mut stopping = || watch.is_some_and(Watch::interrupted) || lane.cancelled();
            waited = wait_watching(
                &mut |timeout| outcome.wait(timeout),
                watch,
                Some(&mut stopping),
                Some(deadline),
            );
        });
        match waited {
            Waited::Done => match outcome.take().expect("a delivered call left its outcome") {
                Ok(result) => result,
                Err(payload) => panic::resume_unwind(payload),
            },
            Waited::Stopped => Err(RunError::Interrupted),
            Waited::PastDeadline => Err(RunError::TimeLimit {
                node: id.clone(),
                limit,
            }),
        }
    }

    /// Whether the watch says stop, its host's pending signals looked for first: a thread
    /// that pauses or waits here is where a wave's wait would poll them (on the run's calling
    /// thread; the watch ignores a poll from any other).
    pub(super) fn stopped(&self) -> bool {
        self.watch.as_deref().is_some_and(|watch| {
            watch.poll();
            watch.interrupted()
        })
    }
}
