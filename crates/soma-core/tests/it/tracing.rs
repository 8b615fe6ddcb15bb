//! Traces: one span per node, with where and how it ran, and the ways to look at them.

use std::collections::HashSet;
use std::sync::Arc;

use soma_core::{
    compile, node_arc, Ctx, Driver, DriverError, Executor, Node, NodeError, Program, Transition,
    Value,
};

use crate::support::{fail, meet, n, plain, Rendezvous};

fn traced_run(
    expr: soma_core::Expr,
    input: Value,
) -> (Result<Value, soma_core::RunError>, Arc<soma_core::Trace>) {
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let trace = Arc::new(soma_core::Trace::new());
    let out = Executor::new()
        .with_trace(Arc::clone(&trace))
        .run(&plan, &catalog, input);
    (out, trace)
}

#[test]
fn a_traced_run_records_one_span_per_node() {
    let (out, trace) = traced_run(n("a") >> (n("b") | n("c")) >> n("d"), Value::Int(1));
    out.unwrap();
    let mut nodes: Vec<String> = trace.spans().iter().map(|s| s.node.to_string()).collect();
    nodes.sort();
    assert_eq!(nodes, ["a", "b", "c", "d"]);
}

#[test]
fn a_span_ends_after_it_starts_and_a_successor_starts_after_its_predecessor_ends() {
    let (out, trace) = traced_run(n("a") >> n("b") >> n("c"), Value::Int(1));
    out.unwrap();
    let spans = trace.spans();
    for span in &spans {
        assert!(span.start <= span.end, "{span:?}");
    }
    let at = |id: &str| spans.iter().find(|s| s.node == id).unwrap().clone();
    assert!(at("a").end <= at("b").start);
    assert!(at("b").end <= at("c").start);
}

#[test]
fn spans_name_the_thread_and_the_branch_each_node_ran_in() {
    let meeting = Rendezvous::new(2);
    let expr = n("a")
        >> ((node_arc("b", Arc::new(plain(meet(&meeting)))) >> n("b2"))
            | node_arc("c", Arc::new(plain(meet(&meeting)))))
        >> n("d");
    let (out, trace) = traced_run(expr, Value::Int(1));
    out.unwrap();
    let spans = trace.spans();
    let at = |id: &str| spans.iter().find(|s| s.node == id).unwrap().clone();
    assert_eq!(at("a").branch_label(), "main");
    assert_eq!(at("b").branch, [0]);
    assert_eq!(at("b2").branch, [0]);
    assert_eq!(at("c").branch, [1]);
    assert_eq!(at("d").branch_label(), "main");
    assert_eq!(
        at("b").thread,
        at("b2").thread,
        "a branch stays on its thread"
    );
    assert_ne!(at("b").thread, at("c").thread, "two branches, two threads");
}

#[test]
fn a_nested_branch_is_labelled_with_its_index_at_each_level() {
    let expr = n("a") >> ((n("b") >> (n("x") | n("y")) >> n("z")) | n("c")) >> n("d");
    let (out, trace) = traced_run(expr, Value::Int(1));
    out.unwrap();
    let spans = trace.spans();
    let label = |id: &str| spans.iter().find(|s| s.node == id).unwrap().branch_label();
    assert_eq!(label("x"), "0.0");
    assert_eq!(label("y"), "0.1");
    assert_eq!(label("z"), "0");
    assert_eq!(label("c"), "1");
}

struct AwaitsTwice;

impl Node for AwaitsTwice {
    fn forward(&self, _input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        if ctx.turn() < 2 {
            Ok(Transition::Await(vec![Value::Null]))
        } else {
            Ok(Transition::Done(Value::Int(i64::from(ctx.turn()))))
        }
    }
}

struct Echo;

impl Driver for Echo {
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError> {
        Ok(requests.to_vec())
    }
}

#[test]
fn a_span_counts_the_turns_of_an_awaiting_node() {
    let (graph, catalog) = node_arc("asker", Arc::new(AwaitsTwice)).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let trace = Arc::new(soma_core::Trace::new());
    Executor::new()
        .with_driver(Arc::new(Echo))
        .with_trace(Arc::clone(&trace))
        .run(&plan, &catalog, Value::Null)
        .unwrap();
    assert_eq!(trace.spans()[0].turns, 3);
}

#[test]
fn a_failed_node_has_a_span_that_carries_its_error() {
    let expr = n("a") >> node_arc("bad", Arc::new(plain(fail("it broke"))));
    let (out, trace) = traced_run(expr, Value::Int(1));
    assert!(out.is_err());
    let bad = trace.spans().into_iter().find(|s| s.node == "bad").unwrap();
    assert!(
        bad.error.as_deref().unwrap().contains("it broke"),
        "{bad:?}"
    );
    assert!(trace
        .spans()
        .iter()
        .find(|s| s.node == "a")
        .unwrap()
        .error
        .is_none());
}

#[test]
fn spans_of_several_runs_accumulate_until_cleared() {
    let (graph, catalog) = (n("a") >> n("b")).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let trace = Arc::new(soma_core::Trace::new());
    let executor = Executor::new().with_trace(Arc::clone(&trace));
    executor.run(&plan, &catalog, Value::Int(1)).unwrap();
    executor.run(&plan, &catalog, Value::Int(2)).unwrap();
    assert_eq!(trace.len(), 4);
    trace.clear();
    assert!(trace.is_empty());
}

#[test]
fn the_chrome_trace_has_a_named_track_per_thread_and_an_event_per_span() {
    let meeting = Rendezvous::new(2);
    let expr = node_arc("b", Arc::new(plain(meet(&meeting))))
        | node_arc("c\"quoted\\", Arc::new(plain(meet(&meeting))));
    let (out, trace) = traced_run(expr, Value::Int(1));
    out.unwrap();
    let json = trace.to_chrome();
    assert!(
        json.starts_with("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["),
        "{json}"
    );
    assert_eq!(json.matches("\"ph\":\"X\"").count(), 2);
    let threads: HashSet<u64> = trace.spans().iter().map(|s| s.thread).collect();
    assert_eq!(json.matches("\"thread_name\"").count(), threads.len());
    assert!(
        json.contains(r#""name":"c\"quoted\\""#),
        "ids are escaped: {json}"
    );
}

#[test]
fn the_summary_lists_the_slowest_node_first() {
    let trace = Arc::new(soma_core::Trace::new());
    // Runs for twice as long as the longest span before it: the slowest by construction,
    // however fast or loaded the machine.
    let before = Arc::clone(&trace);
    let slow = move |_: &str, input: &Value| {
        let start = std::time::Instant::now();
        let longest = before
            .spans()
            .iter()
            .map(soma_core::Span::duration)
            .max()
            .unwrap();
        while start.elapsed() <= 2 * longest {
            std::thread::yield_now();
        }
        Ok(input.clone())
    };
    let expr = n("quick") >> node_arc("slow", Arc::new(plain(slow))) >> n("last");
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    Executor::new()
        .with_trace(Arc::clone(&trace))
        .run(&plan, &catalog, Value::Int(1))
        .unwrap();
    let summary = trace.summary(10);
    let rows: Vec<&str> = summary.lines().collect();
    assert!(rows[0].starts_with("node"), "{summary}");
    assert!(rows[1].starts_with("slow"), "{summary}");
    assert_eq!(rows.len(), 4, "{summary}");
}

#[test]
fn the_timeline_draws_one_bar_per_span() {
    let (out, trace) = traced_run(n("a") >> (n("b") | n("c")), Value::Int(1));
    out.unwrap();
    let svg = trace.to_svg();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert_eq!(svg.matches("<g class=\"span\">").count(), 3);
    assert!(svg.trim_end().ends_with("</svg>"));
}

#[test]
fn an_executor_without_a_trace_records_nothing() {
    // The same program and plan, run traced once and then by executors without a trace: the
    // trace keeps the traced run's spans and gains none.
    let (graph, catalog) = (n("a") >> (n("b") | n("c"))).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let program = Program::new(&plan, &catalog).unwrap();
    let trace = Arc::new(soma_core::Trace::new());
    let traced = Executor::new().with_trace(Arc::clone(&trace));
    traced.run_program(&program, Value::Int(1)).unwrap();
    assert_eq!(trace.len(), 3, "the traced run recorded into the trace");
    Executor::new()
        .run_program(&program, Value::Int(1))
        .unwrap();
    Executor::new().run(&plan, &catalog, Value::Int(1)).unwrap();
    assert_eq!(trace.len(), 3, "{:?}", trace.spans());
}

#[test]
fn spans_adopted_from_a_host_are_timed_from_when_the_slice_left_on_tracks_of_their_own() {
    let (out, here) = traced_run(n("a") >> n("b"), Value::Int(1));
    out.unwrap();
    let (out, there) = traced_run(n("c") >> n("d"), Value::Int(1));
    out.unwrap();
    let host: soma_core::HostName = "gpu-box".parse().unwrap();
    let at = std::time::Duration::from_secs(5);
    here.adopt(there.spans(), &host, at);
    let spans = here.spans();
    let local: Vec<_> = spans.iter().filter(|s| s.host.is_none()).collect();
    let adopted: Vec<_> = spans.iter().filter(|s| s.host.is_some()).collect();
    assert_eq!(adopted.len(), 2);
    for (span, original) in adopted.iter().zip(there.spans()) {
        assert_eq!(span.node, original.node);
        assert_eq!(span.host.as_ref(), Some(&host));
        assert_eq!(
            (span.start, span.end),
            (original.start + at, original.end + at)
        );
        // The host's threads are another process's: none shares a track with one here.
        assert!(local.iter().all(|s| s.thread != span.thread), "{span:?}");
    }
    assert_eq!(adopted[0].thread, adopted[1].thread);
    let chrome = here.to_chrome();
    let track = format!("\"name\":\"host gpu-box, thread {}\"", adopted[0].thread);
    assert!(chrome.contains(&track), "{chrome}");
    assert!(chrome.contains("\"host\":\"gpu-box\""), "{chrome}");
}
