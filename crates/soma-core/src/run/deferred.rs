//! Outputs found in the cache and not read yet: what a hit leaves in its slot when only nodes
//! read it ([`RunKeys::deferrable`]), read when one of them runs.
//!
//! A node's key needs the digest of what it reads, never the value ([`crate::run::keys`]), so
//! a hit needs no more of its entry than the digest filed beside it ([`NodeCache::find`]). A
//! rerun of `big >> smaller >> tiny` that hits everywhere therefore reads `tiny`'s output, the
//! result, and nothing of `big` or `smaller`; a node that runs reads what it reads, just before
//! its call. An entry gone by then (removed by another process, damaged) is computed again,
//! by its node, from what that node read — kept in the deferred output for this, and itself
//! read (or computed again) first, from a stack: a chain of lost entries costs no stack. So
//! that keeping it costs nothing, a hit is left unread only when what its node read is the
//! run's input or outputs left unread themselves: a node that hits after one that ran reads
//! its entry when found, as before, and the value that ran is dropped when it would have been.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use crate::model::key::Key;
use crate::model::value::Value;
use crate::run::cache::{Entry, Unread};
use crate::run::call::{gather, NodeCall, Site};
use crate::run::error::RunError;
use crate::run::executor::Executor;
use crate::run::keys::RunKeys;
use crate::run::program::{Op, Program, Read, Reads, Step};
use crate::run::table::Frame;

/// A hit's output, not read yet: what the run puts in its slot, inside a `Value::Opaque`.
pub(crate) struct Deferred {
    /// The slot of the step that hit, whose node computes it again if it must.
    slot: usize,
    /// The key it was found under, which it is filed again under if computed again.
    key: Key,
    /// What its node read, each deferred output in it as it was: kept until this is read.
    input: Value,
    /// Reads the entry's output.
    read: Box<dyn Fn() -> Option<Value> + Send + Sync>,
    /// The output, once read or computed.
    value: OnceLock<Value>,
    /// Whether reading it failed: it is then computed again, never read twice.
    lost: AtomicBool,
}

/// The deferred output `value` stands for, if it is one.
fn deferred(value: &Value) -> Option<&Deferred> {
    value.downcast_ref::<Deferred>()
}

/// The values `input` (what a step gathered) holds that may be deferred: itself, or each value
/// of a join's map.
fn parts(input: &Value) -> Vec<&Value> {
    match input {
        Value::Map(pairs) => pairs.iter().map(|(_, value)| value).collect(),
        other => vec![other],
    }
}

/// `input` with each deferred output in it replaced by its value, read or computed already.
fn substituted(input: &Value) -> Value {
    let done = |value: &Value| match deferred(value) {
        Some(output) => output
            .value
            .get()
            .cloned()
            .expect("each deferred input is read before its reader"),
        None => value.clone(),
    };
    match input {
        Value::Map(pairs) => Value::Map(
            pairs
                .iter()
                .map(|(source, value)| (source.clone(), done(value)))
                .collect(),
        ),
        other => done(other),
    }
}

impl Deferred {
    /// The output, read now if it was not yet; `None` when its entry cannot be read.
    fn read(&self) -> Option<Value> {
        if let Some(value) = self.value.get() {
            return Some(value.clone());
        }
        if self.lost.load(Ordering::Acquire) {
            return None;
        }
        // Two readers may both read it (two branches of a wave that both run): the first kept
        // is the one every reader gets.
        if let Some(value) = (self.read)() {
            Some(self.value.get_or_init(|| value).clone())
        } else {
            self.lost.store(true, Ordering::Release);
            None
        }
    }
}

impl Executor {
    /// Whether what `step` reads holds nothing computed in this run: the run's input, or
    /// outputs of hits left unread — what a hit on it may keep, unread, at no cost.
    pub(super) fn reads_nothing_computed(step: &Step, frame: &Frame<'_>) -> bool {
        let unread = |read: &Read| {
            frame
                .read(read.slot())
                .is_some_and(|value| deferred(value).is_some())
        };
        match &step.from {
            Reads::Input => true,
            Reads::One(one) => unread(one),
            Reads::Many(joined) => joined.reads.iter().all(|(_, read)| unread(read)),
        }
    }

    /// What a hit on `step` (found under `key`) leaves in its slot: its output unread, with
    /// what its node would have read — taken from the table as the node would have taken it —
    /// kept to compute it again should its entry be gone when it is read.
    pub(super) fn defer(
        step: &Step,
        key: Key,
        found: Unread,
        input: &Value,
        frame: &mut Frame<'_>,
    ) -> Value {
        Value::opaque(Deferred {
            slot: step.slot(),
            key,
            input: gather(step, input, frame),
            read: found.read,
            value: OnceLock::new(),
            lost: AtomicBool::new(false),
        })
    }

    /// `gathered`, what `step` reads, with each deferred output in it read: what the step's
    /// node is called on. An output whose entry cannot be read any more is computed again by
    /// its node, on this thread, and filed again ([`Rereading`]; the async walk drives the
    /// same reading, awaiting an async node).
    pub(super) fn read_deferred(
        &self,
        keys: &RunKeys,
        step: &Step,
        gathered: Value,
        site: Site<'_>,
    ) -> Result<Value, RunError> {
        let mut rereading = match Rereading::of(step, gathered) {
            Ok(gathered) => return Ok(gathered),
            Err(rereading) => rereading,
        };
        while let Some(again) = rereading.next() {
            let step = again.step(site.program);
            let started = Instant::now();
            let calling = keys.calling();
            let value = NodeCall::new(self, step, site).call(&again.input)?;
            drop(calling);
            rereading.computed(again.file(keys, site.program, value, started.elapsed()));
        }
        Ok(rereading.read())
    }
}

/// The deferred outputs in what a step gathered, being read: each one read, or — its entry gone
/// — computed again by its node, what that node read first, from a stack (a chain of lost
/// entries costs no stack). The order is this, once; the walk that reads drives it and makes
/// each call asked for ([`Rereading::next`]): the sync walk on the thread that reads
/// ([`Executor::read_deferred`]), the async walk awaiting an async node (`run/aio`).
pub(crate) struct Rereading {
    gathered: Value,
    /// The deferred outputs still to read, the one read or computed next on top.
    stack: Vec<Value>,
}

/// An output [`Rereading::next`] asks the walk to compute again: its node's slot, the key it
/// was found under, and what its node reads, every deferred output in it read.
pub(crate) struct Again {
    slot: usize,
    key: Key,
    pub(crate) input: Value,
}

impl Again {
    /// The step of `program` whose node computes it.
    pub(crate) fn step<'p>(&self, program: &'p Program) -> &'p Step {
        step_at(&program.root, self.slot)
            .expect("a deferred output's step is in the program it was found in")
    }

    /// Files `value`, computed again in `took`, under the key it was found under.
    pub(crate) fn file(
        &self,
        keys: &RunKeys,
        program: &Program,
        value: Value,
        took: std::time::Duration,
    ) -> Value {
        let entry = Entry {
            digest: keys.cache.digest(&value),
            value,
        };
        keys.cache
            .put(&program.ids[self.slot], &self.key, &entry, took);
        entry.value
    }
}

impl Rereading {
    /// What `step` gathered, `gathered`: `Ok` as it is when nothing in it was deferred, else
    /// its reading.
    pub(crate) fn of(step: &Step, gathered: Value) -> Result<Value, Rereading> {
        if matches!(step.from, Reads::Input) {
            return Ok(gathered); // The run's input: never deferred.
        }
        let stack: Vec<Value> = parts(&gathered)
            .into_iter()
            .filter(|value| deferred(value).is_some())
            .cloned()
            .collect();
        if stack.is_empty() {
            return Ok(gathered);
        }
        Err(Rereading { gathered, stack })
    }

    /// Reads on until an output must be computed again, and says which: [`Rereading::computed`]
    /// takes it. `None` once every deferred output gathered is read.
    pub(crate) fn next(&mut self) -> Option<Again> {
        while let Some(top) = self.stack.last() {
            let output = deferred(top).expect("only deferred outputs are stacked");
            if output.read().is_some() {
                self.stack.pop();
                continue;
            }
            // Gone: what its node read comes first.
            let waiting = parts(&output.input)
                .into_iter()
                .find(|value| deferred(value).is_some_and(|input| input.value.get().is_none()));
            if let Some(waiting) = waiting {
                let waiting = waiting.clone();
                self.stack.push(waiting);
                continue;
            }
            return Some(Again {
                slot: output.slot,
                key: output.key,
                input: substituted(&output.input),
            });
        }
        None
    }

    /// The output [`Rereading::next`] asked for, computed again: `value`.
    pub(crate) fn computed(&mut self, value: Value) {
        let top = self.stack.pop().expect("asked for by `next`");
        let output = deferred(&top).expect("only deferred outputs are stacked");
        let _ = output.value.set(value);
    }

    /// What was gathered, each deferred output in it read.
    pub(crate) fn read(self) -> Value {
        substituted(&self.gathered)
    }
}

/// The step of `root` that writes `slot`, found from a stack: asked only for an entry lost
/// between its hit and its read.
fn step_at(root: &Op, slot: usize) -> Option<&Step> {
    let mut pending = vec![root];
    while let Some(op) = pending.pop() {
        match op {
            Op::Execute(step) if step.slot() == slot => return Some(step),
            Op::Execute(_) | Op::Empty | Op::Map(_) | Op::Switch(_) | Op::Loop(_) => {}
            Op::Sequence { steps, .. } => pending.extend(steps.iter()),
            Op::Wave { branches, .. } => pending.extend(branches.iter()),
        }
    }
    None
}
