//! One item on its way through a stream's stages: its index and input, the table its steps
//! write into, and what it carries from stage to stage — its failure, its context, its keys.
//!
//! An item is a run of its own, cut across the stages' threads: what a run keeps from its start
//! to its end — its table, its context, its keys, what the observer opened — travels with the
//! item instead, so that a stage needs nothing but the item to run its part of it.

use std::time::Instant;

use crate::model::value::Value;
use crate::run::board::HeldBoard;
use crate::run::error::RunError;
use crate::run::hooks::ItemContext;
use crate::run::keys::RunKeys;
use crate::run::observer::Opened;

/// One item on its way through the stages.
pub(super) struct Item {
    pub(super) index: u64,
    pub(super) input: Value,
    /// When the caller began reading its input: a stage that slept until it came was held up
    /// by what came after it before then, and waited for its input from then on.
    pub(super) read_at: Instant,
    /// The values its steps produced: the run's table.
    pub(super) table: Box<[Option<Value>]>,
    /// Why it failed, once it has; the stages after skip it.
    pub(super) failed: Option<RunError>,
    /// What the last stage made of it.
    pub(super) result: Option<Value>,
    /// Its own context, copied from the caller's when it was read, entered around each stage
    /// it goes through: what a stage's nodes set there, its next stages see, and no other item
    /// does. `None` when the host carries no context.
    pub(super) context: Option<Box<dyn ItemContext>>,
    /// The identities of its values, when the stream runs with a cache: each item is a run of
    /// its own, keyed on its own input.
    pub(super) keys: Option<RunKeys>,
    /// What the executor's observer opened as the item was read, when there is one.
    pub(super) opened: Option<Opened>,
    /// The board its run keeps its nodes' states on, when the executor keeps one for each
    /// item ([`crate::Executor::with_item_boards`]).
    pub(super) board: Option<HeldBoard>,
}
