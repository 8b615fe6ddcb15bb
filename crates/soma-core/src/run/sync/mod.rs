//! The sync walk: a program walked on threads, a branch at a time on the thread that took it,
//! the branches of each wave lent to the program's crew. The walk that runs every program
//! without an async node whole (`Executor::run`, `run_program`, `run_detachable`, a stream's
//! stages), and every piece of sync work an async run lends a thread (`run/aio`).
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

mod decide;
mod fan_out;
mod lane;
mod wave;

use std::ops::Range;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use self::lane::{Lane, Walk};
use crate::model::catalog::Catalog;
use crate::model::value::Value;
use crate::plan::Plan;
use crate::run::board::Board;
use crate::run::branch::{Branch, Halt};
use crate::run::call::NodeCall;
use crate::run::crew::Crew;
use crate::run::detach::{Detached, Kept, Remains};
use crate::run::error::RunError;
use crate::run::executor::{prefetch_line, Executor};
use crate::run::hooks::Watch;
use crate::run::keys::RunKeys;
use crate::run::observer::Ended;
use crate::run::program::{Op, Program, Step};
use crate::run::table::Frame;

/// What a detachable run keeps on the heap for its branches, besides its table.
struct RunParts {
    executor: Executor,
    program: Arc<Program>,
    input: Value,
    detached: Detached,
    keys: Option<RunKeys>,
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
pub(crate) fn prefetch_ahead(next: Option<&Op>, after: Option<&Op>) {
    if let Some(step) = after.and_then(first_step) {
        prefetch_line(Arc::as_ptr(&step.node).cast::<u8>());
    }
    if let Some(step) = next.and_then(first_step) {
        step.node.prefetch();
    }
}

/// Where a walk begins that the sync walk makes for a caller outside it — a stream's stage on
/// one item, a piece of sync work an async run lends a thread: the crew its waves borrow, the
/// thread of the run's caller, the run's bookkeeping, the branch of the task that awaits it,
/// the program walked with its keys, and whether it prefetches each next node.
pub(in crate::run) struct Start<'s> {
    pub(in crate::run) crew: &'s Crew,
    pub(in crate::run) caller: thread::ThreadId,
    pub(in crate::run) detached: Option<&'s Detached>,
    pub(in crate::run) awaited_by: Option<&'s Branch>,
    pub(in crate::run) program: &'s Program,
    pub(in crate::run) keys: Option<&'s RunKeys>,
    pub(in crate::run) prefetching: bool,
    /// The run's board, when it keeps one (a streamed item's own, or the executor's).
    pub(in crate::run) board: Option<&'s Board>,
}

impl Executor {
    /// Walks steps `range` of the sequence `steps` from `start`, dropping after each what
    /// `drop_after` says (nothing for a single op, `&[]`): the sync walk's one entry for
    /// the walks made from outside it.
    pub(in crate::run) fn walk_from(
        &self,
        start: &Start<'_>,
        steps: &[Op],
        drop_after: &[Box<[usize]>],
        range: Range<usize>,
        input: &Value,
        frame: &mut Frame<'_>,
    ) -> Result<(), Halt> {
        let walk = Walk::new(
            start.crew,
            start.caller,
            start.detached,
            start.awaited_by,
            start.board,
        );
        let lane = Lane::new(&walk, start.program, start.keys, start.prefetching);
        self.walk_steps(steps, drop_after, range, input, frame, lane)
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
            executor.run_board().map(|board| &**board),
        ));
        let lane = Lane::new(walk.get(), program, keys.as_ref(), program.prefetching());
        let opened = executor.begin_run(program, None, executor.run_board(), None);
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
        let board = self.run_board().map(|board| &**board);
        let walk = Walk::new(crew, thread::current().id(), None, None, board);
        let lane = Lane::new(&walk, program, keys.as_ref(), program.prefetching());
        let opened = self.begin_run(program, None, self.run_board(), None);
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

    fn walk(
        &self,
        op: &Op,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        match op {
            Op::Empty => Ok(()),
            Op::Execute(step) => self.step(step, input, frame, &lane),
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
    fn walk_steps(
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
            // A node's call is made in the loop itself: most of what a sequence holds, and one
            // call and match of `walk` fewer for each.
            match &steps[at] {
                Op::Execute(step) => self.step(step, input, frame, &lane)?,
                op => self.walk(op, input, frame, lane)?,
            }
            if let Some(done) = drop_after.get(at) {
                for &slot in done {
                    *frame.cell(slot) = None;
                }
            }
        }
        Ok(())
    }

    // Inlined into the sequence's loop (above) and `walk`'s arm.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    fn step(
        &self,
        step: &Step,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: &Lane<'_>,
    ) -> Result<(), Halt> {
        if lane.cancelled() {
            return Err(Halt::Cancelled);
        }
        if self.watch.as_deref().is_some_and(Watch::interrupted) {
            return Err(Halt::Failed(RunError::Interrupted));
        }
        let site = lane.site();
        site.mark_running(step, true);
        let value = NodeCall::new(self, step, site).make(input, frame);
        site.mark_running(step, false);
        *frame.cell(step.slot()) = Some(value?);
        Ok(())
    }
}
