//! Running: per node along a chain of Rust nodes, and per branch when launching a wave — back to
//! back, with its threads still awake, and after a pause, once they have gone to sleep — beside
//! what waking a sleeping thread costs: one round trip to a parked thread.

mod shapes;

use std::hint::black_box;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

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
        let executor = Executor::new();
        group.throughput(Throughput::Elements(len as u64));
        group.bench_function(BenchmarkId::new("rust-nodes", len), |b| {
            b.iter(|| executor.run_program(&program, black_box(Value::Int(0))));
        });
        // The same chain traced: what recording a span per node costs when asked for. The
        // untraced figure above is the price of the feature when not asked for.
        let trace = Arc::new(Trace::new());
        let traced = executor.clone().with_trace(Arc::clone(&trace));
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
        let executor = Executor::new();
        group.throughput(Throughput::Elements(width as u64));
        group.bench_function(BenchmarkId::new("trivial-branches", width), |b| {
            b.iter(|| executor.run_program(&program, black_box(Value::Int(0))));
        });
        // Each run after a pause long enough for every thread of the wave, and the caller, to
        // have gone to sleep: what a wave costs when nothing ran just before it.
        group.bench_function(BenchmarkId::new("after-a-pause", width), |b| {
            b.iter_custom(|runs| {
                let mut timed = Duration::ZERO;
                for _ in 0..runs {
                    thread::sleep(Duration::from_millis(1));
                    let start = Instant::now();
                    black_box(executor.run_program(&program, black_box(Value::Int(0))))
                        .expect("runs");
                    timed += start.elapsed();
                }
                timed
            });
        });
    }
    group.finish();
}

/// Hands a value to a parked thread and waits for it to come back: the two wake-ups a wave pays
/// when its threads, and its caller, have gone to sleep.
fn handoff(c: &mut Criterion) {
    let (to_worker, inbox) = mpsc::channel::<u64>();
    let (to_caller, replies) = mpsc::channel::<u64>();
    let worker = thread::spawn(move || {
        for x in inbox {
            if to_caller.send(x + 1).is_err() {
                break;
            }
        }
    });
    c.bench_function("handoff/round-trip/1", |b| {
        b.iter(|| {
            to_worker.send(black_box(1)).expect("worker alive");
            replies.recv().expect("worker alive")
        });
    });
    drop(to_worker);
    worker.join().expect("worker ends");
}

criterion_group!(benches, chain, wave, handoff);
criterion_main!(benches);
