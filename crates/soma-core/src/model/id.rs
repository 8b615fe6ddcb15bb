//! `NodeId`: the name of a node, as a type rather than a bare string.
//!
//! An id is shared by the graph, the catalog, every plan step and every produced value, so it
//! clones in O(1) (an `Arc<str>`). Validity — a non-empty string without whitespace or control
//! characters — is checked once, where a node enters a graph, so that every id a plan carries
//! can be printed between backticks and pasted back into a call.
//!
//! The id of a node inside a decision step is a path: the step's id, [`NodeId::SEPARATOR`],
//! and the node's id in what the step runs (`chunks/clean`; `route/ocr/parse` for a switch's
//! case `ocr`). The path is made and read here and nowhere else ([`NodeId::inside`],
//! [`NodeId::within`], [`NodeId::step_and_rest`], [`NodeId::prefixes`]; a case's level is
//! checked by [`crate::Decision::case_prefix`]), and an id a user gives holds no separator
//! ([`NodeId::is_valid`]), so a path reads back one way only: `/` means one thing.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// The name of a node: non-empty, no whitespace, no control characters; a node inside a step
/// has a path of such names ([`NodeId::inside`]).
///
/// Built freely from `&str` or `String`; [`NodeId::is_valid`] says whether a graph will accept
/// it from a user (see [`crate::GraphError::InvalidId`] and
/// [`crate::GraphError::SeparatorInId`]).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(Arc<str>);

impl NodeId {
    /// What separates a step's id from the id of a node inside it (`chunks/clean`). No id a
    /// user gives holds one, so the step a path names is read back one way only.
    pub const SEPARATOR: char = '/';

    /// Wraps a name. Validity is checked by [`crate::Graph::add_node`], not here, so that an
    /// invalid name can still be reported in the error that refuses it.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        NodeId(name.into())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a graph accepts this id from a user ([`crate::Graph::add_node`]): non-empty,
    /// and no whitespace, control characters or [`NodeId::SEPARATOR`].
    pub fn is_valid(&self) -> bool {
        is_path(&self.0) && !self.0.contains(NodeId::SEPARATOR)
    }

    /// The id of node `id` inside `prefix` — a step's id, or a switch case's
    /// ([`crate::Decision::case_prefix`]): `prefix/id`. `id` may be a path itself (a node
    /// inside a step inside the step): the paths nest, `outer/inner/x`. [`NodeId::within`]
    /// reads it back.
    pub fn inside(prefix: &str, id: &str) -> NodeId {
        let mut path = String::with_capacity(prefix.len() + 1 + id.len());
        path.push_str(prefix);
        path.push(NodeId::SEPARATOR);
        path.push_str(id);
        NodeId::from(path)
    }

    /// What `id` is inside `prefix` (the id it has in what the step runs): `Some("clean")` for
    /// `chunks/clean` within `chunks`, `None` for an id not inside `prefix`. The inverse of
    /// [`NodeId::inside`].
    pub fn within<'a>(id: &'a str, prefix: &str) -> Option<&'a str> {
        id.strip_prefix(prefix)?.strip_prefix(NodeId::SEPARATOR)
    }

    /// The outermost step `id` is inside of, and its id inside that step: `Some(("route",
    /// "ocr/parse"))` for `route/ocr/parse`, `None` for a node of the graph itself.
    pub fn step_and_rest(id: &str) -> Option<(&str, &str)> {
        id.split_once(NodeId::SEPARATOR)
    }

    /// The prefixes of the steps (and switch cases) `id` is inside of, outermost first:
    /// `a` and `a/b` for `a/b/c`; none for a node of the graph itself.
    pub fn prefixes(id: &str) -> impl DoubleEndedIterator<Item = &str> {
        id.match_indices(NodeId::SEPARATOR)
            .map(move |(at, _)| &id[..at])
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

/// Whether `text` is a name or a path of names: non-empty, no whitespace or control characters.
/// What every id a graph holds is, whoever made it (a user, or [`crate::Graph::embed`]).
pub(crate) fn is_path(text: &str) -> bool {
    !text.is_empty() && !text.chars().any(|c| c.is_whitespace() || c.is_control())
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
