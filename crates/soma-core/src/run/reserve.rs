//! The reserve: one thread kept started, for whichever crew next needs a thread.
//!
//! Starting a thread is a system call whose cost falls on whoever makes it: 50–120 µs inside a
//! Python process on the 2-core benchmark machine. Without a reserve, a wave's owner pays it in
//! the middle of its run, and the first forward of every graph does. A crew that finds a thread
//! waiting in reserve hands it its work instead, for the price of waking it.
//!
//! The reserve is used only once asked for: [`keep_a_thread_in_reserve`] fills it, and a host
//! that will run graphs calls it early, off any run's path (the Python module does when it is
//! imported). From then on, a crew thread that has run out of work and is about to sleep fills
//! the reserve again if it was taken ([`refill`]): the next thread is started on time nobody is
//! waiting for, not in the middle of a run. A thread in reserve only waits: it holds no program,
//! no interpreter state, nothing of any run. A crew whose threads need a larger stack than a
//! reserve thread has starts its own. In a child made by `fork` the parent's thread in reserve
//! is not there, and the reserve counts as empty until a thread of the child refills it.

use std::io;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use super::fork;
use super::latch::sleep_on;
use super::worker::{start_worker, DEFAULT_STACK};

/// What a thread taken from the reserve runs: a crew thread's whole life.
pub(crate) type ThreadLife = Box<dyn FnOnce() + Send>;

struct Reserve {
    slot: Mutex<ReserveState>,
    /// Where the thread in reserve waits for work.
    handed: Condvar,
}

struct ReserveState {
    /// The thread waiting in reserve, if one is.
    waiting: Option<ThreadId>,
    /// Whether a thread is being started for the reserve: one is enough.
    starting: bool,
    /// Whether the reserve was asked for ([`keep_a_thread_in_reserve`]), and so is refilled.
    wanted: bool,
    /// A life handed to a thread that was in reserve, and not yet taken by it: for that thread
    /// only, not for a thread that comes to the reserve meanwhile.
    work: Option<(ThreadId, ThreadLife)>,
    /// The process the counted thread was started in ([`fork::generation`]).
    process: u32,
}

static RESERVE: Reserve = Reserve {
    slot: Mutex::new(ReserveState {
        waiting: None,
        starting: false,
        wanted: false,
        work: None,
        process: 0,
    }),
    handed: Condvar::new(),
};

impl Reserve {
    /// The slot, as this process sees it: in a child made by `fork`, empty.
    fn slot(&self) -> MutexGuard<'_, ReserveState> {
        // Nothing panics while holding the lock; a poisoned slot is still whole.
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        let process = fork::generation();
        if slot.process != process {
            slot.process = process;
            slot.waiting = None;
            slot.starting = false;
            slot.work = None;
        }
        slot
    }
}

/// Makes sure a thread waits in reserve, starting one on the calling thread if none does and
/// none is on its way. Idempotent and cheap once the reserve is full.
///
/// # Errors
/// The operating system's refusal of a thread; the reserve then stays empty, and crews start
/// their threads themselves, as without it.
pub fn keep_a_thread_in_reserve() -> io::Result<()> {
    let mut slot = RESERVE.slot();
    slot.wanted = true;
    fill(slot)
}

/// Whether the reserve was asked for and is empty, with no thread on its way to it.
pub(crate) fn wants_refill() -> bool {
    let slot = RESERVE.slot();
    slot.wanted && slot.waiting.is_none() && !slot.starting
}

/// Fills the reserve if it was asked for, on the calling thread, which should have nothing
/// else to do. A refusal leaves it empty.
pub(crate) fn refill() {
    let slot = RESERVE.slot();
    if slot.wanted {
        let _ = fill(slot);
    }
}

/// Starts a thread for the reserve unless one waits there or is on its way.
fn fill(mut slot: MutexGuard<'_, ReserveState>) -> io::Result<()> {
    if slot.waiting.is_some() || slot.starting {
        return Ok(());
    }
    slot.starting = true;
    drop(slot);
    let started = start_worker(DEFAULT_STACK, wait_in_reserve);
    if started.is_err() {
        RESERVE.slot().starting = false;
    }
    started
}

/// The thread waiting in reserve now, if one is: for tests that check which thread ran what.
#[doc(hidden)]
pub fn thread_in_reserve() -> Option<ThreadId> {
    RESERVE.slot().waiting
}

/// Hands `work` to the thread in reserve, if one waits and can run it: a stack of
/// `stack_size` bytes is what the thread has, [`DEFAULT_STACK`]. Gives `work` back otherwise.
pub(crate) fn hand_over(work: ThreadLife, stack_size: usize) -> Result<(), ThreadLife> {
    if stack_size > DEFAULT_STACK {
        return Err(work);
    }
    let mut slot = RESERVE.slot();
    if slot.work.is_some() {
        return Err(work); // The last thread handed work has not taken it yet: one at a time.
    }
    let Some(thread) = slot.waiting.take() else {
        return Err(work);
    };
    slot.work = Some((thread, work));
    drop(slot);
    // Every waiter: the thread that comes to refill the reserve may be waiting too.
    RESERVE.handed.notify_all();
    Ok(())
}

/// A thread in reserve: waits for work, then runs it.
fn wait_in_reserve() {
    let mut slot = RESERVE.slot();
    slot.starting = false;
    if slot.waiting.is_some() {
        return; // Filled meanwhile by a thread of its own: one in reserve is enough.
    }
    let me = thread::current().id();
    slot.waiting = Some(me);
    let work = loop {
        if let Some((_, work)) = slot.work.take_if(|(to, _)| *to == me) {
            break work;
        }
        slot = sleep_on(&RESERVE.handed, slot, None);
    };
    drop(slot);
    work();
}
