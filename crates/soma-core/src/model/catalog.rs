//! `Catalog`: what each node does — id to implementation.
//!
//! Kept apart from the [`crate::Graph`] so topology can be compiled and compared without
//! implementations, and so a run can borrow the catalog, shared, from every branch's thread.

use std::fmt;
use std::sync::Arc;

use crate::model::id::{IdMap, NodeId};
use crate::model::node::Node;

/// Implementations by node id. Cloning copies the table, not the nodes.
#[derive(Clone, Default)]
pub struct Catalog {
    nodes: IdMap<Arc<dyn Node>>,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the implementation of `id`; returns the one it replaced.
    pub fn insert(&mut self, id: impl Into<NodeId>, node: Arc<dyn Node>) -> Option<Arc<dyn Node>> {
        self.nodes.insert(id.into(), node)
    }

    /// The implementation of `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<dyn Node>> {
        self.nodes.get(id)
    }

    /// Whether `id` has an implementation.
    pub fn contains(&self, id: &str) -> bool {
        self.nodes.contains_key(id)
    }

    /// Number of implementations.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no implementation is registered.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&NodeId> = self.nodes.keys().collect();
        ids.sort();
        f.debug_struct("Catalog").field("nodes", &ids).finish()
    }
}
