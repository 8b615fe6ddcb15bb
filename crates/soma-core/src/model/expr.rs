//! The DSL: `node("id", implementation)`, `>>` in series, `|` side by side.
//!
//! A [`Expr`] is nothing but nodes and edges. `a >> b` connects every terminal of `a` to every
//! head of `b`; `a | b` is a disjoint union; `>>` binds tighter than `|`, as in Rust and Python.
//! The DSL is an oracle for [`crate::compile()`], never its source: compile recovers the same tree
//! from the graph alone, so the graph built here and the same graph built with
//! [`crate::Graph::add_edge`] in a loop give the same plan.
//!
//! ```
//! use soma_core::{compile, node, Executor, NodeError, Value};
//!
//! let add = |k: i64| move |x: &Value| -> Result<Value, NodeError> {
//!     x.as_int().map(|x| Value::Int(x + k)).ok_or_else(|| NodeError::new("not an int"))
//! };
//! let expr = node("a", add(1)) >> (node("b", add(10)) | node("c", add(100)));
//! let (graph, catalog) = expr.somatize()?;
//! let plan = compile(&graph, &catalog)?;
//! assert_eq!(plan.compact(), "Sequence([Execute(a), Wave([Execute(b), Execute(c)])])");
//! let out = Executor::new().run(&plan, &catalog, Value::Int(0))?;
//! assert_eq!(out.get("b"), Some(&Value::Int(11)));
//! assert_eq!(out.get("c"), Some(&Value::Int(101)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::VecDeque;
use std::ops::{BitOr, Shr};
use std::sync::Arc;

use crate::model::catalog::Catalog;
use crate::model::graph::{Graph, GraphError};
use crate::model::id::NodeId;
use crate::model::node::Node;

/// A piece of graph under construction: its nodes, its edges, its heads and its terminals.
/// Python's `soma.Expr` is the same idea.
///
/// Nothing is checked while an expression is glued together; [`Expr::somatize`] checks ids
/// as it adds the nodes and reports the first error, in declaration order.
///
/// Gluing costs the size of the smaller side (and, for `>>`, the edges it adds): the larger
/// side's lists are kept and the smaller's added at their front or back, so a chain or a wave
/// written in a loop, growing on either side, is built in time linear in its size.
#[derive(Clone)]
pub struct Expr {
    nodes: VecDeque<(NodeId, Arc<dyn Node>)>,
    edges: VecDeque<(NodeId, NodeId)>,
    heads: VecDeque<NodeId>,
    terminals: VecDeque<NodeId>,
}

/// A one-node expression.
pub fn node(id: impl Into<NodeId>, implementation: impl Node + 'static) -> Expr {
    node_arc(id, Arc::new(implementation))
}

/// A one-node expression around an implementation that is already shared.
pub fn node_arc(id: impl Into<NodeId>, implementation: Arc<dyn Node>) -> Expr {
    let id = id.into();
    Expr {
        nodes: VecDeque::from([(id.clone(), implementation)]),
        edges: VecDeque::new(),
        heads: VecDeque::from([id.clone()]),
        terminals: VecDeque::from([id]),
    }
}

/// `first` then `then`, made by growing the longer of the two.
fn joined<T>(mut first: VecDeque<T>, mut then: VecDeque<T>) -> VecDeque<T> {
    if first.len() >= then.len() {
        first.append(&mut then);
        first
    } else {
        while let Some(item) = first.pop_back() {
            then.push_front(item);
        }
        then
    }
}

impl Expr {
    /// The node ids, in declaration order.
    pub fn ids(&self) -> impl Iterator<Item = &NodeId> {
        self.nodes.iter().map(|(id, _)| id)
    }

    /// Builds the graph and the catalog this expression describes.
    ///
    /// # Errors
    /// The first [`GraphError`] in declaration order: an invalid id, or an id used twice.
    pub fn somatize(self) -> Result<(Graph, Catalog), GraphError> {
        let mut graph = Graph::new();
        let mut catalog = Catalog::new();
        for (id, implementation) in self.nodes {
            graph.add_node(id.clone())?;
            catalog.insert(id, implementation);
        }
        for (from, to) in &self.edges {
            graph.add_edge(from.as_str(), to.as_str())?;
        }
        Ok((graph, catalog))
    }
}

impl Shr for Expr {
    type Output = Expr;

    /// In series: every terminal of `self` to every head of `next`.
    fn shr(self, next: Expr) -> Expr {
        let crossing: Vec<(NodeId, NodeId)> = self
            .terminals
            .iter()
            .flat_map(|t| next.heads.iter().map(move |h| (t.clone(), h.clone())))
            .collect();
        let mut edges = joined(self.edges, next.edges);
        edges.extend(crossing);
        Expr {
            nodes: joined(self.nodes, next.nodes),
            edges,
            heads: self.heads,
            terminals: next.terminals,
        }
    }
}

impl BitOr for Expr {
    type Output = Expr;

    /// Side by side: a disjoint union.
    fn bitor(self, other: Expr) -> Expr {
        Expr {
            nodes: joined(self.nodes, other.nodes),
            edges: joined(self.edges, other.edges),
            heads: joined(self.heads, other.heads),
            terminals: joined(self.terminals, other.terminals),
        }
    }
}
