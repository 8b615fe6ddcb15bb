//! When each value a program's steps make can go: right after its last reader, so that a long
//! chain holds one intermediate value at a time, not all of them.
//!
//! Found between the two passes of resolving — the program's liveness — once the first
//! ([`super::numbering`]) has found every read: the last reader *takes* the value when it runs in its producer's branch;
//! otherwise the innermost sequence around producer and readers drops it after the child that
//! holds the last reader, which the second pass ([`super::build`]) writes into that sequence's
//! op.

use super::numbering::{Numbering, NONE};
use super::ops::to_u32;

/// When each value lives, found once every read is known: which reads take it, which
/// sequences drop it after which child, and which values live to the end (the leaves).
pub(super) struct Liveness {
    /// By read (plan order): whether it takes the value instead of cloning it.
    pub(super) takes: Vec<bool>,
    /// (sequence, child, slot): drop `slot` after `child` of `sequence`; sorted by sequence,
    /// then child, then slot.
    pub(super) drops: Vec<(u32, u32, u32)>,
    pub(super) leaves: Vec<usize>,
}

impl Numbering<'_> {
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
    pub(super) fn liveness(&self) -> Liveness {
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
        let mut liveness = Liveness {
            takes: vec![false; self.reads.len()],
            drops: Vec::with_capacity(slots),
            leaves: Vec::new(),
        };
        for slot in 0..slots {
            let readers = &grouped[first[slot] as usize..first[slot + 1] as usize];
            if readers.is_empty() {
                liveness.leaves.push(slot);
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
                liveness.takes[at as usize] = true;
            } else {
                liveness.drops.push((sequence, last_child, to_u32(slot)));
            }
        }
        // Stable: after each child, drops stay in slot order.
        liveness
            .drops
            .sort_by_key(|&(sequence, child, _)| (sequence, child));
        liveness
    }
}

/// The slots `sequence` drops after each of its `len` children; empty when it drops none.
pub(super) fn drops_after(
    drops: &[(u32, u32, u32)],
    sequence: u32,
    len: usize,
) -> Box<[Box<[usize]>]> {
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
