//! `RunKeys`: the identity of each value one cached run produced, by slot — the digest of its
//! content, or the key its node's output was filed under where it has none — from which each
//! next node's key is chained (see [`crate::run::cache`]).
//!
//! Each slot is written once, by the step that owns it, and read by the steps after it, in its
//! branch or after its wave joined: a `OnceLock` per slot needs no lock and no ordering
//! beyond what the table of values already has.
//!
//! A `Map` or a `Switch` as a whole has a key too ([`RunKeys::decision_key`]): its own node's,
//! and every node of the programs it may run with how they read one another, on what it reads.
//! A rerun finds its output under it from the identity of its input alone, so its input — the
//! list an `each` runs over — is neither read nor digested again; a step edited inside it, or
//! an edited case it did not take, makes that key miss, and the step runs as before, each node
//! it runs looked up on its own.
//!
//! A `Map`'s items are digested once a run: the output of the step it reads (or the input of
//! the program it is in), when a `Map` reads it, is digested with each of its items
//! ([`NodeCache::digest_items`]), and each item run is handed its item's digest as the
//! identity of its input, where before each item was digested again as its run began. Handed
//! only when no node's call ran in the run between the digest and the item run's start
//! ([`Calls`]): a node that may have changed an item in place since has it digested again, as
//! it is when its run begins. Likewise a value passing into or out of a `Switch` or a `Loop`
//! keeps the digest it was given where no call ran between: a switch's output, its case's
//! result, and a loop's iteration's output for its predicate, the digest the program's last node
//! gave it ([`RunKeys::result_digest`]); a case's input and a loop's first iteration's, the
//! digest of what the step read ([`RunKeys::read_digest`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::value::Value;
use crate::run::cache::NodeCache;
use crate::run::program::{Op, Program, Read, Reads, Step};
use std::time::Instant;

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

/// Feeds `text` to `hasher`, its length before it.
fn write_text(hasher: &mut blake3::Hasher, text: &str) {
    hasher.update(&(text.len() as u64).to_le_bytes());
    hasher.update(text.as_bytes());
}

/// The node calls of one run, counted by every [`RunKeys`] of it (the run's own and its steps'
/// bodies'): how many began and how many are under way. Digests taken at one moment are trusted
/// at a later one only when no call ran between them, which the two counts tell: none was under
/// way at the first moment, and the count begun is the same at the second.
#[derive(Default)]
struct Calls {
    begun: AtomicU64,
    running: AtomicU64,
}

/// A node's call under way, counted in its run's [`Calls`] until dropped (returned, failed,
/// unwound, or an async call's future dropped).
pub(crate) struct Calling<'k>(&'k Calls);

impl Drop for Calling<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A digest taken in this run, and the count of calls begun when it was taken, which no call
/// was under way at: it holds while no call began since ([`RunKeys::still`]).
#[derive(Clone, Copy)]
pub(crate) struct Digested {
    digest: Key,
    at: u64,
}

/// The digests of a value's items, and the count of calls begun when they were taken, which
/// no call was running at.
struct Items {
    digests: Box<[Key]>,
    at: u64,
}

/// The identities of one run's values, and the cache they are keyed for.
pub(crate) struct RunKeys {
    pub(crate) cache: Arc<dyn NodeCache>,
    input: OnceLock<Option<Key>>,
    outputs: Box<[OnceLock<Option<Key>>]>,
    /// The run's calls, shared with the bodies of its steps.
    calls: Arc<Calls>,
    /// By slot: whether a `Map` reads it, and so whether its items are digested with it; and
    /// the same for the program's input.
    read_as_items: Box<[bool]>,
    input_read_as_items: bool,
    /// By slot, then for the input: the digests of its items, where they were taken.
    items: Box<[OnceLock<Items>]>,
    input_items: OnceLock<Items>,
    /// By slot: the digest of an output computed in this run, and the count of calls begun
    /// when it was taken, which none was under way at ([`RunKeys::result_digest`]).
    digested: Box<[OnceLock<(Key, u64)>]>,
    /// By slot: whether a hit there may leave its output unread until a node that runs reads
    /// it ([`slots_read`]).
    deferrable: Box<[bool]>,
    /// By slot: the key a decision step there was looked up under and missed, and when it
    /// began, for its output to be filed under when it is written.
    decisions: Box<[OnceLock<(Key, Instant)>]>,
}

/// What each of the `count` item runs of a `Map` step is keyed on, where its digest was taken
/// with its list's ([`RunKeys::items_of`]), for both walks: for items all in flight together,
/// the digests as they all begin, read once (a change one item's run makes to another races
/// with that item's own run, cached or not); for items taken a few at a time, each item's as
/// its run begins, after earlier items' runs, which may have changed it.
pub(crate) struct ItemDigests<'k> {
    keys: Option<&'k RunKeys>,
    step: &'k Step,
    count: usize,
    /// Read once, as they all begin, for items in flight together; `None` otherwise.
    together: Option<&'k [Key]>,
    all_together: bool,
}

impl<'k> ItemDigests<'k> {
    /// The digests for the `count` items of `step`, a `Map` of a run with `keys` (none without
    /// a cache), all `together` in flight or not.
    pub(crate) fn new(
        keys: Option<&'k RunKeys>,
        step: &'k Step,
        count: usize,
        all_together: bool,
    ) -> Self {
        let together = if all_together {
            keys.and_then(|keys| keys.items_of(step, count))
        } else {
            None
        };
        ItemDigests {
            keys,
            step,
            count,
            together,
            all_together,
        }
    }

    /// The digest item `index`'s run is keyed on, when one was taken with the list and still
    /// holds; `None`: its run digests it as it begins.
    pub(crate) fn of(&self, index: usize) -> Option<Key> {
        let digests = if self.all_together {
            self.together
        } else {
            self.keys?.items_of(self.step, self.count)
        };
        digests.map(|digests| digests[index])
    }
}

impl RunKeys {
    /// Identities for a run of `program`, none known yet.
    pub(crate) fn new(cache: Arc<dyn NodeCache>, program: &Program) -> Self {
        Self::of(cache, Arc::default(), program, OnceLock::new())
    }

    /// Identities for a run of `body`, a sub-program of a step of this run (an item, a case, an
    /// iteration), on an input whose identity is `input` when it is known already (an item's
    /// digest, taken with its list's): its calls counted with this run's.
    pub(crate) fn within(&self, body: &Program, input: Option<Key>) -> Self {
        let known = OnceLock::new();
        if let Some(input) = input {
            let _ = known.set(Some(input));
        }
        Self::of(
            Arc::clone(&self.cache),
            Arc::clone(&self.calls),
            body,
            known,
        )
    }

    fn of(
        cache: Arc<dyn NodeCache>,
        calls: Arc<Calls>,
        program: &Program,
        input: OnceLock<Option<Key>>,
    ) -> Self {
        let read = slots_read(program);
        RunKeys {
            cache,
            input,
            outputs: (0..program.len()).map(|_| OnceLock::new()).collect(),
            calls,
            read_as_items: read.as_items,
            input_read_as_items: read.input_as_items,
            items: (0..program.len()).map(|_| OnceLock::new()).collect(),
            input_items: OnceLock::new(),
            digested: (0..program.len()).map(|_| OnceLock::new()).collect(),
            deferrable: read.deferrable,
            decisions: (0..program.len()).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Counts a node's call as under way, in the whole run, until what it answers is dropped:
    /// taken before every call of a node's code in a run with a cache, so that digests taken
    /// before it are not trusted after it ([`RunKeys::items_of`]).
    pub(crate) fn calling(&self) -> Calling<'_> {
        // Under way before begun: a moment that finds none under way and then reads the count
        // begun misses no call that overlaps what follows it (see `quiet`).
        self.calls.running.fetch_add(1, Ordering::SeqCst);
        self.calls.begun.fetch_add(1, Ordering::SeqCst);
        Calling(&self.calls)
    }

    /// The count of calls begun in the run, when no call is under way: what items digested
    /// after it are trusted against. `None` when one is.
    fn quiet(&self) -> Option<u64> {
        let begun = self.calls.begun.load(Ordering::SeqCst);
        (self.calls.running.load(Ordering::SeqCst) == 0).then_some(begun)
    }

    /// The digest of `value`, the output in `slot`, what its readers key on: taken with its
    /// items' digests when a `Map` reads it and no call is under way, and those kept for its
    /// item runs ([`RunKeys::items_of`]).
    pub(crate) fn digest_output(&self, slot: usize, value: &Value) -> Option<Key> {
        let quiet = self.quiet();
        let digest = match quiet {
            Some(at) if self.read_as_items.get(slot).copied().unwrap_or(false) => {
                let (digest, items) = self.cache.digest_items(value);
                if let Some(digests) = items {
                    let _ = self.items[slot].set(Items { digests, at });
                }
                digest
            }
            Some(_) | None => self.cache.digest(value),
        };
        self.note_digested(slot, digest, quiet);
        digest
    }

    /// The digest of `value`, the output of the decision step in `slot`: `digested`, its
    /// result's digest in the program that made it ([`RunKeys::result_digest`]: the same
    /// value, digested where it was computed, nothing run since), where there is one and no
    /// `Map` reads it for its items; otherwise as [`RunKeys::digest_output`] takes it.
    pub(crate) fn digest_decided(
        &self,
        slot: usize,
        value: &Value,
        digested: Option<Key>,
    ) -> Option<Key> {
        match digested {
            Some(digest) if !self.read_as_items.get(slot).copied().unwrap_or(false) => {
                self.note_digested(slot, Some(digest), self.quiet());
                Some(digest)
            }
            Some(_) | None => self.digest_output(slot, value),
        }
    }

    /// Notes `digest`, just taken of the output in `slot` after the moment `quiet` says.
    fn note_digested(&self, slot: usize, digest: Option<Key>, quiet: Option<u64>) {
        if let (Some(digest), Some(at), Some(cell)) = (digest, quiet, self.digested.get(slot)) {
            let _ = cell.set((digest, at));
        }
    }

    /// The digest of what a run of `program` returns, when it is the value of its one leaf,
    /// computed in this run and digested when no call was under way, and no call began since:
    /// what the step that ran it takes rather than digesting the same value again — a switch
    /// as its output's, a loop for its predicate, its next iteration's input and its output —
    /// while it holds still ([`RunKeys::still`]).
    pub(crate) fn result_digest(&self, program: &Program) -> Option<Digested> {
        let [leaf] = &*program.leaves else {
            return None;
        };
        self.still_at(*self.digested.get(*leaf)?.get()?)
    }

    /// The digest of what `step` (a switch, a loop) reads, when it is an output computed in
    /// this run, digested when no call was under way and no call began since: what the program
    /// it runs is keyed on, its input, rather than digesting it again.
    pub(crate) fn read_digest(&self, step: &Step) -> Option<Key> {
        match &step.from {
            Reads::One(one) => {
                let noted = *self.digested.get(one.slot())?.get()?;
                self.still(self.still_at(noted))
            }
            Reads::Input | Reads::Many(_) => None,
        }
    }

    /// `digested`'s digest, when no call began in the run since it was known to hold.
    pub(crate) fn still(&self, digested: Option<Digested>) -> Option<Key> {
        self.still_at((digested?.digest, digested?.at))
            .map(|digested| digested.digest)
    }

    fn still_at(&self, (digest, at): (Key, u64)) -> Option<Digested> {
        (self.calls.begun.load(Ordering::SeqCst) == at).then_some(Digested { digest, at })
    }

    /// The digests of the items of what the `Map` step `step` reads — `count` of them — taken
    /// with its digest, when no node's call began in the run since (nor was under way then):
    /// each the digest of its item as it is now, which its item run is keyed on. `None`
    /// otherwise: each item is digested when its run begins.
    pub(crate) fn items_of(&self, step: &Step, count: usize) -> Option<&[Key]> {
        let items = match &step.from {
            Reads::Input => self.input_items.get(),
            Reads::One(one) => self.items.get(one.slot()).and_then(OnceLock::get),
            Reads::Many(_) => None,
        }?;
        let unchanged = self.calls.begun.load(Ordering::SeqCst) == items.at;
        (unchanged && items.digests.len() == count).then_some(&*items.digests)
    }

    /// The key of the decision step `step` (node `id`) as a whole, on what it reads: its own
    /// node's fingerprint, id and place, then `programs` — a `Map`'s body, a `Switch`'s cases
    /// by their keys — each node in them with its fingerprint, id, place and what it reads, in
    /// plan order. `None` when a node in them is kept out of the cache, or an input has no
    /// identity: the step then runs, its nodes looked up one by one.
    pub(crate) fn decision_key(
        &self,
        id: &NodeId,
        step: &Step,
        programs: &[(&str, &Program)],
        input: &Value,
    ) -> Option<Key> {
        let fingerprint = self.cache.fingerprint(id, &*step.node)?;
        let mut hasher = node_hasher(id, &fingerprint, step);
        hasher.update(b"decision");
        hasher.update(&(programs.len() as u64).to_le_bytes());
        for (label, program) in programs {
            write_text(&mut hasher, label);
            self.shape(&mut hasher, program)?;
        }
        self.reads(&mut hasher, id, step, input)?;
        Some(Key::from_bytes(*hasher.finalize().as_bytes()))
    }

    /// Feeds `program`'s shape to `hasher`: each op in plan order, tagged, and each step's node
    /// by its id, fingerprint, place, slot and what it reads — the programs of steps nested in
    /// it included. From a stack: any nesting costs no stack.
    fn shape(&self, hasher: &mut blake3::Hasher, program: &Program) -> Option<()> {
        enum Pending<'p> {
            Program(&'p Program),
            Op(&'p Program, &'p Op),
        }
        let mut pending = vec![Pending::Program(program)];
        while let Some(next) = pending.pop() {
            let (program, op) = match next {
                Pending::Program(program) => {
                    hasher.update(b"P");
                    hasher.update(&(program.len() as u64).to_le_bytes());
                    hasher.update(&(program.leaves.len() as u64).to_le_bytes());
                    for &leaf in &*program.leaves {
                        hasher.update(&(leaf as u64).to_le_bytes());
                    }
                    pending.push(Pending::Op(program, &program.root));
                    continue;
                }
                Pending::Op(program, op) => (program, op),
            };
            let step_of = |hasher: &mut blake3::Hasher, step: &Step| -> Option<()> {
                let id = &program.ids[step.slot()];
                let fingerprint = self.cache.fingerprint(id, &*step.node)?;
                let node = node_hasher(id, &fingerprint, step).finalize();
                hasher.update(node.as_bytes());
                hasher.update(&(step.slot() as u64).to_le_bytes());
                match &step.from {
                    Reads::Input => {
                        hasher.update(b"i");
                    }
                    Reads::One(one) => {
                        hasher.update(b"o");
                        hasher.update(&(one.slot() as u64).to_le_bytes());
                    }
                    Reads::Many(joined) => {
                        hasher.update(b"m");
                        hasher.update(&(joined.reads.len() as u64).to_le_bytes());
                        for (source, one) in &joined.reads {
                            write_text(hasher, source.as_str());
                            hasher.update(&(one.slot() as u64).to_le_bytes());
                        }
                    }
                }
                Some(())
            };
            match op {
                Op::Empty => {
                    hasher.update(b"E");
                }
                Op::Execute(step) => {
                    hasher.update(b"X");
                    step_of(hasher, step)?;
                }
                Op::Sequence { steps, .. } => {
                    hasher.update(b"S");
                    hasher.update(&(steps.len() as u64).to_le_bytes());
                    pending.extend(steps.iter().rev().map(|op| Pending::Op(program, op)));
                }
                Op::Wave { branches, .. } => {
                    hasher.update(b"W");
                    hasher.update(&(branches.len() as u64).to_le_bytes());
                    pending.extend(branches.iter().rev().map(|op| Pending::Op(program, op)));
                }
                Op::Map(map) => {
                    hasher.update(b"M");
                    step_of(hasher, &map.step)?;
                    pending.push(Pending::Program(&map.body));
                }
                Op::Switch(switch) => {
                    hasher.update(b"C");
                    step_of(hasher, &switch.step)?;
                    hasher.update(&(switch.keys.len() as u64).to_le_bytes());
                    for key in &*switch.keys {
                        write_text(hasher, key);
                    }
                    pending.extend(switch.cases.iter().rev().map(Pending::Program));
                }
                Op::Loop(repeat) => {
                    hasher.update(b"L");
                    step_of(hasher, &repeat.step)?;
                    hasher.update(&repeat.max_iterations.to_le_bytes());
                    pending.push(Pending::Program(&repeat.body));
                }
            }
        }
        Some(())
    }

    /// Notes that the decision step in `slot` missed under `key` and begins now: its output is
    /// filed under it when written ([`RunKeys::decided`]).
    pub(crate) fn deciding(&self, slot: usize, key: Key) {
        let _ = self.decisions[slot].set((key, Instant::now()));
    }

    /// The key the decision step in `slot` missed under, and how long it has run since.
    pub(crate) fn decided(&self, slot: usize) -> Option<(Key, std::time::Duration)> {
        self.decisions
            .get(slot)
            .and_then(OnceLock::get)
            .map(|(key, started)| (*key, started.elapsed()))
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
        self.reads(&mut hasher, id, step, input)?;
        Some(Key::from_bytes(*hasher.finalize().as_bytes()))
    }

    /// Feeds `hasher` the identities of what `step` (of node `id`) reads; `None` when one of
    /// them has none. The run's input is digested once, by its first root.
    fn reads(
        &self,
        hasher: &mut blake3::Hasher,
        id: &NodeId,
        step: &Step,
        input: &Value,
    ) -> Option<()> {
        let read = |read: &Read| self.outputs[read.slot()].get().copied().flatten();
        match &step.from {
            Reads::Input => {
                // Taken outside the cell's lock: the digest may call into the embedder (Python,
                // which lets go of its lock to wait), and a branch that waited on this cell
                // holding that lock would wait for ever. Two branches may both take it; the
                // first kept wins, and it is the same.
                if self.input.get().is_none() {
                    let _ = self.input.set(self.digest_input(id, input));
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
                    write_text(hasher, source.as_str());
                    hasher.update(read(one)?.as_bytes());
                }
            }
        }
        Some(())
    }

    /// The digest of the program's `input`, asked by its first reader `id`: with its items'
    /// when a `Map` reads it and no call is under way, as [`RunKeys::digest_output`] takes an
    /// output's.
    fn digest_input(&self, id: &NodeId, input: &Value) -> Option<Key> {
        let quiet = if self.input_read_as_items {
            self.quiet()
        } else {
            None
        };
        let Some(at) = quiet else {
            return self.cache.digest_input(id, input);
        };
        let (digest, items) = self.cache.digest_input_items(id, input);
        if let Some(digests) = items {
            let _ = self.input_items.set(Items { digests, at });
        }
        digest
    }

    /// The key of `step`'s node `id`, fingerprinted `fingerprint`, called on `value` rather than
    /// on what the step reads: a loop's predicate on an iteration's output, whose digest is
    /// `digested` when the iteration took it already ([`RunKeys::result_digest`]). `None` when
    /// `value` has no digest.
    pub(crate) fn key_on(
        &self,
        id: &NodeId,
        fingerprint: &Key,
        step: &Step,
        (value, digested): (&Value, Option<Key>),
    ) -> Option<Key> {
        let digest = digested.or_else(|| self.cache.digest(value))?;
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
/// it — the output of a node that is no leaf of `program` (the result is read) and that no
/// `Loop` reads (it hands its input to what it runs, which the executor does not look into);
/// a `Map` or a `Switch` reads its input when it runs, not when it is found whole. An async
/// node's output, besides, only when the async walk alone reads it — async nodes and steps
/// that hold one — as a reader walked by the sync walk could not await its node, should its
/// entry be gone when read. Every other output is read when found.
///
/// With it, by slot, whether a `Map` step of `program` (not of the programs inside its steps)
/// reads it, and whether one reads the program's input: what is digested with its items.
/// Walked once, from a stack: any nesting costs no stack.
fn slots_read(program: &Program) -> SlotsRead {
    let mut deferrable = vec![false; program.len()];
    let mut asynchronous = vec![false; program.len()];
    let mut as_items = vec![false; program.len()];
    let mut input_as_items = false;
    // Each reader: its step, whether it is a loop's, whether the sync walk walks it (an op
    // holding no async node).
    let mut readers: Vec<(&Step, bool, bool)> = Vec::new();
    let mut pending = vec![&program.root];
    while let Some(op) = pending.pop() {
        let sync = !op.is_async();
        match op {
            Op::Empty => {}
            Op::Execute(step) => {
                deferrable[step.slot()] = true;
                asynchronous[step.slot()] = step.is_async();
                readers.push((step, false, sync));
            }
            Op::Map(map) => {
                match &map.step.from {
                    Reads::Input => input_as_items = true,
                    Reads::One(one) => as_items[one.slot()] = true,
                    Reads::Many(_) => {}
                }
                readers.push((&map.step, false, sync));
            }
            Op::Switch(switch) => readers.push((&switch.step, false, sync)),
            Op::Loop(repeat) => readers.push((&repeat.step, true, sync)),
            Op::Sequence { steps, .. } => pending.extend(steps.iter()),
            Op::Wave { branches, .. } => pending.extend(branches.iter()),
        }
    }
    for (step, a_loop, sync) in readers {
        let mut read = |one: &Read| {
            if a_loop || (sync && asynchronous[one.slot()]) {
                deferrable[one.slot()] = false;
            }
        };
        match &step.from {
            Reads::Input => {}
            Reads::One(one) => read(one),
            Reads::Many(joined) => {
                for (_, one) in &joined.reads {
                    read(one);
                }
            }
        }
    }
    for &leaf in &program.leaves {
        deferrable[leaf] = false;
    }
    SlotsRead {
        deferrable: deferrable.into(),
        as_items: as_items.into(),
        input_as_items,
    }
}

/// How a program's slots are read ([`slots_read`]).
struct SlotsRead {
    deferrable: Box<[bool]>,
    as_items: Box<[bool]>,
    input_as_items: bool,
}
