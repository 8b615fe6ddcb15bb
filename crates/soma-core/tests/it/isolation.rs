//! What the optimizations must not break: a branch's thread is its own, and depth costs no stack.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use soma_core::{compile, node_arc, Catalog, Executor, Graph, Node, NodeError, Program, Value};

use crate::support::plain;

/// What each node saw in `LEFT_BEHIND` when it started.
type Sightings = Arc<Mutex<Vec<(String, Option<&'static str>)>>>;

thread_local! {
    static LEFT_BEHIND: Cell<Option<&'static str>> = const { Cell::new(None) };
}

#[test]
fn thread_local_state_set_in_a_branch_is_seen_by_no_other_branch_nor_by_the_caller() {
    let seen: Sightings = Arc::default();
    let visit = |mark: &'static str| {
        let seen = Arc::clone(&seen);
        move |id: &str, input: &Value| -> Result<Value, NodeError> {
            seen.lock()
                .unwrap()
                .push((id.to_string(), LEFT_BEHIND.with(Cell::get)));
            LEFT_BEHIND.with(|cell| cell.set(Some(mark)));
            Ok(input.clone())
        }
    };
    // Two waves in a row, so that the second one's branches would see what the first left
    // behind if threads were reused; the caller runs `a`, `m` and `z` itself.
    let expr = node_arc("a", Arc::new(plain(visit("a"))))
        >> (node_arc("b", Arc::new(plain(visit("b"))))
            | node_arc("c", Arc::new(plain(visit("c")))))
        >> node_arc("m", Arc::new(plain(visit("m"))))
        >> (node_arc("d", Arc::new(plain(visit("d"))))
            | node_arc("e", Arc::new(plain(visit("e")))))
        >> node_arc("z", Arc::new(plain(visit("z"))));
    let (graph, catalog) = expr.somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    Executor::new().run(&plan, &catalog, Value::Int(0)).unwrap();
    let seen = seen.lock().unwrap().clone();
    let found = |id: &str| seen.iter().find(|(node, _)| node == id).unwrap().1;
    for branch_head in ["b", "c", "d", "e"] {
        assert_eq!(
            found(branch_head),
            None,
            "`{branch_head}` saw another's state: {seen:?}"
        );
    }
    assert_eq!(
        found("m"),
        Some("a"),
        "the caller keeps its own state: {seen:?}"
    );
    assert_eq!(found("z"), Some("m"), "and sees no branch's: {seen:?}");
}

#[test]
fn a_million_node_chain_compiles_resolves_runs_and_drops_on_a_small_stack() {
    const LEN: usize = 1_000_000;
    let outcome = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let mut graph = Graph::new();
            let mut catalog = Catalog::new();
            let step: Arc<dyn Node> = Arc::new(|x: &Value| -> Result<Value, NodeError> {
                Ok(Value::Int(x.as_int().unwrap_or(0) + 1))
            });
            let mut previous = String::new();
            for i in 0..LEN {
                let id = format!("n{i}");
                graph.add_node(id.as_str()).unwrap();
                catalog.insert(id.as_str(), Arc::clone(&step));
                if i > 0 {
                    graph.add_edge(&previous, &id).unwrap();
                }
                previous = id;
            }
            let plan = compile(&graph, &catalog).unwrap();
            let program = Program::new(&plan, &catalog).unwrap();
            let out = Executor::new()
                .run_program(&program, Value::Int(0))
                .unwrap();
            drop((program, plan, graph, catalog));
            out
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(out_int(&outcome), i64::try_from(LEN).unwrap());
}

fn out_int(value: &Value) -> i64 {
    value.as_int().expect("an int")
}
