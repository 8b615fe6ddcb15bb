//! `soma._soma.Hasher` and `soma._soma.blake3`: BLAKE3 over bytes and buffers, for the keys of
//! `soma.Cache`.
//!
//! A numpy array (any object with the buffer protocol) is read where it lies — no copy, no
//! pickle — and a large one with the GIL released, so other threads run while it is hashed.
//! `blake3` of a large buffer hashes subtrees of BLAKE3's tree on a few scoped threads at once
//! and merges them: the same digest as on one thread, in a fraction of the time.
//!
//! `soma._soma.text_column`: the digest of a numpy array of objects holding text (a pandas
//! `object` or `str` column, whose values lie in one), read here from the array's pointers —
//! each string's UTF-8 as Python keeps it — where digesting it in Python cost three calls an
//! element (1.3 s for a million rows).

use std::sync::{Mutex, PoisonError};
use std::thread;

use ::blake3::hazmat::{
    left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, ChainingValue, HasherExt, Mode,
};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyType};

/// From this size on, a buffer is hashed with the GIL released: below, releasing and taking it
/// back costs more than the hashing.
const DETACH_FROM_BYTES: usize = 64 * 1024;

/// From this size on, `blake3` splits a buffer between threads: below, starting a thread costs
/// more than it saves.
const SPLIT_FROM_BYTES: usize = 8 << 20;

/// The most threads one `blake3` call hashes on, its own included.
const MOST_THREADS: usize = 8;

/// Runs `read` on the bytes of `data` (bytes, or a C-contiguous buffer read in place), with the
/// GIL released when they are many.
fn with_bytes(
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

/// `left()` on a scoped thread while this one runs `right()`; `None` when no thread could be
/// started (the caller then hashes alone).
fn both<T: Send>(left: impl FnOnce() -> T + Send, right: impl FnOnce() -> T) -> Option<(T, T)> {
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

/// Derivation context of a text column's digest: no other digest of a key is made with it.
const TEXT_COLUMN_CONTEXT: &str = "soma 2026-12 text column v1";

/// Bytes gathered before they are fed to BLAKE3: feeding each element on its own costs more
/// than the hashing.
const TEXT_BATCH_BYTES: usize = 64 * 1024;

/// `numpy.ndarray`, looked up once; `None` when numpy cannot be imported.
fn numpy_array_type(py: Python<'_>) -> Option<&Bound<'_, PyType>> {
    static NDARRAY: PyOnceLock<Option<Py<PyType>>> = PyOnceLock::new();
    NDARRAY
        .get_or_init(py, || {
            py.import("numpy")
                .and_then(|numpy| numpy.getattr("ndarray"))
                .and_then(|found| Ok(found.cast_into::<PyType>()?.unbind()))
                .ok()
        })
        .as_ref()
        .map(|ndarray| ndarray.bind(py))
}

/// The 32-byte digest of `array`'s elements, in order, when `array` is a C-contiguous
/// one-dimensional `numpy.ndarray` (exactly) of dtype `object` whose every element is exactly
/// a `str`, `None` or a `float` (pandas' missing value); `None` otherwise (a string that is not
/// UTF-8, a lone surrogate, or any other object), and the caller digests it element by
/// element. Each element is fed with a tag of its kind and each string with its length before
/// it, so two columns that differ in content, or split the same characters differently, never
/// feed the same bytes. Its dtype and shape are the caller's to key.
#[pyfunction]
pub fn text_column<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let Some(ndarray) = numpy_array_type(py) else {
        return Ok(None);
    };
    // Exactly an `ndarray`: its `__array_interface__` is numpy's own, which a subclass could
    // answer with any address.
    if !array.get_type().is(ndarray) {
        return Ok(None);
    }
    let dtype = array.getattr(pyo3::intern!(py, "dtype"))?;
    let contiguous: bool = array
        .getattr(pyo3::intern!(py, "flags"))?
        .getattr(pyo3::intern!(py, "c_contiguous"))?
        .extract()?;
    let kind: String = dtype.getattr(pyo3::intern!(py, "kind"))?.extract()?;
    let item_size: usize = dtype.getattr(pyo3::intern!(py, "itemsize"))?.extract()?;
    let dimensions: usize = array.getattr(pyo3::intern!(py, "ndim"))?.extract()?;
    if kind != "O"
        || !contiguous
        || dimensions != 1
        || item_size != std::mem::size_of::<*mut pyo3::ffi::PyObject>()
    {
        return Ok(None);
    }
    let count: usize = array.getattr(pyo3::intern!(py, "size"))?.extract()?;
    let (address, _read_only): (usize, bool) = array
        .getattr(pyo3::intern!(py, "__array_interface__"))?
        .get_item("data")?
        .extract()?;
    let mut hasher = ::blake3::Hasher::new_derive_key(TEXT_COLUMN_CONTEXT);
    hasher.update(&(count as u64).to_le_bytes());
    if count > 0 {
        // SAFETY: `array` is a live, C-contiguous, one-dimensional numpy array of `count`
        // object pointers starting at `address` (numpy's own interface, the type checked
        // exactly above), and it is held by the caller for this call. The GIL is held
        // throughout and no Python code runs below (no call can release it), so no thread can
        // change the array or free an element while they are read.
        #[allow(unsafe_code)]
        let items = unsafe {
            std::slice::from_raw_parts(address as *const *mut pyo3::ffi::PyObject, count)
        };
        if !feed_text(py, items, &mut hasher) {
            return Ok(None);
        }
    }
    Ok(Some(PyBytes::new(py, hasher.finalize().as_bytes())))
}

/// Feeds each of `items` to `hasher` as a tag and its content; `false` at the first element
/// that is not a `str` with a UTF-8 form, `None` or a `float`.
fn feed_text(
    py: Python<'_>,
    items: &[*mut pyo3::ffi::PyObject],
    hasher: &mut ::blake3::Hasher,
) -> bool {
    let mut batch = Vec::with_capacity(TEXT_BATCH_BYTES * 2);
    for &item in items {
        // SAFETY: each pointer is an element of a live object array, read with the GIL held
        // (see `text_column`): NULL (an array numpy has not filled) is refused first, and
        // every other is a live object, which these calls only inspect.
        #[allow(unsafe_code)]
        unsafe {
            if item.is_null() {
                return false;
            }
            if pyo3::ffi::PyUnicode_CheckExact(item) != 0 {
                let mut length: pyo3::ffi::Py_ssize_t = 0;
                let data = pyo3::ffi::PyUnicode_AsUTF8AndSize(item, &raw mut length);
                if data.is_null() {
                    // A lone surrogate: no UTF-8 form. The caller's walk encodes it.
                    drop(PyErr::take(py));
                    return false;
                }
                let Ok(length) = usize::try_from(length) else {
                    return false;
                };
                let text = std::slice::from_raw_parts(data.cast::<u8>(), length);
                batch.push(b's');
                batch.extend_from_slice(&(length as u64).to_le_bytes());
                if text.len() >= TEXT_BATCH_BYTES {
                    hasher.update(&batch);
                    batch.clear();
                    hasher.update(text);
                } else {
                    batch.extend_from_slice(text);
                }
            } else if item == pyo3::ffi::Py_None() {
                batch.push(b'N');
            } else if pyo3::ffi::PyFloat_CheckExact(item) != 0 {
                let value = pyo3::ffi::PyFloat_AsDouble(item);
                batch.push(b'f');
                batch.extend_from_slice(&value.to_bits().to_le_bytes());
            } else {
                return false;
            }
        }
        if batch.len() >= TEXT_BATCH_BYTES {
            hasher.update(&batch);
            batch.clear();
        }
    }
    hasher.update(&batch);
    true
}
