//! The indented text tree of a plan: what `Display` prints, one line per step.

use std::fmt;

use super::marks::Marks;
use crate::plan::Plan;

/// Writes the indented tree of `plan`, one line per step, without a final newline.
///
/// `prefix` is the margin drawn for the ancestors of the plans being listed: it grows by one
/// level on the way into a plan's children and shrinks back on the way out, so one buffer
/// serves the whole walk. The lists being walked wait on `open`, innermost last, each with the
/// length `prefix` had before it: a plan nests as deep as it likes on the heap, not the stack.
pub(super) fn write_tree(plan: &Plan, marks: Marks<'_>, out: &mut impl fmt::Write) -> fmt::Result {
    write_label(plan, marks, out)?;
    let mut prefix = String::new();
    // Each list being walked, with the keys of its plans when it is a `Switch`'s cases.
    let mut open: Vec<(
        std::slice::Iter<'_, Plan>,
        usize,
        std::slice::Iter<'_, String>,
    )> = vec![(plan.children().iter(), 0, case_keys(plan))];
    while let Some((children, restore, keys)) = open.last_mut() {
        let Some(child) = children.next() else {
            prefix.truncate(*restore);
            open.pop();
            continue;
        };
        let last = children.as_slice().is_empty();
        out.write_char('\n')?;
        out.write_str(&prefix)?;
        out.write_str(if last { "└── " } else { "├── " })?;
        if let Some(key) = keys.next() {
            write!(out, "case {key}: ")?;
        }
        write_label(child, marks, out)?;
        if !child.children().is_empty() {
            let restore = prefix.len();
            prefix.push_str(if last { "    " } else { "│   " });
            open.push((child.children().iter(), restore, case_keys(child)));
        }
    }
    Ok(())
}

/// The keys of a `Switch`'s cases, in order; none for any other plan.
fn case_keys(plan: &Plan) -> std::slice::Iter<'_, String> {
    match plan {
        Plan::Switch { keys, .. } => keys.iter(),
        Plan::Empty
        | Plan::Execute { .. }
        | Plan::Sequence(_)
        | Plan::Wave(_)
        | Plan::Remote { .. }
        | Plan::Map { .. }
        | Plan::Loop { .. } => [].iter(),
    }
}

/// `node <- inputs`, or `node <- (input)` for a step that reads the graph's input.
fn write_step(
    node: &str,
    from: &[crate::model::id::NodeId],
    out: &mut impl fmt::Write,
) -> fmt::Result {
    write!(out, "{node} <- ")?;
    if from.is_empty() {
        // In parentheses, to read as a note rather than as the id of a node.
        out.write_str("(input)")?;
    }
    for (i, source) in from.iter().enumerate() {
        if i > 0 {
            out.write_str(", ")?;
        }
        write!(out, "{source}")?;
    }
    Ok(())
}

fn write_label(plan: &Plan, marks: Marks<'_>, out: &mut impl fmt::Write) -> fmt::Result {
    match plan {
        Plan::Empty => out.write_str("Empty"),
        Plan::Execute { node, from } => {
            write_step(node.as_str(), from, out)?;
            if let Some(device) = marks.device(node) {
                write!(out, " @ {device}")?;
            }
            if marks.cached(node) {
                out.write_str(" (cached)")?;
            }
            Ok(())
        }
        Plan::Sequence(_) => out.write_str("Sequence"),
        Plan::Wave(_) => out.write_str("Wave"),
        Plan::Remote { host, .. } => write!(out, "Remote on {host}"),
        Plan::Map {
            node,
            from,
            in_flight,
            ..
        } => {
            out.write_str("Map ")?;
            write_step(node.as_str(), from, out)?;
            match in_flight {
                Some(limit) => write!(out, ", each item: ({limit} in flight at most)"),
                None => out.write_str(", each item:"),
            }
        }
        Plan::Switch { node, from, .. } => {
            out.write_str("Switch ")?;
            write_step(node.as_str(), from, out)?;
            out.write_str(", the case it names:")
        }
        Plan::Loop {
            node,
            from,
            max_iterations,
            ..
        } => {
            out.write_str("Loop ")?;
            write_step(node.as_str(), from, out)?;
            write!(out, ", until done ({max_iterations} at most):")
        }
    }
}

impl fmt::Display for Plan {
    /// The indented tree, one line per step; an `Execute` line is `node <- inputs`, or
    /// `node <- (input)` for a step that reads the graph's input:
    ///
    /// ```text
    /// Sequence
    /// ├── a <- (input)
    /// ├── Wave
    /// │   ├── b <- a
    /// │   └── c <- a
    /// └── d <- b, c
    /// ```
    ///
    /// [`Plan::compact`] is the same tree on one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_tree(self, Marks::default(), f)
    }
}
