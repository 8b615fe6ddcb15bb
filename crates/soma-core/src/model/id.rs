//! `NodeId`: the name of a node, as a type rather than a bare string.
//!
//! An id is shared by the graph, the catalog, every plan step and every produced value, so it
//! clones in O(1) (an `Arc<str>`). Validity — a non-empty string without whitespace or control
//! characters — is checked once, where a node enters a graph, so that every id a plan carries
//! can be printed between backticks and pasted back into a call.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// The name of a node: non-empty, no whitespace, no control characters.
///
/// Built freely from `&str` or `String`; [`NodeId::is_valid`] says whether a graph will accept
/// it (see [`crate::GraphError::InvalidId`]).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Arc<str>);

impl NodeId {
    /// Wraps a name. Validity is checked by [`crate::Graph::add_node`], not here, so that an
    /// invalid name can still be reported in the error that refuses it.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        NodeId(name.into())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a graph accepts this id: non-empty, and no whitespace or control characters.
    pub fn is_valid(&self) -> bool {
        !self.0.is_empty() && !self.0.chars().any(|c| c.is_whitespace() || c.is_control())
    }

    /// Whether both are one shared id, not merely equal ones: a comparison that reads no text.
    pub(crate) fn is(&self, other: &NodeId) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// The shared text, for values keyed by id (fan-in and leaf maps) without copying it.
    pub fn shared(&self) -> Arc<str> {
        Arc::clone(&self.0)
    }
}

impl From<&str> for NodeId {
    fn from(name: &str) -> Self {
        NodeId::new(name)
    }
}

impl From<String> for NodeId {
    fn from(name: String) -> Self {
        NodeId::new(name)
    }
}

impl From<&NodeId> for NodeId {
    fn from(id: &NodeId) -> Self {
        id.clone()
    }
}

impl Borrow<str> for NodeId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodeId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for NodeId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for NodeId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// A quick hash for node ids, which the graph, the catalog and the program builder look up once
/// per edge or read: the ids are the user's own names, not an attacker's input, so the
/// flood-resistant default hash buys nothing here and costs a good part of a compile.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0_u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }

    fn finish(&self) -> u64 {
        // The table picks buckets by the low bits, and the multiply left them depending on the
        // low bytes only (the ids' shared prefix): fold the high bits down.
        let folded = (self.0 ^ (self.0 >> 31)).wrapping_mul(0x94_d0_49_bb_13_31_11_eb);
        folded ^ (folded >> 29)
    }
}

/// A map keyed by node id, hashed with [`IdHasher`].
pub(crate) type IdMap<V> = HashMap<NodeId, V, BuildHasherDefault<IdHasher>>;
