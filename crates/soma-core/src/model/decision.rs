//! `Decisions`: the steps of a graph that decide as they run, and the sub-graphs they run.
//!
//! A decision step is one node of its graph; what it runs are graphs of their own, kept beside
//! the graph as a placement is, their node ids namespaced under the step's (`chunks/clean`) and
//! their implementations in the same catalog. [`crate::compile_decided`] makes each a `Map`,
//! `Switch` or `Loop` step of the plan.

use std::collections::HashMap;

use crate::model::graph::Graph;

/// What a decision step runs: its sub-graphs, their node ids namespaced under the step's.
#[derive(Clone)]
pub enum Decision {
    /// Run `body` on each item of the list the step reads (see `Plan::Map`).
    Map {
        /// What runs on each item.
        body: Graph,
        /// How many items at once at most; `None` leaves it to the crew.
        in_flight: Option<usize>,
    },
    /// Run the case whose key the step's node (the selector) returns (see `Plan::Switch`).
    Switch {
        /// The cases, by key, in order.
        cases: Vec<(String, Graph)>,
    },
    /// Run `body` until the step's node (the predicate) says done (see `Plan::Loop`).
    Loop {
        /// What runs each iteration.
        body: Graph,
        /// How many iterations at most.
        max_iterations: u32,
    },
}

/// The decision steps of a graph, by node id.
#[derive(Clone, Default)]
pub struct Decisions {
    by_node: HashMap<String, Decision>,
}

impl Decisions {
    /// No decision step.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes node `id` a decision step; returns what it replaced.
    pub fn insert(&mut self, id: impl Into<String>, decision: Decision) -> Option<Decision> {
        self.by_node.insert(id.into(), decision)
    }

    /// What node `id` decides, if it is a decision step.
    pub fn get(&self, id: &str) -> Option<&Decision> {
        self.by_node.get(id)
    }

    /// Whether no node is a decision step.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// Every decision step, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Decision)> {
        self.by_node
            .iter()
            .map(|(id, decision)| (id.as_str(), decision))
    }
}
