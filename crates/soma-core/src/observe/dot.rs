//! Plans as graphviz DOT text, for people who have graphviz.

use std::fmt::Write as _;

use super::marks::Marks;
use super::svg::{CACHED_FILL, CACHED_STROKE, HOST_STROKE, NODE_FILL, NODE_STROKE, WAVE_STROKE};
use crate::plan::{decision_label, Plan, Visit};

/// A DOT id: always quoted, so any node id is one, with `"` and `\` escaped.
fn dot_id(id: &str, out: &mut String) {
    out.push('"');
    for c in id.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// `digraph` with `rankdir=LR`: every node, a `cluster` per wave and per remote slice (labelled
/// `host <name>`; graphviz frames those), then
/// an edge for every input of every step, in step order.
pub(super) fn plan_dot(plan: &Plan, marks: Marks<'_>) -> String {
    let mut out = String::from("digraph plan {\n");
    out.push_str("    rankdir=LR;\n");
    let _ = writeln!(
        out,
        "    node [shape=box, style=\"rounded,filled\", fillcolor=\"{NODE_FILL}\", color=\"{NODE_STROKE}\", fontname=\"monospace\"];"
    );
    dot_nodes(plan, marks, &mut out);
    for (node, from) in plan.all_steps() {
        for source in from {
            out.push_str("    ");
            dot_id(source.as_str(), &mut out);
            out.push_str(" -> ");
            dot_id(node.as_str(), &mut out);
            out.push_str(";\n");
        }
    }
    out.push_str("}\n");
    out
}

/// Every node, and a cluster around each wave's, indented by how many waves enclose it; one
/// walk, with no recursion, however deep the plan.
fn dot_nodes(plan: &Plan, marks: Marks<'_>, out: &mut String) {
    let mut depth = 1;
    let mut waves = 0;
    let mut hosts = 0;
    let mut decisions = 0;
    for visit in plan.visits() {
        match visit {
            Visit::Enter(Plan::Execute { node, .. }) => {
                out.extend(std::iter::repeat_n("    ", depth));
                dot_id(node.as_str(), out);
                let cached = marks.cached(node);
                if cached || marks.device(node).is_some() {
                    out.push_str(" [label=");
                    dot_id(&marks.label(node), out);
                    if cached {
                        let _ = write!(
                            out,
                            ", fillcolor=\"{CACHED_FILL}\", color=\"{CACHED_STROKE}\""
                        );
                    }
                    out.push(']');
                }
                out.push_str(";\n");
            }
            Visit::Enter(Plan::Wave(_)) => {
                out.extend(std::iter::repeat_n("    ", depth));
                let _ = writeln!(out, "subgraph cluster_wave_{waves} {{");
                waves += 1;
                out.extend(std::iter::repeat_n("    ", depth + 1));
                let _ = writeln!(
                    out,
                    "label=\"wave\"; style=\"dashed,rounded\"; color=\"{WAVE_STROKE}\";"
                );
                depth += 1;
            }
            Visit::Enter(Plan::Remote { host, .. }) => {
                out.extend(std::iter::repeat_n("    ", depth));
                let _ = writeln!(out, "subgraph cluster_host_{hosts} {{");
                hosts += 1;
                out.extend(std::iter::repeat_n("    ", depth + 1));
                out.push_str("label=");
                dot_id(&format!("host {host}"), out);
                let _ = writeln!(out, "; style=\"bold,rounded\"; color=\"{HOST_STROKE}\";");
                depth += 1;
            }
            Visit::Enter(
                decision @ (Plan::Map { node, .. }
                | Plan::Switch { node, .. }
                | Plan::Loop { node, .. }),
            ) => {
                // A frame around the step and what it runs, as a wave's: the step a node of
                // its own, for the edges into and out of it.
                out.extend(std::iter::repeat_n("    ", depth));
                let _ = writeln!(out, "subgraph cluster_decision_{decisions} {{");
                decisions += 1;
                out.extend(std::iter::repeat_n("    ", depth + 1));
                out.push_str("label=");
                dot_id(&decision_label(decision, node.as_str()), out);
                let _ = writeln!(out, "; style=\"dotted,rounded\"; color=\"{WAVE_STROKE}\";");
                out.extend(std::iter::repeat_n("    ", depth + 1));
                dot_id(node.as_str(), out);
                out.push_str(" [shape=diamond, label=");
                dot_id(&marks.label(node), out);
                out.push_str("];\n");
                depth += 1;
            }
            Visit::Leave(
                Plan::Wave(_)
                | Plan::Remote { .. }
                | Plan::Map { .. }
                | Plan::Switch { .. }
                | Plan::Loop { .. },
            ) => {
                depth -= 1;
                out.extend(std::iter::repeat_n("    ", depth));
                out.push_str("}\n");
            }
            Visit::Enter(Plan::Empty | Plan::Sequence(_))
            | Visit::Leave(Plan::Empty | Plan::Execute { .. } | Plan::Sequence(_)) => {}
        }
    }
}

impl Plan {
    /// The plan as a graphviz `digraph` with `rankdir=LR`: a node per step, a `cluster` per
    /// wave, an edge for every input. Every id is quoted.
    pub fn to_dot(&self) -> String {
        plan_dot(self, Marks::default())
    }
}
