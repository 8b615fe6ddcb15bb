//! Where a task of an async run stands, held by the task itself rather than borrowed from a
//! stack: the run it belongs to, the table it reads and writes, the part of that table that is
//! its own, and its place among the waves and items around it.
//!
//! The sync walk lends a branch its part of the table as a borrow, split off the parent's with
//! `split_at_mut`, because the parent's stack outlives the branch. A task of an async run has no
//! stack under it while it waits: it may be parked, resumed, or outlive the task that spawned it
//! (whose embedder may drop it early), so everything it uses is shared by `Arc`, and the table is
//! one block of cells that each task reaches through its [`Window`]. The rule that makes this
//! sound is the sync walk's, unchanged: the program numbers a wave's branches into disjoint,
//! contiguous ranges of slots; a branch writes only its own range; what it reads outside it lies
//! in the ranges its ancestors had completed when its wave started, which nobody writes until
//! the wave has joined. A window names exactly those ranges, so no reference is ever made to a
//! cell another task may be writing.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::Arc;

use super::hooks::Tasks;
use super::limits::Limits;
use crate::model::value::Value;
use crate::run::branch::Branch;
use crate::run::detach::{Detached, Remains};
use crate::run::executor::Executor;
use crate::run::keys::RunKeys;
use crate::run::program::Program;
use crate::run::table::{Frame, Shared};

/// What every task of one run shares: the executor and its hooks, the loop's side, the
/// program (which keeps every sub-program a `Map`, `Switch` or `Loop` runs alive), and which
/// nodes are running, for the message of a run stopped early.
pub(crate) struct Run {
    pub(crate) executor: Executor,
    pub(crate) tasks: Arc<dyn Tasks>,
    pub(crate) program: Arc<Program>,
    /// Which of the program's nodes run now, the sync pieces' included: the sync walk marks
    /// them through a lane's `detached`, whose caller never gives up here (no thread of a
    /// piece is the run's caller), so its remains are never used.
    pub(crate) detached: Detached,
    _remains: Arc<Remains>,
    /// How many items of its stream each of the program's steps works on at once, when the
    /// run is an item of a [`crate::Flow`].
    pub(crate) limits: Option<Arc<Limits>>,
    /// The thread that started the run: never one of the crew's, so the sync walk of a piece
    /// never takes its own thread for the run's caller (none of them polls the watch, or gives
    /// up waiting).
    pub(crate) caller: std::thread::ThreadId,
}

impl Run {
    pub(crate) fn new(
        executor: Executor,
        tasks: Arc<dyn Tasks>,
        program: Arc<Program>,
        limits: Option<Arc<Limits>>,
    ) -> Self {
        let remains = Arc::new(Remains::new());
        let detached = Detached::keeping(&*program, program.len(), Arc::downgrade(&remains), true);
        Run {
            executor,
            tasks,
            program,
            detached,
            _remains: remains,
            limits,
            caller: std::thread::current().id(),
        }
    }
}

/// The table of one run of a program: the run's own, or that of one item, case or iteration
/// of a step that decides, whose sub-program numbers slots of its own.
pub(crate) struct Table {
    /// The program whose steps number the cells: the run's, or one of its sub-programs, which
    /// live as long as the run's (`Run::program`), held by every task that holds this table.
    program: *const Program,
    cells: Box<[UnsafeCell<Option<Value>>]>,
    pub(crate) keys: Option<RunKeys>,
    pub(crate) input: Value,
}

// SAFETY: the cells are reached only through windows (see the module's header): a task writes
// only its own range and reads only ranges nobody writes meanwhile, and a wave's join — which
// hands outcomes from the children's tasks to the parent's under a lock — orders the children's
// writes before the parent's later reads. `program` points into a program owned by an `Arc`
// every holder of the table also holds.
#[allow(unsafe_code)]
unsafe impl Send for Table {}
// SAFETY: as for `Send`: shared between tasks, the cells are touched only through windows.
#[allow(unsafe_code)]
unsafe impl Sync for Table {}

impl Table {
    /// The table of a run of `program` on `input`; `program` must be the run's program or one
    /// of its sub-programs.
    pub(crate) fn new(program: &Program, input: Value, keys: Option<RunKeys>) -> Self {
        Table {
            program,
            cells: (0..program.len()).map(|_| UnsafeCell::new(None)).collect(),
            keys,
            input,
        }
    }

    /// The program its slots belong to.
    pub(crate) fn program(&self) -> &Program {
        // SAFETY: see the `Send` impl: the program outlives every holder of this table.
        #[allow(unsafe_code)]
        unsafe {
            &*self.program
        }
    }

    /// Runs `work` on `window`'s view of the table as the sync walk sees one: its own range
    /// mutable, the ranges it may read shared, one segment each, innermost first.
    ///
    /// The caller must be the task (or the thread it lent work to) that owns `window`, and no
    /// other `with_frame` of the same window may be in progress: then no cell in the view is
    /// written by anyone else while `work` runs.
    pub(crate) fn with_frame<R>(
        &self,
        window: &Window,
        work: impl FnOnce(&mut Frame<'_>) -> R,
    ) -> R {
        let base = self.cells.as_ptr().cast::<Option<Value>>().cast_mut();
        // `UnsafeCell<T>` has the layout of `T`, so a range of cells is a slice of values.
        let slice = |range: &Range<usize>| {
            assert!(range.start <= range.end && range.end <= self.cells.len());
            // SAFETY: in bounds (checked above), and — per this function's contract and the
            // module's rule — nobody writes these cells while the view exists.
            #[allow(unsafe_code)]
            unsafe {
                std::slice::from_raw_parts(base.add(range.start), range.len())
            }
        };
        let mut segments: Vec<Shared<'_>> = Vec::with_capacity(window.readable.len());
        for range in &window.readable {
            let outer: Option<*const Shared<'_>> = segments.last().map(std::ptr::from_ref);
            segments.push(Shared {
                base: range.start,
                cells: slice(range),
                // SAFETY: `segments` never reallocates (its capacity is exact), so the segment
                // pushed before stays where it is for as long as `segments` lives, which
                // outlives the frame below.
                #[allow(unsafe_code)]
                outer: outer.map(|at| unsafe { &*at }),
            });
        }
        let own = &window.own;
        assert!(own.start <= own.end && own.end <= self.cells.len());
        // SAFETY: in bounds; the window's own range is this task's alone (its wave gave it
        // that range and nobody else), and this is the one view of it in use.
        #[allow(unsafe_code)]
        let own_cells = unsafe { std::slice::from_raw_parts_mut(base.add(own.start), own.len()) };
        let mut frame = Frame {
            base: own.start,
            own: own_cells,
            shared: segments.last(),
        };
        work(&mut frame)
    }
}

/// The part of a table a task may touch: its own range, which only it writes, and the ranges
/// its ancestors had completed when its wave started, outermost first, which it may read.
pub(crate) struct Window {
    pub(crate) own: Range<usize>,
    pub(crate) readable: Box<[Range<usize>]>,
}

impl Window {
    /// The whole table of a run: all its own, nothing outside.
    pub(crate) fn whole(slots: usize) -> Self {
        Window {
            own: 0..slots,
            readable: Box::new([]),
        }
    }

    /// The window of a branch of a wave that starts at slot `wave_start` and gives the branch
    /// `own`: what this window owns before the wave becomes readable.
    pub(crate) fn branch(&self, wave_start: usize, own: Range<usize>) -> Self {
        let mut readable = self.readable.to_vec();
        readable.push(self.own.start..wave_start);
        Window {
            own,
            readable: readable.into(),
        }
    }
}

/// Where a task's walk stands: its run, its table, its window on it, its branch, and how many
/// levels of steps that decide it has entered inline (a case, an iteration) since it began.
#[derive(Clone)]
pub(crate) struct Place {
    pub(crate) run: Arc<Run>,
    pub(crate) table: Arc<Table>,
    pub(crate) window: Arc<Window>,
    pub(crate) branch: Arc<Branch>,
    pub(crate) depth: u32,
}

impl Place {
    /// The stream's limits on this place's steps: a run's own steps are limited, what a step
    /// that decides runs inside is not (it is no stage of the stream).
    pub(crate) fn limits(&self) -> Option<&Limits> {
        let limits = self.run.limits.as_deref()?;
        std::ptr::eq(self.table.program(), Arc::as_ptr(&self.run.program)).then_some(limits)
    }
}
