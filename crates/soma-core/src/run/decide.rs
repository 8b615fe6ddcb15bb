//! The steps that decide as they run: a `Map` runs its body on every item of a list, items in
//! flight together; a `Switch` runs the one case its selector names; a `Loop` runs its body
//! until its predicate says done.
//!
//! Each holds sub-programs with tables of their own: an item, a case or an iteration runs as a
//! whole run of its program would, inside the step, along a lane that keeps the step's place
//! (so a failure of an earlier-declared branch stops it at a node boundary, and a Ctrl-C or a
//! deadline at the next one). A `Map`'s items are the branches of a wave whose width is the
//! list's: offered to the crew at once, each run start to finish on the thread that took it,
//! in a copy of the context the step was reached in; with `in_flight`, that many lanes take
//! the items one after another instead. The error of the first failing item by index is the
//! step's, as the first declared branch's is a wave's: later items stop at their next node
//! boundary, earlier ones run on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::cache::Entry;

use super::detach::Kept;
use super::error::RunError;
use super::executor::{Executor, Halt};
use super::fan_out::{settle, FanOut, Outcome};
use super::hooks::Watch;
use super::keys::RunKeys;
use super::lane::Lane;
use super::observer::{Begun, Ended, Opened, Part};
use super::program::{LoopOp, MapOp, Program, Step, SwitchOp};
use super::table::Frame;
use super::trace::{thread_number, Span, Trace};
use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::reading::{NativeReading, NotItems, Reading};
use crate::model::value::Value;

/// What a `Map` lends its items: the items, the next one no lane has taken (when lanes take
/// items one after another), and each item's outcome, written by the thread that ran it.
struct MapItems {
    items: Vec<Value>,
    next: AtomicUsize,
    outcomes: Box<[Mutex<Option<Outcome<Value>>>]>,
}

/// A part of a step under way — an item, a case, an iteration — from
/// [`Executor::part_begins`] to [`Executor::part_ends`]: what the trace and the observer keep
/// of it meanwhile.
pub(super) struct PartUnderWay<'k> {
    which: Part<'k>,
    opened: Option<Opened>,
    start: Option<std::time::Duration>,
}

impl Executor {
    pub(super) fn reading(&self) -> &dyn Reading {
        self.reading.as_deref().unwrap_or(&NativeReading)
    }

    /// What a decision step reads, once it may start: the checks a step makes before its node.
    /// An output found in the cache and left unread is read now (see `crate::run::deferred`).
    pub(super) fn decision_input(
        &self,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<Value, Halt> {
        if lane.cancelled() {
            return Err(Halt::Cancelled);
        }
        if self.watch.as_deref().is_some_and(Watch::interrupted) {
            return Err(Halt::Failed(RunError::Interrupted));
        }
        let gathered = Executor::gather(step, input, frame);
        match lane.keys {
            Some(keys) => Ok(self.read_deferred(keys, step, gathered, lane)?),
            None => Ok(gathered),
        }
    }

    /// With a cache, `step` — a `Map` or a `Switch`, running `programs` — looked up as a whole
    /// ([`RunKeys::decision_key`]): `true` when its output was found and written, its input
    /// left unread, and its span marked cached; otherwise its key is noted, to file its output
    /// under when it is written.
    fn decision_found(
        &self,
        step: &Step,
        programs: &[(&str, &Program)],
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> bool {
        let Some(keys) = lane.keys else {
            return false;
        };
        let id = &lane.program.ids[step.slot()];
        let Some(key) = keys.decision_key(id, step, programs, input) else {
            return false;
        };
        // Peeked first: a step not found whole is no lookup of the stats' (the nodes it runs
        // are counted as they are looked up), one found is a hit.
        let found = keys
            .cache
            .peek(id, &key)
            .and_then(|_| keys.cache.get(id, &key));
        let Some(entry) = found else {
            keys.deciding(step.slot(), key);
            return false;
        };
        keys.settle(step.slot(), Some(entry.digest.unwrap_or(key)));
        self.mark_cached(step, id, lane);
        *frame.cell(step.slot()) = Some(entry.value);
        true
    }

    /// Runs `work` as `step`'s work, marked running meanwhile for a run its caller may leave,
    /// and writes what it returns as the step's value. A decision as a whole is never looked
    /// up in a cache (what it runs is not in its key): the nodes it runs are, each on what it
    /// reads ([`Executor::run_body`]), and its output's digest is what readers key on.
    fn run_decision(
        step: &Step,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
        work: impl FnOnce() -> Result<Value, Halt>,
    ) -> Result<(), Halt> {
        lane.mark_running(step, true);
        let value = work();
        lane.mark_running(step, false);
        Self::write_decision(step, value?, frame, lane);
        Ok(())
    }

    /// Writes `value` as a decision step's output, its digest what readers key on; filed in
    /// the cache under the key the step missed under, when it was looked up as a whole.
    pub(super) fn write_decision(step: &Step, value: Value, frame: &mut Frame<'_>, lane: Lane<'_>) {
        if let Some(keys) = lane.keys {
            let digest = keys.cache.digest(&value);
            if let Some((key, took)) = keys.decided(step.slot()) {
                let id = &lane.program.ids[step.slot()];
                let entry = Entry { value, digest };
                keys.cache.put(id, &key, &entry, took);
                keys.settle(step.slot(), digest.or(Some(key)));
                *frame.cell(step.slot()) = Some(entry.value);
                return;
            }
            keys.settle(step.slot(), digest);
        }
        *frame.cell(step.slot()) = Some(value);
    }

    /// Runs `body` on `input` with a table of its own, along `lane` (its place in the waves
    /// and items around it), and returns what a run of it returns.
    ///
    /// With a cache, its nodes are keyed and looked up as a run's are, with identities of
    /// their own, its roots keyed on `input`'s digest: an item, a case's input or an
    /// iteration's seen before finds what its nodes computed then, and a run that failed at
    /// one item kept what the others' nodes completed.
    ///
    /// The table, the input and the identities are kept on the heap: when the run's caller
    /// gives up waiting for a wave inside (Ctrl-C, on the caller's thread), its branches still
    /// running borrow them, and they are left to the run's remains with the rest.
    fn run_body(&self, body: &Program, input: &Value, lane: Lane<'_>) -> Result<Value, Halt> {
        let keys = lane
            .keys
            .map(|outer| RunKeys::new(Arc::clone(&outer.cache), body));
        let mut kept = Kept::new((input.clone(), vec![None; body.len()], keys));
        let (input, table, keys) = kept.get_mut();
        let (input, keys) = (&*input, keys.as_ref());
        let mut frame = Frame {
            base: 0,
            own: table,
            shared: None,
        };
        // A sub-program's steps are not marked running (its step is: see
        // `Detached::set_running`).
        let inner = lane.body(body, keys);
        match self.walk(&body.root, input, &mut frame, inner) {
            Ok(()) => {
                let (input, table, _) = kept.get_mut();
                Ok(Executor::result(body, table, || input.clone()))
            }
            Err(halt) => {
                if let Some(remains) = halt.remains_if_given_up(&lane) {
                    kept.leave(&remains);
                }
                Err(halt)
            }
        }
    }

    /// Calls `step`'s own node — a switch's selector, a loop's predicate — on `value`; with a
    /// cache, through it as any node is, under the key `key` makes (from the run's identities,
    /// the node's id and its fingerprint), its span marked cached when found.
    pub(super) fn decision_call(
        &self,
        step: &Step,
        value: &Value,
        lane: Lane<'_>,
        key: impl FnOnce(&RunKeys, &NodeId, &Key) -> Option<Key>,
    ) -> Result<Value, RunError> {
        let Some(keys) = lane.keys else {
            return self.call(step, value, lane);
        };
        let id = &lane.program.ids[step.slot()];
        let key = keys
            .cache
            .fingerprint(id, &*step.node)
            .and_then(|fingerprint| key(keys, id, &fingerprint));
        let Some(key) = key else {
            return self.call(step, value, lane);
        };
        if let Some(entry) = keys.cache.get(id, &key) {
            self.mark_cached(step, id, lane);
            return Ok(entry.value);
        }
        let started = Instant::now();
        let value = self.call(step, value, lane)?;
        Ok(Self::file_decision(
            keys,
            id,
            &key,
            value,
            started.elapsed(),
        ))
    }

    /// Files what a selector or predicate `id` answered, `value` in `took`, under `key`.
    pub(super) fn file_decision(
        keys: &RunKeys,
        id: &NodeId,
        key: &Key,
        value: Value,
        took: std::time::Duration,
    ) -> Value {
        let digest = keys.cache.digest(&value);
        let entry = Entry { value, digest };
        keys.cache.put(id, key, &entry, took);
        entry.value
    }

    /// Runs `part` — an item, a case, an iteration of step `id` — its span recorded when the
    /// run is traced, and the observer told it, when there is one.
    fn part(
        &self,
        id: &NodeId,
        which: Part<'_>,
        lane: &Lane<'_>,
        part: impl FnOnce() -> Result<Value, Halt>,
    ) -> Result<Value, Halt> {
        if self.trace.is_none() && self.observer.is_none() {
            return part();
        }
        let under_way = self.part_begins(id, which, || lane.path());
        let outcome = part();
        self.part_ends(id, under_way, || lane.path(), &outcome);
        outcome
    }

    /// Begins part `which` of step `id`, in the branch at `branch`, as the trace and the
    /// observer see it — for either walk, on the thread or in the task that runs the part.
    pub(super) fn part_begins<'k>(
        &self,
        id: &NodeId,
        which: Part<'k>,
        branch: impl FnOnce() -> Vec<usize>,
    ) -> PartUnderWay<'k> {
        let opened = self.observer.as_deref().map(|observer| {
            observer.begin(&Begun::Part {
                step: id,
                part: which,
                branch: &branch(),
            })
        });
        PartUnderWay {
            which,
            opened,
            start: self.trace.as_deref().map(Trace::now),
        }
    }

    /// Ends a part [`Executor::part_begins`] began, with `outcome`: its span, named
    /// `id[which]`, recorded when the run is traced, and the observer told.
    pub(super) fn part_ends(
        &self,
        id: &NodeId,
        under_way: PartUnderWay<'_>,
        branch: impl FnOnce() -> Vec<usize>,
        outcome: &Result<Value, Halt>,
    ) {
        if let (Some(trace), Some(start)) = (self.trace.as_deref(), under_way.start) {
            Self::record_part(
                trace,
                id,
                &under_way.which.to_string(),
                branch(),
                start,
                outcome,
            );
        }
        self.end_work(under_way.opened, &Self::part_ended(outcome));
    }

    /// How a part that ended with `outcome` ended, as an observer is told.
    fn part_ended(outcome: &Result<Value, Halt>) -> Ended<'_> {
        match outcome {
            Ok(_) => Ended::Returned,
            Err(Halt::Failed(error)) => Ended::Failed {
                error,
                retry_in: None,
            },
            Err(Halt::Cancelled | Halt::Abandoned) => Ended::Stopped,
        }
    }

    /// Records the span of an item, a case or an iteration `which` of step `id`, named
    /// `id[which]`, from `start` to now, in the branch at `path`.
    fn record_part(
        trace: &Trace,
        id: &NodeId,
        which: &str,
        path: Vec<usize>,
        start: std::time::Duration,
        outcome: &Result<Value, Halt>,
    ) {
        trace.record(Span {
            node: NodeId::new(format!("{id}[{which}]")),
            start,
            end: trace.now(),
            thread: thread_number(),
            branch: path,
            turns: 0,
            error: match outcome {
                Err(Halt::Failed(error)) => Some(error.to_string()),
                Ok(_) | Err(Halt::Cancelled | Halt::Abandoned) => None,
            },
            device: None,
            host: None,
            cached: false,
            part_of: Some(id.clone()),
        });
    }

    // Kept out of line: a run without decisions should not carry their code through
    // every step of its walk.
    #[cold]
    #[inline(never)]
    pub(super) fn map(
        &self,
        op: &MapOp,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        self.decision_level(frame, lane, &|frame| self.map_here(op, input, frame, lane))
    }

    fn map_here(
        &self,
        op: &MapOp,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        if self.decision_found(&op.step, &[("body", &op.body)], input, frame, lane) {
            return Ok(());
        }
        let read = self.decision_input(&op.step, input, frame, lane)?;
        let id = &lane.program.ids[op.step.slot()];
        Self::run_decision(&op.step, frame, lane, || {
            let items = self.items_of(id, &read)?;
            drop(read);
            let results = self.each_item(op, id, items, lane)?;
            Ok(self.reading().collect(results))
        })
    }

    /// Runs `op`'s body on every item, as the branches of one fan-out; the results in order,
    /// settled as a wave's are ([`settle`]).
    fn each_item(
        &self,
        op: &MapOp,
        id: &NodeId,
        items: Vec<Value>,
        lane: Lane<'_>,
    ) -> Result<Vec<Value>, Halt> {
        let count = items.len();
        if count == 0 {
            return Ok(Vec::new());
        }
        // One lane per item, as a wave of that width; or, bounded, `lanes` lanes that take the
        // items one after another, so that no more than that many are in flight.
        let lanes = op.in_flight.unwrap_or(count).clamp(1, count);
        let one_each = lanes == count;
        let locals = MapItems {
            items,
            next: AtomicUsize::new(0),
            outcomes: (0..count).map(|_| Mutex::new(None)).collect(),
        };
        let item = |fan: &FanOut<'_, MapItems>, index: usize| {
            let outcome = fan.branch(index, |lane| {
                self.part(id, Part::Item(index), &lane, || {
                    self.run_body(&op.body, &fan.locals.items[index], lane)
                })
            });
            *fan.locals.outcomes[index]
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(outcome);
        };
        let (locals, lanes_ended) = self.fan_out(
            lane,
            locals,
            std::iter::repeat_n((), lanes),
            &|fan, first, ()| {
                if one_each {
                    return item(fan, first);
                }
                loop {
                    let index = fan.locals.next.fetch_add(1, Ordering::Relaxed);
                    if index >= count || fan.failed_before(index) {
                        break;
                    }
                    item(fan, index);
                }
            },
        )?;
        let mut outcomes: Vec<_> = locals
            .outcomes
            .into_vec()
            .into_iter()
            .map(|outcome| outcome.into_inner().unwrap_or_else(PoisonError::into_inner))
            .collect();
        // A lane that never got a thread: in its item's place when each item has a lane of its
        // own, else after the items (the lanes that got one took its items).
        for (at, ended) in lanes_ended.into_iter().enumerate() {
            if let Err(payload) = ended {
                if one_each {
                    outcomes[at] = Some(Err(payload));
                } else {
                    outcomes.push(Some(Err(payload)));
                }
            }
        }
        settle(outcomes)
    }

    /// What a `Map` step read, as its items: a list; or [`RunError::NotAList`] naming the
    /// step, or the step's failure with the error that reading its items raised.
    pub(super) fn items_of(&self, id: &NodeId, read: &Value) -> Result<Vec<Value>, RunError> {
        self.reading().items(read).map_err(|not| match not {
            NotItems::NotAList(found) => RunError::NotAList {
                node: id.clone(),
                found,
            },
            NotItems::Failed(error) => RunError::NodeFailed {
                node: id.clone(),
                error,
            },
        })
    }

    // Kept out of line: a run without decisions should not carry their code through
    // every step of its walk.
    #[cold]
    #[inline(never)]
    pub(super) fn switch(
        &self,
        op: &SwitchOp,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        self.decision_level(frame, lane, &|frame| {
            self.switch_here(op, input, frame, lane)
        })
    }

    fn switch_here(
        &self,
        op: &SwitchOp,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        let cases: Vec<(&str, &Program)> =
            op.keys.iter().map(String::as_str).zip(&*op.cases).collect();
        if self.decision_found(&op.step, &cases, input, frame, lane) {
            return Ok(());
        }
        let read = self.decision_input(&op.step, input, frame, lane)?;
        let id = &lane.program.ids[op.step.slot()];
        Self::run_decision(&op.step, frame, lane, || {
            let chosen = self.decision_call(&op.step, &read, lane, |keys, id, fingerprint| {
                keys.key_of(id, fingerprint, &op.step, input)
            })?;
            let (at, key) = self.case_of(op, id, &chosen)?;
            self.part(id, Part::Case(&key), &lane, || {
                self.run_body(&op.cases[at], &read, lane)
            })
        })
    }

    /// The case a switch's selector chose, by index, and its key; [`RunError::UnknownCase`]
    /// naming the step when no case has it.
    pub(super) fn case_of(
        &self,
        op: &SwitchOp,
        id: &NodeId,
        chosen: &Value,
    ) -> Result<(usize, String), RunError> {
        let unknown = |key: String| RunError::UnknownCase {
            node: id.clone(),
            key,
            known: op.keys.to_vec(),
        };
        let key = self
            .reading()
            .key(chosen)
            .map_err(|found| unknown(format!("a {found}")))?;
        match op.keys.iter().position(|known| *known == key) {
            Some(at) => Ok((at, key)),
            None => Err(unknown(key)),
        }
    }

    /// The error of a loop whose predicate never said done: its bound and what its body last
    /// returned.
    pub(super) fn loop_limit(&self, op: &LoopOp, id: &NodeId, last: &Value) -> RunError {
        RunError::LoopLimit {
            node: id.clone(),
            max_iterations: op.max_iterations,
            last: self.reading().type_name(last),
        }
    }

    // Kept out of line: a run without decisions should not carry their code through
    // every step of its walk.
    #[cold]
    #[inline(never)]
    pub(super) fn repeat(
        &self,
        op: &LoopOp,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        self.decision_level(frame, lane, &|frame| {
            self.repeat_here(op, input, frame, lane)
        })
    }

    fn repeat_here(
        &self,
        op: &LoopOp,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        let read = self.decision_input(&op.step, input, frame, lane)?;
        let id = &lane.program.ids[op.step.slot()];
        Self::run_decision(&op.step, frame, lane, || {
            let mut current = read;
            for iteration in 0..op.max_iterations {
                let output = self.part(id, Part::Iteration(iteration), &lane, || {
                    self.run_body(&op.body, &current, lane)
                })?;
                let verdict =
                    self.decision_call(&op.step, &output, lane, |keys, id, fingerprint| {
                        keys.key_on(id, fingerprint, &op.step, &output)
                    })?;
                if self.reading().done(&verdict) {
                    return Ok(output);
                }
                current = output;
            }
            Err(self.loop_limit(op, id, &current).into())
        })
    }
}
