//! Invariants of every plan, checked over the battery of named topologies and over hundreds of
//! random DAGs — including the ones the DSL cannot write — and the oracle: a graph written with
//! `>>` and `|` compiles to the very tree that was written.
//!
//! Random cases come from a fixed seed so a failure reproduces; nothing is persisted.

use std::collections::HashMap;
use std::sync::Arc;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use soma_core::{compile, decompose, Executor, Graph, Node, Plan, Value};

use crate::random_graphs::random_dag;
use crate::support::{
    battery, catalog_of, flat_plan, logged, n, seq, trace, wave, Log, Phase, Trace,
};

type Path = Vec<(&'static str, usize)>;

/// Where each `Execute` sits: for every enclosing `Sequence` or `Wave`, its kind and which
/// child leads to the step.
fn locate(plan: &Plan) -> Vec<(String, Path)> {
    fn walk(plan: &Plan, at: &mut Path, out: &mut Vec<(String, Path)>) {
        match plan {
            Plan::Empty => {}
            // A decision's sub-plans run on tables of their own: the step stands for them.
            Plan::Execute { node, .. }
            | Plan::Map { node, .. }
            | Plan::Switch { node, .. }
            | Plan::Loop { node, .. } => out.push((node.to_string(), at.clone())),
            Plan::Sequence(children) | Plan::Wave(children) => {
                for (i, child) in children.iter().enumerate() {
                    at.push((plan.kind(), i));
                    walk(child, at, out);
                    at.pop();
                }
            }
            Plan::Remote { inner, .. } => {
                at.push(("Remote", 0));
                walk(inner, at, out);
                at.pop();
            }
        }
    }
    let mut out = Vec::new();
    walk(plan, &mut Vec::new(), &mut out);
    out
}

fn each_node_once(graph: &Graph, plan: &Plan) -> Result<(), String> {
    let mut count: HashMap<String, usize> = HashMap::new();
    for (node, _) in plan.steps() {
        *count.entry(node.to_string()).or_default() += 1;
    }
    for id in graph.nodes() {
        match count.remove(id.as_str()) {
            Some(1) => {}
            Some(k) => return Err(format!("`{id}` executes {k} times in {}", plan.compact())),
            None => return Err(format!("`{id}` is left out of {}", plan.compact())),
        }
    }
    match count.keys().next() {
        Some(stranger) => Err(format!(
            "`{stranger}` is not in the graph but in {}",
            plan.compact()
        )),
        None => Ok(()),
    }
}

/// An edge `u -> v` is respected when the innermost node of the tree holding both is a
/// `Sequence` that takes `u`'s side first; a `Wave` there would launch `v` without waiting.
fn respects_every_edge(graph: &Graph, plan: &Plan) -> Result<(), String> {
    let at: HashMap<String, Path> = locate(plan).into_iter().collect();
    for (from, to) in graph.edges() {
        let (Some(u), Some(v)) = (at.get(from.as_str()), at.get(to.as_str())) else {
            return Err(format!(
                "`{from}` -> `{to}` has an end missing from {}",
                plan.compact()
            ));
        };
        let split = u.iter().zip(v).position(|(a, b)| a != b);
        match split.map(|i| (u[i], v[i])) {
            Some((("Sequence", i), (_, j))) if i < j => {}
            _ => {
                return Err(format!(
                    "`{from}` -> `{to}` is not respected by {}",
                    plan.compact()
                ))
            }
        }
    }
    Ok(())
}

fn declares_exactly_its_predecessors(graph: &Graph, plan: &Plan) -> Result<(), String> {
    for (node, from) in plan.steps() {
        let expected = graph
            .predecessors(node.as_str())
            .map_err(|e| e.to_string())?;
        if from.iter().ne(expected.iter().copied()) {
            return Err(format!(
                "`{node}` reads {from:?}, the graph says {expected:?}"
            ));
        }
    }
    Ok(())
}

fn branches_share_no_node(plan: &Plan) -> Result<(), String> {
    match plan {
        Plan::Empty
        | Plan::Execute { .. }
        | Plan::Map { .. }
        | Plan::Switch { .. }
        | Plan::Loop { .. } => Ok(()),
        Plan::Sequence(children) => children.iter().try_for_each(branches_share_no_node),
        Plan::Remote { inner, .. } => branches_share_no_node(inner),
        Plan::Wave(branches) => {
            let mut owner: HashMap<String, usize> = HashMap::new();
            for (i, branch) in branches.iter().enumerate() {
                for (node, _) in branch.steps() {
                    if let Some(j) = owner.insert(node.to_string(), i) {
                        return Err(format!(
                            "`{node}` is in branches {j} and {i} of {}",
                            plan.compact()
                        ));
                    }
                }
            }
            branches.iter().try_for_each(branches_share_no_node)
        }
    }
}

/// The same topology, rebuilt node by node and edge by edge in the same order.
fn rebuilt(graph: &Graph) -> Graph {
    let mut copy = Graph::new();
    for id in graph.nodes() {
        copy.add_node(id.clone()).unwrap();
    }
    for (from, to) in graph.edges() {
        copy.add_edge(from.as_str(), to.as_str()).unwrap();
    }
    copy
}

fn compiles_the_same(graph: &Graph) -> Result<(), String> {
    let first = decompose(graph);
    if decompose(graph) != first {
        return Err(format!("two compilations differ for {graph:?}"));
    }
    if decompose(&rebuilt(graph)) != first {
        return Err(format!("a rebuilt copy compiles differently for {graph:?}"));
    }
    Ok(())
}

/// Runs `graph`'s compiled plan with every node logged, and its walk in a row with the same
/// nodes, for what really happened on the threads and what came out of each.
fn really_run(graph: &Graph) -> Result<(Arc<Log>, Value, Value), String> {
    let log = Log::new();
    let catalog = catalog_of(graph, &(Arc::new(logged(&log, trace)) as Arc<dyn Node>));
    let plan = compile(graph, &catalog).map_err(|e| e.to_string())?;
    let spread = Executor::new()
        .run(&plan, &catalog, Value::text("x"))
        .map_err(|e| e.to_string())?;
    let quiet = catalog_of(graph, &(Arc::new(Trace) as Arc<dyn Node>));
    let in_a_row = Executor::new()
        .run(&flat_plan(graph), &quiet, Value::text("x"))
        .map_err(|e| e.to_string())?;
    Ok((log, spread, in_a_row))
}

fn really_runs_each_node_once(graph: &Graph) -> Result<(), String> {
    let (log, _, _) = really_run(graph)?;
    for id in graph.nodes() {
        if log.starts(id.as_str()) != 1 {
            return Err(format!("`{id}` ran {} times", log.starts(id.as_str())));
        }
    }
    Ok(())
}

fn really_runs_in_an_order_that_respects_every_edge(graph: &Graph) -> Result<(), String> {
    let (log, _, _) = really_run(graph)?;
    for (from, to) in graph.edges() {
        let ended = log.position(from.as_str(), Phase::End);
        let started = log.position(to.as_str(), Phase::Start);
        if !matches!((ended, started), (Some(e), Some(s)) if e < s) {
            return Err(format!("`{to}` started before `{from}` ended"));
        }
    }
    Ok(())
}

fn gives_the_same_result_as_in_a_row(graph: &Graph) -> Result<(), String> {
    let (_, spread, in_a_row) = really_run(graph)?;
    if by_key(&spread) == by_key(&in_a_row) {
        Ok(())
    } else {
        Err(format!("spread {spread:?}, in a row {in_a_row:?}"))
    }
}

/// A result with its leaves sorted by id: a run returns them in *its plan's* step order, and a
/// walk in a row takes its steps in another.
fn by_key(value: &Value) -> Value {
    match value.as_map() {
        Some(pairs) => {
            let mut pairs = pairs.to_vec();
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Map(pairs.into())
        }
        None => value.clone(),
    }
}

fn over_the_battery(check: impl Fn(&Graph) -> Result<(), String>) {
    for (name, graph) in battery() {
        if let Err(why) = check(&graph) {
            panic!("{name}: {why}");
        }
    }
}

#[test]
fn no_node_executes_twice_or_is_left_out() {
    over_the_battery(|graph| each_node_once(graph, &decompose(graph)));
}

#[test]
fn no_node_really_runs_twice_or_is_left_out() {
    over_the_battery(really_runs_each_node_once);
}

#[test]
fn the_real_order_respects_every_edge() {
    over_the_battery(really_runs_in_an_order_that_respects_every_edge);
}

#[test]
fn every_graph_gives_the_same_result_spread_out_as_in_a_row() {
    over_the_battery(gives_the_same_result_as_in_a_row);
}

#[test]
fn the_plans_order_respects_every_edge() {
    over_the_battery(|graph| respects_every_edge(graph, &decompose(graph)));
}

#[test]
fn every_step_declares_exactly_its_graph_predecessors_in_edge_declaration_order() {
    over_the_battery(|graph| declares_exactly_its_predecessors(graph, &decompose(graph)));
}

#[test]
fn a_waves_branches_share_no_node() {
    over_the_battery(|graph| branches_share_no_node(&decompose(graph)));
}

#[test]
fn the_same_graph_always_compiles_the_same() {
    over_the_battery(compiles_the_same);
}

#[test]
fn the_battery_has_waves_and_walks_to_check() {
    // The invariants above would pass vacuously over a battery without waves.
    let plans: Vec<Plan> = battery().iter().map(|(_, g)| decompose(g)).collect();
    let shapes: Vec<String> = plans.iter().map(Plan::shape).collect();
    assert!(
        shapes.iter().filter(|p| p.contains("Wave")).count() >= 6,
        "{shapes:?}"
    );
    assert!(
        shapes.iter().any(|p| p.contains("Wave([Sequence")),
        "{shapes:?}"
    );
    assert!(
        plans.iter().filter(|p| has_a_walk(p)).count() >= 3,
        "{shapes:?}"
    );
}

fn config() -> Config {
    Config {
        cases: 512,
        rng_seed: RngSeed::Fixed(0x50_4D_41),
        failure_persistence: None,
        ..Config::default()
    }
}

/// An expression of the DSL, kept as a tree so the expected plan can be derived from it.
#[derive(Clone, Debug)]
enum Expr {
    Node(String),
    Series(Vec<Expr>),
    Parallel(Vec<Expr>),
}

fn l(id: &str) -> Expr {
    Expr::Node(id.to_owned())
}

impl Expr {
    fn expr(&self) -> soma_core::Expr {
        match self {
            Expr::Node(id) => n(id),
            Expr::Series(parts) => parts.iter().map(Expr::expr).reduce(|a, b| a >> b).unwrap(),
            Expr::Parallel(parts) => parts.iter().map(Expr::expr).reduce(|a, b| a | b).unwrap(),
        }
    }

    /// The plan this expression means, derived from the expression alone: nested series flatten
    /// into one `Sequence`, nested parallels into one `Wave`, in declaration order, and a node
    /// reads the terminals of the part before it in its series.
    fn expected(&self, reads: &[String]) -> (Plan, Vec<String>, Vec<String>) {
        match self {
            Expr::Node(id) => (
                Plan::Execute {
                    node: id.as_str().into(),
                    from: reads.iter().map(|r| r.as_str().into()).collect(),
                },
                vec![id.clone()],
                vec![id.clone()],
            ),
            Expr::Series(parts) => {
                let mut steps = Vec::new();
                let mut heads = None;
                let mut terminals = reads.to_vec();
                for part in parts {
                    let (mut plan, part_heads, part_terminals) = part.expected(&terminals);
                    heads.get_or_insert(part_heads);
                    terminals = part_terminals;
                    // `Plan` has a `Drop` of its own, so its steps are moved out of it rather
                    // than matched out by value.
                    match &mut plan {
                        Plan::Sequence(inner) => steps.append(inner),
                        _ => steps.push(plan),
                    }
                }
                (seq(steps), heads.unwrap_or_default(), terminals)
            }
            Expr::Parallel(parts) => {
                let (mut branches, mut heads, mut terminals) = (Vec::new(), Vec::new(), Vec::new());
                for part in parts {
                    let (mut plan, part_heads, part_terminals) = part.expected(reads);
                    heads.extend(part_heads);
                    terminals.extend(part_terminals);
                    match &mut plan {
                        Plan::Wave(inner) => branches.append(inner),
                        _ => branches.push(plan),
                    }
                }
                (wave(branches), heads, terminals)
            }
        }
    }

    fn plan(&self) -> Plan {
        self.expected(&[]).0
    }
}

/// The shape of an expression; its nodes are named afterwards, left to right.
#[derive(Clone, Debug)]
enum Shape {
    Leaf,
    Series(Vec<Shape>),
    Parallel(Vec<Shape>),
}

impl Shape {
    fn named(&self, next: &mut usize) -> Expr {
        match self {
            Shape::Leaf => {
                *next += 1;
                Expr::Node(format!("n{next}"))
            }
            Shape::Series(parts) => Expr::Series(parts.iter().map(|p| p.named(next)).collect()),
            Shape::Parallel(parts) => Expr::Parallel(parts.iter().map(|p| p.named(next)).collect()),
        }
    }
}

fn random_expr() -> impl Strategy<Value = Expr> {
    Just(Shape::Leaf)
        .prop_recursive(5, 40, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 2..=4).prop_map(Shape::Series),
                vec(inner, 2..=4).prop_map(Shape::Parallel),
            ]
        })
        .prop_map(|shape| shape.named(&mut 0))
}

fn compiled(expr: &Expr) -> (Graph, Plan) {
    let (graph, catalog) = expr.expr().somatize().expect("fresh, valid ids");
    let plan = compile(&graph, &catalog).expect("every node is implemented");
    (graph, plan)
}

#[test]
fn written_expressions_compile_to_the_tree_that_was_written() {
    let s = Expr::Series;
    let p = Expr::Parallel;
    let written = [
        l("a"),
        s(vec![l("a"), l("b"), l("c")]),
        s(vec![l("a"), p(vec![l("b"), l("c")]), l("d")]),
        s(vec![
            l("a"),
            p(vec![
                s(vec![l("b"), l("b2"), l("b3")]),
                s(vec![l("c"), l("c2")]),
            ]),
            l("d"),
        ]),
        s(vec![
            p(vec![s(vec![l("a"), l("a2")]), l("b")]),
            p(vec![l("c"), l("d")]),
        ]),
        s(vec![p(vec![l("a"), l("b")]), p(vec![l("c"), l("d")])]),
        s(vec![
            l("a"),
            p(vec![
                s(vec![l("b"), p(vec![l("c"), l("d")]), l("e")]),
                l("f"),
            ]),
            l("g"),
        ]),
        p(vec![
            s(vec![l("a"), l("b")]),
            s(vec![l("c"), l("d")]),
            l("e"),
        ]),
    ];
    for expr in &written {
        assert_eq!(compiled(expr).1, expr.plan(), "{expr:?}");
    }
}

#[test]
fn nested_series_and_parallels_flatten_in_the_expected_plan() {
    // The oracle itself: `(a >> b) >> c` is one sequence and `(a | b) | c` one wave.
    let s = Expr::Series;
    let p = Expr::Parallel;
    assert_eq!(
        s(vec![s(vec![l("a"), l("b")]), l("c")]).plan().shape(),
        "Sequence([Execute, Execute, Execute])"
    );
    assert_eq!(
        p(vec![p(vec![l("a"), l("b")]), l("c")]).plan().shape(),
        "Wave([Execute, Execute, Execute])"
    );
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn no_node_of_a_random_graph_executes_twice_or_is_left_out(dag in random_dag()) {
        let graph = dag.graph();
        prop_assert_eq!(each_node_once(&graph, &decompose(&graph)), Ok(()));
    }

    #[test]
    fn the_plan_of_a_random_graph_respects_every_edge(dag in random_dag()) {
        let graph = dag.graph();
        prop_assert_eq!(respects_every_edge(&graph, &decompose(&graph)), Ok(()));
    }

    #[test]
    fn every_step_of_a_random_graph_declares_exactly_its_predecessors(dag in random_dag()) {
        let graph = dag.graph();
        prop_assert_eq!(declares_exactly_its_predecessors(&graph, &decompose(&graph)), Ok(()));
    }

    #[test]
    fn the_branches_of_a_random_graphs_waves_share_no_node(dag in random_dag()) {
        prop_assert_eq!(branches_share_no_node(&decompose(&dag.graph())), Ok(()));
    }

    #[test]
    fn a_random_graph_always_compiles_the_same(dag in random_dag()) {
        prop_assert_eq!(compiles_the_same(&dag.graph()), Ok(()));
    }

    #[test]
    fn a_random_graph_really_runs_each_node_exactly_once(dag in random_dag()) {
        prop_assert_eq!(really_runs_each_node_once(&dag.graph()), Ok(()));
    }

    #[test]
    fn the_real_order_of_a_random_graph_respects_every_edge(dag in random_dag()) {
        prop_assert_eq!(really_runs_in_an_order_that_respects_every_edge(&dag.graph()), Ok(()));
    }

    #[test]
    fn a_random_graph_gives_the_same_result_spread_out_as_in_a_row(dag in random_dag()) {
        prop_assert_eq!(gives_the_same_result_as_in_a_row(&dag.graph()), Ok(()));
    }

    #[test]
    fn a_random_expression_compiles_to_the_tree_that_was_written(expr in random_expr()) {
        prop_assert_eq!(compiled(&expr).1, expr.plan());
    }

    #[test]
    fn a_random_expression_rebuilt_with_add_edge_compiles_the_same(expr in random_expr()) {
        let (graph, plan) = compiled(&expr);
        prop_assert_eq!(decompose(&rebuilt(&graph)), plan);
    }
}

/// Whether some sequence walks two nodes in a row that no edge joins — what `compile` does
/// only with a part that has no series-parallel tree, since a series cut joins them all.
fn has_a_walk(plan: &Plan) -> bool {
    match plan {
        Plan::Empty
        | Plan::Execute { .. }
        | Plan::Map { .. }
        | Plan::Switch { .. }
        | Plan::Loop { .. } => false,
        Plan::Wave(branches) => branches.iter().any(has_a_walk),
        Plan::Remote { inner, .. } => has_a_walk(inner),
        Plan::Sequence(steps) => {
            steps.iter().any(has_a_walk)
                || steps.windows(2).any(|pair| match pair {
                    [Plan::Execute { node, .. }, Plan::Execute { from, .. }] => {
                        !from.contains(node)
                    }
                    _ => false,
                })
        }
    }
}

#[test]
fn random_graphs_include_ones_the_dsl_cannot_write() {
    // Were every random DAG series-parallel, the properties above would never meet a walk.
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::new(config());
    let strategy = random_dag();
    let walked = (0..200)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current().graph())
        .filter(|graph| has_a_walk(&decompose(graph)))
        .count();
    assert!(
        walked >= 20,
        "only {walked} of 200 random graphs are not series-parallel"
    );
}
