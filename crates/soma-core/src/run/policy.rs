//! Per-node policies: a [`Retry`] for calls that fail for passing reasons, and a time limit for
//! a call that must not take longer than it should.
//!
//! A policy is one small value per node (as `RetryPolicy` is in `LangGraph`, not arguments spread over
//! call sites), kept in [`Policies`] beside the graph and resolved into the step of the node it
//! names by [`crate::Program::resolved`]. A step without one pays a single `Option` check per
//! call; everything here runs only for a node that has a policy.
//!
//! A call that runs past its time limit fails with [`RunError::TimeLimit`] at the limit, and its
//! thread is left to finish it in the background (its result dropped), as a node left behind by
//! `forward(timeout=)` is.
//!
//! Backoff pauses wait on the run's [`Watch`](crate::Watch), a few milliseconds at a time, so a
//! Ctrl-C or a deadline ends them at once; the pausing goes through a [`Clock`], which a test
//! replaces to see every pause without sleeping through it. The values live here; the executor
//! applies them in its `attempt` module.
//!
//! What the Rust builder writes on an expression (`expr.retry(..)`, `expr.time_limit(..)`) is
//! model data, [`WrittenPolicies`]; `Policies::from(&written)` makes the policies of this stage
//! from it, each [`RetryPolicy`]'s filter asked about the failures a retry may retry.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::error::RunError;
use crate::model::policy::{AttemptError, RetryPolicy, WrittenPolicies};

/// How often a pause asks whether to stop.
const PAUSE_SLICE: Duration = Duration::from_millis(5);

/// The longest pause between two attempts, however many doublings came before.
pub const MAX_BACKOFF: Duration = Duration::from_secs(128);

/// The most a pause is lengthened at random: a quarter of it, so that many callers failing
/// together do not all retry at the same instant.
pub const JITTER: f64 = 0.25;

/// Which failures a [`Retry`] retries.
pub type RetryOn = Arc<dyn Fn(&RunError) -> bool + Send + Sync>;

/// How the pauses between attempts pass.
pub trait Clock: Send + Sync {
    /// Waits for `pause`, unless `stop` says yes first (it is asked every few milliseconds);
    /// returns whether the whole pause passed.
    fn pause(&self, pause: Duration, stop: &dyn Fn() -> bool) -> bool;

    /// A number in `[0, 1)`, how much of [`JITTER`] a pause gets.
    fn jitter(&self) -> f64;
}

/// The clock of the machine: pauses sleep, a few milliseconds at a time.
pub struct SystemClock;

impl Clock for SystemClock {
    fn pause(&self, pause: Duration, stop: &dyn Fn() -> bool) -> bool {
        let end = Instant::now() + pause;
        loop {
            if stop() {
                return false;
            }
            let now = Instant::now();
            if now >= end {
                return true;
            }
            thread::sleep((end - now).min(PAUSE_SLICE));
        }
    }

    fn jitter(&self) -> f64 {
        // A fresh `RandomState` is keyed at random: randomness enough for spreading retries,
        // without a dependency.
        let bits = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        #[allow(clippy::cast_precision_loss)] // 53 bits of 64 are plenty for a fraction.
        let fraction = (bits >> 11) as f64 / (1_u64 << 53) as f64;
        fraction
    }
}

/// Retries of a node's failing call: up to `times` more attempts, the first after `backoff`,
/// each next pause twice the last (at most [`MAX_BACKOFF`]) and up to [`JITTER`] longer at
/// random; only failures `on` accepts are retried.
#[derive(Clone)]
pub struct Retry {
    times: u32,
    backoff: Duration,
    pub(crate) on: RetryOn,
    pub(crate) clock: Arc<dyn Clock>,
}

impl Retry {
    /// `times` more attempts after a first that fails, the first pause `backoff`; every node
    /// error and every time limit is retried (see [`Retry::only`]).
    pub fn new(times: u32, backoff: Duration) -> Retry {
        Retry {
            times,
            backoff,
            on: Arc::new(|error| {
                matches!(
                    error,
                    RunError::NodeFailed { .. } | RunError::TimeLimit { .. }
                )
            }),
            clock: Arc::new(SystemClock),
        }
    }

    /// Retries only the failures `on` accepts (a binding checks its exception's type here).
    #[must_use]
    pub fn only(mut self, on: RetryOn) -> Retry {
        self.on = on;
        self
    }

    /// Pauses with `clock` instead of the machine's: how a test sees the pauses.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Retry {
        self.clock = clock;
        self
    }

    /// Attempts after the first.
    pub fn times(&self) -> u32 {
        self.times
    }

    /// The first pause, before jitter.
    pub fn backoff(&self) -> Duration {
        self.backoff
    }

    /// The pause before attempt `retry + 1` (`retry` counting from 0), before jitter.
    pub fn pause_before(&self, retry: u32) -> Duration {
        let doubled = self
            .backoff
            .checked_mul(1_u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(MAX_BACKOFF);
        doubled.min(MAX_BACKOFF)
    }
}

impl From<&RetryPolicy> for Retry {
    /// The retries a [`RetryPolicy`] wrote: its filter asked about a node's error and a time
    /// limit, the failures a retry may retry; any other failure is never retried.
    fn from(written: &RetryPolicy) -> Retry {
        let filter = written.clone();
        Retry::new(written.times(), written.backoff()).only(Arc::new(move |error| {
            retried_as(error).is_some_and(|failed| filter.retries(failed))
        }))
    }
}

/// A failure as a [`RetryPolicy`]'s filter sees it, if it is one a retry may retry: a node's
/// own error or its time limit. A driver's failure, a refused thread, a stop are not the
/// node's passing trouble.
fn retried_as(error: &RunError) -> Option<AttemptError<'_>> {
    match error {
        RunError::NodeFailed { error, .. } => Some(AttemptError::Node(error)),
        RunError::TimeLimit { limit, .. } => Some(AttemptError::TimeLimit(*limit)),
        RunError::NoDriver { .. }
        | RunError::DriverFailed { .. }
        | RunError::WrongResultCount { .. }
        | RunError::TurnLimit { .. }
        | RunError::Invalid(_)
        | RunError::NoThread { .. }
        | RunError::Retried { .. }
        | RunError::NotAList { .. }
        | RunError::UnknownCase { .. }
        | RunError::LoopLimit { .. }
        | RunError::NeedsLoop { .. }
        | RunError::NoTask { .. }
        | RunError::Interrupted
        | RunError::PastDeadline
        | RunError::Cancelled { .. }
        | RunError::Abandoned { .. } => None,
    }
}

impl fmt::Debug for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("times", &self.times)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

/// What a node's calls are held to: retries, a time limit, or both.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Retries of a failing call.
    pub retry: Option<Retry>,
    /// The longest one call may run.
    pub time_limit: Option<Duration>,
}

impl Policy {
    /// Whether it asks nothing.
    pub fn is_empty(&self) -> bool {
        self.retry.is_none() && self.time_limit.is_none()
    }
}

/// Policies by node id, beside a graph as its [placement](crate::Placement) is.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    by_node: HashMap<String, Arc<Policy>>,
}

impl Policies {
    /// The policy of `node`, if it has one.
    pub fn get(&self, node: &str) -> Option<&Arc<Policy>> {
        self.by_node.get(node)
    }

    /// Sets `node`'s retries (`None` removes them), keeping its time limit.
    pub fn set_retry(&mut self, node: &str, retry: Option<Retry>) {
        self.change(node, |policy| policy.retry = retry);
    }

    /// Sets `node`'s time limit (`None` removes it), keeping its retries.
    pub fn set_time_limit(&mut self, node: &str, limit: Option<Duration>) {
        self.change(node, |policy| policy.time_limit = limit);
    }

    fn change(&mut self, node: &str, change: impl FnOnce(&mut Policy)) {
        let mut policy = self
            .by_node
            .get(node)
            .map(|policy| Policy::clone(policy))
            .unwrap_or_default();
        change(&mut policy);
        if policy.is_empty() {
            self.by_node.remove(node);
        } else {
            self.by_node.insert(node.to_owned(), Arc::new(policy));
        }
    }

    /// Whether no node has a policy.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// The same policies, every retry pausing with `clock`: how a test sees the pauses of
    /// retries written on an expression ([`Retry::with_clock`] for one).
    #[must_use]
    pub fn with_clock(self, clock: &Arc<dyn Clock>) -> Policies {
        let by_node = self
            .by_node
            .into_iter()
            .map(|(node, policy)| {
                let mut policy = Policy::clone(&policy);
                policy.retry = policy
                    .retry
                    .map(|retry| retry.with_clock(Arc::clone(clock)));
                (node, Arc::new(policy))
            })
            .collect();
        Policies { by_node }
    }
}

impl From<&WrittenPolicies> for Policies {
    /// The policies written on an expression ([`crate::Expr::somatize_with_policies`]), each
    /// node's retries and time limit as written.
    fn from(written: &WrittenPolicies) -> Policies {
        let mut policies = Policies::default();
        for (node, policy) in written.iter() {
            policies.set_retry(node.as_str(), policy.retry.as_ref().map(Retry::from));
            policies.set_time_limit(node.as_str(), policy.time_limit);
        }
        policies
    }
}
