//! The series-parallel tree of a graph in linear time, by reductions: the fast path of
//! [`crate::decompose`].
//!
//! The general decomposition (`mod.rs`) splits a set of nodes by scanning all of it, then
//! splits each part the same way, so a node is visited once per level of nesting: O(n · depth).
//! A series-parallel graph — every graph the DSL writes — has a tree that two local rules find
//! while visiting each node a fixed number of times (Valdes, Tarjan and Lawler, 1982), so its
//! compile time grows with the graph, not with how deep the graph nests.
//!
//! The graph is turned inside out. Every node becomes an *arc*; every *junction* — the edges
//! one `>>` drew, from all the sinks of its left side to all the sources of its right — becomes
//! a *point* where arcs meet; a node without predecessors starts at a common source, one without
//! successors ends at a common sink. The graph is series-parallel exactly when every junction is
//! complete (its edges are all the tail × head pairs: what `>>` draws, and what the general
//! decomposition's cut test demands) and the arcs then shrink to a single one from source to
//! sink under two rules, applied in any order:
//! - *in a row*: a point with one arc in and one arc out is bypassed by one arc carrying the two
//!   trees one after the other;
//! - *side by side*: two arcs between the same points become one carrying the two trees side by
//!   side.
//!
//! The tree comes out flat — a row never directly holds a row, nor side-by-side a side-by-side —
//! which is the canonical form the general decomposition produces too; a wave's branches are
//! then put in order of their first-inserted node, as there. A graph that does not shrink to one
//! arc (an "N", a transitive edge) gets `None`: the general decomposition handles it, walking
//! the parts that have no tree.
//!
//! The tree is as deep as the graph nests, so the plan is built from it on a stack of its own,
//! not by recursion: a graph nested 100,000 levels deep compiles on a small thread stack.

use super::to_rank;
use crate::model::graph::Graph;
use crate::plan::Plan;

/// No junction, no tree, no arc: the end of a list.
const NONE: u32 = u32::MAX;

/// The plan of `graph` when it is series-parallel, else `None`. O(nodes + edges), plus the
/// sorting of each wave's branches.
pub(crate) fn plan(graph: &Graph) -> Option<Plan> {
    if graph.is_empty() {
        return Some(Plan::Empty);
    }
    let junctions = Junctions::of(graph)?;
    let (forest, root) = Shrinker::new(graph, &junctions).shrink()?;
    Some(forest.plan(graph, root))
}

/// Which junction each node's edges belong to.
struct Junctions {
    /// Per node, the junction of its out-edges, or `NONE` when it has no successor.
    out_of: Vec<u32>,
    /// Per node, the junction of its in-edges, or `NONE` when it has no predecessor.
    into: Vec<u32>,
    count: u32,
}

impl Junctions {
    /// The junctions of `graph`, or `None` as soon as one is incomplete: a graph with a missing
    /// tail × head pair is not series-parallel.
    ///
    /// One pass over the predecessor lists, in insertion order. A junction is born at its first
    /// head, whose predecessors are then all its tails; every later head must have exactly those
    /// predecessors, so each head's list is checked against the junction its first predecessor
    /// belongs to: same junction for every predecessor, and as many of them as it has tails.
    /// Every edge is some head's predecessor, so every edge is checked.
    fn of(graph: &Graph) -> Option<Junctions> {
        let n = graph.len();
        let mut out_of = vec![NONE; n];
        let mut into = vec![NONE; n];
        // At most one junction per node: sized once, never copied as it grows.
        let mut tail_count: Vec<usize> = Vec::with_capacity(n);
        for (v, into_v) in into.iter_mut().enumerate() {
            let preds = graph.pred_at(v);
            let Some(&first) = preds.first() else {
                continue;
            };
            let junction = match out_of[first as usize] {
                NONE => {
                    let junction = to_rank(tail_count.len());
                    tail_count.push(preds.len());
                    for &u in preds {
                        if out_of[u as usize] != NONE {
                            return None;
                        }
                        out_of[u as usize] = junction;
                    }
                    junction
                }
                junction => {
                    let complete = preds.len() == tail_count[junction as usize]
                        && preds.iter().all(|&u| out_of[u as usize] == junction);
                    if !complete {
                        return None;
                    }
                    junction
                }
            };
            *into_v = junction;
        }
        Some(Junctions {
            out_of,
            into,
            count: to_rank(tail_count.len()),
        })
    }
}

/// The arcs and points of the inside-out graph, shrunk by the two rules.
///
/// Arcs side by side are merged lazily, which is what spares a table of arcs by endpoints: a
/// point lists its arcs in and out, and checking whether it can be bypassed walks each list,
/// merging every arc that comes from (goes to) the same point as the first and stopping at the
/// first that does not — so a check costs one step plus one per merge, and a list that turns
/// out uniform has become a single arc. Merging only ever lowers the number of points a point
/// is joined to, never the set of them, so deferring it changes which points can be bypassed
/// in no way.
struct Shrinker {
    arcs: Vec<Link>,
    points: Vec<Point>,
    forest: Forest,
    /// Points that may now be bypassed; checked when taken.
    ready: Vec<u32>,
    /// How many arcs are left: one, from source to sink, when the graph is series-parallel.
    live: usize,
}

/// An arc: one node of the graph at first, then a tree of them. Listed at both its points;
/// `tree == NONE` once it is gone, and its list entries are dropped when next walked.
#[derive(Clone, Copy)]
struct Link {
    from: u32,
    to: u32,
    tree: u32,
    /// The next arc into `to`, and out of `from`: the two lists it belongs to.
    next_in: u32,
    next_out: u32,
}

/// The heads of a point's two lists of arcs.
#[derive(Clone, Copy)]
struct Point {
    first_in: u32,
    first_out: u32,
}

/// Which of a point's two lists.
#[derive(Clone, Copy)]
enum End {
    In,
    Out,
}

impl Shrinker {
    fn new(graph: &Graph, junctions: &Junctions) -> Self {
        let n = graph.len();
        let source = junctions.count;
        let sink = junctions.count + 1;
        let mut points = vec![
            Point {
                first_in: NONE,
                first_out: NONE,
            };
            junctions.count as usize + 2
        ];
        let mut arcs = Vec::with_capacity(n);
        // Pushed at the heads of the lists in reverse, so each list comes out in insertion order.
        for v in (0..n).rev() {
            let from = match junctions.into[v] {
                NONE => source,
                junction => junction,
            };
            let to = match junctions.out_of[v] {
                NONE => sink,
                junction => junction,
            };
            arcs.push(Link {
                from,
                to,
                tree: to_rank(v),
                next_in: std::mem::replace(&mut points[to as usize].first_in, to_rank(n - 1 - v)),
                next_out: std::mem::replace(
                    &mut points[from as usize].first_out,
                    to_rank(n - 1 - v),
                ),
            });
        }
        Shrinker {
            arcs,
            points,
            forest: Forest::with_leaves(n),
            ready: (0..junctions.count).collect(),
            live: n,
        }
    }

    /// The forest and its root when the arcs shrink to one, else `None`.
    fn shrink(mut self) -> Option<(Forest, u32)> {
        // Junctions are numbered first; the source and the sink come last, never bypassed.
        let source = to_rank(self.points.len() - 2);
        let sink = source + 1;
        while let Some(point) = self.ready.pop() {
            let Some(before) = self.uniform(point, End::In) else {
                continue;
            };
            let Some(after) = self.uniform(point, End::Out) else {
                continue;
            };
            // `before` (a -> point) becomes a -> c, staying in a's list of arcs out; it joins
            // c's list of arcs in, where `after` (point -> c) is dropped when next walked.
            let (a, c) = (
                self.arcs[before as usize].from,
                self.arcs[after as usize].to,
            );
            let tree = self.forest.join(
                Kind::Row,
                self.arcs[before as usize].tree,
                self.arcs[after as usize].tree,
            );
            self.arcs[after as usize].tree = NONE;
            let next_in = std::mem::replace(&mut self.points[c as usize].first_in, before);
            let arc = &mut self.arcs[before as usize];
            arc.to = c;
            arc.tree = tree;
            arc.next_in = next_in;
            // Bypassed: its lists are emptied, so that a later check of it finds nothing.
            self.points[point as usize] = Point {
                first_in: NONE,
                first_out: NONE,
            };
            self.live -= 1;
            self.ready
                .extend([a, c].into_iter().filter(|&p| p < source));
        }
        let last = self.uniform(source, End::Out)?;
        let whole = self.arcs[last as usize];
        (self.live == 1 && whole.to == sink).then_some((self.forest, whole.tree))
    }

    /// The only arc left in `point`'s list at `end` once arcs from (to) the same point are
    /// merged, or `None` when the list is empty or joins `point` to more than one point.
    fn uniform(&mut self, point: u32, end: End) -> Option<u32> {
        let first = self.live_after(self.head(point, end), end)?;
        self.set_head(point, end, first);
        let other = |arc: &Link| match end {
            End::In => arc.from,
            End::Out => arc.to,
        };
        let far = other(&self.arcs[first as usize]);
        loop {
            let next = self.live_after(self.next(first, end), end);
            self.set_next(first, end, next.unwrap_or(NONE));
            let Some(next) = next else {
                return Some(first);
            };
            if other(&self.arcs[next as usize]) != far {
                return None;
            }
            // Side by side with `first`: merged into it, and gone.
            let tree = self.forest.join(
                Kind::Side,
                self.arcs[first as usize].tree,
                self.arcs[next as usize].tree,
            );
            self.arcs[first as usize].tree = tree;
            self.arcs[next as usize].tree = NONE;
            self.live -= 1;
        }
    }

    /// The first live arc from `at` on along a list at `end` (`at` included).
    fn live_after(&self, mut at: u32, end: End) -> Option<u32> {
        while at != NONE {
            if self.arcs[at as usize].tree != NONE {
                return Some(at);
            }
            at = self.next(at, end);
        }
        None
    }

    fn head(&self, point: u32, end: End) -> u32 {
        let point = &self.points[point as usize];
        match end {
            End::In => point.first_in,
            End::Out => point.first_out,
        }
    }

    fn set_head(&mut self, point: u32, end: End, arc: u32) {
        let point = &mut self.points[point as usize];
        match end {
            End::In => point.first_in = arc,
            End::Out => point.first_out = arc,
        }
    }

    fn next(&self, arc: u32, end: End) -> u32 {
        let arc = &self.arcs[arc as usize];
        match end {
            End::In => arc.next_in,
            End::Out => arc.next_out,
        }
    }

    fn set_next(&mut self, arc: u32, end: End, next: u32) {
        let arc = &mut self.arcs[arc as usize];
        match end {
            End::In => arc.next_in = next,
            End::Out => arc.next_out = next,
        }
    }
}
/// Trees in one arena: the first `n` are the graph's nodes, each a leaf; the others are rows
/// and side-by-sides, whose children are linked through `next`.
struct Forest {
    trees: Vec<Tree>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Leaf,
    Row,
    Side,
}

#[derive(Clone, Copy)]
struct Tree {
    kind: Kind,
    first: u32,
    last: u32,
    next: u32,
    /// The lowest insertion index below: what orders a wave's branches.
    first_inserted: u32,
    /// How many children: the exact size of the plan's list of steps or branches.
    len: u32,
}

impl Forest {
    fn with_leaves(n: usize) -> Self {
        let trees = (0..n)
            .map(|v| Tree {
                kind: Kind::Leaf,
                first: NONE,
                last: NONE,
                next: NONE,
                first_inserted: to_rank(v),
                len: 0,
            })
            .collect();
        Forest { trees }
    }

    /// `x` then `y` (in a row), or `x` beside `y`, flattened: a child of the same kind gives
    /// its children instead of itself. Returns the joined tree.
    fn join(&mut self, kind: Kind, x: u32, y: u32) -> u32 {
        let first_inserted = self.tree(x).first_inserted.min(self.tree(y).first_inserted);
        let len = |tree: &Tree| if tree.kind == kind { tree.len } else { 1 };
        let len = len(self.tree(x)) + len(self.tree(y));
        let joined = match (self.tree(x).kind == kind, self.tree(y).kind == kind) {
            (true, true) => {
                let (y_first, y_last) = (self.tree(y).first, self.tree(y).last);
                let x_last = self.tree(x).last;
                self.tree_mut(x_last).next = y_first;
                self.tree_mut(x).last = y_last;
                x
            }
            (true, false) => {
                let x_last = self.tree(x).last;
                self.tree_mut(x_last).next = y;
                self.tree_mut(x).last = y;
                x
            }
            (false, true) => {
                self.tree_mut(x).next = self.tree(y).first;
                self.tree_mut(y).first = x;
                y
            }
            (false, false) => {
                self.tree_mut(x).next = y;
                self.trees.push(Tree {
                    kind,
                    first: x,
                    last: y,
                    next: NONE,
                    first_inserted,
                    len,
                });
                return to_rank(self.trees.len() - 1);
            }
        };
        let tree = self.tree_mut(joined);
        tree.first_inserted = first_inserted;
        tree.len = len;
        joined
    }

    fn tree(&self, t: u32) -> &Tree {
        &self.trees[t as usize]
    }

    fn tree_mut(&mut self, t: u32) -> &mut Tree {
        &mut self.trees[t as usize]
    }

    /// The children of `t`, in a vector of exactly their number: the plan's lists are as long
    /// as the graph at worst, and growing one by doubling would copy it over and over.
    fn children(&self, t: u32) -> Vec<u32> {
        let mut children = Vec::with_capacity(self.tree(t).len as usize);
        let mut at = self.tree(t).first;
        while at != NONE {
            children.push(at);
            at = self.tree(at).next;
        }
        children
    }

    /// The plan of tree `root`. The trees still being built wait on `open`, innermost last:
    /// a graph nests as deep as it likes on the heap, not on the stack.
    fn plan(&self, graph: &Graph, root: u32) -> Plan {
        let execute = |t: u32| {
            let id = |at: u32| graph.id_at(at as usize).clone();
            Plan::Execute {
                node: id(t),
                from: graph.pred_at(t as usize).iter().map(|&u| id(u)).collect(),
            }
        };
        if self.tree(root).kind == Kind::Leaf {
            return execute(root);
        }
        let mut open = vec![self.open(root)];
        loop {
            let top = open
                .last_mut()
                .expect("the root is open until it is returned");
            match top.rest.next() {
                Some(child) if self.tree(child).kind == Kind::Leaf => {
                    top.plans.push(execute(child));
                }
                Some(child) => open.push(self.open(child)),
                None => {
                    let done = open.pop().expect("the tree just looked at");
                    let plan = if done.wave {
                        Plan::Wave(done.plans)
                    } else {
                        Plan::Sequence(done.plans)
                    };
                    match open.last_mut() {
                        Some(parent) => parent.plans.push(plan),
                        None => return plan,
                    }
                }
            }
        }
    }

    /// Tree `t`, a row or a side-by-side, about to be turned into a plan: its children in plan
    /// order (a wave's branches by their first-inserted node), none of them planned yet.
    fn open(&self, t: u32) -> Open {
        let wave = self.tree(t).kind == Kind::Side;
        let mut children = self.children(t);
        if wave {
            children.sort_unstable_by_key(|&c| self.tree(c).first_inserted);
        }
        Open {
            wave,
            plans: Vec::with_capacity(children.len()),
            rest: children.into_iter(),
        }
    }
}

/// A tree whose plan is being built, in [`Forest::plan`].
struct Open {
    /// A side-by-side, which makes a `Wave`; else a row, which makes a `Sequence`.
    wave: bool,
    /// The plans of its children so far: the plan's list of steps or branches, exactly as long
    /// as it will be.
    plans: Vec<Plan>,
    /// The children not planned yet.
    rest: std::vec::IntoIter<u32>,
}

// The same random DAGs the integration tests draw (see that file's header).
#[cfg(test)]
#[path = "../../tests/it/random_graphs.rs"]
mod random_graphs;

#[cfg(test)]
mod tests {
    //! The fast path against the general decomposition, on random graphs: it must find a tree
    //! exactly when the graph has one, and the same tree.

    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::plan;
    use super::random_graphs::random_dag;
    use crate::compile::decompose_by_cuts;
    use crate::model::graph::Graph;
    use crate::plan::Plan;

    /// splitmix64: a whole random graph from one seed, so a failing case prints as one number.
    struct Dice(u64);

    impl Dice {
        fn roll(&mut self, sides: usize) -> usize {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            usize::try_from((z ^ (z >> 31)) % sides as u64).expect("below sides")
        }

        fn shuffle<T>(&mut self, items: &mut [T]) {
            for i in (1..items.len()).rev() {
                items.swap(i, self.roll(i + 1));
            }
        }
    }

    /// Nodes `0..n` and `edges` between them, inserted in a random order, edges too.
    fn built(dice: &mut Dice, n: usize, mut edges: Vec<(usize, usize)>) -> Graph {
        let mut order: Vec<usize> = (0..n).collect();
        dice.shuffle(&mut order);
        dice.shuffle(&mut edges);
        let mut graph = Graph::new();
        for v in order {
            graph.add_node(format!("n{v}")).expect("fresh id");
        }
        for (u, v) in edges {
            graph
                .add_edge(&format!("n{u}"), &format!("n{v}"))
                .expect("acyclic");
        }
        graph
    }

    /// A random series-parallel graph of about `budget` nodes: returns its sources and sinks.
    fn grow(
        dice: &mut Dice,
        budget: usize,
        next: &mut usize,
        edges: &mut Vec<(usize, usize)>,
    ) -> (Vec<usize>, Vec<usize>) {
        if budget <= 1 || dice.roll(4) == 0 {
            *next += 1;
            return (vec![*next - 1], vec![*next - 1]);
        }
        let parts = 2 + dice.roll(3);
        let mut shares = vec![1; parts];
        for _ in parts..budget {
            shares[dice.roll(parts)] += 1;
        }
        let grown: Vec<_> = shares
            .iter()
            .map(|&share| grow(dice, share, next, edges))
            .collect();
        if dice.roll(2) == 0 {
            let sources = grown.iter().flat_map(|(s, _)| s.clone()).collect();
            let sinks = grown.iter().flat_map(|(_, t)| t.clone()).collect();
            return (sources, sinks);
        }
        for pair in grown.windows(2) {
            for &u in &pair[0].1 {
                for &v in &pair[1].0 {
                    edges.push((u, v));
                }
            }
        }
        (grown[0].0.clone(), grown[grown.len() - 1].1.clone())
    }

    fn random_series_parallel(seed: u64) -> Graph {
        let mut dice = Dice(seed);
        let budget = 1 + dice.roll(24);
        let (mut next, mut edges) = (0, Vec::new());
        grow(&mut dice, budget, &mut next, &mut edges);
        built(&mut dice, next, edges)
    }

    /// The edges a plan's tree stands for: a row joins the sinks of each step to the sources
    /// of the next; side by side joins nothing. Equal to the graph's edges exactly when the
    /// plan walked nothing.
    fn implied_edges(
        plan: &Plan,
        edges: &mut BTreeSet<(String, String)>,
    ) -> (Vec<String>, Vec<String>) {
        match plan {
            Plan::Empty => (Vec::new(), Vec::new()),
            Plan::Execute { node, .. }
            | Plan::Map { node, .. }
            | Plan::Switch { node, .. }
            | Plan::Loop { node, .. } => (vec![node.to_string()], vec![node.to_string()]),
            Plan::Sequence(steps) => {
                let ends: Vec<_> = steps
                    .iter()
                    .map(|step| implied_edges(step, edges))
                    .collect();
                for pair in ends.windows(2) {
                    for u in &pair[0].1 {
                        for v in &pair[1].0 {
                            edges.insert((u.clone(), v.clone()));
                        }
                    }
                }
                (ends[0].0.clone(), ends[ends.len() - 1].1.clone())
            }
            Plan::Wave(branches) => {
                let ends: Vec<_> = branches
                    .iter()
                    .map(|branch| implied_edges(branch, edges))
                    .collect();
                let sources = ends.iter().flat_map(|(s, _)| s.clone()).collect();
                let sinks = ends.iter().flat_map(|(_, t)| t.clone()).collect();
                (sources, sinks)
            }
            Plan::Remote { inner, .. } => implied_edges(inner, edges),
        }
    }

    fn has_a_tree(graph: &Graph, plan: &Plan) -> bool {
        let mut implied = BTreeSet::new();
        implied_edges(plan, &mut implied);
        let actual: BTreeSet<_> = graph
            .edges()
            .map(|(u, v)| (u.to_string(), v.to_string()))
            .collect();
        implied == actual
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn a_random_graph_takes_the_fast_path_exactly_when_it_has_a_tree(dag in random_dag()) {
            let graph = dag.graph();
            let general = decompose_by_cuts(&graph);
            match plan(&graph) {
                Some(fast) => prop_assert_eq!(fast, general),
                None => prop_assert!(!has_a_tree(&graph, &general), "missed the tree of {general}"),
            }
        }

        #[test]
        fn a_series_parallel_graph_reduces_to_the_general_decompositions_plan(seed in any::<u64>()) {
            let graph = random_series_parallel(seed);
            let general = decompose_by_cuts(&graph);
            prop_assert!(has_a_tree(&graph, &general));
            prop_assert_eq!(plan(&graph), Some(general));
        }
    }
}
