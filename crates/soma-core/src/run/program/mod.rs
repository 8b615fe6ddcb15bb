//! `Program`: a [`Plan`] resolved once for running it many times.
//!
//! A plan names nodes; running one by name would hash an id for every value written and read.
//! A program numbers the `Execute` steps in plan order — slots — and resolves each step's
//! implementation and inputs to slots up front, so a run is array indexing. Numbering in plan
//! order gives every branch of a wave a contiguous range of slots, which lets the executor hand
//! each branch its own disjoint part of one table: a branch writes only its own cells, and
//! nothing has to be merged or locked when the wave joins.
//!
//! A program also knows when each value can be dropped (its liveness): right after its last reader, so a
//! long chain holds one intermediate value at a time, not all of them. The last reader *takes*
//! the value when it runs in the same branch as its producer; a value read inside a later wave
//! is dropped by the producer's branch once that wave has joined.
//!
//! A program also keeps the [`Crew`] its waves' branches are lent threads from: started with no
//! thread, grown to what its waves have in flight at once, its idle threads capped (see
//! [`crate::run::crew`]).
//!
//! Resolving takes two passes over the plan ([`numbering`], then [`build`]) with the liveness
//! found between them ([`drops`]); the ops a program runs are in [`ops`].

mod build;
mod drops;
mod numbering;
mod ops;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::model::catalog::Catalog;
use crate::model::device::{Device, Placement};
use crate::model::id::NodeId;
use crate::plan::Plan;
use crate::run::crew::{Crew, DEFAULT_IDLE_THREADS};
use crate::run::error::ProgramError;
use crate::run::hooks::Host;
use crate::run::policy::Policies;
use crate::run::policy::Policy;
use numbering::Numbering;
pub(crate) use ops::{LoopOp, MapOp, Op, Read, Reads, Step, SwitchOp};

/// A plan with its implementations and inputs resolved to slots. Build it once with
/// [`Program::new`]; run it any number of times, from any number of threads, with
/// [`crate::Executor::run_program`].
///
/// The branches of its waves run on threads the program lends them: about as many as it has
/// branches in flight at once, never one per branch of the graph; idle ones are kept up to a
/// limit ([`Program::set_idle_threads`]) and end when the program is dropped, which never
/// waits for them.
pub struct Program {
    pub(crate) root: Op,
    pub(crate) ids: Box<[NodeId]>,
    /// Each step's policy, by slot; empty when no node has one.
    pub(crate) policies: Box<[Option<Arc<Policy>>]>,
    pub(crate) leaves: Box<[usize]>,
    /// The devices its steps are placed on, each once, in order: what a host prepares before a
    /// run (the device queues it forks per wave, say) without walking the steps.
    devices: Box<[Device]>,
    pub(crate) crew: Crew,
    /// Whether it has a `Map`, `Switch` or `Loop` step, which reads values through the
    /// executor's [`crate::Reading`].
    decides: bool,
    /// Whether it has a wave of its own (not inside a step that decides).
    waves: bool,
    /// Whether a run has begun: its memory, and its nodes', may be in the caches since.
    ran: AtomicBool,
}

/// How many steps a program has before every run of it prefetches: below, its memory and its
/// nodes' fit in the caches once a run has been through them, where prefetching costs a few
/// nanoseconds a node and saves nothing (the 1,000-node Python chain: 78 µs a run without, 83
/// with). A nested graph of 10,000 Python nodes gains from it already.
const PREFETCH_FROM_STEPS: usize = 4096;

impl Program {
    /// Resolves `plan` against `catalog`.
    ///
    /// # Errors
    /// [`ProgramError::NotInCatalog`] for a step without implementation;
    /// [`ProgramError::MissingInput`] for a step that reads a node no step it can see runs
    /// before it; [`ProgramError::StepTwice`] for a node run twice (plans made by
    /// [`crate::compile()`] have none of these). A program that resolved never meets a missing
    /// value when it runs.
    ///
    /// # Complexity
    /// O(steps + reads · d), where d is how far apart in the plan's nesting a value's producer and
    /// readers are (1 or 2 for plans the compiler makes); no recursion, however deep the plan.
    pub fn new(plan: &Plan, catalog: &Catalog) -> Result<Program, ProgramError> {
        Program::placed(plan, catalog, None, None, 0)
    }

    /// Resolves `plan` against `catalog`, each step's node placed where `placement` says
    /// ([`crate::Ctx::device`]); nodes it does not name are unplaced, and placed nodes the plan
    /// does not run are ignored. The program runs the same steps in the same order as without.
    ///
    /// # Errors
    /// As [`Program::new`].
    ///
    /// # Complexity
    /// As [`Program::new`], plus one lookup per step.
    pub fn with_placement(
        plan: &Plan,
        catalog: &Catalog,
        placement: &Placement,
    ) -> Result<Program, ProgramError> {
        Program::placed(
            plan,
            catalog,
            Some(placement).filter(|p| !p.is_empty()),
            None,
            0,
        )
    }

    /// Resolves `plan` against `catalog` as [`Program::with_placement`] does, each step's node
    /// also held to the policy `policies` gives it (retries, a time limit; see
    /// [`crate::Policy`]).
    ///
    /// # Errors
    /// As [`Program::new`].
    ///
    /// # Complexity
    /// As [`Program::with_placement`], plus one lookup per step when a node has a policy.
    pub fn resolved(
        plan: &Plan,
        catalog: &Catalog,
        placement: &Placement,
        policies: &Policies,
    ) -> Result<Program, ProgramError> {
        Program::placed(
            plan,
            catalog,
            Some(placement).filter(|p| !p.is_empty()),
            Some(policies).filter(|p| !p.is_empty()),
            0,
        )
    }

    /// `depth`: how many `Map`, `Switch` and `Loop` steps hold this plan, each resolved into a
    /// program of its own here, every few levels on a fresh stack ([`crate::nesting`]).
    fn placed(
        plan: &Plan,
        catalog: &Catalog,
        placement: Option<&Placement>,
        policies: Option<&Policies>,
        depth: usize,
    ) -> Result<Program, ProgramError> {
        let numbered = Numbering::of(plan, catalog)?;
        let liveness = numbered.liveness();
        let root = numbered.build(plan, &liveness, placement, policies, depth)?;
        let mut devices: Vec<Device> = placement
            .map(|placement| {
                numbered
                    .ids
                    .iter()
                    .filter_map(|id| placement.device(id.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        devices.sort_unstable();
        devices.dedup();
        let policies: Box<[Option<Arc<Policy>>]> = match policies {
            Some(policies) => numbered
                .ids
                .iter()
                .map(|id| policies.get(id.as_str()).cloned())
                .collect(),
            None => Box::new([]),
        };
        Ok(Program {
            root,
            policies,
            ids: numbered.ids.into_iter().cloned().collect(),
            leaves: liveness.leaves.into(),
            devices: devices.into(),
            crew: Crew::new(DEFAULT_IDLE_THREADS),
            decides: numbered.decides,
            waves: numbered.waves,
            ran: AtomicBool::new(false),
        })
    }

    /// Whether it has a `Map`, `Switch` or `Loop` step: only such a program needs the
    /// executor's [`crate::Reading`], so an embedder may give one only then.
    pub fn decides(&self) -> bool {
        self.decides
    }

    /// Whether two of its steps may run at once on two threads: it has a wave, or a step that
    /// decides (an `each`'s items run side by side; a case or a body may hold waves).
    pub(crate) fn runs_side_by_side(&self) -> bool {
        self.waves || self.decides
    }

    /// Whether one of its nodes is async ([`crate::Node::is_async`]), at any depth: such a
    /// program runs through [`crate::Executor::start`], on the embedder's event loop; the other
    /// entry points refuse it ([`RunError::NeedsLoop`](crate::RunError::NeedsLoop)).
    pub fn is_async(&self) -> bool {
        self.root.is_async()
    }

    /// The first async node of the program, in plan order, at any depth: what a refusal to run
    /// it without an event loop names.
    pub fn first_async(&self) -> Option<NodeId> {
        let mut pending = vec![(self, &self.root)];
        while let Some((program, op)) = pending.pop() {
            if !op.is_async() {
                continue;
            }
            match op {
                Op::Empty => {}
                Op::Execute(step) => return Some(program.ids[step.slot()].clone()),
                Op::Sequence {
                    steps: children, ..
                }
                | Op::Wave {
                    branches: children, ..
                } => {
                    pending.extend(children.iter().rev().map(|child| (program, child)));
                }
                Op::Map(map) if map.step.is_async() => {
                    return Some(program.ids[map.step.slot()].clone());
                }
                Op::Map(map) => pending.push((&map.body, &map.body.root)),
                Op::Switch(switch) if switch.step.is_async() => {
                    return Some(program.ids[switch.step.slot()].clone());
                }
                Op::Switch(switch) => {
                    pending.extend(switch.cases.iter().rev().map(|case| (case, &case.root)));
                }
                Op::Loop(repeat) if repeat.step.is_async() => {
                    return Some(program.ids[repeat.step.slot()].clone());
                }
                Op::Loop(repeat) => pending.push((&repeat.body, &repeat.body.root)),
            }
        }
        None
    }

    /// The devices its steps are placed on, each once, in order; empty when none is placed.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Whether a run starting now should prefetch each next node ([`crate::Node::prefetch`]):
    /// always for a program too large for the caches, and for any program the first time,
    /// when nothing of it is in the caches yet.
    pub(crate) fn prefetching(&self) -> bool {
        // Read before it is written: a program run from several threads at once shares it.
        self.len() >= PREFETCH_FROM_STEPS
            || (!self.ran.load(Ordering::Relaxed) && !self.ran.swap(true, Ordering::Relaxed))
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the program runs no step.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Lends one thread of the program's crew to `task`, without waiting for it: the task runs
    /// start to finish on the thread that takes it (wrapped by `host`), then gives the thread
    /// back. For a caller that must not block while work runs — an event loop, told by the
    /// task itself when it is done — and so adds no thread pool of its own.
    ///
    /// # Errors
    /// The operating system's refusal of a thread; the task is then dropped without being run.
    pub fn lend(
        &self,
        task: impl FnOnce() + Send + 'static,
        host: Option<&Arc<dyn Host>>,
    ) -> io::Result<()> {
        self.crew.lend(vec![task], host)
    }

    /// Threads the program holds right now, busy or idle.
    pub fn threads(&self) -> usize {
        self.crew.threads()
    }

    /// Makes the next `count` threads this program would start fail as if the operating system
    /// had refused them, so that the path a process out of threads takes can be tested.
    #[doc(hidden)]
    pub fn refuse_next_threads(&self, count: usize) {
        self.crew.refuse_next_threads(count);
    }

    /// Starts threads from now on with a stack of at least `bytes` (8 MiB at the least, as a
    /// main thread usually has).
    pub fn set_thread_stack(&self, bytes: usize) {
        self.crew.set_stack_size(bytes);
    }

    /// Keeps at most `limit` idle threads (64 unless set); idle threads beyond it end.
    pub fn set_idle_threads(&self, limit: usize) {
        self.crew.set_idle_limit(limit);
    }

    /// The nodes whose outputs a run returns, in plan order.
    pub fn leaves(&self) -> impl Iterator<Item = &NodeId> {
        self.leaves.iter().map(|&slot| &self.ids[slot])
    }
}
