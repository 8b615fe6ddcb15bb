//! What the optimizations must not break: length costs no stack.

use std::sync::Arc;

use soma_core::{compile, Catalog, Executor, Graph, Node, NodeError, Program, Value};

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
