//! The indented text tree of a plan: what `Display` prints, one line per step.

use std::fmt;

use crate::plan::Plan;

/// Writes the indented tree of `plan`, one line per step, without a final newline.
fn write_tree(plan: &Plan, out: &mut impl fmt::Write) -> fmt::Result {
    write_label(plan, out)?;
    write_branches(plan, &mut String::new(), out)
}

fn write_label(plan: &Plan, out: &mut impl fmt::Write) -> fmt::Result {
    match plan {
        Plan::Empty => out.write_str("Empty"),
        Plan::Execute { node, from } => {
            write!(out, "{node} <- ")?;
            if from.is_empty() {
                // In parentheses, to read as a note rather than as the id of a node.
                return out.write_str("(input)");
            }
            for (i, source) in from.iter().enumerate() {
                if i > 0 {
                    out.write_str(", ")?;
                }
                write!(out, "{source}")?;
            }
            Ok(())
        }
        Plan::Sequence(_) => out.write_str("Sequence"),
        Plan::Wave(_) => out.write_str("Wave"),
    }
}

/// `prefix` is the margin drawn for the ancestors; it grows by one level and is restored, so
/// one buffer serves the whole walk.
fn write_branches(plan: &Plan, prefix: &mut String, out: &mut impl fmt::Write) -> fmt::Result {
    let children = match plan {
        Plan::Sequence(children) | Plan::Wave(children) => children,
        Plan::Empty | Plan::Execute { .. } => return Ok(()),
    };
    for (i, child) in children.iter().enumerate() {
        let last = i + 1 == children.len();
        out.write_char('\n')?;
        out.write_str(prefix)?;
        out.write_str(if last { "└── " } else { "├── " })?;
        write_label(child, out)?;
        let restore = prefix.len();
        prefix.push_str(if last { "    " } else { "│   " });
        write_branches(child, prefix, out)?;
        prefix.truncate(restore);
    }
    Ok(())
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
        write_tree(self, f)
    }
}
