//! `soma._soma.Hasher` and `soma._soma.blake3`: BLAKE3 over bytes and buffers, for the keys of
//! `soma.Cache`.
//!
//! A numpy array (any object with the buffer protocol) is read where it lies — no copy, no
//! pickle — and a large one with the GIL released, so other threads run while it is hashed.

use std::sync::{Mutex, PoisonError};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// From this size on, a buffer is hashed with the GIL released: below, releasing and taking it
/// back costs more than the hashing.
const DETACH_FROM_BYTES: usize = 64 * 1024;

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
        if let Ok(bytes) = data.cast::<PyBytes>() {
            let bytes = bytes.as_bytes();
            if bytes.len() < DETACH_FROM_BYTES {
                self.hasher().update(bytes);
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
        let read = || {
            // SAFETY: `buffer` holds the exporter's buffer for as long as it lives, which is
            // past this call, and it is C-contiguous: `len` bytes from `at` are the exporter's
            // memory, readable. Another thread may write that memory meanwhile (the GIL may be
            // released); bytes read then are some mix of old and new, which makes the digest
            // stale, never the read invalid: `u8` has no invalid value.
            #[allow(unsafe_code)]
            let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, len) };
            self.hasher().update(bytes);
        };
        if len >= DETACH_FROM_BYTES {
            py.detach(read);
        } else {
            read();
        }
        buffer.release(py);
        Ok(())
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

/// The 32-byte BLAKE3 digest of `data` (bytes or a C-contiguous buffer, read in place).
#[pyfunction]
pub fn blake3<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let hasher = Hasher::new();
    hasher.update(py, data)?;
    Ok(hasher.digest(py))
}
