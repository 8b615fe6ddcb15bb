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
use crate::model::decision::{Decision, Decisions};
use crate::model::graph::{Graph, GraphError};
use crate::model::id::NodeId;
use crate::model::node::{Ctx, Node, NodeError, Transition};
use crate::model::value::Value;

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
    /// The implementations of the nodes inside its decision steps, by namespaced id: in the
    /// catalog, not the graph.
    inner: Vec<(NodeId, Arc<dyn Node>)>,
    /// Its decision steps ([`each`], [`switch`], [`repeat`]) and theirs, by namespaced id.
    decisions: Vec<(String, Decision)>,
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
        inner: Vec::new(),
        decisions: Vec::new(),
    }
}

/// The node of an [`each`] step: never called, since the plan runs its body on each item.
struct RunByItsPlan;

impl Node for RunByItsPlan {
    fn forward(&self, _: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        Err(NodeError::new(format!(
            "`each` step `{}` is run by its plan, not called",
            ctx.node()
        )))
    }
}

/// A one-node expression, `id`, that runs `body` on every item of the list it reads, at most
/// `in_flight` at once (`None`: as many as the crew lends), and returns their results in
/// order: a `Map` step once compiled with [`crate::compile_decided`]. The body's ids are
/// namespaced under `id` (`id/inner`).
///
/// # Errors
/// The first [`GraphError`] of `body`, or of its ids once namespaced.
pub fn each(
    id: impl Into<NodeId>,
    body: Expr,
    in_flight: Option<usize>,
) -> Result<Expr, GraphError> {
    let id = id.into();
    let mut step = node(id.clone(), RunByItsPlan);
    let body = step.embed(id.as_str(), body)?;
    step.decisions
        .push((id.to_string(), Decision::Map { body, in_flight }));
    Ok(step)
}

/// A one-node expression, `id`, whose node `selector` returns the key of the case to run —
/// [`Value::Text`] (or an int or a bool, read as text) — which runs on the step's own input:
/// a `Switch` step once compiled. Each case's ids are namespaced under `id/key`.
///
/// # Errors
/// The first [`GraphError`] of a case, or of its ids once namespaced.
pub fn switch(
    id: impl Into<NodeId>,
    selector: impl Node + 'static,
    cases: Vec<(String, Expr)>,
) -> Result<Expr, GraphError> {
    let id = id.into();
    let mut step = node(id.clone(), selector);
    let mut graphs = Vec::with_capacity(cases.len());
    for (key, case) in cases {
        let graph = step.embed(&format!("{id}/{key}"), case)?;
        graphs.push((key, graph));
    }
    step.decisions
        .push((id.to_string(), Decision::Switch { cases: graphs }));
    Ok(step)
}

/// A one-node expression, `id`, that runs `body` on its input, then on its own output, until
/// its node `until` returns a true value for the output (see [`crate::Reading::done`]), at
/// most `max_iterations` times: a `Loop` step once compiled (`loop` is a keyword in Rust).
///
/// # Errors
/// The first [`GraphError`] of `body`, or of its ids once namespaced.
pub fn repeat(
    id: impl Into<NodeId>,
    body: Expr,
    until: impl Node + 'static,
    max_iterations: u32,
) -> Result<Expr, GraphError> {
    let id = id.into();
    let mut step = node(id.clone(), until);
    let body = step.embed(id.as_str(), body)?;
    step.decisions.push((
        id.to_string(),
        Decision::Loop {
            body,
            max_iterations,
        },
    ));
    Ok(step)
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

/// Both lists, in no particular order, grown from the longer: only their contents matter.
fn longer_first<T>(mut a: Vec<T>, mut b: Vec<T>) -> Vec<T> {
    if a.len() < b.len() {
        std::mem::swap(&mut a, &mut b);
    }
    a.append(&mut b);
    a
}

impl Expr {
    /// The node ids, in declaration order.
    pub fn ids(&self) -> impl Iterator<Item = &NodeId> {
        self.nodes.iter().map(|(id, _)| id)
    }

    /// The ids of the nodes inside its decision steps, namespaced (`chunks/clean`): in the
    /// catalog, not the graph. What a policy is set by ([`crate::Policies::set_retry`]), as for
    /// the nodes of [`Expr::ids`].
    pub fn inner_ids(&self) -> impl Iterator<Item = &NodeId> {
        self.inner.iter().map(|(id, _)| id)
    }

    /// Builds the graph and the catalog this expression describes. An expression with
    /// decision steps ([`each`], [`switch`], [`repeat`]) needs [`Expr::somatize_decided`], which
    /// keeps what they run.
    ///
    /// # Errors
    /// The first [`GraphError`] in declaration order: an invalid id, or an id used twice.
    pub fn somatize(self) -> Result<(Graph, Catalog), GraphError> {
        self.somatize_decided()
            .map(|(graph, catalog, _)| (graph, catalog))
    }

    /// Builds the graph, the catalog and the decision steps this expression describes, for
    /// [`crate::compile_decided`].
    ///
    /// # Errors
    /// As [`Expr::somatize`].
    pub fn somatize_decided(self) -> Result<(Graph, Catalog, Decisions), GraphError> {
        let mut graph = Graph::new();
        let mut catalog = Catalog::new();
        for (id, implementation) in self.inner {
            catalog.insert(id, implementation);
        }
        for (id, implementation) in self.nodes {
            graph.add_node(id.clone())?;
            catalog.insert(id, implementation);
        }
        for (from, to) in &self.edges {
            graph.add_edge(from.as_str(), to.as_str())?;
        }
        let mut decisions = Decisions::new();
        for (id, decision) in self.decisions {
            decisions.insert(id, decision);
        }
        Ok((graph, catalog, decisions))
    }

    /// Takes `body` in as what a decision step of this expression runs, every id namespaced
    /// under `prefix`: its implementations and decisions are kept here, its graph returned.
    fn embed(&mut self, prefix: &str, body: Expr) -> Result<Graph, GraphError> {
        let (graph, catalog, decisions) = body.somatize_decided()?;
        let named = |id: &str| format!("{prefix}/{id}");
        let renamed = |graph: &Graph| -> Result<Graph, GraphError> {
            let mut copy = Graph::new();
            for id in graph.nodes() {
                copy.add_node(named(id.as_str()))?;
            }
            for (from, to) in graph.edges() {
                copy.add_edge(&named(from.as_str()), &named(to.as_str()))?;
            }
            Ok(copy)
        };
        for (id, implementation) in catalog.iter() {
            self.inner
                .push((NodeId::new(named(id.as_str())), Arc::clone(implementation)));
        }
        for (id, decision) in decisions.iter() {
            let decision = match decision {
                Decision::Map { body, in_flight } => Decision::Map {
                    body: renamed(body)?,
                    in_flight: *in_flight,
                },
                Decision::Loop {
                    body,
                    max_iterations,
                } => Decision::Loop {
                    body: renamed(body)?,
                    max_iterations: *max_iterations,
                },
                Decision::Switch { cases } => Decision::Switch {
                    cases: cases
                        .iter()
                        .map(|(key, case)| Ok((key.clone(), renamed(case)?)))
                        .collect::<Result<_, GraphError>>()?,
                },
            };
            self.decisions.push((named(id), decision));
        }
        renamed(&graph)
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
            inner: longer_first(self.inner, next.inner),
            decisions: longer_first(self.decisions, next.decisions),
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
            inner: longer_first(self.inner, other.inner),
            decisions: longer_first(self.decisions, other.decisions),
        }
    }
}
