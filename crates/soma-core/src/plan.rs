//! `Plan`: the decided shape of a run, as a tree.
//!
//! A plan is self-contained: every `Execute` step names where its input comes from, so running
//! it never looks at the graph again, and a plan can be shipped, drawn or compared on its own.
//! It is a closed enum — a new way of running (a device, a micro-batched chain, a remote slice)
//! arrives as one more variant, and every `match` that must decide about it stops compiling.
//!
//! A plan is as deep as the expression it came from nests, and `(((a >> b) | c) >> d) | e …`
//! nests once per operator, so nothing here recurses per level: dropping, cloning, comparing
//! and printing walk the tree with a stack of their own, on the heap, and a plan 100,000 levels
//! deep needs no more thread stack than a flat one. That is also why `Drop`, `Clone`,
//! `PartialEq` and `Debug` are written out rather than derived (the derived ones recurse), and
//! why a plan cannot be destructured by value: take its children out with `std::mem::take`.

use std::collections::HashSet;
use std::fmt;

use crate::model::id::NodeId;

/// How a graph runs.
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
    /// Launch the branches at the same time, each run start to finish on one thread (branches
    /// in flight together on different ones), and join them. Branches share no node.
    Wave(Vec<Plan>),
}

/// One step of [`Plan::visits`].
pub(crate) enum Visit<'p> {
    /// A plan, before its children.
    Enter(&'p Plan),
    /// A plan, after its children.
    Leave(&'p Plan),
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

    /// The steps of a `Sequence` or the branches of a `Wave`; none otherwise.
    pub(crate) fn children(&self) -> &[Plan] {
        match self {
            Plan::Sequence(children) | Plan::Wave(children) => children,
            Plan::Empty | Plan::Execute { .. } => &[],
        }
    }

    /// Every plan of the tree, entered before its children and left after them, in plan order,
    /// from a stack on the heap: the walk that passes over a whole tree take instead of
    /// recursing per level.
    pub(crate) fn visits(&self) -> impl Iterator<Item = Visit<'_>> {
        let mut stack = vec![Visit::Enter(self)];
        std::iter::from_fn(move || {
            let next = stack.pop()?;
            if let Visit::Enter(entered) = next {
                stack.push(Visit::Leave(entered));
                stack.extend(entered.children().iter().rev().map(Visit::Enter));
            }
            Some(next)
        })
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
        // Whether the next plan entered is the first in its list, so takes no separator.
        let mut first = true;
        for visit in self.visits() {
            match visit {
                Visit::Enter(plan) => {
                    if !first {
                        out.push_str(", ");
                    }
                    first = false;
                    match plan {
                        Plan::Empty => out.push_str("Empty"),
                        Plan::Execute { node, .. } => {
                            out.push_str("Execute");
                            if with_ids {
                                out.push('(');
                                out.push_str(node.as_str());
                                out.push(')');
                            }
                        }
                        Plan::Sequence(_) | Plan::Wave(_) => {
                            out.push_str(plan.kind());
                            out.push_str("([");
                            first = true;
                        }
                    }
                }
                Visit::Leave(Plan::Sequence(_) | Plan::Wave(_)) => {
                    out.push_str("])");
                    first = false;
                }
                Visit::Leave(Plan::Empty | Plan::Execute { .. }) => {}
            }
        }
    }
}

impl Drop for Plan {
    /// Moves the children onto a stack of its own and drops them from there, each emptied of
    /// its own children first, so a deep tree drops in a loop. The derived drop would recurse
    /// once per level.
    fn drop(&mut self) {
        let (Plan::Sequence(children) | Plan::Wave(children)) = self else {
            return;
        };
        let mut stack = std::mem::take(children);
        while let Some(mut plan) = stack.pop() {
            if let Plan::Sequence(children) | Plan::Wave(children) = &mut plan {
                stack.append(children);
            }
        }
    }
}

impl Clone for Plan {
    /// Copies bottom up: a `Sequence` or `Wave` is rebuilt when it is left, from the copies of
    /// its children on top of `done`.
    fn clone(&self) -> Self {
        let mut done: Vec<Plan> = Vec::new();
        for visit in self.visits() {
            match visit {
                Visit::Enter(Plan::Empty) => done.push(Plan::Empty),
                Visit::Enter(Plan::Execute { node, from }) => done.push(Plan::Execute {
                    node: node.clone(),
                    from: from.clone(),
                }),
                Visit::Enter(Plan::Sequence(_) | Plan::Wave(_))
                | Visit::Leave(Plan::Empty | Plan::Execute { .. }) => {}
                Visit::Leave(plan @ (Plan::Sequence(_) | Plan::Wave(_))) => {
                    let children = done.split_off(done.len() - plan.children().len());
                    done.push(match plan {
                        Plan::Sequence(_) => Plan::Sequence(children),
                        _ => Plan::Wave(children),
                    });
                }
            }
        }
        done.pop().expect("the walk leaves the root last")
    }
}

impl PartialEq for Plan {
    /// Structural equality, pair by pair from a stack, left to right as the derived one would.
    fn eq(&self, other: &Plan) -> bool {
        let mut pairs = vec![(self, other)];
        while let Some(pair) = pairs.pop() {
            match pair {
                (Plan::Empty, Plan::Empty) => {}
                (
                    Plan::Execute { node, from },
                    Plan::Execute {
                        node: other_node,
                        from: other_from,
                    },
                ) => {
                    if node != other_node || from != other_from {
                        return false;
                    }
                }
                (Plan::Sequence(children), Plan::Sequence(others))
                | (Plan::Wave(children), Plan::Wave(others)) => {
                    if children.len() != others.len() {
                        return false;
                    }
                    pairs.extend(children.iter().zip(others).rev());
                }
                _ => return false,
            }
        }
        true
    }
}

impl Eq for Plan {}

impl fmt::Debug for Plan {
    /// What `#[derive(Debug)]` prints, `{:#?}` included, written from one walk: the derived
    /// impl would recurse once per level.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            self.debug_pretty(f)
        } else {
            self.debug_line(f)
        }
    }
}

impl Plan {
    /// `{:?}`: `Sequence([Execute { node: "a", from: [] }, Wave([])])`.
    fn debug_line(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for visit in self.visits() {
            match visit {
                Visit::Enter(plan) => {
                    if !first {
                        f.write_str(", ")?;
                    }
                    first = false;
                    match plan {
                        Plan::Empty => f.write_str("Empty")?,
                        Plan::Execute { node, from } => {
                            write!(f, "Execute {{ node: {node:?}, from: {from:?} }}")?;
                        }
                        Plan::Sequence(_) | Plan::Wave(_) => {
                            write!(f, "{}([", plan.kind())?;
                            first = true;
                        }
                    }
                }
                Visit::Leave(Plan::Sequence(_) | Plan::Wave(_)) => {
                    f.write_str("])")?;
                    first = false;
                }
                Visit::Leave(Plan::Empty | Plan::Execute { .. }) => {}
            }
        }
        Ok(())
    }

    /// `{:#?}`: a field or an item per line, indented by four spaces for each variant and each
    /// list around it, every one followed by a comma.
    fn debug_pretty(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pad = |f: &mut fmt::Formatter<'_>, levels: usize| -> fmt::Result {
            (0..levels).try_for_each(|_| f.write_str("    "))
        };
        // How many `Sequence`s and `Wave`s enclose the plan being written: each indents its
        // children twice, once for itself and once for its list.
        let mut depth = 0;
        for visit in self.visits() {
            match visit {
                Visit::Enter(plan) => {
                    pad(f, 2 * depth)?;
                    match plan {
                        Plan::Empty => f.write_str("Empty")?,
                        Plan::Execute { node, from } => {
                            f.write_str("Execute {\n")?;
                            pad(f, 2 * depth + 1)?;
                            writeln!(f, "node: {node:?},")?;
                            pad(f, 2 * depth + 1)?;
                            if from.is_empty() {
                                f.write_str("from: [],\n")?;
                            } else {
                                f.write_str("from: [\n")?;
                                for source in from {
                                    pad(f, 2 * depth + 2)?;
                                    writeln!(f, "{source:?},")?;
                                }
                                pad(f, 2 * depth + 1)?;
                                f.write_str("],\n")?;
                            }
                            pad(f, 2 * depth)?;
                            f.write_str("}")?;
                        }
                        Plan::Sequence(children) | Plan::Wave(children) => {
                            writeln!(f, "{}(", plan.kind())?;
                            pad(f, 2 * depth + 1)?;
                            f.write_str(if children.is_empty() { "[]" } else { "[\n" })?;
                            depth += 1;
                        }
                    }
                }
                Visit::Leave(plan) => {
                    if let Plan::Sequence(children) | Plan::Wave(children) = plan {
                        depth -= 1;
                        if !children.is_empty() {
                            pad(f, 2 * depth + 1)?;
                            f.write_str("]")?;
                        }
                        f.write_str(",\n")?;
                        pad(f, 2 * depth)?;
                        f.write_str(")")?;
                    }
                    // An item of the list around it.
                    if depth > 0 {
                        f.write_str(",\n")?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The hand-written impls against what the derived ones would do, on small plans.

    use super::Plan;
    use crate::model::id::NodeId;

    /// `Plan`'s shape with the derived `Debug`.
    #[derive(Debug)]
    #[expect(
        dead_code,
        reason = "the fields are there to be printed by the derived `Debug`"
    )]
    enum Derived {
        Empty,
        Execute { node: NodeId, from: Vec<NodeId> },
        Sequence(Vec<Derived>),
        Wave(Vec<Derived>),
    }

    fn derived(plan: &Plan) -> Derived {
        match plan {
            Plan::Empty => Derived::Empty,
            Plan::Execute { node, from } => Derived::Execute {
                node: node.clone(),
                from: from.clone(),
            },
            Plan::Sequence(children) => Derived::Sequence(children.iter().map(derived).collect()),
            Plan::Wave(children) => Derived::Wave(children.iter().map(derived).collect()),
        }
    }

    fn execute(node: &str, from: &[&str]) -> Plan {
        Plan::Execute {
            node: node.into(),
            from: from.iter().map(|&id| id.into()).collect(),
        }
    }

    fn plans() -> Vec<Plan> {
        vec![
            Plan::Empty,
            execute("a", &[]),
            execute("b", &["a", "x\"y"]),
            Plan::Sequence(Vec::new()),
            Plan::Wave(vec![Plan::Empty, Plan::Sequence(Vec::new())]),
            Plan::Sequence(vec![
                execute("a", &[]),
                Plan::Wave(vec![
                    Plan::Sequence(vec![execute("b", &["a"]), execute("b2", &["b"])]),
                    execute("c", &["a"]),
                    Plan::Empty,
                ]),
                execute("d", &["b2", "c"]),
            ]),
        ]
    }

    #[test]
    fn debug_prints_what_the_derived_impl_printed_on_one_line_and_pretty() {
        for plan in plans() {
            assert_eq!(format!("{plan:?}"), format!("{:?}", derived(&plan)));
            assert_eq!(format!("{plan:#?}"), format!("{:#?}", derived(&plan)));
        }
    }

    #[test]
    fn a_clone_equals_its_plan_and_no_other() {
        let plans = plans();
        for (i, plan) in plans.iter().enumerate() {
            let copy = plan.clone();
            assert_eq!(format!("{copy:?}"), format!("{plan:?}"));
            for (j, other) in plans.iter().enumerate() {
                assert_eq!(copy == *other, i == j, "{copy:?} against {other:?}");
            }
        }
    }
}
