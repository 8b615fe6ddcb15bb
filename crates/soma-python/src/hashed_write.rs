//! `soma._soma.write_hashed`: a folder cache entry's payload written to its file while the same
//! bytes are hashed (BLAKE3), the GIL released.
//!
//! Writing an entry and checksumming it read the same bytes and need nothing of each other, so
//! a large payload is hashed on a second thread while this one writes it: the entry costs about
//! the longer of the two rather than their sum (the pipeline of `benches/python/cache.py`
//! writes 246 MB on its first run). The payload's pieces are read where they lie — the pickle,
//! padding, and the output's own buffers (numpy's, Arrow's) — never joined into one copy. A
//! small payload stays on the calling thread: starting a thread would cost more than it saves.
//! What the bytes mean (the entry's head, its record, where the payload begins) is the cache's
//! (`python/soma/cache/_cache.py`); this module only writes and hashes.

use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyOSError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// From this many bytes on, the payload is hashed on a second thread while this one writes it:
/// below, starting the thread costs more than the overlap saves. Measured on 2026-12-07 (one
/// buffer written into a new file in `/tmp`, best of 300, load 1.4 to 1.7): one thread against
/// two, 16 KiB 16 against 44 µs, 256 KiB 83–91 against 90, 512 KiB 157 against 126–138, 1 MiB
/// 301–306 against 209.
const SECOND_THREAD_FROM_BYTES: usize = 256 << 10;

/// Writes `pieces` (bytes or C-contiguous buffers, read in place), one after the other, into
/// the existing file at `path` from byte `at` on, and returns the 32-byte BLAKE3 digest of
/// those bytes; a large payload hashed on a second thread while it is written. Raises `OSError`
/// when the file cannot be opened or written (the bytes written so far are left: the caller
/// removes the file).
#[pyfunction]
pub fn write_hashed<'py>(
    py: Python<'py>,
    path: PathBuf,
    at: u64,
    pieces: &Bound<'py, PyList>,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut buffers = Vec::with_capacity(pieces.len());
    for piece in pieces.iter() {
        let buffer = PyUntypedBuffer::get(&piece)?;
        if !buffer.is_c_contiguous() {
            buffer.release(py);
            for held in buffers {
                PyUntypedBuffer::release(held, py);
            }
            return Err(PyBufferError::new_err(
                "a piece of the payload is not C-contiguous",
            ));
        }
        buffers.push(buffer);
    }
    let spans: Vec<(usize, usize)> = buffers
        .iter()
        .map(|buffer| (buffer.buf_ptr() as usize, buffer.len_bytes()))
        .collect();
    let outcome = crate::exit::detach(py, move || {
        let pieces: Vec<&[u8]> = spans
            .iter()
            .map(|&(start, len)| {
                if len == 0 {
                    return &[][..];
                }
                // SAFETY: each buffer in `buffers` holds its exporter's memory until it is
                // released, after this closure returns, and is C-contiguous: `len` bytes from
                // `start` are readable. Another thread may write that memory meanwhile (the GIL
                // is released), as under any C extension that reads a buffer without it; the
                // bytes read are then some mix of old and new (`u8` has no invalid value), and
                // an entry whose written bytes differ from those hashed is found corrupted when
                // read, and computed again.
                #[allow(unsafe_code)]
                let bytes = unsafe { std::slice::from_raw_parts(start as *const u8, len) };
                bytes
            })
            .collect();
        write_and_hash(&path, at, &pieces)
    });
    for buffer in buffers {
        buffer.release(py);
    }
    match outcome {
        Ok(digest) => Ok(PyBytes::new(py, &digest)),
        Err(error) => Err(os_error(&error)),
    }
}

/// `error` as Python's own `OSError` for it: its errno (which picks the subclass, as
/// `FileNotFoundError`) and the system's words for it alone, as a write from Python says them
/// (the cache's warning quotes them), not followed by Rust's "(os error N)".
fn os_error(error: &io::Error) -> PyErr {
    let text = error.to_string();
    match error.raw_os_error() {
        Some(code) => {
            let words = text
                .strip_suffix(&format!(" (os error {code})"))
                .unwrap_or(&text);
            PyOSError::new_err((code, words.to_owned()))
        }
        None => PyOSError::new_err(text),
    }
}

/// Writes `pieces` into `path` from byte `at` on and hashes them: on two threads when they are
/// many bytes and a thread can be started, else on this one.
fn write_and_hash(path: &Path, at: u64, pieces: &[&[u8]]) -> io::Result<[u8; 32]> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(at))?;
    let hash = || {
        let mut hasher = ::blake3::Hasher::new();
        for piece in pieces {
            hasher.update(piece);
        }
        *hasher.finalize().as_bytes()
    };
    let mut write = || pieces.iter().try_for_each(|piece| file.write_all(piece));
    let total: usize = pieces.iter().map(|piece| piece.len()).sum();
    if total >= SECOND_THREAD_FROM_BYTES {
        if let Some((digest, written)) = crate::digest::both(hash, &mut write) {
            return written.map(|()| digest);
        }
    }
    write()?;
    Ok(hash())
}
