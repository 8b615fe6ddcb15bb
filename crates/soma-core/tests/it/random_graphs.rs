//! The random-DAG generator every property test draws from: the integration tests here, and
//! the unit tests of the linear-time compile (`src/compile/reduction.rs`), which include this
//! file by path so that both check their properties over the same graphs.

use std::collections::HashSet;

use proptest::collection::vec;
use proptest::prelude::*;
// `super` is the test crate here and `compile::reduction` in the unit tests: both name `Graph`.
use super::Graph;

/// A DAG drawn at random: node `v{i}` for every index, inserted in a shuffled order, and edges
/// only from a lower index to a higher one, declared in a random order — so it is acyclic by
/// construction yet free to be anything, series-parallel or not.
#[derive(Clone, Debug)]
pub struct RandomDag {
    insertion: Vec<usize>,
    edges: Vec<(usize, usize)>,
}

impl RandomDag {
    pub fn graph(&self) -> Graph {
        let mut graph = Graph::new();
        for i in &self.insertion {
            graph.add_node(format!("v{i}")).unwrap();
        }
        for (a, b) in &self.edges {
            graph
                .add_edge(&format!("v{a}"), &format!("v{b}"))
                .expect("an edge from a lower index to a higher one closes no cycle");
        }
        graph
    }
}

pub fn random_dag() -> impl Strategy<Value = RandomDag> {
    (1_usize..=12)
        .prop_flat_map(|n| {
            (
                Just((0..n).collect::<Vec<_>>()).prop_shuffle(),
                vec((0..n, 0..n), 0..=3 * n),
            )
        })
        .prop_map(|(insertion, pairs)| {
            let mut seen = HashSet::new();
            let edges = pairs
                .into_iter()
                .map(|(a, b)| (a.min(b), a.max(b)))
                .filter(|&(a, b)| a != b && seen.insert((a, b)))
                .collect();
            RandomDag { insertion, edges }
        })
}
