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
use std::sync::{Mutex, PoisonError};

use super::fan_out::FanOut;
use super::lane::Lane;
use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::value::Value;
use crate::run::branch::Halt;
use crate::run::decision;
use crate::run::detach::Kept;
use crate::run::executor::Executor;
use crate::run::keys::{Digested, ItemDigests};
use crate::run::observer::Part;
use crate::run::program::{LoopOp, MapOp, Program, Step, SwitchOp};
use crate::run::settle::{settle, Outcome};
use crate::run::table::Frame;

/// What a `Map` lends its items: the items, the next one no lane has taken (when lanes take
/// items one after another), and each item's outcome, written by the thread that ran it.
struct MapItems {
    items: Vec<Value>,
    next: AtomicUsize,
    outcomes: Box<[Mutex<Option<Outcome<Value>>>]>,
}

impl Executor {
    /// Runs `work` as `step`'s work, marked running meanwhile for a run its caller may leave,
    /// and writes what it returns as the step's value ([`decision::write`]: filed under the key
    /// it missed whole under, if it has one). The nodes it runs are looked up each on what it
    /// reads ([`Executor::run_body`]), and its output's digest is what readers key on.
    fn run_decision(
        step: &Step,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
        work: impl FnOnce() -> Result<(Value, Option<Key>), Halt>,
    ) -> Result<(), Halt> {
        let site = lane.site();
        site.mark_running(step, true);
        let value = work();
        site.mark_running(step, false);
        decision::write(
            step,
            &lane.program.ids[step.slot()],
            value?,
            frame,
            lane.keys,
        );
        Ok(())
    }

    /// Runs `body` on `input` with a table of its own, along `lane` (its place in the waves
    /// and items around it), and returns what a run of it returns, with its digest when the
    /// run took it already ([`RunKeys::result_digest`]).
    ///
    /// With a cache, its nodes are keyed and looked up as a run's are, with identities of
    /// their own, its roots keyed on `input`'s digest — `digested`, when it was taken already
    /// (an item's, with its list's: [`RunKeys::items_of`]): an item, a case's input or an
    /// iteration's seen before finds what its nodes computed then, and a run that failed at
    /// one item kept what the others' nodes completed.
    ///
    /// The table, the input and the identities are kept on the heap: when the run's caller
    /// gives up waiting for a wave inside (Ctrl-C, on the caller's thread), its branches still
    /// running borrow them, and they are left to the run's remains with the rest.
    fn run_body(
        &self,
        body: &Program,
        input: &Value,
        digested: Option<Key>,
        lane: Lane<'_>,
    ) -> Result<(Value, Option<Digested>), Halt> {
        let keys = lane.keys.map(|outer| outer.within(body, digested));
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
                let (input, table, keys) = kept.get_mut();
                let digest = keys.as_ref().and_then(|keys| keys.result_digest(body));
                Ok((Executor::result(body, table, || input.clone()), digest))
            }
            Err(halt) => {
                if let Some(remains) = halt.remains_if_given_up(lane.walk.detached) {
                    kept.leave(&remains);
                }
                Err(halt)
            }
        }
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
        if self.decision_found(&op.step, &[("body", &op.body)], input, frame, lane.site()) {
            return Ok(());
        }
        let read = self.decision_input(&op.step, input, frame, lane.site())?;
        let id = &lane.program.ids[op.step.slot()];
        Self::run_decision(&op.step, frame, lane, || {
            let items = self.items_of(id, &read)?;
            drop(read);
            let results = self.each_item(op, id, items, lane)?;
            Ok((self.reading().collect(results), None))
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
        // Each item's digest, taken with the list's when nothing ran since.
        let digests = ItemDigests::new(lane.keys, &op.step, count, one_each);
        let locals = MapItems {
            items,
            next: AtomicUsize::new(0),
            outcomes: (0..count).map(|_| Mutex::new(None)).collect(),
        };
        let item = |fan: &FanOut<'_, MapItems>, index: usize| {
            let outcome = fan.branch(index, |lane| {
                self.part(id, Part::Item(index), &lane, || {
                    self.run_body(&op.body, &fan.locals.items[index], digests.of(index), lane)
                        .map(|(value, _)| value)
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
        if self.decision_found(&op.step, &cases, input, frame, lane.site()) {
            return Ok(());
        }
        let read = self.decision_input(&op.step, input, frame, lane.site())?;
        let id = &lane.program.ids[op.step.slot()];
        Self::run_decision(&op.step, frame, lane, || {
            let chosen =
                self.decision_call(&op.step, &read, lane.site(), |keys, id, fingerprint| {
                    keys.key_of(id, fingerprint, &op.step, input)
                })?;
            let (at, key) = self.case_of(op, id, &chosen)?;
            // The case's input is the step's: its digest, when nothing ran since it was taken
            // (the selector hit); its result is the step's output: its digest, when the case
            // took it.
            let given = lane.keys.and_then(|keys| keys.read_digest(&op.step));
            let mut digest = None;
            let value = self.part(id, Part::Case(&key), &lane, || {
                let (value, digested) = self.run_body(&op.cases[at], &read, given, lane)?;
                digest = digested;
                Ok(value)
            })?;
            Ok((value, lane.keys.and_then(|keys| keys.still(digest))))
        })
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
        let read = self.decision_input(&op.step, input, frame, lane.site())?;
        let id = &lane.program.ids[op.step.slot()];
        let still = |digest| lane.keys.and_then(|keys| keys.still(digest));
        Self::run_decision(&op.step, frame, lane, || {
            let mut current = read;
            // Each iteration's input's digest, when taken already and nothing ran since: the
            // step's input's, then the last iteration's output's.
            let mut given = lane.keys.and_then(|keys| keys.read_digest(&op.step));
            for iteration in 0..op.max_iterations {
                // The iteration's output, with its digest when the body took it: what the
                // predicate is keyed on, not digested again.
                let mut digest = None;
                let output = self.part(id, Part::Iteration(iteration), &lane, || {
                    let (value, digested) = self.run_body(&op.body, &current, given, lane)?;
                    digest = digested;
                    Ok(value)
                })?;
                let verdict =
                    self.decision_call(&op.step, &output, lane.site(), |keys, id, fingerprint| {
                        keys.key_on(id, fingerprint, &op.step, (&output, keys.still(digest)))
                    })?;
                if self.reading().done(&verdict) {
                    return Ok((output, still(digest)));
                }
                given = still(digest);
                current = output;
            }
            Err(self.loop_limit(op, id, &current).into())
        })
    }
}
