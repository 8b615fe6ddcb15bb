//! Compile time: `decompose` on chains and nested series-parallel graphs from 1,000 to 100,000
//! nodes, against the naive decomposition the seed describes (every prefix of a topological
//! order tested for a series cut with list scans) where that finishes in reasonable time.

mod shapes;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use soma_core::{decompose, Graph, NodeId, Plan};

fn compile(c: &mut Criterion) {
    let mut group = c.benchmark_group("compile");
    group.sample_size(10);
    for size in [1_000, 10_000, 100_000] {
        let chain = shapes::chain(size);
        group.bench_with_input(BenchmarkId::new("chain", size), &chain, |b, g| {
            b.iter(|| decompose(black_box(g)));
        });
        let nested = shapes::nested(size);
        group.bench_with_input(BenchmarkId::new("nested", size), &nested, |b, g| {
            b.iter(|| decompose(black_box(g)));
        });
    }
    for rungs in [500, 1_000, 2_000] {
        let ladder = shapes::ladder(rungs);
        group.bench_with_input(BenchmarkId::new("ladder", 2 * rungs), &ladder, |b, g| {
            b.iter(|| decompose(black_box(g)));
        });
    }
    for size in [300, 1_000] {
        for (name, graph) in [
            ("chain", shapes::chain(size)),
            ("nested", shapes::nested(size)),
        ] {
            assert_eq!(naive(&graph), decompose(&graph), "the baseline must agree");
            group.bench_with_input(
                BenchmarkId::new(format!("naive-{name}"), size),
                &graph,
                |b, g| {
                    b.iter(|| naive(black_box(g)));
                },
            );
        }
    }
    group.finish();
}

/// The seed's decomposition, written the obvious way: sets as lists, every test a scan.
fn naive(graph: &Graph) -> Plan {
    naive_split(graph, &graph.topological_sort())
}

fn naive_split(graph: &Graph, nodes: &[NodeId]) -> Plan {
    let execute = |id: &NodeId| Plan::Execute {
        node: id.clone(),
        from: graph
            .predecessors(id.as_str())
            .expect("known")
            .into_iter()
            .cloned()
            .collect(),
    };
    match nodes {
        [] => return Plan::Empty,
        [one] => return execute(one),
        _ => {}
    }
    let components = naive_components(graph, nodes);
    if components.len() > 1 {
        return Plan::Wave(components.iter().map(|c| naive_split(graph, c)).collect());
    }
    for k in 1..nodes.len() {
        let (a, b) = nodes.split_at(k);
        if naive_is_cut(graph, a, b) {
            let mut steps = Vec::new();
            for part in [a, b] {
                let mut plan = naive_split(graph, part);
                match &mut plan {
                    Plan::Sequence(inner) => steps.append(inner),
                    _ => steps.push(plan),
                }
            }
            return Plan::Sequence(steps);
        }
    }
    Plan::Sequence(nodes.iter().map(execute).collect())
}

fn naive_components(graph: &Graph, nodes: &[NodeId]) -> Vec<Vec<NodeId>> {
    let mut label: Vec<Option<usize>> = vec![None; nodes.len()];
    let mut count = 0;
    for start in 0..nodes.len() {
        if label[start].is_some() {
            continue;
        }
        label[start] = Some(count);
        let mut stack = vec![start];
        while let Some(at) = stack.pop() {
            let id = nodes[at].as_str();
            let around = graph
                .successors(id)
                .expect("known")
                .into_iter()
                .chain(graph.predecessors(id).expect("known"));
            for w in around {
                if let Some(j) = nodes.iter().position(|x| x == w) {
                    if label[j].is_none() {
                        label[j] = Some(count);
                        stack.push(j);
                    }
                }
            }
        }
        count += 1;
    }
    let mut groups: Vec<(usize, Vec<NodeId>)> =
        (0..count).map(|_| (usize::MAX, Vec::new())).collect();
    for (at, id) in nodes.iter().enumerate() {
        let group = &mut groups[label[at].expect("labelled")];
        let inserted = graph.nodes().iter().position(|x| x == id).expect("known");
        group.0 = group.0.min(inserted);
        group.1.push(id.clone());
    }
    groups.sort_by_key(|(first, _)| *first);
    groups.into_iter().map(|(_, group)| group).collect()
}

fn naive_is_cut(graph: &Graph, a: &[NodeId], b: &[NodeId]) -> bool {
    let sinks: Vec<&NodeId> = a
        .iter()
        .filter(|u| {
            graph
                .successors(u.as_str())
                .expect("known")
                .iter()
                .all(|w| !a.contains(w))
        })
        .collect();
    let sources: Vec<&NodeId> = b
        .iter()
        .filter(|v| {
            graph
                .predecessors(v.as_str())
                .expect("known")
                .iter()
                .all(|w| !b.contains(w))
        })
        .collect();
    let mut crossing = 0;
    for u in a {
        for w in graph.successors(u.as_str()).expect("known") {
            if b.contains(w) {
                if !sinks.contains(&u) || !sources.contains(&w) {
                    return false;
                }
                crossing += 1;
            }
        }
    }
    crossing == sinks.len() * sources.len()
}

criterion_group!(benches, compile);
criterion_main!(benches);
