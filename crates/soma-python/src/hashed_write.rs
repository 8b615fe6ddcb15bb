//! `soma._soma.write_hashed` and `soma._soma.xxh3_128`: a folder cache entry's payload written
//! to its file while the same bytes are checksummed, the GIL released; and the checksums such a
//! payload may carry.
//!
//! Writing an entry and checksumming it read the same bytes and need nothing of each other, so
//! a large payload is checksummed on a second thread while this one writes it: the entry costs
//! about the longer of the two rather than their sum (the pipeline of
//! `benches/python/cache.py` writes 246 MB on its first run). The payload's pieces are read
//! where they lie — the pickle, padding, and the output's own buffers (numpy's, Arrow's) — never
//! joined into one copy. A small payload stays on the calling thread: starting a thread would
//! cost more than it saves.
//!
//! Two checksums ([`Checksum`]): BLAKE3 where a seal covers the checksum, which must then be
//! one nobody can forge bytes to; XXH3-128 where it only finds damage, about four times as fast
//! (240 MB: 17 against 70 ms on one thread, 2026-12-07), which made the write wait for the
//! checksum no more. What the bytes mean (the entry's head, its record, which checksum its mark
//! names, where the payload begins) is the cache's (`python/soma/cache/_cache.py`); this module
//! only writes and checksums.

use std::fs::OpenOptions;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use xxhash_rust::xxh3::Xxh3;

/// From this many bytes on, the payload is hashed on a second thread while this one writes it:
/// below, starting the thread costs more than the overlap saves. Measured on 2026-12-07 (one
/// buffer written into a new file in `/tmp`, best of 300, load 1.4 to 1.7): one thread against
/// two, 16 KiB 16 against 44 µs, 256 KiB 83–91 against 90, 512 KiB 157 against 126–138, 1 MiB
/// 301–306 against 209.
const SECOND_THREAD_FROM_BYTES: usize = 256 << 10;

/// Writes `pieces` (bytes or C-contiguous buffers, read in place), one after the other, into
/// the existing file at `path` from byte `at` on, and returns the `checksum` of those bytes
/// (`"blake3"` or `"xxh3"`, see [`Checksum`]); a large payload checksummed on a second thread
/// while it is written. Raises `OSError` when the file cannot be opened or written (the bytes
/// written so far are left: the caller removes the file), `ValueError` for another checksum.
#[pyfunction]
pub fn write_hashed<'py>(
    py: Python<'py>,
    path: PathBuf,
    at: u64,
    pieces: &Bound<'py, PyList>,
    checksum: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let checksum = Checksum::named(checksum)?;
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
        write_and_hash(&path, at, &pieces, checksum)
    });
    for buffer in buffers {
        buffer.release(py);
    }
    match outcome {
        Ok(digest) => Ok(PyBytes::new(py, digest.as_bytes())),
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

/// Writes `pieces` into `path` from byte `at` on and checksums them: on two threads when they
/// are many bytes and a thread can be started, else on this one.
fn write_and_hash(
    path: &Path,
    at: u64,
    pieces: &[&[u8]],
    checksum: Checksum,
) -> io::Result<Digest> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(at))?;
    let hash = || checksum.of(pieces);
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

/// A checksum a folder cache entry's payload carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Checksum {
    /// BLAKE3 (32 bytes): what a seal covers, which nobody can make other bytes match.
    Blake3,
    /// XXH3-128 (16 bytes, its canonical big-endian form): damage found, at memory speed; no
    /// defence against bytes made to match on purpose, which only a seal gives.
    Xxh3,
}

/// A checksum's bytes, as long as its kind makes them.
enum Digest {
    Blake3([u8; 32]),
    Xxh3([u8; 16]),
}

impl Digest {
    fn as_bytes(&self) -> &[u8] {
        match self {
            Digest::Blake3(bytes) => bytes,
            Digest::Xxh3(bytes) => bytes,
        }
    }
}

impl Checksum {
    /// The checksum Python names `name`.
    fn named(name: &str) -> PyResult<Checksum> {
        match name {
            "blake3" => Ok(Checksum::Blake3),
            "xxh3" => Ok(Checksum::Xxh3),
            other => Err(PyValueError::new_err(format!(
                "no checksum is named `{other}`\nhint: name `blake3` or `xxh3`"
            ))),
        }
    }

    /// The checksum of `pieces`, one after the other, on this thread.
    fn of(self, pieces: &[&[u8]]) -> Digest {
        match self {
            Checksum::Blake3 => {
                let mut hasher = ::blake3::Hasher::new();
                for piece in pieces {
                    hasher.update(piece);
                }
                Digest::Blake3(*hasher.finalize().as_bytes())
            }
            Checksum::Xxh3 => {
                let mut hasher = Xxh3::new();
                for piece in pieces {
                    hasher.update(piece);
                }
                Digest::Xxh3(hasher.digest128().to_be_bytes())
            }
        }
    }
}

/// The 16-byte XXH3-128 checksum of `data` (its canonical big-endian form; see
/// [`Checksum::Xxh3`]): bytes or a C-contiguous buffer, read in place, a large one with the GIL
/// released. BLAKE3's is `soma._soma.blake3`, a large buffer's on several threads.
#[pyfunction]
pub fn xxh3_128<'py>(py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let mut digest = None;
    crate::digest::with_bytes(py, data, |bytes| {
        digest = Some(Checksum::Xxh3.of(&[bytes]));
    })?;
    let digest = digest.expect("`with_bytes` reads the bytes when it returns `Ok`");
    Ok(PyBytes::new(py, digest.as_bytes()))
}
