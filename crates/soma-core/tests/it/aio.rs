//! Runs with async nodes, walked by the engine itself ([`Executor::start`]): on a small loop of
//! this file's own (one thread polling tasks, wake-ups from any thread), what a run computes,
//! what is in flight at once, which error wins, what a waiting branch holds, how deep a plan
//! may nest, and what the sync entry points say of such a program.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use soma_core::{
    compile_decided, each, node, node_arc, Call, Ctx, Executor, Expr, Interrupt, MemoryCache, Node,
    NodeError, Observer, Pause, Program, RunError, Settled, Spawned, Task, Tasks, Transition,
    Value,
};

use crate::support::plain;

/// How long a rendezvous waits for its parties before it gives up and fails the test.
const DEADLINE: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// A loop: tasks polled on one thread, woken from any

/// One task of the test loop, and whether it is queued to be polled.
struct Slot {
    task: Mutex<Option<Task>>,
    queued: AtomicBool,
    tasks: Arc<Queue>,
}

/// The tasks ready to be polled.
#[derive(Default)]
struct Queue {
    ready: Mutex<VecDeque<Arc<Slot>>>,
    woken: Condvar,
}

impl Queue {
    fn push(&self, slot: Arc<Slot>) {
        if !slot.queued.swap(true, Ordering::AcqRel) {
            self.ready.lock().unwrap().push_back(slot);
            self.woken.notify_all();
        }
    }
}

impl Wake for Slot {
    fn wake(self: Arc<Self>) {
        let queue = Arc::clone(&self.tasks);
        queue.push(self);
    }
}

/// The engine's loop side for the test loop.
struct TestLoop {
    queue: Arc<Queue>,
    /// Tasks spawned so far, the run's own included.
    spawned: AtomicUsize,
}

struct SpawnedSlot(Arc<Slot>);

impl Spawned for SpawnedSlot {
    fn cancel(&self) {
        if let Some(task) = self.0.task.lock().unwrap().as_ref() {
            task.cancel();
        }
        let queue = Arc::clone(&self.0.tasks);
        queue.push(Arc::clone(&self.0));
    }
}

/// A flag set, and a task woken, from another thread after a while.
struct Timer {
    fired: Arc<AtomicBool>,
}

impl Interrupt for Timer {
    fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

impl TestLoop {
    fn new() -> Arc<Self> {
        Arc::new(TestLoop {
            queue: Arc::default(),
            spawned: AtomicUsize::new(0),
        })
    }

    fn add(&self, task: Task) -> Arc<Slot> {
        self.spawned.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            task: Mutex::new(Some(task)),
            queued: AtomicBool::new(false),
            tasks: Arc::clone(&self.queue),
        });
        self.queue.push(Arc::clone(&slot));
        slot
    }

    /// Polls tasks on this thread until `settled` is done.
    fn run_until(&self, settled: &Settled) {
        let deadline = Instant::now() + 4 * DEADLINE;
        while !settled.is_done() {
            assert!(Instant::now() < deadline, "the run did not end");
            let slot = {
                let mut ready = self.queue.ready.lock().unwrap();
                if ready.is_empty() {
                    ready = self
                        .queue
                        .woken
                        .wait_timeout(ready, Duration::from_millis(10))
                        .unwrap()
                        .0;
                }
                ready.pop_front()
            };
            let Some(slot) = slot else { continue };
            slot.queued.store(false, Ordering::Release);
            let waker = Waker::from(Arc::clone(&slot));
            let mut task = slot.task.lock().unwrap();
            if let Some(running) = task.as_mut() {
                if running.poll(&mut Context::from_waker(&waker)).is_ready() {
                    *task = None;
                }
            }
        }
    }
}

/// The loop side the engine is given: the test loop, shared.
struct LoopSide(Arc<TestLoop>);

impl Tasks for LoopSide {
    fn spawn(&self, task: Task) -> Result<Box<dyn Spawned>, String> {
        Ok(Box::new(SpawnedSlot(self.0.add(task))))
    }

    fn sleep(&self, pause: Duration) -> Pause {
        Box::pin(Sleep {
            until: Instant::now() + pause,
            started: false,
        })
    }

    fn interrupt_after(&self, limit: Duration) -> Box<dyn Interrupt> {
        let fired = Arc::new(AtomicBool::new(false));
        let theirs = Arc::clone(&fired);
        thread::spawn(move || {
            thread::sleep(limit);
            theirs.store(true, Ordering::Release);
        });
        Box::new(Timer { fired })
    }
}

/// A pause: a thread wakes the task when it is over.
struct Sleep {
    until: Instant,
    started: bool,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.until {
            return Poll::Ready(());
        }
        if !self.started {
            self.started = true;
            let (waker, until) = (cx.waker().clone(), self.until);
            thread::spawn(move || {
                thread::sleep(until.saturating_duration_since(Instant::now()));
                waker.wake();
            });
        }
        Poll::Pending
    }
}

/// Runs `program` on `input` on a test loop: its outcome, and the loop.
fn run_async(program: &Arc<Program>, input: Value) -> (Result<Value, RunError>, Arc<TestLoop>) {
    run_with(&Executor::new(), program, input)
}

fn run_with(
    executor: &Executor,
    program: &Arc<Program>,
    input: Value,
) -> (Result<Value, RunError>, Arc<TestLoop>) {
    let test_loop = TestLoop::new();
    let (task, settled) = executor.start(
        program,
        input,
        Arc::new(LoopSide(Arc::clone(&test_loop))) as Arc<dyn Tasks>,
    );
    test_loop.add(task);
    test_loop.run_until(&settled);
    let outcome = settled
        .take()
        .expect("settled")
        .unwrap_or_else(|payload| std::panic::resume_unwind(payload));
    (outcome, test_loop)
}

fn program_of(expr: Expr) -> Arc<Program> {
    let (graph, catalog, decisions) = expr.somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    Arc::new(Program::new(&plan, &catalog).unwrap())
}

// ---------------------------------------------------------------------------------------------
// Async nodes

/// An async node: its call a future made by `call` from its input.
struct Async<F>(F);

impl<F, C> Node for Async<F>
where
    F: Fn(&Value) -> C + Send + Sync,
    C: Future<Output = Result<Value, NodeError>> + Send + 'static,
{
    fn forward(&self, _: &Value, _: &Ctx<'_>) -> Result<Transition, NodeError> {
        Err(NodeError::new("an async node is started, never forwarded"))
    }

    fn is_async(&self) -> bool {
        true
    }

    fn start(self: Arc<Self>, input: &Value, _: &Ctx<'_>) -> Call {
        Box::pin((self.0)(input))
    }
}

fn async_node<F, C>(id: &str, call: F) -> Expr
where
    F: Fn(&Value) -> C + Send + Sync + 'static,
    C: Future<Output = Result<Value, NodeError>> + Send + 'static,
{
    node_arc(id, Arc::new(Async(call)))
}

/// Adds `k`, after waiting once for the loop to come back to it.
fn add_later(id: &str, k: i64) -> Expr {
    async_node(id, move |x| {
        let x = x.as_int().unwrap_or(0);
        async move {
            YieldOnce(false).await;
            Ok(Value::Int(x + k))
        }
    })
}

/// Pending once, waking itself: an await that gives the loop back.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Where async parties meet: each waits, without a thread, until all have come.
struct Meeting {
    parties: usize,
    state: Mutex<(usize, Vec<Waker>)>,
}

impl Meeting {
    fn new(parties: usize) -> Arc<Self> {
        Arc::new(Meeting {
            parties,
            state: Mutex::new((0, Vec::new())),
        })
    }

    /// Arrives; ready once every party has, or `Err` at the deadline.
    fn meet(self: &Arc<Self>) -> impl Future<Output = Result<(), NodeError>> + Send + 'static {
        let meeting = Arc::clone(self);
        let deadline = Instant::now() + DEADLINE;
        let mut arrived = false;
        std::future::poll_fn(move |cx| {
            let mut state = meeting.state.lock().unwrap();
            if !arrived {
                arrived = true;
                state.0 += 1;
                if state.0 == meeting.parties {
                    for waker in state.1.drain(..) {
                        waker.wake();
                    }
                }
            }
            if state.0 >= meeting.parties {
                return Poll::Ready(Ok(()));
            }
            if Instant::now() >= deadline {
                return Poll::Ready(Err(NodeError::new("the others never came")));
            }
            state.1.push(cx.waker().clone());
            // Looked at again now and then, for the deadline.
            let waker = cx.waker().clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                waker.wake();
            });
            Poll::Pending
        })
    }
}

fn meets(id: &str, meeting: &Arc<Meeting>) -> Expr {
    let meeting = Arc::clone(meeting);
    async_node(id, move |x| {
        let (x, met) = (x.clone(), meeting.meet());
        async move {
            met.await?;
            Ok(x)
        }
    })
}

fn add(k: i64) -> impl Fn(&Value) -> Result<Value, NodeError> + Send + Sync + 'static {
    move |x| {
        x.as_int()
            .map(|x| Value::Int(x + k))
            .ok_or_else(|| NodeError::new("not an int"))
    }
}

// ---------------------------------------------------------------------------------------------
// The questionnaire

#[test]
fn a_chain_of_async_and_sync_nodes_computes_what_the_same_chain_all_sync_computes() {
    let mixed = add_later("a", 1) >> node("b", add(10)) >> add_later("c", 100);
    let sync = node("a", add(1)) >> node("b", add(10)) >> node("c", add(100));
    let (out, _) = run_async(&program_of(mixed), Value::Int(0));
    let expected = Executor::new()
        .run_program(&program_of(sync), Value::Int(0))
        .unwrap();
    assert_eq!(out.unwrap(), expected);
}

#[test]
fn an_async_run_tells_its_observer_the_run_and_each_call_awaited_in_its_branch() {
    let told = Arc::new(crate::observing::Told::default());
    let executor = Executor::new().with_observer(Arc::clone(&told) as Arc<dyn Observer>);
    let expr = add_later("a", 1) >> (add_later("b", 2) | node("c", add(3)));
    let (out, _) = run_with(&executor, &program_of(expr), Value::Int(0));
    out.unwrap();
    let lines = told.lines();
    assert_eq!(lines.first().map(String::as_str), Some("begin run"));
    assert_eq!(lines.last().map(String::as_str), Some("end run returned"));
    for line in [
        "end call a #0 [] awaited returned",
        "end call b #0 [0] awaited returned",
        "end call c #0 [1] returned",
    ] {
        assert!(lines.contains(&line.to_string()), "{line} not in {lines:?}");
    }
}

#[test]
fn the_async_branches_of_a_wave_are_in_flight_together() {
    let meeting = Meeting::new(3);
    let expr = meets("a", &meeting) | meets("b", &meeting) | meets("c", &meeting);
    let (out, _) = run_async(&program_of(expr), Value::Int(7));
    let out = out.unwrap();
    let map = out.as_map().unwrap();
    assert_eq!(map.len(), 3);
}

#[test]
fn a_wave_of_a_thousand_waiting_async_nodes_holds_no_thread() {
    let meeting = Meeting::new(1000);
    let mut expr = meets("n0", &meeting);
    for i in 1..1000 {
        expr = expr | meets(&format!("n{i}"), &meeting);
    }
    let program = program_of(expr);
    let (out, test_loop) = run_async(&program, Value::Int(1));
    assert_eq!(out.unwrap().as_map().unwrap().len(), 1000);
    // Each branch was a task, none a thread: the crew never started one.
    assert_eq!(program.threads(), 0);
    assert_eq!(test_loop.spawned.load(Ordering::Relaxed), 1001);
}

#[test]
fn a_sync_piece_runs_on_a_lent_thread_while_an_async_branch_waits_beside_it() {
    let meeting = Meeting::new(1);
    let loop_thread = thread::current().id();
    let off_the_loop = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&off_the_loop);
    let sync = node("s", move |x: &Value| {
        seen.store(thread::current().id() != loop_thread, Ordering::Release);
        Ok(x.clone())
    });
    let (out, _) = run_async(&program_of(meets("a", &meeting) | sync), Value::Int(1));
    assert_eq!(out.unwrap().as_map().unwrap().len(), 2);
    assert!(
        off_the_loop.load(Ordering::Acquire),
        "a sync node ran on the loop's thread"
    );
}

#[test]
fn the_first_declared_failing_branch_wins_and_a_later_one_stops_at_its_next_boundary() {
    let failing = |id: &str, message: &'static str| {
        async_node(id, move |_| async move {
            for _ in 0..3 {
                YieldOnce(false).await;
            }
            Err(NodeError::new(message))
        })
    };
    let ran_after = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&ran_after);
    let after = node("after", move |x: &Value| {
        seen.store(true, Ordering::Release);
        Ok(x.clone())
    });
    // The third branch waits past the first's failure, then reaches a boundary.
    let slow = async_node("slow", |x| {
        let x = x.clone();
        async move {
            for _ in 0..50 {
                YieldOnce(false).await;
            }
            Ok(x)
        }
    });
    let expr = failing("first", "first") | failing("second", "second") | (slow >> after);
    let (out, _) = run_async(&program_of(expr), Value::Int(0));
    match out {
        Err(RunError::NodeFailed { node, .. }) => assert_eq!(node.as_str(), "first"),
        other => panic!("expected the first branch's failure, got {other:?}"),
    }
    assert!(
        !ran_after.load(Ordering::Acquire),
        "a branch ran on after an earlier one failed"
    );
}

#[test]
fn a_panic_in_an_async_node_is_re_raised_after_the_wave_joins() {
    let panics = async_node("p", |_| async {
        YieldOnce(false).await;
        panic!("a bug");
    });
    let expr = panics | add_later("fine", 1);
    let program = program_of(expr);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_async(&program, Value::Int(0))
    }));
    assert!(outcome.is_err(), "the panic was swallowed");
}

#[test]
fn an_async_node_is_looked_up_in_the_cache_as_a_sync_node_is() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let expr = async_node("a", move |x| {
        counted.fetch_add(1, Ordering::Relaxed);
        let x = x.as_int().unwrap_or(0);
        async move { Ok(Value::Int(x + 1)) }
    }) >> node("b", add(1));
    let program = program_of(expr);
    let cache = Arc::new(MemoryCache::new(|id| {
        Some(soma_core::Key::of_value(&Value::text(id.as_str())).unwrap())
    }));
    let executor = Executor::new().with_cache(cache.clone());
    for _ in 0..2 {
        let (out, _) = run_with(&executor, &program, Value::Int(1));
        assert_eq!(out.unwrap(), Value::Int(3));
    }
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    assert_eq!(cache.hits(), 2);
}

#[test]
fn each_item_of_an_async_body_is_a_task_and_the_results_keep_their_order() {
    let expr = each("m", add_later("a", 1), Some(3)).unwrap();
    let items = Value::list((0..10).map(Value::Int));
    let (out, _) = run_async(&program_of(expr), items);
    assert_eq!(out.unwrap(), Value::list((1..11).map(Value::Int)));
}

#[test]
fn steps_nested_deeper_than_a_task_nests_inline_run_without_recursing_deeper() {
    // Each level an `each` of one item around the next: the innermost holds the async node.
    let mut expr = add_later("leaf", 1);
    for level in 0..200 {
        expr = each(format!("l{level}"), expr, None).unwrap();
    }
    let mut input = Value::Int(0);
    let mut expected = Value::Int(1);
    for _ in 0..200 {
        input = Value::list([input]);
        expected = Value::list([expected]);
    }
    let program = program_of(expr);
    let out = crate::support::on_a_small_stack(move || run_async(&program, input).0);
    assert_eq!(out.unwrap(), expected);
}

#[test]
fn the_sync_entry_points_refuse_a_program_with_an_async_node_naming_it() {
    let program = program_of(node("a", add(1)) >> add_later("late", 1));
    match Executor::new().run_program(&program, Value::Int(0)) {
        Err(RunError::NeedsLoop { node }) => assert_eq!(node.as_str(), "late"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(program.is_async());
    assert!(!program_of(node("a", add(1))).is_async());
}

#[test]
fn a_cancelled_run_stops_its_branches_and_ends() {
    let expr = async_node("never", |_| std::future::pending()) | add_later("other", 1);
    let program = program_of(expr);
    let test_loop = TestLoop::new();
    let (task, settled) = Executor::new().start(
        &program,
        Value::Int(0),
        Arc::new(LoopSide(Arc::clone(&test_loop))) as Arc<dyn Tasks>,
    );
    task.cancel();
    test_loop.add(task);
    test_loop.run_until(&settled);
    match settled.take().unwrap().unwrap() {
        Err(RunError::Interrupted) => {}
        other => panic!("expected the run stopped, got {other:?}"),
    }
}

#[test]
fn a_plain_closure_node_is_not_async() {
    let program = program_of(node("a", plain(|_: &str, x: &Value| Ok(x.clone()))));
    assert!(!program.is_async());
}

// ---------------------------------------------------------------------------------------------
// Steps found whole in the cache

/// `parts` (sync: a list of `n` items) `>> each("m", async +1) >> switch("route", by the
/// list's length, {"long": async +10, "short": async +20})`, each node's calls counted, its
/// fingerprint its id and how often it was edited (`edits`).
struct Decided {
    program: Arc<Program>,
    calls: Arc<Mutex<Vec<String>>>,
    edits: Arc<Mutex<Vec<String>>>,
    cache: Arc<MemoryCache>,
}

impl Decided {
    fn new() -> Decided {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let counted = |id: &'static str, k: i64| {
            let calls = Arc::clone(&calls);
            async_node(id, move |x: &Value| {
                calls.lock().unwrap().push(id.to_owned());
                let x = x.as_int().unwrap_or(0);
                async move {
                    YieldOnce(false).await;
                    Ok(Value::Int(x + k))
                }
            })
        };
        let (parts_calls, selector_calls) = (Arc::clone(&calls), Arc::clone(&calls));
        let parts = node(
            "parts",
            plain(move |_: &str, n: &Value| {
                parts_calls.lock().unwrap().push("parts".to_owned());
                Ok(Value::list((0..n.as_int().unwrap_or(0)).map(Value::Int)))
            }),
        );
        let selector = plain(move |_: &str, items: &Value| {
            selector_calls.lock().unwrap().push("selector".to_owned());
            let long = matches!(items, Value::List(items) if items.len() > 2);
            Ok(Value::text(if long { "long" } else { "short" }))
        });
        let route = soma_core::switch(
            "route",
            selector,
            vec![
                ("long".to_owned(), counted("first", 10)),
                ("short".to_owned(), counted("second", 20)),
            ],
        )
        .unwrap();
        let expr = parts >> each("m", counted("plus", 1), None).unwrap() >> route;
        let edits: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&edits);
        let cache = Arc::new(MemoryCache::new(move |id| {
            let edited = seen
                .lock()
                .unwrap()
                .iter()
                .filter(|e| **e == id.as_str())
                .count();
            Some(soma_core::Key::of_value(&Value::text(format!("{id} {edited}"))).unwrap())
        }));
        Decided {
            program: program_of(expr),
            calls,
            edits,
            cache,
        }
    }

    /// Runs it on `n` with the cache, on the test loop: its result, and the nodes it called.
    fn run(&self, n: i64) -> (Value, Vec<String>) {
        let executor = Executor::new().with_cache(self.cache.clone());
        let (out, _) = run_with(&executor, &self.program, Value::Int(n));
        let called = std::mem::take(&mut *self.calls.lock().unwrap());
        (out.unwrap(), called)
    }

    fn edit(&self, id: &str) {
        self.edits.lock().unwrap().push(id.to_owned());
    }
}

fn texts(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| (*id).to_owned()).collect()
}

#[test]
fn an_async_each_and_an_async_switch_rerun_are_each_found_whole_as_one_hit_calling_nothing() {
    let decided = Decided::new();
    let (first, called) = decided.run(3);
    assert_eq!(called.len(), 1 + 3 + 1 + 1); // parts, each item, the selector, one case
    let hits = decided.cache.hits();
    assert_eq!(decided.run(3), (first, Vec::new()));
    // `parts`, then each step whole: none of the items, nor the selector or the case, looked up.
    assert_eq!(decided.cache.hits() - hits, 3);
}

#[test]
fn an_async_switch_whose_untaken_case_is_edited_calls_neither_its_selector_nor_its_case() {
    let decided = Decided::new();
    let (first, _) = decided.run(3); // the "long" case
    decided.edit("route/short/second");
    let hits = decided.cache.hits();
    // The switch is not found whole (a case it may run changed): its selector and the case it
    // takes are found on their own, and the `each` before it whole.
    assert_eq!(decided.run(3), (first.clone(), Vec::new()));
    assert_eq!(decided.cache.hits() - hits, 1 + 1 + 1 + 1);
    // Filed whole under its new key: found whole from now on.
    let hits = decided.cache.hits();
    assert_eq!(decided.run(3), (first, Vec::new()));
    assert_eq!(decided.cache.hits() - hits, 3);
    // The case it took, edited: that case runs again, and nothing else.
    decided.edit("route/long/first");
    assert_eq!(decided.run(3).1, texts(&["first"]));
}

// ---------------------------------------------------------------------------------------------
// Outputs of async nodes left unread

/// A [`MemoryCache`] that leaves each hit unread when the executor allows it, counting the
/// hits found so and the outputs then read; with `lose`, such an output cannot be read.
struct Unreadable {
    inner: Arc<MemoryCache>,
    found: Arc<AtomicUsize>,
    read: Arc<AtomicUsize>,
    lose: AtomicBool,
}

impl soma_core::NodeCache for Unreadable {
    fn fingerprint(&self, id: &soma_core::NodeId, node: &dyn Node) -> Option<soma_core::Key> {
        self.inner.fingerprint(id, node)
    }

    fn get(&self, id: &soma_core::NodeId, key: &soma_core::Key) -> Option<soma_core::Entry> {
        self.inner.get(id, key)
    }

    fn put(
        &self,
        id: &soma_core::NodeId,
        key: &soma_core::Key,
        entry: &soma_core::Entry,
        took: Duration,
    ) {
        self.inner.put(id, key, entry, took);
    }

    fn find(&self, id: &soma_core::NodeId, key: &soma_core::Key) -> Option<soma_core::Found> {
        let entry = self.inner.get(id, key)?;
        self.found.fetch_add(1, Ordering::Relaxed);
        let (read, lose) = (Arc::clone(&self.read), self.lose.load(Ordering::Relaxed));
        Some(soma_core::Found::Unread(soma_core::Unread {
            digest: entry.digest,
            read: Box::new(move || {
                read.fetch_add(1, Ordering::Relaxed);
                (!lose).then(|| entry.value.clone())
            }),
        }))
    }
}

/// A chain of nodes, async or not by `kinds`, each adding 1 and counting its calls, in a run
/// with an [`Unreadable`] store whose fingerprints change with `edit`.
struct Unread {
    program: Arc<Program>,
    calls: Arc<Mutex<Vec<String>>>,
    edits: Arc<Mutex<Vec<String>>>,
    store: Arc<Unreadable>,
}

impl Unread {
    fn new(kinds: &[(&'static str, bool)]) -> Unread {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let mut expr: Option<Expr> = None;
        for &(id, asynchronous) in kinds {
            let calls = Arc::clone(&calls);
            let next = if asynchronous {
                async_node(id, move |x: &Value| {
                    calls.lock().unwrap().push(id.to_owned());
                    let x = x.as_int().unwrap_or(0);
                    async move {
                        YieldOnce(false).await;
                        Ok(Value::Int(x + 1))
                    }
                })
            } else {
                node(
                    id,
                    plain(move |_: &str, x: &Value| {
                        calls.lock().unwrap().push(id.to_owned());
                        Ok(Value::Int(x.as_int().unwrap_or(0) + 1))
                    }),
                )
            };
            expr = Some(match expr {
                None => next,
                Some(before) => before >> next,
            });
        }
        let edits: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&edits);
        let inner = Arc::new(MemoryCache::new(move |id| {
            let edited = seen
                .lock()
                .unwrap()
                .iter()
                .filter(|e| **e == id.as_str())
                .count();
            Some(soma_core::Key::of_value(&Value::text(format!("{id} {edited}"))).unwrap())
        }));
        Unread {
            program: program_of(expr.expect("a node")),
            calls,
            edits,
            store: Arc::new(Unreadable {
                inner,
                found: Arc::new(AtomicUsize::new(0)),
                read: Arc::new(AtomicUsize::new(0)),
                lose: AtomicBool::new(false),
            }),
        }
    }

    /// Runs it on 0: its result and the nodes it called; the hits found unread, and the
    /// outputs then read, counted from zero.
    fn run(&self) -> (Value, Vec<String>) {
        self.store.found.store(0, Ordering::Relaxed);
        self.store.read.store(0, Ordering::Relaxed);
        let executor = Executor::new().with_cache(self.store.clone());
        let (out, _) = run_with(&executor, &self.program, Value::Int(0));
        let called = std::mem::take(&mut *self.calls.lock().unwrap());
        (out.unwrap(), called)
    }

    fn edit(&self, id: &str) {
        self.edits.lock().unwrap().push(id.to_owned());
    }

    fn counted(&self) -> (usize, usize) {
        (
            self.store.found.load(Ordering::Relaxed),
            self.store.read.load(Ordering::Relaxed),
        )
    }
}

#[test]
fn a_fully_cached_rerun_leaves_unread_what_async_nodes_computed_for_async_nodes_that_hit() {
    let chain = Unread::new(&[("a", true), ("b", true), ("c", true)]);
    assert_eq!(chain.run(), (Value::Int(3), texts(&["a", "b", "c"])));
    assert_eq!(chain.run(), (Value::Int(3), Vec::new()));
    // `a` and `b` found unread and never read; `c`, the result, read when found.
    assert_eq!(chain.counted(), (2, 0));
    // `c` edited: it runs, and reads `b`'s output, and no other.
    chain.edit("c");
    assert_eq!(chain.run(), (Value::Int(3), texts(&["c"])));
    assert_eq!(chain.counted(), (2, 1));
}

#[test]
fn an_async_nodes_output_lost_before_it_is_read_is_computed_again_by_awaiting_its_node() {
    let chain = Unread::new(&[("a", true), ("b", true), ("c", true)]);
    chain.run();
    chain.edit("c");
    chain.store.lose.store(true, Ordering::Relaxed);
    // `c` runs and reads `b`'s output, lost: `b` is awaited again, on `a`'s, lost too.
    assert_eq!(chain.run(), (Value::Int(3), texts(&["a", "b", "c"])));
    chain.store.lose.store(false, Ordering::Relaxed);
    assert_eq!(chain.run(), (Value::Int(3), Vec::new()));
}

#[test]
fn an_async_nodes_output_a_sync_node_reads_is_read_when_found() {
    let chain = Unread::new(&[("a", true), ("b", false), ("c", true)]);
    chain.run();
    chain.edit("b");
    chain.store.lose.store(true, Ordering::Relaxed);
    // `b`, sync, could not await `a` should its output be lost: `a`'s is read when found, and
    // so is `b`'s, read from it; `b` runs on it, and `c` hits on its same output.
    assert_eq!(chain.run(), (Value::Int(3), texts(&["b"])));
    assert_eq!(chain.counted(), (0, 0));
}
