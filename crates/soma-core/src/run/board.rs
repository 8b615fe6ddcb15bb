//! `Board`: a run's node states kept by the engine itself — one compact record per node of the
//! program, nested steps' inner nodes included: its state, its attempt, the thread it ran on and
//! its start and end marks — so that a live view of the run costs the run no call out per node.
//!
//! An [`crate::Observer`] is told each call as it begins and ends: for an embedder in Python
//! that is a call into Python twice a node, ten times what a trivial node costs. A board is
//! written instead, where a run keeps one ([`crate::Executor::with_board`]): sized once, when
//! the run is made, and written by the node's call (`run/call.rs`) with plain stores, no
//! allocation, no lock. What only the embedder has (a failure's traceback) still goes through
//! the observer, for the calls that fail only.
//!
//! A reader reads the board in bulk ([`Board::read`]): the records changed since its last read,
//! on its own thread. It is woken once per batch, never per node: the first change after a read
//! raises a flag ([`Board::changed`]) and wakes whoever waits ([`Board::wait`]); the changes
//! after it only write. The flag is read relaxed on the writer's side, so a change made in the
//! instant the reader lowers it may wait for the next change, or the run's end, to be told: a
//! reader that reads once more after the run ended has seen every change.
//!
//! Times are marks of a coarse clock: a tick, in milliseconds, that a thread of the board's own
//! advances about once a millisecond while any board's run is under way ([`RESOLUTION`]); a mark costs
//! one load where a clock read costs about 20 ns, a tenth of a trivial node. A record's seconds
//! are right to within the tick (a loaded machine may stretch the tick: the thread advancing it
//! waits to be scheduled).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use super::observer::Ended;
use super::program::{Op, Program};
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
use super::trace::thread_number;
use crate::model::device::Device;
use crate::model::id::NodeId;

/// How far apart the clock's ticks are: what a node's start and end are known to within.
pub const RESOLUTION: Duration = Duration::from_millis(1);

/// A node's state on a board.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NodeState {
    /// Not begun in this run.
    Waiting = 0,
    /// An attempt of its call is under way.
    Running = 1,
    /// Its call returned.
    Finished = 2,
    /// The run's cache answered it.
    Cached = 3,
    /// Its call failed, for the last time.
    Failed = 4,
    /// An attempt failed, and its retry will try again.
    Retrying = 5,
    /// Its call failed for time running out (its time limit, the run's deadline).
    TimedOut = 6,
    /// Its call ended without an outcome of its own: the run stopped, or a sibling failed.
    Stopped = 7,
}

impl NodeState {
    /// The state a call's attempt that ended as `ended` leaves its node in.
    pub(crate) fn after(ended: &Ended<'_>) -> Self {
        match ended {
            Ended::Returned => NodeState::Finished,
            Ended::Failed {
                retry_in: Some(_), ..
            } => NodeState::Retrying,
            Ended::Failed { error, .. } if error.timed_out() => NodeState::TimedOut,
            Ended::Failed { .. } => NodeState::Failed,
            Ended::Stopped => NodeState::Stopped,
        }
    }

    /// The state a record's byte holds.
    fn from_byte(byte: u32) -> Self {
        match byte {
            1 => NodeState::Running,
            2 => NodeState::Finished,
            3 => NodeState::Cached,
            4 => NodeState::Failed,
            5 => NodeState::Retrying,
            6 => NodeState::TimedOut,
            7 => NodeState::Stopped,
            _ => NodeState::Waiting,
        }
    }
}

/// One node's record: written by its call, read by the board's reader. Its state and attempt
/// share one word, written last, so that a reader that sees a new state sees the marks written
/// before it.
#[derive(Default)]
pub(crate) struct Record {
    /// The state in the low 8 bits, the attempt (from 0) above them.
    state: AtomicU32,
    /// The tick its last attempt began at.
    started: AtomicU32,
    /// The tick its last attempt ended at.
    ended: AtomicU32,
    /// The thread its last attempt ran on ([`this_thread`]).
    thread: AtomicU64,
}

/// A record as a reader saw it.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    state: u32,
    started: u32,
    ended: u32,
    thread: u64,
}

impl Record {
    fn seen(&self) -> Seen {
        // The state first: the marks it was written after are seen with it.
        let state = self.state.load(Ordering::Acquire);
        Seen {
            state,
            thread: self.thread.load(Ordering::Relaxed),
            started: self.started.load(Ordering::Relaxed),
            ended: self.ended.load(Ordering::Relaxed),
        }
    }
}

/// One change a reader is told: the record at `index` (in [`Board::nodes`]' order) as it is now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Change {
    /// The node's index on the board.
    pub index: usize,
    /// Its state.
    pub state: NodeState,
    /// Its last attempt, from 0.
    pub attempt: u32,
    /// The thread its last attempt ran on: its `pthread_self` where the board reads it (x86-64
    /// Linux, as Python's `threading.get_ident`), else the engine's number for it
    /// ([`crate::run::trace::thread_number`]).
    pub thread: u64,
    /// When its last attempt began, in seconds since the board was made.
    pub started: f64,
    /// When its last attempt ended, in seconds since the board was made; `None` while running.
    pub ended: Option<f64>,
}

/// A run's node states (see the module's header).
pub struct Board {
    records: Box<[Record]>,
    /// The program the board is of, for the nodes' ids (read by the reader only).
    program: Arc<Program>,
    /// Where each sub-program's records begin (an `each`'s body, a `switch`'s case, a `loop`'s
    /// body), by the sub-program's address, sorted; the root's begin at 0.
    bases: Box<[(usize, usize)]>,
    /// Raised by the first change after a read.
    changed: AtomicBool,
    /// What a reader that waits for a change waits on.
    waiting: Mutex<()>,
    woken: Condvar,
    /// What the reader saw at its last read, by record.
    seen: Mutex<Vec<Seen>>,
    /// The tick the board was made at.
    origin: u32,
    /// Whether its run is over ([`Board::finished`]).
    finished: AtomicBool,
}

impl Board {
    /// A board for a run of `program`, every node waiting. Costs a record of 16 bytes a node,
    /// zeroed, and, for a program with steps that decide, a walk of its steps.
    pub fn new(program: &Arc<Program>) -> Board {
        let mut bases = Vec::new();
        let mut count = program.len();
        if program.decides() {
            for_each_program(program, |inner, _| {
                if !std::ptr::eq(inner, Arc::as_ptr(program)) {
                    bases.push((std::ptr::from_ref(inner) as usize, count));
                    count += inner.len();
                }
            });
            bases.sort_unstable();
        }
        Board {
            records: (0..count).map(|_| Record::default()).collect(),
            program: Arc::clone(program),
            bases: bases.into(),
            changed: AtomicBool::new(false),
            waiting: Mutex::new(()),
            woken: Condvar::new(),
            seen: Mutex::new(Vec::new()),
            origin: Ticker::watch(),
            finished: AtomicBool::new(false),
        }
    }

    /// How many of the program's own nodes (not those inside its steps) are done: finished,
    /// or answered by the cache. A count of loads, for a reader that needs no more.
    pub fn done(&self) -> usize {
        self.records[..self.program.len().min(self.records.len())]
            .iter()
            .filter(|record| {
                let state = record.state.load(Ordering::Acquire) & 0xff;
                state == NodeState::Finished as u32 || state == NodeState::Cached as u32
            })
            .count()
    }

    /// The program it is of.
    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// How many nodes it holds.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Each node's id and device, by index: the program's nodes in order, then each
    /// sub-program's, as the records are laid out.
    pub fn nodes(&self) -> Vec<(NodeId, Option<Device>)> {
        let mut nodes = vec![None; self.records.len()];
        for_each_program(&self.program, |inner, steps| {
            let base = self.base(inner);
            for (slot, device) in steps {
                if let Some(node) = nodes.get_mut(base + slot) {
                    *node = Some((inner.ids[slot].clone(), device));
                }
            }
        });
        nodes
            .into_iter()
            .map(|node| node.expect("every record is a step's"))
            .collect()
    }

    /// Whether a record changed since the last read.
    pub fn changed(&self) -> bool {
        self.changed.load(Ordering::Acquire)
    }

    /// Waits at most `timeout` for a change since the last read; whether there is one.
    pub fn wait(&self, timeout: Duration) -> bool {
        let guard = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let (_guard, _) = self
            .woken
            .wait_timeout_while(guard, timeout, |()| !self.changed())
            .unwrap_or_else(PoisonError::into_inner);
        self.changed()
    }

    /// The records changed since the last read, each as it is now; lowers the flag first, so
    /// that a change made while it reads raises it again.
    pub fn read(&self) -> Vec<Change> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        self.changed.store(false, Ordering::SeqCst);
        seen.resize(self.records.len(), Seen::default());
        let mut changes = Vec::new();
        for (index, (record, seen)) in self.records.iter().zip(seen.iter_mut()).enumerate() {
            let now = record.seen();
            if now == *seen {
                continue;
            }
            *seen = now;
            let state = NodeState::from_byte(now.state & 0xff);
            let ended = match state {
                NodeState::Waiting | NodeState::Running => None,
                NodeState::Finished
                | NodeState::Cached
                | NodeState::Failed
                | NodeState::Retrying
                | NodeState::TimedOut
                | NodeState::Stopped => Some(self.seconds(now.ended)),
            };
            changes.push(Change {
                index,
                state,
                attempt: now.state >> 8,
                thread: now.thread,
                started: self.seconds(now.started),
                ended,
            });
        }
        changes
    }

    /// A tick as seconds since the board was made.
    fn seconds(&self, tick: u32) -> f64 {
        f64::from(tick.wrapping_sub(self.origin)) * RESOLUTION.as_secs_f64()
    }

    /// Where `program`'s records begin.
    fn base(&self, program: &Program) -> usize {
        if std::ptr::eq(program, Arc::as_ptr(&self.program)) {
            return 0;
        }
        let address = std::ptr::from_ref(program) as usize;
        match self.bases.binary_search_by_key(&address, |&(at, _)| at) {
            Ok(found) => self.bases[found].1,
            // Not a program of this board's: its calls land nowhere.
            Err(_) => usize::MAX,
        }
    }

    /// The record of `program`'s step at `slot`; `None` for a program not the board's.
    #[inline]
    pub(crate) fn record(&self, program: &Program, slot: usize) -> Option<&Record> {
        self.records.get(self.base(program).wrapping_add(slot))
    }

    /// Attempt `attempt` of the call of `program`'s step at `slot` begins on this thread.
    pub(crate) fn began(&self, program: &Program, slot: usize, attempt: u32) {
        if let Some(record) = self.record(program, slot) {
            self.begin(record, attempt);
        }
    }

    /// Attempt `attempt` of `record`'s call begins on this thread.
    #[inline]
    pub(crate) fn begin(&self, record: &Record, attempt: u32) {
        record.started.store(Ticker::now(), Ordering::Relaxed);
        record.thread.store(this_thread(), Ordering::Relaxed);
        self.set(record, NodeState::Running, attempt);
    }

    /// The attempt of `program`'s step at `slot` under way ended as `ended`: which attempt,
    /// and when it began (in seconds since the board was made).
    pub(crate) fn ended(&self, program: &Program, slot: usize, ended: &Ended<'_>) -> (u32, f64) {
        match self.record(program, slot) {
            Some(record) => self.end(record, NodeState::after(ended)),
            None => (0, 0.0),
        }
    }

    /// The attempt of `record`'s call under way ended, leaving it `state`: which attempt, and
    /// when it began (in seconds since the board was made).
    #[inline]
    pub(crate) fn end(&self, record: &Record, state: NodeState) -> (u32, f64) {
        record.ended.store(Ticker::now(), Ordering::Relaxed);
        let attempt = record.state.load(Ordering::Relaxed) >> 8;
        self.set(record, state, attempt);
        (
            attempt,
            self.seconds(record.started.load(Ordering::Relaxed)),
        )
    }

    /// `program`'s step at `slot` was answered by the run's cache.
    pub(crate) fn cached(&self, program: &Program, slot: usize) {
        let Some(record) = self.record(program, slot) else {
            return;
        };
        let now = Ticker::now();
        record.started.store(now, Ordering::Relaxed);
        record.ended.store(now, Ordering::Relaxed);
        self.set(record, NodeState::Cached, 0);
    }

    /// Writes `record`'s state and attempt, and raises the flag if it is not raised.
    #[inline]
    fn set(&self, record: &Record, state: NodeState, attempt: u32) {
        record
            .state
            .store(attempt << 8 | state as u32, Ordering::Release);
        if !self.changed.load(Ordering::Relaxed) {
            self.raise();
        }
    }

    /// The first change since a read: raises the flag and wakes a reader that waits.
    #[cold]
    #[inline(never)]
    fn raise(&self) {
        if !self.changed.swap(true, Ordering::SeqCst) {
            let _held = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            self.woken.notify_all();
        }
    }
}

impl Board {
    /// The run is over: the clock need not tick for the board any more (it stops when no
    /// board's run is under way). Said once; a board dropped unsaid says it then.
    pub fn finished(&self) {
        if !self.finished.swap(true, Ordering::AcqRel) {
            Ticker::unwatch();
        }
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        self.finished();
    }
}

/// The thread this runs on, as the board names it: the thread control block's own address
/// where that is one load (x86-64 Linux, where it is `pthread_self`, which Python's
/// `threading.get_ident` returns too), else the engine's number for the thread.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(clippy::inline_always)]
#[inline(always)]
fn this_thread() -> u64 {
    let this: u64;
    // SAFETY: the x86-64 TLS ABI keeps, at offset 0 of the block `fs` points to, that block's
    // own address (glibc's and musl's `pthread_self`): always mapped and readable by its thread.
    // The load writes nothing.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::asm!(
            "mov {}, qword ptr fs:[0]",
            out(reg) this,
            options(nostack, readonly, preserves_flags, pure)
        );
    }
    this
}

/// The thread this runs on, as the board names it: the engine's number for it.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn this_thread() -> u64 {
    thread_number()
}

/// Calls `visit` with `program` and each program nested in its steps (an `each`'s body, a
/// `switch`'s cases, a `loop`'s body), each with its steps' slots and devices; with a stack of
/// its own, however deep they nest.
fn for_each_program(
    program: &Program,
    mut visit: impl FnMut(&Program, Vec<(usize, Option<Device>)>),
) {
    let mut programs = vec![program];
    while let Some(program) = programs.pop() {
        let mut steps = Vec::new();
        let mut ops = vec![&program.root];
        while let Some(op) = ops.pop() {
            match op {
                Op::Empty => {}
                Op::Execute(step) => steps.push((step.slot(), step.device)),
                Op::Sequence { steps: inner, .. }
                | Op::Wave {
                    branches: inner, ..
                } => {
                    ops.extend(inner.iter());
                }
                Op::Map(map) => {
                    steps.push((map.step.slot(), map.step.device));
                    programs.push(&map.body);
                }
                Op::Switch(switch) => {
                    steps.push((switch.step.slot(), switch.step.device));
                    programs.extend(switch.cases.iter());
                }
                Op::Loop(repeat) => {
                    steps.push((repeat.step.slot(), repeat.step.device));
                    programs.push(&repeat.body);
                }
            }
        }
        visit(program, steps);
    }
}

/// The coarse clock: a tick in milliseconds since the process's first board, advanced by a
/// thread of its own while any board's run is under way, parked while none is.
struct Ticker;

/// The tick, as the ticking thread last set it.
static TICK: AtomicU32 = AtomicU32::new(0);

/// How many boards are alive, and the condition the ticking thread parks on while none is.
static WATCHED: Mutex<usize> = Mutex::new(0);
static WATCHING: Condvar = Condvar::new();

impl Ticker {
    /// The tick now.
    #[inline]
    fn now() -> u32 {
        TICK.load(Ordering::Relaxed)
    }

    /// When the clock began.
    fn epoch() -> Instant {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    /// Sets the tick from the clock.
    fn advance() -> u32 {
        // Wraps after 49 days: marks are read as differences.
        #[allow(clippy::cast_possible_truncation)]
        let tick = Ticker::epoch().elapsed().as_millis() as u32;
        TICK.store(tick, Ordering::Relaxed);
        tick
    }

    /// A board is made: the clock ticks while it is alive. The tick now.
    fn watch() -> u32 {
        static THREAD: OnceLock<()> = OnceLock::new();
        *WATCHED.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        WATCHING.notify_all();
        THREAD.get_or_init(|| {
            // Without a thread the clock does not tick: marks are the board's making, a
            // record's seconds 0, and nothing else is lost.
            let _ = std::thread::Builder::new()
                .name("soma-board-clock".into())
                .spawn(Ticker::tick);
        });
        Ticker::advance()
    }

    /// A board is dropped.
    fn unwatch() {
        let mut watched = WATCHED.lock().unwrap_or_else(PoisonError::into_inner);
        *watched = watched.saturating_sub(1);
    }

    /// The ticking thread's loop: a tick a millisecond while a board is alive.
    fn tick() {
        loop {
            {
                let watched = WATCHED.lock().unwrap_or_else(PoisonError::into_inner);
                let _watched = WATCHING
                    .wait_while(watched, |watched| *watched == 0)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            Ticker::advance();
            std::thread::sleep(RESOLUTION);
        }
    }
}
