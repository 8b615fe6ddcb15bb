//! `RunKeys`: the identity of each value one cached run produced, by slot — the digest of its
//! content, or the key its node's output was filed under where it has none — from which each
//! next node's key is chained (see [`crate::run::cache`]).
//!
//! Each slot is written once, by the step that owns it, and read by the steps after it, in its
//! branch or after its wave joined: a `OnceLock` per slot needs no lock and no ordering
//! beyond what the table of values already has.

use std::sync::{Arc, OnceLock};

use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::value::Value;
use crate::run::cache::NodeCache;
use crate::run::program::{Op, Program, Read, Reads, Step};

/// Derivation context of a node's key: no key of another kind can equal one. Version 2: a
/// fingerprint covers the code a node reaches and a digest a value's whole content and type,
/// so no key of version 1 can be taken for one of these.
const NODE_CONTEXT: &str = "soma 2026-12 node key v2";

/// A node's key so far, before what it reads: its fingerprint (its code and state), its id and
/// where it runs.
fn node_hasher(id: &NodeId, fingerprint: &Key, step: &Step) -> blake3::Hasher {
    // Derived once: deriving a hasher's key hashes its context, which would cost a hit as much
    // as the rest of its key.
    static DERIVED: OnceLock<blake3::Hasher> = OnceLock::new();
    let mut hasher = DERIVED
        .get_or_init(|| blake3::Hasher::new_derive_key(NODE_CONTEXT))
        .clone();
    hasher.update(fingerprint.as_bytes());
    // Its id, which a node may read (`Ctx::node`): two nodes alike in code and state, on the
    // same input, may still compute different outputs.
    let name = id.as_str().as_bytes();
    hasher.update(&(name.len() as u64).to_le_bytes());
    hasher.update(name);
    // Where it runs is part of what it computes: an output made on `cuda:1` is not the output
    // of the same node moved to `cuda:0`.
    match step.device {
        None => hasher.update(b"nowhere"),
        Some(device) => hasher.update(format!("on {device}").as_bytes()),
    };
    hasher
}

/// The identities of one run's values, and the cache they are keyed for.
pub(crate) struct RunKeys {
    pub(crate) cache: Arc<dyn NodeCache>,
    input: OnceLock<Option<Key>>,
    outputs: Box<[OnceLock<Option<Key>>]>,
    /// By slot: whether a hit there may leave its output unread until a node that runs reads
    /// it ([`deferrable`]).
    deferrable: Box<[bool]>,
}

impl RunKeys {
    /// Identities for a run of `program`, none known yet.
    pub(crate) fn new(cache: Arc<dyn NodeCache>, program: &Program) -> Self {
        RunKeys {
            cache,
            input: OnceLock::new(),
            outputs: (0..program.len()).map(|_| OnceLock::new()).collect(),
            deferrable: deferrable(program),
        }
    }

    /// Whether a hit in `slot` may leave its output unread: what reads it is nodes alone, which
    /// read it when they run.
    pub(crate) fn deferrable(&self, slot: usize) -> bool {
        self.deferrable.get(slot).copied().unwrap_or(false)
    }

    /// The key of `step`'s node `id`, fingerprinted `fingerprint`, placed where it is, on what
    /// it reads: `None` when one of its inputs has no identity. The run's input is digested
    /// once, by its first root.
    pub(crate) fn key_of(
        &self,
        id: &NodeId,
        fingerprint: &Key,
        step: &Step,
        input: &Value,
    ) -> Option<Key> {
        let mut hasher = node_hasher(id, fingerprint, step);
        let read = |read: &Read| self.outputs[read.slot()].get().copied().flatten();
        match &step.from {
            Reads::Input => {
                // Taken outside the cell's lock: the digest may call into the embedder (Python,
                // which lets go of its lock to wait), and a branch that waited on this cell
                // holding that lock would wait for ever. Two branches may both take it; the
                // first kept wins, and it is the same.
                if self.input.get().is_none() {
                    let _ = self.input.set(self.cache.digest_input(id, input));
                }
                let digest = self.input.get().expect("set just now").as_ref()?;
                hasher.update(b"input");
                hasher.update(digest.as_bytes());
            }
            Reads::One(one) => {
                hasher.update(b"one");
                hasher.update(read(one)?.as_bytes());
            }
            Reads::Many(joined) => {
                hasher.update(b"many");
                hasher.update(&(joined.reads.len() as u64).to_le_bytes());
                for (source, one) in &joined.reads {
                    let name = source.as_str().as_bytes();
                    hasher.update(&(name.len() as u64).to_le_bytes());
                    hasher.update(name);
                    hasher.update(read(one)?.as_bytes());
                }
            }
        }
        Some(Key::from_bytes(*hasher.finalize().as_bytes()))
    }

    /// The key of `step`'s node `id`, fingerprinted `fingerprint`, called on `value` rather than
    /// on what the step reads: a loop's predicate on an iteration's output. `None` when
    /// `value` has no digest.
    pub(crate) fn key_on(
        &self,
        id: &NodeId,
        fingerprint: &Key,
        step: &Step,
        value: &Value,
    ) -> Option<Key> {
        let digest = self.cache.digest(value)?;
        let mut hasher = node_hasher(id, fingerprint, step);
        // Apart from any key `key_of` makes: what it reads is no step's value.
        hasher.update(b"on a value");
        hasher.update(digest.as_bytes());
        Some(Key::from_bytes(*hasher.finalize().as_bytes()))
    }

    /// Records the identity of the value in `slot`, once its step is done.
    pub(crate) fn settle(&self, slot: usize, identity: Option<Key>) {
        // A slot is written only by its own step, once a run.
        let _ = self.outputs[slot].set(identity);
    }
}

/// By slot: whether the output of a hit there may be left unread until a node that runs reads
/// it — the output of a sync node that is no leaf of `program` (the result is read) and that
/// no step that decides reads (a `Map`, `Switch` or `Loop` hands its input to what it runs,
/// which the executor does not look into). Every other output is read when found. Walked from
/// a stack: any nesting costs no stack.
fn deferrable(program: &Program) -> Box<[bool]> {
    let mut deferrable = vec![false; program.len()];
    let mut deciders: Vec<&Step> = Vec::new();
    let mut pending = vec![&program.root];
    while let Some(op) = pending.pop() {
        match op {
            Op::Empty => {}
            Op::Execute(step) => deferrable[step.slot()] = !step.is_async(),
            Op::Sequence { steps, .. } => pending.extend(steps.iter()),
            Op::Wave { branches, .. } => pending.extend(branches.iter()),
            Op::Map(map) => deciders.push(&map.step),
            Op::Switch(switch) => deciders.push(&switch.step),
            Op::Loop(repeat) => deciders.push(&repeat.step),
        }
    }
    for step in deciders {
        match &step.from {
            Reads::Input => {}
            Reads::One(one) => deferrable[one.slot()] = false,
            Reads::Many(joined) => {
                for (_, one) in &joined.reads {
                    deferrable[one.slot()] = false;
                }
            }
        }
    }
    for &leaf in &program.leaves {
        deferrable[leaf] = false;
    }
    deferrable.into()
}
