//! Text columns — a numpy array of objects holding strings, as a pandas `object` or `str`
//! column keeps them — read here from the array's pointers: `soma._soma.text_column`, its
//! digest for a cache key, and `soma._soma.text_pack` / `text_unpack`, the form a cache entry
//! keeps one in, where pickle would write and memoize a million strings one by one.
//!
//! Each element is encoded the same way for both: a LEB128 header (a string's UTF-8 length
//! times two; 1 for `None`; 3 for a `float`, its eight bytes after it), then a string's UTF-8.
//! The encoding is prefix-free, so two columns of different content never feed the same bytes.
//!
//! A string is read where `CPython` keeps it — a compact string's characters lie right after its
//! header, one, two or four bytes each (PEP 393) — without a call into the interpreter, so that
//! the digest of a large column is made on a few threads at once while the calling thread holds
//! the GIL: no Python code runs meanwhile, so nothing changes or frees what they read. Where
//! that header lies is not part of the stable ABI: it is found once by reading strings made
//! for the purpose ([`layout`]); where it is not found, strings are read through
//! `PyUnicode_AsUTF8AndSize` on the calling thread, to the same bytes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::thread;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyFloat, PyString, PyTuple, PyType};

/// Derivation context of a text column's digest: no other digest of a key is made with it.
pub(crate) const TEXT_COLUMN_CONTEXT: &str = "soma 2026-12 text column v2";

/// Elements a block holds: a column's digest is made of its blocks' digests, in order, so that
/// blocks can be read on several threads and the digest is the same on any number of them.
pub(crate) const BLOCK: usize = 1 << 14;

/// The most threads one column is read on, the caller's included.
pub(crate) const MOST_THREADS: usize = 8;

/// What a packed column begins with: its format's mark and version.
const PACKED_MARK: &[u8; 4] = b"STC1";

/// Where a compact string's characters begin, in this interpreter: after a `PyASCIIObject` for
/// an ASCII string, after a `PyCompactUnicodeObject` for any other.
#[derive(Clone, Copy)]
struct Layout {
    ascii: usize,
    compact: usize,
}

/// Where a string's length (`Py_ssize_t`) and its state's bit field lie: after the object's
/// header, and after the length and the hash.
const LENGTH_AT: usize = 16;
const STATE_AT: usize = 32;

/// The layouts `CPython` has had on 64-bit machines: 3.12 on (no `wstr`), and 3.11.
const LAYOUTS: [Layout; 2] = [
    Layout {
        ascii: 40,
        compact: 56,
    },
    Layout {
        ascii: 48,
        compact: 72,
    },
];

/// A string's state, as its bit field says: its kind (bytes a character), whether it is
/// compact and whether it is ASCII.
fn state_of(state: u32) -> (usize, bool, bool) {
    (
        ((state >> 2) & 7) as usize,
        (state >> 5) & 1 == 1,
        (state >> 6) & 1 == 1,
    )
}

/// The layout of a compact string in this interpreter, found once: the first of [`LAYOUTS`]
/// under which strings made here of each kind read back as the characters they were made of;
/// `None` when none does (another build, a debug one), and strings are read by calls instead.
fn layout(py: Python<'_>) -> Option<Layout> {
    static FOUND: PyOnceLock<Option<Layout>> = PyOnceLock::new();
    *FOUND.get_or_init(py, || {
        if cfg!(not(target_pointer_width = "64")) || cfg!(not(target_endian = "little")) {
            return None;
        }
        // Long and without a period, so that a wrong offset reads other characters, and so long
        // that every offset tried stays inside the object.
        let samples: Vec<(String, usize, bool)> = [
            ('a', 1, true),
            ('é', 1, false),
            ('ā', 2, false),
            ('😀', 4, false),
        ]
        .into_iter()
        .map(|(first, kind, ascii)| {
            let text: String = std::iter::once(first)
                .chain((0..80_u32).map(|i| char::from(b'0' + (i * 7 % 75) as u8)))
                .collect();
            (text, kind, ascii)
        })
        .collect();
        let strings: Vec<Bound<'_, PyString>> = samples
            .iter()
            .map(|(text, _, _)| PyString::new(py, text))
            .collect();
        LAYOUTS.into_iter().find(|layout| {
            samples
                .iter()
                .zip(&strings)
                .all(|((text, kind, ascii), string)| {
                    let object = string.as_ptr();
                    let units: Vec<u32> = text.chars().map(u32::from).collect();
                    // SAFETY: `object` is a live `str` of 81 characters held above; every offset
                    // read lies inside it under either layout (its header is at most 72 bytes and
                    // the characters compared end 32 bytes before its last, at most 40 + 81 x kind).
                    #[allow(unsafe_code)]
                    unsafe {
                        let base = object.cast::<u8>();
                        let length = base.add(LENGTH_AT).cast::<isize>().read_unaligned();
                        let (found_kind, compact, found_ascii) =
                            state_of(base.add(STATE_AT).cast::<u32>().read_unaligned());
                        if usize::try_from(length).ok() != Some(units.len())
                            || found_kind != *kind
                            || !compact
                            || found_ascii != *ascii
                        {
                            return false;
                        }
                        let at = if *ascii { layout.ascii } else { layout.compact };
                        let compared = units.len() - 32 / kind;
                        (0..compared).all(|i| {
                            let unit = base.add(at + i * kind);
                            let value = match kind {
                                1 => u32::from(unit.read()),
                                2 => u32::from(unit.cast::<u16>().read_unaligned()),
                                _ => unit.cast::<u32>().read_unaligned(),
                            };
                            value == units[i]
                        })
                    }
                })
        })
    })
}

/// Why an element could not be read without the interpreter.
enum Stop {
    /// Not text: the caller walks the column instead.
    Refused,
    /// A string not in compact form (or no layout known): read by a call, on the caller's
    /// thread.
    ByCall,
}

/// An element read: a string's characters as `CPython` keeps them, `None`, or a float's bits.
enum Element<'a> {
    Text {
        kind: usize,
        ascii: bool,
        data: &'a [u8],
    },
    Nothing,
    Float(u64),
}

/// Reads `item` without a call into the interpreter.
///
/// # Safety
/// `item` is NULL or a live object, which nothing changes or frees while the result is used
/// (the GIL is held by the thread that waits for this one, and no Python code runs).
#[allow(unsafe_code)]
unsafe fn element<'a>(
    item: *mut ffi::PyObject,
    layout: Option<Layout>,
) -> Result<Element<'a>, Stop> {
    if item.is_null() {
        return Err(Stop::Refused);
    }
    let kind = ffi::Py_TYPE(item);
    if kind == &raw mut ffi::PyUnicode_Type {
        let Some(layout) = layout else {
            return Err(Stop::ByCall);
        };
        let base = item.cast::<u8>();
        let length = base.add(LENGTH_AT).cast::<isize>().read_unaligned();
        let (width, compact, ascii) = state_of(base.add(STATE_AT).cast::<u32>().read_unaligned());
        let Ok(length) = usize::try_from(length) else {
            return Err(Stop::ByCall);
        };
        if !compact || !matches!(width, 1 | 2 | 4) {
            return Err(Stop::ByCall);
        }
        let at = if ascii { layout.ascii } else { layout.compact };
        let data = std::slice::from_raw_parts(base.add(at), length * width);
        return Ok(Element::Text {
            kind: width,
            ascii,
            data,
        });
    }
    if item == ffi::Py_None() {
        return Ok(Element::Nothing);
    }
    if kind == &raw mut ffi::PyFloat_Type {
        // `PyFloatObject`: the object's header, then its double.
        return Ok(Element::Float(
            item.cast::<u8>().add(16).cast::<u64>().read_unaligned(),
        ));
    }
    Err(Stop::Refused)
}

pub(crate) fn leb128(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends the UTF-8 of `data`, characters of `kind` bytes each, with its header; `Refused` at
/// a lone surrogate, which has no UTF-8 form.
fn push_text(out: &mut Vec<u8>, kind: usize, ascii: bool, data: &[u8]) -> Result<(), Stop> {
    if ascii {
        leb128(out, (data.len() as u64) << 1);
        out.extend_from_slice(data);
        return Ok(());
    }
    let unit = |i: usize| -> u32 {
        match kind {
            1 => u32::from(data[i]),
            2 => u32::from(u16::from_ne_bytes([data[2 * i], data[2 * i + 1]])),
            _ => u32::from_ne_bytes([
                data[4 * i],
                data[4 * i + 1],
                data[4 * i + 2],
                data[4 * i + 3],
            ]),
        }
    };
    let count = data.len() / kind;
    let mut utf8 = 0_u64;
    for i in 0..count {
        let Some(character) = char::from_u32(unit(i)) else {
            return Err(Stop::Refused);
        };
        utf8 += character.len_utf8() as u64;
    }
    leb128(out, utf8 << 1);
    let mut buffer = [0_u8; 4];
    for i in 0..count {
        let character = char::from_u32(unit(i)).ok_or(Stop::Refused)?;
        out.extend_from_slice(character.encode_utf8(&mut buffer).as_bytes());
    }
    Ok(())
}

/// Appends `item`'s encoding; by a call into the interpreter where `py` is given and the
/// string cannot be read in place.
///
/// # Safety
/// As [`element`]; with `py` given, the caller holds the GIL.
#[allow(unsafe_code)]
unsafe fn push_element(
    out: &mut Vec<u8>,
    item: *mut ffi::PyObject,
    layout: Option<Layout>,
    py: Option<Python<'_>>,
) -> Result<(), Stop> {
    match element(item, layout) {
        Ok(Element::Text { kind, ascii, data }) => push_text(out, kind, ascii, data),
        Ok(Element::Nothing) => {
            out.push(1);
            Ok(())
        }
        Ok(Element::Float(bits)) => {
            out.push(3);
            out.extend_from_slice(&bits.to_le_bytes());
            Ok(())
        }
        Err(Stop::ByCall) => match py {
            Some(py) => {
                let data = utf8_by_call(py, item)?;
                leb128(out, (data.len() as u64) << 1);
                out.extend_from_slice(data);
                Ok(())
            }
            None => Err(Stop::ByCall),
        },
        Err(Stop::Refused) => Err(Stop::Refused),
    }
}

/// A string's UTF-8, asked of the interpreter; `Refused` for a lone surrogate.
///
/// # Safety
/// `item` is a live `str`, and the caller holds the GIL.
#[allow(unsafe_code)]
unsafe fn utf8_by_call<'a>(py: Python<'_>, item: *mut ffi::PyObject) -> Result<&'a [u8], Stop> {
    let mut length: ffi::Py_ssize_t = 0;
    let data = ffi::PyUnicode_AsUTF8AndSize(item, &raw mut length);
    if data.is_null() {
        drop(PyErr::take(py));
        return Err(Stop::Refused);
    }
    let length = usize::try_from(length).map_err(|_| Stop::Refused)?;
    Ok(std::slice::from_raw_parts(data.cast::<u8>(), length))
}

/// The digest of one block's elements.
///
/// # Safety
/// As [`push_element`], for each of `items`.
#[allow(unsafe_code)]
unsafe fn block_digest(
    items: &[usize],
    layout: Option<Layout>,
    py: Option<Python<'_>>,
    out: &mut Vec<u8>,
) -> Result<[u8; 32], Stop> {
    out.clear();
    let unicode = (&raw mut ffi::PyUnicode_Type) as usize;
    for (at, &item) in items.iter().enumerate() {
        if let Some(&ahead) = items.get(at + PREFETCH_AHEAD) {
            prefetch(ahead);
        }
        // The common case first, inline: a short compact ASCII string, its header one byte.
        if let Some(layout) = layout {
            let base = item as *const u8;
            if item != 0 && base.add(8).cast::<usize>().read_unaligned() == unicode {
                let state = base.add(STATE_AT).cast::<u32>().read_unaligned();
                let length = base.add(LENGTH_AT).cast::<isize>().read_unaligned();
                // Under 64 characters, twice the length is its LEB128 header, one byte.
                if let Some(length) = u8::try_from(length)
                    .ok()
                    .filter(|length| *length < 64 && state & ASCII_COMPACT == ASCII_COMPACT)
                {
                    let header = length << 1;
                    let length = usize::from(length);
                    out.reserve(length + 1);
                    let end = out.len();
                    let to = out.as_mut_ptr().add(end);
                    to.write(header);
                    copy_short(base.add(layout.ascii), length, to.add(1));
                    out.set_len(end + 1 + length);
                    continue;
                }
            }
        }
        push_element(out, item as *mut ffi::PyObject, layout, py)?;
    }
    Ok(*::blake3::hash(out).as_bytes())
}

/// The bits of a string's state that say it is compact and ASCII.
const ASCII_COMPACT: u32 = (1 << 5) | (1 << 6);

/// Copies `length` bytes from `from` to `to` (which do not overlap) by a few unaligned words
/// for a short run, where a call to `memcpy` costs more than the copy.
///
/// # Safety
/// `length` bytes are readable at `from` and writable at `to`.
#[allow(unsafe_code)]
#[inline]
unsafe fn copy_short(from: *const u8, length: usize, to: *mut u8) {
    match length {
        16.. => std::ptr::copy_nonoverlapping(from, to, length),
        8..=15 => {
            let (head, tail) = (
                from.cast::<u64>().read_unaligned(),
                from.add(length - 8).cast::<u64>().read_unaligned(),
            );
            to.cast::<u64>().write_unaligned(head);
            to.add(length - 8).cast::<u64>().write_unaligned(tail);
        }
        4..=7 => {
            let (head, tail) = (
                from.cast::<u32>().read_unaligned(),
                from.add(length - 4).cast::<u32>().read_unaligned(),
            );
            to.cast::<u32>().write_unaligned(head);
            to.add(length - 4).cast::<u32>().write_unaligned(tail);
        }
        _ => {
            for i in 0..length {
                to.add(i).write(from.add(i).read());
            }
        }
    }
}

/// How many elements ahead a block's reader asks for an object's memory: the objects lie
/// anywhere, and waiting for each in turn is most of the time a column takes.
const PREFETCH_AHEAD: usize = 32;

/// Asks the processor to bring the first two cache lines of the object at `address` (its
/// header, and a short string's characters) closer; it reads nothing and cannot fault.
#[inline]
fn prefetch(address: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults, whatever the address.
    #[allow(unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(address as *const i8);
        _mm_prefetch::<_MM_HINT_T0>(address.wrapping_add(48) as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// What a block's digest came to, on a thread of [`digest_blocks`].
pub(crate) enum Block {
    Digest([u8; 32]),
    /// Left to the caller, to digest on its own thread.
    Left,
    /// Not text: every thread stops, and the column is not digested here.
    Stop,
}

/// Digests `blocks` blocks on this thread and on up to `threads - 1` scoped helpers (fewer
/// where the system refuses one), each thread taking the next block until none is left:
/// `digest(at, scratch)` says what block `at` came to. Each block's digest by index (`None`
/// where left), or `None` when a block stopped them. A helper's panic goes on here.
pub(crate) fn digest_blocks<F>(
    threads: usize,
    blocks: usize,
    digest: F,
) -> Option<Vec<Option<[u8; 32]>>>
where
    F: Fn(usize, &mut Vec<u8>) -> Block + Sync,
{
    let next = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let work = || {
        let mut scratch = Vec::new();
        let mut done = Vec::new();
        loop {
            let at = next.fetch_add(1, Ordering::Relaxed);
            if at >= blocks || stopped.load(Ordering::Relaxed) {
                return done;
            }
            match digest(at, &mut scratch) {
                Block::Digest(found) => done.push((at, found)),
                Block::Left => {}
                Block::Stop => {
                    stopped.store(true, Ordering::Relaxed);
                    return done;
                }
            }
        }
    };
    let finished = thread::scope(|scope| {
        let work = &work;
        let helpers: Vec<_> = (1..threads)
            .filter_map(|_| thread::Builder::new().spawn_scoped(scope, work).ok())
            .collect();
        let mut finished = work();
        for helper in helpers {
            finished.extend(
                helper
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        finished
    });
    if stopped.load(Ordering::Relaxed) {
        return None;
    }
    let mut digests = vec![None; blocks];
    for (at, found) in finished {
        digests[at] = Some(found);
    }
    Some(digests)
}

/// How many threads this process may run at once, asked once (it reads files).
pub(crate) fn parallelism() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| thread::available_parallelism().map_or(1, usize::from))
}

/// `numpy.ndarray` and `numpy.empty`, looked up once; `None` when numpy cannot be imported.
fn numpy(py: Python<'_>) -> Option<(&Bound<'_, PyType>, &Bound<'_, PyAny>)> {
    static NUMPY: PyOnceLock<Option<(Py<PyType>, Py<PyAny>)>> = PyOnceLock::new();
    NUMPY
        .get_or_init(py, || {
            let numpy = py.import("numpy").ok()?;
            let ndarray = numpy.getattr("ndarray").ok()?.cast_into::<PyType>().ok()?;
            let empty = numpy.getattr("empty").ok()?;
            Some((ndarray.unbind(), empty.unbind()))
        })
        .as_ref()
        .map(|(ndarray, empty)| (ndarray.bind(py), empty.bind(py)))
}

/// The pointers of `array` when it is exactly a C-contiguous `numpy.ndarray` of dtype `object`
/// (any shape), as addresses; `None` otherwise.
fn pointers<'a>(py: Python<'_>, array: &'a Bound<'_, PyAny>) -> PyResult<Option<&'a [usize]>> {
    let Some((ndarray, _)) = numpy(py) else {
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
    if kind != "O" || !contiguous || item_size != std::mem::size_of::<usize>() {
        return Ok(None);
    }
    let count: usize = array.getattr(pyo3::intern!(py, "size"))?.extract()?;
    if count == 0 {
        return Ok(Some(&[]));
    }
    let (address, _read_only): (usize, bool) = array
        .getattr(pyo3::intern!(py, "__array_interface__"))?
        .get_item("data")?
        .extract()?;
    // SAFETY: `array` is a live, C-contiguous numpy array of `count` object pointers starting
    // at `address` (numpy's own interface, the type checked exactly above), held by the caller
    // for as long as the slice is borrowed; the GIL is held while it is read, and nothing read
    // from it runs Python code, so no thread changes the array meanwhile.
    #[allow(unsafe_code)]
    let items = unsafe { std::slice::from_raw_parts(address as *const usize, count) };
    Ok(Some(items))
}

/// The 32-byte digest of `array`'s elements, in order, when `array` is a C-contiguous
/// `numpy.ndarray` (exactly) of dtype `object` whose every element is exactly a `str` with a
/// UTF-8 form, `None` or a `float` (pandas' missing value); `None` otherwise, and the caller
/// digests it element by element. Its dtype and shape are the caller's to key. A large column
/// is read on a few threads, each a block at a time, with the GIL held by this one.
#[pyfunction]
pub fn text_column<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let Some(items) = pointers(py, array)? else {
        return Ok(None);
    };
    let layout = layout(py);
    let blocks: Vec<&[usize]> = items.chunks(BLOCK).collect();
    let mut digests: Vec<Option<[u8; 32]>> = vec![None; blocks.len()];
    let threads = if layout.is_some() {
        parallelism().min(MOST_THREADS).min(blocks.len() / 2).max(1)
    } else {
        1
    };
    if threads > 1 {
        let found = digest_blocks(threads, blocks.len(), |at, scratch| {
            // SAFETY: the elements of a live object array, read while the thread that waits
            // for this one holds the GIL and runs no Python code (see `pointers`); no call
            // into the interpreter is made here (no `py`).
            #[allow(unsafe_code)]
            let digest = unsafe { block_digest(blocks[at], layout, None, scratch) };
            match digest {
                Ok(digest) => Block::Digest(digest),
                Err(Stop::ByCall) => Block::Left, // Read below, by calls, on this thread.
                Err(Stop::Refused) => Block::Stop,
            }
        });
        let Some(found) = found else {
            return Ok(None);
        };
        digests = found;
    }
    let mut out = Vec::new();
    for (digest, block) in digests.iter_mut().zip(&blocks) {
        if digest.is_none() {
            // SAFETY: as above, on the thread holding the GIL, so strings may be read by calls.
            #[allow(unsafe_code)]
            match unsafe { block_digest(block, layout, Some(py), &mut out) } {
                Ok(found) => *digest = Some(found),
                Err(Stop::Refused | Stop::ByCall) => return Ok(None),
            }
        }
    }
    let mut hasher = ::blake3::Hasher::new_derive_key(TEXT_COLUMN_CONTEXT);
    hasher.update(&(items.len() as u64).to_le_bytes());
    for digest in digests.into_iter().flatten() {
        hasher.update(&digest);
    }
    Ok(Some(PyBytes::new(py, hasher.finalize().as_bytes())))
}

/// A hasher for the distinct elements of a column: `FxHash`'s multiply and rotate, mixed at the
/// end, which hashes a short string in a few nanoseconds where `std`'s `SipHash` takes tens.
#[derive(Default)]
struct Fx(u64);

impl std::hash::Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0_u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let mut word = [0_u8; 8];
        word[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        self.add(u64::from_le_bytes(word) ^ (chunks.remainder().len() as u64) << 56);
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        // The multiplications carry each word's bits up, never down: mixed down again (as
        // MurmurHash3 ends), or strings differing in their last characters share a bucket.
        let mut hash = self.0;
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        hash
    }
}

impl Fx {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The odd number nearest 2^64 (or 2^32) over the golden ratio, for Fibonacci hashing.
#[allow(clippy::cast_possible_truncation)]
const GOLDEN: usize = if usize::BITS == 64 {
    0x9e37_79b9_7f4a_7c15_u64 as usize
} else {
    0x9e37_79b9
};

/// How many contents' indices [`text_pack`] remembers by hash, before asking its map.
const CONTENT_SLOTS: usize = 1 << 12;

/// How many objects' indices [`text_pack`] remembers by address (16 bytes each).
const RECENT_SLOTS: usize = 1 << 16;

/// An element told apart by content: a string by its kind and characters as `CPython` keeps
/// them (one form per content, PEP 393), or its UTF-8 when read by a call; `None`; a float by
/// its bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Distinct<'a> {
    Text(usize, &'a [u8]),
    Utf8(&'a [u8]),
    Nothing,
    Float(u64),
}

/// `array` (as [`text_column`] takes it) in a form a cache entry keeps: its distinct elements
/// once each, encoded as for its digest, and the index of each element's among them — where
/// pickle writes each string and memoizes each object; `None` for any other array.
#[pyfunction]
pub fn text_pack<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let Some(items) = pointers(py, array)? else {
        return Ok(None);
    };
    let layout = layout(py);
    let mut seen: HashMap<Distinct<'_>, u32, BuildHasherDefault<Fx>> = HashMap::default();
    let mut indices: Vec<u32> = Vec::with_capacity(items.len());
    let mut table = Vec::new();
    // The index last found for an object, by its address: a column repeats the same few
    // objects, and finding one here reads neither the object nor the map. A slot holds one
    // address at a time, so it only ever answers what the map would.
    let slots = items.len().next_power_of_two().clamp(16, RECENT_SLOTS);
    let mut recent: Vec<(usize, u32)> = vec![(0, 0); slots];
    // The distinct elements by index, and the index last found for a content by its hash.
    let mut distincts: Vec<Distinct<'_>> = Vec::new();
    let mut by_content: Vec<(u64, u32)> = vec![(0, u32::MAX); CONTENT_SLOTS];
    // Fibonacci hashing: the product's high bits, which every bit of the address moves.
    let shift = usize::BITS - slots.trailing_zeros();
    let slot_of = |address: usize| (address.wrapping_mul(GOLDEN) >> shift) % slots;
    for (at, &address) in items.iter().enumerate() {
        if let Some(&ahead) = items.get(at + PREFETCH_AHEAD) {
            prefetch(recent.as_ptr().wrapping_add(slot_of(ahead)) as usize);
            prefetch(ahead);
        }
        let slot = slot_of(address);
        if address != 0 && recent[slot].0 == address {
            indices.push(recent[slot].1);
            continue;
        }
        let item = address as *mut ffi::PyObject;
        // SAFETY: an element of a live object array, read with the GIL held by this thread
        // (see `pointers`); a string read by a call is kept by the interpreter (its UTF-8 is
        // cached on it) while the array holds it.
        #[allow(unsafe_code)]
        let distinct = unsafe {
            match element(item, layout) {
                Ok(Element::Text { kind, data, .. }) => Distinct::Text(kind, data),
                Ok(Element::Nothing) => Distinct::Nothing,
                Ok(Element::Float(bits)) => Distinct::Float(bits),
                Err(Stop::ByCall) => match utf8_by_call(py, item) {
                    Ok(data) => Distinct::Utf8(data),
                    Err(_) => return Ok(None),
                },
                Err(Stop::Refused) => return Ok(None),
            }
        };
        // A content met just before under another object (a column of a million objects
        // holding five strings) is found by its hash in a small table first, the map asked
        // only when that slot holds another.
        let mut hasher = Fx::default();
        distinct.hash(&mut hasher);
        let hash = hasher.finish();
        let by_hash = usize::try_from(hash % CONTENT_SLOTS as u64).unwrap_or(0);
        let (found_hash, found) = by_content[by_hash];
        let index = if found_hash == hash
            && distincts
                .get(found as usize)
                .is_some_and(|known| *known == distinct)
        {
            found
        } else {
            let next = u32::try_from(seen.len()).map_err(|_| PyValueError::new_err("too many"))?;
            let index = match seen.entry(distinct) {
                std::collections::hash_map::Entry::Occupied(found) => *found.get(),
                std::collections::hash_map::Entry::Vacant(vacant) => {
                    // SAFETY: as above.
                    #[allow(unsafe_code)]
                    let pushed = unsafe { push_element(&mut table, item, layout, Some(py)) };
                    if pushed.is_err() {
                        return Ok(None);
                    }
                    distincts.push(*vacant.key());
                    vacant.insert(next);
                    next
                }
            };
            by_content[by_hash] = (hash, index);
            index
        };
        recent[slot] = (address, index);
        indices.push(index);
    }
    let width: usize = match seen.len() {
        0..=0x100 => 1,
        0x101..=0x1_0000 => 2,
        _ => 4,
    };
    let mut packed = Vec::with_capacity(21 + table.len() + indices.len() * width);
    packed.extend_from_slice(PACKED_MARK);
    packed.extend_from_slice(&(items.len() as u64).to_le_bytes());
    packed.extend_from_slice(&(seen.len() as u64).to_le_bytes());
    packed.push(u8::try_from(width).expect("1, 2 or 4"));
    packed.extend_from_slice(&table);
    for index in indices {
        packed.extend_from_slice(&index.to_le_bytes()[..width]);
    }
    Ok(Some(PyBytes::new(py, &packed)))
}

/// Reads `packed` front to back, refusing what [`text_pack`] cannot have written.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> PyResult<&'a [u8]> {
        let end = self
            .at
            .checked_add(count)
            .filter(|end| *end <= self.data.len());
        let end = end.ok_or_else(|| PyValueError::new_err("a packed text column cut short"))?;
        let taken = &self.data[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u64(&mut self) -> PyResult<u64> {
        let mut word = [0_u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    fn leb128(&mut self) -> PyResult<u64> {
        let mut value = 0_u64;
        for shift in (0..64).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(PyValueError::new_err(
            "a packed text column with a header too long",
        ))
    }
}

/// The array [`text_pack`] packed, of `shape`: a new `numpy.ndarray` of dtype `object`, each
/// distinct element made once and shared where it repeats. Raises `ValueError` for bytes it
/// did not write (a cache entry corrupted since: the cache computes the output again).
#[pyfunction]
pub fn text_unpack<'py>(
    py: Python<'py>,
    packed: &[u8],
    shape: &Bound<'py, PyTuple>,
) -> PyResult<Bound<'py, PyAny>> {
    let corrupt = || PyValueError::new_err("not a packed text column");
    let (_, empty) = numpy(py).ok_or_else(|| PyValueError::new_err("numpy cannot be imported"))?;
    let mut reader = Reader {
        data: packed,
        at: 0,
    };
    if reader.take(4)? != PACKED_MARK {
        return Err(corrupt());
    }
    let count = usize::try_from(reader.u64()?).map_err(|_| corrupt())?;
    let distinct = usize::try_from(reader.u64()?).map_err(|_| corrupt())?;
    let width = usize::from(reader.take(1)?[0]);
    if !matches!(width, 1 | 2 | 4) || distinct > count || packed.len() / width < count {
        return Err(corrupt());
    }
    let mut values: Vec<Bound<'py, PyAny>> = Vec::with_capacity(distinct);
    for _ in 0..distinct {
        let header = reader.leb128()?;
        let value = match header {
            1 => py.None().into_bound(py),
            3 => PyFloat::new(py, f64::from_bits(reader.u64()?)).into_any(),
            _ if header & 1 == 0 => {
                let length = usize::try_from(header >> 1).map_err(|_| corrupt())?;
                let text = std::str::from_utf8(reader.take(length)?).map_err(|_| corrupt())?;
                PyString::new(py, text).into_any()
            }
            _ => return Err(corrupt()),
        };
        values.push(value);
    }
    let indices = reader.take(count.checked_mul(width).ok_or_else(corrupt)?)?;
    if reader.at != packed.len() {
        return Err(corrupt());
    }
    let array = empty.call1((shape, "O"))?;
    let Some(items) = pointers(py, &array)? else {
        return Err(corrupt());
    };
    if items.len() != count {
        return Err(corrupt());
    }
    let slots = items.as_ptr().cast_mut().cast::<*mut ffi::PyObject>();
    for (at, index) in indices.chunks_exact(width).enumerate() {
        let mut word = [0_u8; 4];
        word[..width].copy_from_slice(index);
        let value = values
            .get(u32::from_le_bytes(word) as usize)
            .ok_or_else(corrupt)?;
        // SAFETY: `slots` are the `count` pointers of the array made above, which no one else
        // holds yet, each a reference to `None` that numpy filled it with: each is replaced by
        // a new reference to the value, and the old one released, with the GIL held.
        #[allow(unsafe_code)]
        unsafe {
            let slot = slots.add(at);
            let old = slot.read();
            slot.write(value.clone().into_ptr());
            ffi::Py_DecRef(old);
        }
    }
    Ok(array)
}
