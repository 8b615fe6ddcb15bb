//! `Plan`: the decided shape of a run, as a tree.
//!
//! A plan is self-contained: every `Execute` step names where its input comes from, so running
//! it never looks at the graph again, and a plan can be shipped, drawn or compared on its own.
//! It is a closed enum — a new way of running (a device, a micro-batched chain, a remote slice)
//! arrives as one more variant, and every `match` that must decide about it stops compiling.

use std::collections::HashSet;

use crate::model::id::NodeId;

/// How a graph runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing to run: the input is the output.
    Empty,
    /// Run one node.
    Execute {
        /// The node.
        node: NodeId,
        /// Its predecessors, in edge-declaration order; empty means the graph's input.
        from: Vec<NodeId>,
    },
    /// Run the steps one after the other.
    Sequence(Vec<Plan>),
    /// Launch the branches at the same time, each start to finish on its own thread, and join
    /// them. Branches share no node.
    Wave(Vec<Plan>),
}

impl Plan {
    /// The `Execute` steps, depth first, in the order a sequential run would take them.
    pub fn steps(&self) -> Vec<(&NodeId, &[NodeId])> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(plan) = stack.pop() {
            match plan {
                Plan::Empty => {}
                Plan::Execute { node, from } => out.push((node, from.as_slice())),
                Plan::Sequence(children) | Plan::Wave(children) => {
                    stack.extend(children.iter().rev());
                }
            }
        }
        out
    }

    /// The nodes whose output no step reads — what a run returns — in step order.
    pub fn leaves(&self) -> Vec<&NodeId> {
        let steps = self.steps();
        let read: HashSet<&NodeId> = steps.iter().flat_map(|(_, from)| from.iter()).collect();
        steps
            .into_iter()
            .map(|(node, _)| node)
            .filter(|node| !read.contains(node))
            .collect()
    }

    /// The plan's variant name: `"Empty"`, `"Execute"`, `"Sequence"` or `"Wave"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Plan::Empty => "Empty",
            Plan::Execute { .. } => "Execute",
            Plan::Sequence(_) => "Sequence",
            Plan::Wave(_) => "Wave",
        }
    }

    /// The tree without ids: `Sequence([Execute, Wave([Execute, Execute])])`.
    pub fn shape(&self) -> String {
        let mut out = String::new();
        self.write_compact(&mut out, false);
        out
    }

    /// The tree on one line, with ids: `Sequence([Execute(a), Wave([Execute(b), Execute(c)])])`.
    /// Python's `repr(plan)`. `Display` is the indented tree instead (see the drawing module).
    pub fn compact(&self) -> String {
        let mut out = String::new();
        self.write_compact(&mut out, true);
        out
    }

    fn write_compact(&self, out: &mut String, with_ids: bool) {
        match self {
            Plan::Empty => out.push_str("Empty"),
            Plan::Execute { node, .. } => {
                out.push_str("Execute");
                if with_ids {
                    out.push('(');
                    out.push_str(node.as_str());
                    out.push(')');
                }
            }
            Plan::Sequence(children) | Plan::Wave(children) => {
                out.push_str(self.kind());
                out.push_str("([");
                for (i, child) in children.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    child.write_compact(out, with_ids);
                }
                out.push_str("])");
            }
        }
    }
}
