//! Latches: how one thread waits for work other threads finish — a wave's owner for its last
//! branch ([`Latch`]), a thread that hopped to a fresh stack for the one it hopped to, a branch
//! for a time-limited call on a lent thread, an async run's task for a piece of sync work lent
//! to the crew ([`Delivery`]) — and the one loop by which a waiter that must also watch the run
//! waits ([`wait_watching`]). Written once, so that each waiter stays awake, sleeps, is woken,
//! polls the watch and times out the same way.
//!
//! # Memory ordering
//!
//! A latch is opened once, by the thread that finishes the work, after it wrote what the
//! waiter reads (outcomes, a delivered value). `open` stores `opened` with `Release`; a waiter
//! reads it with `Acquire` (while it looks awake, and on return), so everything the opener wrote
//! before opening is visible to a waiter that saw it open. A waiter that goes to sleep does so
//! under the latch's mutex, which the opener takes to set `done` and to wake it: either the
//! opener's store comes before the waiter's check under the lock (the waiter never sleeps), or
//! the waiter is asleep when the opener takes the lock (and is woken). No wake-up is lost, and
//! the waiter's return after a timeout reads `opened` once more, so it never reports "not
//! open" for a latch opened before it looked.
//!
//! A waiter that stops waiting (a run's caller that gives up) leaves the run's remains on the
//! latch ([`Latch::leave`]), for the opener to let go of: under the same mutex, so either the
//! latch is open already (the work is done, and nothing is kept) or the opener finds the
//! remains when it takes the lock to open it, and drops them once it has let go of the lock —
//! after the work, which may borrow from them, is done with them.
//!
//! A task of an async run waits for a [`Delivery`] without a thread ([`Delivery::arrival`]):
//! the value and the task's waker are kept under one mutex, the waker stored only by a poll
//! that found no value, and taken by the deliverer as it stores the value; so either the poll
//! sees the value, or the deliverer sees the waker and wakes it — after letting go of the mutex,
//! as a waker may take locks of its own (the embedder's).
//!
//! Opening wakes no one unless a waiter sleeps: a system call even with nobody asleep costs
//! more than most waves take, and most end while their owner is still looking.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use super::detach::Remains;
use super::hooks::Watch;

/// How long a thread that has run out of work keeps looking for more, yielding its core to any
/// other thread that wants it, before it sleeps: a crew thread for the next offer, an owner for
/// the end of its wave.
///
/// Waking a sleeping thread costs tens of microseconds on a virtual machine, more than a small
/// branch takes. A program forwarded in a loop, or a wave of short branches, finds its threads
/// still awake. Looking costs at most this much CPU time per thread per wave, and yielding means
/// it is taken from no thread that has work.
pub(super) const STAY_AWAKE: Duration = Duration::from_micros(50);

/// How often a thread that waits asks the [`crate::Watch`] whether to stop, when it is the one
/// that polls it (the run's caller, a stream's reader, a branch waiting for a time-limited
/// call, an embedder's caller waiting for a run): often enough that Ctrl-C and a deadline are
/// seen at once, rarely enough to cost nothing.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(5);

/// Opened once, by whoever finishes the work; waited on by one thread or more.
pub(super) struct Latch {
    opened: AtomicBool,
    asleep: Mutex<Asleep>,
    woken: Condvar,
}

/// What the latch's mutex guards: whether it is open, as a sleeper sees it, whether anyone
/// sleeps on it (only then is a wake-up sent), and what a waiter that stopped waiting left for
/// the opener to let go of.
#[derive(Default)]
struct Asleep {
    done: bool,
    sleeping: bool,
    left: Option<Arc<Remains>>,
}

impl Latch {
    pub(super) fn new() -> Self {
        Latch {
            opened: AtomicBool::new(false),
            asleep: Mutex::default(),
            woken: Condvar::new(),
        }
    }

    /// Whether it has been opened; what the opener wrote before is visible after.
    pub(super) fn is_open(&self) -> bool {
        self.opened.load(Ordering::Acquire)
    }

    /// Opens it, waking whoever sleeps on it, and lets go of what a waiter left on it: called
    /// once the opener no longer touches anything the waiter lent the work.
    pub(super) fn open(&self) {
        self.opened.store(true, Ordering::Release);
        let mut asleep = self.asleep.lock().unwrap_or_else(PoisonError::into_inner);
        asleep.done = true;
        if asleep.sleeping {
            self.woken.notify_all();
        }
        let left = asleep.left.take();
        drop(asleep);
        drop(left);
    }

    /// Keeps `remains` alive until the latch opens, for a waiter that stops waiting while the
    /// work may still borrow from them; nothing is kept when it is open already.
    pub(super) fn leave(&self, remains: &Arc<Remains>) {
        let mut asleep = self.asleep.lock().unwrap_or_else(PoisonError::into_inner);
        if !asleep.done {
            asleep.left = Some(Arc::clone(remains));
        }
    }

    /// Waits until it is open, or `timeout` passed; true when it is open. Looks awake for
    /// [`STAY_AWAKE`] first, then sleeps.
    pub(super) fn wait(&self, timeout: Option<Duration>) -> bool {
        let start = Instant::now();
        while start.elapsed() < STAY_AWAKE {
            if self.is_open() {
                return true;
            }
            thread::yield_now();
        }
        let deadline = timeout.and_then(|timeout| start.checked_add(timeout));
        let mut asleep = self.asleep.lock().unwrap_or_else(PoisonError::into_inner);
        while !asleep.done {
            asleep.sleeping = true;
            let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
            if left.is_some_and(|left| left.is_zero()) {
                break;
            }
            asleep = sleep_on(&self.woken, asleep, left);
        }
        asleep.sleeping = false;
        drop(asleep);
        self.is_open()
    }
}

/// Sleeps on `woken` once, holding `guard`'s mutex again on waking: until notified, or `timeout`
/// passed when there is one. A poisoned mutex is taken as it is, as everywhere in the engine: a
/// panic is the walk's to report, never a second one here. Spurious wake-ups are the caller's
/// loop's to see.
pub(super) fn sleep_on<'g, T>(
    woken: &Condvar,
    guard: MutexGuard<'g, T>,
    timeout: Option<Duration>,
) -> MutexGuard<'g, T> {
    match timeout {
        None => woken.wait(guard).unwrap_or_else(PoisonError::into_inner),
        Some(timeout) => {
            woken
                .wait_timeout(guard, timeout)
                .unwrap_or_else(PoisonError::into_inner)
                .0
        }
    }
}

/// A value one thread delivers and another waits for: a time-limited call's outcome, the
/// outcome of a walk that hopped to a fresh stack, of a piece of sync work an async run lent.
pub(super) struct Delivery<T> {
    /// The value, once delivered and not yet taken, and the waker of a task waiting for it
    /// without a thread (see the module's header).
    value: Mutex<(Option<T>, Option<Waker>)>,
    latch: Latch,
}

impl<T> Delivery<T> {
    pub(super) fn new() -> Self {
        Delivery {
            value: Mutex::new((None, None)),
            latch: Latch::new(),
        }
    }

    /// Delivers `value`, opens the latch and wakes the task that waits for it, if one does:
    /// once, by the thread that made it.
    pub(super) fn deliver(&self, value: T) {
        let waker = {
            let mut slot = self.value.lock().unwrap_or_else(PoisonError::into_inner);
            slot.0 = Some(value);
            slot.1.take()
        };
        self.latch.open();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Waits until the value is delivered, or `timeout` passed; true when it is.
    pub(super) fn wait(&self, timeout: Option<Duration>) -> bool {
        self.latch.wait(timeout)
    }

    /// Keeps `remains` alive until the value is delivered ([`Latch::leave`]).
    pub(super) fn leave(&self, remains: &Arc<Remains>) {
        self.latch.leave(remains);
    }

    /// The value, once delivered and not yet taken.
    pub(super) fn take(&self) -> Option<T> {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .take()
    }

    /// The value, for a task that waits for it without a thread; `None` as soon as a poll
    /// finds `stop` true before the value is there.
    pub(super) async fn arrival(&self, stop: impl Fn() -> bool) -> Option<T> {
        std::future::poll_fn(|cx| {
            let mut slot = self.value.lock().unwrap_or_else(PoisonError::into_inner);
            match slot.0.take() {
                Some(value) => Poll::Ready(Some(value)),
                None if stop() => Poll::Ready(None),
                None => {
                    slot.1 = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

/// How a [`wait_watching`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waited {
    /// What it waited for is done.
    Done,
    /// Its `stop` said to stop waiting.
    Stopped,
    /// Its deadline passed first.
    PastDeadline,
}

/// The one loop by which a thread waits for work and watches the run meanwhile: the run's
/// caller for a wave or a walk handed off, a branch for a time-limited call, a stream's reader
/// for its next result and its closer for the stages to stop.
///
/// `done(timeout)` waits at most `timeout` (for ever with `None`) and says whether the work is
/// done. Between its waits, at most [`WATCH_INTERVAL`] apart, this polls `watch` (a host's
/// pending signals) and asks `stop` whether to stop waiting, and looks at the `deadline`. A
/// wait with nothing to look at between — no watch, no `stop`, no deadline — sleeps until done.
/// Done wins over stopping and over the deadline when both are there at once.
pub(super) fn wait_watching(
    done: &mut dyn FnMut(Option<Duration>) -> bool,
    watch: Option<&dyn Watch>,
    mut stop: Option<&mut dyn FnMut() -> bool>,
    deadline: Option<Instant>,
) -> Waited {
    let looks = watch.is_some() || stop.is_some();
    loop {
        let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
        let slice = match (looks, left) {
            (true, Some(left)) => Some(left.min(WATCH_INTERVAL)),
            (true, None) => Some(WATCH_INTERVAL),
            (false, left) => left,
        };
        if done(slice) {
            return Waited::Done;
        }
        // Out of whatever lock `done` took: a watch may take the host's lock to look for
        // signals.
        if let Some(watch) = watch {
            watch.poll();
        }
        if stop.as_mut().is_some_and(|stop| stop()) {
            return Waited::Stopped;
        }
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            return Waited::PastDeadline;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::future::Future;
    use std::pin::pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Condvar, Mutex};
    use std::task::{Context, Poll, Wake, Waker};
    use std::thread;
    use std::time::{Duration, Instant};

    use super::{wait_watching, Delivery, Latch, Waited};
    use crate::run::detach::Remains;
    use crate::run::hooks::Watch;

    /// Long enough that only a lost wake-up reaches it.
    const DEADLINE: Duration = Duration::from_secs(30);

    #[test]
    fn a_latch_opened_before_the_wait_is_seen_open_at_once() {
        let latch = Latch::new();
        latch.open();
        assert!(latch.is_open());
        assert!(latch.wait(None));
    }

    #[test]
    fn a_wait_with_a_timeout_on_a_latch_never_opened_says_not_open() {
        let latch = Latch::new();
        assert!(!latch.wait(Some(Duration::from_millis(1))));
        assert!(!latch.is_open());
    }

    #[test]
    fn a_waiter_sees_every_value_delivered_by_another_thread_whenever_it_comes() {
        for round in 0..200_u32 {
            let delivery = Arc::new(Delivery::new());
            let theirs = Arc::clone(&delivery);
            let deliverer = thread::spawn(move || theirs.deliver(round));
            assert!(delivery.wait(Some(DEADLINE)), "round {round}: woken");
            assert_eq!(delivery.take(), Some(round));
            assert_eq!(delivery.take(), None);
            deliverer.join().expect("the deliverer ends");
        }
    }

    #[test]
    fn what_a_waiter_left_on_a_latch_is_let_go_of_when_it_opens_and_not_before() {
        let (latch, remains) = (Latch::new(), Arc::new(Remains::new()));
        latch.leave(&remains);
        assert_eq!(Arc::strong_count(&remains), 2, "kept while the work runs");
        latch.open();
        assert_eq!(Arc::strong_count(&remains), 1, "let go of once it opened");
    }

    #[test]
    fn a_latch_open_already_keeps_nothing_a_waiter_leaves() {
        let (latch, remains) = (Latch::new(), Arc::new(Remains::new()));
        latch.open();
        latch.leave(&remains);
        assert_eq!(Arc::strong_count(&remains), 1);
    }

    /// Counts its wake-ups, and lets a test wait for the first.
    #[derive(Default)]
    struct Woken {
        times: Mutex<usize>,
        changed: Condvar,
    }

    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            *self.times.lock().unwrap() += 1;
            self.changed.notify_all();
        }
    }

    #[test]
    fn a_task_waiting_for_a_delivery_is_woken_by_the_deliverer_and_finds_the_value() {
        for round in 0..200_u32 {
            let delivery = Arc::new(Delivery::new());
            let woken = Arc::new(Woken::default());
            let waker = Waker::from(Arc::clone(&woken));
            let mut cx = Context::from_waker(&waker);
            let mut arrival = pin!(delivery.arrival(|| false));
            let theirs = Arc::clone(&delivery);
            let mut deliverer = Some(thread::spawn(move || theirs.deliver(round)));
            let found = loop {
                if let Poll::Ready(found) = arrival.as_mut().poll(&mut cx) {
                    break found;
                }
                // Pending: the deliverer has not delivered when the waker was stored, so it
                // wakes it; waited for with a deadline, never a sleep.
                let times = woken.times.lock().unwrap();
                let (times, timeout) = woken
                    .changed
                    .wait_timeout_while(times, DEADLINE, |times| *times == 0)
                    .unwrap();
                assert!(
                    !timeout.timed_out(),
                    "round {round}: the task was never woken"
                );
                drop(times);
                deliverer.take().map(thread::JoinHandle::join);
            };
            assert_eq!(found, Some(round));
            if let Some(deliverer) = deliverer {
                deliverer.join().expect("the deliverer ends");
            }
        }
    }

    #[test]
    fn a_task_told_to_stop_before_a_delivery_stops_waiting_without_a_value() {
        let delivery: Delivery<u32> = Delivery::new();
        let waker = Waker::from(Arc::new(Woken::default()));
        let mut cx = Context::from_waker(&waker);
        let stop = Cell::new(false);
        let mut arrival = pin!(delivery.arrival(|| stop.get()));
        assert_eq!(arrival.as_mut().poll(&mut cx), Poll::Pending);
        stop.set(true);
        assert_eq!(arrival.as_mut().poll(&mut cx), Poll::Ready(None));
    }

    /// A watch that counts its polls.
    #[derive(Default)]
    struct Counting {
        polls: AtomicUsize,
    }

    impl Watch for Counting {
        fn interrupted(&self) -> bool {
            false
        }

        fn poll(&self) {
            self.polls.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_waiter_polls_the_watch_between_its_waits_each_at_most_the_watch_interval() {
        let watch = Counting::default();
        let mut waits = Vec::new();
        let mut done = |timeout: Option<Duration>| {
            waits.push(timeout);
            waits.len() == 3
        };
        let waited = wait_watching(&mut done, Some(&watch), None, None);
        assert_eq!(waited, Waited::Done);
        assert_eq!(
            watch.polls.load(Ordering::Relaxed),
            2,
            "once between each two waits"
        );
        assert!(waits
            .iter()
            .all(|wait| wait.is_some_and(|wait| wait <= super::WATCH_INTERVAL)));
    }

    #[test]
    fn a_waiter_with_nothing_to_watch_sleeps_until_done() {
        let mut waits = Vec::new();
        let mut done = |timeout: Option<Duration>| {
            waits.push(timeout);
            waits.len() == 2
        };
        assert_eq!(wait_watching(&mut done, None, None, None), Waited::Done);
        assert_eq!(waits, [None, None]);
    }

    #[test]
    fn a_waiter_stops_when_told_to_and_done_wins_over_stopping() {
        let mut asked = 0;
        let mut stop = || {
            asked += 1;
            asked == 2
        };
        let waited = wait_watching(&mut |_| false, None, Some(&mut stop), None);
        assert_eq!((waited, asked), (Waited::Stopped, 2));
        let mut stop = || true;
        let waited = wait_watching(&mut |_| true, None, Some(&mut stop), None);
        assert_eq!(waited, Waited::Done);
    }

    #[test]
    fn a_waiter_past_its_deadline_stops_waiting_and_says_so() {
        let past = Instant::now();
        let mut waits = Vec::new();
        let mut done = |timeout: Option<Duration>| {
            waits.push(timeout);
            false
        };
        assert_eq!(
            wait_watching(&mut done, None, None, Some(past)),
            Waited::PastDeadline
        );
        assert_eq!(waits, [Some(Duration::ZERO)], "one wait, of what was left");
    }
}
