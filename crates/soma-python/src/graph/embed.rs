//! Embedding a sub-graph: what a decision step (`each`, `switch`, `loop`) runs is another
//! `GraphCore`, copied into this one's catalog, placement, policies and decisions under ids
//! namespaced by the step's (`chunks/clean`); and registering the step itself, its sub-graphs
//! embedded first, then its node.
//!
//! The namespacing is the core's: [`Graph::embed`] and its kin on the catalog, the placement
//! and the decisions make every id inside a step, [`NodeId::inside`] the few this glue keeps
//! (the settings as Python wrote them), so that `/` is written once. A step is checked whole —
//! its id, each case's key, each sub-graph's ids — before anything of it is copied, so that a
//! refused step leaves the graph as it was.
//!
//! Copied rather than referred to, so that the plan compiles and the program resolves from one
//! catalog, as a graph without steps does; the graph it was copied from is kept beside
//! ([`GraphCore::implementation`] finds a node inside by it) for the Python objects it holds.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use soma_core::{Decision, Graph, NodeId};

use super::GraphCore;
use crate::errors::graph_error;

impl GraphCore {
    /// Registers `object` under `id` as a decision step whose node is `object`'s `forward`
    /// (the selector of a `switch`, the predicate of a `loop`), running `bodies`: each with
    /// its case's key for a switch, `None` for the one body of an `each` or a `loop`.
    pub(super) fn add_decision(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        bodies: Vec<(Option<String>, Bound<'_, GraphCore>)>,
        decide: impl FnOnce(Vec<(String, Graph)>) -> Decision,
    ) -> PyResult<()> {
        // Refused before anything is copied, as `add_python` would refuse it.
        if let Some(refused) = self.state().graph.refusal(id) {
            return Err(graph_error(py, &refused));
        }
        let mut checked = Vec::with_capacity(bodies.len());
        for (key, body) in bodies {
            let (prefix, graph) = self.namespaced(py, id, key.as_deref(), &body)?;
            checked.push((key, prefix, graph, body));
        }
        // Its `forward` reads `ctx`, for the step's id in what it raises; an async selector
        // or predicate makes it async.
        let is_async = is_coroutine_function(py, &object.getattr(intern!(py, "forward"))?)?;
        let mut graphs = Vec::with_capacity(checked.len());
        for (key, prefix, graph, body) in checked {
            self.copy_in(py, prefix, body)?;
            graphs.push((key.unwrap_or_default(), graph));
        }
        self.add_python(py, id, object, true, is_async)?;
        self.state().decisions.insert(id, decide(graphs));
        Ok(())
    }

    /// The prefix `body`'s ids take under step `step` — the step's id, or its case `key`'s
    /// (`route/ocr`) — and `body`'s topology under it: what the step's decision runs. Checked
    /// only; nothing is copied.
    fn namespaced(
        &self,
        py: Python<'_>,
        step: &str,
        key: Option<&str>,
        body: &Bound<'_, GraphCore>,
    ) -> PyResult<(NodeId, Graph)> {
        if std::ptr::eq(self, body.get()) {
            return Err(PyValueError::new_err(
                "a graph cannot run itself as a step of its own",
            ));
        }
        let prefix = match key {
            // A switch's cases are namespaced by key too: two may hold a node of one name.
            Some(key) => Decision::case_prefix(step, key).map_err(|e| graph_error(py, &e))?,
            None => NodeId::from(step),
        };
        let mut graph = Graph::new();
        graph
            .embed(prefix.as_str(), &body.get().state().graph)
            .map_err(|e| graph_error(py, &e))?;
        Ok((prefix, graph))
    }

    /// Copies `body` in under `prefix`, checked by [`GraphCore::namespaced`]: its catalog
    /// (its own nodes' and those of the decisions it holds in turn), its placement, its
    /// policies and its decisions; its Python nodes for the collector, and `body` itself for
    /// [`GraphCore::implementation`].
    fn copy_in(&self, py: Python<'_>, prefix: NodeId, body: Bound<'_, GraphCore>) -> PyResult<()> {
        let inner = body.get().state();
        let mut state = self.state();
        // Refused before anything of `body` is copied: only a graph whose step of this id was
        // refused half-way could hold one of these ids, and none is.
        state
            .catalog
            .embed(prefix.as_str(), &inner.catalog)
            .map_err(|e| graph_error(py, &e))?;
        state
            .decisions
            .embed(prefix.as_str(), &inner.decisions)
            .map_err(|e| graph_error(py, &e))?;
        if !inner.placement.is_empty() {
            Arc::make_mut(&mut state.placement).embed(prefix.as_str(), &inner.placement);
        }
        state.policies.embed(py, prefix.as_str(), &inner.policies);
        state
            .python_nodes
            .extend(inner.python_nodes.iter().cloned());
        drop(inner);
        state.bodies.push((prefix, body.unbind()));
        state.compiled = None;
        Ok(())
    }
}

/// Whether `function` is a coroutine function (`async def`).
fn is_coroutine_function(py: Python<'_>, function: &Bound<'_, PyAny>) -> PyResult<bool> {
    static CHECK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    CHECK
        .import(py, "inspect", "iscoroutinefunction")?
        .call1((function,))?
        .is_truthy()
}
