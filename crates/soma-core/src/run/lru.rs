//! `Lru`: entries by key, each of a size, the least recently used dropped first once together
//! they hold more than a bound — a run cache's entries kept in memory by an embedder.
//!
//! Why it is here rather than in the embedder's own language: an embedder with a global
//! interpreter lock that keeps its entries behind a lock of its own (Python's `threading.Lock`
//! around a dict) gets a lock convoy as soon as two threads use it. A thread made to give up
//! the interpreter's lock while it holds the entries' lock leaves every other thread to queue
//! on the entries', each of which hands it on only after waiting for the interpreter's: an
//! `each` over 10,000 small arrays with `soma.Cache()` took 1.6 to 2.2 s on 67 threads, where
//! it takes 0.035 s uncached. Here each operation is one call that runs no code of the
//! embedder's while it holds the lock, so a thread holding the interpreter's lock never waits
//! on this one behind a thread that does not.
//!
//! What an entry holds is the embedder's (`P`): handed out through a closure that sees it under
//! the lock (a reference count taken, say), and handed back when dropped, after the lock is
//! let go, so that freeing it — which may run the embedder's code — happens outside.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

/// Entries by key, the least recently used dropped first past a bound on their total size.
pub struct Lru<P> {
    state: Mutex<State<P>>,
    /// The most their sizes may add up to; `None`: no bound.
    bound: Option<u64>,
}

struct State<P> {
    entries: HashMap<Box<[u8]>, Kept<P>>,
    /// Keys by when each was last used: the first is the least recently used.
    by_use: BTreeMap<u64, Box<[u8]>>,
    /// The next use's mark, later than every mark given.
    next_use: u64,
    /// What the entries' sizes add up to.
    held: u64,
}

struct Kept<P> {
    payload: P,
    size: u64,
    used: u64,
}

/// What [`Lru::insert`] did: whether the entry was kept (one larger than the bound is not),
/// how many others it dropped to make room, and what it let go of — the entry it replaced,
/// those it dropped, or the one it could not keep — for the caller to free outside the lock.
pub struct Inserted<P> {
    /// Whether the entry is kept: not when it alone is larger than the bound.
    pub kept: bool,
    /// How many other entries were dropped to make room for it.
    pub evicted: usize,
    /// What was let go of: the entry replaced, those dropped, or the one not kept.
    pub released: Vec<P>,
}

impl<P> Lru<P> {
    /// An empty one whose entries' sizes add up to `bound` at most (`None`: no bound).
    pub fn new(bound: Option<u64>) -> Self {
        Lru {
            state: Mutex::new(State {
                entries: HashMap::new(),
                by_use: BTreeMap::new(),
                next_use: 0,
                held: 0,
            }),
            bound,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<P>> {
        // Every operation leaves the state whole before anything that could panic: a panic
        // in a caller's closure leaves it as it was.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What `read` makes of the entry under `key` and its size, marking it used now; `None`
    /// when there is none.
    pub fn get<R>(&self, key: &[u8], read: impl FnOnce(&P, u64) -> R) -> Option<R> {
        let mut state = self.lock();
        let state = &mut *state;
        let kept = state.entries.get_mut(key)?;
        let now = state.next_use;
        state.next_use += 1;
        let key = state
            .by_use
            .remove(&kept.used)
            .expect("each entry is in the order of use");
        kept.used = now;
        state.by_use.insert(now, key);
        Some(read(&kept.payload, kept.size))
    }

    /// What `read` makes of the entry under `key`, leaving when it was last used as it was;
    /// `None` when there is none.
    pub fn peek<R>(&self, key: &[u8], read: impl FnOnce(&P) -> R) -> Option<R> {
        self.lock().entries.get(key).map(|kept| read(&kept.payload))
    }

    /// Files `payload`, of `size`, under `key`, as the most recently used, in place of what was
    /// there; then drops the least recently used others until the rest fit the bound. An entry
    /// larger than the bound is not kept, and the others stay.
    pub fn insert(&self, key: &[u8], payload: P, size: u64) -> Inserted<P> {
        if self.bound.is_some_and(|bound| size > bound) {
            return Inserted {
                kept: false,
                evicted: 0,
                released: vec![payload],
            };
        }
        let mut released = Vec::new();
        let mut state = self.lock();
        let state = &mut *state;
        let used = state.next_use;
        state.next_use += 1;
        let key: Box<[u8]> = key.into();
        if let Some(old) = state.entries.insert(
            key.clone(),
            Kept {
                payload,
                size,
                used,
            },
        ) {
            state.by_use.remove(&old.used);
            state.held -= old.size;
            released.push(old.payload);
        }
        state.by_use.insert(used, key);
        state.held += size;
        let mut evicted = 0;
        while self.bound.is_some_and(|bound| state.held > bound) {
            // The newest fits alone, so the oldest is another until the rest fit.
            let Some((_, oldest)) = state.by_use.pop_first() else {
                break;
            };
            if let Some(dropped) = state.entries.remove(&oldest) {
                state.held -= dropped.size;
                released.push(dropped.payload);
                evicted += 1;
            }
        }
        Inserted {
            kept: true,
            evicted,
            released,
        }
    }

    /// How many entries it holds.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What its entries' sizes add up to.
    pub fn held(&self) -> u64 {
        self.lock().held
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Lru;

    /// One operation of a property's sequence: on one of four keys.
    #[derive(Clone, Debug)]
    enum Op {
        Insert(u8, u64),
        Get(u8),
        Peek(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4u8, 0..40u64).prop_map(|(key, size)| Op::Insert(key, size)),
            (0..4u8).prop_map(Op::Get),
            (0..4u8).prop_map(Op::Peek),
        ]
    }

    proptest! {
        #[test]
        fn it_keeps_what_a_list_in_order_of_use_cut_from_its_oldest_end_keeps(
            ops in proptest::collection::vec(op(), 0..60),
            bound in proptest::option::of(0..80u64),
        ) {
            let lru = Lru::new(bound);
            // The model: (key, payload, size), the least recently used first.
            let mut model: Vec<(u8, usize, u64)> = Vec::new();
            for (payload, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(key, size) => {
                        let inserted = lru.insert(&[key], payload, size);
                        let fits = bound.is_none_or(|bound| size <= bound);
                        prop_assert_eq!(inserted.kept, fits);
                        if fits {
                            model.retain(|(k, _, _)| *k != key);
                            model.push((key, payload, size));
                            let mut evicted = 0;
                            while bound.is_some_and(|bound| {
                                model.iter().map(|(_, _, size)| size).sum::<u64>() > bound
                            }) {
                                model.remove(0);
                                evicted += 1;
                            }
                            prop_assert_eq!(inserted.evicted, evicted);
                        }
                    }
                    Op::Get(key) => {
                        let at = model.iter().position(|(k, _, _)| *k == key);
                        let found = lru.get(&[key], |payload, size| (*payload, size));
                        prop_assert_eq!(found, at.map(|at| (model[at].1, model[at].2)));
                        if let Some(at) = at {
                            let used = model.remove(at);
                            model.push(used);
                        }
                    }
                    Op::Peek(key) => {
                        let found = model.iter().find(|(k, _, _)| *k == key).map(|e| e.1);
                        prop_assert_eq!(lru.peek(&[key], |payload| *payload), found);
                    }
                }
                prop_assert_eq!(lru.len(), model.len());
                prop_assert_eq!(lru.held(), model.iter().map(|(_, _, size)| size).sum::<u64>());
            }
        }
    }

    #[test]
    fn an_entry_used_since_outlives_one_filed_after_it() {
        let lru = Lru::new(Some(30));
        lru.insert(b"a", 'a', 10);
        lru.insert(b"b", 'b', 10);
        lru.insert(b"c", 'c', 10);
        assert_eq!(lru.get(b"a", |p, _| *p), Some('a'));
        let inserted = lru.insert(b"d", 'd', 10);
        assert_eq!((inserted.kept, inserted.evicted), (true, 1));
        assert_eq!(inserted.released, vec!['b']);
        assert_eq!(lru.peek(b"b", |p| *p), None);
        assert_eq!(lru.held(), 30);
    }

    #[test]
    fn a_peek_leaves_the_order_of_use_as_it_was() {
        let lru = Lru::new(Some(20));
        lru.insert(b"a", 1, 10);
        lru.insert(b"b", 2, 10);
        assert_eq!(lru.peek(b"a", |p| *p), Some(1));
        assert_eq!(lru.insert(b"c", 3, 10).released, vec![1]);
    }

    #[test]
    fn an_entry_larger_than_the_bound_is_handed_back_and_the_others_stay() {
        let lru = Lru::new(Some(15));
        lru.insert(b"a", 1, 10);
        let inserted = lru.insert(b"big", 2, 16);
        assert_eq!((inserted.kept, inserted.evicted), (false, 0));
        assert_eq!(inserted.released, vec![2]);
        assert_eq!((lru.len(), lru.held()), (1, 10));
    }

    #[test]
    fn an_entry_filed_again_replaces_the_old_one_and_its_size() {
        let lru = Lru::new(None);
        lru.insert(b"a", 1, 10);
        let inserted = lru.insert(b"a", 2, 4);
        assert_eq!((inserted.evicted, inserted.released), (0, vec![1]));
        assert_eq!((lru.len(), lru.held()), (1, 4));
        assert_eq!(lru.get(b"a", |p, size| (*p, size)), Some((2, 4)));
    }
}
