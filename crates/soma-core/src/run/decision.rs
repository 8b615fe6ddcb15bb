//! A step that decides — a `Map`, a `Switch`, a `Loop` — as both walks make it: what it reads
//! once past its boundary, how its own node (a selector, a predicate) is called through the
//! cache, how its output is written, how it reads its items, its case and its loop's bound, and
//! how each part of it (an item, a case, an iteration) is told to the trace and the observer.
//! The sync walk runs its parts as branches and bodies on threads (`run/sync`), the async walk
//! as tasks (`run/aio`); what the step means is here, once.

use std::time::Instant;

use super::branch::Halt;
use super::cache::Entry;
use super::call::{gather, NodeCall, Site};
use super::error::RunError;
use super::executor::Executor;
use super::hooks::Watch;
use super::keys::RunKeys;
use super::observer::{Begun, Ended, Opened, Part};
use super::program::{LoopOp, Program, Step, SwitchOp};
use super::table::Frame;
use super::trace::{thread_number, Span, Trace};
use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::reading::NotItems;
use crate::model::value::Value;

/// A part of a step under way — an item, a case, an iteration — from
/// [`Executor::part_begins`] to [`Executor::part_ends`]: what the trace and the observer keep
/// of it meanwhile.
pub(super) struct PartUnderWay<'k> {
    which: Part<'k>,
    opened: Option<Opened>,
    start: Option<std::time::Duration>,
}

impl Executor {
    /// What a decision step reads, once it may start ([`Executor::decision_gathered`]), each
    /// output in it found in the cache and left unread read now (`crate::run::deferred`).
    pub(super) fn decision_input(
        &self,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        site: Site<'_>,
    ) -> Result<Value, Halt> {
        let gathered = self.decision_gathered(step, input, frame, site)?;
        match site.keys {
            Some(keys) => Ok(self.read_deferred(keys, step, gathered, site)?),
            None => Ok(gathered),
        }
    }

    /// What a decision step gathers, once it may start: the checks a step makes before its
    /// node, in the branch at `site`; the outputs in it left unread by their hits not read yet
    /// (the async walk reads them itself, awaiting an async node that must compute one again).
    pub(super) fn decision_gathered(
        &self,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        site: Site<'_>,
    ) -> Result<Value, Halt> {
        if site.branch.stopped() {
            return Err(Halt::Cancelled);
        }
        if self.watch.as_deref().is_some_and(Watch::interrupted) {
            return Err(Halt::Failed(RunError::Interrupted));
        }
        Ok(gather(step, input, frame))
    }

    /// With a cache, `step` — a `Map` or a `Switch`, running `programs` — looked up as a whole
    /// ([`RunKeys::decision_key`]), from the identities of what it reads, for either walk:
    /// `true` when its output was found and written, its input left unread, and its span marked
    /// cached; otherwise its key is noted, to file its output under when it is written
    /// ([`write`]).
    pub(super) fn decision_found(
        &self,
        step: &Step,
        programs: &[(&str, &Program)],
        input: &Value,
        frame: &mut Frame<'_>,
        site: Site<'_>,
    ) -> bool {
        let Some(keys) = site.keys else {
            return false;
        };
        let id = &site.program.ids[step.slot()];
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
        NodeCall::new(self, step, site).mark_cached();
        *frame.cell(step.slot()) = Some(entry.value);
        true
    }

    /// Calls `step`'s own node — a switch's selector, a loop's predicate — on `value`; with a
    /// cache, through it as any node is, under the key `key` makes (from the run's identities,
    /// the node's id and its fingerprint), its span marked cached when found.
    pub(super) fn decision_call(
        &self,
        step: &Step,
        value: &Value,
        site: Site<'_>,
        key: impl FnOnce(&RunKeys, &NodeId, &Key) -> Option<Key>,
    ) -> Result<Value, RunError> {
        let call = NodeCall::new(self, step, site);
        let Some(keys) = site.keys else {
            return call.call(value);
        };
        let id = call.id();
        let key = keys
            .cache
            .fingerprint(id, &*step.node)
            .and_then(|fingerprint| key(keys, id, &fingerprint));
        let Some(key) = key else {
            let _calling = keys.calling();
            return call.call(value);
        };
        if let Some(entry) = keys.cache.get(id, &key) {
            call.mark_cached();
            return Ok(entry.value);
        }
        let started = Instant::now();
        let calling = keys.calling();
        let value = call.call(value)?;
        drop(calling);
        Ok(file_answer(keys, id, &key, value, started.elapsed()))
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
            record_part(
                trace,
                id,
                &under_way.which.to_string(),
                branch(),
                start,
                outcome,
            );
        }
        self.end_work(under_way.opened, &part_ended(outcome));
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
}

/// Writes `value` as a decision step's output, its digest what readers key on when the run
/// has `keys` (`digested`, when the program that computed it has it already:
/// [`RunKeys::result_digest`]); filed in the cache under the key the step missed under, when
/// it was looked up as a whole (`RunKeys::decision_key`).
pub(super) fn write(
    step: &Step,
    id: &NodeId,
    (value, digested): (Value, Option<Key>),
    frame: &mut Frame<'_>,
    keys: Option<&RunKeys>,
) {
    if let Some(keys) = keys {
        let digest = keys.digest_decided(step.slot(), &value, digested);
        if let Some((key, took)) = keys.decided(step.slot()) {
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

/// Files what a selector or predicate `id` answered, `value` in `took`, under `key`.
pub(super) fn file_answer(
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
