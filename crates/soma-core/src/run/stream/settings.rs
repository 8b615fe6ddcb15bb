//! How a stream runs: its bound on the items in flight, whether results keep input order, what
//! it does after an item fails, how many workers a stage gets, and the executor every stage
//! runs its items with.
//!
//! Set by the embedder before the stream starts and read, never changed, by the caller's side
//! and every stage's workers from then on: the settings are shared behind one `Arc`.

use std::collections::HashMap;

use crate::model::id::NodeId;
use crate::run::executor::Executor;

/// How many items a stream holds at once unless told otherwise: enough to keep a few dozen
/// stage workers busy, few enough that a stream of large items stays small.
pub const DEFAULT_IN_FLIGHT: usize = 64;

/// What a stream does after an item fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnError {
    /// Hands back the items before it, then its error, and ends.
    Stop,
    /// Hands back its error in its place and goes on with the others.
    Continue,
}

/// How a stream runs: its bound, order, error rule, stage workers, and the executor whose hooks
/// (driver, watch, host, trace, turn limit) every stage runs its items with.
#[derive(Clone)]
pub struct StreamSettings {
    pub(super) in_flight: usize,
    pub(super) ordered: bool,
    pub(super) on_error: OnError,
    pub(super) concurrency: HashMap<NodeId, usize>,
    pub(super) executor: Executor,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            in_flight: DEFAULT_IN_FLIGHT,
            ordered: true,
            on_error: OnError::Stop,
            concurrency: HashMap::new(),
            executor: Executor::new(),
        }
    }
}

impl StreamSettings {
    /// Holds at most `items` items at once (at least 1).
    #[must_use]
    pub fn with_in_flight(mut self, items: usize) -> Self {
        self.in_flight = items.max(1);
        self
    }

    /// Hands results back as they finish instead of in input order.
    #[must_use]
    pub fn unordered(mut self) -> Self {
        self.ordered = false;
        self
    }

    /// What to do after an item fails ([`OnError::Stop`] unless set).
    #[must_use]
    pub fn with_on_error(mut self, rule: OnError) -> Self {
        self.on_error = rule;
        self
    }

    /// Lets `node` work on up to `workers` items at once, for a node that keeps no state between
    /// items. A stage gets the fewest workers any of its nodes allows, so a node in a stage with
    /// others (a wave) keeps one unless they all allow more.
    #[must_use]
    pub fn with_concurrency(mut self, node: NodeId, workers: usize) -> Self {
        self.concurrency.insert(node, workers.max(1));
        self
    }

    /// Runs every stage's items with `executor`'s hooks: its driver, watch (consulted at node
    /// boundaries and while the caller waits), host (around each stage and each blocking wait),
    /// trace (a span for every node of every item) and turn limit (per node, per item).
    #[must_use]
    pub fn with_executor(mut self, executor: Executor) -> Self {
        self.executor = executor;
        self
    }
}
