//! The ops a [`Program`] runs: a tree mirroring its [`Plan`](crate::plan::Plan), each step
//! resolved to what running it needs — its node, the slots it reads and writes, its device —
//! and nothing more.
//!
//! Kept apart from the resolving that makes them: what walks a program (the executor, the
//! stream, the async walk) reads these types and never the passes over the plan. A step is
//! kept small on purpose — its flags in spare bits of its slot, a single read inline — since a
//! program is memory a first run touches for the first time and a large one must stay in the
//! caches.

use std::sync::Arc;

use super::Program;
use crate::model::device::Device;
use crate::model::id::NodeId;
use crate::model::node::Node;

/// One step of a program, mirroring [`Plan`](crate::plan::Plan).
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
    /// A [`Plan::Map`](crate::plan::Plan::Map): boxed, so that an op is no larger for it.
    Map(Box<MapOp>),
    /// A [`Plan::Switch`](crate::plan::Plan::Switch).
    Switch(Box<SwitchOp>),
    /// A [`Plan::Loop`](crate::plan::Plan::Loop).
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
    pub(super) slot: u32,
    /// Where the node is placed, if it is.
    pub(crate) device: Option<Device>,
}

/// The bit of [`Step::slot`] that says the step's node has a
/// [`Policy`](crate::run::policy::Policy), in [`Program::policies`]: kept in a bit the slot
/// does not use rather than in a field, so that a step is no larger for it and a step without
/// one pays a bit test.
pub(super) const HAS_POLICY: u32 = 1 << 31;

/// The bit of [`Step::slot`] that says the step's node is async ([`crate::Node::is_async`]),
/// kept as [`HAS_POLICY`] is.
pub(super) const IS_ASYNC: u32 = 1 << 30;

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
    pub(super) slot: u32,
    pub(crate) take: bool,
}

impl Read {
    /// The slot read.
    pub(crate) fn slot(self) -> usize {
        self.slot as usize
    }
}

/// A slot's number as a `u32`, below the bits [`Step::slot`] keeps its flags in.
pub(super) fn to_u32(n: usize) -> u32 {
    u32::try_from(n)
        .ok()
        .filter(|&n| n < IS_ASYNC)
        .expect("fewer steps than 2^30")
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
