//! `Executor`: the hooks a run holds — its driver, cache, watch, host, trace, observer and way
//! of reading values — with their builders, and what every walk asks of them alike: the
//! observer told a run begins and ends, a wait made through the host, the watch polled, a
//! run's keys made and its result read from its table.
//!
//! Below both walks, which add the ways to run (`run/sync.rs`: `run`, `run_program`,
//! `run_detachable`; `run/aio`: `start`) and call a node through `run/call.rs`: this module
//! names neither walk.

use super::board::Board;
use super::branch::Halt;
use super::cache::NodeCache;
use super::error::RunError;
use super::hooks::{Host, ItemContext, Watch};
use super::keys::RunKeys;
use super::observer::{Begun, Ended, Observer, Opened};
use super::trace::Trace;
use std::sync::Arc;

use crate::model::driver::Driver;
use crate::model::node::DEFAULT_TURN_LIMIT;
use crate::model::reading::{NativeReading, Reading};
use crate::model::value::Value;
use crate::run::program::Program;

/// Runs plans, with an optional driver, watch, host, trace, observer and cache.
#[derive(Clone)]
pub struct Executor {
    pub(super) driver: Option<Arc<dyn Driver>>,
    pub(super) cache: Option<Arc<dyn NodeCache>>,
    pub(super) watch: Option<Arc<dyn Watch>>,
    pub(super) host: Option<Arc<dyn Host>>,
    pub(super) trace: Option<Arc<Trace>>,
    pub(super) observer: Option<Arc<dyn Observer>>,
    pub(super) boards: Boards,
    pub(super) reading: Option<Arc<dyn Reading>>,
    pub(super) turn_limit: u32,
}

/// Which runs keep a [`Board`] of their nodes' states: none, the one run an executor makes
/// ([`Executor::with_board`]), or each streamed item's, a board of its own
/// ([`Executor::with_item_boards`]).
#[derive(Clone)]
pub(super) enum Boards {
    None,
    Run(Arc<Board>),
    EachItem,
}

impl Default for Executor {
    fn default() -> Self {
        Executor::new()
    }
}

/// Asks the processor for the cache line at `at` without waiting for it: a hint, for
/// [`crate::Node::prefetch`] and the executor, that does nothing where it is not supported.
pub fn prefetch_line<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch reads nothing the program sees and cannot fault, whatever the
        // address; SSE, which it needs, is part of every x86-64 processor.
        #[allow(unsafe_code)]
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(at.cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

impl Executor {
    /// An executor without driver, watch, host or trace, with the default turn limit.
    pub fn new() -> Self {
        Executor {
            driver: None,
            cache: None,
            watch: None,
            host: None,
            trace: None,
            observer: None,
            boards: Boards::None,
            reading: None,
            turn_limit: DEFAULT_TURN_LIMIT,
        }
    }

    /// Reads the values `Map`, `Switch` and `Loop` steps act on with `reading` instead of as the
    /// engine's own values ([`crate::NativeReading`]).
    #[must_use]
    pub fn with_reading(mut self, reading: Arc<dyn Reading>) -> Self {
        self.reading = Some(reading);
        self
    }

    /// Serves awaiting nodes with `driver`, shared by every branch at once.
    #[must_use]
    pub fn with_driver(mut self, driver: Arc<dyn Driver>) -> Self {
        self.driver = Some(driver);
        self
    }

    /// Consults `watch` at node boundaries and while waiting on waves.
    #[must_use]
    pub fn with_watch(mut self, watch: Arc<dyn Watch>) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Lets `host` wrap each branch a crew thread runs and each blocking wait. Shared, because
    /// a crew thread may still be on its way to a wave when the run that made it has ended.
    #[must_use]
    pub fn with_host(mut self, host: Arc<dyn Host>) -> Self {
        self.host = Some(host);
        self
    }

    /// Records a [`Span`](super::trace::Span) in `trace` for every step of every run.
    #[must_use]
    pub fn with_trace(mut self, trace: Arc<Trace>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Tells `observer` every work of every run as it begins and ends: each attempt of a node
    /// call, each node the cache answers, each part of a step that decides, each streamed item
    /// ([`Observer`]).
    #[must_use]
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Keeps each node's state on `board` as its calls begin and end ([`Board`]), instead of
    /// telling the observer each call: the observer is told only the calls that fail (for
    /// what only it has of a failure), and still every run, step's part and async node's call.
    /// The board is a run's: an executor with one makes one run.
    #[must_use]
    pub fn with_board(mut self, board: Arc<Board>) -> Self {
        self.boards = Boards::Run(board);
        self
    }

    /// Keeps a board for each streamed item's run ([`crate::Stream`]), made as the item is
    /// read and handed to the observer with the run's beginning ([`Begun::Run`]'s `board`), as
    /// [`Executor::with_board`] keeps one for a whole run: an item's calls tell the observer
    /// only what they tell a run that keeps a board. A [`crate::Flow`]'s items keep none: their
    /// async calls are told the observer, which names the task each runs in, whatever the run
    /// keeps.
    #[must_use]
    pub fn with_item_boards(mut self) -> Self {
        self.boards = Boards::EachItem;
        self
    }

    /// The board of the one run this executor makes, when it keeps one.
    pub(super) fn run_board(&self) -> Option<&Arc<Board>> {
        match &self.boards {
            Boards::Run(board) => Some(board),
            Boards::None | Boards::EachItem => None,
        }
    }

    /// A board for the run of a streamed item of `program`, when the executor keeps one for
    /// each item ([`Executor::with_item_boards`]) and has an observer to hand it to.
    pub(crate) fn item_board(&self, program: &Arc<Program>) -> Option<Arc<Board>> {
        match &self.boards {
            Boards::EachItem if self.observer.is_some() => Some(Arc::new(Board::new(program))),
            Boards::EachItem | Boards::Run(_) | Boards::None => None,
        }
    }

    /// Asks `cache` before running each node, and files each output a node computed in it:
    /// a node whose key is there is not called (see [`NodeCache`] for what a key covers). Each
    /// output is filed as soon as its node returns, so a run that fails keeps what it
    /// completed. Without a cache a run costs what it did.
    #[must_use]
    pub fn with_cache(mut self, cache: Arc<dyn NodeCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Gives each node at most `limit` calls to `forward`; awaiting on the last is an error.
    #[must_use]
    pub fn with_turn_limit(mut self, limit: u32) -> Self {
        self.turn_limit = limit;
        self
    }

    /// The turn limit in force.
    pub fn turn_limit(&self) -> u32 {
        self.turn_limit
    }

    /// The identities a run of `program` keys its values by, when it runs with a cache.
    pub(super) fn run_keys(&self, program: &Program) -> Option<RunKeys> {
        let cache = self.cache.as_ref()?;
        Some(RunKeys::new(Arc::clone(cache), program))
    }

    /// The run's result, from the outcome of its walk and the table it filled; `input` is the
    /// result of a plan without a leaf.
    pub(super) fn finish(
        program: &Program,
        walked: Result<(), Halt>,
        table: &mut [Option<Value>],
        input: impl FnOnce() -> Value,
    ) -> Result<Value, RunError> {
        match walked {
            Ok(()) => {}
            Err(Halt::Failed(error)) => return Err(error),
            Err(Halt::Cancelled) => {
                unreachable!(
                    "only a sibling's failure cancels a branch, and it is reported instead"
                )
            }
            Err(Halt::Abandoned) => {
                unreachable!("only a detachable run is given up, and it reports that itself")
            }
        }
        Ok(Self::result(program, table, input))
    }

    /// What a run that succeeded returns, from the table it filled: its one leaf's value, or
    /// its leaves' keyed by id; `input` when it has no leaf.
    pub(super) fn result(
        program: &Program,
        table: &mut [Option<Value>],
        input: impl FnOnce() -> Value,
    ) -> Value {
        // A leaf has no reader, so nothing took or dropped its value.
        let mut take = |slot: usize| {
            table[slot]
                .take()
                .expect("a run that succeeded wrote every leaf")
        };
        match &*program.leaves {
            [] => input(),
            [one] => take(*one),
            many => {
                let pairs = many
                    .iter()
                    .map(|&slot| (program.ids[slot].shared(), take(slot)))
                    .collect::<Vec<_>>();
                Value::Map(pairs.into())
            }
        }
    }

    /// Tells the observer, when there is one, that a run of `program` begins — a whole run, or
    /// the run of a stream's item at index `item` — keeping `board` when it keeps one, on this
    /// thread, inside `context` when the item has one, so that what the observer makes current
    /// there travels with the item through its stages.
    pub(crate) fn begin_run(
        &self,
        program: &Program,
        item: Option<u64>,
        board: Option<&Arc<Board>>,
        context: Option<&mut (dyn ItemContext + 'static)>,
    ) -> Option<Opened> {
        let observer = self.observer.as_deref()?;
        let begun = Begun::Run {
            item,
            nodes: program.ids.len(),
            asynchronous: program.is_async(),
            board,
        };
        let Some(context) = context else {
            return Some(observer.begin(&begun));
        };
        let mut opened = None;
        context.enter(&mut || opened = Some(observer.begin(&begun)));
        opened
    }

    /// How the run reads the values steps that decide act on: its own reading, or the
    /// engine's native one.
    pub(super) fn reading(&self) -> &dyn Reading {
        self.reading.as_deref().unwrap_or(&NativeReading)
    }

    /// Tells the observer that the work `opened` was returned for ends as `ended` says.
    pub(crate) fn end_work(&self, opened: Option<Opened>, ended: &Ended<'_>) {
        if let (Some(observer), Some(opened)) = (self.observer.as_deref(), opened) {
            observer.end(opened, ended);
        }
    }

    /// Whether the watch says stop, its host's pending signals looked for first: a thread
    /// that pauses or waits here is where a wave's wait would poll them (on the run's calling
    /// thread; the watch ignores a poll from any other).
    pub(crate) fn stopped(&self) -> bool {
        self.watch.as_deref().is_some_and(|watch| {
            watch.poll();
            watch.interrupted()
        })
    }

    /// Runs `work`, which blocks, through the host if there is one.
    pub(crate) fn blocking(&self, work: &mut (dyn FnMut() + Send)) {
        match &self.host {
            Some(host) => host.blocking(work),
            None => work(),
        }
    }
}
