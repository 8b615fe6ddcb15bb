//! Running again with a cache: a node whose key is in the cache is not called, a changed
//! node is called again with everything after it, a failed run keeps what it completed, and a
//! cached run returns what an uncached one does.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use soma_core::{
    compile, Ctx, Device, Entry, Executor, Graph, Key, MemoryCache, Node, NodeError, NodeId,
    Placement, Plan, Program, Stream, StreamSettings, Trace as Spans, Transition, Value,
};

use crate::random_graphs::random_dag;
use crate::support::{catalog_of, graph, traced, Log, Phase};

/// What version of its code each node is at: a node's output and its fingerprint both say it,
/// so that a stale hit would show in the result.
#[derive(Default)]
struct Versions(Mutex<HashMap<String, u32>>);

impl Versions {
    fn of(&self, id: &str) -> u32 {
        self.0.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    fn edit(&self, id: &str) {
        *self.0.lock().unwrap().entry(id.to_owned()).or_default() += 1;
    }
}

/// A node at the version `versions` says, which logs each call; `broken` ones fail.
struct Versioned {
    versions: Arc<Versions>,
    log: Arc<Log>,
    broken: Arc<Mutex<HashSet<String>>>,
}

impl Node for Versioned {
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        let id = ctx.node().as_str();
        self.log.record(id, Phase::Start);
        if self.broken.lock().unwrap().contains(id) {
            return Err(NodeError::new(format!("{id} is broken")));
        }
        let version = self.versions.of(id);
        Ok(Transition::Done(traced(&format!("{id}{version}"), input)))
    }
}

/// A graph with a cache, its nodes' versions and a log of their calls.
struct Bench {
    plan: Plan,
    program: Arc<Program>,
    versions: Arc<Versions>,
    log: Arc<Log>,
    broken: Arc<Mutex<HashSet<String>>>,
    cache: Arc<MemoryCache>,
    /// Nodes the cache keeps out.
    kept_out: Arc<Mutex<HashSet<String>>>,
}

impl Bench {
    fn new(graph: &Graph) -> Bench {
        let versions = Arc::new(Versions::default());
        let log = Log::new();
        let broken = Arc::new(Mutex::new(HashSet::new()));
        let node: Arc<dyn Node> = Arc::new(Versioned {
            versions: Arc::clone(&versions),
            log: Arc::clone(&log),
            broken: Arc::clone(&broken),
        });
        let catalog = catalog_of(graph, &node);
        let kept_out = Arc::new(Mutex::new(HashSet::<String>::new()));
        let cache = {
            let (versions, kept_out) = (Arc::clone(&versions), Arc::clone(&kept_out));
            Arc::new(MemoryCache::new(move |id| {
                let id = id.as_str();
                (!kept_out.lock().unwrap().contains(id))
                    .then(|| Key::of_bytes(format!("{id}@{}", versions.of(id)).as_bytes()))
            }))
        };
        let plan = compile(graph, &catalog).unwrap();
        Bench {
            program: Arc::new(Program::new(&plan, &catalog).unwrap()),
            plan,
            versions,
            log,
            broken,
            cache,
            kept_out,
        }
    }

    fn executor(&self) -> Executor {
        Executor::new().with_cache(Arc::clone(&self.cache) as _)
    }

    /// Runs with the cache; returns the result and the nodes called, sorted.
    fn run(&self, input: Value) -> (Value, Vec<String>) {
        let before = self.log.entries().len();
        let result = self.executor().run_program(&self.program, input).unwrap();
        (result, self.called_since(before))
    }

    fn called_since(&self, before: usize) -> Vec<String> {
        let mut called: Vec<String> = self.log.entries()[before..]
            .iter()
            .filter(|entry| entry.phase == Phase::Start)
            .map(|entry| entry.node.clone())
            .collect();
        called.sort();
        called
    }

    /// The same run without a cache.
    fn uncached(&self, input: Value) -> Value {
        Executor::new().run_program(&self.program, input).unwrap()
    }
}

fn chain(ids: &[&str]) -> Graph {
    let edges: Vec<(&str, &str)> = ids.windows(2).map(|pair| (pair[0], pair[1])).collect();
    graph(ids, &edges)
}

fn names(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|&id| id.to_owned()).collect()
}

#[test]
fn a_rerun_calls_no_node_and_returns_what_the_first_run_returned() {
    let bench = Bench::new(&chain(&["a", "b", "c"]));
    let (first, called) = bench.run(Value::Int(1));
    assert_eq!(called, names(&["a", "b", "c"]));
    let (again, called) = bench.run(Value::Int(1));
    assert_eq!(called, Vec::<String>::new());
    assert_eq!(again, first);
    assert_eq!(again, Value::text("c0(b0(a0(1)))"));
    assert_eq!((bench.cache.hits(), bench.cache.misses()), (3, 3));
}

#[test]
fn editing_a_node_calls_it_and_everything_after_it_and_nothing_before() {
    let bench = Bench::new(&chain(&["a", "b", "c", "d"]));
    bench.run(Value::Int(1));
    bench.versions.edit("b");
    let (result, called) = bench.run(Value::Int(1));
    assert_eq!(called, names(&["b", "c", "d"]));
    assert_eq!(result, Value::text("d0(c0(b1(a0(1))))"));
}

#[test]
fn another_input_misses_from_the_roots_on() {
    let bench = Bench::new(&chain(&["a", "b"]));
    bench.run(Value::Int(1));
    let (result, called) = bench.run(Value::Int(2));
    assert_eq!(called, names(&["a", "b"]));
    assert_eq!(result, Value::text("b0(a0(2))"));
    // Both inputs' runs stay filed side by side.
    assert_eq!(bench.run(Value::Int(1)).1, Vec::<String>::new());
}

#[test]
fn a_failed_run_keeps_what_it_completed_and_the_next_calls_only_the_failed_node_and_after() {
    let bench = Bench::new(&chain(&["a", "b", "c", "d"]));
    bench.broken.lock().unwrap().insert("c".to_owned());
    let failed = bench.executor().run_program(&bench.program, Value::Int(1));
    assert!(failed.is_err());
    bench.broken.lock().unwrap().clear();
    bench.versions.edit("c"); // The fix.
    let (result, called) = bench.run(Value::Int(1));
    assert_eq!(called, names(&["c", "d"]));
    assert_eq!(result, Value::text("d0(c1(b0(a0(1))))"));
}

#[test]
fn a_wave_calls_its_edited_branch_and_the_join_and_not_its_unchanged_branch() {
    let bench = Bench::new(&graph(
        &["source", "left", "right", "join"],
        &[
            ("source", "left"),
            ("source", "right"),
            ("left", "join"),
            ("right", "join"),
        ],
    ));
    let (first, _) = bench.run(Value::Int(1));
    bench.versions.edit("right");
    let (result, called) = bench.run(Value::Int(1));
    assert_eq!(called, names(&["join", "right"]));
    assert_eq!(
        result,
        Value::text("join0(left0(source0(1)),right1(source0(1)))")
    );
    assert_ne!(result, first);
}

#[test]
fn a_node_kept_out_always_runs_and_its_readers_hit_while_its_output_is_the_same() {
    let bench = Bench::new(&chain(&["clock", "after"]));
    bench.kept_out.lock().unwrap().insert("clock".to_owned());
    bench.run(Value::Int(1));
    let (_, called) = bench.run(Value::Int(1));
    assert_eq!(called, names(&["clock"]));
}

#[test]
fn a_node_kept_out_whose_output_changed_reruns_its_readers() {
    let bench = Bench::new(&chain(&["clock", "after"]));
    bench.kept_out.lock().unwrap().insert("clock".to_owned());
    bench.run(Value::Int(1));
    // Its output changes, as a clock's would; its fingerprint is not asked.
    bench.versions.edit("clock");
    let (result, called) = bench.run(Value::Int(1));
    assert_eq!(called, names(&["after", "clock"]));
    assert_eq!(result, Value::text("after0(clock1(1))"));
}

#[test]
fn an_opaque_input_runs_every_root_uncached_and_files_nothing_under_it() {
    let bench = Bench::new(&chain(&["a", "b"]));
    bench.run(Value::opaque(7_u8));
    let (_, called) = bench.run(Value::opaque(7_u8));
    // `a` has no key; `b` reads `a`'s output, text with a digest, and hits.
    assert_eq!(called, names(&["a"]));
}

#[test]
fn a_detachable_run_reads_and_fills_the_cache_as_an_ordinary_run_does() {
    let bench = Bench::new(&chain(&["a", "b"]));
    let first = bench
        .executor()
        .run_detachable(&bench.program, Value::Int(3))
        .unwrap();
    let before = bench.log.entries().len();
    let again = bench
        .executor()
        .run_detachable(&bench.program, Value::Int(3))
        .unwrap();
    assert_eq!(bench.called_since(before), Vec::<String>::new());
    assert_eq!(again, first);
    // And what the detachable run filed, an ordinary run finds.
    assert_eq!(bench.run(Value::Int(3)).1, Vec::<String>::new());
}

#[test]
fn a_traced_rerun_marks_each_hit_cached_with_no_turn() {
    let bench = Bench::new(&chain(&["a", "b"]));
    bench.run(Value::Int(1));
    bench.versions.edit("b");
    let spans = Arc::new(Spans::new());
    bench
        .executor()
        .with_trace(Arc::clone(&spans))
        .run_program(&bench.program, Value::Int(1))
        .unwrap();
    let marks: Vec<(String, bool, u32)> = spans
        .spans()
        .iter()
        .map(|span| (span.node.to_string(), span.cached, span.turns))
        .collect();
    assert_eq!(
        marks,
        vec![("a".to_owned(), true, 0), ("b".to_owned(), false, 1)]
    );
}

#[test]
fn a_value_digest_tells_apart_what_equality_tells_apart() {
    let digest = |value: &Value| Key::of_value(value).unwrap();
    let pairs = [
        (Value::Int(1), Value::Float(1.0)),
        (Value::text("ab"), Value::Bytes(b"ab".to_vec().into())),
        (
            Value::list([Value::list([Value::Int(1)]), Value::Int(2)]),
            Value::list([Value::list([Value::Int(1), Value::Int(2)])]),
        ),
        (
            Value::map([("a", Value::Int(1)), ("b", Value::Int(2))]),
            Value::map([("b", Value::Int(2)), ("a", Value::Int(1))]),
        ),
        (Value::text("a"), Value::text("a\0")),
    ];
    for (one, other) in &pairs {
        assert_ne!(digest(one), digest(other), "{one:?} against {other:?}");
    }
    let value = Value::map([("x", Value::list([Value::Float(0.5), Value::Null]))]);
    assert_eq!(digest(&value), digest(&value.clone()));
    assert_eq!(
        digest(&Value::Int(1)).to_hex().len(),
        64,
        "a key prints as 64 hex digits"
    );
}

#[test]
fn a_value_holding_an_opaque_one_has_no_digest() {
    assert_eq!(
        Key::of_value(&Value::list([Value::Int(1), Value::opaque(2_u8)])),
        None
    );
}

#[test]
fn a_value_nested_100_000_levels_deep_has_a_digest_on_a_small_stack() {
    let mut value = Value::Int(0);
    for _ in 0..100_000 {
        value = Value::list([value]);
    }
    let digest = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || Key::of_value(&value).is_some())
        .unwrap()
        .join()
        .unwrap();
    assert!(digest);
}

/// A store that finds nothing and keeps nothing, as one whose folder cannot be read or written.
struct Unreadable;

impl soma_core::NodeCache for Unreadable {
    fn fingerprint(&self, id: &soma_core::NodeId, _node: &dyn Node) -> Option<Key> {
        Some(Key::of_bytes(id.as_str().as_bytes()))
    }

    fn get(&self, _id: &soma_core::NodeId, _key: &Key) -> Option<Entry> {
        None
    }

    fn put(&self, _: &soma_core::NodeId, _: &Key, _: &Entry, _: std::time::Duration) {}
}

#[test]
fn a_store_that_keeps_nothing_runs_every_node_every_time_with_the_same_result() {
    let bench = Bench::new(&chain(&["a", "b"]));
    let executor = Executor::new().with_cache(Arc::new(Unreadable));
    for _ in 0..2 {
        let before = bench.log.entries().len();
        let result = executor.run_program(&bench.program, Value::Int(1)).unwrap();
        assert_eq!(bench.called_since(before), names(&["a", "b"]));
        assert_eq!(result, bench.uncached(Value::Int(1)));
    }
}

/// The nodes of `graph` that `edited` reaches, themselves included.
fn downstream(graph: &Graph, edited: &HashSet<String>) -> Vec<String> {
    let mut reached: HashSet<String> = HashSet::new();
    let mut pending: Vec<String> = edited.iter().cloned().collect();
    while let Some(id) = pending.pop() {
        if reached.insert(id.clone()) {
            pending.extend(
                graph
                    .successors(&id)
                    .unwrap()
                    .into_iter()
                    .map(ToString::to_string),
            );
        }
    }
    let mut reached: Vec<String> = reached.into_iter().collect();
    reached.sort();
    reached
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_cached_rerun_after_random_edits_equals_an_uncached_run_and_calls_only_what_they_reach(
        dag in random_dag(),
        picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let graph = dag.graph();
        let ids: Vec<String> = graph.nodes().iter().map(ToString::to_string).collect();
        let bench = Bench::new(&graph);
        bench.run(Value::Int(5));
        let edited: HashSet<String> =
            picks.iter().map(|pick| ids[pick.index(ids.len())].clone()).collect();
        for id in &edited {
            bench.versions.edit(id);
        }
        let (result, called) = bench.run(Value::Int(5));
        prop_assert_eq!(result, bench.uncached(Value::Int(5)));
        prop_assert_eq!(called, downstream(&graph, &edited));
    }
}

#[test]
fn a_broken_node_is_called_again_however_often_it_failed() {
    let bench = Bench::new(&chain(&["a", "b"]));
    bench.broken.lock().unwrap().insert("b".to_owned());
    let executor = bench.executor();
    for _ in 0..2 {
        assert!(executor.run_program(&bench.program, Value::Int(1)).is_err());
    }
    assert_eq!(bench.log.starts("b"), 2);
    assert_eq!(bench.log.starts("a"), 1);
}

#[test]
fn a_stream_with_a_cache_keys_each_item_on_its_own_input_and_calls_only_the_new_ones() {
    let bench = Bench::new(&chain(&["a", "b"]));
    let stream = |inputs: Vec<i64>| {
        let before = bench.log.entries().len();
        let settings = StreamSettings::default().with_executor(bench.executor());
        let results: Vec<Value> = Stream::start(
            Arc::clone(&bench.program),
            inputs.into_iter().map(Value::Int),
            settings,
        )
        .map(|item| item.unwrap().1)
        .collect();
        (results, bench.called_since(before).len())
    };
    let (first, calls) = stream(vec![1, 2]);
    assert_eq!(calls, 4);
    let (again, calls) = stream(vec![1, 2, 3]);
    assert_eq!(calls, 2, "only item 3's two nodes are called");
    assert_eq!(again[..2], first[..]);
    assert_eq!(again[2], Value::text("b0(a0(3))"));
}

#[test]
fn a_node_moved_to_another_device_is_called_again_and_moved_back_hits() {
    let graph = chain(&["a", "b"]);
    let bench = Bench::new(&graph);
    let catalog = {
        let node: Arc<dyn Node> = Arc::new(Versioned {
            versions: Arc::clone(&bench.versions),
            log: Arc::clone(&bench.log),
            broken: Arc::clone(&bench.broken),
        });
        catalog_of(&graph, &node)
    };
    let plan = compile(&graph, &catalog).unwrap();
    let on = |device: &str| {
        let mut placement = Placement::new();
        placement.place("b", device.parse::<Device>().unwrap());
        Program::with_placement(&plan, &catalog, &placement).unwrap()
    };
    let run = |program: &Program| {
        let before = bench.log.entries().len();
        bench
            .executor()
            .run_program(program, Value::Int(1))
            .unwrap();
        bench.called_since(before)
    };
    assert_eq!(run(&on("cuda:1")), names(&["a", "b"]));
    assert_eq!(run(&on("cuda:0")), names(&["b"]));
    assert_eq!(run(&on("cuda:1")), Vec::<String>::new());
}

#[test]
fn two_nodes_alike_in_fingerprint_on_the_same_input_keep_entries_of_their_own() {
    // `Versioned` outputs its own id: alike in code and state, the two compute different values.
    let graph = graph(&["left", "right"], &[]);
    let bench = Bench::new(&graph);
    let alike = Arc::new(MemoryCache::new(|_| Some(Key::of_bytes(b"the same code"))));
    let executor = Executor::new().with_cache(Arc::clone(&alike) as _);
    let first = executor.run_program(&bench.program, Value::Int(1)).unwrap();
    let again = executor.run_program(&bench.program, Value::Int(1)).unwrap();
    assert_eq!(again, first);
    assert_eq!(
        again,
        Value::map([
            ("left", Value::text("left0(1)")),
            ("right", Value::text("right0(1)"))
        ])
    );
    assert_eq!(alike.len(), 2);
}

#[test]
fn a_node_edited_to_compute_the_same_output_leaves_what_reads_it_hitting() {
    // Early cutoff: `b` is edited (its fingerprint changes) but still outputs what it did.
    let graph = chain(&["a", "b", "c"]);
    let log = Log::new();
    let node: Arc<dyn Node> = Arc::new(crate::support::logged(&log, |id, x| Ok(traced(id, x))));
    let catalog = catalog_of(&graph, &node);
    let program = Program::new(&compile(&graph, &catalog).unwrap(), &catalog).unwrap();
    let edits = Arc::new(Versions::default());
    let cache = {
        let edits = Arc::clone(&edits);
        Arc::new(MemoryCache::new(move |id| {
            Some(Key::of_bytes(
                format!("{id}@{}", edits.of(id.as_str())).as_bytes(),
            ))
        }))
    };
    let executor = Executor::new().with_cache(cache);
    let first = executor.run_program(&program, Value::Int(1)).unwrap();
    edits.edit("b");
    let before = log.entries().len();
    let again = executor.run_program(&program, Value::Int(1)).unwrap();
    let called: Vec<String> = log.entries()[before..]
        .iter()
        .filter(|entry| entry.phase == Phase::Start)
        .map(|entry| entry.node.clone())
        .collect();
    assert_eq!(called, names(&["b"]));
    assert_eq!(again, first);
}

#[test]
fn would_hit_says_which_nodes_a_run_would_find_without_calling_any() {
    let bench = Bench::new(&chain(&["a", "b", "c"]));
    let ask = |input: i64| {
        let before = bench.log.entries().len();
        let answer: Vec<(String, bool)> = bench
            .executor()
            .would_hit(&bench.program, &Value::Int(input))
            .into_iter()
            .map(|(id, hit)| (id.to_string(), hit))
            .collect();
        assert_eq!(bench.called_since(before), Vec::<String>::new());
        answer
    };
    let all = |hit: bool| vec![("a".into(), hit), ("b".into(), hit), ("c".into(), hit)];
    assert_eq!(ask(1), all(false));
    bench.run(Value::Int(1));
    assert_eq!(ask(1), all(true));
    assert_eq!(ask(2), all(false));
    bench.versions.edit("b");
    assert_eq!(
        ask(1),
        vec![("a".into(), true), ("b".into(), false), ("c".into(), false)]
    );
    assert_eq!(
        (bench.cache.hits(), bench.cache.misses()),
        (0, 3),
        "no lookup counted"
    );
    assert!(Executor::new()
        .would_hit(&bench.program, &Value::Int(1))
        .is_empty());
}

#[test]
fn each_drawing_of_a_plan_marks_the_nodes_a_run_would_find_in_the_cache_and_only_those() {
    let bench = Bench::new(&chain(&["a", "b", "c"]));
    bench.run(Value::Int(1));
    bench.versions.edit("b");
    let cached: HashSet<NodeId> = bench
        .executor()
        .would_hit(&bench.program, &Value::Int(1))
        .into_iter()
        .filter_map(|(id, hit)| hit.then_some(id))
        .collect();
    let drawing = bench.plan.with_cached(&cached);
    insta::assert_snapshot!(drawing, @r"
    Sequence
    ├── a <- (input) (cached)
    ├── b <- a
    └── c <- b
    ");
    let mermaid = drawing.to_mermaid();
    assert!(mermaid.contains("a[\"a (cached)\"]"), "{mermaid}");
    assert!(mermaid.contains("b[\"b\"]"), "{mermaid}");
    assert!(mermaid.ends_with("    class a soma_cached\n"), "{mermaid}");
    let dot = drawing.to_dot();
    assert!(
        dot.contains("\"a\" [label=\"a (cached)\", fillcolor=\"#d9f2e3\", color=\"#2f855a\"];"),
        "{dot}"
    );
    assert!(dot.contains("    \"b\";"), "{dot}");
    let svg = drawing.to_svg();
    assert_eq!(svg.matches("<g class=\"node cached\">").count(), 1, "{svg}");
    assert!(svg.contains(">a (cached)</text>"), "{svg}");
    assert!(svg.contains(">b</text>"), "{svg}");
    // With its devices too, a node says both; with nothing cached, the plan's own drawings.
    let mut placement = Placement::new();
    placement.place("a", "cuda:1".parse::<Device>().unwrap());
    let both = bench.plan.with_devices(&placement).with_cached(&cached);
    assert!(both.to_string().contains("a <- (input) @ cuda:1 (cached)"));
    let none = HashSet::new();
    assert_eq!(
        bench.plan.with_cached(&none).to_string(),
        bench.plan.to_string()
    );
    assert_eq!(
        bench.plan.with_cached(&none).to_mermaid(),
        bench.plan.to_mermaid()
    );
    assert_eq!(bench.plan.with_cached(&none).to_dot(), bench.plan.to_dot());
    assert_eq!(bench.plan.with_cached(&none).to_svg(), bench.plan.to_svg());
}

/// A store in memory whose input has no digest, noting which node asked for it.
#[derive(Default)]
struct NoInputDigest {
    entries: Mutex<HashMap<Key, Entry>>,
    asked: Mutex<Vec<String>>,
}

impl soma_core::NodeCache for NoInputDigest {
    fn fingerprint(&self, id: &soma_core::NodeId, _node: &dyn Node) -> Option<Key> {
        Some(Key::of_bytes(id.as_str().as_bytes()))
    }

    fn digest_input(&self, id: &soma_core::NodeId, _input: &Value) -> Option<Key> {
        self.asked.lock().unwrap().push(id.as_str().to_owned());
        None
    }

    fn get(&self, _id: &soma_core::NodeId, key: &Key) -> Option<Entry> {
        self.entries.lock().unwrap().get(key).cloned()
    }

    fn put(&self, _: &soma_core::NodeId, key: &Key, entry: &Entry, _: std::time::Duration) {
        self.entries.lock().unwrap().insert(*key, entry.clone());
    }
}

#[test]
fn an_input_without_a_digest_is_asked_for_once_a_run_by_its_first_reader_which_runs_uncached() {
    let bench = Bench::new(&chain(&["a", "b"]));
    let store = Arc::new(NoInputDigest::default());
    let executor = Executor::new().with_cache(Arc::clone(&store) as Arc<dyn soma_core::NodeCache>);
    executor.run_program(&bench.program, Value::Int(1)).unwrap();
    let before = bench.log.entries().len();
    let result = executor.run_program(&bench.program, Value::Int(1)).unwrap();
    // `a` reads the input and runs; `b`, keyed on `a`'s output, which has a digest, hits.
    assert_eq!(bench.called_since(before), names(&["a"]));
    assert_eq!(result, bench.uncached(Value::Int(1)));
    assert_eq!(*store.asked.lock().unwrap(), names(&["a", "a"]));
}

/// A [`MemoryCache`] that counts the outputs it reads for hits found unread, and can lose them:
/// an entry then found cannot be read when a node that runs reads it.
struct Reads {
    inner: Arc<MemoryCache>,
    read: Arc<std::sync::atomic::AtomicUsize>,
    lose: bool,
    /// How many hits were found unread.
    found: std::sync::atomic::AtomicUsize,
}

impl soma_core::NodeCache for Reads {
    fn fingerprint(&self, id: &soma_core::NodeId, node: &dyn Node) -> Option<Key> {
        self.inner.fingerprint(id, node)
    }

    fn get(&self, id: &soma_core::NodeId, key: &Key) -> Option<Entry> {
        self.inner.get(id, key)
    }

    fn put(&self, id: &soma_core::NodeId, key: &Key, entry: &Entry, took: std::time::Duration) {
        self.inner.put(id, key, entry, took);
    }

    fn find(&self, id: &soma_core::NodeId, key: &Key) -> Option<soma_core::Found> {
        let entry = self.inner.get(id, key)?;
        self.found
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (read, lose) = (Arc::clone(&self.read), self.lose);
        Some(soma_core::Found::Unread(soma_core::Unread {
            digest: entry.digest,
            read: Box::new(move || {
                read.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                (!lose).then(|| entry.value.clone())
            }),
        }))
    }
}

#[test]
fn a_fully_cached_rerun_reads_no_output_that_only_nodes_that_hit_read() {
    let bench = Bench::new(&chain(&["a", "b", "c", "d"]));
    let (first, _) = bench.run(Value::Int(1));
    let read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let store = Reads {
        inner: Arc::clone(&bench.cache),
        read: Arc::clone(&read),
        lose: false,
        found: std::sync::atomic::AtomicUsize::new(0),
    };
    let executor = Executor::new().with_cache(Arc::new(store));
    let before = bench.log.entries().len();
    assert_eq!(
        executor.run_program(&bench.program, Value::Int(1)).unwrap(),
        first
    );
    assert_eq!(bench.called_since(before), Vec::<String>::new());
    assert_eq!(read.load(std::sync::atomic::Ordering::Relaxed), 0);
    // `d` edited: it runs, and reads `c`'s output, and no other.
    bench.versions.edit("d");
    let expected = bench.uncached(Value::Int(1));
    let before = bench.log.entries().len();
    let result = executor.run_program(&bench.program, Value::Int(1)).unwrap();
    assert_eq!(bench.called_since(before), names(&["d"]));
    assert_eq!(result, expected);
    assert_eq!(read.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[test]
fn an_output_found_unread_that_cannot_be_read_when_needed_is_computed_again_by_its_node() {
    let bench = Bench::new(&graph(
        &["a", "b", "c", "j"],
        &[("a", "b"), ("a", "c"), ("b", "j"), ("c", "j")],
    ));
    bench.run(Value::Int(1));
    bench.versions.edit("j");
    let store = Reads {
        inner: Arc::clone(&bench.cache),
        read: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        lose: true,
        found: std::sync::atomic::AtomicUsize::new(0),
    };
    let executor = Executor::new().with_cache(Arc::new(store));
    let expected = bench.uncached(Value::Int(1));
    let before = bench.log.entries().len();
    let result = executor.run_program(&bench.program, Value::Int(1)).unwrap();
    assert_eq!(result, expected);
    // `j` runs; `b` and `c`, lost, are computed again, and `a` once for both.
    assert_eq!(bench.called_since(before), names(&["a", "b", "c", "j"]));
}

#[test]
fn a_hit_on_what_a_node_that_ran_computed_is_read_when_found_and_keeps_nothing_computed() {
    let bench = Bench::new(&chain(&["a", "b", "c", "d"]));
    bench.run(Value::Int(1));
    bench.kept_out.lock().unwrap().insert("a".to_owned()); // `a` runs, the same output.
    let store = Arc::new(Reads {
        inner: Arc::clone(&bench.cache),
        read: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        lose: false,
        found: std::sync::atomic::AtomicUsize::new(0),
    });
    let executor = Executor::new().with_cache(Arc::clone(&store) as _);
    let expected = bench.uncached(Value::Int(1));
    let before = bench.log.entries().len();
    assert_eq!(
        executor.run_program(&bench.program, Value::Int(1)).unwrap(),
        expected
    );
    assert_eq!(bench.called_since(before), names(&["a"]));
    // `b` read what `a` computed: found and read whole, so that `a`'s output is dropped
    // after `b` as it would be; `c` and `d` read what was read.
    assert_eq!(store.found.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[test]
fn a_map_found_whole_calls_nothing_and_one_edited_node_inside_it_calls_its_body_again() {
    use soma_core::{compile_decided, each, node};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let body = node(
        "a",
        crate::support::plain(move |_: &str, x: &Value| {
            counted.fetch_add(1, Ordering::Relaxed);
            Ok(Value::Int(x.as_int().unwrap_or(0) + 1))
        }),
    );
    let (graph, catalog, decisions) = each("m", body, None).unwrap().somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    // The body's node at the version this says: its fingerprint changes with it.
    let version = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&version);
    let cache = Arc::new(MemoryCache::new(move |id: &NodeId| {
        let at = if id.as_str().ends_with('a') {
            seen.load(Ordering::Relaxed)
        } else {
            0
        };
        Some(Key::of_bytes(format!("{id} {at}").as_bytes()))
    }));
    let executor = Executor::new().with_cache(cache.clone());
    let items = Value::list([1, 2, 3].map(Value::Int));
    let first = executor.run_program(&program, items.clone()).unwrap();
    assert_eq!(calls.swap(0, Ordering::Relaxed), 3);
    assert_eq!(
        executor.run_program(&program, items.clone()).unwrap(),
        first
    );
    assert_eq!(calls.swap(0, Ordering::Relaxed), 0);
    assert_eq!(cache.hits(), 1); // the step, found whole: none of its items looked up
    version.store(1, Ordering::Relaxed);
    assert_eq!(executor.run_program(&program, items).unwrap(), first);
    assert_eq!(calls.swap(0, Ordering::Relaxed), 3);
}

/// A [`MemoryCache`] that counts the values it digests, whole and as a run's input.
struct Digests {
    inner: MemoryCache,
    digested: Mutex<Vec<Value>>,
    inputs: std::sync::atomic::AtomicUsize,
}

impl soma_core::NodeCache for Digests {
    fn fingerprint(&self, id: &NodeId, node: &dyn Node) -> Option<Key> {
        self.inner.fingerprint(id, node)
    }

    fn digest(&self, value: &Value) -> Option<Key> {
        self.digested.lock().unwrap().push(value.clone());
        Key::of_value(value)
    }

    fn digest_input(&self, _id: &NodeId, input: &Value) -> Option<Key> {
        self.inputs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.digest(input)
    }

    fn get(&self, id: &NodeId, key: &Key) -> Option<Entry> {
        self.inner.get(id, key)
    }

    fn put(&self, id: &NodeId, key: &Key, entry: &Entry, took: std::time::Duration) {
        self.inner.put(id, key, entry, took);
    }
}

#[test]
fn a_maps_items_are_digested_with_its_list_and_each_item_run_is_keyed_on_that_digest() {
    use soma_core::{compile_decided, each, node};
    let body = node(
        "a",
        crate::support::plain(|_: &str, x: &Value| Ok(Value::Int(x.as_int().unwrap_or(0) * 10))),
    );
    let (graph, catalog, decisions) = each("m", body, None).unwrap().somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    let store = Arc::new(Digests {
        inner: MemoryCache::new(|id: &NodeId| Some(Key::of_bytes(id.as_str().as_bytes()))),
        digested: Mutex::new(Vec::new()),
        inputs: std::sync::atomic::AtomicUsize::new(0),
    });
    let executor = Executor::new().with_cache(Arc::clone(&store) as Arc<dyn soma_core::NodeCache>);
    let items = Value::list([1, 2, 3].map(Value::Int));
    let result = executor.run_program(&program, items.clone()).unwrap();
    assert_eq!(result, Value::list([10, 20, 30].map(Value::Int)));
    // The list asked for once, as the run's input, its items digested with it and never
    // again as their runs began.
    assert_eq!(store.inputs.load(std::sync::atomic::Ordering::Relaxed), 1);
    let digested = store.digested.lock().unwrap();
    for item in [1, 2, 3].map(Value::Int) {
        assert_eq!(digested.iter().filter(|value| **value == item).count(), 1);
    }
    assert_eq!(digested.iter().filter(|value| **value == items).count(), 1);
}
