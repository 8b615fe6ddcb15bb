//! `Executor`: walks a [`Plan`], running the branches of each wave on their own threads.
//!
//! A wave hands every branch at once to a thread of its own — the program's standing thread
//! for that branch ([`crate::run::crew`]), or a new one — and each branch runs start to finish on
//! that one thread while the caller's thread only waits.
//! Values live in one table of slots ([`Program`] numbers them so that each branch owns a
//! contiguous range): a branch reads what its ancestors produced through a shared borrow of the
//! part of the table that was complete when its wave started, and writes only into its own
//! range, borrowed mutably and disjoint from every sibling's. What a branch produced is
//! therefore already in its parent's table when the wave joins — the merge costs nothing — and
//! no lock ever guards a produced value.
//!
//! Errors are deterministic: a wave reports the error of the first *declared* failing branch,
//! whichever failed first on the clock. Branches declared after a failing one stop at their
//! next node boundary (their error could not be reported anyway); branches declared before it
//! run on, because theirs would take precedence. A panic in a branch is re-raised once every
//! branch has been joined — ahead of any branch's error, even an earlier-declared one: a panic
//! is a bug, and reporting an ordinary error in its place would swallow it.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use crate::model::catalog::Catalog;
use crate::model::driver::{Driver, DriverError};
use crate::model::id::NodeId;
use crate::model::node::{Ctx, NodeError, Transition};
use crate::model::value::Value;
use crate::observe::trace::{thread_number, Span, Trace};
use crate::plan::Plan;
use crate::run::crew::{Crew, Tally};
use crate::run::program::{Op, Program, Read, Step};

/// How many turns a node gets unless [`Executor::with_turn_limit`] says otherwise.
pub const DEFAULT_TURN_LIMIT: u32 = 64;

/// How often a thread waiting on a wave asks the [`Watch`] whether to stop.
const WATCH_INTERVAL: Duration = Duration::from_millis(5);

/// Why a run stopped.
#[derive(Clone, Debug)]
pub enum RunError {
    /// A node reported an error.
    NodeFailed {
        /// The node.
        node: NodeId,
        /// What it reported.
        error: NodeError,
    },
    /// A node awaited, and the executor has no driver.
    NoDriver {
        /// The node.
        node: NodeId,
    },
    /// The driver failed while serving a node's requests.
    DriverFailed {
        /// The node whose requests were being served.
        node: NodeId,
        /// What the driver reported.
        error: DriverError,
    },
    /// The driver answered a different number of results than the node asked for.
    WrongResultCount {
        /// The node.
        node: NodeId,
        /// Requests made.
        asked: usize,
        /// Results returned.
        got: usize,
    },
    /// A node was still awaiting on its last allowed turn.
    TurnLimit {
        /// The node.
        node: NodeId,
        /// The limit in force.
        limit: u32,
    },
    /// The plan names a node the catalog does not implement.
    NotInCatalog {
        /// The node.
        node: NodeId,
    },
    /// A step reads a node that had not produced anything: the plan was not compiled from a
    /// graph, or was edited by hand.
    MissingInput {
        /// The step.
        node: NodeId,
        /// The node it reads.
        from: NodeId,
    },
    /// A plan runs the same node twice: it was not compiled from a graph, or was edited by
    /// hand.
    StepTwice {
        /// The node.
        node: NodeId,
    },
    /// The [`Watch`] asked the run to stop.
    Interrupted,
}

impl RunError {
    /// The node the error is about, if it is about one.
    pub fn node(&self) -> Option<&NodeId> {
        match self {
            RunError::NodeFailed { node, .. }
            | RunError::NoDriver { node }
            | RunError::DriverFailed { node, .. }
            | RunError::WrongResultCount { node, .. }
            | RunError::TurnLimit { node, .. }
            | RunError::NotInCatalog { node }
            | RunError::MissingInput { node, .. }
            | RunError::StepTwice { node } => Some(node),
            RunError::Interrupted => None,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::NodeFailed { node, error } => write!(f, "node `{node}` failed: {error}"),
            RunError::NoDriver { node } => write!(
                f,
                "node `{node}` awaited, but no driver was given\nhint: pass a driver that serves its requests"
            ),
            RunError::DriverFailed { node, error } => write!(
                f,
                "the driver failed serving node `{node}`: {error}\nhint: the driver's own error is the cause; fix the driver, or the requests `{node}` makes"
            ),
            RunError::WrongResultCount { node, asked, got } => write!(
                f,
                "the driver answered {got} result(s) to the {asked} request(s) of node `{node}`\nhint: a driver returns exactly one result per request, in order"
            ),
            RunError::TurnLimit { node, limit } => write!(
                f,
                "node `{node}` was still awaiting after {limit} turns\nhint: make it finish, or raise the turn limit"
            ),
            RunError::NotInCatalog { node } => write!(
                f,
                "node `{node}` has no implementation in the catalog\nhint: run a plan with the catalog it was compiled against"
            ),
            RunError::MissingInput { node, from } => write!(
                f,
                "node `{node}` reads `{from}`, which had produced nothing\nhint: run plans made by `compile`"
            ),
            RunError::StepTwice { node } => write!(
                f,
                "node `{node}` is run twice by the plan\nhint: run plans made by `compile`, where each node is one step"
            ),
            RunError::Interrupted => f.write_str(
                "the run was interrupted\nhint: its watch asked it to stop (Ctrl-C, a deadline); every branch stopped at a node boundary, and the run can be started again"
            ),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::NodeFailed { error, .. } => Some(error),
            RunError::DriverFailed { error, .. } => Some(error),
            RunError::NoDriver { .. }
            | RunError::WrongResultCount { .. }
            | RunError::TurnLimit { .. }
            | RunError::NotInCatalog { .. }
            | RunError::MissingInput { .. }
            | RunError::StepTwice { .. }
            | RunError::Interrupted => None,
        }
    }
}

/// Asked at every node boundary whether the run should stop — how a host turns Ctrl-C or a
/// deadline into [`RunError::Interrupted`].
pub trait Watch: Send + Sync {
    /// Whether to stop. Once it has said yes it should keep saying yes. Called on every node
    /// boundary of every branch, so it should be a flag read.
    fn interrupted(&self) -> bool;

    /// Called every few milliseconds by a thread that waits for a wave's branches: the time to
    /// do what is too slow for every boundary (looking for a host's pending signals, say).
    fn poll(&self) {}
}

/// How a host runtime takes part in a run: an interpreter with a global lock, say, which a
/// branch holds from node to node and gives back whenever the engine blocks.
///
/// The executor calls [`Host::branch`] on a branch's thread around the whole branch, and
/// [`Host::blocking`] around everything that waits: handing a wave's branches to their threads
/// and joining them, and calling the driver. Nothing else blocks inside the engine.
pub trait Host: Send + Sync {
    /// Runs a whole branch, on the thread that will run it.
    fn branch(&self, run: &mut dyn FnMut());
    /// Runs something that blocks.
    fn blocking(&self, run: &mut (dyn FnMut() + Send));
}

/// Runs plans, with an optional driver, watch and host.
#[derive(Clone, Copy)]
pub struct Executor<'a> {
    catalog: &'a Catalog,
    driver: Option<&'a dyn Driver>,
    watch: Option<&'a dyn Watch>,
    host: Option<&'a dyn Host>,
    trace: Option<&'a Trace>,
    turn_limit: u32,
}

/// Why a branch stopped: its own error, or because an earlier-declared sibling failed.
enum Halt {
    Failed(RunError),
    Cancelled,
}

impl From<RunError> for Halt {
    fn from(error: RunError) -> Self {
        Halt::Failed(error)
    }
}

/// The part of the table a branch may only read: what its ancestors had produced when the
/// wave started, one segment per enclosing wave.
struct Shared<'t> {
    base: usize,
    cells: &'t [Option<Value>],
    outer: Option<&'t Shared<'t>>,
}

/// The table as one branch sees it: its own range, mutable, and the shared segments around it.
struct Frame<'t> {
    base: usize,
    own: &'t mut [Option<Value>],
    shared: Option<&'t Shared<'t>>,
}

impl Frame<'_> {
    fn read(&self, slot: usize) -> Option<&Value> {
        if let Some(cell) = slot.checked_sub(self.base).and_then(|at| self.own.get(at)) {
            return cell.as_ref();
        }
        let mut at = self.shared;
        while let Some(segment) = at {
            if let Some(cell) = slot
                .checked_sub(segment.base)
                .and_then(|i| segment.cells.get(i))
            {
                return cell.as_ref();
            }
            at = segment.outer;
        }
        None
    }

    /// The value, taken out of the table when this frame owns its cell.
    fn take(&mut self, slot: usize) -> Option<Value> {
        match slot
            .checked_sub(self.base)
            .and_then(|at| self.own.get_mut(at))
        {
            Some(cell) => cell.take(),
            None => self.read(slot).cloned(),
        }
    }

    fn cell(&mut self, slot: usize) -> &mut Option<Value> {
        &mut self.own[slot - self.base]
    }
}

/// The state one wave shares with its branches.
struct WaveState {
    /// The smallest declared index of a branch that failed, `usize::MAX` while none has.
    first_failed: AtomicUsize,
}

/// Where a branch stands: its index in its wave, the lane of the branch around that wave, and
/// the crew the branches of its own waves run on (the run's, the same at every depth).
#[derive(Clone, Copy)]
struct Lane<'s> {
    wave: Option<(&'s WaveState, usize)>,
    parent: Option<&'s Lane<'s>>,
    crew: &'s Crew,
}

impl<'s> Lane<'s> {
    /// The lane of a whole run, outside every wave.
    fn root(crew: &'s Crew) -> Self {
        Lane {
            wave: None,
            parent: None,
            crew,
        }
    }

    /// The index of this branch in each enclosing wave, outermost first.
    fn path(&self) -> Vec<usize> {
        let mut path = Vec::new();
        let mut at = Some(self);
        while let Some(lane) = at {
            if let Some((_, index)) = lane.wave {
                path.push(index);
            }
            at = lane.parent;
        }
        path.reverse();
        path
    }

    /// Whether a branch declared before this one, at any level of nesting, has failed.
    fn cancelled(&self) -> bool {
        let mut at = Some(self);
        while let Some(lane) = at {
            if let Some((wave, index)) = lane.wave {
                if wave.first_failed.load(Ordering::Acquire) < index {
                    return true;
                }
            }
            at = lane.parent;
        }
        false
    }
}

impl<'a> Executor<'a> {
    /// An executor over `catalog`, without driver, watch or host, with the default turn limit.
    pub fn new(catalog: &'a Catalog) -> Self {
        Executor {
            catalog,
            driver: None,
            watch: None,
            host: None,
            trace: None,
            turn_limit: DEFAULT_TURN_LIMIT,
        }
    }

    /// Serves awaiting nodes with `driver`, shared by every branch at once.
    #[must_use]
    pub fn with_driver(mut self, driver: &'a dyn Driver) -> Self {
        self.driver = Some(driver);
        self
    }

    /// Consults `watch` at node boundaries and while waiting on waves.
    #[must_use]
    pub fn with_watch(mut self, watch: &'a dyn Watch) -> Self {
        self.watch = Some(watch);
        self
    }

    /// Lets `host` wrap each branch thread and each blocking wait.
    #[must_use]
    pub fn with_host(mut self, host: &'a dyn Host) -> Self {
        self.host = Some(host);
        self
    }

    /// Records a [`Span`] in `trace` for every step of every run.
    #[must_use]
    pub fn with_trace(mut self, trace: &'a Trace) -> Self {
        self.trace = Some(trace);
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

    /// Runs `plan` on `input`.
    ///
    /// Every root receives `input`. The result is the output of the plan's one leaf, or a
    /// [`Value::Map`] keyed by leaf id, in step order, when there are several; an empty plan
    /// returns `input`. To run a plan many times, resolve it once with [`Program::new`] and use
    /// [`Executor::run_program`].
    ///
    /// # Errors
    /// The first error in plan order; within a wave, the first declared failing branch's.
    ///
    /// # Panics
    /// Re-raises a node's panic, after every branch of the wave it happened in was joined.
    pub fn run(&self, plan: &Plan, input: Value) -> Result<Value, RunError> {
        // A one-off run: threads kept for later runs would only be ended right after it.
        let program = Program::new(plan, self.catalog)?;
        self.run_on(&program, &Crew::fresh(), input)
    }

    /// Runs a resolved plan on `input`; see [`Executor::run`]. The program carries its own
    /// implementations: this executor's catalog is not consulted.
    ///
    /// # Errors
    /// As [`Executor::run`].
    ///
    /// # Panics
    /// As [`Executor::run`].
    pub fn run_program(&self, program: &Program, input: Value) -> Result<Value, RunError> {
        self.run_on(program, &program.crew, input)
    }

    fn run_on(&self, program: &Program, crew: &Crew, input: Value) -> Result<Value, RunError> {
        let mut table: Vec<Option<Value>> = vec![None; program.len()];
        let mut frame = Frame {
            base: 0,
            own: &mut table,
            shared: None,
        };
        match self.walk(&program.root, &input, &mut frame, Lane::root(crew)) {
            Ok(()) => {}
            Err(Halt::Failed(error)) => return Err(error),
            Err(Halt::Cancelled) => {
                unreachable!(
                    "only a sibling's failure cancels a branch, and it is reported instead"
                )
            }
        }
        let mut take = |slot: usize| {
            table[slot].take().ok_or_else(|| RunError::MissingInput {
                node: program.ids[slot].clone(),
                from: program.ids[slot].clone(),
            })
        };
        match &*program.leaves {
            [] => Ok(input),
            [one] => take(*one),
            many => {
                let pairs = many
                    .iter()
                    .map(|&slot| take(slot).map(|value| (program.ids[slot].shared(), value)))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Value::Map(pairs.into()))
            }
        }
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
            Op::Execute(step) => self.step(step, input, frame, lane),
            Op::Sequence { steps, drop_after } => {
                for (at, step) in steps.iter().enumerate() {
                    self.walk(step, input, frame, lane)?;
                    if let Some(done) = drop_after.get(at) {
                        for &slot in done {
                            *frame.cell(slot) = None;
                        }
                    }
                }
                Ok(())
            }
            Op::Wave {
                branches,
                bounds,
                first,
            } => self.wave(branches, bounds, *first, input, frame, lane),
        }
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
        if self.watch.is_some_and(Watch::interrupted) {
            return Err(Halt::Failed(RunError::Interrupted));
        }
        let fetch = |frame: &mut Frame<'_>, read: &Read| {
            let value = if read.take {
                frame.take(read.slot)
            } else {
                frame.read(read.slot).cloned()
            };
            value.ok_or_else(|| RunError::MissingInput {
                node: step.id.clone(),
                from: read.source.clone(),
            })
        };
        // Each arm drops what it gathered as soon as the node is done with it.
        let value = match &*step.from {
            [] => self.call(step, input, lane)?,
            [one] => {
                let read = fetch(frame, one)?;
                self.call(step, &read, lane)?
            }
            many => {
                let pairs = many
                    .iter()
                    .map(|read| Ok((read.source.shared(), fetch(frame, read)?)))
                    .collect::<Result<Vec<_>, RunError>>()?;
                self.call(step, &Value::Map(pairs.into()), lane)?
            }
        };
        *frame.cell(step.slot) = Some(value);
        Ok(())
    }

    /// Runs a step's node on its input, traced when a trace was asked for.
    fn call(&self, step: &Step, input: &Value, lane: Lane<'_>) -> Result<Value, RunError> {
        match self.trace {
            None => self.execute(step, input, &mut 0),
            Some(trace) => self.traced(trace, step, input, lane),
        }
    }

    // Kept out of line: an untraced run should not carry its code through every step.
    #[cold]
    #[inline(never)]
    fn traced(
        &self,
        trace: &Trace,
        step: &Step,
        input: &Value,
        lane: Lane<'_>,
    ) -> Result<Value, RunError> {
        let start = trace.now();
        let mut turns = 0;
        let outcome = self.execute(step, input, &mut turns);
        trace.record(Span {
            node: step.id.clone(),
            start,
            end: trace.now(),
            thread: thread_number(),
            branch: lane.path(),
            turns,
            error: outcome.as_ref().err().map(ToString::to_string),
        });
        outcome
    }

    fn wave(
        &self,
        branches: &[Op],
        bounds: &[usize],
        first: usize,
        input: &Value,
        frame: &mut Frame<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        if let [only] = branches {
            return self.walk(only, input, frame, lane);
        }
        // Split the table: everything before the wave becomes read-only for its branches, and
        // the wave's range is cut into one disjoint mutable part per branch.
        let (lo, hi) = (bounds[0], bounds[bounds.len() - 1]);
        let (before, after) = frame.own.split_at_mut(lo - frame.base);
        let shared = Shared {
            base: frame.base,
            cells: before,
            outer: frame.shared,
        };
        let mut remaining = &mut after[..hi - lo];
        let state = WaveState {
            first_failed: AtomicUsize::new(usize::MAX),
        };
        let (state, lane) = (&state, &lane);
        let mut tasks = Vec::with_capacity(branches.len());
        for (i, (branch, window)) in branches.iter().zip(bounds.windows(2)).enumerate() {
            let (own, tail) = std::mem::take(&mut remaining).split_at_mut(window[1] - window[0]);
            remaining = tail;
            let mut own = Frame {
                base: window[0],
                own,
                shared: Some(&shared),
            };
            tasks.push(move || {
                let mut outcome = None;
                let mut run = || {
                    outcome = Some(self.branch(branch, i, input, &mut own, state, lane));
                };
                match self.host {
                    Some(host) => host.branch(&mut run),
                    None => run(),
                }
                outcome.expect("the host ran the branch")
            });
        }
        // The caller gives up the host's lock before handing the branches over, not after: a
        // wide wave's branches can start while the rest are still being woken.
        let mut tasks = Some(tasks);
        let mut outcomes = Vec::new();
        self.blocking(&mut || {
            if let Some(tasks) = tasks.take() {
                outcomes = lane.crew.run(first, tasks, |tally| self.wait(tally));
            }
        });
        settle(outcomes)
    }

    /// Runs one branch of a wave; on failure, tells the later-declared siblings to stop.
    fn branch(
        &self,
        branch: &Op,
        index: usize,
        input: &Value,
        frame: &mut Frame<'_>,
        state: &WaveState,
        outer: &Lane<'_>,
    ) -> Result<(), Halt> {
        let lane = Lane {
            wave: Some((state, index)),
            parent: Some(outer),
            crew: outer.crew,
        };
        let result =
            panic::catch_unwind(AssertUnwindSafe(|| self.walk(branch, input, frame, lane)));
        if !matches!(result, Ok(Ok(()) | Err(Halt::Cancelled))) {
            state.first_failed.fetch_min(index, Ordering::AcqRel);
        }
        result.unwrap_or_else(|payload| panic::resume_unwind(payload))
    }

    /// Runs `work`, which blocks, through the host if there is one.
    fn blocking(&self, work: &mut (dyn FnMut() + Send)) {
        match self.host {
            Some(host) => host.blocking(work),
            None => work(),
        }
    }

    /// Blocks until the branches finish, polling the watch while it waits so that an interruption
    /// only this thread can see (a signal, on a host's main thread) reaches them.
    fn wait<T>(&self, tally: &Tally<T>) {
        match self.watch {
            None => tally.wait_all(),
            Some(watch) => tally.wait_polling(WATCH_INTERVAL, &|| watch.poll()),
        }
    }

    /// Calls one node turn after turn until it is done; `turns` counts the calls.
    fn execute(&self, step: &Step, input: &Value, turns: &mut u32) -> Result<Value, RunError> {
        let node = &step.id;
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
            let ctx = Ctx::new(node, turn, &results);
            *turns = turn + 1;
            let transition =
                step.node
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

/// A wave's outcomes, in declaration order: the first panic is re-raised, else the first
/// failure is returned, else the wave succeeded.
fn settle(outcomes: Vec<thread::Result<Result<(), Halt>>>) -> Result<(), Halt> {
    let mut outcomes: Vec<Result<(), Halt>> = outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or_else(|payload| panic::resume_unwind(payload)))
        .collect();
    if let Some(at) = outcomes
        .iter()
        .position(|outcome| matches!(outcome, Err(Halt::Failed(_))))
    {
        return outcomes.swap_remove(at);
    }
    outcomes.into_iter().collect()
}
