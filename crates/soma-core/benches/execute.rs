//! Running: per node along a chain of Rust nodes, and per branch when launching a wave.

mod shapes;

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use soma_core::{compile, Catalog, Executor, Graph, Node, NodeError, Plan, Program, Trace, Value};

#[allow(clippy::unnecessary_wraps)] // The signature of a node written as a function.
fn increment(x: &Value) -> Result<Value, NodeError> {
    Ok(Value::Int(x.as_int().unwrap_or(0) + 1))
}

fn catalog_for(graph: &Graph) -> Catalog {
    let mut catalog = Catalog::new();
    let node: Arc<dyn Node> = Arc::new(increment);
    for id in graph.nodes() {
        catalog.insert(id.clone(), Arc::clone(&node));
    }
    catalog
}

fn chain(c: &mut Criterion) {
    let mut group = c.benchmark_group("chain");
    {
        let len = 1_000;
        let graph = shapes::chain(len);
        let catalog = catalog_for(&graph);
        let plan = compile(&graph, &catalog).expect("compiles");
        let program = Program::new(&plan, &catalog).expect("resolves");
        let executor = Executor::new(&catalog);
        group.throughput(Throughput::Elements(len as u64));
        group.bench_function(BenchmarkId::new("rust-nodes", len), |b| {
            b.iter(|| executor.run_program(&program, black_box(Value::Int(0))));
        });
        // The same chain traced: what recording a span per node costs when asked for. The
        // untraced figure above is the price of the feature when not asked for.
        let trace = Trace::new();
        let traced = executor.with_trace(&trace);
        group.bench_function(BenchmarkId::new("rust-nodes-traced", len), |b| {
            b.iter(|| {
                trace.clear();
                traced.run_program(&program, black_box(Value::Int(0)))
            });
        });
    }
    group.finish();
}

fn wave(c: &mut Criterion) {
    let mut group = c.benchmark_group("wave");
    for width in [2_usize, 8] {
        let mut graph = Graph::new();
        for i in 0..width {
            graph.add_node(format!("b{i}")).expect("fresh id");
        }
        let catalog = catalog_for(&graph);
        let plan = compile(&graph, &catalog).expect("compiles");
        assert!(matches!(plan, Plan::Wave(_)));
        let program = Program::new(&plan, &catalog).expect("resolves");
        let executor = Executor::new(&catalog);
        group.throughput(Throughput::Elements(width as u64));
        group.bench_function(BenchmarkId::new("trivial-branches", width), |b| {
            b.iter(|| executor.run_program(&program, black_box(Value::Int(0))));
        });
    }
    group.finish();
}

criterion_group!(benches, chain, wave);
criterion_main!(benches);
