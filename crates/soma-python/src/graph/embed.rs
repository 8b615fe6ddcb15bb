//! Embedding a sub-graph: what a decision step (`each`, `switch`, `loop`) runs is another
//! `GraphCore`, copied into this one's catalog, placement, policies and decisions under ids
//! namespaced by the step's (`chunks/clean`); and registering the step itself, its sub-graphs
//! embedded first, then its node.
//!
//! Copied rather than referred to, so that the plan compiles and the program resolves from one
//! catalog, as a graph without steps does; the graph it was copied from is kept beside
//! ([`GraphCore::implementation`] finds a node inside by it) for the Python objects it holds.

use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use soma_core::{Decision, Graph};

use super::GraphCore;
use crate::errors::{graph_error, taken_inside_a_step};
use crate::policy;

impl GraphCore {
    /// Copies `body` into this graph's catalog, placement, policies and decisions, every id
    /// namespaced under `step`'s (`step/id`), and returns its topology so namespaced: the
    /// sub-graph a decision step runs.
    fn embed(&self, py: Python<'_>, step: &str, body: &Bound<'_, GraphCore>) -> PyResult<Graph> {
        if std::ptr::eq(self, body.get()) {
            return Err(PyValueError::new_err(
                "a graph cannot run itself as a step of its own",
            ));
        }
        let inner = body.get().state();
        let named = |id: &str| format!("{step}/{id}");
        let mut graph = Graph::new();
        for id in inner.graph.nodes() {
            graph
                .add_node(named(id.as_str()))
                .map_err(|e| graph_error(py, &e))?;
        }
        for (source, target) in inner.graph.edges() {
            graph
                .add_edge(&named(source.as_str()), &named(target.as_str()))
                .map_err(|e| graph_error(py, &e))?;
        }
        let mut state = self.state();
        // Refused before anything is copied: a node of this graph, or of a step of it, already
        // holds one of the names the body's nodes take here.
        if let Some(taken) = inner
            .catalog
            .iter()
            .map(|(id, _)| named(id.as_str()))
            .find(|id| state.catalog.contains(id) || state.graph.contains(id))
        {
            return Err(taken_inside_a_step(py, &taken));
        }
        // Its whole catalog: its own nodes' and those of the decisions it holds in turn.
        for (id, implementation) in inner.catalog.iter() {
            state
                .catalog
                .insert(named(id.as_str()), Arc::clone(implementation));
            if let Some(device) = inner.placement.device(id.as_str()) {
                Arc::make_mut(&mut state.placement).place(named(id.as_str()), device);
            }
        }
        for (id, (times, backoff, on)) in &inner.policies.retries {
            let retry = policy::retry(py, *times, *backoff, on)?;
            state.policies.policies.set_retry(&named(id), Some(retry));
            state
                .policies
                .retries
                .insert(named(id), (*times, *backoff, on.clone_ref(py)));
        }
        for (id, seconds) in &inner.policies.time_limits {
            let limit = Duration::try_from_secs_f64(*seconds)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            state
                .policies
                .policies
                .set_time_limit(&named(id), Some(limit));
            state.policies.time_limits.insert(named(id), *seconds);
        }
        for (id, decision) in inner.decisions.iter() {
            let renamed = |graph: &Graph| -> PyResult<Graph> {
                let mut copy = Graph::new();
                for node in graph.nodes() {
                    copy.add_node(named(node.as_str()))
                        .map_err(|e| graph_error(py, &e))?;
                }
                for (source, target) in graph.edges() {
                    copy.add_edge(&named(source.as_str()), &named(target.as_str()))
                        .map_err(|e| graph_error(py, &e))?;
                }
                Ok(copy)
            };
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
                        .collect::<PyResult<_>>()?,
                },
            };
            state.decisions.insert(named(id), decision);
        }
        state
            .python_nodes
            .extend(inner.python_nodes.iter().cloned());
        drop(inner);
        state.bodies.push((step.to_owned(), body.clone().unbind()));
        state.compiled = None;
        Ok(graph)
    }

    /// Registers `object` under `id` as a decision step whose node is `object`'s `forward`
    /// (the selector of a `switch`, the predicate of a `loop`), running `bodies`.
    pub(super) fn add_decision(
        &self,
        py: Python<'_>,
        id: &str,
        object: &Bound<'_, PyAny>,
        bodies: Vec<(String, Bound<'_, GraphCore>)>,
        decide: impl FnOnce(Vec<(String, Graph)>) -> Decision,
    ) -> PyResult<()> {
        if self.state().graph.contains(id) {
            // Refused before anything is copied, as `add_python` would refuse it.
            self.add_python(py, id, object, false, false)?;
        }
        let mut graphs = Vec::with_capacity(bodies.len());
        for (key, body) in bodies {
            // A switch's cases are namespaced by key too: two may hold a node of one name.
            let prefix = if key.is_empty() {
                id.to_owned()
            } else {
                format!("{id}/{key}")
            };
            let graph = self.embed(py, &prefix, &body)?;
            graphs.push((key, graph));
        }
        // Its `forward` reads `ctx`, for the step's id in what it raises; an async selector
        // or predicate makes it async.
        let is_async = is_coroutine_function(py, &object.getattr(intern!(py, "forward"))?)?;
        self.add_python(py, id, object, true, is_async)?;
        self.state().decisions.insert(id, decide(graphs));
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
