//! `Executor`: walks a [`Plan`], the branches of each wave launched together.
//!
//! A wave offers its branches to the program's crew ([`crate::run::crew`]): the thread that
//! reached the wave runs the first branch itself and takes the siblings nobody has started,
//! while crew threads take the others; each branch runs start to finish on the thread that took
//! it.
//! Values live in one table of slots ([`Program`] numbers them so that each branch owns a
//! contiguous range): a branch reads what its ancestors produced through a shared borrow of the
//! part of the table that was complete when its wave started, and writes only into its own
//! range, borrowed mutably and disjoint from every sibling's. What a branch produced is
//! therefore already in its parent's table when the wave joins — nothing is copied or merged — and
//! no lock ever guards a produced value.
//!
//! Errors are deterministic: a wave reports the error of the first *declared* failing branch,
//! whichever failed first on the clock. Branches declared after a failing one stop at their
//! next node boundary (their error could not be reported anyway); branches declared before it
//! run on, because theirs would take precedence. A panic in a branch is re-raised once every
//! branch has been joined — ahead of any branch's error, even an earlier-declared one: a panic
//! is a bug, and reporting an ordinary error in its place would swallow it.

use super::branch::Halt;
use super::cache::{Entry, Found, NodeCache};
use super::detach::{Detached, Kept, Remains};
use super::error::RunError;
use super::hooks::{Host, ItemContext, Watch};
use super::keys::RunKeys;
use super::lane::{Lane, Walk};
use super::observer::{Begun, Ended, Observer, Opened};
use super::table::Frame;
use super::trace::{thread_number, Span, Trace};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use crate::model::catalog::Catalog;
use crate::model::device::Device;
use crate::model::driver::Driver;
use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::node::{Ctx, Node, Transition, DEFAULT_TURN_LIMIT};
use crate::model::reading::Reading;
use crate::model::value::Value;
use crate::plan::Plan;
use crate::run::crew::Crew;
use crate::run::program::{Op, Program, Read, Reads, Step};

/// Runs plans, with an optional driver, watch, host, trace, observer and cache.
#[derive(Clone)]
pub struct Executor {
    pub(super) driver: Option<Arc<dyn Driver>>,
    pub(super) cache: Option<Arc<dyn NodeCache>>,
    pub(super) watch: Option<Arc<dyn Watch>>,
    pub(super) host: Option<Arc<dyn Host>>,
    pub(super) trace: Option<Arc<Trace>>,
    pub(super) observer: Option<Arc<dyn Observer>>,
    pub(super) reading: Option<Arc<dyn Reading>>,
    pub(super) turn_limit: u32,
}

/// What a detachable run keeps on the heap for its branches, besides its table.
struct RunParts {
    executor: Executor,
    program: Arc<Program>,
    input: Value,
    detached: Detached,
    keys: Option<RunKeys>,
}

impl Default for Executor {
    fn default() -> Self {
        Executor::new()
    }
}

/// How far down nested ops the first step of an op is looked for, to prefetch it: a nested
/// block of the DSL begins within two, and a bound keeps a walk of a deep plan linear.
const PREFETCH_DEPTH: usize = 4;

/// The first step `op` runs, if it lies within [`PREFETCH_DEPTH`] levels.
fn first_step(mut op: &Op) -> Option<&Step> {
    for _ in 0..PREFETCH_DEPTH {
        op = match op {
            Op::Execute(step) => return Some(step),
            Op::Sequence {
                steps: children, ..
            }
            | Op::Wave {
                branches: children, ..
            } => children.first()?,
            Op::Empty | Op::Map(_) | Op::Switch(_) | Op::Loop(_) => return None,
        };
    }
    None
}

/// Before running the op before `next`, and the one before that: a node's memory is fetched
/// two ops ahead, and what its call reads first ([`crate::Node::prefetch`]) one op ahead, once
/// the node's memory is there to say where that is. A graph larger than the caches then finds
/// each node's memory in them instead of waiting for it, one miss after another.
pub(super) fn prefetch_ahead(next: Option<&Op>, after: Option<&Op>) {
    if let Some(step) = after.and_then(first_step) {
        prefetch_line(Arc::as_ptr(&step.node).cast::<u8>());
    }
    if let Some(step) = next.and_then(first_step) {
        step.node.prefetch();
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

    /// Records a [`Span`] in `trace` for every step of every run.
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

    /// Runs `plan` on `input`, with the implementations in `catalog`.
    ///
    /// Every root receives `input`. The result is the output of the plan's one leaf, or a
    /// [`Value::Map`] keyed by leaf id, in step order, when there are several; an empty plan
    /// returns `input`. To run a plan many times, resolve it once with [`Program::new`] and use
    /// [`Executor::run_program`].
    ///
    /// # Errors
    /// [`RunError::Invalid`] when the plan does not fit the catalog (see [`Program::new`]);
    /// [`RunError::NeedsLoop`] when it has an async node ([`Executor::start`] runs those);
    /// otherwise the first error in plan order, and within a wave the first declared failing
    /// branch's.
    ///
    /// # Panics
    /// Re-raises a node's panic, after every branch of the wave it happened in was joined.
    pub fn run(&self, plan: &Plan, catalog: &Catalog, input: Value) -> Result<Value, RunError> {
        // A one-off run: its crew keeps no idle thread, and its threads end after it.
        let program = Program::new(plan, catalog)?;
        self.run_on(&program, &Crew::new(0), input)
    }

    /// Runs a resolved plan on `input`; see [`Executor::run`]. The program carries its own
    /// implementations.
    ///
    /// # Errors
    /// As [`Executor::run`].
    ///
    /// # Panics
    /// As [`Executor::run`].
    pub fn run_program(&self, program: &Program, input: Value) -> Result<Value, RunError> {
        self.run_on(program, &program.crew, input)
    }

    /// Runs a resolved plan on `input`, as [`Executor::run_program`] does, except that the
    /// calling thread may stop waiting for branches that do not stop: once the watch has asked
    /// the run to stop, branches still running a node after a short grace (100 ms) are left to
    /// finish in the background, their results dropped, and the run returns
    /// [`RunError::Abandoned`] naming their nodes. What they borrow — the program, the values,
    /// the hooks — stays alive until the last of them finishes. Only the thread that called
    /// this gives up, so only its [`Watch::poll`] decides.
    ///
    /// When the watch has a [deadline](Watch::deadline), the calling thread runs no node at
    /// all: the plan is walked on a thread lent by the program's crew, in the context the host
    /// captures here, while the caller only waits — so it returns by the deadline (and the
    /// grace) even when the node that overruns would otherwise have run on it. A run that
    /// finishes past its deadline returns [`RunError::PastDeadline`], never its result.
    ///
    /// # Errors
    /// As [`Executor::run`], and [`RunError::Abandoned`].
    ///
    /// # Panics
    /// As [`Executor::run`].
    pub fn run_detachable(&self, program: &Arc<Program>, input: Value) -> Result<Value, RunError> {
        Self::refuse_async(program)?;
        let remains = Arc::new(Remains::new());
        let parts = Kept::new(RunParts {
            executor: self.clone(),
            program: Arc::clone(program),
            input,
            detached: Detached::new(&**program, program.len(), Arc::downgrade(&remains)),
            keys: self.run_keys(program),
        });
        let mut table = Kept::new(vec![None; program.len()]);
        let RunParts {
            executor,
            program,
            input,
            detached,
            keys,
        } = parts.get();
        let mut frame = Frame {
            base: 0,
            own: table.get_mut(),
            shared: None,
        };
        // On the heap too: every lane of the run points to it, a branch left running included.
        let walk = Kept::new(Walk::new(
            &program.crew,
            thread::current().id(),
            Some(detached),
            None,
        ));
        let lane = Lane::new(walk.get(), program, keys.as_ref(), program.prefetching());
        let opened = executor.begin_run(program, None, None);
        let deadline = executor.watch.as_deref().and_then(Watch::deadline);
        let walked = match deadline {
            // No node may run on the caller's thread: it could not be left behind.
            Some(_) => executor.walk_elsewhere(&program.root, input, &mut frame, lane),
            None => executor.walk(&program.root, input, &mut frame, lane),
        };
        // The end of the run is a node boundary like any other: one that ends past its deadline
        // has not finished within it, whichever node overran, and is not a success.
        let walked = match walked {
            Ok(()) if deadline.is_some_and(|deadline| Instant::now() >= deadline) => {
                Err(Halt::Failed(RunError::PastDeadline))
            }
            other => other,
        };
        if detached.given_up() {
            let running = detached.running(&program.ids);
            let result = Err(RunError::Abandoned { running });
            executor.end_work(opened, &Ended::of(&result));
            walk.leave(&remains);
            table.leave(&remains);
            parts.leave(&remains);
            return result;
        }
        let result = Self::finish(program, walked, table.get_mut(), || input.clone());
        executor.end_work(opened, &Ended::of(&result));
        drop((table, remains));
        result
    }

    fn run_on(&self, program: &Program, crew: &Crew, input: Value) -> Result<Value, RunError> {
        Self::refuse_async(program)?;
        let mut table: Vec<Option<Value>> = vec![None; program.len()];
        let mut frame = Frame {
            base: 0,
            own: &mut table,
            shared: None,
        };
        let keys = self.run_keys(program);
        let walk = Walk::new(crew, thread::current().id(), None, None);
        let lane = Lane::new(&walk, program, keys.as_ref(), program.prefetching());
        let opened = self.begin_run(program, None, None);
        let walked = self.walk(&program.root, &input, &mut frame, lane);
        let result = Self::finish(program, walked, &mut table, || input);
        self.end_work(opened, &Ended::of(&result));
        result
    }

    /// Refuses a program with an async node: only [`Executor::start`] has a loop to await it.
    pub(super) fn refuse_async(program: &Program) -> Result<(), RunError> {
        if !program.is_async() {
            return Ok(());
        }
        Err(RunError::NeedsLoop {
            node: program
                .first_async()
                .expect("an async program has an async node"),
        })
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

    pub(super) fn walk(
        &self,
        op: &Op,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        match op {
            Op::Empty => Ok(()),
            Op::Execute(step) => self.step(step, input, frame, lane),
            Op::Sequence {
                steps, drop_after, ..
            } => self.walk_steps(steps, drop_after, 0..steps.len(), input, frame, lane),
            Op::Wave {
                branches, bounds, ..
            } => self.wave(branches, bounds, input, frame, lane),
            Op::Map(map) => self.map(map, input, frame, lane),
            Op::Switch(switch) => self.switch(switch, input, frame, lane),
            Op::Loop(repeat) => self.repeat(repeat, input, frame, lane),
        }
    }

    /// Walks steps `range` of a sequence, dropping after each what `drop_after` says: the whole
    /// sequence, or the run of its sync steps an async run lends a thread.
    // Inlined into `walk`: the sequence is the loop every run goes round once per step.
    #[inline]
    pub(super) fn walk_steps(
        &self,
        steps: &[Op],
        drop_after: &[Box<[usize]>],
        range: std::ops::Range<usize>,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        for at in range {
            if lane.prefetching {
                prefetch_ahead(steps.get(at + 1), steps.get(at + 2));
            }
            self.walk(&steps[at], input, frame, lane)?;
            if let Some(done) = drop_after.get(at) {
                for &slot in done {
                    *frame.cell(slot) = None;
                }
            }
        }
        Ok(())
    }

    fn step(
        &self,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        if lane.cancelled() {
            return Err(Halt::Cancelled);
        }
        if self.watch.as_deref().is_some_and(Watch::interrupted) {
            return Err(Halt::Failed(RunError::Interrupted));
        }
        lane.mark_running(step, true);
        let value = match lane.keys {
            None => self.gather_and_call(step, input, frame, lane),
            Some(keys) => self.through_cache(keys, step, input, frame, lane),
        };
        lane.mark_running(step, false);
        *frame.cell(step.slot()) = Some(value?);
        Ok(())
    }

    /// What `step` reads, gathered from the table: the run's input, one predecessor's value, or
    /// several keyed by id; each taken when the step is its last reader, cloned otherwise.
    pub(super) fn gather(step: &Step, input: &Value, frame: &mut Frame<'_>) -> Value {
        match &step.from {
            Reads::Input => input.clone(),
            Reads::One(one) => frame.gather(*one),
            Reads::Many(many) => Value::Map(
                many.reads
                    .iter()
                    .map(|(source, read)| (source.shared(), frame.gather(*read)))
                    .collect::<Vec<_>>()
                    .into(),
            ),
        }
    }

    /// Gathers a step's inputs from the table and calls its node on them.
    fn gather_and_call(
        &self,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<Value, Halt> {
        // Each arm drops what it gathered as soon as the node is done with it.
        let value = match &step.from {
            Reads::Input => self.call(step, input, lane)?,
            Reads::One(one) => {
                let read = frame.gather(*one);
                self.call(step, &read, lane)?
            }
            Reads::Many(many) => {
                let pairs = many
                    .reads
                    .iter()
                    .map(|(source, read)| (source.shared(), frame.gather(*read)))
                    .collect::<Vec<_>>();
                self.call(step, &Value::Map(pairs.into()), lane)?
            }
        };
        Ok(value)
    }

    /// A step of a run with a cache: its output from the cache when its key is there (the
    /// values it would have taken are dropped unread), otherwise from its node, filed under its
    /// key with its digest. Either way the identity of its output — its digest, or its key
    /// where it has none — is recorded for the steps that read it.
    // Kept out of line: a run without a cache should not carry its code through every step.
    #[cold]
    #[inline(never)]
    fn through_cache(
        &self,
        keys: &RunKeys,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<Value, Halt> {
        let key = match self.look_up(keys, step, input, frame, lane) {
            Ok(found) => return Ok(found),
            Err(key) => key,
        };
        let started = Instant::now();
        let gathered = Self::gather(step, input, frame);
        let gathered = self.read_deferred(keys, step, gathered, lane)?;
        let value = self.call(step, &gathered, lane)?;
        drop(gathered);
        let id = &lane.program.ids[step.slot()];
        Ok(Self::file(keys, step, id, key, value, started.elapsed()))
    }

    /// Looks `step` up in the run's cache: `Ok` with its output when its key is there (the
    /// values it would have taken dropped unread, its span marked cached, its identity
    /// settled) — left unread where only nodes read it ([`RunKeys::deferrable`]) and it read
    /// nothing this run computed, with what it would have taken kept instead — `Err` with its
    /// key (if it has one) when it must run.
    pub(super) fn look_up(
        &self,
        keys: &RunKeys,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<Value, Option<Key>> {
        let id = &lane.program.ids[step.slot()];
        let key = keys
            .cache
            .fingerprint(id, &*step.node)
            .and_then(|fingerprint| keys.key_of(id, &fingerprint, step, input));
        let Some(key) = key else {
            return Err(None);
        };
        if keys.deferrable(step.slot()) && Self::reads_nothing_computed(step, frame) {
            // Only nodes read it: its output is read when one of them runs, if one does.
            match keys.cache.find(id, &key) {
                Some(Found::Unread(found)) => {
                    keys.settle(step.slot(), Some(found.digest.unwrap_or(key)));
                    let deferred = Self::defer(step, key, found, input, frame);
                    self.mark_cached(step, id, lane);
                    return Ok(deferred);
                }
                Some(Found::Read(entry)) => {
                    self.skip(step, id, frame, lane);
                    keys.settle(step.slot(), Some(entry.digest.unwrap_or(key)));
                    return Ok(entry.value);
                }
                None => {}
            }
        } else if let Some(entry) = keys.cache.get(id, &key) {
            self.skip(step, id, frame, lane);
            keys.settle(step.slot(), Some(entry.digest.unwrap_or(key)));
            return Ok(entry.value);
        }
        Err(Some(key))
    }

    /// Files what `step`'s node computed, `value` in `took`, under its `key` if it has one, and
    /// settles the identity readers key on: its digest, so that an output computed again the
    /// same leaves them hitting; its key where it has no digest.
    pub(super) fn file(
        keys: &RunKeys,
        step: &Step,
        id: &NodeId,
        key: Option<Key>,
        value: Value,
        took: std::time::Duration,
    ) -> Value {
        let digest = keys.cache.digest(&value);
        if let Some(key) = key {
            let entry = Entry { value, digest };
            keys.cache.put(id, &key, &entry, took);
            keys.settle(step.slot(), digest.or(Some(key)));
            return entry.value;
        }
        keys.settle(step.slot(), digest);
        value
    }

    /// What a step found in the cache leaves undone: it drops the values it would have taken
    /// (their last reader in the branch, it would have dropped them after its call) and marks
    /// its span cached in the trace.
    fn skip(&self, step: &Step, id: &NodeId, frame: &mut Frame<'_>, lane: Lane<'_>) {
        let mut drop_taken = |read: &Read| {
            if read.take {
                drop(frame.take(read.slot()));
            }
        };
        match &step.from {
            Reads::Input => {}
            Reads::One(one) => drop_taken(one),
            Reads::Many(many) => many.reads.iter().for_each(|(_, read)| drop_taken(read)),
        }
        self.mark_cached(step, id, lane);
    }

    /// Records, when the run is traced, that `step`'s node `id` was found in the cache: a span
    /// marked cached, of no length; and tells the observer, when there is one.
    pub(super) fn mark_cached(&self, step: &Step, id: &NodeId, lane: Lane<'_>) {
        if let Some(trace) = self.trace.as_deref() {
            let now = trace.now();
            trace.record(Span {
                node: id.clone(),
                start: now,
                end: now,
                thread: thread_number(),
                branch: lane.path(),
                turns: 0,
                error: None,
                device: step.device,
                host: None,
                cached: true,
                part_of: None,
            });
        }
        if let Some(observer) = self.observer.as_deref() {
            Self::observe_cached(observer, step, id, &lane.path());
        }
    }

    /// Tells `observer` that `step`'s node `id`, in the branch at `branch`, was answered by the
    /// cache.
    #[cold]
    pub(super) fn observe_cached(
        observer: &dyn Observer,
        step: &Step,
        id: &NodeId,
        branch: &[usize],
    ) {
        let opened = observer.begin(&Begun::Cached {
            node: id,
            device: step.device,
            branch,
        });
        observer.end(opened, &Ended::Returned);
    }

    /// Tells the observer, when there is one, that attempt `attempt` of `step`'s node `id`
    /// begins in the branch at `branch`: what it opened, for [`Executor::end_work`].
    pub(super) fn begin_call(
        &self,
        step: &Step,
        id: &NodeId,
        attempt: u32,
        branch: impl FnOnce() -> Vec<usize>,
    ) -> Option<Opened> {
        let observer = self.observer.as_deref()?;
        Some(observer.begin(&Begun::Call {
            node: id,
            attempt,
            device: step.device,
            branch: &branch(),
            awaited: step.is_async(),
            described: step.node.described(),
        }))
    }

    /// Tells the observer, when there is one, that a run of `program` begins — a whole run, or
    /// the run of a stream's item at index `item` — on this thread, inside `context` when the
    /// item has one, so that what the observer makes current there travels with the item
    /// through its stages.
    pub(crate) fn begin_run(
        &self,
        program: &Program,
        item: Option<u64>,
        context: Option<&mut (dyn ItemContext + 'static)>,
    ) -> Option<Opened> {
        let observer = self.observer.as_deref()?;
        let begun = Begun::Run {
            item,
            nodes: program.ids.len(),
            asynchronous: program.is_async(),
        };
        let Some(context) = context else {
            return Some(observer.begin(&begun));
        };
        let mut opened = None;
        context.enter(&mut || opened = Some(observer.begin(&begun)));
        opened
    }

    /// Tells the observer that the work `opened` was returned for ends as `ended` says.
    pub(crate) fn end_work(&self, opened: Option<Opened>, ended: &Ended<'_>) {
        if let (Some(observer), Some(opened)) = (self.observer.as_deref(), opened) {
            observer.end(opened, ended);
        }
    }

    /// Runs a step's node on its input, traced when a trace was asked for and observed when
    /// an observer was given.
    pub(super) fn call(
        &self,
        step: &Step,
        input: &Value,
        lane: Lane<'_>,
    ) -> Result<Value, RunError> {
        let id = &lane.program.ids[step.slot()];
        if step.has_policy() {
            return self.call_with_policy(step, id, input, lane);
        }
        match (self.trace.as_deref(), self.observer.is_some()) {
            (None, false) => self.execute(&*step.node, step.device, id, input, &mut 0),
            (trace, _) => self.traced(trace, step, id, input, lane),
        }
    }

    // Kept out of line: an untraced run should not carry its code through every step.
    #[cold]
    #[inline(never)]
    fn traced(
        &self,
        trace: Option<&Trace>,
        step: &Step,
        id: &NodeId,
        input: &Value,
        lane: Lane<'_>,
    ) -> Result<Value, RunError> {
        let opened = self.begin_call(step, id, 0, || lane.path());
        let outcome = match trace {
            Some(trace) => Self::spanned(trace, step, id, lane, |turns| {
                self.execute(&*step.node, step.device, id, input, turns)
            }),
            None => self.execute(&*step.node, step.device, id, input, &mut 0),
        };
        self.end_work(opened, &Ended::of(&outcome));
        outcome
    }

    /// Makes `call` — one call of `step`'s node, which counts its turns — and records its span
    /// in `trace`: from the call to its return, on this thread, in `lane`'s branch.
    pub(super) fn spanned(
        trace: &Trace,
        step: &Step,
        id: &NodeId,
        lane: Lane<'_>,
        call: impl FnOnce(&mut u32) -> Result<Value, RunError>,
    ) -> Result<Value, RunError> {
        let start = trace.now();
        let mut turns = 0;
        let outcome = call(&mut turns);
        Self::record_call(trace, step, id, lane.path(), start, turns, &outcome);
        outcome
    }

    /// Records the span of one call of `step`'s node `id`, from `start` to now, on this
    /// thread, in the branch at `path`, with its turns and its error if it failed.
    pub(super) fn record_call(
        trace: &Trace,
        step: &Step,
        id: &NodeId,
        path: Vec<usize>,
        start: std::time::Duration,
        turns: u32,
        outcome: &Result<Value, RunError>,
    ) {
        trace.record(Span {
            node: id.clone(),
            start,
            end: trace.now(),
            thread: thread_number(),
            branch: path,
            turns,
            error: outcome.as_ref().err().map(ToString::to_string),
            device: step.device,
            host: None,
            cached: false,
            part_of: None,
        });
    }

    /// Runs `work`, which blocks, through the host if there is one.
    pub(super) fn blocking(&self, work: &mut (dyn FnMut() + Send)) {
        match &self.host {
            Some(host) => host.blocking(work),
            None => work(),
        }
    }

    /// Calls one node, `implementation` run as `node` placed on `device`, turn after turn until
    /// it is done; `turns` counts the calls.
    // Inlined into every caller, so that the policies' callers (see `attempt`) do not make the
    // plain step's call an out-of-line one: measured on a shared machine, not isolated from the
    // step's own change, the chain row ran a few percent slower with the choice left open.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(super) fn execute(
        &self,
        implementation: &dyn Node,
        device: Option<Device>,
        node: &NodeId,
        input: &Value,
        turns: &mut u32,
    ) -> Result<Value, RunError> {
        let mut results: Vec<Value> = Vec::new();
        let mut turn = 0;
        loop {
            if turn >= self.turn_limit {
                // Only reachable with a limit of 0: the node gets no call at all.
                return Err(RunError::TurnLimit {
                    node: node.clone(),
                    limit: self.turn_limit,
                });
            }
            let ctx = Ctx::new(node, turn, &results).on(device);
            *turns = turn + 1;
            let transition =
                implementation
                    .forward(input, &ctx)
                    .map_err(|error| RunError::NodeFailed {
                        node: node.clone(),
                        error,
                    })?;
            let requests = match transition {
                Transition::Done(value) => return Ok(value),
                Transition::Await(requests) => requests,
            };
            turn += 1;
            if turn >= self.turn_limit {
                return Err(RunError::TurnLimit {
                    node: node.clone(),
                    limit: self.turn_limit,
                });
            }
            let driver = self
                .driver
                .as_deref()
                .ok_or_else(|| RunError::NoDriver { node: node.clone() })?;
            let mut answered = None;
            self.blocking(&mut || answered = Some(driver.perform(&requests)));
            results = answered
                .expect("the host ran the driver")
                .map_err(|error| RunError::DriverFailed {
                    node: node.clone(),
                    error,
                })?;
            if results.len() != requests.len() {
                return Err(RunError::WrongResultCount {
                    node: node.clone(),
                    asked: requests.len(),
                    got: results.len(),
                });
            }
        }
    }
}
