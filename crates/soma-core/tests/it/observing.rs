//! The observer: every work of a run told as it begins and ends — a run, each attempt of a
//! call, a node the cache answered, each part of a step that decides, each streamed item — its
//! end told on the thread its beginning was, every beginning ended once.

use std::sync::{Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::Duration;

use soma_core::{
    compile, compile_decided, each, node, node_arc, repeat, switch, Begun, Ended, Executor, Expr,
    Key, MemoryCache, Observer, Opened, Placement, Policies, Program, Retry, Stream,
    StreamSettings, Value,
};

use crate::support::{fail, fails_first, meet, n, plain, Rendezvous};

/// What an observer was told, as text: `begin <work>` and `end <work> <how>`, each with the
/// thread it was told on.
#[derive(Default)]
pub(crate) struct Told {
    lines: Mutex<Vec<(String, ThreadId)>>,
}

/// What a recording observer keeps from a beginning to its end: the work, and the thread.
struct Open(String, ThreadId);

fn work(begun: &Begun<'_>) -> String {
    match begun {
        Begun::Call {
            node,
            attempt,
            branch,
            awaited,
            ..
        } => {
            let awaited = if *awaited { " awaited" } else { "" };
            format!("call {node} #{attempt} {branch:?}{awaited}")
        }
        Begun::Cached { node, .. } => format!("cached {node}"),
        Begun::Part { step, part, .. } => format!("part {step}[{part}]"),
        Begun::Run { item, .. } => match item {
            Some(item) => format!("item {item}"),
            None => "run".to_string(),
        },
    }
}

fn how(ended: &Ended<'_>) -> String {
    match ended {
        Ended::Returned => "returned".to_string(),
        Ended::Failed { error, retry_in } => match retry_in {
            Some(pause) => format!("retrying in {}ms: {error}", pause.as_millis()),
            None => format!("failed: {error}"),
        },
        Ended::Stopped => "stopped".to_string(),
    }
}

impl Observer for Told {
    fn begin(&self, begun: &Begun<'_>) -> Opened {
        let work = work(begun);
        let here = thread::current().id();
        self.lines
            .lock()
            .unwrap()
            .push((format!("begin {work}"), here));
        Some(Box::new(Open(work, here)))
    }

    fn end(&self, opened: Opened, ended: &Ended<'_>) {
        let open = opened
            .expect("every beginning returned something")
            .downcast::<Open>()
            .expect("what the observer returned comes back");
        let here = thread::current().id();
        assert_eq!(open.1, here, "{} ended on another thread", open.0);
        self.lines
            .lock()
            .unwrap()
            .push((format!("end {} {}", open.0, how(ended)), here));
    }
}

impl Told {
    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .map(|(line, _)| line.clone())
            .collect()
    }

    fn thread_of(&self, line: &str) -> ThreadId {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .find(|(told, _)| told == line)
            .unwrap_or_else(|| panic!("never told `{line}`"))
            .1
    }
}

fn observed(expr: Expr, input: Value) -> (Result<Value, soma_core::RunError>, Arc<Told>) {
    let (graph, catalog, decisions) = expr.somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    let told = Arc::new(Told::default());
    let out = Executor::new()
        .with_observer(Arc::clone(&told) as Arc<dyn Observer>)
        .run(&plan, &catalog, input);
    (out, told)
}

#[test]
fn a_chain_tells_the_run_around_each_call_in_order() {
    let (out, told) = observed(n("a") >> n("b"), Value::Int(1));
    out.unwrap();
    assert_eq!(
        told.lines(),
        [
            "begin run",
            "begin call a #0 []",
            "end call a #0 [] returned",
            "begin call b #0 []",
            "end call b #0 [] returned",
            "end run returned",
        ]
    );
}

#[test]
fn a_waves_branches_are_told_on_their_own_threads_with_their_branch() {
    let meeting = Rendezvous::new(2);
    let expr = n("a")
        >> (node_arc("b", Arc::new(plain(meet(&meeting))))
            | node_arc("c", Arc::new(plain(meet(&meeting)))));
    let (out, told) = observed(expr, Value::Int(1));
    out.unwrap();
    let lines = told.lines();
    assert!(lines.contains(&"end call b #0 [0] returned".to_string()));
    assert!(lines.contains(&"end call c #0 [1] returned".to_string()));
    assert_ne!(
        told.thread_of("begin call b #0 [0]"),
        told.thread_of("begin call c #0 [1]")
    );
}

#[test]
fn a_failed_call_ends_failed_and_so_does_its_run() {
    let (out, told) = observed(n("a") >> node("bad", plain(fail("no"))), Value::Int(1));
    out.unwrap_err();
    let lines = told.lines();
    assert!(lines[lines.len() - 2].starts_with("end call bad #0 [] failed:"));
    assert!(lines[lines.len() - 1].starts_with("end run failed:"));
}

#[test]
fn each_attempt_of_a_retried_call_is_told_and_the_failed_ones_say_their_pause() {
    let flaky = node("f", plain(fails_first(2)));
    let (graph, catalog) = flaky.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let mut policies = Policies::default();
    policies.set_retry("f", Some(Retry::new(3, Duration::from_millis(1))));
    let program = Program::resolved(&plan, &catalog, &Placement::default(), &policies).unwrap();
    let told = Arc::new(Told::default());
    Executor::new()
        .with_observer(Arc::clone(&told) as Arc<dyn Observer>)
        .run_program(&program, Value::Int(1))
        .unwrap();
    let ends: Vec<String> = told
        .lines()
        .into_iter()
        .filter(|line| line.starts_with("end call"))
        .collect();
    assert_eq!(ends.len(), 3, "{ends:?}");
    assert!(
        ends[0].starts_with("end call f #0 [] retrying in "),
        "{ends:?}"
    );
    assert!(
        ends[1].starts_with("end call f #1 [] retrying in "),
        "{ends:?}"
    );
    assert_eq!(ends[2], "end call f #2 [] returned");
}

#[test]
fn each_item_case_and_iteration_is_a_part_around_its_nodes() {
    let items = each("m", n("inner"), Some(1)).unwrap();
    let (out, told) = observed(items, Value::list([Value::Int(1), Value::Int(2)]));
    out.unwrap();
    let lines = told.lines();
    for index in 0..2 {
        let begin = lines
            .iter()
            .position(|line| *line == format!("begin part m[{index}]"))
            .unwrap();
        assert_eq!(lines[begin + 1], format!("begin call m/inner #0 [{index}]"));
        assert_eq!(lines[begin + 3], format!("end part m[{index}] returned"));
    }
    let chosen = switch(
        "pick",
        plain(|_, _: &Value| Ok(Value::text("yes"))),
        vec![("yes".to_string(), n("y"))],
    )
    .unwrap();
    let (out, told) = observed(chosen, Value::Int(1));
    out.unwrap();
    assert!(told.lines().contains(&"begin part pick[yes]".to_string()));
    let counted = repeat(
        "count",
        node(
            "up",
            plain(|_, x: &Value| Ok(Value::Int(x.as_int().unwrap() + 1))),
        ),
        plain(|_, x: &Value| Ok(Value::Bool(x.as_int().unwrap() >= 2))),
        5,
    )
    .unwrap();
    let (out, told) = observed(counted, Value::Int(0));
    assert_eq!(out.unwrap(), Value::Int(2));
    let parts: Vec<String> = told
        .lines()
        .into_iter()
        .filter(|line| line.starts_with("begin part"))
        .collect();
    assert_eq!(parts, ["begin part count[0]", "begin part count[1]"]);
}

#[test]
fn a_node_the_cache_answers_is_told_cached_and_not_called() {
    let (graph, catalog) = (n("a") >> n("b")).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let cache = Arc::new(MemoryCache::new(|id| {
        Some(Key::of_bytes(id.as_str().as_bytes()))
    }));
    let told = Arc::new(Told::default());
    let executor = Executor::new()
        .with_cache(cache)
        .with_observer(Arc::clone(&told) as Arc<dyn Observer>);
    executor.run(&plan, &catalog, Value::Int(1)).unwrap();
    told.lines.lock().unwrap().clear();
    executor.run(&plan, &catalog, Value::Int(1)).unwrap();
    assert_eq!(
        told.lines(),
        [
            "begin run",
            "begin cached a",
            "end cached a returned",
            "begin cached b",
            "end cached b returned",
            "end run returned",
        ]
    );
}

#[test]
fn each_streamed_item_is_told_around_its_nodes() {
    let (graph, catalog) = (n("a") >> n("b")).somatize().unwrap();
    let program = Arc::new(Program::new(&compile(&graph, &catalog).unwrap(), &catalog).unwrap());
    let told = Arc::new(Told::default());
    let observing = ObservedAcross(Arc::clone(&told));
    let settings = StreamSettings::default()
        .with_executor(Executor::new().with_observer(Arc::new(observing) as Arc<dyn Observer>));
    let out: Vec<_> = Stream::start(program, (0..3).map(Value::Int), settings)
        .map(Result::unwrap)
        .collect();
    assert_eq!(out.len(), 3);
    let lines = told.lines();
    for item in 0..3 {
        assert!(lines.contains(&format!("begin item {item}")), "{lines:?}");
        assert!(
            lines.contains(&format!("end item {item} returned")),
            "{lines:?}"
        );
    }
    assert_eq!(
        lines
            .iter()
            .filter(|line| line.starts_with("end call"))
            .count(),
        6
    );
}

/// A recording observer whose ends may come on another thread than their beginning: a
/// streamed item ends wherever its last stage runs.
struct ObservedAcross(Arc<Told>);

impl Observer for ObservedAcross {
    fn begin(&self, begun: &Begun<'_>) -> Opened {
        let work = work(begun);
        self.0
            .lines
            .lock()
            .unwrap()
            .push((format!("begin {work}"), thread::current().id()));
        Some(Box::new(work))
    }

    fn end(&self, opened: Opened, ended: &Ended<'_>) {
        let work = opened.unwrap().downcast::<String>().unwrap();
        self.0
            .lines
            .lock()
            .unwrap()
            .push((format!("end {work} {}", how(ended)), thread::current().id()));
    }
}
