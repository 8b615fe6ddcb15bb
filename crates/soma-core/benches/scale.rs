//! Waves at scale, with trivial Rust nodes: one wave of 1,000 and of 10,000 branches, and nested
//! graphs of 10,000 and 100,000 nodes — the chained blocks of the Python benchmark (four wide,
//! waves two deep) and the recursive shape of `compile` (waves within waves, wider as it grows).
//! What is timed is `run_program` on a program built once, as a graph's forward does.
//!
//! Every run here is milliseconds long, so samples are few and short: `cargo bench` on two cores
//! stays within a minute or two for this file.

mod shapes;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use soma_core::{
    compile, decompose, Catalog, Executor, Graph, Node, NodeError, Plan, Program, Value,
};

/// The trivial node: passes its input on, or for a join the first of its inputs, so that values
/// stay flat however many blocks are chained (a join's whole map passed on would nest one level
/// deeper per block).
#[allow(clippy::unnecessary_wraps)] // The signature of a node written as a function.
fn pass(x: &Value) -> Result<Value, NodeError> {
    Ok(match x.as_map() {
        Some(inputs) => inputs.first().map_or(Value::Null, |(_, v)| v.clone()),
        None => x.clone(),
    })
}

fn program_for(graph: &Graph) -> Program {
    let mut catalog = Catalog::new();
    let node: Arc<dyn Node> = Arc::new(pass);
    for id in graph.nodes() {
        catalog.insert(id.clone(), Arc::clone(&node));
    }
    let plan = compile(graph, &catalog).expect("compiles");
    Program::new(&plan, &catalog).expect("resolves")
}

/// One wave of `width` branches: what launching and joining many siblings costs per branch.
fn wide_wave(c: &mut Criterion) {
    let mut group = c.benchmark_group("wide-wave");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for width in [1_000_usize, 10_000] {
        let graph = shapes::wave(width);
        assert!(matches!(decompose(&graph), Plan::Wave(ref branches) if branches.len() == width));
        let program = program_for(&graph);
        let executor = Executor::new();
        group.throughput(Throughput::Elements(width as u64));
        group.bench_function(BenchmarkId::new("trivial-branches", width), |b| {
            b.iter(|| executor.run_program(&program, black_box(Value::Int(0))));
        });
    }
    group.finish();
}

/// Nested graphs: per node, which at scale should stay what it is for a small graph.
fn nested(c: &mut Criterion) {
    let mut group = c.benchmark_group("nested");
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for nodes in [10_000_usize, 100_000] {
        for (name, graph) in [
            ("blocks", shapes::blocks(nodes / 8)),
            ("tree", shapes::nested(nodes)),
        ] {
            let program = program_for(&graph);
            let executor = Executor::new();
            black_box(executor.run_program(&program, Value::Int(0))).expect("runs");
            group.throughput(Throughput::Elements(graph.len() as u64));
            group.bench_function(BenchmarkId::new(name, nodes), |b| {
                b.iter(|| executor.run_program(&program, black_box(Value::Int(0))));
            });
        }
    }
    group.finish();
}

criterion_group!(benches, wide_wave, nested);
criterion_main!(benches);
