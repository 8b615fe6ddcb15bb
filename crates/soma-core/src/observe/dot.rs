//! Plans as graphviz DOT text, for people who have graphviz.

use std::fmt::Write as _;

use super::svg::{NODE_FILL, NODE_STROKE, WAVE_STROKE};
use crate::plan::Plan;

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

/// `digraph` with `rankdir=LR`: every node, a `cluster` per wave (graphviz frames those), then
/// an edge for every input of every step, in step order.
fn plan_dot(plan: &Plan) -> String {
    let mut out = String::from("digraph plan {\n");
    out.push_str("    rankdir=LR;\n");
    let _ = writeln!(
        out,
        "    node [shape=box, style=\"rounded,filled\", fillcolor=\"{NODE_FILL}\", color=\"{NODE_STROKE}\", fontname=\"monospace\"];"
    );
    let mut waves = 0;
    dot_nodes(plan, 1, &mut waves, &mut out);
    for (node, from) in plan.steps() {
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

fn dot_nodes(plan: &Plan, depth: usize, waves: &mut usize, out: &mut String) {
    let indent = "    ".repeat(depth);
    match plan {
        Plan::Empty => {}
        Plan::Execute { node, .. } => {
            out.push_str(&indent);
            dot_id(node.as_str(), out);
            out.push_str(";\n");
        }
        Plan::Sequence(steps) => {
            for step in steps {
                dot_nodes(step, depth, waves, out);
            }
        }
        Plan::Wave(branches) => {
            let _ = writeln!(out, "{indent}subgraph cluster_wave_{waves} {{");
            *waves += 1;
            let _ = writeln!(
                out,
                "{indent}    label=\"wave\"; style=\"dashed,rounded\"; color=\"{WAVE_STROKE}\";"
            );
            for branch in branches {
                dot_nodes(branch, depth + 1, waves, out);
            }
            out.push_str(&indent);
            out.push_str("}\n");
        }
    }
}

impl Plan {
    /// The plan as a graphviz `digraph` with `rankdir=LR`: a node per step, a `cluster` per
    /// wave, an edge for every input. Every id is quoted.
    pub fn to_dot(&self) -> String {
        plan_dot(self)
    }
}
