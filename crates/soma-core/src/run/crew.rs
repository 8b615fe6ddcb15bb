//! `Crew`: the threads the branches of a program's waves are lent.
//!
//! A wave's branches are *offered* to the crew all at once, and taken by whichever threads are
//! free: the thread that reached the wave runs its first branch itself and then takes the
//! siblings nobody has started yet, while the crew's threads take the others. A branch, once
//! taken, runs start to finish on the thread that took it. Threads are lent, never owned by a
//! branch: a run uses about as many threads as it has branches *in flight* at once, however many
//! branches its graph has.
//!
//! # Every branch of a wave is in flight when it needs to be
//!
//! A wave means its branches are launched together: two branches that wait for each other must
//! both be running. So whenever a thread takes a branch while siblings are still waiting to be
//! taken, it makes sure one more thread is on its way to them — one that is looking for work
//! already, else a sleeping one woken, else a new one started. That chain reaches every branch
//! of the wave: if the branches that run block, more threads come, up to one per branch; if
//! they finish quickly, the threads already there take the rest and nobody else is woken.
//! Waiting for a wave therefore never ties up a thread that could run one of its branches: the
//! waiting thread has run its own share before it sleeps.
//!
//! # What a branch finds on its thread
//!
//! The thread a branch is taken by is the engine's choice; so what a node leaves in a native
//! library's thread-locals may be seen by a later branch that runs on the same thread, exactly
//! as with any thread pool. What the engine itself manages per branch — through [`Host::branch`]
//! on a crew thread, and on any thread through the context a host captures for a wave
//! ([`crate::Captured`]) — is set when the branch starts and put back when it ends.
//!
//! # Threads come and go
//!
//! A crew starts with no thread and gets one only when a branch is waiting and no idle thread
//! is at hand: the process's thread in reserve when there is one ([`crate::run::reserve`]),
//! else one it starts. A thread that runs out of work stays awake for a moment
//! ([`STAY_AWAKE`]), refills the reserve if it was taken, then sleeps; beyond the crew's idle
//! limit it ends instead. Dropping the crew ends every idle thread
//! without waiting for it: dropping never blocks on a thread. A child made by `fork` inherits the
//! crew but not its threads, and starts its own.
//!
//! # Words used here, and the usual names for them
//!
//! | here | usually | what it is |
//! |---|---|---|
//! | crew | thread pool | the threads a program's waves are lent |
//! | offer | job (a batch) | a wave's branches, claimed one by one by whoever is free |
//! | claim | steal / pop | taking the next branch of an offer nobody has started |
//! | latch | countdown latch | what the wave's owner sleeps on until every branch is done |
//! | owner | the joining thread | the thread that reached the wave and waits for it |
//!
//! # The `unsafe` of the engine
//!
//! A branch borrows from its run (the table of values, the driver), while a crew thread outlives
//! every run: the offer reaches its branches through a pointer whose lifetime is erased.
//! [`Crew::run`] keeps the promise `std::thread::scope` keeps: it returns only once every branch
//! of the offer has been claimed and has finished, and nobody follows the pointer without a
//! claim, which exists only while a branch is unclaimed or unfinished — or, when the run's
//! caller gives up waiting, it returns at once having left the work, and everything its
//! branches borrow, to the run's remains, which the last branch to finish frees
//! ([`crate::run::detach`]).
//! [`Crew::lend`], whose tasks outlive their caller's frame, leaves its work to the remains
//! from the start.

use std::any::Any;
use std::collections::VecDeque;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::detach::{Detached, Kept, Remains};
use super::fork;
use super::hooks::Host;
use super::latch::{sleep_on, Latch, STAY_AWAKE};
use super::reserve;
use super::worker::{start_worker, DEFAULT_STACK};

/// How many threads a wave's owner makes sure are on their way to the branches it has not
/// claimed: one, not none, in case its own branch blocks until a sibling runs. Only one, because
/// the owner pays for waking or starting a thread on its own time, in the middle of its run
/// (unless the reserve has one, [`crate::run::reserve`]), and runs the siblings itself when its
/// branch is quick (a wave of trivial branches needs no helper at all); the helper, once it has
/// a branch, sends more.
const OWNER_SENDS: usize = 1;

/// How many threads a crew thread that has just claimed a branch makes sure are on their way to
/// the branches still unclaimed. Two, not one: each helper sending two, a wave of a thousand
/// branches that all block has its threads after about ten rounds, not a thousand. Started on
/// a crew thread's time, these cost the owner nothing.
const HELPER_SENDS: usize = 2;

/// How many idle threads a crew keeps unless told otherwise: enough for the waves people write
/// to find their threads awake or parked, few enough that a graph that once ran a wave of
/// thousands of blocking branches does not keep thousands of threads.
pub const DEFAULT_IDLE_THREADS: usize = 64;

/// What a branch that never got a thread reports in place of its outcome: the operating
/// system's refusal, as text.
#[derive(Debug)]
pub(crate) struct Refused(pub(crate) String);

/// The threads one program's waves are lent; see the module docs.
pub(crate) struct Crew {
    pool: Arc<Pool>,
}

struct Pool {
    state: Mutex<PoolState>,
    /// Where idle threads sleep; woken one at a time, with a permit each.
    wake: Condvar,
    /// Offers in the queue, read without the lock by threads looking for work.
    offered: AtomicUsize,
}

struct PoolState {
    /// Waves with branches nobody has claimed yet. An offer all claimed is removed by whoever
    /// sees it first.
    offers: VecDeque<Arc<Offer>>,
    /// Live threads of the crew.
    threads: usize,
    /// Threads awake and not running a branch: each will look at the queue before it sleeps.
    looking: usize,
    /// Threads asleep, waiting for a permit.
    sleeping: usize,
    /// Wake-ups handed out and not yet taken by a sleeping thread.
    permits: usize,
    /// How many sleeping threads to keep; a thread that would be one more ends instead.
    idle_limit: usize,
    /// Set when the crew is dropped: every thread ends once it has nothing to run.
    closed: bool,
    /// Threads still to be refused as if the operating system had said no: the path a process
    /// out of threads takes, made testable.
    refusals: usize,
    /// The stack each new thread gets.
    stack_size: usize,
    /// The process that started the threads counted here ([`fork::generation`]); in a forked
    /// child they are not there.
    process: u32,
}

/// One wave's branches, claimed one at a time by whoever is free.
struct Offer {
    /// The index of the next branch nobody has claimed; past `len`, all are claimed.
    next: AtomicUsize,
    len: usize,
    /// Branches not finished yet, claimed or not: the wave's owner waits for zero.
    unfinished: AtomicUsize,
    /// Set by a crew thread once it has left the offer's host (given back the GIL, say) after
    /// running the offer's branches: what the owner of a hand-off waits for, briefly, before it
    /// asks for the host again, instead of queueing behind the thread that still holds it.
    host_left: AtomicBool,
    /// Whether the offer is in the crew's queue; changed only under the crew's lock, so
    /// `Relaxed` is enough. Lets the owner skip looking for an offer a crew thread removed.
    queued: AtomicBool,
    /// Opened by the branch that finishes last, which lets go of what a run's caller left on
    /// it when it stopped waiting for this offer ([`crate::run::detach`]).
    latch: Latch,
    /// Around every branch a crew thread runs (never around the owner's own).
    host: Option<Arc<dyn Host>>,
    /// The owner's [`Branches`], type and lifetime erased; followed only with a claim in hand.
    work: *const (),
    /// Runs branch `index` of the `work` behind the pointer, or records that it never got a
    /// thread.
    run: unsafe fn(work: *const (), index: usize, refused: Option<&str>),
}

// SAFETY: `work` points to a `Branches` whose tasks are `Send` and whose outcomes are behind
// mutexes; it is only followed under a claim, which guarantees it is alive (see `Crew::run`).
#[allow(unsafe_code)]
unsafe impl Send for Offer {}
// SAFETY: as above; every other field is `Sync`.
#[allow(unsafe_code)]
unsafe impl Sync for Offer {}

/// The owner's side of an offer: the branches themselves and their outcomes, kept on the heap
/// so that an owner that stops waiting can leave them to the branches still running.
struct Branches<F, T> {
    tasks: Box<[Mutex<Option<F>>]>,
    outcomes: Box<[Mutex<Option<thread::Result<T>>>]>,
}

impl Crew {
    /// A crew with no thread yet, keeping at most `idle_limit` idle threads.
    pub(crate) fn new(idle_limit: usize) -> Crew {
        Crew {
            pool: Arc::new(Pool {
                state: Mutex::new(PoolState {
                    offers: VecDeque::new(),
                    threads: 0,
                    looking: 0,
                    sleeping: 0,
                    permits: 0,
                    idle_limit,
                    closed: false,
                    refusals: 0,
                    stack_size: DEFAULT_STACK,
                    process: fork::generation(),
                }),
                wake: Condvar::new(),
                offered: AtomicUsize::new(0),
            }),
        }
    }

    /// Live threads of the crew, busy or idle.
    pub(crate) fn threads(&self) -> usize {
        self.pool.lock().threads
    }

    /// Refuses the next `count` threads this crew would start, as an operating system out of
    /// threads would.
    pub(crate) fn refuse_next_threads(&self, count: usize) {
        self.pool.lock().refusals = count;
    }

    /// Gives threads started from now on a stack of at least `bytes`.
    pub(crate) fn set_stack_size(&self, bytes: usize) {
        self.pool.lock().stack_size = bytes.max(DEFAULT_STACK);
    }

    /// Sets how many idle threads the crew keeps; idle threads beyond it end.
    pub(crate) fn set_idle_limit(&self, limit: usize) {
        let mut state = self.pool.lock();
        state.idle_limit = limit;
        // Sleepers over the limit are woken without work, and end.
        let excess = state.sleeping.saturating_sub(limit);
        for _ in 0..excess {
            state.sleeping -= 1;
            state.looking += 1;
            state.permits += 1;
            self.pool.wake.notify_one();
        }
    }

    /// Runs `task` once for each of `parts`, as the branches of one wave, and returns what it
    /// lent them and their outcomes in order, a panic caught as `Err`.
    ///
    /// Branch `index` is `task(&lent, index, part)`: `lent` is shared by every branch, `part`
    /// is the branch's own. The crew owns `lent` while the branches run, on the heap: it gives
    /// it back once every branch has finished, or — when `wait` gave up in a `detached` run —
    /// leaves it, with the branches still running, to the run's remains, so that no caller has
    /// to remember to. (A caller still must not lend its branches a borrow of its own frame
    /// that is not itself kept: what they borrow comes through `lent`, `parts` or frames kept
    /// further up.)
    ///
    /// The calling thread runs the first branch itself, then every branch no crew thread has
    /// claimed by then; `host` wraps each branch a crew thread runs. `wait` is called, on the
    /// calling thread, only if branches run elsewhere are still unfinished: it should block
    /// until `until_done` returns true (it may do more: let go of a lock, poll for signals), and
    /// return whether it gave up instead. Returns once every branch has finished — or `None` at
    /// once when `wait` gave up in a `detached` run.
    pub(super) fn run<L, P, T, G>(
        &self,
        lent: L,
        parts: impl IntoIterator<Item = P>,
        task: &G,
        host: Option<&Arc<dyn Host>>,
        detached: Option<&Detached>,
        wait: impl FnOnce(&(dyn Fn(Option<Duration>) -> bool + Sync)) -> bool,
    ) -> Option<(L, Vec<thread::Result<T>>)>
    where
        L: Send + Sync,
        P: Send,
        T: Send,
        G: Fn(&L, usize, P) -> T + Sync,
    {
        // Declared first, so that on unwinding it is freed after `guard` has waited for every
        // branch that borrows it.
        let lent = Kept::new(lent);
        // SAFETY: `lent` is on the heap and is freed only after every branch has finished, or
        // left with them to the run's remains (`joined_or_left`); and `T`, which is `task`'s for
        // every borrow of `lent`, cannot hold this one.
        #[allow(unsafe_code)]
        let shared: &L = unsafe { &*lent.as_ptr() };
        let tasks: Vec<_> = parts
            .into_iter()
            .enumerate()
            .map(|(index, part)| move || task(shared, index, part))
            .collect();
        let len = tasks.len();
        // The owner holds the first branch from the start.
        let (offer, work) = Offer::new(tasks, 1, host);
        // Whatever happens from here, the owner returns — or unwinds — only once every branch
        // is finished, or after leaving `work` to the run's remains: that is what keeps `work`
        // alive for the crew threads that claim it.
        let guard = JoinOnDrop(&offer);
        if len > 1 {
            if let Err(refused) = self.pool.offer(&offer) {
                offer.refuse_unclaimed(&refused);
            }
        }
        // SAFETY: branch 0 was claimed by construction (`next` starts at 1), and `work` is
        // this frame's.
        #[allow(unsafe_code)]
        unsafe {
            offer.run_claimed(0, None, || {});
        }
        while let Some(index) = offer.claim() {
            self.pool.send_helper_if_needed(&offer);
            // SAFETY: claimed just now; `work` is this frame's.
            #[allow(unsafe_code)]
            unsafe {
                offer.run_claimed(index, None, || {});
            }
        }
        if len > 1 {
            self.pool.withdraw(&offer);
        }
        let (work, lent) = joined_or_left(&offer, work, lent, guard, detached, wait)?;
        Some((
            lent,
            work.outcomes
                .into_vec()
                .into_iter()
                .map(|outcome| {
                    outcome
                        .into_inner()
                        .unwrap_or_else(PoisonError::into_inner)
                        .expect("every branch recorded its outcome")
                })
                .collect(),
        ))
    }
}

impl Crew {
    /// Runs `task` on `lent` on a crew thread while the calling thread only waits, and returns
    /// `lent` back with the task's outcome, a panic caught as `Err`: the caller never runs it,
    /// so however long the task takes, `wait` decides when the caller stops waiting. `host`
    /// wraps the task on its thread.
    ///
    /// `wait` is called as in [`Crew::run`]; when it gives up in a `detached` run, this returns
    /// `None` at once and the task, still running or not yet taken, keeps `lent` alive through
    /// the run's remains, where the crew leaves it. A task the operating system refuses a
    /// thread for reports [`Refused`].
    pub(super) fn hand_off<L, T>(
        &self,
        lent: L,
        task: impl FnOnce(&mut L) -> T + Send,
        host: Option<&Arc<dyn Host>>,
        detached: Option<&Detached>,
        wait: impl FnOnce(&(dyn Fn(Option<Duration>) -> bool + Sync)) -> bool,
    ) -> Option<(L, thread::Result<T>)>
    where
        L: Send,
        T: Send,
    {
        // Declared first, as in `run`.
        let lent = Kept::new(lent);
        // SAFETY: as in `run`; and the task is the one borrower, the caller touching `lent`
        // again only once it has finished.
        #[allow(unsafe_code)]
        let only: &mut L = unsafe { &mut *lent.as_ptr() };
        let task = move || task(only);
        // Nobody holds the task: a crew thread claims it.
        let (offer, work) = Offer::new(vec![task], 0, host);
        // As in `run`: the caller returns only once the task has finished, or after leaving
        // `work` to the run's remains.
        let guard = JoinOnDrop(&offer);
        if let Err(refused) = self.pool.offer(&offer) {
            offer.refuse_unclaimed(&refused);
        }
        let (work, lent) = joined_or_left(&offer, work, lent, guard, detached, wait)?;
        // The task is done, but its thread may still hold the host it ran in: asking for the
        // host now would put this thread to sleep until that one lets go, and waking it costs
        // more than the few instructions between the two. So look a moment for it to go.
        if host.is_some() {
            let start = Instant::now();
            while !offer.host_left.load(Ordering::Acquire) && start.elapsed() < STAY_AWAKE {
                std::hint::spin_loop();
            }
        }
        let outcome = (work.outcomes.into_vec().pop()).expect("one task, one outcome");
        Some((
            lent,
            outcome
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .expect("the task recorded its outcome"),
        ))
    }

    /// Lends crew threads to `tasks`, one each, without waiting for them: each runs start to
    /// finish on the thread that takes it and gives the thread back to the crew when it returns.
    /// For work that outlives its caller's frame (the stages of a stream); a task that must meet
    /// the others is in flight with them, by the same chain of helpers as a wave's branches.
    ///
    /// A task the operating system refuses a thread for is dropped without being run: whoever
    /// waits for it should learn that from something the task owns being dropped.
    ///
    /// # Errors
    /// The operating system's refusal of a thread, after the tasks without one were dropped.
    pub(crate) fn lend<F>(&self, tasks: Vec<F>, host: Option<&Arc<dyn Host>>) -> io::Result<()>
    where
        F: FnOnce() + Send + 'static,
    {
        if tasks.is_empty() {
            return Ok(());
        }
        // Nobody holds a task yet: the crew's threads take them all.
        let (offer, work) = Offer::new(tasks, 0, host);
        // Nobody waits for these tasks: their work goes to remains that the offer keeps and the
        // task that finishes last frees, as a wave's whose owner stopped waiting.
        let remains = Arc::new(Remains::new());
        work.leave(&remains);
        offer.leave(&remains);
        self.pool.offer(&offer).inspect_err(|refused| {
            offer.refuse_unclaimed(refused);
        })
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        state.closed = true;
        drop(state);
        // Idle threads wake and end; none is joined, so dropping never waits on a thread.
        self.pool.wake.notify_all();
    }
}

/// The end of an owner's wait for `offer`, whose `guard` it holds: the work back, every
/// outcome in it, and what the owner lent its branches, once every branch has finished; or
/// `None` at once when `wait` gave up in a `detached` run, the work, the offer and what was lent
/// then left to the run's remains for the branches still running. `wait` is called only if a
/// branch is unfinished; see [`Crew::run`].
fn joined_or_left<F: Send, T: Send, L: Send>(
    offer: &Arc<Offer>,
    work: Kept<Branches<F, T>>,
    lent: Kept<L>,
    guard: JoinOnDrop<'_>,
    detached: Option<&Detached>,
    wait: impl FnOnce(&(dyn Fn(Option<Duration>) -> bool + Sync)) -> bool,
) -> Option<(Branches<F, T>, L)> {
    if !offer.finished() {
        let until_done = |timeout: Option<Duration>| offer.latch.wait(timeout);
        let gave_up = wait(&until_done);
        if let (true, Some(detached)) = (gave_up, detached) {
            let remains = &detached.remains();
            offer.leave(remains);
            // The branches borrow what was lent: left after them, so freed after them.
            work.leave(remains);
            lent.leave(remains);
            std::mem::forget(guard);
            return None;
        }
    }
    drop(guard);
    Some((work.into_inner(), lent.into_inner()))
}

/// Waits, when dropped, until every branch of the offer has finished.
struct JoinOnDrop<'o>(&'o Arc<Offer>);

impl Drop for JoinOnDrop<'_> {
    fn drop(&mut self) {
        while !self.0.finished() {
            self.0.latch.wait(None);
        }
    }
}

/// Runs task `index` of the `Branches<F, T>` behind `work` and records its outcome, or records that
/// it never got a thread.
///
/// # Safety
/// `work` must point to a live `Branches<F, T>`, and the caller must hold the claim on `index`.
#[allow(unsafe_code)]
unsafe fn run_task<F, T>(work: *const (), index: usize, refused: Option<&str>)
where
    F: FnOnce() -> T,
{
    // SAFETY: the caller vouches that `work` is a live `Branches<F, T>`.
    let work = unsafe { &*work.cast::<Branches<F, T>>() };
    let task = work.tasks[index]
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
        .expect("a claimed branch runs once");
    let outcome = match refused {
        None => panic::catch_unwind(AssertUnwindSafe(task)),
        Some(why) => {
            drop(task);
            let payload: Box<dyn Any + Send> = Box::new(Refused(why.to_owned()));
            Err(payload)
        }
    };
    *work.outcomes[index]
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(outcome);
}

impl Offer {
    /// An offer of `tasks`, the first `claimed` of them held by the caller already, and the
    /// work it points to, kept on the heap for whoever outlives whom.
    fn new<'env, F, T>(
        tasks: Vec<F>,
        claimed: usize,
        host: Option<&Arc<dyn Host>>,
    ) -> (Arc<Offer>, Kept<Branches<F, T>>)
    where
        T: Send + 'env,
        F: FnOnce() -> T + Send + 'env,
    {
        let len = tasks.len();
        let work = Kept::new(Branches {
            tasks: tasks.into_iter().map(|t| Mutex::new(Some(t))).collect(),
            outcomes: (0..len).map(|_| Mutex::new(None)).collect(),
        });
        let offer = Arc::new(Offer {
            next: AtomicUsize::new(claimed),
            len,
            unfinished: AtomicUsize::new(len),
            host_left: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            latch: Latch::new(),
            host: host.cloned(),
            work: work.as_ptr().cast_const().cast(),
            run: run_task::<F, T>,
        });
        (offer, work)
    }

    /// Claims the next branch nobody has started, if any.
    fn claim(&self) -> Option<usize> {
        // Relaxed is enough: the claim is exclusive by the atomicity of the add alone, and the
        // task and its outcome are behind mutexes of their own.
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        (index < self.len).then_some(index)
    }

    /// How many branches nobody has claimed yet.
    fn unclaimed(&self) -> usize {
        self.len.saturating_sub(self.next.load(Ordering::Relaxed))
    }

    /// Whether every branch has been claimed.
    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.len
    }

    /// Whether every branch has finished. `Acquire` pairs with the `Release` of the decrement in
    /// [`Offer::run_claimed`]: the outcomes written before it are visible after.
    fn finished(&self) -> bool {
        self.unfinished.load(Ordering::Acquire) == 0
    }

    /// Runs a claimed branch (or records that it never got a thread), calls `before_finish`,
    /// then counts the branch finished.
    ///
    /// # Safety
    /// The caller holds the claim on `index`, so the owner is still waiting and `work` is alive.
    #[allow(unsafe_code)]
    unsafe fn run_claimed(
        &self,
        index: usize,
        refused: Option<&str>,
        before_finish: impl FnOnce(),
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { (self.run)(self.work, index, refused) };
        before_finish();
        // `Release`: the outcome recorded above is visible to whoever sees the count reach zero.
        if self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last branch of a wave its owner left: what the owner left goes with it.
            self.latch.open();
        }
    }

    /// Keeps `remains` alive until the last branch finishes, for an owner that stops waiting.
    fn leave(&self, remains: &Arc<Remains>) {
        self.latch.leave(remains);
    }

    /// Claims every branch left and records that none of them got a thread.
    fn refuse_unclaimed(&self, refused: &io::Error) {
        let why = refused.to_string();
        while let Some(index) = self.claim() {
            // SAFETY: claimed just now, so the owner is waiting and `work` is alive.
            #[allow(unsafe_code)]
            unsafe {
                self.run_claimed(index, Some(&why), || {});
            }
        }
    }
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // Nothing panics while holding the lock; a poisoned state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Puts `offer` in the queue and makes sure a thread is on its way to it.
    fn offer(self: &Arc<Self>, offer: &Arc<Offer>) -> io::Result<()> {
        let mut state = self.lock();
        let process = fork::generation();
        if state.process != process {
            // A forked child: the threads counted belong to the parent.
            state.process = process;
            state.threads = 0;
            state.looking = 0;
            state.sleeping = 0;
            state.permits = 0;
            for stale in state.offers.drain(..) {
                stale.queued.store(false, Ordering::Relaxed);
            }
            self.offered.store(0, Ordering::Relaxed);
        }
        state.offers.push_back(Arc::clone(offer));
        offer.queued.store(true, Ordering::Relaxed);
        self.offered.fetch_add(1, Ordering::Release);
        let unclaimed = offer.unclaimed();
        self.send_helpers(&mut state, unclaimed, OWNER_SENDS)
    }

    /// Takes `offer` out of the queue, if it is still there; all its branches are claimed.
    fn withdraw(&self, offer: &Arc<Offer>) {
        let mut state = self.lock();
        if !offer.queued.load(Ordering::Relaxed) {
            return;
        }
        // Searched from the back: the offers of waves nested in one another are withdrawn in
        // the reverse of the order they were made.
        if let Some(at) = state.offers.iter().rposition(|o| Arc::ptr_eq(o, offer)) {
            state.offers.remove(at);
            offer.queued.store(false, Ordering::Relaxed);
            self.offered.fetch_sub(1, Ordering::Release);
        }
    }

    /// Called by a thread that has just claimed a branch of `offer` and is about to run it: if
    /// any branch in the queue is still unclaimed — a sibling, or a branch of another wave whose
    /// helper this thread was — makes sure more threads are on their way, in case the branch
    /// about to run blocks until those run. Without a thread to be had, the branches of `offer`
    /// left unclaimed are recorded as refused.
    fn send_helper_if_needed(self: &Arc<Self>, offer: &Offer) {
        if self.offered.load(Ordering::Acquire) == 0 {
            return;
        }
        self.send_helpers_to_the_queue(self.lock(), offer, OWNER_SENDS);
    }

    /// [`Pool::send_helper_if_needed`], for a caller that holds the lock already and sends up
    /// to `sends` threads.
    fn send_helpers_to_the_queue(
        self: &Arc<Self>,
        mut state: MutexGuard<'_, PoolState>,
        offer: &Offer,
        sends: usize,
    ) {
        // Two are enough to know: the scan stops there, and usually at the first offer.
        let mut unclaimed = 0;
        for waiting in state.offers.iter().rev() {
            unclaimed += waiting.unclaimed();
            if unclaimed >= 2 {
                break;
            }
        }
        if let Err(refused) = self.send_helpers(&mut state, unclaimed, sends) {
            drop(state);
            offer.refuse_unclaimed(&refused);
        }
    }

    /// Makes sure up to `sends` threads are on their way to `unclaimed` branches: those already
    /// looking count, then sleeping ones are woken, then new ones started.
    fn send_helpers(
        self: &Arc<Self>,
        state: &mut PoolState,
        unclaimed: usize,
        sends: usize,
    ) -> io::Result<()> {
        let mut missing = unclaimed.min(sends).saturating_sub(state.looking);
        while missing > 0 {
            if state.sleeping > 0 {
                state.sleeping -= 1;
                state.looking += 1;
                state.permits += 1;
                self.wake.notify_one();
            } else {
                self.start_thread(state)?;
            }
            missing -= 1;
        }
        Ok(())
    }

    fn start_thread(self: &Arc<Self>, state: &mut PoolState) -> io::Result<()> {
        if state.refusals > 0 {
            state.refusals -= 1;
            return Err(io::Error::other("refused on purpose, for a test"));
        }
        let pool = Arc::clone(self);
        // The thread in reserve if there is one: starting a thread would cost this thread a
        // system call, in the middle of its run.
        if let Err(serve) = reserve::hand_over(Box::new(move || pool.serve()), state.stack_size) {
            start_worker(state.stack_size, serve)?;
        }
        state.threads += 1;
        // Counted as looking from now, so that nobody starts another for the same work.
        state.looking += 1;
        Ok(())
    }

    /// A crew thread's life: take branches while there are any, stay awake a moment, sleep,
    /// end when the crew is gone or enough threads are idle already.
    fn serve(self: Arc<Self>) {
        let mut state = self.lock();
        let mut stayed_awake = false;
        loop {
            if let Some(offer) = next_offer(&mut state, &self.offered) {
                // Still counted as looking until it claims a branch: a thread on its way into
                // the host (waiting for the GIL, say) is as good as one looking, and counting it
                // keeps every wave it was sent to from starting yet another thread.
                drop(state);
                self.take_branches(&offer);
                state = self.lock();
                stayed_awake = false;
                continue;
            }
            if state.closed {
                break;
            }
            if !stayed_awake {
                drop(state);
                stay_awake(&self.offered);
                state = self.lock();
                // Back to the queue, under the lock: an offer made while this thread looked
                // without it counted on it as looking, and must not find it asleep.
                stayed_awake = true;
                continue;
            }
            stayed_awake = false;
            if state.sleeping >= state.idle_limit {
                break;
            }
            if reserve::wants_refill() {
                // Idle: the time to start the reserve's next thread, one having been taken from
                // it. A refusal leaves the reserve empty, and crews start their own threads.
                drop(state);
                reserve::refill();
                state = self.lock();
                continue; // Time has passed, without the lock: back to the queue.
            }
            state.looking -= 1;
            state.sleeping += 1;
            while state.permits == 0 && !state.closed {
                state = sleep_on(&self.wake, state, None);
            }
            if state.permits > 0 {
                // The waker moved this thread from sleeping to looking already.
                state.permits -= 1;
            } else {
                state.sleeping -= 1;
                state.looking += 1;
            }
        }
        state.looking -= 1;
        state.threads -= 1;
    }

    /// Claims and runs branches of `offer` until none is left, inside the offer's host.
    fn take_branches(self: &Arc<Self>, offer: &Arc<Offer>) {
        let mut run = || {
            while let Some(index) = offer.claim() {
                let mut state = self.lock();
                state.looking -= 1;
                self.send_helpers_to_the_queue(state, offer, HELPER_SENDS);
                // SAFETY: claimed just now, so the owner is waiting and `work` is alive.
                #[allow(unsafe_code)]
                // Counted as looking again before the branch counts as finished: once it does,
                // the owner may go on to offer the next wave, and must not find this thread
                // missing from the count and start another in its place.
                unsafe {
                    offer.run_claimed(index, None, || self.lock().looking += 1);
                }
            }
        };
        match &offer.host {
            // An offer claimed out already costs no trip through the host.
            Some(host) if !offer.exhausted() => {
                host.branch(&mut run);
                // `Release`: whoever sees it may take the host at once.
                offer.host_left.store(true, Ordering::Release);
            }
            Some(_) => {}
            None => run(),
        }
    }
}

/// The first offer in the queue with a branch left, dropping the ones claimed out.
fn next_offer(state: &mut PoolState, offered: &AtomicUsize) -> Option<Arc<Offer>> {
    while let Some(front) = state.offers.front() {
        if !front.exhausted() {
            return Some(Arc::clone(front));
        }
        front.queued.store(false, Ordering::Relaxed);
        state.offers.pop_front();
        offered.fetch_sub(1, Ordering::Release);
    }
    None
}

/// Looks for an offer without the lock for [`STAY_AWAKE`], yielding the core meanwhile, and
/// returns as soon as one appears. Only a hint: the caller looks at the queue again under the
/// lock.
fn stay_awake(offered: &AtomicUsize) {
    let start = Instant::now();
    while start.elapsed() < STAY_AWAKE && offered.load(Ordering::Acquire) == 0 {
        thread::yield_now();
    }
}
