//! `NodeCache`: what the executor asks before running a node, so that a run computes only what
//! changed since the last one.
//!
//! A node's key chains, Merkle-fashion, from what can change its output: its own fingerprint
//! (its code and state, as the cache reads them), its id and the device it is placed on (both of
//! which it can read from its `Ctx`), then the identity of each value it reads, in the order it
//! declares them: the digest of its content. The digest of an output is taken once, when its
//! node computes it, and kept in the entry beside it ([`Entry`]), as Bazel's action cache keeps
//! an output's digest: a hit therefore costs no hashing of large outputs, a node whose inputs
//! all hit is keyed, and found, without any of them being computed again — and a node that
//! reruns (edited) but computes the same output as before leaves what reads it hitting ("early
//! cutoff"). A node kept out (no fingerprint) always runs, and what reads it is keyed on the
//! digest of its fresh output. An output without a digest (an `Opaque` one, to
//! [`Key::of_value`]) is identified by its node's key instead; the run's input without a digest
//! leaves the roots unkeyed: they run, uncached.
//!
//! Each output is filed as soon as its node returns, so a run that fails part way keeps what it
//! completed, and the next run calls only the failed node and what comes after it.
//!
//! A hit reads only the entry's digest ([`NodeCache::find`]) when its output is no leaf and is
//! read by nodes alone (no step that decides): the output itself is read when one of those
//! nodes runs, and never when all of them hit — so a fully cached rerun reads the result and
//! nothing else. An entry that cannot be read by then (removed, damaged) is computed again from
//! what its node read, kept for that (see `crate::run::deferred`).
//!
//! The store is behind the trait: [`MemoryCache`] keeps entries in a map; an embedder files
//! them wherever it likes (a folder, Redis, S3) by implementing [`NodeCache`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::model::id::NodeId;
use crate::model::key::Key;
use crate::model::node::Node;
use crate::model::value::Value;

/// What a cache keeps under a key: a node's output, and the digest of its content when it has
/// one ([`NodeCache::digest`]), which the nodes that read it are keyed on.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The output.
    pub value: Value,
    /// The digest of its content, taken when it was computed; `None` when it has none.
    pub digest: Option<Key>,
}

/// An entry found by [`NodeCache::find`]: read already, where reading it cost nothing (an
/// output kept in memory as it is), or not read yet.
pub enum Found {
    /// The entry, its output read.
    Read(Entry),
    /// The entry's digest, and how to read its output when a node that runs needs it.
    Unread(Unread),
}

/// An entry found without its output read ([`Found::Unread`]).
pub struct Unread {
    /// The digest of the output, as filed with it.
    pub digest: Option<Key>,
    /// Reads the output; `None` when it cannot be read whole any more (removed, damaged since
    /// it was found): the executor then computes it again. Called at most once a reader.
    pub read: Box<dyn Fn() -> Option<Value> + Send + Sync>,
}

/// Where the executor looks a node's output up before running it, and files it after.
///
/// Called from whichever thread runs the node, several at once in a wave: an implementation
/// synchronises its own store. None of its methods can fail the run: a store that cannot read
/// an entry answers a miss, one that cannot write drops the entry.
pub trait NodeCache: Send + Sync {
    /// The digest of what `node`'s output depends on besides its inputs — its code, its state —
    /// or `None` to keep it out of the cache: it then always runs, and what reads it is keyed
    /// on the digest of its fresh output. Asked once per run for each node that runs or hits.
    fn fingerprint(&self, id: &NodeId, node: &dyn Node) -> Option<Key>;

    /// The digest of `value`'s content and type, the output a node computed: what the nodes
    /// that read it are keyed on. `None` when the value cannot be read whole: they are keyed on
    /// the key of the node that made it instead. By default [`Key::of_value`].
    fn digest(&self, value: &Value) -> Option<Key> {
        Key::of_value(value)
    }

    /// The digest of the run's input, asked once a run, by the first node `id` that reads it.
    /// `None` when it cannot be read whole: every node that reads it then runs uncached, and so
    /// does what reads them until an output has a digest again — an embedder that can say why
    /// says it here. By default [`NodeCache::digest`].
    fn digest_input(&self, id: &NodeId, input: &Value) -> Option<Key> {
        let _ = id;
        self.digest(input)
    }

    /// [`NodeCache::digest`] of `value`, a node's output that a `Map` reads, and with it the
    /// digest of each of its items as `digest` would make it, when it is a list of items each
    /// with one (`None` otherwise): the `Map`'s item runs are keyed on them rather than each
    /// item digested again. An embedder whose digest walks the list anyway keeps what it found
    /// of each item; the walk over the items is otherwise paid twice. By default, for a
    /// [`Value::List`], its items' [`NodeCache::digest`]s; for anything else, none.
    fn digest_items(&self, value: &Value) -> (Option<Key>, Option<Box<[Key]>>) {
        (self.digest(value), items_digests(self, value))
    }

    /// [`NodeCache::digest_input`] of the run's `input` that a `Map` reads, with its items'
    /// digests as [`NodeCache::digest_items`] gives them. By default the input's digest and,
    /// when it has one, its items' [`NodeCache::digest`]s, for a [`Value::List`].
    fn digest_input_items(&self, id: &NodeId, input: &Value) -> (Option<Key>, Option<Box<[Key]>>) {
        let digest = self.digest_input(id, input);
        (digest, digest.and_then(|_| items_digests(self, input)))
    }

    /// The entry filed under `key` for `id`, or `None`. A store that cannot read an entry
    /// whole (truncated, corrupted, gone) answers `None`: the node runs again.
    fn get(&self, id: &NodeId, key: &Key) -> Option<Entry>;

    /// Files `entry`, `id`'s output, under `key`; `took` is how long computing it took (what a
    /// later hit saves).
    fn put(&self, id: &NodeId, key: &Key, entry: &Entry, took: Duration);

    /// Whether an entry is filed under `key` for `id`, and if so its digest: `Some(digest)`
    /// for one that would be read whole, `None` for none — what
    /// [`Executor::would_hit`](crate::Executor::would_hit) asks, and no lookup counted. By
    /// default [`NodeCache::get`]'s answer, the output dropped; a store that can read an
    /// entry's digest without its output says so here.
    fn peek(&self, id: &NodeId, key: &Key) -> Option<Option<Key>> {
        self.get(id, key).map(|entry| entry.digest)
    }

    /// The entry filed under `key` for `id`, found — a lookup counted as [`NodeCache::get`]
    /// counts it — with its output read ([`Found::Read`]) or not ([`Found::Unread`]: read by
    /// the executor only when a node that runs reads it). By default [`NodeCache::get`]'s
    /// entry, read; a store whose reads cost (a folder, unpickling) answers the digest alone.
    fn find(&self, id: &NodeId, key: &Key) -> Option<Found> {
        self.get(id, key).map(Found::Read)
    }
}

/// The [`NodeCache::digest`] of each item of `value`, a [`Value::List`] whose every item has
/// one; `None` otherwise: what a cache's `digest_items` and `digest_input_items` hand the engine
/// by default.
fn items_digests<C: NodeCache + ?Sized>(cache: &C, value: &Value) -> Option<Box<[Key]>> {
    value
        .as_list()?
        .iter()
        .map(|item| cache.digest(item))
        .collect()
}

/// Fingerprints a node by its id: what a [`MemoryCache`] asks to know whether a node changed.
type Fingerprints = dyn Fn(&NodeId) -> Option<Key> + Send + Sync;

/// A [`NodeCache`] in memory: entries in a map, for as long as it lives. Fingerprints come from
/// a function of the node's id, since the engine cannot read a node's code: an embedder
/// changes what it answers for a node when that node changes.
pub struct MemoryCache {
    fingerprints: Box<Fingerprints>,
    entries: Mutex<HashMap<Key, Entry>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl MemoryCache {
    /// An empty cache that fingerprints nodes with `fingerprints` (`None` keeps one out).
    pub fn new(fingerprints: impl Fn(&NodeId) -> Option<Key> + Send + Sync + 'static) -> Self {
        MemoryCache {
            fingerprints: Box::new(fingerprints),
            entries: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Lookups that found an entry, since the cache was made.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Lookups that found none, since the cache was made.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether it holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl NodeCache for MemoryCache {
    fn fingerprint(&self, id: &NodeId, _node: &dyn Node) -> Option<Key> {
        (self.fingerprints)(id)
    }

    fn get(&self, _id: &NodeId, key: &Key) -> Option<Entry> {
        // A node that panicked while another held the lock left the map whole: entries are
        // inserted in one call.
        let found = self
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned();
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    fn peek(&self, _id: &NodeId, key: &Key) -> Option<Option<Key>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(key).map(|entry| entry.digest)
    }

    fn put(&self, _id: &NodeId, key: &Key, entry: &Entry, _took: Duration) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(*key, entry.clone());
    }
}
