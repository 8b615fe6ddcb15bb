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
//! on its own thread, as often as it likes (a page, every tick): the writer neither signals nor
//! waits for it. A node's call writes three words as it begins — its end cleared, its thread,
//! its beginning (tick, attempt, state) — and one as it ends, with its tick, attempt and state:
//! a reader that sees a beginning sees the end cleared before it, so a node run again (a
//! `loop`'s next iteration) never reads as ended by its last run; a reader that reads once more
//! after the run ended has seen every change.
//!
//! Times are marks of a coarse clock: a tick, in milliseconds, that a thread of the board's own
//! advances about once a millisecond while any board's run is under way ([`RESOLUTION`]); a mark costs
//! one load where a clock read costs about 20 ns, a tenth of a trivial node. A loaded machine
//! makes the tick late (its thread waits to be scheduled), and a late tick would shorten a node
//! whose end it marks by as much: so a run's beginning and the end of a node the tick has moved
//! under read the clock itself, and set the tick from it. A node that lasted a tick or more is
//! right to within the tick at its end; at its beginning, to within how late the tick was then,
//! unless a run or a node ending had just set it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

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
    /// The state a record's byte holds.
    fn from_byte(byte: u64) -> Self {
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

/// One node's record: written by its call, read by the board's reader. Its beginning and its end
/// are each one word — the tick in the high 32 bits, the attempt in the 24 above the low byte,
/// the state in the low byte ([`mark`]) — so that each is written with one store.
#[derive(Default)]
pub(crate) struct Record {
    /// The last attempt's beginning, written last as it begins (0: not begun).
    begun: AtomicU64,
    /// Its end, cleared before its beginning is written (0: running, or not begun).
    ended: AtomicU64,
    /// The thread its last attempt ran on ([`this_thread`]).
    thread: AtomicU64,
}

/// A beginning's or an end's word: `tick`, `attempt` (its low 24 bits) and `state`.
#[inline]
fn mark(tick: u32, attempt: u32, state: NodeState) -> u64 {
    u64::from(tick) << 32 | u64::from(attempt & 0x00ff_ffff) << 8 | state as u64
}

/// A word's tick.
fn tick_of(word: u64) -> u32 {
    // The high 32 bits: the cast keeps exactly them.
    #[allow(clippy::cast_possible_truncation)]
    let tick = (word >> 32) as u32;
    tick
}

/// A word's attempt.
fn attempt_of(word: u64) -> u32 {
    // 24 bits: the cast keeps them.
    #[allow(clippy::cast_possible_truncation)]
    let attempt = (word >> 8) as u32 & 0x00ff_ffff;
    attempt
}

/// A record as a reader saw it.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    begun: u64,
    ended: u64,
    thread: u64,
}

impl Record {
    fn seen(&self) -> Seen {
        // The beginning first: an end cleared before it was written is seen cleared with it.
        // Read again until the beginning did not change meanwhile, so that an end is never
        // paired with a later attempt's beginning.
        loop {
            let begun = self.begun.load(Ordering::Acquire);
            let seen = Seen {
                begun,
                ended: self.ended.load(Ordering::Acquire),
                thread: self.thread.load(Ordering::Relaxed),
            };
            if self.begun.load(Ordering::Acquire) == begun {
                return seen;
            }
        }
    }

    /// Whether its last attempt ended as `state`.
    fn ended_as(&self, state: NodeState) -> bool {
        let ended = self.ended.load(Ordering::Acquire);
        ended != 0 && ended & 0xff == state as u64
    }
}

/// A record on a cache line of its own.
#[derive(Default)]
#[repr(align(64))]
struct Line(Record);

/// A board's records, in [`Board::nodes`]' order: side by side (24 bytes a node), for a program
/// whose steps run one at a time; each on a cache line of its own (64 bytes), for one whose
/// steps may run at once on two threads ([`Program::runs_side_by_side`]). A wave's branches,
/// which threads take one by one in turn, write neighbouring records at once, and records
/// sharing a line made each of those stores wait for the line to come back from the other
/// core: a wave of 10,000 trivial branches watched ran 5.1 to 7.6% slower than unwatched with
/// records side by side, 0.5 to 1.3% with a line each (three rounds alternated on two cores);
/// spread so that only nodes eight apart shared a line, 1.5 to 14.5%. A line each costs a
/// program run on one thread only room to zero as each board is made and lines to write: a
/// chain of 100,000 trivial nodes watched ran 17 to 20% slower than unwatched so.
enum Records {
    SideBySide(Box<[Record]>),
    LineEach(Box<[Line]>),
}

impl Records {
    /// `count` records, every node waiting; a line each when `apart`.
    fn new(count: usize, apart: bool) -> Records {
        if apart {
            Records::LineEach((0..count).map(|_| Line::default()).collect())
        } else {
            Records::SideBySide((0..count).map(|_| Record::default()).collect())
        }
    }

    /// The record at `index`.
    #[inline]
    fn get(&self, index: usize) -> Option<&Record> {
        match self {
            Records::SideBySide(records) => records.get(index),
            Records::LineEach(lines) => lines.get(index).map(|line| &line.0),
        }
    }

    /// How many it holds.
    fn len(&self) -> usize {
        match self {
            Records::SideBySide(records) => records.len(),
            Records::LineEach(lines) => lines.len(),
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
    records: Records,
    /// The program the board is of, for the nodes' ids (read by the reader only).
    program: Arc<Program>,
    /// Where each sub-program's records begin (an `each`'s body, a `switch`'s case, a `loop`'s
    /// body), by the sub-program's address, sorted; the root's begin at 0.
    bases: Box<[(usize, usize)]>,
    /// What the reader saw at its last read, by record.
    seen: Mutex<Vec<Seen>>,
    /// The tick the board was made at.
    origin: u32,
    /// Whether its run is over ([`Board::finished`]).
    finished: AtomicBool,
}

impl Board {
    /// A board for a run of `program`, every node waiting. Costs a record a node (`Records`:
    /// 24 bytes, or 64 for a program whose steps run side by side), zeroed, and, for a program
    /// with steps that decide, a walk of its steps.
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
            records: Records::new(count, program.runs_side_by_side()),
            program: Arc::clone(program),
            bases: bases.into(),
            seen: Mutex::new(Vec::new()),
            origin: Ticker::watch(),
            finished: AtomicBool::new(false),
        }
    }

    /// How many of the program's own nodes (not those inside its steps) are done: finished,
    /// or answered by the cache. A count of loads, for a reader that needs no more.
    pub fn done(&self) -> usize {
        (0..self.program.len().min(self.records.len()))
            .filter_map(|index| self.records.get(index))
            .filter(|record| {
                record.ended_as(NodeState::Finished) || record.ended_as(NodeState::Cached)
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
        self.records.len() == 0
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

    /// The records changed since the last read, each as it is now.
    pub fn read(&self) -> Vec<Change> {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.resize(self.records.len(), Seen::default());
        let mut changes = Vec::new();
        for (index, seen) in seen.iter_mut().enumerate() {
            let Some(record) = self.records.get(index) else {
                break;
            };
            let now = record.seen();
            if now == *seen {
                continue;
            }
            *seen = now;
            let (word, ended) = if now.ended == 0 {
                (now.begun, None)
            } else {
                (now.ended, Some(self.seconds(tick_of(now.ended))))
            };
            let started = if now.begun == 0 { now.ended } else { now.begun };
            changes.push(Change {
                index,
                state: NodeState::from_byte(word & 0xff),
                attempt: attempt_of(word),
                thread: now.thread,
                started: self.seconds(tick_of(started)),
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
            Board::begin(record, attempt);
        }
    }

    /// Attempt `attempt` of `record`'s call begins on this thread.
    #[inline]
    pub(crate) fn begin(record: &Record, attempt: u32) {
        record.ended.store(0, Ordering::Relaxed);
        record.thread.store(this_thread(), Ordering::Relaxed);
        record.begun.store(
            mark(Ticker::now(), attempt, NodeState::Running),
            Ordering::Release,
        );
    }

    /// The attempt of `program`'s step at `slot` under way ended, leaving it `state`: which
    /// attempt, and when it began (in seconds since the board was made).
    pub(crate) fn ended(&self, program: &Program, slot: usize, state: NodeState) -> (u32, f64) {
        match self.record(program, slot) {
            Some(record) => self.end(record, state),
            None => (0, 0.0),
        }
    }

    /// The attempt of `record`'s call under way ended, leaving it `state`: which attempt, and
    /// when it began (in seconds since the board was made).
    pub(crate) fn end(&self, record: &Record, state: NodeState) -> (u32, f64) {
        let begun = record.begun.load(Ordering::Relaxed);
        let attempt = attempt_of(begun);
        record.ended.store(
            mark(Ticker::end_of(tick_of(begun)), attempt, state),
            Ordering::Release,
        );
        (attempt, self.seconds(tick_of(begun)))
    }

    /// The first attempt of `record`'s call returned: [`Board::end`] as finished for the plain
    /// call's way, whose one attempt is its first, and which needs nothing back.
    #[inline]
    pub(crate) fn first_returned(record: &Record) {
        let begun = tick_of(record.begun.load(Ordering::Relaxed));
        record.ended.store(
            mark(Ticker::end_of(begun), 0, NodeState::Finished),
            Ordering::Release,
        );
    }

    /// `program`'s step at `slot` was answered by the run's cache.
    pub(crate) fn cached(&self, program: &Program, slot: usize) {
        let Some(record) = self.record(program, slot) else {
            return;
        };
        let now = mark(Ticker::now(), 0, NodeState::Cached);
        record.ended.store(0, Ordering::Relaxed);
        record.begun.store(now, Ordering::Release);
        record.ended.store(now, Ordering::Release);
    }
}

impl std::fmt::Debug for Board {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Board")
            .field("records", &self.records.len())
            .finish_non_exhaustive()
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

    /// Whether its run was said to be over ([`Board::finished`]).
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }
}

/// A board as a streamed item's run holds it, which says the run is over ([`Board::finished`])
/// when the item goes — whether its run ended or its stream was closed with it in flight: the
/// observer may hold the board long after (a view keeps finished runs), and the clock need not
/// tick for it.
pub(crate) struct HeldBoard(pub(crate) Arc<Board>);

impl Drop for HeldBoard {
    fn drop(&mut self) {
        self.0.finished();
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

/// The tick, in milliseconds since the clock began, as last set: by the ticking thread, by a run
/// that begins, or by a node's end the tick moved under. Each sets it to at least what it
/// read from the clock (`fetch_max`), so that it never goes back when two set it at once: a
/// mark is read as a difference from an earlier one. 64 bits, never wrapping; a mark keeps
/// the low 32.
static TICK: AtomicU64 = AtomicU64::new(0);

/// How many boards' runs are under way: a count, so that a run that begins pays an atomic add,
/// not a lock.
static WATCHED: AtomicUsize = AtomicUsize::new(0);
/// Whether the ticking thread parks, or is about to; the lock and condition it parks on, which
/// a run that begins takes only then.
static PARKED: AtomicBool = AtomicBool::new(false);
static PARKING: Mutex<()> = Mutex::new(());
static WATCHING: Condvar = Condvar::new();
/// How many ticks the clock goes on for with no board's run under way before it parks: runs
/// one after another find it ticking, and wake nobody.
const IDLE_TICKS: u32 = 100;

impl Ticker {
    /// The tick now.
    #[inline]
    fn now() -> u32 {
        // The low 32 bits: a mark's, wrapping after 49 days (marks are read as differences).
        #[allow(clippy::cast_possible_truncation)]
        let tick = TICK.load(Ordering::Relaxed) as u32;
        tick
    }

    /// The tick for the end of a node begun at tick `begun`. The tick as it is, while it has not
    /// moved since: a node shorter than the tick, whose end costs no clock read. Once it has
    /// moved, the node lasted a tick or more, and the tick may be late: the clock's own reading
    /// then (about 20 ns, nothing beside a millisecond), which sets the tick for the marks after.
    #[inline]
    fn end_of(begun: u32) -> u32 {
        let now = Ticker::now();
        if now == begun {
            now
        } else {
            Ticker::advance()
        }
    }

    /// When the clock began.
    fn epoch() -> Instant {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        *EPOCH.get_or_init(Instant::now)
    }

    /// Sets the tick from the clock, unless another set it later meanwhile. The tick now.
    fn advance() -> u32 {
        // Milliseconds since the clock began: 64 bits hold 584 million years of them.
        #[allow(clippy::cast_possible_truncation)]
        let read = Ticker::epoch().elapsed().as_millis() as u64;
        let set = TICK.load(Ordering::Relaxed);
        // Most often the tick is already this millisecond's: read, not written, the line that
        // every node's mark loads stays shared.
        let tick = if read <= set {
            set
        } else {
            TICK.fetch_max(read, Ordering::Relaxed).max(read)
        };
        // The low 32 bits, as `now`.
        #[allow(clippy::cast_possible_truncation)]
        let tick = tick as u32;
        tick
    }

    /// A board is made: the clock ticks while its run is under way. The tick now.
    fn watch() -> u32 {
        static THREAD: OnceLock<()> = OnceLock::new();
        THREAD.get_or_init(|| {
            // Without a thread the clock does not tick: marks are the board's making, a
            // record's seconds 0, and nothing else is lost.
            let _ = std::thread::Builder::new()
                .name("soma-board-clock".into())
                .spawn(Ticker::tick);
        });
        // Sequentially consistent, as the ticking thread's flag and look at the count: either it
        // sees this run, or this run sees it parking and wakes it.
        WATCHED.fetch_add(1, Ordering::SeqCst);
        // Set from the clock whether it ticks or not: a tick late on a busy machine would
        // stretch the run's first node by as much (its beginning marked early), and the read
        // costs a run what it costs a node that lasts a tick.
        let tick = Ticker::advance();
        if !PARKED.load(Ordering::SeqCst) {
            return tick; // Ticking.
        }
        // The clock is parked: woken.
        let _parking = PARKING.lock().unwrap_or_else(PoisonError::into_inner);
        WATCHING.notify_all();
        tick
    }

    /// A board's run is over.
    fn unwatch() {
        let _ = WATCHED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |watched| {
            Some(watched.saturating_sub(1))
        });
    }

    /// The ticking thread's loop: a tick a millisecond while a board's run is under way, and
    /// for [`IDLE_TICKS`] after the last; then parked until a run begins.
    fn tick() {
        let mut idle = 0;
        loop {
            if WATCHED.load(Ordering::SeqCst) != 0 {
                idle = 0;
            } else if idle < IDLE_TICKS {
                idle += 1;
            } else {
                PARKED.store(true, Ordering::SeqCst);
                // Looked at again under the lock, which `watch` takes to wake it: a run begun
                // meanwhile is never missed.
                let parking = PARKING.lock().unwrap_or_else(PoisonError::into_inner);
                let _parking = WATCHING
                    .wait_while(parking, |()| WATCHED.load(Ordering::SeqCst) == 0)
                    .unwrap_or_else(PoisonError::into_inner);
                PARKED.store(false, Ordering::SeqCst);
                idle = 0;
            }
            Ticker::advance();
            std::thread::sleep(RESOLUTION);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::{Ticker, TICK};

    #[test]
    fn a_nodes_end_is_read_from_the_clock_once_the_tick_moved_however_late_the_tick() {
        // This binary makes no board: no thread ticks, and the tick moves only as the test
        // moves it (were one ticking, it would only move the tick sooner).
        let begun = Ticker::advance();
        std::thread::sleep(Duration::from_millis(20));
        // A late tick: one tick on since the beginning, where the clock is twenty on.
        TICK.fetch_add(1, Ordering::Relaxed);
        let ended = Ticker::end_of(begun);
        assert!(ended.wrapping_sub(begun) >= 20, "{begun} to {ended}");
        // The tick is set from the clock's reading: the next marks are not late either.
        assert!(at_or_after(Ticker::now(), ended));
    }

    #[test]
    fn the_tick_never_goes_back_when_the_clock_is_read_behind_a_later_setting() {
        let set = Ticker::advance();
        // Another setter read the clock later and set the tick first.
        TICK.fetch_add(5, Ordering::Relaxed);
        let read = Ticker::advance();
        assert!(read.wrapping_sub(set) >= 5, "{set} then {read}");
        assert!(at_or_after(Ticker::now(), read));
    }

    /// Whether mark `later` is `earlier` or after it (as marks are read: differences). The
    /// tests run side by side and each moves the tick: another may have moved it on since.
    fn at_or_after(later: u32, earlier: u32) -> bool {
        later.wrapping_sub(earlier) < 1 << 31
    }
}
