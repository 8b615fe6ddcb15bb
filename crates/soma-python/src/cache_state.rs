//! What a `soma.Cache` shares between the threads of its runs — its entries in memory and its
//! counts — held where no Python lock guards them.
//!
//! A Python lock around them made a convoy as soon as two threads used the cache at once: a
//! thread made to give up the GIL while it held the lock kept every other thread queued on it
//! (see `soma_core::Lru`). Each method here is one call that runs no Python code while it holds
//! its own lock, so it never waits on a thread that is waiting for the GIL.

use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use soma_core::Lru;

/// A memory cache's entries (`soma.cache._cache._Entry`), by key, the least recently used
/// dropped first past the cache's `max_bytes`.
#[pyclass(module = "soma._soma", frozen)]
pub struct MemoryEntries {
    entries: Lru<Py<PyAny>>,
}

#[pymethods]
impl MemoryEntries {
    #[new]
    #[pyo3(signature = (max_bytes))]
    fn new(max_bytes: Option<u64>) -> Self {
        MemoryEntries {
            entries: Lru::new(max_bytes),
        }
    }

    /// The entry under `key`, now the most recently used; `None` when there is none.
    fn used(&self, py: Python<'_>, key: &[u8]) -> Option<Py<PyAny>> {
        self.entries.get(key, |entry, _| entry.clone_ref(py))
    }

    /// The entry under `key`, its last use left as it was; `None` when there is none.
    fn peek(&self, py: Python<'_>, key: &[u8]) -> Option<Py<PyAny>> {
        self.entries.peek(key, |entry| entry.clone_ref(py))
    }

    /// Files `entry`, of `size` bytes, under `key`, dropping the least recently used others
    /// until the rest fit: whether it was kept (not when it alone is larger than the bound),
    /// and how many it dropped.
    fn put(&self, key: &[u8], entry: Py<PyAny>, size: u64) -> (bool, usize) {
        let inserted = self.entries.insert(key, entry, size);
        // Freed here, the entries' lock let go: freeing runs Python's deallocators.
        drop(inserted.released);
        (inserted.kept, inserted.evicted)
    }

    fn __len__(&self) -> usize {
        self.entries.len()
    }
}

/// The names of [`CacheCounts`]' counts, in the order `read` gives them: `soma.CacheStats`'
/// fields.
const COUNTED: usize = 7;

/// What a cache did since it was made (`soma.CacheStats`): each count added to in one call,
/// a hit's three together.
#[pyclass(module = "soma._soma", frozen)]
pub struct CacheCounts {
    counts: Mutex<[f64; COUNTED]>,
}

#[pymethods]
impl CacheCounts {
    #[new]
    fn new() -> Self {
        CacheCounts {
            counts: Mutex::new([0.0; COUNTED]),
        }
    }

    /// Adds to the counts; a negative amount takes back what was counted too soon (a hit
    /// whose entry then did not unpickle).
    #[pyo3(signature = (*, hits=0.0, misses=0.0, corrupted=0.0, bytes_read=0.0, bytes_written=0.0, seconds_saved=0.0, evicted=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn add(
        &self,
        hits: f64,
        misses: f64,
        corrupted: f64,
        bytes_read: f64,
        bytes_written: f64,
        seconds_saved: f64,
        evicted: f64,
    ) {
        let more = [
            hits,
            misses,
            corrupted,
            bytes_read,
            bytes_written,
            seconds_saved,
            evicted,
        ];
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        for (count, more) in counts.iter_mut().zip(more) {
            *count += more;
        }
    }

    /// The counts, all read at one moment: hits, misses, corrupted, bytes read, bytes
    /// written, seconds saved, evicted.
    fn read(&self) -> [f64; COUNTED] {
        *self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
