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
use std::sync::Arc;

use crate::model::catalog::Catalog;
use crate::model::id::NodeId;
use crate::model::node::Node;
use crate::plan::Plan;
use crate::run::crew::{Crew, DEFAULT_IDLE_THREADS};
use crate::run::error::ProgramError;

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
    pub(crate) leaves: Box<[usize]>,
    pub(crate) crew: Crew,
}

/// One step of a program, mirroring [`Plan`].
pub(crate) enum Op {
    Empty,
    Execute(Step),
    Sequence {
        steps: Box<[Op]>,
        /// Slots to drop after each step (a value whose last readers ran inside that step's
        /// wave).
        drop_after: Box<[Box<[usize]>]>,
    },
    Wave {
        branches: Box<[Op]>,
        /// Branch `i` owns slots `bounds[i]..bounds[i + 1]`.
        bounds: Box<[usize]>,
    },
}

pub(crate) struct Step {
    pub(crate) id: NodeId,
    pub(crate) slot: usize,
    pub(crate) node: Arc<dyn Node>,
    pub(crate) from: Box<[Read]>,
}

/// Where a step reads one input, and whether it is the value's last reader in its producer's
/// branch (and so may take it instead of cloning it).
pub(crate) struct Read {
    pub(crate) source: NodeId,
    pub(crate) slot: usize,
    pub(crate) take: bool,
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
    /// O(steps · nesting depth).
    pub fn new(plan: &Plan, catalog: &Catalog) -> Result<Program, ProgramError> {
        let mut builder = Builder {
            catalog,
            ids: Vec::new(),
            slot_of: HashMap::new(),
            paths: Vec::new(),
            path: Vec::new(),
            sequences: 0,
            reads: Vec::new(),
            hidden: Vec::new(),
        };
        let mut root = builder.build(plan)?;
        let ids = builder.ids;
        let mut readers: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ids.len()];
        for (at, &(reader, slot)) in builder.reads.iter().enumerate() {
            readers[slot].push((reader, at));
        }
        let mut takes = vec![false; builder.reads.len()];
        let mut drops: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        let mut leaves = Vec::new();
        for (slot, readers) in readers.iter().enumerate() {
            if readers.is_empty() {
                leaves.push(slot);
                continue;
            }
            let own = &builder.paths[slot];
            let depth = readers
                .iter()
                .map(|&(reader, _)| common_depth(own, &builder.paths[reader]))
                .min()
                .unwrap_or(0);
            if depth == 0 {
                continue; // No sequence holds producer and readers: keep the value to the end.
            }
            let (sequence, _) = own[depth - 1];
            let (last_child, read_at) = readers
                .iter()
                .map(|&(reader, at)| (builder.paths[reader][depth - 1].1, (reader, at)))
                .max_by_key(|&(child, _)| child)
                .map(|(child, (reader, at))| (child, (builder.paths[reader].len(), at)))
                .expect("readers is not empty");
            let (reader_depth, at) = read_at;
            if reader_depth == depth {
                // The last reader is a step of that very sequence, in the producer's branch.
                takes[at] = true;
            } else {
                drops.entry(sequence).or_default().push((last_child, slot));
            }
        }
        let mut next_sequence = 0;
        let mut next_read = 0;
        finish(
            &mut root,
            &takes,
            &drops,
            &mut next_sequence,
            &mut next_read,
        );
        Ok(Program {
            root,
            ids: ids.into(),
            leaves: leaves.into(),
            crew: Crew::new(DEFAULT_IDLE_THREADS),
        })
    }

    /// Number of steps.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the program runs no step.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
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

    /// Keeps at most `limit` idle threads (64 unless set); idle threads beyond it end.
    pub fn set_idle_threads(&self, limit: usize) {
        self.crew.set_idle_limit(limit);
    }

    /// The nodes whose outputs a run returns, in plan order.
    pub fn leaves(&self) -> impl Iterator<Item = &NodeId> {
        self.leaves.iter().map(|&slot| &self.ids[slot])
    }
}

/// How many enclosing sequences two steps share.
fn common_depth(a: &[(usize, usize)], b: &[(usize, usize)]) -> usize {
    a.iter()
        .zip(b)
        .take_while(|((x, _), (y, _))| x == y)
        .count()
}

struct Builder<'c> {
    catalog: &'c Catalog,
    ids: Vec<NodeId>,
    slot_of: HashMap<NodeId, usize>,
    /// For each slot, the enclosing sequences: (sequence number, index of the child holding it).
    paths: Vec<Box<[(usize, usize)]>>,
    path: Vec<(usize, usize)>,
    sequences: usize,
    /// Every (reader slot, read slot), in build order.
    reads: Vec<(usize, usize)>,
    /// For each wave around the step being built, `(wave start, branch start)`: the slots of
    /// the sibling branches before this one, which run at the same time and so cannot be read.
    /// Ranges nest, so they are sorted by start and disjoint.
    hidden: Vec<(usize, usize)>,
}

impl Builder<'_> {
    /// Whether a step being built may read `slot`, which is already numbered: true unless it
    /// lies in a sibling branch of an enclosing wave.
    fn visible(&self, slot: usize) -> bool {
        let at = self.hidden.partition_point(|&(start, _)| start <= slot);
        at == 0 || slot >= self.hidden[at - 1].1
    }

    fn build(&mut self, plan: &Plan) -> Result<Op, ProgramError> {
        match plan {
            Plan::Empty => Ok(Op::Empty),
            Plan::Execute { node, from } => {
                let implementation = self
                    .catalog
                    .get(node.as_str())
                    .ok_or_else(|| ProgramError::NotInCatalog { node: node.clone() })?;
                let slot = self.ids.len();
                let from = from
                    .iter()
                    .map(|source| match self.slot_of.get(source) {
                        Some(&read) if self.visible(read) => {
                            self.reads.push((slot, read));
                            Ok(Read {
                                source: source.clone(),
                                slot: read,
                                take: false,
                            })
                        }
                        Some(_) | None => Err(ProgramError::MissingInput {
                            node: node.clone(),
                            from: source.clone(),
                        }),
                    })
                    .collect::<Result<Box<[Read]>, ProgramError>>()?;
                if self.slot_of.insert(node.clone(), slot).is_some() {
                    return Err(ProgramError::StepTwice { node: node.clone() });
                }
                self.ids.push(node.clone());
                self.paths.push(self.path.as_slice().into());
                Ok(Op::Execute(Step {
                    id: node.clone(),
                    slot,
                    node: Arc::clone(implementation),
                    from,
                }))
            }
            Plan::Sequence(children) => {
                let number = self.sequences;
                self.sequences += 1;
                let mut steps = Vec::with_capacity(children.len());
                for (index, child) in children.iter().enumerate() {
                    self.path.push((number, index));
                    let step = self.build(child);
                    self.path.pop();
                    steps.push(step?);
                }
                Ok(Op::Sequence {
                    steps: steps.into(),
                    drop_after: Box::new([]),
                })
            }
            Plan::Wave(children) => {
                let mut bounds = Vec::with_capacity(children.len() + 1);
                let mut branches = Vec::with_capacity(children.len());
                let start = self.ids.len();
                for child in children {
                    bounds.push(self.ids.len());
                    self.hidden.push((start, self.ids.len()));
                    let branch = self.build(child);
                    self.hidden.pop();
                    branches.push(branch?);
                }
                bounds.push(self.ids.len());
                Ok(Op::Wave {
                    branches: branches.into(),
                    bounds: bounds.into(),
                })
            }
        }
    }
}

/// Fills in the takes and drops decided once every read was known, visiting the tree in the
/// order it was built so that sequence and read numbers line up.
fn finish(
    op: &mut Op,
    takes: &[bool],
    drops: &HashMap<usize, Vec<(usize, usize)>>,
    next_sequence: &mut usize,
    next_read: &mut usize,
) {
    match op {
        Op::Empty => {}
        Op::Execute(step) => {
            for read in &mut step.from {
                read.take = takes[*next_read];
                *next_read += 1;
            }
        }
        Op::Sequence { steps, drop_after } => {
            let number = *next_sequence;
            *next_sequence += 1;
            if let Some(scheduled) = drops.get(&number) {
                let mut after: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
                for &(child, slot) in scheduled {
                    after[child].push(slot);
                }
                *drop_after = after.into_iter().map(Vec::into_boxed_slice).collect();
            }
            for step in &mut **steps {
                finish(step, takes, drops, next_sequence, next_read);
            }
        }
        Op::Wave { branches, .. } => {
            for branch in &mut **branches {
                finish(branch, takes, drops, next_sequence, next_read);
            }
        }
    }
}
