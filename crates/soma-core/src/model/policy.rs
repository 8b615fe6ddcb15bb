//! Per-node policies as the Rust builder writes them (`expr.retry(..)`, `expr.time_limit(..)`):
//! plain data, kept with the expression until it is somatized.
//!
//! The model cannot hold the run stage's [`crate::Policies`] — a retry's pauses, its clock and
//! the errors it sees belong to the executor, which the model does not import — so what the
//! builder writes is a [`RetryPolicy`] and a limit per node id, in [`WrittenPolicies`], and the
//! run stage makes its `Policies` from them (`Policies::from(&written)`). A retry's filter sees
//! a failed attempt as an [`AttemptError`]: the node's own error or its time limit, the two
//! failures a retry may retry, as Python's `on=` sees an exception.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::model::id::NodeId;
use crate::model::node::NodeError;

/// Why one attempt of a node's call failed, as a [`RetryPolicy`]'s filter sees it.
#[derive(Clone, Copy, Debug)]
pub enum AttemptError<'a> {
    /// The node returned this error (its [`NodeError::cause`] is the error underneath, if any).
    Node(&'a NodeError),
    /// The call ran past the node's time limit, this long.
    TimeLimit(Duration),
}

/// Which failed attempts a [`RetryPolicy`] retries.
pub type RetryFilter = Arc<dyn Fn(AttemptError<'_>) -> bool + Send + Sync>;

/// A node's retries, as written: `times` more attempts after a failing one, the first after
/// `backoff`, each next pause twice the last (at most [`crate::MAX_BACKOFF`]) and up to
/// [`crate::JITTER`] longer at random, only for the failures its filter accepts (every node
/// error and every time limit unless [`RetryPolicy::on`] says otherwise). Python's
/// `RetryPolicy(times, backoff, on)` is the same value.
#[derive(Clone)]
pub struct RetryPolicy {
    times: u32,
    backoff: Duration,
    on: Option<RetryFilter>,
}

impl RetryPolicy {
    /// `times` more attempts after a first that fails, the first pause `backoff`; every node
    /// error and every time limit is retried.
    pub fn new(times: u32, backoff: Duration) -> RetryPolicy {
        RetryPolicy {
            times,
            backoff,
            on: None,
        }
    }

    /// Retries only the failed attempts `filter` accepts: a node's error whose cause is an
    /// `std::io::Error`, say, as Python's `on=(ConnectionError,)` retries only those.
    #[must_use]
    pub fn on(mut self, filter: impl Fn(AttemptError<'_>) -> bool + Send + Sync + 'static) -> Self {
        self.on = Some(Arc::new(filter));
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

    /// Whether a failed attempt is retried (while attempts remain).
    pub fn retries(&self, failed: AttemptError<'_>) -> bool {
        self.on.as_ref().is_none_or(|on| on(failed))
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("times", &self.times)
            .field("backoff", &self.backoff)
            .field("filtered", &self.on.is_some())
            .finish()
    }
}

/// What one node's calls are held to, as written: retries, a time limit, or both.
#[derive(Clone, Debug, Default)]
pub struct WrittenPolicy {
    /// Retries of a failing call.
    pub retry: Option<RetryPolicy>,
    /// The longest one call may run.
    pub time_limit: Option<Duration>,
}

/// The policies written on an expression, by node id — the nodes inside its decision steps by
/// their namespaced ids (`chunks/clean`) — as [`crate::Expr::somatize_with_policies`] hands
/// them back.
#[derive(Clone, Debug, Default)]
pub struct WrittenPolicies {
    by_node: HashMap<NodeId, WrittenPolicy>,
}

impl WrittenPolicies {
    /// No policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// What node `id` is held to, if anything.
    pub fn get(&self, id: &str) -> Option<&WrittenPolicy> {
        self.by_node.get(id)
    }

    /// Every node's policies, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&NodeId, &WrittenPolicy)> {
        self.by_node.iter()
    }

    /// Whether no node has a policy.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// Gives node `id` `retry` unless it has retries already: the innermost wins.
    pub(crate) fn retry_unless_set(&mut self, id: &NodeId, retry: &RetryPolicy) {
        let policy = self.by_node.entry(id.clone()).or_default();
        if policy.retry.is_none() {
            policy.retry = Some(retry.clone());
        }
    }

    /// Gives node `id` `limit` unless it has a time limit already: the innermost wins.
    pub(crate) fn limit_unless_set(&mut self, id: &NodeId, limit: Duration) {
        let policy = self.by_node.entry(id.clone()).or_default();
        if policy.time_limit.is_none() {
            policy.time_limit = Some(limit);
        }
    }

    /// Both sides' policies, grown from the larger: gluing costs the smaller side.
    pub(crate) fn joined(mut self, mut other: WrittenPolicies) -> WrittenPolicies {
        if self.by_node.len() < other.by_node.len() {
            std::mem::swap(&mut self, &mut other);
        }
        self.by_node.extend(other.by_node);
        self
    }

    /// The same policies, every id under `prefix` ([`NodeId::inside`]): those of a step's
    /// sub-graph, as the graph around it holds them.
    pub(crate) fn inside(self, prefix: &str) -> WrittenPolicies {
        WrittenPolicies {
            by_node: self
                .by_node
                .into_iter()
                .map(|(id, policy)| (NodeId::inside(prefix, id.as_str()), policy))
                .collect(),
        }
    }
}
