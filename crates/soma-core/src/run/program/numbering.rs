//! The first pass of resolving a plan: its steps numbered into slots in plan order, every read
//! resolved to the slot it reads and checked, and where each step and each sequence sits.
//!
//! What a plan names by id, a program finds by number: this pass finds the slot of each read by
//! its id, once, so that running the program never hashes one. The positions it keeps are what
//! deciding the drops ([`super::drops`]) reads, and the numbering is what the second pass
//! ([`super::build`]) builds the ops from.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use super::ops::to_u32;
use crate::model::catalog::Catalog;
use crate::model::id::{IdHasher, NodeId};
use crate::model::node::Node;
use crate::plan::{Plan, Visit};
use crate::run::error::ProgramError;

/// Where a step or a sequence sits: the innermost sequence around it, and the index of the
/// child of that sequence that holds it (itself, or the wave it is in). `NONE` outside any
/// sequence.
#[derive(Clone, Copy)]
pub(super) struct Position {
    pub(super) sequence: u32,
    pub(super) child: u32,
}

pub(super) const NONE: u32 = u32::MAX;

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
pub(super) struct Numbering<'p> {
    /// Where the sub-programs of decision steps find their implementations too.
    pub(super) catalog: &'p Catalog,
    pub(super) ids: Vec<&'p NodeId>,
    pub(super) implementations: Vec<&'p Arc<dyn Node>>,
    /// Where each slot's step sits.
    pub(super) positions: Vec<Position>,
    /// Where each sequence sits, by number (plan order), and how many sequences enclose it,
    /// itself included.
    pub(super) sequences: Vec<(Position, u32)>,
    /// Every read, in plan order: (reader slot, read slot).
    pub(super) reads: Vec<(u32, u32)>,
    /// Where in the catalog the next step's node is looked for first.
    next_in_catalog: usize,
    /// Whether a `Map`, `Switch` or `Loop` step was numbered.
    pub(super) decides: bool,
    /// Whether a wave was entered.
    pub(super) waves: bool,
}

/// A container being walked in the first pass.
struct Open {
    position: Position,
    /// For a sequence: its number and the index of the child being walked.
    sequence: Option<(u32, u32)>,
    /// For a wave: the first slot of its first branch.
    wave_start: Option<usize>,
}

impl<'p> Numbering<'p> {
    pub(super) fn of(plan: &'p Plan, catalog: &'p Catalog) -> Result<Numbering<'p>, ProgramError> {
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
            waves: false,
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
                    numbering.waves |= matches!(entered, Plan::Wave(_));
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
}

/// The refusal of a remote slice: a program runs every step in this process.
fn remote_refused(host: &crate::model::host::HostName, inner: &Plan) -> ProgramError {
    let first = inner.steps().first().map(|&(node, _)| node.clone());
    ProgramError::RemoteSlice {
        node: first.unwrap_or_else(|| NodeId::new("(empty slice)")),
        host: host.clone(),
    }
}

/// Whether a step may read `slot`, already numbered: true unless it lies in a sibling branch
/// of an enclosing wave (`hidden`, as kept by [`Numbering::of`]).
fn visible(hidden: &[(usize, usize)], slot: usize) -> bool {
    let at = hidden.partition_point(|&(start, _)| start <= slot);
    at == 0 || slot >= hidden[at - 1].1
}
