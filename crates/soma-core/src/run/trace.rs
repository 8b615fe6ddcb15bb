//! `Trace`: where a run spent its time — one span per node, with its thread and branch.
//!
//! A trace is opt-in and shared: pass one to [`crate::Executor::with_trace`] and every step of
//! the run records a [`Span`] when it ends (start, end, thread, branch, turns, error). A run
//! without a trace checks one `Option` per node and records nothing. The spans of one trace can
//! come from several runs and several threads; they are kept in the order they ended, behind a
//! lock that only traced runs ever take.
//!
//! What a trace is for is looking at it: [`Trace::to_chrome`] writes the Chrome trace-event
//! format that Perfetto and `chrome://tracing` open (one track per thread), [`Trace::summary`]
//! lists the slowest nodes, and [`Trace::to_svg`] draws a timeline.
//!
//! A slice of the run that ran on another host records its spans in a trace there; they come
//! back with its result and join this one ([`Trace::adopt`]), on tracks of their own marked with
//! the host.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::model::device::Device;
use crate::model::host::HostName;
use crate::model::id::NodeId;

/// One node's run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The node.
    pub node: NodeId,
    /// When its first turn started, since the trace was created.
    pub start: Duration,
    /// When it was done (or failed), since the trace was created.
    pub end: Duration,
    /// The thread it ran on: a number unique in this process, stable for the thread's life.
    pub thread: u64,
    /// The branch it ran in: the index of the branch in each enclosing wave, outermost first;
    /// empty outside any wave.
    pub branch: Vec<usize>,
    /// Calls to its `forward`: one, plus one per answered `Await`.
    pub turns: u32,
    /// Its error, if it failed.
    pub error: Option<String>,
    /// The device it was placed on, if any.
    pub device: Option<Device>,
    /// The host it ran on, if not this process: a span of a remote slice ([`Trace::adopt`]).
    pub host: Option<HostName>,
    /// Whether its output came from the run's cache ([`crate::Executor::with_cache`]): the
    /// node was not called, and `turns` is 0.
    pub cached: bool,
    /// For the span of an `each` item, a `switch` case or a `loop` iteration (named
    /// `step[which]`), the step's id; `None` for a node's call.
    pub part_of: Option<NodeId>,
}

impl Span {
    /// How long the node took.
    pub fn duration(&self) -> Duration {
        self.end.saturating_sub(self.start)
    }

    /// The branch as text: `main` outside any wave, else the indices joined by dots (`1.0`).
    pub fn branch_label(&self) -> String {
        if self.branch.is_empty() {
            return "main".to_string();
        }
        let parts: Vec<String> = self.branch.iter().map(ToString::to_string).collect();
        parts.join(".")
    }
}

/// What a thread is to the runs it records spans of, which names its track
/// ([`Trace::to_chrome`], the timeline): set where Soma starts a thread, and around each poll of
/// an async task; any other thread is a caller's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadRole {
    /// A thread Soma did not start that runs nodes: one that called a run, on which its first
    /// branch runs.
    Caller,
    /// A thread Soma started: a crew's (or the reserve's), or one with a deeper stack.
    Crew,
    /// A thread that polls the async walk's tasks: an event loop's.
    EventLoop,
}

thread_local! {
    static ROLE: Cell<ThreadRole> = const { Cell::new(ThreadRole::Caller) };
}

/// This thread's role now.
pub fn thread_role() -> ThreadRole {
    ROLE.with(Cell::get)
}

/// Makes `role` this thread's, and returns the one it had.
pub(crate) fn set_thread_role(role: ThreadRole) -> ThreadRole {
    ROLE.with(|cell| cell.replace(role))
}

/// Spans recorded by traced runs.
#[derive(Debug)]
pub struct Trace {
    origin: Instant,
    recorded: Mutex<Recorded>,
}

/// What a trace holds behind its lock.
#[derive(Debug, Default)]
struct Recorded {
    spans: Vec<Span>,
    /// The role of each thread a span was recorded on, as it was when its first span was.
    roles: Vec<(u64, ThreadRole)>,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD: u64 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// This thread's number in traces.
pub fn thread_number() -> u64 {
    THREAD.with(|n| *n)
}

impl Trace {
    /// An empty trace; span times count from now.
    pub fn new() -> Self {
        Trace {
            origin: Instant::now(),
            recorded: Mutex::new(Recorded::default()),
        }
    }

    /// The time since the trace was created.
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Records the spans of a slice that ran on `host`, timed from `at` (this trace's time when
    /// the slice was sent; the host's clock is not this one's) and each on a track of its own:
    /// its threads are another process's, so each gets a fresh number here.
    pub fn adopt(&self, spans: Vec<Span>, host: &HostName, at: Duration) {
        let mut threads: Vec<(u64, u64)> = Vec::new();
        let adopted: Vec<Span> = spans
            .into_iter()
            .map(|span| {
                let known = threads.iter().find(|(there, _)| *there == span.thread);
                let thread = if let Some((_, here)) = known {
                    *here
                } else {
                    let here = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
                    threads.push((span.thread, here));
                    here
                };
                Span {
                    start: at + span.start,
                    end: at + span.end,
                    thread,
                    host: Some(host.clone()),
                    ..span
                }
            })
            .collect();
        self.lock().spans.extend(adopted);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.recorded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a span; recorded on its own thread, which it is when a run records it, it also
    /// notes the thread's role, if none of its spans did yet.
    pub fn record(&self, span: Span) {
        let here = (span.thread == thread_number()).then(thread_role);
        let mut recorded = self.lock();
        if let Some(role) = here {
            if !recorded
                .roles
                .iter()
                .any(|(thread, _)| *thread == span.thread)
            {
                recorded.roles.push((span.thread, role));
            }
        }
        recorded.spans.push(span);
    }

    /// A copy of the spans, in the order they ended.
    pub fn spans(&self) -> Vec<Span> {
        self.lock().spans.clone()
    }

    /// The role of `thread` when it recorded its first span here: a caller's unless noted.
    pub fn role_of(&self, thread: u64) -> ThreadRole {
        self.lock()
            .roles
            .iter()
            .find(|(known, _)| *known == thread)
            .map_or(ThreadRole::Caller, |(_, role)| *role)
    }

    /// Number of spans.
    pub fn len(&self) -> usize {
        self.lock().spans.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every span.
    pub fn clear(&self) {
        let mut recorded = self.lock();
        recorded.spans.clear();
        recorded.roles.clear();
    }
}
