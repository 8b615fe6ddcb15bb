//! Arrow text columns — `pyarrow` arrays of `string`, `large_string`, `binary` and
//! `large_binary`, as pandas' `string[pyarrow]` and `str` (where pyarrow is installed) keep
//! them — digested from their buffers (validity bitmap, offsets, data): `soma._soma.arrow_text`.
//!
//! Each element is encoded as a text column of Python strings is (`text.rs`): a LEB128 header
//! (its length in bytes times two; 1 for a missing value), then its bytes; and the column's
//! digest is made the same way, of blocks of `BLOCK` elements counted from the column's first,
//! whatever chunk each lies in. So equal content gives an equal digest however it is chunked
//! or sliced (an array's offset into its buffers, the bytes a missing value's slot spans), and
//! the encoding being prefix-free, different content never feeds the same bytes. What the
//! column is (its Arrow type, a chunked array or one array) is the caller's to key.
//!
//! Arrow's buffers are not written once an array is made (Arrow's rule, which pyarrow and
//! pandas keep), so they are read with the GIL released, on a few threads for a large column;
//! one written meanwhile all the same gives a stale digest, as any buffer read so (`digest.rs`). Every offset is checked against its buffer before a byte is
//! read: a malformed array (made by `Array.from_buffers`, say) is refused, never read past.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::text::{
    digest_blocks, leb128, parallelism, Block, BLOCK, MOST_THREADS, TEXT_COLUMN_CONTEXT,
};

/// One array of a column, as the caller hands it over: its validity bitmap (`None` when every
/// element is there), its offsets, its data (`None` when it has no bytes), its offset into
/// them, its length.
type Given<'py> = (
    Option<Bound<'py, PyAny>>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    usize,
    usize,
);

/// One array's buffers, read in place: where each lies and how long it is.
#[derive(Clone, Copy)]
struct Chunk {
    validity: Option<(usize, usize)>,
    offsets: (usize, usize),
    data: (usize, usize),
    offset: usize,
    length: usize,
}

/// A buffer's bytes, read in place.
///
/// # Safety
/// `(at, len)` is a buffer held by the caller (a `PyUntypedBuffer` alive while the slice is
/// used), whose bytes nothing writes meanwhile: Arrow's buffers are immutable.
#[allow(unsafe_code)]
unsafe fn bytes<'a>((at, len): (usize, usize)) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(at as *const u8, len)
}

impl Chunk {
    /// Appends the encodings of its elements `from` to `to` (its own positions); `None` when
    /// an offset lies outside its buffers.
    ///
    /// # Safety
    /// As [`bytes`], for each of the chunk's buffers.
    #[allow(unsafe_code)]
    unsafe fn push(&self, from: usize, to: usize, wide: bool, out: &mut Vec<u8>) -> Option<()> {
        let width = if wide { 8 } else { 4 };
        let (first, last) = (self.offset.checked_add(from)?, self.offset.checked_add(to)?);
        // The run's offsets, one more than its elements, bounds checked once here.
        let offsets = bytes(self.offsets).get(first * width..(last + 1) * width)?;
        let data = bytes(self.data);
        let validity = self.validity.map(|validity| bytes(validity));
        let offset_at = |k: usize| -> Option<usize> {
            let word = &offsets[k * width..(k + 1) * width];
            if wide {
                usize::try_from(i64::from_le_bytes(word.try_into().ok()?)).ok()
            } else {
                usize::try_from(i32::from_le_bytes(word.try_into().ok()?)).ok()
            }
        };
        let span = offset_at(to - from)?.saturating_sub(offset_at(0)?);
        out.reserve(span.min(data.len()) + (to - from));
        let mut start = offset_at(0)?;
        for k in 0..to - from {
            let end = offset_at(k + 1)?;
            let at = first + k;
            if let Some(bits) = validity {
                // A bitmap shorter than its array is refused.
                if bits.get(at / 8)? & (1 << (at % 8)) == 0 {
                    out.push(1);
                    start = end;
                    continue;
                }
            }
            let text = data.get(start..end)?;
            match u8::try_from(text.len()) {
                // Under 64 bytes, twice the length is its LEB128 header, one byte.
                Ok(length) if length < 64 => out.push(length << 1),
                _ => leb128(out, (text.len() as u64) << 1),
            }
            out.extend_from_slice(text);
            start = end;
        }
        Some(())
    }
}

/// The digest of the elements from `from` to `to` (positions in the whole column), whose
/// chunks begin at `starts`; `None` when one cannot be read.
///
/// # Safety
/// As [`Chunk::push`].
#[allow(unsafe_code)]
unsafe fn block_digest(
    chunks: &[Chunk],
    starts: &[usize],
    wide: bool,
    (from, to): (usize, usize),
    out: &mut Vec<u8>,
) -> Option<[u8; 32]> {
    out.clear();
    // The last chunk beginning at or before `from` (empty chunks skipped by the loop).
    let mut which = starts.partition_point(|&start| start <= from) - 1;
    let mut at = from;
    while at < to {
        let chunk = chunks.get(which)?;
        let end = (starts[which] + chunk.length).min(to);
        if end > at {
            chunk.push(at - starts[which], end - starts[which], wide, out)?;
        }
        at = end;
        which += 1;
    }
    Some(*::blake3::hash(out).as_bytes())
}

/// A buffer of the caller's, held while it is read: its place and length.
fn hold(buffer: &Bound<'_, PyAny>, held: &mut Vec<PyUntypedBuffer>) -> PyResult<(usize, usize)> {
    let found = PyUntypedBuffer::get(buffer)?;
    if !found.is_c_contiguous() {
        return Err(pyo3::exceptions::PyBufferError::new_err(
            "an Arrow buffer is contiguous",
        ));
    }
    let place = (found.buf_ptr() as usize, found.len_bytes());
    held.push(found);
    Ok(place)
}

/// The 32-byte digest of a text column made of `chunks` in order, each `(validity, offsets,
/// data, offset, length)` as Arrow keeps a `string` or `binary` array (`wide`: 64-bit offsets,
/// `large_string` and `large_binary`): the same as [`crate::text::text_column`]'s of a column
/// holding the same strings, `None` for a missing value. `None` when an offset lies outside its
/// buffers. What the column is (its type) is the caller's to key.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)] // pyo3 hands the list over as a `Vec`.
pub fn arrow_text<'py>(
    py: Python<'py>,
    chunks: Vec<Given<'py>>,
    wide: bool,
) -> PyResult<Option<Bound<'py, PyBytes>>> {
    let mut held = Vec::new();
    let mut read = Vec::with_capacity(chunks.len());
    let mut starts = Vec::with_capacity(chunks.len());
    let mut count = 0_usize;
    for (validity, offsets, data, offset, length) in &chunks {
        read.push(Chunk {
            validity: validity
                .as_ref()
                .map(|validity| hold(validity, &mut held))
                .transpose()?,
            offsets: hold(offsets, &mut held)?,
            data: match data {
                Some(data) => hold(data, &mut held)?,
                None => (0, 0),
            },
            offset: *offset,
            length: *length,
        });
        starts.push(count);
        count = count
            .checked_add(*length)
            .ok_or_else(|| pyo3::exceptions::PyOverflowError::new_err("too many elements"))?;
    }
    let blocks: Vec<(usize, usize)> = (0..count)
        .step_by(BLOCK)
        .map(|from| (from, (from + BLOCK).min(count)))
        .collect();
    let threads = parallelism().min(MOST_THREADS).min(blocks.len() / 2).max(1);
    let digests = crate::exit::detach(py, || {
        digest_blocks(threads, blocks.len(), |at, scratch| {
            // SAFETY: every buffer of `read` is held in `held` until after this closure
            // returns, and Arrow's buffers are not written once made.
            #[allow(unsafe_code)]
            let digest = unsafe { block_digest(&read, &starts, wide, blocks[at], scratch) };
            digest.map_or(Block::Stop, Block::Digest)
        })
    });
    for buffer in held {
        buffer.release(py);
    }
    let Some(digests) = digests else {
        return Ok(None);
    };
    let mut hasher = ::blake3::Hasher::new_derive_key(TEXT_COLUMN_CONTEXT);
    hasher.update(&(count as u64).to_le_bytes());
    // Every block digested: none is left to this thread.
    for digest in digests.into_iter().flatten() {
        hasher.update(&digest);
    }
    Ok(Some(PyBytes::new(py, hasher.finalize().as_bytes())))
}
