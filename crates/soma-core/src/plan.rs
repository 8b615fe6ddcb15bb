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

use crate::model::host::HostName;
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
    /// Run `inner` on `host`, in one trip: what it reads from outside is sent there, what later
    /// steps read comes back. Only [`crate::distribute`] makes these; [`crate::compile()`]
    /// never does.
    Remote {
        /// Where the slice runs.
        host: HostName,
        /// The slice: a subtree every step of which is placed on `host`.
        inner: Box<Plan>,
    },
    /// Run `body` on every item of the list the step reads, items in flight together (at most
    /// `in_flight` at once, as many as the crew lends when `None`), each item's run a branch
    /// with a table of its own; the step's value is the list of results in input order. The
    /// body's ids are namespaced under `node` (`node/inner`).
    Map {
        /// The step: where its value is written, and what the graph calls it.
        node: NodeId,
        /// Its predecessors, as for `Execute`.
        from: Vec<NodeId>,
        /// How many items run at once at most; `None` leaves it to the crew.
        in_flight: Option<usize>,
        /// What runs on each item.
        body: Box<Plan>,
    },
    /// Call `node` (the selector) on what the step reads; it returns one of `keys`, and only the
    /// case of that key runs, on that same input: the step's value is the case's result.
    Switch {
        /// The step, whose implementation is the selector.
        node: NodeId,
        /// Its predecessors, as for `Execute`.
        from: Vec<NodeId>,
        /// The cases' keys, in the order the cases were given.
        keys: Vec<String>,
        /// The cases, one per key, in the same order.
        cases: Vec<Plan>,
    },
    /// Run `body` on what the step reads, then on its own output, until `node` (the predicate)
    /// says the output is done; more than `max_iterations` runs of the body is an error.
    Loop {
        /// The step, whose implementation is the predicate.
        node: NodeId,
        /// Its predecessors, as for `Execute`.
        from: Vec<NodeId>,
        /// How many times the body may run at most.
        max_iterations: u32,
        /// What runs each iteration.
        body: Box<Plan>,
    },
}

/// One step of [`Plan::visits`].
pub(crate) enum Visit<'p> {
    /// A plan, before its children.
    Enter(&'p Plan),
    /// A plan, after its children.
    Leave(&'p Plan),
}

impl Plan {
    /// The steps that write a value of the run's table — `Execute`, and the `Map`, `Switch` and
    /// `Loop` steps themselves, not what runs inside them — depth first, in the order a sequential run would take them.
    pub fn steps(&self) -> Vec<(&NodeId, &[NodeId])> {
        let mut out = Vec::new();
        let mut stack = vec![self];
        while let Some(plan) = stack.pop() {
            match plan {
                Plan::Empty => {}
                Plan::Execute { node, from }
                | Plan::Map { node, from, .. }
                | Plan::Switch { node, from, .. }
                | Plan::Loop { node, from, .. } => out.push((node, from.as_slice())),
                Plan::Sequence(children) | Plan::Wave(children) => {
                    stack.extend(children.iter().rev());
                }
                Plan::Remote { inner, .. } => stack.push(inner),
            }
        }
        out
    }

    /// Every step of the tree, those inside the sub-plans of `Map`, `Switch` and `Loop` too,
    /// each decision before what it runs: what a drawing draws an edge for.
    pub fn all_steps(&self) -> Vec<(&NodeId, &[NodeId])> {
        self.visits()
            .filter_map(|visit| match visit {
                Visit::Enter(plan) => plan.step(),
                Visit::Leave(_) => None,
            })
            .collect()
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

    /// The plan's variant name: `"Empty"`, `"Execute"`, `"Sequence"`, `"Wave"`, `"Remote"`,
    /// `"Map"`, `"Switch"` or `"Loop"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Plan::Empty => "Empty",
            Plan::Execute { .. } => "Execute",
            Plan::Sequence(_) => "Sequence",
            Plan::Wave(_) => "Wave",
            Plan::Remote { .. } => "Remote",
            Plan::Map { .. } => "Map",
            Plan::Switch { .. } => "Switch",
            Plan::Loop { .. } => "Loop",
        }
    }

    /// The steps of a `Sequence`, the branches of a `Wave`, the slice of a `Remote`, the body
    /// of a `Map` or a `Loop`, the cases of a `Switch`; none otherwise.
    pub fn children(&self) -> &[Plan] {
        match self {
            Plan::Sequence(children)
            | Plan::Wave(children)
            | Plan::Switch {
                cases: children, ..
            } => children,
            Plan::Remote { inner, .. } => std::slice::from_ref(inner),
            Plan::Map { body, .. } | Plan::Loop { body, .. } => std::slice::from_ref(body),
            Plan::Empty | Plan::Execute { .. } => &[],
        }
    }

    /// The children that are part of this plan's own run — a `Sequence`'s steps, a `Wave`'s
    /// branches, a `Remote`'s slice — and not the sub-plans a `Map`, `Switch` or `Loop` runs
    /// with tables of their own.
    pub(crate) fn own_children(&self) -> &[Plan] {
        match self {
            Plan::Sequence(children) | Plan::Wave(children) => children,
            Plan::Remote { inner, .. } => std::slice::from_ref(inner),
            Plan::Empty
            | Plan::Execute { .. }
            | Plan::Map { .. }
            | Plan::Switch { .. }
            | Plan::Loop { .. } => &[],
        }
    }

    /// The step of a `Execute`, `Map`, `Switch` or `Loop` (its node and what it reads); none
    /// otherwise.
    pub fn step(&self) -> Option<(&NodeId, &[NodeId])> {
        match self {
            Plan::Execute { node, from }
            | Plan::Map { node, from, .. }
            | Plan::Switch { node, from, .. }
            | Plan::Loop { node, from, .. } => Some((node, from)),
            Plan::Empty | Plan::Sequence(_) | Plan::Wave(_) | Plan::Remote { .. } => None,
        }
    }

    /// The host of a `Remote`; none otherwise.
    pub fn host(&self) -> Option<&HostName> {
        match self {
            Plan::Remote { host, .. } => Some(host),
            Plan::Empty
            | Plan::Execute { .. }
            | Plan::Sequence(_)
            | Plan::Wave(_)
            | Plan::Map { .. }
            | Plan::Switch { .. }
            | Plan::Loop { .. } => None,
        }
    }

    /// Every plan of the tree, entered before its children and left after them, in plan order,
    /// from a stack on the heap: the walk that passes over a whole tree take instead of
    /// recursing per level.
    pub(crate) fn visits(&self) -> impl Iterator<Item = Visit<'_>> {
        self.walk(Plan::children)
    }

    /// As [`Plan::visits`], without going into the sub-plans of a `Map`, `Switch` or `Loop`:
    /// the walk of one table's steps.
    pub(crate) fn own_visits(&self) -> impl Iterator<Item = Visit<'_>> {
        self.walk(Plan::own_children)
    }

    fn walk(&self, children: fn(&Plan) -> &[Plan]) -> impl Iterator<Item = Visit<'_>> {
        let mut stack = vec![Visit::Enter(self)];
        std::iter::from_fn(move || {
            let next = stack.pop()?;
            if let Visit::Enter(entered) = next {
                stack.push(Visit::Leave(entered));
                stack.extend(children(entered).iter().rev().map(Visit::Enter));
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
                        Plan::Remote { host, .. } => {
                            out.push_str("Remote");
                            if with_ids {
                                out.push('@');
                                out.push_str(host.as_str());
                            }
                            out.push('(');
                            first = true;
                        }
                        Plan::Map { node, .. }
                        | Plan::Switch { node, .. }
                        | Plan::Loop { node, .. } => {
                            out.push_str(plan.kind());
                            out.push('(');
                            if with_ids {
                                out.push_str(node.as_str());
                                out.push_str(", ");
                            }
                            out.push('[');
                            first = true;
                        }
                    }
                }
                Visit::Leave(
                    Plan::Sequence(_)
                    | Plan::Wave(_)
                    | Plan::Map { .. }
                    | Plan::Switch { .. }
                    | Plan::Loop { .. },
                ) => {
                    out.push_str("])");
                    first = false;
                }
                Visit::Leave(Plan::Remote { .. }) => {
                    out.push(')');
                    first = false;
                }
                Visit::Leave(Plan::Empty | Plan::Execute { .. }) => {}
            }
        }
    }
}

impl Plan {
    /// Moves this plan's children onto `stack`, leaving it childless (a `Remote`'s slice
    /// becomes `Empty`), for the drop that walks instead of recursing.
    fn take_children(&mut self, stack: &mut Vec<Plan>) {
        match self {
            Plan::Sequence(children)
            | Plan::Wave(children)
            | Plan::Switch {
                cases: children, ..
            } => stack.append(children),
            Plan::Remote { inner: body, .. } | Plan::Map { body, .. } | Plan::Loop { body, .. } => {
                stack.push(std::mem::replace(&mut **body, Plan::Empty));
            }
            Plan::Empty | Plan::Execute { .. } => {}
        }
    }
}

impl Drop for Plan {
    /// Moves the children onto a stack of its own and drops them from there, each emptied of
    /// its own children first, so a deep tree drops in a loop. The derived drop would recurse
    /// once per level.
    fn drop(&mut self) {
        let mut stack = Vec::new();
        self.take_children(&mut stack);
        while let Some(mut plan) = stack.pop() {
            plan.take_children(&mut stack);
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
                Visit::Enter(
                    Plan::Sequence(_)
                    | Plan::Wave(_)
                    | Plan::Remote { .. }
                    | Plan::Map { .. }
                    | Plan::Switch { .. }
                    | Plan::Loop { .. },
                )
                | Visit::Leave(Plan::Empty | Plan::Execute { .. }) => {}
                Visit::Leave(Plan::Sequence(children)) => {
                    let children = done.split_off(done.len() - children.len());
                    done.push(Plan::Sequence(children));
                }
                Visit::Leave(Plan::Wave(children)) => {
                    let children = done.split_off(done.len() - children.len());
                    done.push(Plan::Wave(children));
                }
                Visit::Leave(Plan::Remote { host, .. }) => {
                    let inner = done.pop().expect("the slice was copied before");
                    done.push(Plan::Remote {
                        host: host.clone(),
                        inner: Box::new(inner),
                    });
                }
                Visit::Leave(Plan::Map {
                    node,
                    from,
                    in_flight,
                    ..
                }) => {
                    let body = done.pop().expect("the body was copied before");
                    done.push(Plan::Map {
                        node: node.clone(),
                        from: from.clone(),
                        in_flight: *in_flight,
                        body: Box::new(body),
                    });
                }
                Visit::Leave(Plan::Loop {
                    node,
                    from,
                    max_iterations,
                    ..
                }) => {
                    let body = done.pop().expect("the body was copied before");
                    done.push(Plan::Loop {
                        node: node.clone(),
                        from: from.clone(),
                        max_iterations: *max_iterations,
                        body: Box::new(body),
                    });
                }
                Visit::Leave(Plan::Switch {
                    node,
                    from,
                    keys,
                    cases,
                }) => {
                    let cases = done.split_off(done.len() - cases.len());
                    done.push(Plan::Switch {
                        node: node.clone(),
                        from: from.clone(),
                        keys: keys.clone(),
                        cases,
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
                (
                    Plan::Remote { host, inner },
                    Plan::Remote {
                        host: other_host,
                        inner: other_inner,
                    },
                ) => {
                    if host != other_host {
                        return false;
                    }
                    pairs.push((inner, other_inner));
                }
                (Plan::Map { .. } | Plan::Switch { .. } | Plan::Loop { .. }, _) => {
                    let (plan, other) = pair;
                    if !same_decision(plan, other) {
                        return false;
                    }
                    pairs.extend(plan.children().iter().zip(other.children()).rev());
                }
                (
                    Plan::Empty
                    | Plan::Execute { .. }
                    | Plan::Sequence(_)
                    | Plan::Wave(_)
                    | Plan::Remote { .. },
                    _,
                ) => return false,
            }
        }
        true
    }
}

/// Whether `plan` and `other` are the same `Map`, `Switch` or `Loop` step, children aside: the
/// same variant, node, inputs and bound or keys, and as many children.
fn same_decision(plan: &Plan, other: &Plan) -> bool {
    let fields = match (plan, other) {
        (
            Plan::Map { in_flight, .. },
            Plan::Map {
                in_flight: theirs, ..
            },
        ) => in_flight == theirs,
        (
            Plan::Loop { max_iterations, .. },
            Plan::Loop {
                max_iterations: theirs,
                ..
            },
        ) => max_iterations == theirs,
        (Plan::Switch { keys, .. }, Plan::Switch { keys: theirs, .. }) => keys == theirs,
        (
            Plan::Empty
            | Plan::Execute { .. }
            | Plan::Sequence(_)
            | Plan::Wave(_)
            | Plan::Remote { .. }
            | Plan::Map { .. }
            | Plan::Switch { .. }
            | Plan::Loop { .. },
            _,
        ) => false,
    };
    fields && plan.step() == other.step() && plan.children().len() == other.children().len()
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
                        Plan::Remote { host, .. } => {
                            write!(f, "Remote {{ host: {host:?}, inner: ")?;
                            first = true;
                        }
                        Plan::Map {
                            node,
                            from,
                            in_flight,
                            ..
                        } => {
                            write!(
                                f,
                                "Map {{ node: {node:?}, from: {from:?}, in_flight: {in_flight:?}, body: "
                            )?;
                            first = true;
                        }
                        Plan::Loop {
                            node,
                            from,
                            max_iterations,
                            ..
                        } => {
                            write!(
                                f,
                                "Loop {{ node: {node:?}, from: {from:?}, max_iterations: {max_iterations:?}, body: "
                            )?;
                            first = true;
                        }
                        Plan::Switch {
                            node, from, keys, ..
                        } => {
                            write!(
                                f,
                                "Switch {{ node: {node:?}, from: {from:?}, keys: {keys:?}, cases: ["
                            )?;
                            first = true;
                        }
                    }
                }
                Visit::Leave(Plan::Sequence(_) | Plan::Wave(_)) => {
                    f.write_str("])")?;
                    first = false;
                }
                Visit::Leave(Plan::Switch { .. }) => {
                    f.write_str("] }")?;
                    first = false;
                }
                Visit::Leave(Plan::Remote { .. } | Plan::Map { .. } | Plan::Loop { .. }) => {
                    f.write_str(" }")?;
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
        // How far the plan being written is indented: a `Sequence` or `Wave` indents its
        // children twice, once for itself and once for its list; a `Remote` once, for its
        // fields, and its slice follows `inner: ` on the same line.
        let mut level = 0;
        let mut inline = false;
        for visit in self.visits() {
            match visit {
                Visit::Enter(plan) => {
                    if !std::mem::take(&mut inline) {
                        pad(f, level)?;
                    }
                    match plan {
                        Plan::Empty => f.write_str("Empty")?,
                        Plan::Execute { node, from } => {
                            f.write_str("Execute {\n")?;
                            pad(f, level + 1)?;
                            writeln!(f, "node: {node:?},")?;
                            pad(f, level + 1)?;
                            if from.is_empty() {
                                f.write_str("from: [],\n")?;
                            } else {
                                f.write_str("from: [\n")?;
                                for source in from {
                                    pad(f, level + 2)?;
                                    writeln!(f, "{source:?},")?;
                                }
                                pad(f, level + 1)?;
                                f.write_str("],\n")?;
                            }
                            pad(f, level)?;
                            f.write_str("}")?;
                        }
                        Plan::Sequence(children) | Plan::Wave(children) => {
                            writeln!(f, "{}(", plan.kind())?;
                            pad(f, level + 1)?;
                            f.write_str(if children.is_empty() { "[]" } else { "[\n" })?;
                            level += 2;
                        }
                        Plan::Remote { host, .. } => {
                            f.write_str("Remote {\n")?;
                            pad(f, level + 1)?;
                            writeln!(f, "host: {host:?},")?;
                            pad(f, level + 1)?;
                            f.write_str("inner: ")?;
                            inline = true;
                            level += 1;
                        }
                        Plan::Map { .. } | Plan::Switch { .. } | Plan::Loop { .. } => {
                            let (body_inline, deeper) = plan.debug_pretty_open(f, level)?;
                            inline = body_inline;
                            level += deeper;
                        }
                    }
                }
                Visit::Leave(plan) => {
                    match plan {
                        Plan::Sequence(children) | Plan::Wave(children) => {
                            level -= 2;
                            if !children.is_empty() {
                                pad(f, level + 1)?;
                                f.write_str("]")?;
                            }
                            f.write_str(",\n")?;
                            pad(f, level)?;
                            f.write_str(")")?;
                        }
                        Plan::Switch { cases, .. } => {
                            level -= 2;
                            if !cases.is_empty() {
                                pad(f, level + 1)?;
                                f.write_str("]")?;
                            }
                            f.write_str(",\n")?;
                            pad(f, level)?;
                            f.write_str("}")?;
                        }
                        Plan::Remote { .. } | Plan::Map { .. } | Plan::Loop { .. } => {
                            level -= 1;
                            pad(f, level)?;
                            f.write_str("}")?;
                        }
                        Plan::Empty | Plan::Execute { .. } => {}
                    }
                    // An item of the list around it, or the field of a `Remote`.
                    if level > 0 {
                        f.write_str(",\n")?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Plan {
    /// `{:#?}`'s opening of a `Map`, `Switch` or `Loop` at `level`: its name and fields up to
    /// its children. Returns whether its one child follows on the same line (a `body: `), and
    /// how many levels deeper its children are.
    fn debug_pretty_open(
        &self,
        f: &mut fmt::Formatter<'_>,
        level: usize,
    ) -> Result<(bool, usize), fmt::Error> {
        writeln!(f, "{} {{", self.kind())?;
        if let Some((node, from)) = self.step() {
            field(f, level + 1, "node", node)?;
            field(f, level + 1, "from", &from.to_vec())?;
        }
        match self {
            Plan::Map { in_flight, .. } => field(f, level + 1, "in_flight", in_flight)?,
            Plan::Loop { max_iterations, .. } => {
                field(f, level + 1, "max_iterations", max_iterations)?;
            }
            Plan::Switch { keys, cases, .. } => {
                field(f, level + 1, "keys", keys)?;
                f.write_str(&"    ".repeat(level + 1))?;
                f.write_str(if cases.is_empty() {
                    "cases: []"
                } else {
                    "cases: [\n"
                })?;
                return Ok((false, 2));
            }
            Plan::Empty
            | Plan::Execute { .. }
            | Plan::Sequence(_)
            | Plan::Wave(_)
            | Plan::Remote { .. } => {}
        }
        f.write_str(&"    ".repeat(level + 1))?;
        f.write_str("body: ")?;
        Ok((true, 1))
    }
}

/// What a drawing calls a `Map`, `Switch` or `Loop` step's frame: `each chunks`,
/// `switch route (ocr | text)`, `loop refine (8 at most)`; the node's id for any other plan.
pub(crate) fn decision_label(plan: &Plan, node: &str) -> String {
    match plan {
        Plan::Map {
            in_flight: Some(limit),
            ..
        } => format!("each {node} ({limit} in flight)"),
        Plan::Map {
            in_flight: None, ..
        } => format!("each {node}"),
        Plan::Switch { keys, .. } => format!("switch {node} ({})", keys.join(" | ")),
        Plan::Loop { max_iterations, .. } => format!("loop {node} ({max_iterations} at most)"),
        Plan::Empty
        | Plan::Execute { .. }
        | Plan::Sequence(_)
        | Plan::Wave(_)
        | Plan::Remote { .. } => node.to_owned(),
    }
}

/// Writes `name: value,` as a field of a `{:#?}` at `level`: the value printed by its own
/// pretty `Debug`, its later lines indented to the field's level.
fn field(
    f: &mut fmt::Formatter<'_>,
    level: usize,
    name: &str,
    value: &dyn fmt::Debug,
) -> fmt::Result {
    let margin = "    ".repeat(level);
    let written = format!("{value:#?}").replace('\n', &format!("\n{margin}"));
    writeln!(f, "{margin}{name}: {written},")
}

#[cfg(test)]
mod tests {
    //! The hand-written impls against what the derived ones would do, on small plans.

    use super::Plan;
    use crate::model::host::HostName;
    use crate::model::id::NodeId;

    /// `Plan`'s shape with the derived `Debug`.
    #[derive(Debug)]
    #[expect(
        dead_code,
        reason = "the fields are there to be printed by the derived `Debug`"
    )]
    enum Derived {
        Empty,
        Execute {
            node: NodeId,
            from: Vec<NodeId>,
        },
        Sequence(Vec<Derived>),
        Wave(Vec<Derived>),
        Remote {
            host: HostName,
            inner: Box<Derived>,
        },
        Map {
            node: NodeId,
            from: Vec<NodeId>,
            in_flight: Option<usize>,
            body: Box<Derived>,
        },
        Switch {
            node: NodeId,
            from: Vec<NodeId>,
            keys: Vec<String>,
            cases: Vec<Derived>,
        },
        Loop {
            node: NodeId,
            from: Vec<NodeId>,
            max_iterations: u32,
            body: Box<Derived>,
        },
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
            Plan::Remote { host, inner } => Derived::Remote {
                host: host.clone(),
                inner: Box::new(derived(inner)),
            },
            Plan::Map {
                node,
                from,
                in_flight,
                body,
            } => Derived::Map {
                node: node.clone(),
                from: from.clone(),
                in_flight: *in_flight,
                body: Box::new(derived(body)),
            },
            Plan::Switch {
                node,
                from,
                keys,
                cases,
            } => Derived::Switch {
                node: node.clone(),
                from: from.clone(),
                keys: keys.clone(),
                cases: cases.iter().map(derived).collect(),
            },
            Plan::Loop {
                node,
                from,
                max_iterations,
                body,
            } => Derived::Loop {
                node: node.clone(),
                from: from.clone(),
                max_iterations: *max_iterations,
                body: Box::new(derived(body)),
            },
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
            remote("gpu", execute("a", &[])),
            remote("cpu-1", remote("gpu", Plan::Empty)),
            Plan::Wave(vec![
                remote(
                    "gpu",
                    Plan::Sequence(vec![execute("a", &[]), execute("b", &["a"])]),
                ),
                remote("other", Plan::Wave(Vec::new())),
            ]),
            Plan::Map {
                node: "m".into(),
                from: vec!["a".into()],
                in_flight: Some(3),
                body: Box::new(Plan::Sequence(vec![
                    execute("m/a", &[]),
                    execute("m/b", &["m/a"]),
                ])),
            },
            Plan::Sequence(vec![
                execute("a", &[]),
                Plan::Switch {
                    node: "s".into(),
                    from: vec!["a".into()],
                    keys: vec!["x".into(), "y".into()],
                    cases: vec![
                        execute("s/x", &[]),
                        Plan::Loop {
                            node: "s/y".into(),
                            from: Vec::new(),
                            max_iterations: 4,
                            body: Box::new(Plan::Map {
                                node: "s/y/m".into(),
                                from: Vec::new(),
                                in_flight: None,
                                body: Box::new(Plan::Empty),
                            }),
                        },
                    ],
                },
            ]),
            Plan::Switch {
                node: "s".into(),
                from: Vec::new(),
                keys: Vec::new(),
                cases: Vec::new(),
            },
        ]
    }

    fn remote(host: &str, inner: Plan) -> Plan {
        Plan::Remote {
            host: host.parse::<HostName>().expect("a valid host name"),
            inner: Box::new(inner),
        }
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
