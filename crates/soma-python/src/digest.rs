//! `soma._soma.Hasher` and `soma._soma.blake3`: BLAKE3 over bytes and buffers, for the keys of
//! `soma.Cache`.
//!
//! A numpy array (any object with the buffer protocol) is read where it lies — no copy, no
//! pickle — and a large one with the GIL released, so other threads run while it is hashed.
//! `blake3` of a large buffer hashes subtrees of BLAKE3's tree on a few scoped threads at once
//! and merges them: the same digest as on one thread, in a fraction of the time.
//!
//! A numpy array of objects holding text is read in `text.rs`.

use std::sync::{Mutex, PoisonError};
use std::thread;

use ::blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// From this size on, a buffer is hashed with the GIL released: below, releasing and taking it
/// back costs more than the hashing.
const DETACH_FROM_BYTES: usize = 64 * 1024;

/// From this size on, `blake3` splits a buffer between threads: below, starting a thread costs
/// more than it saves. Best of 60 calls on a 2-core machine with a core free, one thread against
/// two: 1 MiB 157 against 166–183 µs, 2 MiB 318 against 239–269, 4 MiB 640 against 415–422,
/// 7.6 MiB (a million float64s, a column) 1,229–1,301 against 738–803. A machine with no core
/// free makes the split cost more (1 MiB 158 against 217 µs): it is not made below 2 MiB.
const SPLIT_FROM_BYTES: usize = 2 << 20;

/// The most threads one `blake3` call hashes on, its own included.
const MOST_THREADS: usize = 8;

/// Runs `read` on the bytes of `data` (bytes, or a C-contiguous buffer read in place), with the
/// GIL released when they are many.
pub(crate) fn with_bytes(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    read: impl FnOnce(&[u8]) + Send,
) -> PyResult<()> {
    if let Ok(bytes) = data.cast::<PyBytes>() {
        let bytes = bytes.as_bytes();
        if bytes.len() < DETACH_FROM_BYTES {
            read(bytes);
            return Ok(());
        }
    }
    let buffer = PyUntypedBuffer::get(data)?;
    if !buffer.is_c_contiguous() {
        return Err(PyBufferError::new_err(
            "the buffer is not C-contiguous\nhint: hash `numpy.ascontiguousarray(array)`",
        ));
    }
    let (at, len) = (buffer.buf_ptr() as usize, buffer.len_bytes());
    let read = move || {
        // SAFETY: `buffer` holds the exporter's buffer for as long as it lives, which is past
        // this call, and it is C-contiguous: `len` bytes from `at` are the exporter's memory,
        // readable. Another thread may write that memory meanwhile (the GIL may be released),
        // as it may under any C extension that reads a buffer without the GIL; bytes read then
        // are some mix of old and new, which makes the digest stale: `u8` has no invalid value.
        #[allow(unsafe_code)]
        let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
        read(bytes);
    };
    if len >= DETACH_FROM_BYTES {
        crate::exit::detach(py, read);
    } else {
        read();
    }
    buffer.release(py);
    Ok(())
}

/// An incremental BLAKE3 hash: `update` with bytes or buffers, then `digest`.
#[pyclass(module = "soma._soma", frozen)]
pub struct Hasher {
    state: Mutex<::blake3::Hasher>,
}

#[pymethods]
impl Hasher {
    #[new]
    fn new() -> Self {
        Hasher {
            state: Mutex::new(::blake3::Hasher::new()),
        }
    }

    /// Feeds `data`: `bytes`, or any C-contiguous buffer (a numpy array, a `memoryview`), read
    /// in place.
    fn update(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        with_bytes(py, data, |bytes| {
            self.hasher().update(bytes);
        })
    }

    /// The 32-byte digest of everything fed so far.
    fn digest<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.hasher().finalize().as_bytes())
    }
}

impl Hasher {
    fn hasher(&self) -> std::sync::MutexGuard<'_, ::blake3::Hasher> {
        // Updating never panics midway: a poisoned lock still holds a whole state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The chaining value of the subtree `input`, which starts `offset` bytes into the whole: split
/// at BLAKE3's own boundary between a left and a right subtree, the left on a scoped thread of
/// its own while this one hashes the right, as long as `spare` threads are left to start.
fn subtree(input: &[u8], offset: u64, spare: usize) -> ChainingValue {
    let whole = || {
        ::blake3::Hasher::new()
            .set_input_offset(offset)
            .update(input)
            .finalize_non_root()
    };
    if spare == 0 || input.len() < SPLIT_FROM_BYTES {
        return whole();
    }
    let (left, right) = split(input);
    let right_offset = offset + left.len() as u64;
    let (for_left, for_right) = ((spare - 1) / 2, (spare - 1) - (spare - 1) / 2);
    match both(
        || subtree(left, offset, for_left),
        || subtree(right, right_offset, for_right),
    ) {
        Some((left, right)) => merge_subtrees_non_root(&left, &right, Mode::Hash),
        None => whole(),
    }
}

/// `input` cut where BLAKE3's tree cuts it: a left subtree of a power of two chunks, the rest.
fn split(input: &[u8]) -> (&[u8], &[u8]) {
    let at = usize::try_from(left_subtree_len(input.len() as u64))
        .expect("a left part shorter than the input");
    input.split_at(at)
}

/// `left()` on a scoped thread while this one runs `right()`; `None`, neither run, when no
/// thread could be started (the caller then does both alone). Also what `write_hashed` writes
/// an entry and hashes it at once with (`hashed_write.rs`).
pub(crate) fn both<L: Send, R>(
    left: impl FnOnce() -> L + Send,
    right: impl FnOnce() -> R,
) -> Option<(L, R)> {
    thread::scope(|scope| {
        let started = thread::Builder::new().spawn_scoped(scope, left).ok()?;
        let right = right();
        let left = started
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        Some((left, right))
    })
}

/// The BLAKE3 digest of `input`, its subtrees on up to [`MOST_THREADS`] threads.
fn digest_of(input: &[u8]) -> [u8; 32] {
    if input.len() < SPLIT_FROM_BYTES {
        return *::blake3::hash(input).as_bytes();
    }
    // Asked only here: it reads the process's CPU quota from files, tens of microseconds.
    let threads = thread::available_parallelism().map_or(1, usize::from);
    let spare = threads.min(MOST_THREADS) - 1;
    if spare == 0 {
        return *::blake3::hash(input).as_bytes();
    }
    let (left, right) = split(input);
    let right_offset = left.len() as u64;
    let (for_left, for_right) = ((spare - 1) / 2, (spare - 1) - (spare - 1) / 2);
    match both(
        || subtree(left, 0, for_left),
        || subtree(right, right_offset, for_right),
    ) {
        Some((left, right)) => *merge_subtrees_root(&left, &right, Mode::Hash).as_bytes(),
        None => *::blake3::hash(input).as_bytes(),
    }
}

/// The 32-byte BLAKE3 digest of `data` (bytes or a C-contiguous buffer, read in place); a large
/// one hashed on several threads, the same digest as on one.
#[pyfunction]
pub fn blake3<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let mut digest = [0_u8; 32];
    with_bytes(py, data, |bytes| digest = digest_of(bytes))?;
    Ok(PyBytes::new(py, &digest))
}
