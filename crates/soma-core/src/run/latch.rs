//! Latches: how one thread waits for work other threads finish — a wave's owner for its last
//! branch ([`Latch`]), a thread that hopped to a fresh stack for the one it hopped to, a branch
//! for a time-limited call on a lent thread ([`Delivery`]). Written once, so that each waiter
//! stays awake, sleeps, is woken and times out the same way.
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
//! Opening wakes no one unless a waiter sleeps: a system call even with nobody asleep costs
//! more than most waves take, and most end while their owner is still looking.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

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

/// What the latch's mutex guards: whether it is open, as a sleeper sees it, and whether anyone
/// sleeps on it (only then is a wake-up sent).
#[derive(Default)]
struct Asleep {
    done: bool,
    sleeping: bool,
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

    /// Opens it, waking whoever sleeps on it.
    pub(super) fn open(&self) {
        self.opened.store(true, Ordering::Release);
        let mut asleep = self.asleep.lock().unwrap_or_else(PoisonError::into_inner);
        asleep.done = true;
        if asleep.sleeping {
            self.woken.notify_all();
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
            asleep = match deadline {
                None => self
                    .woken
                    .wait(asleep)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    self.woken
                        .wait_timeout(asleep, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
        asleep.sleeping = false;
        drop(asleep);
        self.is_open()
    }
}

/// A value one thread delivers and another waits for: a time-limited call's outcome, the
/// outcome of a walk that hopped to a fresh stack.
pub(super) struct Delivery<T> {
    value: Mutex<Option<T>>,
    latch: Latch,
}

impl<T> Delivery<T> {
    pub(super) fn new() -> Self {
        Delivery {
            value: Mutex::new(None),
            latch: Latch::new(),
        }
    }

    /// Delivers `value` and opens the latch: once, by the thread that made it.
    pub(super) fn deliver(&self, value: T) {
        *self.value.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
        self.latch.open();
    }

    /// Whether the value has been delivered (taken since, or not).
    pub(super) fn delivered(&self) -> bool {
        self.latch.is_open()
    }

    /// Waits until the value is delivered, or `timeout` passed; true when it is.
    pub(super) fn wait(&self, timeout: Option<Duration>) -> bool {
        self.latch.wait(timeout)
    }

    /// The value, once delivered and not yet taken.
    pub(super) fn take(&self) -> Option<T> {
        self.value
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    use super::{Delivery, Latch};

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
            assert!(delivery.delivered());
            assert_eq!(delivery.take(), Some(round));
            assert_eq!(delivery.take(), None);
            deliverer.join().expect("the deliverer ends");
        }
    }
}
