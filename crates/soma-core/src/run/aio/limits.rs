//! How many items of a stream each node works on at once, when a stream's items are runs of
//! their own on the loop ([`crate::Flow`]): the stream's stages, without threads.
//!
//! A stream of sync nodes gives each node a stage with as many workers as its concurrency
//! (`run/stream/`), so a node sees one item at a time unless it allows more. A stream of a
//! program with async nodes runs each item as a task walking the whole plan, and holds the same
//! promise with a permit per node instead: an async node's step, and a step that decides, waits
//! for one of its own node's permits (as many as its concurrency); a piece of sync work, for one
//! of the piece's, as many as its least concurrent node allows. Waiters are served in the order
//! they came, so items pass a node in about the order they were read. Only the program's own
//! steps are limited: what a step that decides runs inside is not, as it is not a stage.
//!
//! **The default** ([`Limits::new`] asks the stream's settings only for what they name): a
//! step that awaits — an async node's, or a step that decides holding one — takes as many items
//! at once as the stream holds (`in_flight`): what it waits for is I/O elsewhere, and one at a
//! time would make a stream of requests no faster than a loop over them. A sync node keeps one,
//! as in a stream of sync nodes: it holds a thread while it works, and may keep state between
//! items. A node given a concurrency (1 included) keeps what it was given.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use crate::run::program::{Op, Program};

/// A count of permits, handed out in the order they were asked for.
pub(crate) struct Permits {
    state: Mutex<PermitState>,
}

struct PermitState {
    free: usize,
    /// Who waits, by ticket, first come first served.
    waiting: VecDeque<(u64, Waker)>,
    next_ticket: u64,
}

impl Permits {
    fn new(count: usize) -> Arc<Self> {
        Arc::new(Permits {
            state: Mutex::new(PermitState {
                free: count.max(1),
                waiting: VecDeque::new(),
                next_ticket: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PermitState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a permit; it is given back when what this returns is dropped.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Permit {
        Acquiring {
            permits: Arc::clone(self),
            ticket: None,
        }
        .await
    }
}

/// A permit held; given back, and the next waiter woken, when dropped.
pub(crate) struct Permit {
    permits: Arc<Permits>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let next = {
            let mut state = self.permits.lock();
            state.free += 1;
            state.waiting.front().map(|(_, waker)| waker.clone())
        };
        if let Some(waker) = next {
            waker.wake();
        }
    }
}

/// A wait for a permit: served when it is first in line and one is free.
struct Acquiring {
    permits: Arc<Permits>,
    ticket: Option<u64>,
}

impl Future for Acquiring {
    type Output = Permit;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        let permits = Arc::clone(&self.permits);
        let mut state = permits.lock();
        let ticket = if let Some(ticket) = self.ticket {
            ticket
        } else {
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.waiting.push_back((ticket, cx.waker().clone()));
            self.ticket = Some(ticket);
            ticket
        };
        let first = state.waiting.front().is_some_and(|(at, _)| *at == ticket);
        if first && state.free > 0 {
            state.free -= 1;
            state.waiting.pop_front();
            // The next in line may be served too, if a permit is left.
            let next = (state.free > 0)
                .then(|| state.waiting.front().map(|(_, waker)| waker.clone()))
                .flatten();
            drop(state);
            self.ticket = None;
            if let Some(waker) = next {
                waker.wake();
            }
            return Poll::Ready(Permit {
                permits: Arc::clone(&self.permits),
            });
        }
        if let Some(entry) = state.waiting.iter_mut().find(|(at, _)| *at == ticket) {
            entry.1.clone_from(cx.waker());
        }
        Poll::Pending
    }
}

impl Drop for Acquiring {
    /// A wait given up (its task cancelled) leaves the line, and lets the next one try.
    fn drop(&mut self) {
        let Some(ticket) = self.ticket else {
            return;
        };
        let next = {
            let mut state = self.permits.lock();
            let was_first = state.waiting.front().is_some_and(|(at, _)| *at == ticket);
            state.waiting.retain(|(at, _)| *at != ticket);
            was_first
                .then(|| state.waiting.front().map(|(_, waker)| waker.clone()))
                .flatten()
        };
        if let Some(waker) = next {
            waker.wake();
        }
    }
}

/// The permits of one stream: by slot of its program for each step, and for each piece of
/// sync work by the slots it covers.
pub(crate) struct Limits {
    /// Each step's concurrency, by slot.
    concurrency: Box<[usize]>,
    steps: Box<[Arc<Permits>]>,
    pieces: Mutex<HashMap<(usize, usize), Arc<Permits>>>,
}

impl Limits {
    /// The limits of a stream of `program` that holds `in_flight` items at once, each node
    /// working on `given(slot)` items at once where that says, else by the default of the
    /// module's header: `in_flight` for a step that awaits, 1 for any other.
    pub(crate) fn new(
        program: &Program,
        in_flight: usize,
        given: impl Fn(usize) -> Option<usize>,
    ) -> Self {
        let awaits = awaiting_slots(program);
        let concurrency: Box<[usize]> = (0..program.len())
            .map(|slot| {
                given(slot)
                    .unwrap_or(if awaits[slot] { in_flight } else { 1 })
                    .max(1)
            })
            .collect();
        Limits {
            steps: concurrency
                .iter()
                .map(|&count| Permits::new(count))
                .collect(),
            concurrency,
            pieces: Mutex::new(HashMap::new()),
        }
    }

    /// The permits of the step in `slot`.
    pub(crate) fn step(&self, slot: usize) -> &Arc<Permits> {
        &self.steps[slot]
    }

    /// The permits of the piece covering `slots`: as many as its least concurrent node allows.
    /// `None` for a piece with no step.
    pub(crate) fn piece(&self, slots: std::ops::Range<usize>) -> Option<Arc<Permits>> {
        let least = self.concurrency[slots.clone()].iter().copied().min()?;
        let mut pieces = self.pieces.lock().unwrap_or_else(PoisonError::into_inner);
        Some(Arc::clone(
            pieces
                .entry((slots.start, slots.end))
                .or_insert_with(|| Permits::new(least)),
        ))
    }
}

/// Which of `program`'s own slots hold a step that awaits: an async node's, or a `Map`,
/// `Switch` or `Loop` step holding one ([`Op::is_async`]). A sub-program's steps number slots of
/// their own, not looked at; no recursion.
fn awaiting_slots(program: &Program) -> Vec<bool> {
    let mut awaits = vec![false; program.len()];
    let mut pending = vec![&program.root];
    while let Some(op) = pending.pop() {
        match op {
            Op::Empty => {}
            Op::Execute(step) => awaits[step.slot()] = step.is_async(),
            Op::Map(map) => awaits[map.step.slot()] = map.asynchronous,
            Op::Switch(switch) => awaits[switch.step.slot()] = switch.asynchronous,
            Op::Loop(repeat) => awaits[repeat.step.slot()] = repeat.asynchronous,
            Op::Sequence {
                steps: children, ..
            }
            | Op::Wave {
                branches: children, ..
            } => pending.extend(children.iter()),
        }
    }
    awaits
}

/// The slots `ops` number, in a program (a sub-program's are its own): contiguous, in plan
/// order; empty when they hold no step. Found from the first and the last step, down the first
/// and the last child, with no recursion.
pub(crate) fn slots_of(ops: &[Op]) -> std::ops::Range<usize> {
    let first = ops.iter().find_map(|op| edge_slot(op, Edge::First));
    let last = ops.iter().rev().find_map(|op| edge_slot(op, Edge::Last));
    match (first, last) {
        (Some(first), Some(last)) => first..last + 1,
        _ => 0..0,
    }
}

#[derive(Clone, Copy)]
enum Edge {
    First,
    Last,
}

/// The first (or last) slot `op` numbers, if it numbers any.
fn edge_slot(op: &Op, edge: Edge) -> Option<usize> {
    let mut pending = vec![op];
    while let Some(op) = pending.pop() {
        match op {
            Op::Empty => {}
            Op::Execute(step) => return Some(step.slot()),
            Op::Map(map) => return Some(map.step.slot()),
            Op::Switch(switch) => return Some(switch.step.slot()),
            Op::Loop(repeat) => return Some(repeat.step.slot()),
            Op::Sequence {
                steps: children, ..
            }
            | Op::Wave {
                branches: children, ..
            } => {
                // Pushed so that the edge child is looked at first, then its neighbours (an
                // empty child numbers nothing).
                match edge {
                    Edge::First => pending.extend(children.iter().rev()),
                    Edge::Last => pending.extend(children.iter()),
                }
            }
        }
    }
    None
}
