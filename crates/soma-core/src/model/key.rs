//! `Key`: the 32-byte digest a cache files a node's output under, and the digest of a value's
//! content.
//!
//! Both are BLAKE3: a digest depends only on the bytes fed to it, so a key made in one process
//! is the same in another, on another machine, in another run — no `id()`, no hash seed. What a
//! value's digest is fed is a prefix-free encoding of it (a tag per variant, every length
//! written before what it counts), so two different values never feed the same bytes. An
//! `Opaque` value has no content the engine may read: a value holding one has no digest.

use std::fmt;

use crate::model::value::{Value, Visit};

/// A 32-byte digest: what a node's output is filed under, or what a value's content hashes to.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key([u8; 32]);

/// Derivation contexts: a key of one kind can never equal a key of another made from the same
/// bytes.
const VALUE_CONTEXT: &str = "soma 2026-12 value content v1";
const BYTES_CONTEXT: &str = "soma 2026-12 bytes v1";

impl Key {
    /// The key whose digest is `bytes` (a digest made elsewhere: a fingerprint, a stored key).
    pub const fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// The digest's 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest in 64 lowercase hex digits: a file name, a log line.
    pub fn to_hex(&self) -> String {
        use fmt::Write as _;
        self.0.iter().fold(String::with_capacity(64), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        })
    }

    /// The digest of raw bytes: what a node's code and state are fingerprinted by.
    pub fn of_bytes(bytes: &[u8]) -> Key {
        let mut hasher = blake3::Hasher::new_derive_key(BYTES_CONTEXT);
        hasher.update(bytes);
        Key(*hasher.finalize().as_bytes())
    }

    /// The digest of a value's content, or `None` when it holds an `Opaque` value, whose
    /// content the engine cannot read. Equal values (as `==` compares them, floats by their
    /// bits) have equal digests. Walks the value from a stack: any depth costs no stack.
    pub fn of_value(value: &Value) -> Option<Key> {
        let mut hasher = blake3::Hasher::new_derive_key(VALUE_CONTEXT);
        let length = |hasher: &mut blake3::Hasher, n: usize| {
            hasher.update(&(n as u64).to_le_bytes());
        };
        for visit in value.visits() {
            let entered = match visit {
                // Lengths prefix every list and map, so a closing mark would add nothing.
                Visit::Leave(_) => continue,
                Visit::Enter(key, entered) => {
                    if let Some(key) = key {
                        length(&mut hasher, key.len());
                        hasher.update(key.as_bytes());
                    }
                    entered
                }
            };
            match entered {
                Value::Null => {
                    hasher.update(b"n");
                }
                Value::Bool(b) => {
                    hasher.update(&[b'b', u8::from(*b)]);
                }
                Value::Int(i) => {
                    hasher.update(b"i");
                    hasher.update(&i.to_le_bytes());
                }
                Value::Float(x) => {
                    hasher.update(b"f");
                    hasher.update(&x.to_bits().to_le_bytes());
                }
                Value::Text(text) => {
                    hasher.update(b"t");
                    length(&mut hasher, text.len());
                    hasher.update(text.as_bytes());
                }
                Value::Bytes(bytes) => {
                    hasher.update(b"y");
                    length(&mut hasher, bytes.len());
                    hasher.update(bytes);
                }
                Value::List(items) => {
                    hasher.update(b"l");
                    length(&mut hasher, items.len());
                }
                Value::Map(pairs) => {
                    hasher.update(b"m");
                    length(&mut hasher, pairs.len());
                }
                Value::Opaque(_) => return None,
            }
        }
        Some(Key(*hasher.finalize().as_bytes()))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.to_hex())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
