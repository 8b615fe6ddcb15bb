//! `Decisions`: the steps of a graph that decide as they run, and the sub-graphs they run.
//!
//! A decision step is one node of its graph; what it runs are graphs of their own, kept beside
//! the graph as a placement is, their node ids namespaced under the step's (`chunks/clean`,
//! made by [`crate::Graph::embed`]) and their implementations in the same catalog.
//! [`crate::compile_decided`] makes each a `Map`, `Switch` or `Loop` step of the plan.

use std::collections::HashMap;
use std::fmt;

use crate::model::graph::{Graph, GraphError};
use crate::model::id::NodeId;

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

impl Decision {
    /// The same decision, as a step inside another step sees it: the ids of every graph it
    /// runs under `prefix` ([`Graph::embed`]).
    ///
    /// # Errors
    /// As [`Graph::embed`] into an empty graph: [`GraphError::InvalidId`] for a `prefix` that is
    /// no name or path.
    pub fn inside(&self, prefix: &str) -> Result<Decision, GraphError> {
        let embedded = |graph: &Graph| -> Result<Graph, GraphError> {
            let mut copy = Graph::new();
            copy.embed(prefix, graph)?;
            Ok(copy)
        };
        Ok(match self {
            Decision::Map { body, in_flight } => Decision::Map {
                body: embedded(body)?,
                in_flight: *in_flight,
            },
            Decision::Loop {
                body,
                max_iterations,
            } => Decision::Loop {
                body: embedded(body)?,
                max_iterations: *max_iterations,
            },
            Decision::Switch { cases } => Decision::Switch {
                cases: cases
                    .iter()
                    .map(|(key, case)| Ok((key.clone(), embedded(case)?)))
                    .collect::<Result<_, GraphError>>()?,
            },
        })
    }

    /// The prefix of the ids inside the case `key` of switch step `step`: `step/key`
    /// ([`NodeId::inside`]), so that two cases may hold a node of one name
    /// (`route/ocr/parse`, `route/text/parse`).
    ///
    /// # Errors
    /// [`GraphError::SeparatorInKey`] for a key that holds [`NodeId::SEPARATOR`], which would
    /// read as two levels of the path.
    pub fn case_prefix(step: &str, key: &str) -> Result<NodeId, GraphError> {
        if key.contains(NodeId::SEPARATOR) {
            return Err(GraphError::SeparatorInKey {
                step: NodeId::from(step),
                key: key.to_owned(),
            });
        }
        Ok(NodeId::inside(step, key))
    }

    /// The step's kind as Python writes it: `each`, `switch` or `loop`.
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::Map { .. } => "each",
            Decision::Switch { .. } => "switch",
            Decision::Loop { .. } => "loop",
        }
    }
}

/// A setting written on a node by its id, beside the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// The device it runs on.
    Device,
    /// Its retries.
    Retry,
    /// Its time limit.
    TimeLimit,
    /// The host it runs on.
    Host,
    /// How many items of a stream it works on at once.
    Concurrency,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Setting::Device => "device",
            Setting::Retry => "retry",
            Setting::TimeLimit => "time limit",
            Setting::Host => "host",
            Setting::Concurrency => "concurrency",
        })
    }
}

/// Why a setting was refused on an id ([`Decisions::refusal`]); nothing changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SettingError {
    /// `step` is an `each` step, which calls no node of its own.
    NothingToCall {
        /// The step's id.
        step: String,
        /// What was written on it.
        setting: Setting,
    },
    /// `node` is a step of kind `kind`, or inside one: it runs in this process.
    RunsHere {
        /// The id a host was written on.
        node: String,
        /// The kind of the step (`each`, `switch`, `loop`): the node's own, or the innermost
        /// one around it.
        kind: &'static str,
        /// Whether the node is that step itself.
        own: bool,
    },
    /// `node` is inside the step `step`, of kind `kind`: a stream limits the graph's own steps
    /// only, and what a step runs is no stage of it.
    NotAStage {
        /// The id a concurrency was written on.
        node: String,
        /// The innermost step around it.
        step: String,
        /// That step's kind (`each`, `switch`, `loop`).
        kind: &'static str,
    },
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingError::NothingToCall { step, setting } => write!(
                f,
                "`{step}` is an `each` step, which calls no node of its own: a {setting} has nothing to apply to\nhint: set it on the nodes inside (`{step}/...`, listed by `g.plan()`), or write it on the step before it is registered (`soma.each(...)` then `.retry(...)`), which gives it to each node inside that has none"
            ),
            SettingError::RunsHere { node, kind, own } => {
                let article = if *kind == "each" { "an" } else { "a" };
                let is = if *own { "is" } else { "is in" };
                write!(
                    f,
                    "`{node}` {is} {article} `{kind}` step, which runs in this process: it cannot be placed on a host\nhint: place the whole graph's other nodes with `.at()`, and keep `each`, `switch` and `loop` steps, and what they run, here"
                )
            }
            SettingError::NotAStage { node, step, kind } => write!(
                f,
                "`{node}` is inside the `{kind}` step `{step}`: a stream limits the graph's own steps only, so a concurrency has nothing to apply to there\nhint: set it on the step, `g.concurrency(\"{step}\", n)`, which then takes that many items at once"
            ),
        }
    }
}

impl std::error::Error for SettingError {}

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

    /// Takes in `inner`'s decision steps as the steps inside a step: each under `prefix`, its
    /// id as [`Graph::embed`] names it and its graphs' ids so too ([`Decision::inside`]).
    ///
    /// # Errors
    /// As [`Decision::inside`]; the decisions are unchanged.
    pub fn embed(&mut self, prefix: &str, inner: &Decisions) -> Result<(), GraphError> {
        let embedded = inner
            .iter()
            .map(|(id, decision)| Ok((NodeId::inside(prefix, id), decision.inside(prefix)?)))
            .collect::<Result<Vec<_>, GraphError>>()?;
        for (id, decision) in embedded {
            self.insert(id.as_str(), decision);
        }
        Ok(())
    }

    /// What node `id` decides, if it is a decision step.
    pub fn get(&self, id: &str) -> Option<&Decision> {
        self.by_node.get(id)
    }

    /// Whether no node is a decision step.
    pub fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// Why `setting` cannot be written on node `id`, if it cannot: the one rule of which ids
    /// take which settings, asked wherever a setting is written by id (after the id is known).
    ///
    /// A node inside a step, and a `switch`'s or `loop`'s own node (its selector, its
    /// predicate), take a device, a retry and a time limit as any node does. An `each` step
    /// calls no node of its own, so those have nothing to apply to there. No step, and nothing
    /// inside one, takes a host: a step runs in this process, with what it runs. A step takes a
    /// concurrency as a node does, and nothing inside one does: a stream's stages are the
    /// graph's own steps.
    pub fn refusal(&self, id: &str, setting: Setting) -> Option<SettingError> {
        match setting {
            Setting::Device | Setting::Retry | Setting::TimeLimit => match self.get(id) {
                Some(Decision::Map { .. }) => Some(SettingError::NothingToCall {
                    step: id.to_owned(),
                    setting,
                }),
                Some(Decision::Switch { .. } | Decision::Loop { .. }) | None => None,
            },
            Setting::Host => {
                let (step, decision) = self
                    .get(id)
                    .map(|own| (id, own))
                    .or_else(|| self.around(id))?;
                Some(SettingError::RunsHere {
                    node: id.to_owned(),
                    kind: decision.kind(),
                    own: step == id,
                })
            }
            Setting::Concurrency => {
                let (step, decision) = self.around(id)?;
                Some(SettingError::NotAStage {
                    node: id.to_owned(),
                    step: step.to_owned(),
                    kind: decision.kind(),
                })
            }
        }
    }

    /// The innermost step `id` is inside of, with what it decides: the longest of the prefixes
    /// of its path that is a step (a switch case's prefix is none).
    fn around<'i>(&self, id: &'i str) -> Option<(&'i str, &Decision)> {
        NodeId::prefixes(id)
            .rev()
            .find_map(|step| Some((step, self.get(step)?)))
    }

    /// Every decision step, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Decision)> {
        self.by_node
            .iter()
            .map(|(id, decision)| (id.as_str(), decision))
    }
}
