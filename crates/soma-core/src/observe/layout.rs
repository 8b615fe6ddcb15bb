//! Drawing plans and graphs: an indented text tree, Mermaid and DOT for other tools, and SVG.
//!
//! A plan is the decided shape of a run, so it is worth seeing: in a terminal (`Display`, the
//! tree), in a document (Mermaid, DOT) and in a notebook (SVG). The SVG is laid out by Soma
//! itself rather than handed to graphviz, because a plan already *is* a layout — series left to
//! right, the branches of a wave stacked — and a notebook should show it with nothing else
//! installed.
//!
//! The SVG layout follows the plan: the steps of a `Sequence` left to right, the branches of a
//! `Wave` stacked. A compiled sequence puts each step after the one it reads from, so it is a
//! row; only a stretch that is not series-parallel (which its plan walks in order, having no
//! tree for it) has steps that do not read each other, and those share topological columns, so
//! the drawing shows the real shape of that part of the graph instead of a tangle over a row.
//! A graph ([`Graph::to_svg`]) is drawn with its plan's layout and nothing more; a plan
//! ([`Plan::to_svg`]) also frames what its plan decided: each wave (branches at once) and each
//! stretch walked in order. Both draw an arrow for every edge.
//!
//! Every drawing is a function of the plan (and the graph) alone, so the same input gives the
//! same bytes. No walk recurses: measuring, placing and the columns of every sequence each keep
//! their own stack, on the heap, so a plan nested 100,000 levels deep draws on a small thread
//! stack, as a 100,000-node chain does; and its measured blocks sit in one arena, so they drop
//! in a loop too. The columns are found in one pass over the whole plan rather than one per
//! sequence over all its steps, which a deep plan would pay once per level.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::marks::Marks;
use super::svg::{
    svg_open, xml, ARC_LEVELS, ARC_STEP, BASELINE, CACHED_FILL, CACHED_STROKE, CHAR_WIDTH,
    COLUMN_GAP, CORNER, EDGE, FRAME_END, FRAME_SIDE, HEAD, HOST_STROKE, HOST_TEXT, MARGIN, MUTED,
    NODE_FILL, NODE_HEIGHT, NODE_MIN_WIDTH, NODE_PADDING, NODE_STROKE, ORDER_STROKE, ORDER_TEXT,
    ROW_GAP, TEXT, WAVE_STROKE, WAVE_TEXT,
};
use crate::compile::decompose;
use crate::model::graph::Graph;
use crate::model::host::HostName;
use crate::model::id::NodeId;
use crate::plan::{decision_label, Plan, Visit};

/// What a frame marks.
enum Framing<'p> {
    /// A wave: its branches run at the same time.
    Wave,
    /// Steps of a sequence that share columns: not series-parallel, so walked in order.
    InOrder,
    /// A remote slice: what it holds runs on this host, in one trip.
    Host(&'p HostName),
    /// A `Map`, `Switch` or `Loop` step and what it runs: `each chunks`, say.
    Decision(String),
}

/// A subtree measured: its size, and how its parts sit inside it. The blocks of a drawing live
/// in one arena and name their parts by index there, so a deep plan's blocks drop in a loop.
struct Block<'p> {
    width: i64,
    height: i64,
    shape: Shape<'p>,
}

enum Shape<'p> {
    Blank,
    Node(&'p NodeId),
    /// Left to right; each column a stack, centred in the block's height. `in_order` is the
    /// range of columns to frame as walked in order, with room left for the frame.
    Columns {
        columns: Vec<Column>,
        in_order: Option<(usize, usize)>,
    },
    /// Top to bottom, left-aligned, since branches start together; framed as a wave or not.
    Stack {
        branches: Vec<usize>,
        framed: bool,
    },
    /// A remote slice, framed with its host's name.
    Host {
        inner: usize,
        host: &'p HostName,
    },
    /// A `Map`, `Switch` or `Loop` step, framed with what it is: its own box on the left, its
    /// sub-plans stacked on the right (a switch's cases in order).
    Decision {
        node: &'p NodeId,
        step_width: i64,
        parts: Vec<usize>,
        label: String,
    },
}

struct Column {
    width: i64,
    height: i64,
    /// Its blocks, top to bottom, by index in the arena.
    blocks: Vec<usize>,
}

fn int(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn node_width(label: &str) -> i64 {
    // A character that takes three or four bytes in UTF-8 is likely wide (CJK, emoji): count it
    // twice, so its box is too wide rather than too narrow.
    let units: usize = label
        .chars()
        .map(|c| if c.len_utf8() >= 3 { 2 } else { 1 })
        .sum();
    (int(units) * CHAR_WIDTH + 2 * NODE_PADDING).max(NODE_MIN_WIDTH)
}

/// The sum of `sizes` with `gap` between consecutive ones.
fn spaced(sizes: impl Iterator<Item = i64>, gap: i64) -> i64 {
    let (total, count) = sizes.fold((0, 0), |(total, count), size| (total + size, count + 1));
    total + gap * (count - 1).max(0)
}

/// Measures every plan of the tree, children before parents; `framed` says whether frames are
/// drawn (a plan) or not (a graph), `marks` what boxes say besides their node's id.
/// The root's block is the last.
fn measure<'p>(plan: &'p Plan, framed: bool, marks: Marks<'_>) -> Vec<Block<'p>> {
    let mut columns_of = topological_columns(plan).into_iter();
    let mut blocks: Vec<Block<'_>> = Vec::new();
    // The blocks of the plans left whose parent is not: a parent's are the last of them.
    let mut done: Vec<usize> = Vec::new();
    for visit in plan.visits() {
        let block = match visit {
            Visit::Enter(Plan::Empty) => Block {
                width: 0,
                height: 0,
                shape: Shape::Blank,
            },
            Visit::Enter(Plan::Execute { node, .. }) => Block {
                width: node_width(&marks.label(node)),
                height: NODE_HEIGHT,
                shape: Shape::Node(node),
            },
            Visit::Enter(
                Plan::Sequence(_)
                | Plan::Wave(_)
                | Plan::Remote { .. }
                | Plan::Map { .. }
                | Plan::Switch { .. }
                | Plan::Loop { .. },
            )
            | Visit::Leave(Plan::Empty | Plan::Execute { .. }) => continue,
            Visit::Leave(
                decision @ (Plan::Map { node, .. }
                | Plan::Switch { node, .. }
                | Plan::Loop { node, .. }),
            ) => {
                let parts = done.split_off(done.len() - decision.children().len());
                let step_width = node_width(&marks.label(node));
                let inner_width = parts.iter().map(|&p| blocks[p].width).max().unwrap_or(0);
                let inner_height = spaced(parts.iter().map(|&p| blocks[p].height), ROW_GAP);
                Block {
                    width: 2 * FRAME_SIDE + step_width + COLUMN_GAP + inner_width,
                    height: inner_height.max(NODE_HEIGHT) + 2 * FRAME_END,
                    shape: Shape::Decision {
                        node,
                        step_width,
                        parts,
                        label: decision_label(decision, node.as_str()),
                    },
                }
            }
            Visit::Leave(Plan::Remote { host, .. }) => {
                let inner = *done.last().expect("the slice was measured before");
                if !framed {
                    continue; // Its slice stands for it.
                }
                done.pop();
                Block {
                    width: blocks[inner].width + 2 * FRAME_SIDE,
                    height: blocks[inner].height + 2 * FRAME_END,
                    shape: Shape::Host { inner, host },
                }
            }
            Visit::Leave(Plan::Sequence(steps)) => {
                let ranks = columns_of.next().expect("the columns of every sequence");
                let parts = done.split_off(done.len() - steps.len());
                sequence_block(&blocks, steps, &ranks, parts, framed)
            }
            Visit::Leave(Plan::Wave(branches)) => {
                let parts = done.split_off(done.len() - branches.len());
                let branches: Vec<usize> = branches
                    .iter()
                    .zip(parts)
                    .filter(|(branch, _)| !matches!(branch, Plan::Empty))
                    .map(|(_, part)| part)
                    .collect();
                let (side, end) = if framed {
                    (FRAME_SIDE, FRAME_END)
                } else {
                    (0, 0)
                };
                Block {
                    width: branches.iter().map(|&b| blocks[b].width).max().unwrap_or(0) + 2 * side,
                    height: spaced(branches.iter().map(|&b| blocks[b].height), ROW_GAP) + 2 * end,
                    shape: Shape::Stack { branches, framed },
                }
            }
        };
        done.push(blocks.len());
        blocks.push(block);
    }
    blocks
}

/// The block of a sequence whose steps are measured (`parts`, by index in `blocks`) and whose
/// columns are `ranks`.
fn sequence_block<'p>(
    blocks: &[Block<'p>],
    steps: &[Plan],
    ranks: &[usize],
    parts: Vec<usize>,
    framed: bool,
) -> Block<'p> {
    let mut columns: Vec<Column> = Vec::new();
    for ((step, &rank), part) in steps.iter().zip(ranks).zip(parts) {
        if matches!(step, Plan::Empty) {
            continue;
        }
        while columns.len() <= rank {
            columns.push(Column {
                width: 0,
                height: 0,
                blocks: Vec::new(),
            });
        }
        columns[rank].blocks.push(part);
    }
    columns.retain(|column| !column.blocks.is_empty());
    for column in &mut columns {
        column.width = column
            .blocks
            .iter()
            .map(|&b| blocks[b].width)
            .max()
            .unwrap_or(0);
        column.height = spaced(column.blocks.iter().map(|&b| blocks[b].height), ROW_GAP);
    }
    let mut shared = (0..columns.len()).filter(|&k| columns[k].blocks.len() > 1);
    let in_order = shared
        .next()
        .filter(|_| framed)
        .map(|first| (first, shared.next_back().unwrap_or(first)));
    let framed_at = |k: usize| in_order.is_some_and(|(first, last)| first <= k && k <= last);
    let sides = if in_order.is_some() {
        2 * FRAME_SIDE
    } else {
        0
    };
    Block {
        width: spaced(columns.iter().map(|c| c.width), COLUMN_GAP) + sides,
        height: columns
            .iter()
            .enumerate()
            .map(|(k, c)| c.height + if framed_at(k) { 2 * FRAME_END } else { 0 })
            .max()
            .unwrap_or(0),
        shape: Shape::Columns { columns, in_order },
    }
}

/// The column of each step of each sequence, sequences in the order the walk leaves them: one
/// more than the furthest column among the earlier steps of the same sequence it reads from
/// (the last such step, where an id runs more than once). Steps in series get a column each;
/// the steps of a stretch that is not series-parallel share columns as far as their edges
/// allow.
///
/// One pass over the whole plan, not one per sequence over its steps' subtrees, which a plan
/// nested `d` levels deep would pay `d` times over. Steps are numbered in plan order, so every
/// plan holds a range of numbers. A read of `source` counts in the one sequence that holds both
/// the reader and the last run of `source` before it, in different steps — the innermost plan
/// around both, when it is a sequence — and then, only where an id runs more than once, in the
/// sequences further out, for the runs before the one found; the plans around the reader are
/// open on a stack, ranges in increasing order of start, so finding the innermost is a binary
/// search.
fn topological_columns(plan: &Plan) -> Vec<Vec<usize>> {
    // Where each id runs, by step number, in increasing order.
    let mut runs: HashMap<&NodeId, Vec<usize>> = HashMap::new();
    for (at, (node, _)) in plan.all_steps().into_iter().enumerate() {
        runs.entry(node).or_default().push(at);
    }
    let mut out = Vec::new();
    let mut open: Vec<Around> = Vec::new();
    let mut step = 0;
    for visit in plan.visits() {
        match visit {
            Visit::Enter(entered) => {
                if let Some(parent) = open.last_mut().filter(|parent| parent.sequence) {
                    parent.starts.push(step);
                }
                match entered {
                    Plan::Empty => {}
                    Plan::Execute { from, .. } => {
                        for source in from {
                            if let Some(runs) = runs.get(source) {
                                record_read(&mut open, runs, step);
                            }
                        }
                        step += 1;
                    }
                    // What a decision runs is drawn apart from the sequence around it, as a
                    // wave's branches are: its sub-plans hold columns of their own.
                    Plan::Map { from, .. }
                    | Plan::Switch { from, .. }
                    | Plan::Loop { from, .. } => {
                        for source in from {
                            if let Some(runs) = runs.get(source) {
                                record_read(&mut open, runs, step);
                            }
                        }
                        step += 1;
                        open.push(Around {
                            start: step,
                            sequence: false,
                            starts: Vec::new(),
                            reads: Vec::new(),
                        });
                    }
                    // A slice is, for columns, a one-branch wave: it holds no columns itself.
                    Plan::Sequence(_) | Plan::Wave(_) | Plan::Remote { .. } => open.push(Around {
                        start: step,
                        sequence: matches!(entered, Plan::Sequence(_)),
                        starts: Vec::new(),
                        reads: Vec::new(),
                    }),
                }
            }
            Visit::Leave(Plan::Sequence(steps)) => {
                let mut sequence = open.pop().expect("entered before");
                // By reading child: a child's column is final before any later child reads it.
                sequence.reads.sort_unstable();
                let mut ranks = vec![0; steps.len()];
                for (reader, read) in sequence.reads {
                    ranks[reader] = ranks[reader].max(ranks[read] + 1);
                }
                out.push(ranks);
            }
            Visit::Leave(
                Plan::Wave(_)
                | Plan::Remote { .. }
                | Plan::Map { .. }
                | Plan::Switch { .. }
                | Plan::Loop { .. },
            ) => {
                open.pop();
            }
            Visit::Leave(Plan::Empty | Plan::Execute { .. }) => {}
        }
    }
    out
}

/// A `Sequence` or `Wave` around the step being visited, in [`topological_columns`].
struct Around {
    /// The number of its first step.
    start: usize,
    sequence: bool,
    /// For a sequence: the number of the first step of each child entered so far.
    starts: Vec<usize>,
    /// For a sequence: (reading child, read child) for every read from an earlier child.
    reads: Vec<(usize, usize)>,
}

/// Records, in the sequences of `open` where it counts, that step number `step` reads an id
/// that runs at steps `runs`.
fn record_read(open: &mut [Around], runs: &[usize], step: usize) {
    // The read leaves `open[level]` (the step itself at first), which starts at `before`.
    let (mut before, mut level) = (step, open.len());
    loop {
        let earlier = runs.partition_point(|&run| run < before);
        let Some(&run) = earlier.checked_sub(1).map(|last| &runs[last]) else {
            return;
        };
        // The innermost plan around both the reader and `run`.
        let inside = open[..level].partition_point(|around| around.start <= run);
        let Some(at) = inside.checked_sub(1) else {
            return;
        };
        let around = &mut open[at];
        if around.sequence {
            let reader = around.starts.len() - 1;
            let read = around.starts.partition_point(|&start| start <= run) - 1;
            around.reads.push((reader, read));
        }
        before = around.start;
        level = at;
    }
}

/// A node's box, placed.
struct Placed<'p> {
    id: &'p NodeId,
    x: i64,
    y: i64,
    width: i64,
}

impl Placed<'_> {
    fn middle(&self) -> i64 {
        self.y + NODE_HEIGHT / 2
    }
}

struct Frame<'p> {
    framing: Framing<'p>,
    x: i64,
    y: i64,
    width: i64,
    height: i64,
}

#[derive(Default)]
struct Placement<'p> {
    boxes: Vec<Placed<'p>>,
    frames: Vec<Frame<'p>>,
}

/// What [`place`] has left to do, in order from the top of its stack.
enum Task<'p> {
    /// Place a block (by index) with its top left corner at `(x, y)`.
    Place(usize, i64, i64),
    /// Add a frame, once what it frames is placed.
    Frame(Frame<'p>),
}

/// Places block `root` of `blocks` and everything in it, boxes and frames in the order of a
/// depth-first walk (the order drawn). A block's tasks are pushed in that order and then
/// reversed, so the stack hands them back in it.
fn place<'p>(blocks: &[Block<'p>], root: usize, x: i64, y: i64, out: &mut Placement<'p>) {
    let mut tasks = vec![Task::Place(root, x, y)];
    while let Some(task) = tasks.pop() {
        let (block, x, y) = match task {
            Task::Frame(frame) => {
                out.frames.push(frame);
                continue;
            }
            Task::Place(at, x, y) => (&blocks[at], x, y),
        };
        let first_task = tasks.len();
        match &block.shape {
            Shape::Blank => {}
            Shape::Node(id) => out.boxes.push(Placed {
                id,
                x,
                y,
                width: block.width,
            }),
            Shape::Columns { columns, in_order } => {
                let mut left = x;
                let mut frame_left = x;
                for (k, column) in columns.iter().enumerate() {
                    if in_order.is_some_and(|(first, _)| first == k) {
                        frame_left = left;
                        left += FRAME_SIDE;
                    }
                    let mut top = y + (block.height - column.height) / 2;
                    for &inner in &column.blocks {
                        let width = blocks[inner].width;
                        tasks.push(Task::Place(inner, left + (column.width - width) / 2, top));
                        top += blocks[inner].height + ROW_GAP;
                    }
                    left += column.width;
                    if let Some((first, last)) = in_order.filter(|&(_, last)| last == k) {
                        left += FRAME_SIDE;
                        let height = columns[first..=last]
                            .iter()
                            .map(|c| c.height)
                            .max()
                            .unwrap_or(0)
                            + 2 * FRAME_END;
                        tasks.push(Task::Frame(Frame {
                            framing: Framing::InOrder,
                            x: frame_left,
                            y: y + (block.height - height) / 2,
                            width: left - frame_left,
                            height,
                        }));
                    }
                    left += COLUMN_GAP;
                }
            }
            Shape::Stack { branches, framed } => {
                let (mut left, mut top) = (x, y);
                if *framed {
                    // Before the branches: a wave's frame comes before what it holds.
                    out.frames.push(Frame {
                        framing: Framing::Wave,
                        x,
                        y,
                        width: block.width,
                        height: block.height,
                    });
                    left += FRAME_SIDE;
                    top += FRAME_END;
                }
                for &branch in branches {
                    tasks.push(Task::Place(branch, left, top));
                    top += blocks[branch].height + ROW_GAP;
                }
            }
            Shape::Decision {
                node,
                step_width,
                parts,
                label,
            } => {
                let step = Placed {
                    id: node,
                    x: x + FRAME_SIDE,
                    y: y + (block.height - NODE_HEIGHT) / 2,
                    width: *step_width,
                };
                place_decision(blocks, block, step, parts, label, &mut tasks, out);
            }
            Shape::Host { inner, host } => {
                // Before the slice, as a wave's frame comes before what it holds.
                out.frames.push(Frame {
                    framing: Framing::Host(host),
                    x,
                    y,
                    width: block.width,
                    height: block.height,
                });
                tasks.push(Task::Place(*inner, x + FRAME_SIDE, y + FRAME_END));
            }
        }
        tasks[first_task..].reverse();
    }
}

/// Places a decision's frame (`label`, the size of `block`) and its own box, `step`, and queues
/// its sub-plans, `parts`, stacked to the right of that box.
fn place_decision<'p>(
    blocks: &[Block<'p>],
    block: &Block<'p>,
    step: Placed<'p>,
    parts: &[usize],
    label: &str,
    tasks: &mut Vec<Task<'p>>,
    out: &mut Placement<'p>,
) {
    let (x, y) = (
        step.x - FRAME_SIDE,
        step.y - (block.height - NODE_HEIGHT) / 2,
    );
    // Before what it holds, as a wave's frame.
    out.frames.push(Frame {
        framing: Framing::Decision(label.to_owned()),
        x,
        y,
        width: block.width,
        height: block.height,
    });
    let left = step.x + step.width + COLUMN_GAP;
    out.boxes.push(step);
    let mut top = y + FRAME_END;
    for &part in parts {
        tasks.push(Task::Place(part, left, top));
        top += blocks[part].height + ROW_GAP;
    }
}

/// What an empty plan or graph draws: a small card that says so.
fn empty_svg() -> String {
    let (width, height) = (NODE_MIN_WIDTH + 2 * MARGIN, NODE_HEIGHT + 2 * MARGIN);
    let mut out = String::new();
    svg_open(width, height, &mut out);
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{MUTED}\" font-style=\"italic\">Empty</text>",
        width / 2,
        height / 2 + BASELINE
    );
    out.push_str("</svg>\n");
    out
}

/// The SVG of `plan`, frames drawn or not, with an arrow for each `(source, target)` in
/// `edges`.
fn svg<'p>(
    plan: &'p Plan,
    framed: bool,
    edges: impl Iterator<Item = (&'p NodeId, &'p NodeId)>,
    marks: Marks<'_>,
) -> String {
    let blocks = measure(plan, framed, marks);
    let root = blocks.len() - 1;
    let block = &blocks[root];
    if block.width == 0 {
        return empty_svg();
    }
    let mut placement = Placement::default();
    place(&blocks, root, MARGIN, MARGIN, &mut placement);
    let (width, height) = (block.width + 2 * MARGIN, block.height + 2 * MARGIN);
    let mut out = String::new();
    svg_open(width, height, &mut out);
    for frame in &placement.frames {
        let host_label;
        let (class, stroke, dashes, text, label) = match &frame.framing {
            Framing::Wave => ("wave", WAVE_STROKE, "5 3", WAVE_TEXT, "wave"),
            Framing::InOrder => ("in-order", ORDER_STROKE, "2 3", ORDER_TEXT, "in order"),
            Framing::Host(host) => {
                host_label = format!("host {host}");
                ("host", HOST_STROKE, "none", HOST_TEXT, host_label.as_str())
            }
            Framing::Decision(label) => (
                "decision",
                ORDER_STROKE,
                "6 2 1 2",
                ORDER_TEXT,
                label.as_str(),
            ),
        };
        let _ = writeln!(
            out,
            concat!(
                "<g class=\"{}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"8\" ",
                "fill=\"none\" stroke=\"{}\" stroke-dasharray=\"{}\"/>",
                "<text x=\"{}\" y=\"{}\" font-size=\"10\" fill=\"{}\">{}</text></g>"
            ),
            class,
            frame.x,
            frame.y,
            frame.width,
            frame.height,
            stroke,
            dashes,
            frame.x + 8,
            frame.y + 13,
            text,
            escaped(label),
        );
    }
    let at: HashMap<&str, &Placed<'_>> = placement
        .boxes
        .iter()
        .map(|placed| (placed.id.as_str(), placed))
        .collect();
    for (source, target) in edges {
        // A plan built by hand may read from a node it never runs: there is nothing to draw.
        let (Some(from), Some(to)) = (at.get(source.as_str()), at.get(target.as_str())) else {
            continue;
        };
        edge(source, target, from, to, &mut out);
    }
    // Boxes last, over the arrows, so an arrow that crosses a box passes behind it.
    for placed in &placement.boxes {
        let (class, fill, stroke) = if marks.cached(placed.id) {
            ("node cached", CACHED_FILL, CACHED_STROKE)
        } else {
            ("node", NODE_FILL, NODE_STROKE)
        };
        let _ = write!(
            out,
            "<g class=\"{class}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{NODE_HEIGHT}\" rx=\"6\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"1.2\"/>",
            placed.x, placed.y, placed.width
        );
        let _ = write!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{TEXT}\">",
            placed.x + placed.width / 2,
            placed.middle() + BASELINE
        );
        xml(&marks.label(placed.id), &mut out);
        out.push_str("</text></g>\n");
    }
    out.push_str("</svg>\n");
    out
}

/// `text` escaped for XML, for a frame's label, which may hold a node's id.
fn escaped(text: &str) -> String {
    let mut out = String::new();
    xml(text, &mut out);
    out
}

/// One arrow, from the right side of `from` to the left side of `to`, with its head drawn as a
/// shape of its own (not an SVG marker, whose id would clash between drawings on one page).
fn edge(source: &NodeId, target: &NodeId, from: &Placed<'_>, to: &Placed<'_>, out: &mut String) {
    let (sx, sy) = (from.x + from.width, from.middle());
    let (tx, ty) = (to.x, to.middle());
    let ex = tx - HEAD;
    out.push_str("<g class=\"edge\"><title>");
    xml(source.as_str(), out);
    out.push_str(" -&gt; ");
    xml(target.as_str(), out);
    out.push_str("</title><path d=\"");
    let skip = NODE_MIN_WIDTH + COLUMN_GAP;
    if sy == ty && tx - sx >= COLUMN_GAP + skip {
        // Level, with room for a box in between: go over the row instead of through it, up and
        // down in the gaps either side, where no box stands; longer arrows rise higher.
        let (up, down) = (sx + COLUMN_GAP / 2, tx - COLUMN_GAP / 2);
        let level = ((tx - sx - COLUMN_GAP) / skip).min(ARC_LEVELS);
        let top = sy - NODE_HEIGHT / 2 - ARC_STEP * level;
        let r = CORNER;
        let _ = write!(
            out,
            "M{sx},{sy} L{},{sy} Q{up},{sy} {up},{} L{up},{} Q{up},{top} {},{top} L{},{top} Q{down},{top} {down},{} L{down},{} Q{down},{sy} {},{sy} L{ex},{sy}",
            up - r,
            sy - r,
            top + r,
            up + r,
            down - r,
            top + r,
            sy - r,
            down + r,
        );
    } else {
        let mx = (sx + ex) / 2;
        let _ = write!(out, "M{sx},{sy} C{mx},{sy} {mx},{ty} {ex},{ty}");
    }
    let _ = writeln!(
        out,
        "\" fill=\"none\" stroke=\"{EDGE}\" stroke-width=\"1.4\"/><path d=\"M{tx},{ty} L{ex},{} L{ex},{} Z\" fill=\"{EDGE}\"/></g>",
        ty - HEAD / 2,
        ty + HEAD / 2,
    );
}

/// A graph drawn as [`Graph::to_svg`] draws it, each box saying what its node's `marks` say.
pub(super) fn graph_svg(graph: &Graph, marks: Marks<'_>) -> String {
    svg(&decompose(graph), false, graph.edges(), marks)
}

/// The SVG of a plan, frames drawn, each box saying what its node's `marks` say: see
/// [`Plan::to_svg`].
pub(super) fn plan_svg(plan: &Plan, marks: Marks<'_>) -> String {
    let steps = plan.all_steps();
    let edges = steps
        .iter()
        .flat_map(|&(node, from)| from.iter().map(move |source| (source, node)));
    svg(plan, true, edges, marks)
}

impl Plan {
    /// The plan drawn by Soma as a self-contained SVG document: series left to right, the
    /// branches of a wave stacked in a frame, a stretch that is not series-parallel (walked in
    /// order) in topological columns in a frame of its own, a box with its id for every step
    /// and an arrow for every input. Deterministic; no graphviz involved.
    /// [`Graph::to_svg`] draws a graph, without the frames.
    pub fn to_svg(&self) -> String {
        plan_svg(self, Marks::default())
    }
}

impl Graph {
    /// The graph drawn as an SVG document, laid out with its plan: series left to right, the
    /// branches of a wave stacked, the part that is not series-parallel in topological columns,
    /// a box with its id for every node and an arrow for every edge. Self-contained (no external
    /// font, stylesheet or marker), with an opaque light background so it reads on a dark page
    /// too, and deterministic: the same graph gives the same bytes.
    ///
    /// ```
    /// use soma_core::Graph;
    ///
    /// let mut graph = Graph::new();
    /// graph.add_node("a")?;
    /// graph.add_node("b")?;
    /// graph.add_edge("a", "b")?;
    /// let svg = graph.to_svg();
    /// assert!(svg.starts_with("<svg"));
    /// assert_eq!(svg.matches("<g class=\"edge\">").count(), 1);
    /// # Ok::<(), soma_core::GraphError>(())
    /// ```
    pub fn to_svg(&self) -> String {
        graph_svg(self, Marks::default())
    }

    /// The graph as Mermaid text: the drawing of its plan (a subgraph per wave), as
    /// [`Plan::to_mermaid`] makes it.
    pub fn to_mermaid(&self) -> String {
        decompose(self).to_mermaid()
    }

    /// The graph as graphviz DOT text: the drawing of its plan (a cluster per wave), as
    /// [`Plan::to_dot`] makes it.
    pub fn to_dot(&self) -> String {
        decompose(self).to_dot()
    }
}
