//! Plans as Mermaid `flowchart LR` text, for documents that render Mermaid.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::marks::Marks;
use super::svg::{CACHED_FILL, CACHED_STROKE};
use crate::plan::{decision_label, Plan, Visit};

/// Mermaid names for node ids: the id itself when Mermaid reads it as a plain name, otherwise
/// `soma_n<k>`. Ids in the reserved `soma_` prefix are renamed too, so the two never collide.
struct MermaidNames<'p> {
    names: HashMap<&'p str, String>,
}

impl<'p> MermaidNames<'p> {
    fn name(&mut self, id: &'p str) -> &str {
        let next = self.names.len();
        self.names.entry(id).or_insert_with(|| {
            if mermaid_safe(id) {
                id.to_owned()
            } else {
                format!("soma_n{next}")
            }
        })
    }
}

/// Whether Mermaid reads `id` as a plain node name: ASCII word characters, starting with a
/// letter, not one of its keywords (a node named `end` closes a subgraph), and outside the
/// `soma_` prefix the renamed ids use.
fn mermaid_safe(id: &str) -> bool {
    const KEYWORDS: [&str; 14] = [
        "end",
        "graph",
        "flowchart",
        "subgraph",
        "direction",
        "style",
        "classdef",
        "class",
        "click",
        "linkstyle",
        "call",
        "href",
        "default",
        "interpolate",
    ];
    let lower = id.to_ascii_lowercase();
    id.starts_with(|c: char| c.is_ascii_alphabetic())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&lower.as_str())
        && !lower.starts_with("soma_")
}

/// A node label between double quotes. Mermaid decodes `#name;` entities inside labels, so `#`
/// itself is escaped, as are the characters its HTML rendering would read.
fn mermaid_label(id: &str, out: &mut String) {
    out.push('"');
    for c in id.chars() {
        match c {
            '"' => out.push_str("#quot;"),
            '#' => out.push_str("#35;"),
            '<' => out.push_str("#lt;"),
            '>' => out.push_str("#gt;"),
            '&' => out.push_str("#amp;"),
            _ => out.push(c),
        }
    }
    out.push('"');
}

/// `flowchart LR`: every node with its id as label, a subgraph per wave and per remote slice
/// (labelled with its host), then an arrow for every input of every step, in step order, and
/// last, when some node would be found in a cache, the class that fills those apart.
pub(super) fn plan_mermaid(plan: &Plan, marks: Marks<'_>) -> String {
    let mut names = MermaidNames {
        names: HashMap::new(),
    };
    let mut out = String::from("flowchart LR\n");
    mermaid_nodes(plan, marks, &mut names, &mut out);
    for (node, from) in plan.all_steps() {
        for source in from {
            let source = names.name(source.as_str()).to_owned();
            let target = names.name(node.as_str());
            let _ = writeln!(out, "    {source} --> {target}");
        }
    }
    let cached: Vec<String> = plan
        .steps()
        .into_iter()
        .filter(|(node, _)| marks.cached(node))
        .map(|(node, _)| names.name(node.as_str()).to_owned())
        .collect();
    if !cached.is_empty() {
        let _ = writeln!(
            out,
            "    classDef soma_cached fill:{CACHED_FILL},stroke:{CACHED_STROKE}"
        );
        let _ = writeln!(out, "    class {} soma_cached", cached.join(","));
    }
    out
}

/// Every node, and a subgraph around each wave's, indented by how many waves enclose it; one
/// walk, with no recursion, however deep the plan.
fn mermaid_nodes<'p>(
    plan: &'p Plan,
    marks: Marks<'_>,
    names: &mut MermaidNames<'p>,
    out: &mut String,
) {
    let mut depth = 1;
    let mut waves = 0;
    let mut hosts = 0;
    let mut decisions = 0;
    for visit in plan.visits() {
        match visit {
            Visit::Enter(Plan::Execute { node, .. }) => {
                out.extend(std::iter::repeat_n("    ", depth));
                out.push_str(names.name(node.as_str()));
                out.push('[');
                mermaid_label(&marks.label(node), out);
                out.push_str("]\n");
            }
            Visit::Enter(Plan::Wave(_)) => {
                out.extend(std::iter::repeat_n("    ", depth));
                let _ = writeln!(out, "subgraph soma_wave_{waves} [wave]");
                waves += 1;
                depth += 1;
            }
            Visit::Enter(Plan::Remote { host, .. }) => {
                out.extend(std::iter::repeat_n("    ", depth));
                let _ = write!(out, "subgraph soma_host_{hosts} [");
                mermaid_label(&format!("host {host}"), out);
                out.push_str("]\n");
                hosts += 1;
                depth += 1;
            }
            Visit::Enter(
                decision @ (Plan::Map { node, .. }
                | Plan::Switch { node, .. }
                | Plan::Loop { node, .. }),
            ) => {
                // A frame around the step and what it runs, as a wave's: the step a node of
                // its own, for the arrows into and out of it.
                out.extend(std::iter::repeat_n("    ", depth));
                let _ = write!(out, "subgraph soma_decision_{decisions} [");
                mermaid_label(&decision_label(decision, node.as_str()), out);
                out.push_str("]\n");
                decisions += 1;
                out.extend(std::iter::repeat_n("    ", depth + 1));
                out.push_str(names.name(node.as_str()));
                out.push('{');
                mermaid_label(&marks.label(node), out);
                out.push_str("}\n");
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
                out.push_str("end\n");
            }
            Visit::Enter(Plan::Empty | Plan::Sequence(_))
            | Visit::Leave(Plan::Empty | Plan::Execute { .. } | Plan::Sequence(_)) => {}
        }
    }
}

impl Plan {
    /// The plan as a Mermaid `flowchart LR`: a node per step labelled with its id, a
    /// `subgraph` per wave, an arrow for every input. Ids Mermaid cannot read as names are
    /// renamed `soma_n<k>` and keep their id as label.
    pub fn to_mermaid(&self) -> String {
        plan_mermaid(self, Marks::default())
    }
}
