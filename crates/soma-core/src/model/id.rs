//! `NodeId`: the name of a node, as a type rather than a bare string.
//!
//! An id is shared by the graph, the catalog, every plan step and every produced value, so it
//! clones in O(1) (an `Arc<str>`). Validity — a non-empty string without whitespace or control
//! characters — is checked once, where a node enters a graph, so that every id a plan carries
//! can be printed between backticks and pasted back into a call.

use std::borrow::Borrow;
use std::fmt;
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
