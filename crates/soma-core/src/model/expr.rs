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

use std::collections::{HashSet, VecDeque};
use std::ops::{BitOr, Shr};
use std::sync::Arc;
use std::time::Duration;

use crate::model::catalog::Catalog;
use crate::model::decision::{Decision, Decisions};
use crate::model::graph::{Graph, GraphError};
use crate::model::id::NodeId;
use crate::model::node::{Ctx, Node, NodeError, Transition};
use crate::model::policy::{RetryPolicy, WrittenPolicies};
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
///
/// What [`Expr::retry`] and [`Expr::time_limit`] write travels with it, as plain data, and
/// comes back from [`Expr::somatize_with_policies`] for the run stage.
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
    /// What [`Expr::retry`] and [`Expr::time_limit`] wrote, by (namespaced) id.
    policies: WrittenPolicies,
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
        policies: WrittenPolicies::new(),
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
/// The first [`GraphError`] of a case, or of its ids once namespaced;
/// [`GraphError::SeparatorInKey`] for a key holding [`NodeId::SEPARATOR`].
pub fn switch(
    id: impl Into<NodeId>,
    selector: impl Node + 'static,
    cases: Vec<(String, Expr)>,
) -> Result<Expr, GraphError> {
    let id = id.into();
    let mut step = node(id.clone(), selector);
    let mut graphs = Vec::with_capacity(cases.len());
    for (key, case) in cases {
        let graph = step.embed(Decision::case_prefix(id.as_str(), &key)?.as_str(), case)?;
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
    /// keeps what they run, and one with policies ([`Expr::retry`], [`Expr::time_limit`])
    /// needs [`Expr::somatize_with_policies`], which keeps them: here they are dropped.
    ///
    /// # Errors
    /// The first [`GraphError`] in declaration order: an invalid id, or an id used twice.
    pub fn somatize(self) -> Result<(Graph, Catalog), GraphError> {
        self.somatize_decided()
            .map(|(graph, catalog, _)| (graph, catalog))
    }

    /// Builds the graph, the catalog and the decision steps this expression describes, for
    /// [`crate::compile_decided`]. Its policies are dropped: see
    /// [`Expr::somatize_with_policies`].
    ///
    /// # Errors
    /// As [`Expr::somatize`].
    pub fn somatize_decided(self) -> Result<(Graph, Catalog, Decisions), GraphError> {
        self.somatize_with_policies()
            .map(|(graph, catalog, decisions, _)| (graph, catalog, decisions))
    }

    /// Builds the graph, the catalog, the decision steps and the policies this expression
    /// describes: the policies by node id, the nodes inside decision steps by their namespaced
    /// ids, for the run stage's `Policies::from(&written)` and [`crate::Program::resolved`].
    ///
    /// # Errors
    /// As [`Expr::somatize`].
    pub fn somatize_with_policies(
        self,
    ) -> Result<(Graph, Catalog, Decisions, WrittenPolicies), GraphError> {
        let mut graph = Graph::new();
        let mut catalog = Catalog::new();
        // A node inside a step is named `step/node` (no node of the graph is: `add_node` refuses
        // the separator); two steps of one id would have their nodes share implementations.
        let mut file = |id: NodeId, implementation| match catalog.insert(id.clone(), implementation)
        {
            Some(_) => Err(GraphError::DuplicateNode { id }),
            None => Ok(()),
        };
        for (id, implementation) in self.inner {
            file(id, implementation)?;
        }
        for (id, implementation) in self.nodes {
            graph.add_node(id.clone())?;
            file(id, implementation)?;
        }
        for (from, to) in &self.edges {
            graph.add_edge(from.as_str(), to.as_str())?;
        }
        let mut decisions = Decisions::new();
        for (id, decision) in self.decisions {
            decisions.insert(id, decision);
        }
        Ok((graph, catalog, decisions, self.policies))
    }

    /// Retries a failing call of every node of the expression that has no retries yet — the
    /// nodes inside its decision steps too — up to `times` more times, the first pause
    /// `backoff`, each next twice the last (at most [`crate::MAX_BACKOFF`]) and up to
    /// [`crate::JITTER`] longer at random; every node error and time limit is retried (see
    /// [`Expr::retry_with`] to choose which). Each node is retried on its own: the expression
    /// is not run again as a whole. Retries written first — on a node, or on an inner
    /// expression — win, as Python's `.retry()` on an expression; a decision step's own node
    /// (a [`switch`]'s selector, a [`repeat`]'s predicate) is given none, as in Python.
    ///
    /// The run's error after every attempt failed is `RunError::Retried`, with the count and
    /// the last attempt's error; each attempt is a span of the trace.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use std::time::Duration;
    ///
    /// use soma_core::{compile_decided, node, Executor, NodeError, Placement, Policies, Program, Value};
    ///
    /// let calls = Arc::new(AtomicU32::new(0));
    /// let counted = Arc::clone(&calls);
    /// let flaky = move |x: &Value| -> Result<Value, NodeError> {
    ///     match counted.fetch_add(1, Ordering::SeqCst) {
    ///         0 | 1 => Err(NodeError::new("connection refused")),
    ///         _ => Ok(x.clone()),
    ///     }
    /// };
    /// let expr = node("fetch", flaky).retry(3, Duration::from_millis(1));
    /// let (graph, catalog, decisions, written) = expr.somatize_with_policies()?;
    /// let plan = compile_decided(&graph, &catalog, &decisions)?;
    /// let policies = Policies::from(&written);
    /// let program = Program::resolved(&plan, &catalog, &Placement::new(), &policies)?;
    /// assert_eq!(Executor::new().run_program(&program, Value::Int(7))?, Value::Int(7));
    /// assert_eq!(calls.load(Ordering::SeqCst), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn retry(self, times: u32, backoff: Duration) -> Expr {
        self.retry_with(&RetryPolicy::new(times, backoff))
    }

    /// As [`Expr::retry`], with the retries `policy` says: which failed attempts it retries is
    /// its [`RetryPolicy::on`] filter.
    ///
    /// ```
    /// use std::io;
    /// use std::time::Duration;
    ///
    /// use soma_core::{node, AttemptError, NodeError, RetryPolicy, Value};
    ///
    /// let fetch = |_: &Value| -> Result<Value, NodeError> {
    ///     Err(NodeError::from_cause(io::Error::from(io::ErrorKind::ConnectionRefused)))
    /// };
    /// // Retries what the network said, and a call that overran; not a bug of the node's.
    /// let passing = RetryPolicy::new(3, Duration::from_millis(500)).on(|failed| match failed {
    ///     AttemptError::Node(error) => error.cause().is_some_and(|cause| cause.is::<io::Error>()),
    ///     AttemptError::TimeLimit(_) => true,
    /// });
    /// let expr = node("fetch", fetch)
    ///     .time_limit(Duration::from_secs(2))
    ///     .retry_with(&passing);
    /// let (_, _, _, written) = expr.somatize_with_policies()?;
    /// let policy = written.get("fetch").unwrap();
    /// assert_eq!(policy.retry.as_ref().map(RetryPolicy::times), Some(3));
    /// assert_eq!(policy.time_limit, Some(Duration::from_secs(2)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn retry_with(mut self, policy: &RetryPolicy) -> Expr {
        for id in self.called_ids() {
            self.policies.retry_unless_set(&id, policy);
        }
        self
    }

    /// Holds every call of every node of the expression that has no time limit yet — the
    /// nodes inside its decision steps too — to `limit`: a call still running after it fails
    /// with `RunError::TimeLimit` naming the node, its thread left to finish it in the
    /// background, its result dropped. The limit is each node's, not the expression's as a
    /// whole; one written first wins, and a decision step's own node is given none, as for
    /// [`Expr::retry`]. With [`Expr::retry`], a call that overran is tried again.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// use soma_core::{each, node, NodeError, Value};
    ///
    /// let same = |x: &Value| -> Result<Value, NodeError> { Ok(x.clone()) };
    /// let body = node("clean", same) >> node("embed", same).time_limit(Duration::from_secs(5));
    /// let expr = (node("split", same) >> each("chunks", body, None)?).time_limit(Duration::from_secs(1));
    /// let (_, _, _, written) = expr.somatize_with_policies()?;
    /// let limit = |id: &str| written.get(id).and_then(|policy| policy.time_limit);
    /// assert_eq!(limit("split"), Some(Duration::from_secs(1)));
    /// assert_eq!(limit("chunks/clean"), Some(Duration::from_secs(1)));
    /// assert_eq!(limit("chunks/embed"), Some(Duration::from_secs(5)));
    /// assert_eq!(limit("chunks"), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Panics
    /// On a `limit` of zero, which no call could meet.
    #[must_use]
    pub fn time_limit(mut self, limit: Duration) -> Expr {
        assert!(
            !limit.is_zero(),
            "a time limit of zero fails every call\nhint: give a limit above zero"
        );
        for id in self.called_ids() {
            self.policies.limit_unless_set(&id, limit);
        }
        self
    }

    /// The ids of the nodes a run calls as they are — every node of the graph and inside its
    /// decision steps, but the decision steps' own — which a policy reaches.
    fn called_ids(&self) -> Vec<NodeId> {
        let steps: HashSet<&str> = self.decisions.iter().map(|(id, _)| id.as_str()).collect();
        self.ids()
            .chain(self.inner_ids())
            .filter(|id| !steps.contains(id.as_str()))
            .cloned()
            .collect()
    }

    /// Takes `body` in as what a decision step of this expression runs, every id under
    /// `prefix` ([`Graph::embed`]): its implementations and decisions are kept here, its graph
    /// returned.
    fn embed(&mut self, prefix: &str, body: Expr) -> Result<Graph, GraphError> {
        let (graph, catalog, decisions, policies) = body.somatize_with_policies()?;
        let mut embedded = Graph::new();
        embedded.embed(prefix, &graph)?;
        for (id, decision) in decisions.iter() {
            let decision = decision.inside(prefix)?;
            self.decisions
                .push((NodeId::inside(prefix, id).to_string(), decision));
        }
        for (id, implementation) in catalog.iter() {
            self.inner.push((
                NodeId::inside(prefix, id.as_str()),
                Arc::clone(implementation),
            ));
        }
        self.policies = std::mem::take(&mut self.policies).joined(policies.inside(prefix));
        Ok(embedded)
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
            policies: self.policies.joined(next.policies),
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
            policies: self.policies.joined(other.policies),
        }
    }
}
