//! `Catalog`: what each node does — id to implementation.
//!
//! Kept apart from the [`crate::Graph`] so topology can be compiled and compared without
//! implementations, and so a run can borrow the catalog, shared, from every branch's thread.

use std::collections::hash_map::Entry;
use std::fmt;
use std::sync::Arc;

use crate::model::graph::GraphError;
use crate::model::id::{IdMap, NodeId};
use crate::model::node::Node;

/// Implementations by node id. Cloning copies the table, not the nodes.
///
/// Kept in the order the ids were first registered, with an index by id beside: a graph and its
/// catalog are usually filled together, node by node, and then checked against each other
/// side by side (`Catalog::first_missing`) instead of by one lookup per node, which once the
/// table outgrows the caches costs a cache miss each (a tenth of a microsecond per node at
/// 100,000 nodes, a third of compiling the graph).
#[derive(Clone, Default)]
pub struct Catalog {
    entries: Vec<(NodeId, Arc<dyn Node>)>,
    index: IdMap<usize>,
}

impl Catalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers (or replaces) the implementation of `id`; returns the one it replaced.
    pub fn insert(&mut self, id: impl Into<NodeId>, node: Arc<dyn Node>) -> Option<Arc<dyn Node>> {
        let id = id.into();
        let next = self.entries.len();
        // One hash of the id, for the lookup and the insertion both.
        match self.index.entry(id) {
            Entry::Occupied(known) => {
                Some(std::mem::replace(&mut self.entries[*known.get()].1, node))
            }
            Entry::Vacant(free) => {
                self.entries.push((free.key().clone(), node));
                free.insert(next);
                None
            }
        }
    }

    /// Registers `inner`'s implementations under `prefix`, each id as [`Graph::embed`] names
    /// it (`prefix/x`): those of what a decision step runs, and of the steps inside it in turn.
    ///
    /// # Errors
    /// [`GraphError::DuplicateNode`] with the first of those ids that has an implementation
    /// already; the catalog is unchanged.
    ///
    /// [`Graph::embed`]: crate::Graph::embed
    pub fn embed(&mut self, prefix: &str, inner: &Catalog) -> Result<(), GraphError> {
        let entries: Vec<(NodeId, Arc<dyn Node>)> = inner
            .iter()
            .map(|(id, node)| (NodeId::inside(prefix, id.as_str()), Arc::clone(node)))
            .collect();
        if let Some((taken, _)) = entries.iter().find(|(id, _)| self.contains(id.as_str())) {
            return Err(GraphError::DuplicateNode { id: taken.clone() });
        }
        for (id, node) in entries {
            self.insert(id, node);
        }
        Ok(())
    }

    /// The implementation of `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<dyn Node>> {
        self.index.get(id).map(|&at| &self.entries[at].1)
    }

    /// Whether `id` has an implementation.
    pub fn contains(&self, id: &str) -> bool {
        self.index.contains_key(id)
    }

    /// Every id and its implementation, in the order the ids were first registered.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&NodeId, &Arc<dyn Node>)> {
        self.entries.iter().map(|(id, node)| (id, node))
    }

    /// Number of implementations.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no implementation is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The implementation of `id` and the position of its entry, looked for first in the entry
    /// at `*next`, then by id; `*next` is left just past the entry found. Steps that come in the
    /// order their nodes were registered — a plan's usually do — are found in order, without
    /// touching the index.
    pub(crate) fn get_after(
        &self,
        id: &NodeId,
        next: &mut usize,
    ) -> Option<(usize, &Arc<dyn Node>)> {
        let at = match self.entries.get(*next) {
            // By identity alone: comparing text (what `==` on ids does, shared or not) would read
            // every id once more; an equal id of its own is found by the index.
            Some((entry, _)) if entry.is(id) => *next,
            Some(_) | None => *self.index.get(id.as_str())?,
        };
        *next = at + 1;
        Some((at, &self.entries[at].1))
    }

    /// The first of `ids` without an implementation, if any. While `ids` were registered in the
    /// same order, each is compared with the entry in its place (the same id, shared, as a graph
    /// and its catalog filled together hold it); from the first that was not, looked up.
    pub(crate) fn first_missing<'i>(&self, ids: &'i [NodeId]) -> Option<&'i NodeId> {
        let in_step = ids
            .iter()
            .zip(&self.entries)
            // By identity alone, as in `get_after`; from the first that is not, by the index.
            .take_while(|(id, (entry, _))| id.is(entry))
            .count();
        ids[in_step..].iter().find(|id| !self.contains(id.as_str()))
    }
}

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&NodeId> = self.entries.iter().map(|(id, _)| id).collect();
        ids.sort();
        // The ids alone, sorted: the implementations are opaque, the index only mirrors them.
        f.debug_struct("Catalog")
            .field("nodes", &ids)
            .finish_non_exhaustive()
    }
}
