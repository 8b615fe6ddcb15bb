//! `Graph`: topology only — node ids and directed edges, a DAG at every instant.
//!
//! What a node *does* lives in the [`crate::Catalog`]; keeping the two apart is what lets the
//! same topology be compiled, drawn or compared without touching an implementation. Every
//! constructor either succeeds or changes nothing and returns a [`GraphError`], so an invalid
//! graph never exists and a topological order cannot fail.
//!
//! Nodes live in an arena indexed by insertion order; adjacency is kept in both directions, in
//! edge-declaration order, so neighbour queries cost O(degree) and never scan every edge. A
//! node's first few neighbours are kept in place rather than on the heap ([`Neighbours`]), so a
//! graph allocates about once per node — its id — and the ids, which every plan clones, sit
//! side by side in memory instead of among two small lists per node.
//!
//! The ids a user gives are names ([`NodeId::is_valid`]); the ids of the nodes inside a
//! decision step are paths, which only [`Graph::embed`] makes: what a step runs is its sub-graph
//! embedded under the step's id.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::hash::BuildHasherDefault;

use crate::model::id::{is_path, IdHasher, IdMap, NodeId};

/// Why a graph refused a node or an edge. The graph is unchanged after any of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphError {
    /// The id is empty or holds whitespace or control characters.
    InvalidId {
        /// The refused id.
        id: NodeId,
    },
    /// The id holds [`NodeId::SEPARATOR`], which separates a step's id from the ids inside it
    /// (`chunks/clean`): an id a user gives holds none, so that a path reads back one way.
    SeparatorInId {
        /// The refused id.
        id: NodeId,
    },
    /// A switch's case key holds [`NodeId::SEPARATOR`]: the key is a level of the path of the
    /// ids inside the case (`route/ocr/parse`), and would read as two.
    SeparatorInKey {
        /// The switch step's id.
        step: NodeId,
        /// The refused key.
        key: String,
    },
    /// A node with this id is already in the graph.
    DuplicateNode {
        /// The taken id.
        id: NodeId,
    },
    /// No node has this id.
    UnknownNode {
        /// The id that was asked for.
        id: NodeId,
    },
    /// This edge was already declared.
    DuplicateEdge {
        /// Where the edge starts.
        from: NodeId,
        /// Where the edge ends.
        to: NodeId,
    },
    /// The edge would close a cycle.
    WouldCycle {
        /// The cycle the edge would close, first node repeated at the end: the edge's source,
        /// its target, and the existing path back to the source (`[a, a]` for a self-loop).
        path: Vec<NodeId>,
    },
}

impl fmt::Display for GraphError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GraphError::InvalidId { id } => write!(
                f,
                "invalid node id `{id}`\nhint: an id is a non-empty name without spaces or control characters"
            ),
            GraphError::SeparatorInId { id } => write!(
                f,
                "invalid node id `{id}`: `{sep}` separates a step's id from the ids of the nodes inside it (`chunks{sep}clean`), and cannot be in an id\nhint: use another character, as in `{}`",
                id.as_str().replace(NodeId::SEPARATOR, "_"),
                sep = NodeId::SEPARATOR
            ),
            GraphError::SeparatorInKey { step, key } => write!(
                f,
                "invalid key `{key}` of switch step `{step}`: `{sep}` separates the levels of the ids inside a case (`{step}{sep}key{sep}node`), and cannot be in a key\nhint: use another character, as in `{}`",
                key.replace(NodeId::SEPARATOR, "_"),
                sep = NodeId::SEPARATOR
            ),
            GraphError::DuplicateNode { id } => write!(
                f,
                "a node `{id}` is already in the graph\nhint: give the new node another id, or let Soma derive one"
            ),
            GraphError::UnknownNode { id } => write!(
                f,
                "no node `{id}` in the graph\nhint: add it with `node` before connecting it"
            ),
            GraphError::DuplicateEdge { from, to } => write!(
                f,
                "the edge `{from}` -> `{to}` is already in the graph\nhint: an edge is declared once"
            ),
            GraphError::WouldCycle { path } => {
                let shown: Vec<String> = path.iter().map(|id| format!("`{id}`")).collect();
                write!(
                    f,
                    "the edge `{}` -> `{}` would close a cycle: {}\nhint: a graph is acyclic; remove an edge of that path",
                    path[0],
                    path[1],
                    shown.join(" -> ")
                )
            }
        }
    }
}

impl std::error::Error for GraphError {}

/// Why a graph refuses `id` from a user, whatever it holds: no name, or a path.
fn refusal(id: &NodeId) -> Option<GraphError> {
    if !is_path(id.as_str()) {
        Some(GraphError::InvalidId { id: id.clone() })
    } else if id.as_str().contains(NodeId::SEPARATOR) {
        Some(GraphError::SeparatorInId { id: id.clone() })
    } else {
        None
    }
}

/// Node indices to node indices, for the cycle check's searches.
type PairMap = HashMap<usize, usize, BuildHasherDefault<IdHasher>>;

/// A directed acyclic graph of node ids.
#[derive(Clone, Default)]
pub struct Graph {
    ids: Vec<NodeId>,
    index: IdMap<usize>,
    succ: Vec<Neighbours>,
    pred: Vec<Neighbours>,
    edges: Vec<(usize, usize)>,
    /// Every edge, to refuse one declared twice in O(1) whatever the degrees; hashed quickly,
    /// as the ids are (two indices, no attacker's input).
    edge_set: HashSet<(usize, usize), BuildHasherDefault<IdHasher>>,
    /// Per base of [`Graph::free_id`], the first suffix not known to be taken: `base_2` up to
    /// it are all taken, and stay so (a graph never loses a node), so a search resumes there
    /// and naming the n-th node of a class costs O(1), not O(n).
    free_from: HashMap<Box<str>, usize>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the graph has no node.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether a node has this id.
    pub fn contains(&self, id: &str) -> bool {
        self.index.contains_key(id)
    }

    /// Where `id` stands in insertion order (0 for the first node added), if it is a node:
    /// for tables kept beside the graph in its order.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// Adds a node.
    ///
    /// # Errors
    /// [`GraphError::InvalidId`], [`GraphError::SeparatorInId`] (a node inside a step is added
    /// by [`Graph::embed`]) or [`GraphError::DuplicateNode`]; the graph is unchanged.
    pub fn add_node(&mut self, id: impl Into<NodeId>) -> Result<&NodeId, GraphError> {
        let id = id.into();
        if let Some(refused) = refusal(&id) {
            return Err(refused);
        }
        let at = self.ids.len();
        // One hash of the id, for the check and the insertion both.
        match self.index.entry(id) {
            Entry::Occupied(taken) => {
                return Err(GraphError::DuplicateNode {
                    id: taken.key().clone(),
                })
            }
            Entry::Vacant(free) => {
                self.ids.push(free.key().clone());
                free.insert(at);
            }
        }
        self.succ.push(Neighbours::default());
        self.pred.push(Neighbours::default());
        Ok(&self.ids[at])
    }

    /// Why [`Graph::add_node`] would refuse `id`, if it would: to refuse it before anything
    /// that goes with the node (a step's sub-graphs) is copied.
    pub fn refusal(&self, id: &str) -> Option<GraphError> {
        let id = NodeId::from(id);
        refusal(&id).or_else(|| {
            self.contains(id.as_str())
                .then_some(GraphError::DuplicateNode { id })
        })
    }

    /// Adds `inner`'s nodes under `prefix` — node `x` as `prefix/x` ([`NodeId::inside`]), a
    /// path already as a deeper one (`prefix/step/x`) — and its edges between them, in its
    /// orders: what a decision step runs, embedded under the step's id (or a switch case's,
    /// [`crate::Decision::case_prefix`]). [`NodeId::within`] reads each id back.
    ///
    /// # Errors
    /// [`GraphError::InvalidId`] for a `prefix` that is no name or path (`inner` empty adds
    /// nothing and refuses nothing), [`GraphError::DuplicateNode`] with the first id this graph
    /// holds already; the graph is unchanged.
    ///
    /// # Complexity
    /// O(nodes + edges of `inner`, and the length of their ids): no edge can close a cycle, so
    /// none is searched for.
    pub fn embed(&mut self, prefix: &str, inner: &Graph) -> Result<(), GraphError> {
        if inner.is_empty() {
            return Ok(());
        }
        // Every id of `inner` is a path already, so each made here is one exactly when
        // `prefix` is.
        if !is_path(prefix) {
            return Err(GraphError::InvalidId {
                id: NodeId::from(prefix),
            });
        }
        let ids: Vec<NodeId> = inner
            .ids
            .iter()
            .map(|id| NodeId::inside(prefix, id.as_str()))
            .collect();
        if let Some(taken) = ids.iter().find(|id| self.contains(id.as_str())) {
            return Err(GraphError::DuplicateNode { id: taken.clone() });
        }
        let base = self.ids.len();
        for (at, id) in ids.into_iter().enumerate() {
            self.index.insert(id.clone(), base + at);
            self.ids.push(id);
            self.succ.push(Neighbours::default());
            self.pred.push(Neighbours::default());
        }
        // Between new nodes only, as in `inner`: neither a duplicate nor a cycle.
        for &(a, b) in &inner.edges {
            let (a, b) = (base + a, base + b);
            self.edge_set.insert((a, b));
            self.edges.push((a, b));
            self.succ[a].push(b);
            self.pred[b].push(a);
        }
        Ok(())
    }

    /// Adds the edge `from -> to`.
    ///
    /// # Errors
    /// [`GraphError::UnknownNode`], [`GraphError::DuplicateEdge`] or
    /// [`GraphError::WouldCycle`] with the path the edge would close; the graph is unchanged.
    ///
    /// # Complexity
    /// O(1) when `from` has no predecessor or `to` no successor (how chains and the DSL grow a
    /// graph); otherwise two searches in lockstep, from `to` onwards and from `from` backwards,
    /// which stop when the smaller of the two regions is explored: O(nodes + edges) at worst.
    pub fn add_edge(&mut self, from: &str, to: &str) -> Result<(), GraphError> {
        let a = self.require(from)?;
        let b = self.require(to)?;
        if self.edge_set.contains(&(a, b)) {
            return Err(GraphError::DuplicateEdge {
                from: self.ids[a].clone(),
                to: self.ids[b].clone(),
            });
        }
        if let Some(back) = self.path(b, a) {
            let mut path = Vec::with_capacity(back.len() + 1);
            path.push(self.ids[a].clone());
            path.extend(back.into_iter().map(|i| self.ids[i].clone()));
            return Err(GraphError::WouldCycle { path });
        }
        self.edge_set.insert((a, b));
        self.edges.push((a, b));
        self.succ[a].push(b);
        self.pred[b].push(a);
        Ok(())
    }

    /// A path `from ->* to` along existing edges (both ends included), if there is one.
    ///
    /// Two searches run in lockstep, one node each in turn: forward from `from` and backward
    /// from `to`. Either one alone decides — it finds the other's start, or it runs out and
    /// there is no path — so the search costs about the smaller of the two regions it explores:
    /// an edge from a small expression into a large one (`(a >> b) >> rest`) costs the small
    /// one's size, not the whole graph's.
    fn path(&self, from: usize, to: usize) -> Option<Vec<usize>> {
        if from == to {
            return Some(vec![from]);
        }
        if self.succ[from].is_empty() || self.pred[to].is_empty() {
            return None;
        }
        // Forward: each node reached, and the node it was reached from.
        let mut reached_from: PairMap = PairMap::default();
        reached_from.insert(from, from);
        let mut forward = vec![from];
        // Backward: each node that reaches `to`, and the next node on its way there.
        let mut leads_to: PairMap = PairMap::default();
        leads_to.insert(to, to);
        let mut backward = vec![to];
        loop {
            let v = forward.pop()?;
            for &w in self.succ[v].as_slice() {
                let w = w as usize;
                if reached_from.contains_key(&w) {
                    continue;
                }
                reached_from.insert(w, v);
                if w == to {
                    let mut path = vec![to];
                    let mut at = to;
                    while at != from {
                        at = reached_from[&at];
                        path.push(at);
                    }
                    path.reverse();
                    return Some(path);
                }
                forward.push(w);
            }
            let v = backward.pop()?;
            for &w in self.pred[v].as_slice() {
                let w = w as usize;
                if leads_to.contains_key(&w) {
                    continue;
                }
                leads_to.insert(w, v);
                if w == from {
                    let mut path = vec![from];
                    let mut at = from;
                    while at != to {
                        at = leads_to[&at];
                        path.push(at);
                    }
                    return Some(path);
                }
                backward.push(w);
            }
        }
    }

    fn require(&self, id: &str) -> Result<usize, GraphError> {
        self.index
            .get(id)
            .copied()
            .ok_or_else(|| GraphError::UnknownNode { id: id.into() })
    }

    /// The ids in insertion order.
    pub fn nodes(&self) -> &[NodeId] {
        &self.ids
    }

    /// The edges in declaration order.
    pub fn edges(&self) -> impl ExactSizeIterator<Item = (&NodeId, &NodeId)> + '_ {
        self.edges
            .iter()
            .map(|&(a, b)| (&self.ids[a], &self.ids[b]))
    }

    /// The sources of the edges into `id`, in edge-declaration order. O(in-degree).
    ///
    /// # Errors
    /// [`GraphError::UnknownNode`].
    pub fn predecessors(&self, id: &str) -> Result<Vec<&NodeId>, GraphError> {
        let at = self.require(id)?;
        Ok(self.pred[at]
            .as_slice()
            .iter()
            .map(|&i| &self.ids[i as usize])
            .collect())
    }

    /// The targets of the edges out of `id`, in edge-declaration order. O(out-degree).
    ///
    /// # Errors
    /// [`GraphError::UnknownNode`].
    pub fn successors(&self, id: &str) -> Result<Vec<&NodeId>, GraphError> {
        let at = self.require(id)?;
        Ok(self.succ[at]
            .as_slice()
            .iter()
            .map(|&i| &self.ids[i as usize])
            .collect())
    }

    /// Nodes without predecessors, in insertion order.
    pub fn roots(&self) -> Vec<&NodeId> {
        (0..self.len())
            .filter(|&i| self.pred[i].is_empty())
            .map(|i| &self.ids[i])
            .collect()
    }

    /// Nodes without successors, in insertion order.
    pub fn leaves(&self) -> Vec<&NodeId> {
        (0..self.len())
            .filter(|&i| self.succ[i].is_empty())
            .map(|i| &self.ids[i])
            .collect()
    }

    /// Every node after all of its predecessors; among nodes ready at the same time, the one
    /// inserted first comes first, so the order is a function of the graph alone.
    ///
    /// # Complexity
    /// O((nodes + edges) · log nodes).
    pub fn topological_sort(&self) -> Vec<NodeId> {
        self.topological_order()
            .into_iter()
            .map(|i| self.ids[i].clone())
            .collect()
    }

    /// [`Graph::topological_sort`] as insertion indices.
    pub(crate) fn topological_order(&self) -> Vec<usize> {
        let mut missing: Vec<usize> = self.pred.iter().map(Neighbours::len).collect();
        let mut ready: BinaryHeap<Reverse<usize>> = (0..self.len())
            .filter(|&i| missing[i] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(self.len());
        while let Some(Reverse(v)) = ready.pop() {
            order.push(v);
            for &w in self.succ[v].as_slice() {
                let w = w as usize;
                missing[w] -= 1;
                if missing[w] == 0 {
                    ready.push(Reverse(w));
                }
            }
        }
        order
    }

    /// `base` if it is free, else the first of `base_2`, `base_3`, … that is.
    ///
    /// # Complexity
    /// O(1) amortized: the search for a base resumes where the last one for it stopped.
    pub fn free_id(&mut self, base: &str) -> NodeId {
        if !self.contains(base) {
            return NodeId::from(base);
        }
        let ids = &self.index;
        let from = self.free_from.entry(base.into()).or_insert(2);
        // At most `len` ids are taken, so the search ends within `len + 1` candidates.
        loop {
            let candidate = format!("{base}_{from}");
            if !ids.contains_key(candidate.as_str()) {
                return NodeId::from(candidate);
            }
            *from += 1;
        }
    }

    pub(crate) fn id_at(&self, at: usize) -> &NodeId {
        &self.ids[at]
    }

    /// The successors of the node inserted `at`-th, as insertion indices.
    pub(crate) fn succ_at(&self, at: usize) -> &[u32] {
        self.succ[at].as_slice()
    }

    /// The predecessors of the node inserted `at`-th, as insertion indices.
    pub(crate) fn pred_at(&self, at: usize) -> &[u32] {
        self.pred[at].as_slice()
    }
}

/// How many neighbours a node keeps in place before they move to the heap: more than the in-
/// and out-degree of nearly every node of a model graph, and as many as fit in the 32 bytes the
/// heap form takes anyway.
const IN_PLACE: usize = 6;

/// The neighbours of one node in one direction, as insertion indices (a graph holds fewer than
/// `u32::MAX` nodes), in edge-declaration order.
#[derive(Clone)]
enum Neighbours {
    /// Up to [`IN_PLACE`] of them; `at[..len]` are the neighbours.
    Few { len: u8, at: [u32; IN_PLACE] },
    /// More: all of them, on the heap.
    Many(Vec<u32>),
}

impl Default for Neighbours {
    fn default() -> Self {
        Neighbours::Few {
            len: 0,
            at: [0; IN_PLACE],
        }
    }
}

impl Neighbours {
    fn as_slice(&self) -> &[u32] {
        match self {
            Neighbours::Few { len, at } => &at[..usize::from(*len)],
            Neighbours::Many(all) => all,
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    fn push(&mut self, node: usize) {
        let node = u32::try_from(node).expect("fewer nodes than u32::MAX");
        match self {
            Neighbours::Few { len, at } if usize::from(*len) < IN_PLACE => {
                at[usize::from(*len)] = node;
                *len += 1;
            }
            Neighbours::Few { at, .. } => {
                let mut all = Vec::with_capacity(2 * IN_PLACE);
                all.extend_from_slice(at);
                all.push(node);
                *self = Neighbours::Many(all);
            }
            Neighbours::Many(all) => all.push(node),
        }
    }
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Neighbours>() == 32);

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("nodes", &self.ids)
            .field("edges", &self.edges().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}
