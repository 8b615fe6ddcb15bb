//! A run's board: each node's state kept by the engine as its calls begin and end — finished,
//! failed, retried, cached, a step's inner nodes, a node run again — read in bulk, each change
//! once, and the observer told of a call only when it fails.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use soma_core::{
    compile, compile_decided, each, node, node_arc, Begun, Board, Ended, Executor, Expr, Key,
    MemoryCache, NodeState, Observer, Opened, Placement, Policies, Program, Retry, Stream,
    StreamSettings, Value,
};

use crate::support::{fail, fails_first, n, plain, Rendezvous};

/// The works an observer was told, as `kind node` lines.
#[derive(Default)]
struct Told(Mutex<Vec<String>>);

impl Observer for Told {
    fn begin(&self, begun: &Begun<'_>) -> Opened {
        let line = match begun {
            Begun::Call {
                node,
                attempt,
                began,
                ..
            } => format!("call {node} #{attempt} began {}", began.is_some()),
            Begun::Cached { node, .. } => format!("cached {node}"),
            Begun::Part { step, .. } => format!("part {step}"),
            Begun::Run { .. } => "run".to_string(),
        };
        self.0.lock().unwrap().push(line);
        None
    }

    fn end(&self, _opened: Opened, _ended: &Ended<'_>) {}
}

fn program_of(expr: Expr, policies: &Policies) -> Arc<Program> {
    let (graph, catalog, decisions) = expr.somatize_decided().unwrap();
    let plan = compile_decided(&graph, &catalog, &decisions).unwrap();
    Arc::new(Program::resolved(&plan, &catalog, &Placement::default(), policies).unwrap())
}

/// Runs `program` on 1 keeping a board, told to a recording observer: the outcome, the board,
/// and what the observer was told.
fn on_board(
    program: &Arc<Program>,
    executor: Executor,
) -> (Result<Value, soma_core::RunError>, Arc<Board>, Vec<String>) {
    let board = Arc::new(Board::new(program));
    let told = Arc::new(Told::default());
    let out = executor
        .with_observer(Arc::clone(&told) as Arc<dyn Observer>)
        .with_board(Arc::clone(&board))
        .run_program(program, Value::Int(1));
    let lines = told.0.lock().unwrap().clone();
    (out, board, lines)
}

/// Runs `program` on `input` keeping a board, on a thread of its own: the board, read while
/// the run goes, and the run.
fn on_board_in_a_thread(
    program: &Arc<Program>,
    input: Value,
) -> (
    Arc<Board>,
    std::thread::JoinHandle<Result<Value, soma_core::RunError>>,
) {
    let board = Arc::new(Board::new(program));
    let running = {
        let (board, program) = (Arc::clone(&board), Arc::clone(program));
        std::thread::spawn(move || {
            Executor::new()
                .with_board(board)
                .run_program(&program, input)
        })
    };
    (board, running)
}

/// Each node's state and attempt after the changes `board` holds, by id.
fn states(board: &Board) -> Vec<(String, NodeState, u32)> {
    let nodes = board.nodes();
    let mut states: Vec<_> = board
        .read()
        .into_iter()
        .map(|change| {
            (
                nodes[change.index].0.as_str().to_string(),
                change.state,
                change.attempt,
            )
        })
        .collect();
    states.sort_by(|a, b| a.0.cmp(&b.0));
    states
}

#[test]
fn a_runs_board_holds_each_nodes_last_state_and_the_observer_hears_no_call_that_returned() {
    let program = program_of(n("a") >> (n("b") | n("c")) >> n("d"), &Policies::default());
    let (out, board, told) = on_board(&program, Executor::new());
    out.unwrap();
    assert_eq!(
        states(&board),
        [
            ("a".to_string(), NodeState::Finished, 0),
            ("b".to_string(), NodeState::Finished, 0),
            ("c".to_string(), NodeState::Finished, 0),
            ("d".to_string(), NodeState::Finished, 0),
        ]
    );
    assert_eq!(told, ["run"]);
}

#[test]
fn a_read_tells_each_change_once() {
    let program = program_of(n("a") >> n("b"), &Policies::default());
    let (out, board, _) = on_board(&program, Executor::new());
    out.unwrap();
    assert_eq!(board.read().len(), 2);
    assert!(
        board.read().is_empty(),
        "nothing changed since the last read"
    );
}

#[test]
fn a_failed_call_is_on_the_board_and_told_the_observer_with_when_it_began() {
    let program = program_of(
        n("a") >> node_arc("f", Arc::new(plain(fail("no")))),
        &Policies::default(),
    );
    let (out, board, told) = on_board(&program, Executor::new());
    assert!(out.is_err());
    let states = states(&board);
    assert_eq!(states[1], ("f".to_string(), NodeState::Failed, 0));
    assert_eq!(told, ["run", "call f #0 began true"]);
}

#[test]
fn a_retried_call_shows_its_attempt_and_each_failure_is_told() {
    let flaky = node("f", plain(fails_first(2)));
    let mut policies = Policies::default();
    policies.set_retry("f", Some(Retry::new(3, Duration::from_millis(1))));
    let program = program_of(flaky, &policies);
    let (out, board, told) = on_board(&program, Executor::new());
    out.unwrap();
    assert_eq!(states(&board), [("f".to_string(), NodeState::Finished, 2)]);
    assert_eq!(
        told,
        ["run", "call f #0 began true", "call f #1 began true"]
    );
}

#[test]
fn a_node_the_cache_answers_is_cached_on_the_board() {
    let (graph, catalog) = (n("a") >> n("b")).somatize().unwrap();
    let plan = compile(&graph, &catalog).unwrap();
    let program = Arc::new(Program::new(&plan, &catalog).unwrap());
    let cache = Arc::new(MemoryCache::new(|id| {
        Some(Key::of_bytes(id.as_str().as_bytes()))
    }));
    let executor = Executor::new().with_cache(cache);
    executor.run_program(&program, Value::Int(1)).unwrap();
    let (out, board, told) = on_board(&program, executor);
    out.unwrap();
    let cached: Vec<_> = states(&board)
        .into_iter()
        .map(|(_, state, _)| state)
        .collect();
    assert_eq!(cached, [NodeState::Cached, NodeState::Cached]);
    assert_eq!(told, ["run"]);
}

#[test]
fn an_each_steps_inner_nodes_have_records_of_their_own_after_the_programs() {
    let items = each("m", n("inner"), Some(1)).unwrap();
    let program = program_of(n("list") >> items, &Policies::default());
    let board = Board::new(&program);
    let ids: Vec<String> = board
        .nodes()
        .into_iter()
        .map(|(id, _)| id.as_str().to_string())
        .collect();
    assert_eq!(ids, ["list", "m", "m/inner"]);
}

#[test]
fn a_running_node_is_on_the_board_before_it_returns() {
    let (began, released) = (Rendezvous::new(2), Rendezvous::new(2));
    let held = {
        let (began, released) = (Arc::clone(&began), Arc::clone(&released));
        plain(move |_: &str, x: &Value| {
            assert!(began.meet(), "the test met the node as it ran");
            assert!(released.meet(), "the test let the node go");
            Ok(x.clone())
        })
    };
    let program = program_of(node_arc("held", Arc::new(held)), &Policies::default());
    let (board, running) = on_board_in_a_thread(&program, Value::Int(1));
    assert!(began.meet(), "the node began");
    let first = board.read();
    assert_eq!(first[0].state, NodeState::Running);
    assert_eq!(first[0].ended, None);
    assert!(released.meet(), "the node was let go");
    running.join().unwrap().unwrap();
    assert_eq!(board.read()[0].state, NodeState::Finished);
}

#[test]
fn a_boards_done_counts_the_programs_own_nodes_finished_or_cached() {
    let program = program_of(
        n("a") >> n("b") >> node_arc("f", Arc::new(plain(fail("no")))),
        &Policies::default(),
    );
    let (out, board, _) = on_board(&program, Executor::new());
    assert!(out.is_err());
    assert_eq!(board.done(), 2);
}

#[test]
fn a_node_run_again_by_a_loop_reads_running_never_ended_by_its_last_run() {
    let (began, released) = (Rendezvous::new(2), Rendezvous::new(2));
    let step = {
        let (began, released) = (Arc::clone(&began), Arc::clone(&released));
        plain(move |_: &str, x: &Value| {
            let x = x.as_int().unwrap_or(0);
            if x == 1 {
                // The second iteration: the first ended on the board a moment ago.
                assert!(began.meet(), "the test met the node's second run");
                assert!(released.meet(), "the test let the node go");
            }
            Ok(Value::Int(x + 1))
        })
    };
    let done = plain(|_: &str, x: &Value| Ok(Value::Bool(x.as_int() >= Some(2))));
    let program = program_of(
        soma_core::repeat("l", node("step", step), done, 10).unwrap(),
        &Policies::default(),
    );
    let (board, running) = on_board_in_a_thread(&program, Value::Int(0));
    assert!(began.meet(), "the node ran again");
    let ids: Vec<String> = board
        .nodes()
        .into_iter()
        .map(|(id, _)| id.as_str().to_string())
        .collect();
    let step_at = ids.iter().position(|id| id == "l/step").unwrap();
    let seen = board.read();
    let step_seen = seen.iter().find(|change| change.index == step_at).unwrap();
    assert_eq!(step_seen.state, NodeState::Running);
    assert_eq!(step_seen.ended, None);
    assert!(released.meet(), "the node was let go");
    assert_eq!(running.join().unwrap().unwrap(), Value::Int(2));
    let last = board.read();
    let step_last = last.iter().find(|change| change.index == step_at).unwrap();
    assert_eq!(step_last.state, NodeState::Finished);
}

/// What an observer of a stream was told: the boards of the items' runs, by item, and the
/// calls told of.
#[derive(Default)]
struct ItemBoards {
    boards: Mutex<Vec<(u64, Arc<Board>)>>,
    calls: Mutex<Vec<String>>,
}

impl Observer for ItemBoards {
    fn begin(&self, begun: &Begun<'_>) -> Opened {
        match begun {
            Begun::Run {
                item: Some(item),
                board: Some(board),
                ..
            } => self.boards.lock().unwrap().push((*item, Arc::clone(board))),
            Begun::Call { node, .. } => self.calls.lock().unwrap().push(node.to_string()),
            Begun::Run { .. } | Begun::Cached { .. } | Begun::Part { .. } => {}
        }
        None
    }

    fn end(&self, _opened: Opened, _ended: &Ended<'_>) {}
}

/// A stream of `program` over `0..count` that keeps a board for each item, told to an
/// [`ItemBoards`].
fn stream_with_item_boards(
    program: &Arc<Program>,
    count: i64,
) -> (Stream<impl Iterator<Item = Value>>, Arc<ItemBoards>) {
    let told = Arc::new(ItemBoards::default());
    let executor = Executor::new()
        .with_observer(Arc::clone(&told) as Arc<dyn Observer>)
        .with_item_boards();
    let settings = StreamSettings::default().with_executor(executor);
    let stream = Stream::start(Arc::clone(program), (0..count).map(Value::Int), settings);
    (stream, told)
}

#[test]
fn each_streamed_items_run_keeps_a_board_of_its_own_and_tells_no_call_that_returned() {
    let program = program_of(n("a") >> n("b"), &Policies::default());
    let (stream, told) = stream_with_item_boards(&program, 3);
    assert_eq!(stream.map(Result::unwrap).count(), 3);
    let boards = told.boards.lock().unwrap();
    assert_eq!(
        boards.iter().map(|(item, _)| *item).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    for (_, board) in boards.iter() {
        assert_eq!(
            states(board),
            [
                ("a".to_string(), NodeState::Finished, 0),
                ("b".to_string(), NodeState::Finished, 0),
            ]
        );
        assert!(board.is_finished());
    }
    assert!(told.calls.lock().unwrap().is_empty());
}

#[test]
fn a_streamed_items_failed_call_is_on_its_board_and_told_the_observer() {
    let program = program_of(
        n("a") >> node_arc("fails", Arc::new(plain(fail("no")))),
        &Policies::default(),
    );
    let (stream, told) = stream_with_item_boards(&program, 1);
    let out: Vec<_> = stream.collect();
    assert!(out[0].is_err());
    let boards = told.boards.lock().unwrap();
    let [(0, board)] = &boards[..] else {
        panic!("one item's board, not {}", boards.len());
    };
    assert_eq!(
        states(board),
        [
            ("a".to_string(), NodeState::Finished, 0),
            ("fails".to_string(), NodeState::Failed, 0),
        ]
    );
    assert_eq!(*told.calls.lock().unwrap(), ["fails"]);
}

#[test]
fn a_stream_dropped_with_items_in_flight_says_each_items_run_is_over() {
    let program = program_of(n("a") >> n("b"), &Policies::default());
    let (mut stream, told) = stream_with_item_boards(&program, 1_000);
    assert!(stream.next().unwrap().is_ok());
    // Items read and not yet returned are in flight: dropping the stream drops them.
    drop(stream);
    let boards = told.boards.lock().unwrap();
    assert!(boards.len() > 1, "items in flight: {}", boards.len() - 1);
    // The clock ticks while any board's run is under way: none is left so.
    assert!(boards.iter().all(|(_, board)| board.is_finished()));
}
