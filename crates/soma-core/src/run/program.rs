//! `Program`: a [`Plan`] resolved once for running it many times.
//!
//! A plan names nodes; running one by name would hash an id for every value written and read.
//! A program numbers the `Execute` steps in plan order — slots — and resolves each step's
//! implementation and inputs to slots up front, so a run is array indexing. Numbering in plan
//! order gives every branch of a wave a contiguous range of slots, which lets the executor hand
//! each branch its own disjoint part of one table: a branch writes only its own cells, and
//! nothing has to be merged or locked when the wave joins.
//!
//! A program also decides when each value can be dropped: right after its last reader, so a
//! long chain holds one intermediate value at a time, not all of them. The last reader *takes*
//! the value when it runs in the same branch as its producer; a value read inside a later wave
//! is dropped by the producer's branch once that wave has joined.
//!
//! A program also keeps the [`Crew`] its waves' branches are lent threads from: started with no
//! thread, grown to what its waves have in flight at once, its idle threads capped (see
//! [`crate::run::crew`]).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::model::catalog::Catalog;
use crate::model::device::{Device, Placement};
use crate::model::id::{IdHasher, NodeId};
use crate::model::node::Node;
use crate::nesting::nested;
use crate::plan::{Plan, Visit};
use crate::run::crew::{Crew, DEFAULT_IDLE_THREADS};
use crate::run::error::ProgramError;
use crate::run::hooks::Host;
use crate::run::policy::Policies;
use crate::run::policy::Policy;

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
    /// Whether a run has begun: its memory, and its nodes', may be in the caches since.
    ran: AtomicBool,
}

/// How many steps a program has before every run of it prefetches: below, its memory and its
/// nodes' fit in the caches once a run has been through them, where prefetching costs a few
/// nanoseconds a node and saves nothing (the 1,000-node Python chain: 78 µs a run without, 83
/// with). A nested graph of 10,000 Python nodes gains from it already.
const PREFETCH_FROM_STEPS: usize = 4096;

/// One step of a program, mirroring [`Plan`].
pub(crate) enum Op {
    Empty,
    Execute(Step),
    Sequence {
        steps: Box<[Op]>,
        /// Slots to drop after each step (a value whose last readers ran inside that step's
        /// wave).
        drop_after: Box<[Box<[usize]>]>,
        /// Whether a step of it holds an async node ([`Op::is_async`]).
        asynchronous: bool,
    },
    Wave {
        branches: Box<[Op]>,
        /// Branch `i` owns slots `bounds[i]..bounds[i + 1]`.
        bounds: Box<[usize]>,
        /// Whether a branch of it holds an async node ([`Op::is_async`]).
        asynchronous: bool,
    },
    /// A [`Plan::Map`]: boxed, so that an op is no larger for it.
    Map(Box<MapOp>),
    /// A [`Plan::Switch`].
    Switch(Box<SwitchOp>),
    /// A [`Plan::Loop`].
    Loop(Box<LoopOp>),
}

/// A `Map` step: where it reads and writes, and the program each item runs, with a table of
/// its own.
pub(crate) struct MapOp {
    pub(crate) step: Step,
    pub(crate) body: Program,
    pub(crate) in_flight: Option<usize>,
    /// Whether its node or its body holds an async node ([`Op::is_async`]).
    pub(crate) asynchronous: bool,
}

/// A `Switch` step: its node is the selector; one program per case.
pub(crate) struct SwitchOp {
    pub(crate) step: Step,
    pub(crate) keys: Box<[String]>,
    pub(crate) cases: Box<[Program]>,
    /// Whether its selector or a case holds an async node ([`Op::is_async`]).
    pub(crate) asynchronous: bool,
}

/// A `Loop` step: its node is the predicate; the program each iteration runs.
pub(crate) struct LoopOp {
    pub(crate) step: Step,
    pub(crate) body: Program,
    pub(crate) max_iterations: u32,
    /// Whether its predicate or its body holds an async node ([`Op::is_async`]).
    pub(crate) asynchronous: bool,
}

impl Op {
    /// Whether the op holds an async node ([`crate::Node::is_async`]) at any depth — a step's
    /// own, or one inside a wave's branch or a sub-program — and so is walked by an async run
    /// (`run/aio`); any other op is sync work, which the sync walk runs whole. Decided when the
    /// program is resolved: reading it costs a field.
    pub(crate) fn is_async(&self) -> bool {
        match self {
            Op::Empty => false,
            Op::Execute(step) => step.is_async(),
            Op::Sequence { asynchronous, .. } | Op::Wave { asynchronous, .. } => *asynchronous,
            Op::Map(map) => map.asynchronous,
            Op::Switch(switch) => switch.asynchronous,
            Op::Loop(repeat) => repeat.asynchronous,
        }
    }
}

/// A step keeps what running it needs and nothing more — its id is the program's, by slot — so
/// that a program is as little memory as it can be: memory a first run touches for the first
/// time (a page fault a page), and a large program's steps stay in the caches longer.
pub(crate) struct Step {
    pub(crate) node: Arc<dyn Node>,
    pub(crate) from: Reads,
    slot: u32,
    /// Where the node is placed, if it is.
    pub(crate) device: Option<Device>,
}

/// The bit of [`Step::slot`] that says the step's node has a [`Policy`], in
/// [`Program::policies`]: kept in a bit the slot does not use rather than in a field, so
/// that a step is no larger for it and a step without one pays a bit test.
const HAS_POLICY: u32 = 1 << 31;

/// The bit of [`Step::slot`] that says the step's node is async ([`crate::Node::is_async`]),
/// kept as [`HAS_POLICY`] is.
const IS_ASYNC: u32 = 1 << 30;

impl Step {
    /// Where the step writes its value, and where its id is in [`Program::ids`].
    pub(crate) fn slot(&self) -> usize {
        (self.slot & !(HAS_POLICY | IS_ASYNC)) as usize
    }

    /// Whether its node has a policy, in [`Program::policies`] at its slot.
    pub(crate) fn has_policy(&self) -> bool {
        self.slot & HAS_POLICY != 0
    }

    /// Whether its node is async.
    pub(crate) fn is_async(&self) -> bool {
        self.slot & IS_ASYNC != 0
    }
}

/// What a step's node is called on.
pub(crate) enum Reads {
    /// The run's input: the step has no predecessor.
    Input,
    /// One predecessor's value, as it is. Most steps read one: kept in the step itself, it costs
    /// neither an allocation nor an id's reference count when the program is made, nor a pointer
    /// to follow, into memory of its own, each time the step runs — which is what a step costs
    /// once a program outgrows the caches.
    One(Read),
    /// Several predecessors' values, in a map keyed by their ids: behind one pointer, so that
    /// the other steps are not as large as a join's list.
    Many(Box<Joined>),
}

/// A join's reads, with the id each value is keyed by.
pub(crate) struct Joined {
    pub(crate) reads: Box<[(NodeId, Read)]>,
}

/// Where a step reads one input, and whether it is the value's last reader in its producer's
/// branch (and so may take it instead of cloning it).
#[derive(Clone, Copy)]
pub(crate) struct Read {
    slot: u32,
    pub(crate) take: bool,
}

impl Read {
    /// The slot read.
    pub(crate) fn slot(self) -> usize {
        self.slot as usize
    }
}

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
        let decided = numbered.decide();
        let root = numbered.build(plan, &decided, placement, policies, depth)?;
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
            leaves: decided.leaves.into(),
            devices: devices.into(),
            crew: Crew::new(DEFAULT_IDLE_THREADS),
            decides: numbered.decides,
            ran: AtomicBool::new(false),
        })
    }

    /// Whether it has a `Map`, `Switch` or `Loop` step: only such a program needs the
    /// executor's [`crate::Reading`], so an embedder may give one only then.
    pub fn decides(&self) -> bool {
        self.decides
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

/// Where a step or a sequence sits: the innermost sequence around it, and the index of the
/// child of that sequence that holds it (itself, or the wave it is in). `NONE` outside any
/// sequence.
#[derive(Clone, Copy)]
struct Position {
    sequence: u32,
    child: u32,
}

const NONE: u32 = u32::MAX;

fn to_u32(n: usize) -> u32 {
    u32::try_from(n)
        .ok()
        .filter(|&n| n < IS_ASYNC)
        .expect("fewer steps than 2^30")
}

/// Slots by id.
type SlotOf<'p> = HashMap<&'p str, u32, BuildHasherDefault<IdHasher>>;

/// How many of the steps numbered last a read is looked for among, by identity, before the
/// table by id: a block of the DSL's nesting reads nothing further back.
const RECENT: usize = 8;

/// Where each node already numbered runs: its slot, found among the numbered steps' ids.
///
/// A compiled plan's ids are its graph's, shared, and a step nearly always reads what a step a
/// few places back wrote: found there by identity, a read costs no hashing and no lookup into a
/// table of every node — a cache miss each once the plan outgrows the caches. The table by id
/// is made only the first time a read is not found that way (a wide join, a hand-made plan),
/// and kept up to date from then on.
#[derive(Default)]
struct Slots<'p> {
    by_id: Option<SlotOf<'p>>,
}

impl<'p> Slots<'p> {
    /// The slot of the step that runs `source`, if one was numbered; `numbered` holds the id of
    /// each step numbered so far, by slot.
    fn find(&mut self, numbered: &[&'p NodeId], source: &NodeId) -> Option<u32> {
        let recent = numbered.len().saturating_sub(RECENT);
        if let Some(back) = numbered[recent..].iter().rposition(|id| id.is(source)) {
            return Some(to_u32(recent + back));
        }
        let by_id = self.by_id.get_or_insert_with(|| {
            let mut by_id =
                SlotOf::with_capacity_and_hasher(numbered.len(), BuildHasherDefault::default());
            for (slot, id) in numbered.iter().enumerate() {
                by_id.insert(id.as_str(), to_u32(slot));
            }
            by_id
        });
        by_id.get(source.as_str()).copied()
    }

    /// Numbers the step that runs `id` in `slot`, the next one.
    fn push(&mut self, id: &'p NodeId, slot: usize) {
        if let Some(by_id) = &mut self.by_id {
            by_id.insert(id.as_str(), to_u32(slot));
        }
    }
}

/// The first pass: steps numbered into slots in plan order, every read resolved and checked,
/// and where each step and each sequence sits. It borrows the plan's ids and the catalog's
/// implementations: each is cloned once, into the program, not once per pass.
struct Numbering<'p> {
    /// Where the sub-programs of decision steps find their implementations too.
    catalog: &'p Catalog,
    ids: Vec<&'p NodeId>,
    implementations: Vec<&'p Arc<dyn Node>>,
    /// Where each slot's step sits.
    positions: Vec<Position>,
    /// Where each sequence sits, by number (plan order), and how many sequences enclose it,
    /// itself included.
    sequences: Vec<(Position, u32)>,
    /// Every read, in plan order: (reader slot, read slot).
    reads: Vec<(u32, u32)>,
    /// Where in the catalog the next step's node is looked for first.
    next_in_catalog: usize,
    /// Whether a `Map`, `Switch` or `Loop` step was numbered.
    decides: bool,
}

/// A container being walked in the first pass.
struct Open {
    position: Position,
    /// For a sequence: its number and the index of the child being walked.
    sequence: Option<(u32, u32)>,
    /// For a wave: the first slot of its first branch.
    wave_start: Option<usize>,
}

/// What the second pass resolves each step with, besides the numbering.
#[derive(Clone, Copy)]
struct Resolved<'r> {
    decided: &'r Decided,
    placement: Option<&'r Placement>,
    policies: Option<&'r Policies>,
    /// How many decision steps hold the plan being resolved.
    depth: usize,
}

/// What the program decides once every read is known.
struct Decided {
    /// By read (plan order): whether it takes the value instead of cloning it.
    takes: Vec<bool>,
    /// (sequence, child, slot): drop `slot` after `child` of `sequence`; sorted by sequence,
    /// then child, then slot.
    drops: Vec<(u32, u32, u32)>,
    leaves: Vec<usize>,
}

impl<'p> Numbering<'p> {
    fn of(plan: &'p Plan, catalog: &'p Catalog) -> Result<Numbering<'p>, ProgramError> {
        // A plan runs at most every node of its catalog, and a compiled one exactly those: sized
        // once, the tables never move while they grow.
        let steps = catalog.len();
        let mut numbering = Numbering {
            catalog,
            ids: Vec::with_capacity(steps),
            implementations: Vec::with_capacity(steps),
            positions: Vec::with_capacity(steps),
            // Every sequence but the outermost has a step or a wave of its own: at most one each.
            sequences: Vec::with_capacity(steps),
            reads: Vec::with_capacity(steps),
            next_in_catalog: 0,
            decides: false,
        };
        let mut slots = Slots::default();
        // Which catalog entries a step runs already: a node run twice is refused.
        let mut running = vec![false; catalog.len()];
        let mut open: Vec<Open> = Vec::new();
        // For each wave around the step being visited, `(wave start, branch start)`: the slots
        // of the sibling branches before this one, which run at the same time and so cannot be
        // read. Ranges nest, so they are sorted by start and disjoint.
        let mut hidden: Vec<(usize, usize)> = Vec::new();
        // A decision's sub-plans run with tables of their own: resolved apart, in `build`.
        for visit in plan.own_visits() {
            match visit {
                Visit::Enter(entered) => {
                    let position = match open.last() {
                        None => Position {
                            sequence: NONE,
                            child: 0,
                        },
                        Some(parent) => match parent.sequence {
                            Some((sequence, child)) => Position { sequence, child },
                            None => parent.position,
                        },
                    };
                    if let Some(start) = open.last().and_then(|parent| parent.wave_start) {
                        hidden.push((start, numbering.ids.len()));
                    }
                    match entered {
                        Plan::Empty => {}
                        Plan::Execute { node, from }
                        | Plan::Map { node, from, .. }
                        | Plan::Switch { node, from, .. }
                        | Plan::Loop { node, from, .. } => {
                            numbering.execute(
                                catalog,
                                &mut slots,
                                &mut running,
                                &hidden,
                                node,
                                from,
                            )?;
                            numbering.positions.push(position);
                            numbering.decides |= !matches!(entered, Plan::Execute { .. });
                        }
                        Plan::Sequence(_) => {
                            let depth = match position.sequence {
                                NONE => 1,
                                outer => numbering.sequences[outer as usize].1 + 1,
                            };
                            open.push(Open {
                                position,
                                sequence: Some((to_u32(numbering.sequences.len()), 0)),
                                wave_start: None,
                            });
                            numbering.sequences.push((position, depth));
                        }
                        Plan::Wave(_) => open.push(Open {
                            position,
                            sequence: None,
                            wave_start: Some(numbering.ids.len()),
                        }),
                        Plan::Remote { host, inner } => return Err(remote_refused(host, inner)),
                    }
                }
                Visit::Leave(left) => {
                    match left {
                        Plan::Sequence(_) | Plan::Wave(_) => {
                            open.pop();
                        }
                        // Refused when entered, or without children of this table.
                        Plan::Remote { .. }
                        | Plan::Empty
                        | Plan::Execute { .. }
                        | Plan::Map { .. }
                        | Plan::Switch { .. }
                        | Plan::Loop { .. } => {}
                    }
                    match open.last_mut() {
                        Some(Open {
                            sequence: Some((_, child)),
                            ..
                        }) => *child += 1,
                        Some(Open {
                            wave_start: Some(_),
                            ..
                        }) => {
                            hidden.pop();
                        }
                        Some(_) | None => {}
                    }
                }
            }
        }
        Ok(numbering)
    }

    /// Numbers one step and resolves its reads.
    fn execute(
        &mut self,
        catalog: &'p Catalog,
        slots: &mut Slots<'p>,
        running: &mut [bool],
        hidden: &[(usize, usize)],
        node: &'p NodeId,
        from: &[NodeId],
    ) -> Result<(), ProgramError> {
        let (entry, implementation) = catalog
            .get_after(node, &mut self.next_in_catalog)
            .ok_or_else(|| ProgramError::NotInCatalog { node: node.clone() })?;
        let slot = to_u32(self.ids.len());
        for source in from {
            match slots.find(&self.ids, source) {
                Some(read) if visible(hidden, read as usize) => self.reads.push((slot, read)),
                Some(_) | None => {
                    return Err(ProgramError::MissingInput {
                        node: node.clone(),
                        from: source.clone(),
                    })
                }
            }
        }
        if std::mem::replace(&mut running[entry], true) {
            return Err(ProgramError::StepTwice { node: node.clone() });
        }
        slots.push(node, self.ids.len());
        self.ids.push(node);
        self.implementations.push(implementation);
        Ok(())
    }

    /// How many sequences enclose `sequence`, itself included; 0 for `NONE`.
    fn depth(&self, sequence: u32) -> u32 {
        match sequence {
            NONE => 0,
            s => self.sequences[s as usize].1,
        }
    }

    /// The innermost sequence around both `a` and `b`, or `NONE`.
    fn common(&self, mut a: u32, mut b: u32) -> u32 {
        while self.depth(a) > self.depth(b) {
            a = self.sequences[a as usize].0.sequence;
        }
        while self.depth(b) > self.depth(a) {
            b = self.sequences[b as usize].0.sequence;
        }
        while a != b {
            a = self.sequences[a as usize].0.sequence;
            b = self.sequences[b as usize].0.sequence;
        }
        a
    }

    /// The index of the child of `sequence` that holds the step in `slot`; `sequence` must
    /// enclose it.
    fn child_in(&self, slot: u32, sequence: u32) -> u32 {
        let mut at = self.positions[slot as usize];
        while at.sequence != sequence {
            at = self.sequences[at.sequence as usize].0;
        }
        at.child
    }

    /// When each value can go: right after its last reader. The last reader *takes* the value
    /// when it is a step of the innermost sequence that holds producer and readers; otherwise
    /// that sequence drops it after the child that holds the last reader.
    fn decide(&self) -> Decided {
        let slots = self.ids.len();
        // The reads of each slot, grouped by a counting sort: (reader, read index).
        let mut first = vec![0_u32; slots + 1];
        for &(_, read) in &self.reads {
            first[read as usize + 1] += 1;
        }
        for slot in 0..slots {
            first[slot + 1] += first[slot];
        }
        let mut next = first.clone();
        let mut grouped = vec![(0_u32, 0_u32); self.reads.len()];
        for (at, &(reader, read)) in self.reads.iter().enumerate() {
            let place = &mut next[read as usize];
            grouped[*place as usize] = (reader, to_u32(at));
            *place += 1;
        }
        let mut decided = Decided {
            takes: vec![false; self.reads.len()],
            drops: Vec::with_capacity(slots),
            leaves: Vec::new(),
        };
        for slot in 0..slots {
            let readers = &grouped[first[slot] as usize..first[slot + 1] as usize];
            if readers.is_empty() {
                decided.leaves.push(slot);
                continue;
            }
            let own = self.positions[slot].sequence;
            let sequence = readers.iter().fold(own, |around, &(reader, _)| {
                self.common(around, self.positions[reader as usize].sequence)
            });
            if sequence == NONE {
                continue; // No sequence holds producer and readers: keep the value to the end.
            }
            let (last_child, (reader, at)) = readers
                .iter()
                .map(|&(reader, at)| (self.child_in(reader, sequence), (reader, at)))
                .max_by_key(|&(child, _)| child)
                .expect("readers is not empty");
            if self.positions[reader as usize].sequence == sequence {
                // The last reader is a step of that very sequence, in the producer's branch.
                decided.takes[at as usize] = true;
            } else {
                decided.drops.push((sequence, last_child, to_u32(slot)));
            }
        }
        // Stable: after each child, drops stay in slot order.
        decided
            .drops
            .sort_by_key(|&(sequence, child, _)| (sequence, child));
        decided
    }

    /// The op of the step `entered` (an `Execute`, `Map`, `Switch` or `Loop`) in `slot`, reading
    /// `from` through the reads numbered from `*read` on; a decision's sub-plans each resolved
    /// into a program of its own.
    fn step_op(
        &self,
        entered: &Plan,
        from: &[NodeId],
        slot: usize,
        read: &mut usize,
        resolved: &Resolved<'_>,
    ) -> Result<Op, ProgramError> {
        let Resolved {
            decided,
            placement,
            policies,
            depth,
        } = *resolved;
        let mut next = || {
            let (_, read_slot) = self.reads[*read];
            let take = decided.takes[*read];
            *read += 1;
            Read {
                slot: read_slot,
                take,
            }
        };
        let from = match from {
            [] => Reads::Input,
            [_] => Reads::One(next()),
            many => Reads::Many(Box::new(Joined {
                reads: many.iter().map(|source| (source.clone(), next())).collect(),
            })),
        };
        let id = self.ids[slot];
        let policy = policies.is_some_and(|p| p.get(id.as_str()).is_some());
        let node = Arc::clone(self.implementations[slot]);
        let asynchronous = node.is_async();
        let step = Step {
            node,
            from,
            slot: to_u32(slot)
                | if policy { HAS_POLICY } else { 0 }
                | if asynchronous { IS_ASYNC } else { 0 },
            device: placement.and_then(|p| p.device(id.as_str())),
        };
        let catalog = self.catalog;
        let inner = |plan: &Plan| {
            nested(depth + 1, || {
                Program::placed(plan, catalog, placement, policies, depth + 1)
            })
        };
        Ok(match entered {
            Plan::Map {
                body, in_flight, ..
            } => {
                let body = inner(body)?;
                Op::Map(Box::new(MapOp {
                    asynchronous: asynchronous || body.is_async(),
                    step,
                    body,
                    in_flight: *in_flight,
                }))
            }
            Plan::Switch { keys, cases, .. } => {
                let cases: Box<[Program]> = cases.iter().map(inner).collect::<Result<_, _>>()?;
                Op::Switch(Box::new(SwitchOp {
                    asynchronous: asynchronous || cases.iter().any(Program::is_async),
                    step,
                    keys: keys.clone().into(),
                    cases,
                }))
            }
            Plan::Loop {
                body,
                max_iterations,
                ..
            } => {
                let body = inner(body)?;
                Op::Loop(Box::new(LoopOp {
                    asynchronous: asynchronous || body.is_async(),
                    step,
                    body,
                    max_iterations: *max_iterations,
                }))
            }
            Plan::Execute { .. }
            | Plan::Empty
            | Plan::Sequence(_)
            | Plan::Wave(_)
            | Plan::Remote { .. } => Op::Execute(step),
        })
    }

    /// The second pass: the tree of ops, built bottom up on an explicit stack.
    ///
    /// Each container's children go straight into a list of their exact number, which becomes
    /// the container's boxed slice without a copy: the tree is written once, into as much new
    /// memory as it takes — memory a first run touches for the first time, a page fault a page.
    fn build(
        &self,
        plan: &Plan,
        decided: &Decided,
        placement: Option<&Placement>,
        policies: Option<&Policies>,
        depth: usize,
    ) -> Result<Op, ProgramError> {
        /// What a container being built is.
        enum Container {
            /// The list the root op goes into.
            Root,
            /// A sequence, by number.
            Sequence(u32),
            /// A wave, with its bounds so far.
            Wave(Vec<usize>),
        }
        /// A container being built, and its children so far.
        struct Building {
            children: Vec<Op>,
            container: Container,
        }
        let mut open = vec![Building {
            children: Vec::with_capacity(1),
            container: Container::Root,
        }];
        let (mut slot, mut read, mut sequences) = (0_usize, 0_usize, 0_u32);
        let resolved = Resolved {
            decided,
            placement,
            policies,
            depth,
        };
        for visit in plan.own_visits() {
            match visit {
                Visit::Enter(entered) => {
                    let parent = open.last_mut().expect("the root stays open");
                    if let Container::Wave(bounds) = &mut parent.container {
                        bounds.push(slot);
                    }
                    match entered {
                        Plan::Empty => parent.children.push(Op::Empty),
                        Plan::Execute { from, .. }
                        | Plan::Map { from, .. }
                        | Plan::Switch { from, .. }
                        | Plan::Loop { from, .. } => {
                            let op = self.step_op(entered, from, slot, &mut read, &resolved)?;
                            parent.children.push(op);
                            slot += 1;
                        }
                        Plan::Sequence(children) => {
                            open.push(Building {
                                children: Vec::with_capacity(children.len()),
                                container: Container::Sequence(sequences),
                            });
                            sequences += 1;
                        }
                        Plan::Wave(children) => open.push(Building {
                            children: Vec::with_capacity(children.len()),
                            container: Container::Wave(Vec::with_capacity(children.len() + 1)),
                        }),
                        Plan::Remote { .. } => unreachable!("`Numbering::of` refuses a slice"),
                    }
                }
                Visit::Leave(
                    Plan::Empty
                    | Plan::Execute { .. }
                    | Plan::Remote { .. }
                    | Plan::Map { .. }
                    | Plan::Switch { .. }
                    | Plan::Loop { .. },
                ) => {}
                Visit::Leave(Plan::Sequence(_) | Plan::Wave(_)) => {
                    let built = open.pop().expect("entered before");
                    // Exactly as many as the plan has children: no copy, no spare room.
                    let children: Box<[Op]> = built.children.into_boxed_slice();
                    let asynchronous = children.iter().any(Op::is_async);
                    let op = match built.container {
                        Container::Sequence(number) => Op::Sequence {
                            drop_after: drops_after(&decided.drops, number, children.len()),
                            steps: children,
                            asynchronous,
                        },
                        Container::Wave(mut bounds) => {
                            bounds.push(slot);
                            Op::Wave {
                                branches: children,
                                bounds: bounds.into(),
                                asynchronous,
                            }
                        }
                        Container::Root => unreachable!("the root is never left"),
                    };
                    open.last_mut()
                        .expect("the root stays open")
                        .children
                        .push(op);
                }
            }
        }
        let mut root = open.pop().expect("the root stays open").children;
        Ok(root.pop().expect("the root was built"))
    }
}

/// The refusal of a remote slice: a program runs every step in this process.
fn remote_refused(host: &crate::model::host::HostName, inner: &Plan) -> ProgramError {
    let first = inner.steps().first().map(|&(node, _)| node.clone());
    ProgramError::RemoteSlice {
        node: first.unwrap_or_else(|| NodeId::new("(empty slice)")),
        host: host.clone(),
    }
}

/// The slots `sequence` drops after each of its `len` children; empty when it drops none.
fn drops_after(drops: &[(u32, u32, u32)], sequence: u32, len: usize) -> Box<[Box<[usize]>]> {
    let start = drops.partition_point(|&(s, _, _)| s < sequence);
    let end = drops.partition_point(|&(s, _, _)| s <= sequence);
    if start == end {
        return Box::new([]);
    }
    // Sorted by child: each child's slots are one run, each made into its box at its size.
    let mut ours = &drops[start..end];
    (0..len)
        .map(|child| {
            let run = ours.partition_point(|&(_, c, _)| c as usize <= child);
            let (here, rest) = ours.split_at(run);
            ours = rest;
            here.iter().map(|&(_, _, slot)| slot as usize).collect()
        })
        .collect()
}

/// Whether a step may read `slot`, already numbered: true unless it lies in a sibling branch
/// of an enclosing wave (`hidden`, as kept by [`Numbering::of`]).
fn visible(hidden: &[(usize, usize)], slot: usize) -> bool {
    let at = hidden.partition_point(|&(start, _)| start <= slot);
    at == 0 || slot >= hidden[at - 1].1
}

impl Drop for Op {
    /// Takes a deep tree apart with a stack of its own, so that dropping a program never
    /// recurses once per level of its plan.
    fn drop(&mut self) {
        let mut stack: Vec<Op> = Vec::new();
        let take = |op: &mut Op, stack: &mut Vec<Op>| match op {
            Op::Sequence {
                steps: children, ..
            }
            | Op::Wave {
                branches: children, ..
            } => {
                stack.extend(Vec::from(std::mem::take(children)));
            }
            // A sub-program's ops are taken out too, so that steps nested in steps drop in the
            // same loop however deep they nest.
            Op::Map(map) => stack.push(std::mem::replace(&mut map.body.root, Op::Empty)),
            Op::Loop(repeat) => stack.push(std::mem::replace(&mut repeat.body.root, Op::Empty)),
            Op::Switch(switch) => stack.extend(
                switch
                    .cases
                    .iter_mut()
                    .map(|case| std::mem::replace(&mut case.root, Op::Empty)),
            ),
            Op::Empty | Op::Execute(_) => {}
        };
        take(self, &mut stack);
        while let Some(mut op) = stack.pop() {
            take(&mut op, &mut stack);
        }
    }
}
