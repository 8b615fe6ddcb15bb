//! A stream's stages: where a program is cut for its items to overlap — the steps of its
//! top-level sequence, each a node or a whole wave — and the nodes each stage holds.
//!
//! Cut there because those steps already run one after the other with nothing shared but the
//! item's table: a stage needs no change to the program, only the slots to drop after it, and a
//! wave inside a stage still runs its branches side by side as a run does.

use crate::model::id::NodeId;
use crate::run::program::{Op, Program};

/// The stages of a program: the steps of its top-level sequence, each with the slots to drop
/// after it; a program of one step or one wave is one stage.
pub(super) fn stages(program: &Program) -> Vec<(&Op, &[usize])> {
    match &program.root {
        Op::Sequence {
            steps, drop_after, ..
        } => steps
            .iter()
            .enumerate()
            .map(|(at, step)| (step, drop_after.get(at).map_or(&[][..], |d| &**d)))
            .collect(),
        whole @ (Op::Empty
        | Op::Execute(_)
        | Op::Wave { .. }
        | Op::Map(_)
        | Op::Switch(_)
        | Op::Loop(_)) => vec![(whole, &[][..])],
    }
}

/// The nodes of a stage, in plan order; walked with a stack, however deep the stage nests.
pub(super) fn nodes_of(op: &Op, ids: &[NodeId]) -> Vec<(usize, NodeId)> {
    let mut found = Vec::new();
    let mut pending = vec![op];
    while let Some(op) = pending.pop() {
        match op {
            Op::Empty => {}
            Op::Execute(step) => found.push((step.slot(), ids[step.slot()].clone())),
            Op::Map(op) => found.push((op.step.slot(), ids[op.step.slot()].clone())),
            Op::Switch(op) => found.push((op.step.slot(), ids[op.step.slot()].clone())),
            Op::Loop(op) => found.push((op.step.slot(), ids[op.step.slot()].clone())),
            Op::Sequence { steps, .. } => pending.extend(steps.iter()),
            Op::Wave { branches, .. } => pending.extend(branches.iter()),
        }
    }
    found.sort_unstable_by_key(|&(slot, _)| slot);
    found
}
