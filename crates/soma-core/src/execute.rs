//! `Executor`: walks a [`Plan`], running the branches of each wave on their own threads.
//!
//! A wave launches every branch at once — the first on the calling thread, the others on
//! scoped threads (`std::thread::scope`, so the catalog, the driver and what was produced so
//! far are lent as plain references) — and each branch runs start to finish on that one thread.
//! A branch reads what its ancestors produced through a shared borrow and writes only into a
//! map of its own, which it returns; the parent merges the maps when it joins. Values clone by
//! `Arc`, so that copy is cheap, and no lock ever guards a produced value.
//!
//! Errors are deterministic: a wave reports the error of the first *declared* failing branch,
//! whichever failed first on the clock. Branches declared after a failing one stop at their
//! next node boundary (their error could not be reported anyway); branches declared before it
//! run on, because theirs would take precedence. A panic in a branch is re-raised once every
//! branch has been joined — ahead of any branch's error, even an earlier-declared one: a panic
//! is a bug, and reporting an ordinary error in its place would swallow it.

use std::collections::HashMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::Duration;

use crate::catalog::Catalog;
use crate::driver::{Driver, DriverError};
use crate::id::NodeId;
use crate::node::{Ctx, NodeError, Transition};
use crate::plan::Plan;
use crate::value::Value;

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
            | RunError::MissingInput { node, .. } => Some(node),
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
                "the driver failed serving node `{node}`: {error}"
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
            RunError::Interrupted => f.write_str("the run was interrupted"),
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
            | RunError::Interrupted => None,
        }
    }
}

/// Asked, at every node boundary and periodically while a thread waits on a wave, whether the
/// run should stop — how a host turns Ctrl-C or a deadline into [`RunError::Interrupted`].
pub trait Watch: Send + Sync {
    /// Whether to stop. Once it has said yes it should keep saying yes.
    fn interrupted(&self) -> bool;
}

/// Runs plans against a catalog, with an optional driver and watch.
#[derive(Clone, Copy)]
pub struct Executor<'a> {
    catalog: &'a Catalog,
    driver: Option<&'a dyn Driver>,
    watch: Option<&'a dyn Watch>,
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

/// Values produced so far: this branch's own, then its ancestors' through shared borrows.
struct Produced<'p> {
    local: HashMap<NodeId, Value>,
    parent: Option<&'p Produced<'p>>,
}

impl Produced<'_> {
    fn get(&self, id: &NodeId) -> Option<&Value> {
        let mut at = Some(self);
        while let Some(produced) = at {
            if let Some(value) = produced.local.get(id) {
                return Some(value);
            }
            at = produced.parent;
        }
        None
    }
}

/// The state one wave shares with its branches.
struct WaveState {
    /// The smallest declared index of a branch that failed, `usize::MAX` while none has.
    first_failed: AtomicUsize,
}

/// Where a branch stands: its index in its wave, and the lane of the branch around that wave.
#[derive(Clone, Copy)]
struct Lane<'s> {
    wave: Option<(&'s WaveState, usize)>,
    parent: Option<&'s Lane<'s>>,
}

impl Lane<'_> {
    const ROOT: Lane<'static> = Lane {
        wave: None,
        parent: None,
    };

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

/// Counts the branches still running, so a waiting thread can wake to consult the watch.
struct Latch {
    running: Mutex<usize>,
    finished: Condvar,
}

/// Marks one branch finished when dropped — also when the branch unwinds from a panic.
struct LatchGuard<'l>(&'l Latch);

impl Drop for LatchGuard<'_> {
    fn drop(&mut self) {
        let mut running = self
            .0
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *running -= 1;
        self.0.finished.notify_all();
    }
}

type BranchOutcome = thread::Result<Result<HashMap<NodeId, Value>, Halt>>;

impl<'a> Executor<'a> {
    /// An executor over `catalog`, without driver or watch, with the default turn limit.
    pub fn new(catalog: &'a Catalog) -> Self {
        Executor {
            catalog,
            driver: None,
            watch: None,
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
    /// returns `input`.
    ///
    /// # Errors
    /// The first error in plan order; within a wave, the first declared failing branch's.
    ///
    /// # Panics
    /// Re-raises a node's panic, after every branch of the wave it happened in was joined.
    pub fn run(&self, plan: &Plan, input: Value) -> Result<Value, RunError> {
        let mut produced = Produced {
            local: HashMap::new(),
            parent: None,
        };
        match self.walk(plan, &input, &mut produced, Lane::ROOT) {
            Ok(()) => {}
            Err(Halt::Failed(error)) => return Err(error),
            Err(Halt::Cancelled) => {
                unreachable!(
                    "only a sibling's failure cancels a branch, and it is reported instead"
                )
            }
        }
        let leaves = plan.leaves();
        let mut take = |id: &NodeId| {
            produced
                .local
                .remove(id)
                .ok_or_else(|| RunError::MissingInput {
                    node: id.clone(),
                    from: id.clone(),
                })
        };
        match leaves.as_slice() {
            [] => Ok(input),
            [one] => take(one),
            many => {
                let pairs = many
                    .iter()
                    .map(|id| take(id).map(|value| (id.shared(), value)))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Value::Map(pairs.into()))
            }
        }
    }

    fn walk(
        &self,
        plan: &Plan,
        input: &Value,
        produced: &mut Produced<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        match plan {
            Plan::Empty => Ok(()),
            Plan::Execute { node, from } => {
                if lane.cancelled() {
                    return Err(Halt::Cancelled);
                }
                if self.watch.is_some_and(Watch::interrupted) {
                    return Err(Halt::Failed(RunError::Interrupted));
                }
                let value = self.execute(node, &gather(node, from, input, produced)?)?;
                produced.local.insert(node.clone(), value);
                Ok(())
            }
            Plan::Sequence(steps) => {
                for step in steps {
                    self.walk(step, input, produced, lane)?;
                }
                Ok(())
            }
            Plan::Wave(branches) => self.wave(branches, input, produced, lane),
        }
    }

    fn wave(
        &self,
        branches: &[Plan],
        input: &Value,
        produced: &mut Produced<'_>,
        lane: Lane<'_>,
    ) -> Result<(), Halt> {
        let Some((first, rest)) = branches.split_first() else {
            return Ok(());
        };
        if rest.is_empty() {
            return self.walk(first, input, produced, lane);
        }
        let state = WaveState {
            first_failed: AtomicUsize::new(usize::MAX),
        };
        let latch = Latch {
            running: Mutex::new(rest.len()),
            finished: Condvar::new(),
        };
        let parent: &Produced<'_> = produced;
        let outcomes: Vec<BranchOutcome> = thread::scope(|scope| {
            let handles: Vec<_> = rest
                .iter()
                .enumerate()
                .map(|(i, branch)| {
                    let (state, latch, lane) = (&state, &latch, &lane);
                    thread::Builder::new()
                        .name(format!("soma-branch-{}", i + 1))
                        .spawn_scoped(scope, move || {
                            let _finished = LatchGuard(latch);
                            self.branch(branch, i + 1, input, parent, state, lane)
                        })
                        .expect("the operating system refused a thread for a wave branch")
                })
                .collect();
            let mut outcomes = Vec::with_capacity(branches.len());
            outcomes.push(panic::catch_unwind(AssertUnwindSafe(|| {
                self.branch(first, 0, input, parent, &state, &lane)
            })));
            self.wait(&latch);
            outcomes.extend(handles.into_iter().map(thread::ScopedJoinHandle::join));
            outcomes
        });
        merge(outcomes, produced)
    }

    /// Runs one branch of a wave; on failure, tells the later-declared siblings to stop.
    fn branch(
        &self,
        branch: &Plan,
        index: usize,
        input: &Value,
        parent: &Produced<'_>,
        state: &WaveState,
        outer: &Lane<'_>,
    ) -> Result<HashMap<NodeId, Value>, Halt> {
        let lane = Lane {
            wave: Some((state, index)),
            parent: Some(outer),
        };
        let mut own = Produced {
            local: HashMap::new(),
            parent: Some(parent),
        };
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            self.walk(branch, input, &mut own, lane)
        }));
        if !matches!(result, Ok(Ok(()) | Err(Halt::Cancelled))) {
            state.first_failed.fetch_min(index, Ordering::AcqRel);
        }
        match result {
            Ok(outcome) => outcome.map(|()| own.local),
            Err(payload) => panic::resume_unwind(payload),
        }
    }

    /// Blocks until the spawned branches finish, consulting the watch while it waits so that an
    /// interruption seen only by this thread (a signal, on a host's main thread) reaches them.
    fn wait(&self, latch: &Latch) {
        let Some(watch) = self.watch else {
            return; // Joining the handles waits; nobody needs to be woken.
        };
        let mut running = latch
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *running > 0 {
            running = latch
                .finished
                .wait_timeout(running, WATCH_INTERVAL)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            if *running > 0 {
                drop(running);
                watch.interrupted();
                running = latch
                    .running
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
    }

    /// Calls one node turn after turn until it is done.
    fn execute(&self, node: &NodeId, input: &Value) -> Result<Value, RunError> {
        let implementation = self
            .catalog
            .get(node.as_str())
            .ok_or_else(|| RunError::NotInCatalog { node: node.clone() })?;
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
                .ok_or_else(|| RunError::NoDriver { node: node.clone() })?;
            results = driver
                .perform(&requests)
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

/// The input of a step: the graph's input for a root, the one predecessor's value, or a map
/// keyed by source id in edge-declaration order.
fn gather(
    node: &NodeId,
    from: &[NodeId],
    input: &Value,
    produced: &Produced<'_>,
) -> Result<Value, RunError> {
    let read = |source: &NodeId| {
        produced
            .get(source)
            .cloned()
            .ok_or_else(|| RunError::MissingInput {
                node: node.clone(),
                from: source.clone(),
            })
    };
    match from {
        [] => Ok(input.clone()),
        [one] => read(one),
        many => {
            let pairs = many
                .iter()
                .map(|source| read(source).map(|value| (source.shared(), value)))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Value::Map(pairs.into()))
        }
    }
}

/// Joins a wave's outcomes, in declaration order: the first panic is re-raised, else the first
/// failure is returned, else every branch's values join the parent's.
fn merge(outcomes: Vec<BranchOutcome>, produced: &mut Produced<'_>) -> Result<(), Halt> {
    let mut outcomes: Vec<Result<HashMap<NodeId, Value>, Halt>> = outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or_else(|payload| panic::resume_unwind(payload)))
        .collect();
    if let Some(at) = outcomes
        .iter()
        .position(|outcome| matches!(outcome, Err(Halt::Failed(_))))
    {
        return Err(outcomes.swap_remove(at).err().unwrap_or(Halt::Cancelled));
    }
    for outcome in outcomes {
        produced.local.extend(outcome?);
    }
    Ok(())
}
