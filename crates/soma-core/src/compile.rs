//! `compile`: from a graph to a plan, by recovering its series-parallel tree.
//!
//! The tree is recovered from the graph, never from the expression that built it: a graph built
//! with `add_node`/`add_edge` in a loop compiles exactly like the DSL expression that draws the
//! same topology. Four cases, in this order, for each set of nodes:
//!
//! | the set | becomes |
//! |---|---|
//! | no node | `Empty` |
//! | one node | `Execute` |
//! | several weakly connected components | `Wave`, one branch per component, in declaration order |
//! | series cuts | `Sequence` of the segments between them, in a row |
//! | none of the above | the set walked in topological order: it is not series-parallel |
//!
//! A series cut `(A, B)` is what `>>` makes: the edges from `A` to `B` run from every sink of
//! `A` to every source of `B`, and from nowhere else. In a series composition every node of `A`
//! precedes every node of `B` in *any* topological order, so testing the prefixes of one order
//! finds every cut; and the segments between consecutive cuts have no cut of their own, so one
//! scan splits a set completely. The scan keeps four counters up to date as nodes move from `B`
//! to `A` — crossing edges, crossing edges that run sink-to-source, sinks of `A`, sources of
//! `B` — and a prefix is a cut when all crossing edges are sink-to-source and there are exactly
//! `sinks × sources` of them (edges are never duplicated, so that means every pair).
//!
//! Graphs the DSL cannot write (the smallest is the "N": `a->c, a->d, b->d`) have no tree —
//! a theorem (Valdes, Tarjan and Lawler, 1982), not a gap in the algorithm — and are walked in
//! sequence where they occur, without spoiling the parallelism around them.

use std::fmt;

use crate::catalog::Catalog;
use crate::graph::Graph;
use crate::id::NodeId;
use crate::plan::Plan;

/// Why a graph could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileError {
    /// A node of the graph has no implementation in the catalog.
    MissingImplementation {
        /// The first such node, in insertion order.
        node: NodeId,
    },
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileError::MissingImplementation { node } => write!(
                f,
                "node `{node}` has no implementation\nhint: register one for `{node}` in the catalog before compiling"
            ),
        }
    }
}

impl std::error::Error for CompileError {}

/// Compiles `graph` into a plan, checking that `catalog` implements every node.
///
/// # Errors
/// [`CompileError::MissingImplementation`] for the first node, in insertion order, that the
/// catalog lacks.
///
/// # Complexity
/// O((nodes + edges) · log nodes) per level of series-parallel nesting.
pub fn compile(graph: &Graph, catalog: &Catalog) -> Result<Plan, CompileError> {
    if let Some(node) = graph
        .nodes()
        .iter()
        .find(|id| !catalog.contains(id.as_str()))
    {
        return Err(CompileError::MissingImplementation { node: node.clone() });
    }
    Ok(decompose(graph))
}

/// The plan of a graph's topology alone, implementations aside. See the module documentation.
pub fn decompose(graph: &Graph) -> Plan {
    let mut decomposer = Decomposer::new(graph);
    let everything: Vec<usize> = (0..graph.len()).collect();
    decomposer.split(&everything, false)
}

/// Scratch space shared by every level of the decomposition, so a level touches only its own
/// nodes and never allocates per node.
///
/// Nodes are renumbered by their rank in one topological order, and adjacency is copied into
/// flat arrays in that numbering: a set is then a sorted list of ranks, and the nodes of one
/// branch — consecutive in that order — sit next to each other in memory, which is most of the
/// speed of every scan below.
struct Decomposer<'g> {
    graph: &'g Graph,
    /// Rank -> insertion index.
    order: Vec<usize>,
    /// Successors of rank `r`: `succ[succ_start[r]..succ_start[r + 1]]`, as ranks.
    succ_start: Vec<usize>,
    succ: Vec<usize>,
    /// Predecessors, likewise.
    pred_start: Vec<usize>,
    pred: Vec<usize>,
    /// What each pass keeps per node, side by side so that visiting a node touches one cache
    /// line, not one per array — most of what a large graph costs.
    scratch: Vec<Scratch>,
    pass: u32,
}

/// Per-node state of the current pass.
#[derive(Clone, Copy, Default)]
struct Scratch {
    /// `== pass` when the node is in the set being split by the current pass.
    member: u32,
    /// `== pass` once the node has been reached by the current pass's component search, or
    /// moved into `A` by its cut scan.
    seen: u32,
    /// For the cut scan: predecessors still in `B`.
    left: u32,
    /// For the component search: the component the node belongs to.
    component: u32,
    /// For the cut scan: whether a node of `A` has no successor in `A`.
    sink: bool,
}

impl<'g> Decomposer<'g> {
    fn new(graph: &'g Graph) -> Self {
        let n = graph.len();
        let order = graph.topological_order();
        let mut rank = vec![0; n];
        for (r, &v) in order.iter().enumerate() {
            rank[v] = r;
        }
        let flatten = |neighbours: &dyn Fn(usize) -> &'g [usize]| {
            let mut start = Vec::with_capacity(n + 1);
            let mut flat = Vec::new();
            for &v in &order {
                start.push(flat.len());
                flat.extend(neighbours(v).iter().map(|&w| rank[w]));
            }
            start.push(flat.len());
            (start, flat)
        };
        let (succ_start, succ) = flatten(&|v| graph.succ_at(v));
        let (pred_start, pred) = flatten(&|v| graph.pred_at(v));
        Decomposer {
            graph,
            order,
            succ_start,
            succ,
            pred_start,
            pred,
            scratch: vec![Scratch::default(); n],
            pass: 0,
        }
    }

    fn pred(&self, r: usize) -> &[usize] {
        &self.pred[self.pred_start[r]..self.pred_start[r + 1]]
    }

    fn execute(&self, r: usize) -> Plan {
        let v = self.order[r];
        Plan::Execute {
            node: self.graph.id_at(v).clone(),
            from: self
                .graph
                .pred_at(v)
                .iter()
                .map(|&u| self.graph.id_at(u).clone())
                .collect(),
        }
    }

    /// Starts a pass over `nodes`: marks them as the current set.
    fn begin(&mut self, nodes: &[usize]) {
        self.pass += 1;
        for &v in nodes {
            self.scratch[v].member = self.pass;
        }
    }

    /// The plan of `nodes`, ranks in increasing order; `connected` when they are known to form
    /// one component (a component found by the caller), which spares a search.
    fn split(&mut self, nodes: &[usize], connected: bool) -> Plan {
        match nodes.len() {
            0 => return Plan::Empty,
            1 => return self.execute(nodes[0]),
            _ => {}
        }
        if !connected {
            self.begin(nodes);
            let components = self.components(nodes);
            if components.len() > 1 {
                return Plan::Wave(components.iter().map(|c| self.split(c, true)).collect());
            }
        }
        let cuts = self.series_cuts(nodes);
        if cuts.is_empty() {
            return Plan::Sequence(nodes.iter().map(|&v| self.execute(v)).collect());
        }
        let mut steps = Vec::with_capacity(cuts.len() + 1);
        let mut start = 0;
        for end in cuts.into_iter().chain(std::iter::once(nodes.len())) {
            match self.split(&nodes[start..end], false) {
                // Series steps stand in a row: a segment walked in sequence joins the row.
                Plan::Sequence(inner) => steps.extend(inner),
                step @ (Plan::Empty | Plan::Execute { .. } | Plan::Wave(_)) => steps.push(step),
            }
            start = end;
        }
        Plan::Sequence(steps)
    }

    /// The weakly connected components of the current set, each in topological order, ordered
    /// by their first-inserted node (declaration order for the DSL); none when the set is
    /// connected.
    fn components(&mut self, nodes: &[usize]) -> Vec<Vec<usize>> {
        let mut firsts: Vec<usize> = Vec::new();
        let mut stack = Vec::new();
        for &start in nodes {
            if self.scratch[start].seen == self.pass {
                continue;
            }
            let label = u32::try_from(firsts.len()).expect("fewer components than u32::MAX");
            let mut first = start;
            self.scratch[start].seen = self.pass;
            stack.push(start);
            while let Some(v) = stack.pop() {
                self.scratch[v].component = label;
                first = first.min(self.order[v]);
                let around = self.succ[self.succ_start[v]..self.succ_start[v + 1]]
                    .iter()
                    .chain(&self.pred[self.pred_start[v]..self.pred_start[v + 1]]);
                for &w in around {
                    if self.scratch[w].member == self.pass && self.scratch[w].seen != self.pass {
                        self.scratch[w].seen = self.pass;
                        stack.push(w);
                    }
                }
            }
            firsts.push(first);
        }
        if firsts.len() == 1 {
            return Vec::new(); // One component: the caller goes on with the set it has.
        }
        let mut sizes = vec![0; firsts.len()];
        for &v in nodes {
            sizes[self.scratch[v].component as usize] += 1;
        }
        let mut groups: Vec<Vec<usize>> = sizes.into_iter().map(Vec::with_capacity).collect();
        for &v in nodes {
            groups[self.scratch[v].component as usize].push(v);
        }
        let mut labelled: Vec<(usize, Vec<usize>)> = firsts.into_iter().zip(groups).collect();
        labelled.sort_by_key(|(first, _)| *first);
        labelled.into_iter().map(|(_, group)| group).collect()
    }

    /// Every `k` such that `nodes[..k]` and `nodes[k..]` form a series cut of the current set
    /// (`nodes` in topological order, one connected component). O(nodes + edges).
    fn series_cuts(&mut self, nodes: &[usize]) -> Vec<usize> {
        // `seen` marks membership in A for this scan; the component search is done with it.
        self.pass += 1;
        let in_a = self.pass;
        for &v in nodes {
            self.scratch[v].member = in_a;
            self.scratch[v].sink = false;
            let preds = self
                .pred(v)
                .iter()
                .filter(|&&u| self.scratch[u].member == in_a);
            self.scratch[v].left = u32::try_from(preds.count()).expect("in-degree fits in u32");
        }
        let mut sources: u64 = nodes.iter().filter(|&&v| self.scratch[v].left == 0).count() as u64;
        let mut sinks: u64 = 0;
        let mut crossing: u64 = 0;
        let mut good: u64 = 0;
        let mut cuts = Vec::new();
        for (k, &v) in nodes[..nodes.len() - 1].iter().enumerate() {
            // v leaves B (where, its predecessors all in A, it was a source) and joins A.
            self.scratch[v].seen = in_a;
            sources -= 1;
            for at in self.pred_start[v]..self.pred_start[v + 1] {
                let u = self.pred[at];
                if self.scratch[u].member != in_a {
                    continue;
                }
                crossing -= 1;
                if self.scratch[u].sink {
                    // u -> v was sink-to-source; u now has a successor in A and stops being a
                    // sink, so its other crossing edges into sources of B stop being good.
                    good -= 1;
                    self.scratch[u].sink = false;
                    sinks -= 1;
                    for at in self.succ_start[u]..self.succ_start[u + 1] {
                        let w = self.succ[at];
                        if self.scratch[w].member == in_a
                            && self.scratch[w].seen != in_a
                            && self.scratch[w].left == 0
                        {
                            good -= 1;
                        }
                    }
                }
            }
            self.scratch[v].sink = true;
            sinks += 1;
            for at in self.succ_start[v]..self.succ_start[v + 1] {
                let w = self.succ[at];
                if self.scratch[w].member != in_a {
                    continue;
                }
                crossing += 1;
                self.scratch[w].left -= 1;
                if self.scratch[w].left == 0 {
                    // w becomes a source of B: its edges from sinks of A become good.
                    sources += 1;
                    for at in self.pred_start[w]..self.pred_start[w + 1] {
                        let x = self.pred[at];
                        if self.scratch[x].member == in_a && self.scratch[x].sink {
                            good += 1;
                        }
                    }
                }
            }
            if crossing == good && good == sinks * sources {
                cuts.push(k + 1);
            }
        }
        cuts
    }
}
