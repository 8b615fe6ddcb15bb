//! Streams: many items through one program, each node on one item at a time and in order, the
//! stages overlapped, memory bounded, errors per item, threads lent and given back.

// Indices here are below a million: an index as an int never wraps.
#![allow(clippy::cast_possible_wrap)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use soma_core::{
    compile, node_arc, Captured, Catalog, Executor, Expr, Host, ItemContext, Node, NodeError,
    NodeId, OnError, Program, Stream, StreamError, StreamSettings, Value, Watch,
};

use crate::random_graphs::random_dag;
use crate::support::{catalog_of, n, plain, Gate, Rendezvous, Trace, DEADLINE};

fn int(value: &Value) -> i64 {
    value.as_int().expect("an int")
}

/// A node that answers what `body` makes of its input, as an int.
fn f(id: &str, body: impl Fn(i64) -> Result<i64, NodeError> + Send + Sync + 'static) -> Expr {
    node_arc(
        id,
        Arc::new(plain(move |_, x: &Value| body(int(x)).map(Value::Int))),
    )
}

fn program_of(expr: Expr) -> Arc<Program> {
    let (graph, catalog) = expr.somatize().unwrap();
    Arc::new(Program::new(&compile(&graph, &catalog).unwrap(), &catalog).unwrap())
}

fn ints(range: std::ops::Range<i64>) -> impl Iterator<Item = Value> {
    range.map(Value::Int)
}

/// Every result of a stream that must not fail, with its index.
fn all(stream: impl Iterator<Item = Result<(u64, Value), StreamError>>) -> Vec<(u64, i64)> {
    stream
        .map(|item| {
            let (index, value) = item.expect("no item fails");
            (index, int(&value))
        })
        .collect()
}

#[test]
fn results_come_back_in_input_order_with_their_index() {
    let program = program_of(f("a", |x| Ok(x + 1)) >> f("b", |x| Ok(x * 10)));
    let out = all(Stream::start(
        program,
        ints(0..200),
        StreamSettings::default(),
    ));
    let expected: Vec<(u64, i64)> = (0..200).map(|i| (i, (i as i64 + 1) * 10)).collect();
    assert_eq!(out, expected);
}

#[test]
fn stage_one_on_item_two_meets_stage_two_on_item_one() {
    let together = Rendezvous::new(2);
    let (first, second) = (Arc::clone(&together), Arc::clone(&together));
    let program = program_of(
        f("a", move |x| {
            if x == 2 && !first.meet() {
                return Err(NodeError::new("`a` on item 2 met nobody"));
            }
            Ok(x)
        }) >> f("b", move |x| {
            if x == 1 && !second.meet() {
                return Err(NodeError::new("`b` on item 1 met nobody"));
            }
            Ok(x)
        }),
    );
    let out = all(Stream::start(
        program,
        ints(0..4),
        StreamSettings::default(),
    ));
    assert_eq!(out.len(), 4);
}

/// A node that fails if it is ever entered twice at once, or sees an item out of order.
struct OneAtATime {
    busy: AtomicBool,
    next: AtomicUsize,
}

impl Node for OneAtATime {
    fn forward(
        &self,
        input: &Value,
        _: &soma_core::Ctx<'_>,
    ) -> Result<soma_core::Transition, NodeError> {
        if self.busy.swap(true, Ordering::SeqCst) {
            return Err(NodeError::new("entered twice at once"));
        }
        let expected = self.next.fetch_add(1, Ordering::SeqCst);
        std::thread::yield_now();
        self.busy.store(false, Ordering::SeqCst);
        if usize::try_from(int(input)).unwrap() != expected {
            return Err(NodeError::new(format!(
                "item {input:?} came when {expected} was due"
            )));
        }
        Ok(soma_core::Transition::Done(input.clone()))
    }
}

fn one_at_a_time(id: &str) -> Expr {
    node_arc(
        id,
        Arc::new(OneAtATime {
            busy: AtomicBool::new(false),
            next: AtomicUsize::new(0),
        }),
    )
}

#[test]
fn each_node_takes_items_one_at_a_time_and_in_order_even_after_a_concurrent_stage() {
    // `shuffle` finishes items out of order on four workers; `count` still sees them in order.
    let program = program_of(
        one_at_a_time("first")
            >> f("shuffle", |x| {
                if x % 3 == 0 {
                    std::thread::yield_now();
                }
                Ok(x)
            })
            >> one_at_a_time("count"),
    );
    let settings = StreamSettings::default().with_concurrency("shuffle".into(), 4);
    let out = all(Stream::start(program, ints(0..500), settings));
    assert_eq!(out, (0..500).map(|i| (i, i as i64)).collect::<Vec<_>>());
}

#[test]
fn a_concurrent_stage_has_as_many_items_in_flight_as_it_has_workers() {
    let together = Rendezvous::new(3);
    let program = program_of(f("slow", move |x| {
        if x < 3 && !together.meet() {
            return Err(NodeError::new("`slow` ran items one at a time"));
        }
        Ok(x)
    }));
    let settings = StreamSettings::default().with_concurrency("slow".into(), 3);
    let out = all(Stream::start(program, ints(0..6), settings));
    assert_eq!(out, (0..6).map(|i| (i, i as i64)).collect::<Vec<_>>());
}

#[test]
fn the_branches_of_a_wave_inside_a_stage_run_side_by_side_for_each_item() {
    let together = Rendezvous::new(2);
    let (left, right) = (Arc::clone(&together), Arc::clone(&together));
    let meet_on_item_one = |rendezvous: Arc<Rendezvous>| {
        move |x: i64| {
            if x == 1 && !rendezvous.meet() {
                return Err(NodeError::new("a branch ran alone"));
            }
            Ok(x)
        }
    };
    let program = program_of(
        f("a", Ok) >> (f("left", meet_on_item_one(left)) | f("right", meet_on_item_one(right))),
    );
    let out: Vec<_> = Stream::start(program, ints(0..3), StreamSettings::default())
        .map(|item| item.unwrap().1)
        .collect();
    assert_eq!(out.len(), 3);
    assert!(out.iter().all(|value| value.as_map().unwrap().len() == 2));
}

#[test]
fn a_wave_of_chains_with_a_wave_inside_streams_to_what_a_loop_of_runs_gives() {
    // Branches that are chains, one holding a wave of its own, joined by a node that reads all.
    let program = program_of(
        f("a", |x| Ok(x + 1))
            >> ((f("b1", |x| Ok(x * 2)) >> f("b2", |x| Ok(x - 3)))
                | (f("c1", |x| Ok(x * 5))
                    >> (f("c2", |x| Ok(x + 7)) | (f("c3", |x| Ok(x * x)) >> f("c4", Ok))))),
    );
    let looped: Vec<Value> = ints(0..40)
        .map(|input| Executor::new().run_program(&program, input).unwrap())
        .collect();
    let streamed: Vec<Value> = Stream::start(
        program,
        ints(0..40),
        StreamSettings::default().with_in_flight(5),
    )
    .map(|item| item.unwrap().1)
    .collect();
    assert_eq!(streamed, looped);
}

/// Inputs that count how many times they were read.
fn counted(read: &Arc<AtomicUsize>, count: i64) -> impl Iterator<Item = Value> {
    let read = Arc::clone(read);
    (0..count).map(move |i| {
        read.fetch_add(1, Ordering::SeqCst);
        Value::Int(i)
    })
}

#[test]
fn inputs_are_read_no_further_ahead_than_the_bound() {
    let read = Arc::new(AtomicUsize::new(0));
    let program = program_of(f("a", Ok) >> f("b", Ok));
    let settings = StreamSettings::default().with_in_flight(5);
    let mut handed = 0;
    for item in Stream::start(program, counted(&read, 1_000), settings) {
        item.unwrap();
        handed += 1;
        // The item just handed back counted as in flight when the last input was read.
        assert!(read.load(Ordering::SeqCst) <= handed - 1 + 5);
    }
    assert_eq!(read.load(Ordering::SeqCst), 1_000);
}

#[test]
fn a_consumer_that_stops_reading_stops_the_stream_at_the_bound() {
    let read = Arc::new(AtomicUsize::new(0));
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    let program = program_of(f("a", move |x| {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok(x)
    }));
    let mut stream = Stream::start(
        program,
        counted(&read, 1_000_000),
        StreamSettings::default().with_in_flight(4),
    );
    stream.next().unwrap().unwrap();
    // The consumer takes its time; nothing beyond the bound is read or run meanwhile.
    std::thread::yield_now();
    assert_eq!(read.load(Ordering::SeqCst), 4);
    assert!(ran.load(Ordering::SeqCst) <= 4);
    assert_eq!(stream.figures().in_flight, 3);
}

#[test]
fn the_first_failing_item_comes_out_at_its_place_after_the_ones_before_and_the_stream_ends() {
    let ran_after = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran_after);
    let program = program_of(
        f("a", |x| {
            if x == 3 {
                Err(NodeError::new("three is bad"))
            } else {
                Ok(x)
            }
        }) >> f("b", move |x| {
            if x > 3 {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            Ok(x)
        }),
    );
    let mut stream = Stream::start(
        program,
        ints(0..1_000),
        StreamSettings::default().with_in_flight(8),
    );
    for expected in 0..3 {
        assert_eq!(
            stream.next().unwrap().unwrap(),
            (expected, Value::Int(expected as i64))
        );
    }
    match stream.next() {
        Some(Err(StreamError::Item(failed))) => {
            assert_eq!(failed.index, 3);
            assert_eq!(failed.input, Value::Int(3));
            assert_eq!(
                failed.error.node().map(soma_core::NodeId::as_str),
                Some("a")
            );
        }
        other => panic!("expected item 3's failure, got {other:?}"),
    }
    assert!(stream.next().is_none());
    // Stages stop before items after the failure; a few may have passed `b` before it was known.
    assert!(ran_after.load(Ordering::SeqCst) <= 8);
}

#[test]
fn with_continue_every_failure_comes_out_in_its_place_and_the_rest_go_on() {
    let program = program_of(f("odd", |x| {
        if x % 2 == 1 {
            Err(NodeError::new("odd"))
        } else {
            Ok(x)
        }
    }));
    let settings = StreamSettings::default().with_on_error(OnError::Continue);
    let out: Vec<Result<u64, u64>> = Stream::start(program, ints(0..10), settings)
        .map(|item| match item {
            Ok((index, _)) => Ok(index),
            Err(StreamError::Item(failed)) => Err(failed.index),
            Err(StreamError::Stopped(error)) => panic!("stopped: {error}"),
        })
        .collect();
    let expected: Vec<Result<u64, u64>> = (0..10)
        .map(|i| if i % 2 == 1 { Err(i) } else { Ok(i) })
        .collect();
    assert_eq!(out, expected);
}

#[test]
fn unordered_hands_back_every_item_once_with_its_index() {
    let program = program_of(f("a", Ok) >> f("b", |x| Ok(x * 2)));
    let settings = StreamSettings::default()
        .unordered()
        .with_concurrency("b".into(), 3);
    let mut out = all(Stream::start(program, ints(0..300), settings));
    out.sort_unstable();
    assert_eq!(out, (0..300).map(|i| (i, i as i64 * 2)).collect::<Vec<_>>());
}

#[test]
fn dropping_a_stream_early_stops_its_stages_and_gives_their_threads_back() {
    let program = program_of(f("a", Ok) >> f("b", Ok) >> f("c", Ok));
    for _ in 0..20 {
        let mut stream = Stream::start(
            Arc::clone(&program),
            ints(0..1_000_000),
            StreamSettings::default(),
        );
        stream.next().unwrap().unwrap();
        drop(stream);
    }
    // The same three lent threads, back with the crew each time, not twenty streams' worth.
    assert!(program.threads() <= 4, "{} threads", program.threads());
    // And the program still runs.
    assert_eq!(
        Executor::new()
            .run_program(&program, Value::Int(7))
            .unwrap(),
        Value::Int(7)
    );
}

#[test]
fn a_stream_holds_one_thread_per_stage_worker_while_it_runs() {
    let stages = Rendezvous::new(3);
    let meet_on = |item: i64, rendezvous: &Arc<Rendezvous>| {
        let rendezvous = Arc::clone(rendezvous);
        move |x: i64| {
            if x == item && !rendezvous.meet() {
                return Err(NodeError::new("the stages were not all in flight"));
            }
            Ok(x)
        }
    };
    // Stage a on item 2, b on item 1, c on item 0: all three at once, on three threads.
    let program = program_of(
        f("a", meet_on(2, &stages)) >> f("b", meet_on(1, &stages)) >> f("c", meet_on(0, &stages)),
    );
    let out = all(Stream::start(
        Arc::clone(&program),
        ints(0..5),
        StreamSettings::default(),
    ));
    assert_eq!(out.len(), 5);
    assert!(program.threads() >= 3);
    assert!(program.threads() <= 4, "{} threads", program.threads());
}

#[test]
#[should_panic(expected = "a bug in a node")]
fn a_panic_in_a_node_is_raised_again_by_the_caller() {
    let program = program_of(
        f("a", Ok)
            >> f("b", |x| {
                if x == 5 {
                    panic!("a bug in a node")
                } else {
                    Ok(x)
                }
            }),
    );
    for item in Stream::start(program, ints(0..100), StreamSettings::default()) {
        item.unwrap();
    }
}

#[test]
fn the_program_still_streams_after_a_panic() {
    let program = program_of(f("a", |x| if x == 1 { panic!("once") } else { Ok(x) }));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        all(Stream::start(
            Arc::clone(&program),
            ints(0..3),
            StreamSettings::default(),
        ))
    }));
    assert!(panicked.is_err());
    let out = all(Stream::start(
        program,
        ints(2..5),
        StreamSettings::default(),
    ));
    assert_eq!(out, vec![(0, 2), (1, 3), (2, 4)]);
}

struct Flag(AtomicBool);

impl Watch for Flag {
    fn interrupted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn a_watch_that_says_stop_ends_the_stream_with_interrupted() {
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let raise = Arc::clone(&flag);
    let program = program_of(f("a", move |x| {
        if x == 10 {
            raise.0.store(true, Ordering::SeqCst);
        }
        Ok(x)
    }));
    let settings = StreamSettings::default().with_executor(Executor::new().with_watch(flag));
    let out: Vec<_> = Stream::start(program, ints(0..1_000_000), settings).collect();
    assert!(out.len() <= 12, "{} items", out.len());
    assert!(matches!(
        out.last(),
        Some(Err(StreamError::Stopped(soma_core::RunError::Interrupted)))
    ));
}

#[test]
fn once_the_watch_says_stop_a_node_that_does_not_return_is_left_behind() {
    let gate = Gate::new();
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let returned = Arc::new(AtomicBool::new(false));
    let (raise, wait, done) = (Arc::clone(&flag), Arc::clone(&gate), Arc::clone(&returned));
    let program = program_of(f("a", move |x| {
        if x == 1 {
            raise.0.store(true, Ordering::SeqCst);
            wait.wait();
            done.store(true, Ordering::SeqCst);
        }
        Ok(x)
    }));
    let settings = StreamSettings::default().with_executor(Executor::new().with_watch(flag));
    let mut stream = Stream::start(Arc::clone(&program), ints(0..10), settings);
    let out: Vec<_> = stream.by_ref().collect();
    // The stream ended while its node was still waiting: it did not wait for the node, and
    // names it.
    assert!(!returned.load(Ordering::SeqCst));
    match out.last() {
        Some(Err(StreamError::Stopped(soma_core::RunError::Abandoned { running }))) => {
            assert_eq!(running, &[NodeId::from("a")]);
        }
        other => panic!("ended with {other:?}"),
    }
    assert_eq!(stream.left_running(), &[vec![NodeId::from("a")]]);
    gate.open();
    assert_eq!(
        all(Stream::start(
            program,
            ints(5..7),
            StreamSettings::default()
        )),
        vec![(0, 5), (1, 6)]
    );
}

#[test]
fn a_stage_without_a_thread_ends_the_stream_with_no_thread_instead_of_hanging() {
    let program = program_of(f("a", Ok) >> f("b", Ok));
    program.refuse_next_threads(100);
    let out: Vec<_> =
        Stream::start(Arc::clone(&program), ints(0..10), StreamSettings::default()).collect();
    assert!(matches!(
        out.last(),
        Some(Err(StreamError::Stopped(
            soma_core::RunError::NoThread { .. }
        )))
    ));
    program.refuse_next_threads(0);
    assert_eq!(
        all(Stream::start(
            program,
            ints(0..3),
            StreamSettings::default()
        ))
        .len(),
        3
    );
}

#[test]
fn an_empty_input_ends_at_once() {
    let program = program_of(f("a", Ok));
    assert!(
        Stream::start(program, ints(0..0), StreamSettings::default())
            .next()
            .is_none()
    );
}

#[test]
fn figures_count_items_and_name_each_stages_nodes() {
    let program = program_of(f("a", Ok) >> (f("b", Ok) | f("c", Ok)));
    let mut stream = Stream::start(program, ints(0..50), StreamSettings::default());
    for item in stream.by_ref() {
        item.unwrap();
    }
    let figures = stream.figures();
    assert_eq!(
        (figures.read, figures.succeeded, figures.failed),
        (50, 50, 0)
    );
    let nodes: Vec<Vec<&str>> = figures
        .stages
        .iter()
        .map(|stage| stage.nodes.iter().map(soma_core::NodeId::as_str).collect())
        .collect();
    assert_eq!(nodes, vec![vec!["a"], vec!["b", "c"]]);
    assert!(figures.stages.iter().all(|stage| stage.items == 50));
}

fn config() -> Config {
    Config {
        cases: 64,
        rng_seed: RngSeed::Fixed(0x53_54_52),
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_stream_over_a_random_graph_equals_a_loop_of_runs(dag in random_dag(), items in 1_usize..12) {
        let graph = dag.graph();
        let catalog: Catalog = catalog_of(&graph, &(Arc::new(Trace) as Arc<dyn Node>));
        let plan = compile(&graph, &catalog).unwrap();
        let program = Arc::new(Program::new(&plan, &catalog).unwrap());
        let inputs: Vec<Value> = (0..items).map(|i| Value::text(format!("x{i}"))).collect();
        let looped: Vec<Value> = inputs
            .iter()
            .map(|input| Executor::new().run_program(&program, input.clone()).unwrap())
            .collect();
        let streamed: Vec<Value> = Stream::start(program, inputs.into_iter(), StreamSettings::default().with_in_flight(3))
            .map(|item| item.unwrap().1)
            .collect();
        prop_assert_eq!(streamed, looped);
    }

    #[test]
    fn with_continue_each_failure_is_in_its_place_whatever_the_workers_and_bound(
        failing in proptest::collection::hash_set(0_i64..40, 0..10),
        workers in 1_usize..4,
        in_flight in 1_usize..8,
        ordered in any::<bool>(),
    ) {
        let bad = failing.clone();
        let program = program_of(
            f("first", Ok)
                >> f("check", move |x| if bad.contains(&x) { Err(NodeError::new("bad")) } else { Ok(x) })
                >> f("last", |x| Ok(x * 2)),
        );
        let mut settings = StreamSettings::default()
            .with_on_error(OnError::Continue)
            .with_in_flight(in_flight)
            .with_concurrency("check".into(), workers);
        if !ordered {
            settings = settings.unordered();
        }
        let mut out: Vec<(u64, Result<i64, String>)> = Stream::start(program, ints(0..40), settings)
            .map(|item| match item {
                Ok((index, value)) => (index, Ok(int(&value))),
                Err(StreamError::Item(failed)) => {
                    (failed.index, Err(failed.error.node().unwrap().to_string()))
                }
                Err(StreamError::Stopped(error)) => panic!("stopped: {error}"),
            })
            .collect();
        if !ordered {
            out.sort_by_key(|(index, _)| *index);
        }
        let expected: Vec<(u64, Result<i64, String>)> = (0..40)
            .map(|x: i64| {
                let outcome = if failing.contains(&x) { Err("check".to_owned()) } else { Ok(x * 2) };
                (x.unsigned_abs(), outcome)
            })
            .collect();
        prop_assert_eq!(out, expected);
    }
}

#[test]
fn a_one_node_graph_streams_too() {
    let program = program_of(n("only"));
    let out: Vec<Value> = Stream::start(program, ints(0..3), StreamSettings::default())
        .map(|item| item.unwrap().1)
        .collect();
    assert_eq!(out.len(), 3);
}

#[test]
fn dropping_a_stream_does_not_wait_for_a_node_that_never_returns() {
    let (reached, release) = (Gate::new(), Gate::new());
    let (reached_in, release_in) = (Arc::clone(&reached), Arc::clone(&release));
    let program = program_of(
        f("a", Ok)
            >> f("stuck", move |x| {
                if x == 1 {
                    reached_in.open();
                    release_in.wait();
                }
                Ok(x)
            }),
    );
    let mut stream = Stream::start(Arc::clone(&program), ints(0..10), StreamSettings::default());
    assert_eq!(int(&stream.next().unwrap().unwrap().1), 0);
    assert!(reached.wait(), "`stuck` never got item 1");
    // Dropped on a thread of its own, so that a drop that waited for `stuck` fails this test
    // at the deadline instead of hanging it.
    let (dropped, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(stream);
        dropped.send(()).unwrap();
    });
    let outcome = done.recv_timeout(DEADLINE);
    release.open();
    assert!(
        outcome.is_ok(),
        "the drop waited for the node that never returns"
    );
    assert_eq!(
        all(Stream::start(
            program,
            ints(5..7),
            StreamSettings::default()
        )),
        vec![(0, 5), (1, 6)]
    );
}

thread_local! {
    /// The context a [`Carrying`] host carries: one number per thread.
    static CONTEXT: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// A host that carries [`CONTEXT`] into each stage, and each item's own from stage to stage.
struct Carrying;

impl Host for Carrying {
    fn branch(&self, run: &mut dyn FnMut()) {
        run();
    }

    fn blocking(&self, run: &mut (dyn FnMut() + Send)) {
        run();
    }

    fn capture(&self) -> Option<Box<dyn Captured>> {
        Some(Box::new(Snapshot(CONTEXT.with(std::cell::Cell::get))))
    }
}

struct Snapshot(u32);

impl Captured for Snapshot {
    fn enter(&self, run: &mut dyn FnMut()) {
        let had = CONTEXT.with(|context| context.replace(self.0));
        run();
        CONTEXT.with(|context| context.set(had));
    }

    fn for_item(&self) -> Option<Box<dyn ItemContext>> {
        Some(Box::new(Snapshot(self.0)))
    }
}

impl ItemContext for Snapshot {
    fn enter(&mut self, run: &mut dyn FnMut()) {
        let had = CONTEXT.with(|context| context.replace(self.0));
        run();
        self.0 = CONTEXT.with(|context| context.replace(had));
    }
}

#[test]
fn each_item_carries_its_own_context_from_stage_to_stage() {
    // `set` sees the caller's context for every item, whatever the item before it set on the
    // same thread; `read`, on a thread of its own, sees what `set` set for the same item.
    let program = program_of(
        node_arc(
            "set",
            Arc::new(plain(|_, x: &Value| {
                let seen =
                    CONTEXT.with(|context| context.replace(1000 + u32::try_from(int(x)).unwrap()));
                Ok(Value::Int(i64::from(seen)))
            })),
        ) >> node_arc(
            "read",
            Arc::new(plain(|_, seen: &Value| {
                let now = CONTEXT.with(std::cell::Cell::get);
                Ok(Value::Int(int(seen) * 10_000 + i64::from(now)))
            })),
        ),
    );
    CONTEXT.with(|context| context.set(7));
    let settings = StreamSettings::default()
        .with_in_flight(4)
        .with_executor(Executor::new().with_host(Arc::new(Carrying)));
    let out: Vec<i64> = all(Stream::start(program, (0..40).map(Value::Int), settings))
        .into_iter()
        .map(|(_, value)| value)
        .collect();
    let expected: Vec<i64> = (0..40).map(|i| 7 * 10_000 + 1000 + i).collect();
    assert_eq!(out, expected);
    // The caller's own context is its own.
    assert_eq!(CONTEXT.with(std::cell::Cell::get), 7);
}
