//! `Crew`: the threads the branches of a program's waves run on.
//!
//! Starting a thread costs tens of microseconds — more than a small branch does. So a
//! [`crate::Program`] keeps a *standing* crew: one parked thread per branch of its waves (a
//! *member*), started the first time that branch runs and handed that same branch in every later
//! run. A branch still runs start to finish on one thread, and the thread that waits for a wave
//! never runs a branch itself.
//!
//! Waking a sleeping thread costs about as much again, on a virtual machine more, and a wave
//! would pay it twice: once to start its branches, once to get the caller back. So a member that
//! runs out of work, and a caller waiting for its wave, stay awake for a moment
//! ([`STAY_AWAKE`]) before they sleep, yielding their core meanwhile to any thread that has work:
//! a wave of short branches, or a program forwarded in a loop, finds its threads awake.
//!
//! # Why thread-local state set by one branch never reaches another
//!
//! - A member is keyed by its branch's number in the program and runs nothing else: no other
//!   branch of the program, no branch of another program (each program has a crew of its own),
//!   and never the caller's code.
//! - When a branch's member is busy — the program run from two threads at once, or from inside
//!   one of its own branches — that branch gets a fresh thread, made for it and ended with it,
//!   never a sibling's member.
//! - A child process made by `fork` inherits the crew but not its threads; a member started by
//!   another process is started again.
//!
//! What a branch leaves behind (torch's current device, a seeded random state) is therefore seen
//! only by the same branch in a later run of the same program — the reason a branch owns a
//! thread at all. The same holds for what a host keeps per thread: the Python glue keeps one
//! interpreter thread state per branch thread, so a `threading.local` set by a branch is seen by
//! that branch's next run and by nothing else.
//!
//! A one-off run ([`crate::Executor::run`] on a plan) has no later run to serve: it uses a
//! *fresh* crew, one new thread per branch.
//!
//! # Words used here, and the usual names for them
//!
//! | here | usually | what it is |
//! |---|---|---|
//! | crew | thread pool | the threads a program's waves run on |
//! | member | worker thread | one thread of the crew, parked between jobs |
//! | errand | job | one task on its way to a thread, with where its outcome goes |
//! | tally | latch (a countdown) | what a wave's caller waits on until every task reported |
//! | muster | scope guard | joins every handed-over task when dropped, even on unwind |
//!
//! # The one `unsafe` of the engine
//!
//! A branch borrows from its run (the program, the table of values, the driver), while a member
//! thread outlives every run. The borrow's lifetime is therefore erased when a branch is handed
//! over, and [`Crew::run`] keeps the promise `std::thread::scope` keeps: it returns, or unwinds,
//! only once every branch it handed over has finished and dropped what it borrowed.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SendError, Sender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

/// Work for a thread, with the lifetime of what it borrows erased (see the module docs).
type Job = Box<dyn FnOnce() + Send + 'static>;

/// How long a thread that has run out of work keeps looking for more, yielding its core to any
/// other thread that wants it, before it goes to sleep: a member for its next branch, the
/// caller for the end of its wave.
///
/// Waking a sleeping thread costs tens of microseconds on a virtual machine (the hypervisor must
/// wake an idle virtual CPU), more than a small branch takes, and a wave pays it twice: to start
/// its branches and to come back. A program forwarded in a loop, or a wave of short branches,
/// finds its threads still awake. Looking costs at most this much CPU time per thread per wave,
/// and yielding means it is taken from no thread that has work.
const STAY_AWAKE: Duration = Duration::from_micros(50);

/// What a task that never ran reports in place of its outcome.
const NOT_STARTED: &str = "soma: the operating system refused a thread for a branch";

/// Where the branches of waves run: one member per branch number, reused from run to run. A
/// branch without a member (every branch, for a fresh crew) gets a new thread that ends with it.
pub(crate) struct Crew {
    members: Box<[Member]>,
}

/// The thread of one branch, started on first use.
pub(crate) struct Member {
    /// Held by the run that is using this member, so that no two runs share it. Claimed with
    /// `Acquire` and freed with `Release`: a run that claims the member sees everything the
    /// previous run did with it (the job channel is behind its own mutex anyway); the flag
    /// itself guards nothing else, so nothing stronger is needed.
    busy: AtomicBool,
    hand: Mutex<Option<Hand>>,
}

/// A started member thread: where its work goes, and which process started it.
struct Hand {
    jobs: Sender<Job>,
    process: u32,
}

/// What a wave's tasks report back, shared with the threads running them.
pub(crate) struct Tally<T> {
    board: Mutex<Board<T>>,
    finished: Condvar,
}

struct Board<T> {
    /// Tasks handed over and not finished yet.
    running: usize,
    outcomes: Vec<Option<thread::Result<T>>>,
}

impl Crew {
    /// A standing crew for a program whose waves have `branches` branches in all; no thread is
    /// started until a branch first runs.
    pub(crate) fn standing(branches: usize) -> Crew {
        Crew {
            members: (0..branches)
                .map(|_| Member {
                    busy: AtomicBool::new(false),
                    hand: Mutex::new(None),
                })
                .collect(),
        }
    }

    /// A crew with no member: every branch on a thread of its own, for one run.
    pub(crate) fn fresh() -> Crew {
        Crew {
            members: Box::new([]),
        }
    }

    /// Number of members (branch numbers served).
    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }

    /// Runs `tasks` at once, task `i` on the thread of branch `first + i`, and returns their
    /// outcomes in order, a panic caught as `Err`.
    ///
    /// `wait` is called once every task was handed over and should block until the tally
    /// says they are done (it may do more while it waits: let go of a lock, poll for signals).
    /// Returns — or unwinds, if `wait` or a task's hand-over panics — only once every task has
    /// finished.
    #[allow(unsafe_code)]
    pub(crate) fn run<'env, T, F>(
        &self,
        first: usize,
        tasks: Vec<F>,
        wait: impl FnOnce(&Tally<T>),
    ) -> Vec<thread::Result<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'env,
    {
        let tally = Arc::new(Tally::new(tasks.len()));
        let mut muster = Muster {
            crew: self,
            tally: &tally,
            claimed: Vec::new(),
        };
        for (index, task) in tasks.into_iter().enumerate() {
            let errand = Errand {
                task: Some(task),
                index,
                tally: Arc::clone(&tally),
            };
            let job: Box<dyn FnOnce() + Send + 'env> = Box::new(move || errand.run());
            // SAFETY: `muster` lives on this frame and, when dropped — on return or on unwind —
            // waits until every errand handed over has recorded its outcome, which each does
            // only after its task (and everything the task borrows for `'env`) is gone; an
            // errand dropped unrun drops its task first as well. So no borrow outlives `'env`.
            let job = unsafe { erase(job) };
            muster.hand_over(first + index, job);
        }
        wait(&tally);
        drop(muster);
        let mut board = tally.board();
        board
            .outcomes
            .iter_mut()
            .map(|outcome| outcome.take().expect("every task recorded its outcome"))
            .collect()
    }
}

/// Forgets how long `job`'s borrows live.
///
/// # Safety
/// The caller must not let anything `job` borrows go out of scope before `job` has run or been
/// dropped, wherever that happens.
#[allow(unsafe_code)]
unsafe fn erase<'env>(job: Box<dyn FnOnce() + Send + 'env>) -> Job {
    // SAFETY: only the lifetime bound of the trait object changes; the caller vouches for it.
    unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'env>, Job>(job) }
}

/// The tasks one call to [`Crew::run`] handed over: waits for them all, and frees the members
/// it claimed, when dropped.
struct Muster<'c, T> {
    crew: &'c Crew,
    tally: &'c Tally<T>,
    claimed: Vec<usize>,
}

impl<T> Muster<'_, T> {
    fn hand_over(&mut self, number: usize, job: Job) {
        // Counted before it can finish, and only once handed over: a panic between two
        // hand-overs leaves nothing counted that will never report.
        self.tally.board().running += 1;
        match self.crew.members.get(number) {
            Some(member) if !member.busy.swap(true, Ordering::Acquire) => {
                self.claimed.push(number);
                member.give(number, job);
            }
            Some(_) | None => start_fresh(job),
        }
    }
}

impl<T> Drop for Muster<'_, T> {
    fn drop(&mut self) {
        self.tally.wait_all();
        for &number in &self.claimed {
            self.crew.members[number]
                .busy
                .store(false, Ordering::Release);
        }
    }
}

impl Member {
    /// Runs `job` on this member's thread, starting the thread if it is not running in this
    /// process.
    fn give(&self, number: usize, job: Job) {
        let mut hand = self.hand.lock().unwrap_or_else(PoisonError::into_inner);
        let process = std::process::id();
        let job = match &*hand {
            Some(started) if started.process == process => match started.jobs.send(job) {
                Ok(()) => return,
                // The thread is gone (it cannot panic, but could be stopped from outside).
                Err(SendError(job)) => job,
            },
            Some(_) | None => job,
        };
        let (jobs, inbox) = mpsc::channel::<Job>();
        let started = thread::Builder::new()
            .name(format!("soma-branch-{number}"))
            .spawn(move || {
                // Ends when the crew is dropped, which drops the sender.
                while let Some(job) = next_job(&inbox) {
                    job();
                }
            });
        match started {
            Ok(_) => {
                jobs.send(job)
                    .unwrap_or_else(|_| unreachable!("the new thread holds the receiver"));
                *hand = Some(Hand { jobs, process });
            }
            // Dropping the job records that it never ran.
            Err(_) => drop(job),
        }
    }
}

/// The member's next job, or `None` once its crew is gone: looked for awake for
/// [`STAY_AWAKE`], then waited for asleep.
fn next_job(inbox: &Receiver<Job>) -> Option<Job> {
    let start = Instant::now();
    loop {
        match inbox.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) if start.elapsed() < STAY_AWAKE => thread::yield_now(),
            Err(TryRecvError::Empty) => return inbox.recv().ok(),
        }
    }
}

/// Runs `job` on a thread of its own; if none can be had, dropping the job records that.
fn start_fresh(job: Job) {
    // A failed spawn drops the closure, and with it the job.
    let _detached = thread::Builder::new()
        .name("soma-branch".to_owned())
        .spawn(job);
}

/// One task on its way to a thread, and where its outcome goes.
struct Errand<T, F> {
    task: Option<F>,
    index: usize,
    tally: Arc<Tally<T>>,
}

impl<T, F: FnOnce() -> T> Errand<T, F> {
    fn run(mut self) {
        let task = self.task.take().expect("an errand runs once");
        // The task, and all it borrows, is gone once this returns — even if it panicked.
        let outcome = panic::catch_unwind(AssertUnwindSafe(task));
        self.tally.record(self.index, outcome);
    }
}

impl<T, F> Drop for Errand<T, F> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            drop(task);
            let refused: Box<dyn Any + Send> = Box::new(NOT_STARTED);
            self.tally.record(self.index, Err(refused));
        }
    }
}

impl<T> Tally<T> {
    fn new(tasks: usize) -> Self {
        Tally {
            board: Mutex::new(Board {
                running: 0,
                outcomes: (0..tasks).map(|_| None).collect(),
            }),
            finished: Condvar::new(),
        }
    }

    fn board(&self) -> MutexGuard<'_, Board<T>> {
        // Nothing panics while holding the lock; a poisoned board is still whole.
        self.board.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, index: usize, outcome: thread::Result<T>) {
        let mut board = self.board();
        board.outcomes[index] = Some(outcome);
        board.running -= 1;
        if board.running == 0 {
            self.finished.notify_all();
        }
    }

    /// Whether every task finishes within [`STAY_AWAKE`], looked at without sleeping.
    fn finished_soon(&self) -> bool {
        let start = Instant::now();
        loop {
            if self.board().running == 0 {
                return true;
            }
            if start.elapsed() >= STAY_AWAKE {
                return false;
            }
            thread::yield_now();
        }
    }

    /// Blocks until every task has finished.
    pub(crate) fn wait_all(&self) {
        if self.finished_soon() {
            return;
        }
        let mut board = self.board();
        while board.running > 0 {
            board = self
                .finished
                .wait(board)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Blocks until every task has finished, calling `poll` every `interval` meanwhile.
    pub(crate) fn wait_polling(&self, interval: Duration, poll: &dyn Fn()) {
        if self.finished_soon() {
            return;
        }
        let mut board = self.board();
        while board.running > 0 {
            board = self
                .finished
                .wait_timeout(board, interval)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if board.running > 0 {
                drop(board);
                poll();
                board = self.board();
            }
        }
    }
}
