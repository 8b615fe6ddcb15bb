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
#[derive(Clone)]
pub struct Expr {
    nodes: Vec<(NodeId, Arc<dyn Node>)>,
    edges: Vec<(NodeId, NodeId)>,
    heads: Vec<NodeId>,
    terminals: Vec<NodeId>,
}

/// A one-node expression.
pub fn node(id: impl Into<NodeId>, implementation: impl Node + 'static) -> Expr {
    node_arc(id, Arc::new(implementation))
}

/// A one-node expression around an implementation that is already shared.
pub fn node_arc(id: impl Into<NodeId>, implementation: Arc<dyn Node>) -> Expr {
    let id = id.into();
    Expr {
        nodes: vec![(id.clone(), implementation)],
        edges: Vec::new(),
        heads: vec![id.clone()],
        terminals: vec![id],
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

    fn union(mut self, other: Expr) -> Expr {
        self.nodes.extend(other.nodes);
        self.edges.extend(other.edges);
        self
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
        let heads = self.heads.clone();
        let terminals = next.terminals.clone();
        let mut expr = self.union(next);
        expr.edges.extend(crossing);
        expr.heads = heads;
        expr.terminals = terminals;
        expr
    }
}

impl BitOr for Expr {
    type Output = Expr;

    /// Side by side: a disjoint union.
    fn bitor(self, other: Expr) -> Expr {
        let mut heads = self.heads.clone();
        heads.extend(other.heads.iter().cloned());
        let mut terminals = self.terminals.clone();
        terminals.extend(other.terminals.iter().cloned());
        let mut expr = self.union(other);
        expr.heads = heads;
        expr.terminals = terminals;
        expr
    }
}
