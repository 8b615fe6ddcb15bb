//! The graphs the benchmarks measure, built with `add_node`/`add_edge` as a loop would.
// Each benchmark binary uses some of these shapes, never all.
#![allow(dead_code)]

use soma_core::Graph;

fn id(n: usize) -> String {
    format!("n{n}")
}

/// `n0 -> n1 -> ... -> n(len-1)`.
pub fn chain(len: usize) -> Graph {
    let mut graph = Graph::new();
    for i in 0..len {
        graph.add_node(id(i)).expect("fresh id");
        if i > 0 {
            graph.add_edge(&id(i - 1), &id(i)).expect("acyclic");
        }
    }
    graph
}

/// A series-parallel graph of about `size` nodes, nested waves and chains: a head, three
/// branches that are each such a graph of a third of the rest, and a tail — down to short
/// chains. Nesting depth grows with log3(size), as real models nest blocks inside blocks.
pub fn nested(size: usize) -> Graph {
    let mut graph = Graph::new();
    let mut next = 0;
    grow(&mut graph, &mut next, size);
    graph
}

/// Adds a nested graph of about `size` nodes; returns its heads and its terminals.
fn grow(graph: &mut Graph, next: &mut usize, size: usize) -> (Vec<String>, Vec<String>) {
    if size <= 8 {
        let names: Vec<String> = (0..size.max(1)).map(|_| fresh(graph, next)).collect();
        for pair in names.windows(2) {
            graph.add_edge(&pair[0], &pair[1]).expect("acyclic");
        }
        return (vec![names[0].clone()], vec![names[names.len() - 1].clone()]);
    }
    let head = fresh(graph, next);
    let mut terminals = Vec::new();
    for _ in 0..3 {
        let (heads, tails) = grow(graph, next, (size - 2) / 3);
        for h in &heads {
            graph.add_edge(&head, h).expect("acyclic");
        }
        terminals.extend(tails);
    }
    let tail = fresh(graph, next);
    for t in &terminals {
        graph.add_edge(t, &tail).expect("acyclic");
    }
    (vec![head], vec![tail])
}

/// `blocks` blocks `a >> ((b >> c) | d | (e >> (f | g))) >> h` one after another, the `h` of
/// each feeding the `a` of the next: `8 * blocks` nodes, four wide, waves nested two deep however
/// long — the Python benchmark's nested graph. Ids are the letter and the block (`c12`).
pub fn blocks(blocks: usize) -> Graph {
    const EDGES: [(char, char); 10] = [
        ('a', 'b'),
        ('b', 'c'),
        ('a', 'd'),
        ('a', 'e'),
        ('e', 'f'),
        ('e', 'g'),
        ('c', 'h'),
        ('d', 'h'),
        ('f', 'h'),
        ('g', 'h'),
    ];
    let mut graph = Graph::new();
    for k in 0..blocks {
        for letter in 'a'..='h' {
            graph.add_node(format!("{letter}{k}")).expect("fresh id");
        }
        for (source, target) in EDGES {
            graph
                .add_edge(&format!("{source}{k}"), &format!("{target}{k}"))
                .expect("acyclic");
        }
        if k > 0 {
            graph
                .add_edge(&format!("h{}", k - 1), &format!("a{k}"))
                .expect("acyclic");
        }
    }
    graph
}

/// `width` nodes side by side, nothing between them: one wave of `width` branches.
pub fn wave(width: usize) -> Graph {
    let mut graph = Graph::new();
    for i in 0..width {
        graph.add_node(id(i)).expect("fresh id");
    }
    graph
}

/// The worst case for nesting: `a0 >> (b0 | (a1 >> (b1 | ...)))`, `2 * rungs` nodes, nested
/// `rungs` deep.
pub fn ladder(rungs: usize) -> Graph {
    let mut graph = Graph::new();
    for i in 0..rungs {
        graph.add_node(format!("a{i}")).expect("fresh id");
        graph.add_node(format!("b{i}")).expect("fresh id");
        if i > 0 {
            graph
                .add_edge(&format!("a{}", i - 1), &format!("a{i}"))
                .expect("acyclic");
            graph
                .add_edge(&format!("a{}", i - 1), &format!("b{}", i - 1))
                .expect("acyclic");
        }
    }
    graph
        .add_edge(&format!("a{}", rungs - 1), &format!("b{}", rungs - 1))
        .expect("acyclic");
    graph
}

fn fresh(graph: &mut Graph, next: &mut usize) -> String {
    let name = id(*next);
    *next += 1;
    graph.add_node(name.clone()).expect("fresh id");
    name
}
