//! `compile`: from a graph to a plan, by recovering its series-parallel tree.
//!
//! The tree is recovered from the graph, never from the expression that built it: a graph built
//! with `add_node`/`add_edge` in a loop compiles exactly like the DSL expression that draws the
//! same topology. For each set of nodes, in this order:
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
//!
//! Those scans visit a node once per level of nesting. A graph that does have a tree — every
//! graph the DSL writes — first takes the linear-time path of `reduction.rs`, which finds
//! the same tree without levels; only a graph without one comes here. Neither recurses: the
//! sets still being split, like the trees still being built, wait on a stack on the heap, so
//! however deep a graph nests, compiling it needs no more thread stack than a flat one.

mod decide;
mod distribute;
mod reduction;
mod route;

pub use decide::compile_decided;
pub use distribute::distribute;
pub use route::{Route, RouteError};

use std::fmt;

use crate::model::catalog::Catalog;
use crate::model::graph::Graph;
use crate::model::id::NodeId;
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
/// O(nodes + edges), plus sorting each wave's branches, for a series-parallel graph; for any
/// other, O((nodes + edges) · log nodes) per level of nesting.
pub fn compile(graph: &Graph, catalog: &Catalog) -> Result<Plan, CompileError> {
    if let Some(node) = catalog.first_missing(graph.nodes()) {
        return Err(CompileError::MissingImplementation { node: node.clone() });
    }
    Ok(decompose(graph))
}

/// The plan of a graph's topology alone, implementations aside: its series-parallel tree, or,
/// where a part of it has none, that part walked in topological order.
///
/// A series-parallel graph (every graph the DSL writes) is decomposed in linear time, by series
/// and parallel reductions; any other by scans that visit each node once per level of nesting.
/// Both give the same plan wherever both apply.
pub fn decompose(graph: &Graph) -> Plan {
    reduction::plan(graph).unwrap_or_else(|| decompose_by_cuts(graph))
}

/// The general decomposition: components and series cuts, one scan per set, level by level.
pub(crate) fn decompose_by_cuts(graph: &Graph) -> Plan {
    let mut decomposer = Decomposer::new(graph);
    let mut everything: Vec<Rank> = (0..decomposer.order.len()).map(to_rank).collect();
    decomposer.split(&mut everything)
}

/// A node's position in the decomposer's topological order. 32 bits, not a `usize`: every array
/// the scans walk is indexed by or made of ranks, and half the bytes is half the cache misses
/// once a graph outgrows the cache.
type Rank = u32;

/// A node index or an edge count as a `u32`: the decomposer's arrays, and the reductions' too,
/// hold nothing wider.
fn to_rank(at: usize) -> u32 {
    u32::try_from(at).expect("fewer nodes and edges than u32::MAX")
}

/// Scratch space shared by every level of the decomposition, so a level touches only its own
/// nodes and allocates nothing per node.
///
/// Nodes are renumbered by their rank in one topological order, and adjacency is copied into
/// flat arrays in that numbering: a set is then a sorted list of ranks, and the nodes of one
/// branch — consecutive in that order — sit next to each other in memory, which is most of the
/// speed of every scan below. Every set lives in one buffer of ranks, made by the caller of
/// [`Decomposer::split`]: a level reorders its slice in place so that each part it finds is a
/// sub-slice, and hands the sub-slices down.
struct Decomposer<'g> {
    graph: &'g Graph,
    /// Rank -> insertion index.
    order: Vec<Rank>,
    adjacency: Adjacency,
    /// What each pass keeps per node, side by side so that visiting a node touches one cache
    /// line, not one per array — most of what a large graph costs.
    scratch: Vec<Scratch>,
    pass: u32,
    /// The component search's depth-first stack.
    stack: Vec<Rank>,
    /// The components the current search found, in the order it found them.
    found: Vec<Component>,
    /// Where each component's nodes go when a set is regrouped, by component label.
    place: Vec<usize>,
    /// A set regrouped by component, before it is copied back over the set.
    regrouped: Vec<Rank>,
    /// Where the parts of the sets being split end, innermost set last: a set pushes its own
    /// above those of the sets around it and pops them once its parts are planned.
    bounds: Vec<usize>,
}

/// Adjacency in rank numbering, compressed: the neighbours of every node, one after the other.
struct Adjacency {
    /// Successors of rank `r`: `succ[succ_start[r]..succ_start[r + 1]]`.
    succ_start: Vec<u32>,
    succ: Vec<Rank>,
    /// Predecessors, likewise, in edge-declaration order (what `Execute::from` lists).
    pred_start: Vec<u32>,
    pred: Vec<Rank>,
}

impl Adjacency {
    fn succ(&self, r: Rank) -> &[Rank] {
        let r = r as usize;
        &self.succ[self.succ_start[r] as usize..self.succ_start[r + 1] as usize]
    }

    fn pred(&self, r: Rank) -> &[Rank] {
        let r = r as usize;
        &self.pred[self.pred_start[r] as usize..self.pred_start[r + 1] as usize]
    }
}

/// Per-node state of the current pass: one pass per set, shared by its component search and
/// its cut scan.
#[derive(Clone, Copy, Default)]
struct Scratch {
    /// `== pass` when the node is in the set being split by the current pass.
    member: u32,
    /// `== pass` once the component search has reached the node.
    seen: u32,
    /// For the component search, the label of the node's component; for the cut scan, `IN_A`
    /// once the node is in `A`, else its predecessors still in `B`. One field for both keeps the
    /// struct at 16 bytes, four nodes to a cache line; the scan starts after the search is done.
    tally: u32,
    /// For the cut scan: `== pass` while the node is in `A` and has no successor in `A`.
    sink: u32,
}

/// One weakly connected component found by the component search.
struct Component {
    /// Its first-inserted node, by insertion index: what orders a wave's branches.
    first: u32,
    /// The label its nodes carry in `Scratch::tally`.
    label: u32,
    /// How many nodes it has.
    size: usize,
    /// Its lowest and highest ranks.
    lowest: Rank,
    highest: Rank,
}

/// What one level of the decomposition makes of a set.
enum Split {
    /// Its plan: it has no parts to split further.
    Whole(Plan),
    /// Its parts, each a sub-slice of the set, ending at `bounds[base..base + count]`: the
    /// branches of a wave, or the segments between series cuts.
    Parts {
        wave: bool,
        base: usize,
        count: usize,
    },
}

/// A set whose parts are being planned, in [`Decomposer::split`].
struct Open {
    /// Where the set starts in the buffer of ranks; its parts' ends are relative to it.
    start: usize,
    wave: bool,
    /// Where its parts' ends sit on `bounds`, and how many parts there are.
    base: usize,
    count: usize,
    /// How many parts are planned, and their plans.
    done: usize,
    plans: Vec<Plan>,
}

impl<'g> Decomposer<'g> {
    fn new(graph: &'g Graph) -> Self {
        let n = graph.len();
        let (adjacency, forward) = Adjacency::of(graph);
        // The order is the one that always takes the earliest-inserted ready node. When every
        // edge runs from an earlier node to a later one (a graph built front to back, as a
        // loop usually builds one) that order is insertion order itself, found without the
        // priority queue the general case needs.
        let (order, adjacency) = if forward {
            ((0..n).map(to_rank).collect(), adjacency)
        } else {
            let order: Vec<Rank> = graph.topological_order().into_iter().map(to_rank).collect();
            let renumbered = adjacency.renumbered(&order);
            (order, renumbered)
        };
        Decomposer {
            graph,
            order,
            adjacency,
            scratch: vec![Scratch::default(); n],
            pass: 0,
            stack: Vec::new(),
            found: Vec::new(),
            place: Vec::new(),
            regrouped: Vec::new(),
            bounds: Vec::new(),
        }
    }

    fn execute(&self, r: Rank) -> Plan {
        let id = |r: Rank| self.graph.id_at(self.order[r as usize] as usize).clone();
        Plan::Execute {
            node: id(r),
            from: self.adjacency.pred(r).iter().map(|&u| id(u)).collect(),
        }
    }

    /// The plan of `nodes`, ranks in increasing order. Leaves `nodes` reordered.
    ///
    /// A set splits into parts, each part into its own, as deep as the graph nests; the sets
    /// still being split wait on `open`, innermost last, so the depth costs heap, not stack.
    fn split(&mut self, nodes: &mut [Rank]) -> Plan {
        let mut open: Vec<Open> = Vec::new();
        // The set to split next: where it starts and ends in `nodes`, and whether it is known
        // to be connected.
        let (mut start, mut end, mut connected) = (0, nodes.len(), false);
        loop {
            let mut plan = match self.split_once(&mut nodes[start..end], connected) {
                Split::Whole(plan) => plan,
                Split::Parts { wave, base, count } => {
                    open.push(Open {
                        start,
                        wave,
                        base,
                        count,
                        done: 0,
                        plans: Vec::with_capacity(count),
                    });
                    // Into its first part.
                    end = start + self.bounds[base];
                    connected = wave;
                    continue;
                }
            };
            // A plan is done: it joins its set's, which is done in turn after its last part.
            loop {
                let Some(set) = open.last_mut() else {
                    return plan;
                };
                match &mut plan {
                    // Series steps stand in a row: a segment walked in sequence joins the row.
                    Plan::Sequence(inner) if !set.wave => set.plans.append(inner),
                    _ => set.plans.push(plan),
                }
                set.done += 1;
                if set.done < set.count {
                    start = set.start + self.bounds[set.base + set.done - 1];
                    end = set.start + self.bounds[set.base + set.done];
                    connected = set.wave;
                    break;
                }
                let set = open.pop().expect("the set just looked at");
                self.bounds.truncate(set.base);
                plan = if set.wave {
                    Plan::Wave(set.plans)
                } else {
                    Plan::Sequence(set.plans)
                };
            }
        }
    }

    /// One level of [`Decomposer::split`]: the plan of `nodes` when it needs no parts, else
    /// the parts, pushed onto `bounds`. `connected` when the nodes are known to form one
    /// component (a branch found by the level above), which spares a search.
    fn split_once(&mut self, nodes: &mut [Rank], connected: bool) -> Split {
        match nodes {
            [] => return Split::Whole(Plan::Empty),
            [one] => return Split::Whole(self.execute(*one)),
            _ => {}
        }
        // One pass per set: the component search and the cut scan both read its marks.
        self.pass += 1;
        let base = self.bounds.len();
        if !connected {
            self.components(nodes);
            let count = self.bounds.len() - base;
            if count > 1 {
                return Split::Parts {
                    wave: true,
                    base,
                    count,
                };
            }
            self.bounds.truncate(base);
        }
        self.series_cuts(nodes);
        let cut_count = self.bounds.len() - base;
        if cut_count == 0 {
            return Split::Whole(Plan::Sequence(
                nodes.iter().map(|&v| self.execute(v)).collect(),
            ));
        }
        self.bounds.push(nodes.len());
        Split::Parts {
            wave: false,
            base,
            count: cut_count + 1,
        }
    }

    /// Regroups `nodes` by weakly connected component, each component in topological order and
    /// the components ordered by their first-inserted node (declaration order for the DSL), and
    /// pushes where each component ends onto `bounds`; one end, and `nodes` untouched, when the
    /// set is connected.
    fn components(&mut self, nodes: &mut [Rank]) {
        let pass = self.pass;
        for &v in nodes.iter() {
            self.scratch[v as usize].member = pass;
        }
        self.found.clear();
        for &start in nodes.iter() {
            if self.scratch[start as usize].seen == pass {
                continue;
            }
            let label = u32::try_from(self.found.len()).expect("fewer components than u32::MAX");
            let mut first = u32::MAX;
            let mut size = 0;
            let (mut lowest, mut highest) = (start, start);
            self.scratch[start as usize].seen = pass;
            self.stack.push(start);
            while let Some(v) = self.stack.pop() {
                self.scratch[v as usize].tally = label;
                first = first.min(self.order[v as usize]);
                size += 1;
                lowest = lowest.min(v);
                highest = highest.max(v);
                let around = self.adjacency.succ(v).iter().chain(self.adjacency.pred(v));
                for &w in around {
                    let w_scratch = &mut self.scratch[w as usize];
                    if w_scratch.member == pass && w_scratch.seen != pass {
                        w_scratch.seen = pass;
                        self.stack.push(w);
                    }
                }
            }
            self.found.push(Component {
                first,
                label,
                size,
                lowest,
                highest,
            });
        }
        self.found.sort_unstable_by_key(|component| component.first);
        let base = self.bounds.len();
        let mut end = 0;
        for component in &self.found {
            end += component.size;
            self.bounds.push(end);
        }
        // `nodes` is sorted by rank, so components whose rank ranges follow one another in
        // branch order already sit where they belong: the usual case, a graph declared branch
        // by branch, costs no regrouping.
        let in_place = self
            .found
            .windows(2)
            .all(|pair| pair[0].highest < pair[1].lowest);
        if in_place {
            return;
        }
        // A counting sort, stable, so each component keeps its nodes in topological order.
        self.place.clear();
        self.place.resize(self.found.len(), 0);
        for (component, &end) in self.found.iter().zip(&self.bounds[base..]) {
            self.place[component.label as usize] = end - component.size;
        }
        self.regrouped
            .resize(self.regrouped.len().max(nodes.len()), 0);
        let regrouped = &mut self.regrouped[..nodes.len()];
        for &v in nodes.iter() {
            let place = &mut self.place[self.scratch[v as usize].tally as usize];
            regrouped[*place] = v;
            *place += 1;
        }
        nodes.copy_from_slice(regrouped);
    }

    /// Pushes onto `bounds` every `k` such that `nodes[..k]` and `nodes[k..]` form a series cut
    /// of `nodes` (in topological order, one connected component). O(nodes + edges).
    fn series_cuts(&mut self, nodes: &[Rank]) {
        // The current pass marks the set (`member`) and the sinks of A (`sink`); a node of A has
        // `tally == IN_A`, a node of B its predecessors still in B.
        const IN_A: u32 = u32::MAX;
        let pass = self.pass;
        let mut sources: u64 = 0;
        for &v in nodes {
            // Marking as we go is enough: a node's predecessors in the set come before it.
            self.scratch[v as usize].member = pass;
            let preds = self
                .adjacency
                .pred(v)
                .iter()
                .filter(|&&u| self.scratch[u as usize].member == pass);
            let left = u32::try_from(preds.count()).expect("in-degree below u32::MAX");
            self.scratch[v as usize].tally = left;
            sources += u64::from(left == 0);
        }
        let mut sinks: u64 = 0;
        let mut crossing: u64 = 0;
        let mut good: u64 = 0;
        for (k, &v) in nodes[..nodes.len() - 1].iter().enumerate() {
            // v leaves B (where, its predecessors all in A, it was a source) and joins A.
            self.scratch[v as usize].tally = IN_A;
            sources -= 1;
            for &u in self.adjacency.pred(v) {
                if self.scratch[u as usize].member != pass {
                    continue;
                }
                crossing -= 1;
                if self.scratch[u as usize].sink == pass {
                    // u -> v was sink-to-source; u now has a successor in A and stops being a
                    // sink, so its other crossing edges into sources of B stop being good.
                    good -= 1;
                    self.scratch[u as usize].sink = 0;
                    sinks -= 1;
                    for &w in self.adjacency.succ(u) {
                        let w_scratch = self.scratch[w as usize];
                        if w_scratch.member == pass && w_scratch.tally == 0 {
                            good -= 1;
                        }
                    }
                }
            }
            self.scratch[v as usize].sink = pass;
            sinks += 1;
            for &w in self.adjacency.succ(v) {
                let w_scratch = &mut self.scratch[w as usize];
                if w_scratch.member != pass {
                    continue;
                }
                crossing += 1;
                w_scratch.tally -= 1;
                if w_scratch.tally == 0 {
                    // w becomes a source of B: its edges from sinks of A become good.
                    sources += 1;
                    for &x in self.adjacency.pred(w) {
                        let x_scratch = self.scratch[x as usize];
                        if x_scratch.member == pass && x_scratch.sink == pass {
                            good += 1;
                        }
                    }
                }
            }
            if crossing == good && good == sinks * sources {
                self.bounds.push(k + 1);
            }
        }
    }
}

impl Adjacency {
    /// The graph's adjacency in insertion numbering, and whether every edge runs forward in it.
    fn of(graph: &Graph) -> (Adjacency, bool) {
        let n = graph.len();
        let edge_count = graph.edges().len();
        let mut forward = true;
        let mut succ_start = Vec::with_capacity(n + 1);
        let mut succ = Vec::with_capacity(edge_count);
        for v in 0..n {
            succ_start.push(to_rank(succ.len()));
            let targets = graph.succ_at(v);
            forward &= targets.iter().all(|&w| w as usize > v);
            succ.extend_from_slice(targets);
        }
        succ_start.push(to_rank(succ.len()));
        let mut pred_start = Vec::with_capacity(n + 1);
        let mut pred = Vec::with_capacity(edge_count);
        for v in 0..n {
            pred_start.push(to_rank(pred.len()));
            pred.extend_from_slice(graph.pred_at(v));
        }
        pred_start.push(to_rank(pred.len()));
        let adjacency = Adjacency {
            succ_start,
            succ,
            pred_start,
            pred,
        };
        (adjacency, forward)
    }

    /// The same adjacency with node `order[r]` renamed `r`, each neighbour list in its order.
    fn renumbered(&self, order: &[Rank]) -> Adjacency {
        let mut rank = vec![0; order.len()];
        for (r, &v) in order.iter().enumerate() {
            rank[v as usize] = to_rank(r);
        }
        let renumber = |start: &[u32], flat: &[Rank]| {
            let mut new_start = Vec::with_capacity(start.len());
            let mut new_flat = Vec::with_capacity(flat.len());
            for &v in order {
                new_start.push(to_rank(new_flat.len()));
                let v = v as usize;
                let neighbours = &flat[start[v] as usize..start[v + 1] as usize];
                new_flat.extend(neighbours.iter().map(|&w| rank[w as usize]));
            }
            new_start.push(to_rank(new_flat.len()));
            (new_start, new_flat)
        };
        let (succ_start, succ) = renumber(&self.succ_start, &self.succ);
        let (pred_start, pred) = renumber(&self.pred_start, &self.pred);
        Adjacency {
            succ_start,
            succ,
            pred_start,
            pred,
        }
    }
}
