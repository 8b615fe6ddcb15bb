//! `compile_decided`: a graph whose steps may decide as they run — a `Map` over the items of a
//! list, a `Switch` between cases, a `Loop` until done — compiled into one plan.
//!
//! Such a step is one node of the graph, like any other: the topology around it compiles as
//! before. What it runs are graphs of their own ([`Decision`]), kept beside the graph as a
//! placement is, whose node ids are namespaced under the step's (`chunks/clean`) and whose
//! implementations sit in the same catalog ([`Decisions`]); each is compiled into the sub-plan the step holds.
//! A decision inside a decision is compiled the same way, at any depth: every few levels the
//! next is compiled on a fresh stack ([`crate::nesting`]), so no stack grows with the nesting.

use crate::compile::{compile, CompileError};
use crate::model::catalog::Catalog;
use crate::model::decision::{Decision, Decisions};
use crate::model::graph::Graph;
use crate::nesting::nested;
use crate::plan::{Plan, Visit};

/// Compiles `graph` as [`compile`] does, each node that `decisions` names becoming the
/// `Map`, `Switch` or `Loop` step that runs its sub-graphs, compiled from the same catalog.
///
/// # Errors
/// [`CompileError::MissingImplementation`] for a node of the graph or of a sub-graph without
/// an implementation.
///
/// # Complexity
/// That of [`compile`] over the graph and every sub-graph.
pub fn compile_decided(
    graph: &Graph,
    catalog: &Catalog,
    decisions: &Decisions,
) -> Result<Plan, CompileError> {
    compiled_at(graph, catalog, decisions, 0)
}

fn compiled_at(
    graph: &Graph,
    catalog: &Catalog,
    decisions: &Decisions,
    depth: usize,
) -> Result<Plan, CompileError> {
    let plan = compile(graph, catalog)?;
    if decisions.is_empty()
        || !plan
            .steps()
            .iter()
            .any(|(node, _)| decisions.get(node.as_str()).is_some())
    {
        return Ok(plan);
    }
    let inner = |sub: &Graph| {
        nested(depth + 1, || {
            compiled_at(sub, catalog, decisions, depth + 1)
        })
    };
    // Rebuilt bottom up, as `Plan::clone` does, each decision node made its step.
    let mut done: Vec<Plan> = Vec::new();
    for visit in plan.visits() {
        match visit {
            Visit::Enter(Plan::Empty) => done.push(Plan::Empty),
            Visit::Enter(Plan::Execute { node, from }) => {
                let from = from.clone();
                let node = node.clone();
                let step = match decisions.get(node.as_str()) {
                    None => Plan::Execute { node, from },
                    Some(Decision::Map { body, in_flight }) => Plan::Map {
                        body: Box::new(inner(body)?),
                        node,
                        from,
                        in_flight: *in_flight,
                    },
                    Some(Decision::Loop {
                        body,
                        max_iterations,
                    }) => Plan::Loop {
                        body: Box::new(inner(body)?),
                        node,
                        from,
                        max_iterations: *max_iterations,
                    },
                    Some(Decision::Switch { cases }) => {
                        let mut keys = Vec::with_capacity(cases.len());
                        let mut plans = Vec::with_capacity(cases.len());
                        for (key, case) in cases {
                            keys.push(key.clone());
                            plans.push(inner(case)?);
                        }
                        Plan::Switch {
                            node,
                            from,
                            keys,
                            cases: plans,
                        }
                    }
                };
                done.push(step);
            }
            Visit::Leave(Plan::Sequence(children)) => {
                let children = done.split_off(done.len() - children.len());
                done.push(Plan::Sequence(children));
            }
            Visit::Leave(Plan::Wave(children)) => {
                let children = done.split_off(done.len() - children.len());
                done.push(Plan::Wave(children));
            }
            // `compile` makes none of these, and rebuilds nothing on the way in.
            Visit::Enter(
                Plan::Sequence(_)
                | Plan::Wave(_)
                | Plan::Remote { .. }
                | Plan::Map { .. }
                | Plan::Switch { .. }
                | Plan::Loop { .. },
            )
            | Visit::Leave(
                Plan::Empty
                | Plan::Execute { .. }
                | Plan::Remote { .. }
                | Plan::Map { .. }
                | Plan::Switch { .. }
                | Plan::Loop { .. },
            ) => {}
        }
    }
    Ok(done.pop().expect("the walk leaves the root last"))
}
