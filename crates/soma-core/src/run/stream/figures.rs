//! Where a stream's time went: the figures it reports — items read, handed back and failed, the
//! caller's wait — and each stage's busy, waiting and blocked time.
//!
//! A stage's idle time is split in two because the two point at different culprits: waiting is
//! an item still to come from before the stage (a slow stage before it, a slow input), blocked
//! is what came after holding the stream back (a slow consumer, the bound reached). The rule
//! that splits a worker's sleep between them is here, with its tests; the worker only records
//! when it slept and why it began to.

use std::time::{Duration, Instant};

use crate::model::id::NodeId;

/// Where one stage's time went.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StageFigures {
    /// Its nodes, in plan order.
    pub nodes: Vec<NodeId>,
    /// How many items it may work on at once.
    pub workers: usize,
    /// Items it has passed on, failed ones included.
    pub items: u64,
    /// Time its workers spent running items, summed over workers.
    pub busy: Duration,
    /// Time its workers spent idle with an item still to come from before them (the stages
    /// before, or the inputs being read), summed over workers.
    pub waiting: Duration,
    /// Time its workers spent idle because what came after held the stream back: every item in
    /// flight was past this stage and the caller read no input, because the stream was at its
    /// bound or the consumer had not asked for the next result. Summed over workers.
    pub blocked: Duration,
}

/// A stream's figures so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamFigures {
    /// Inputs read.
    pub read: u64,
    /// Results handed back.
    pub succeeded: u64,
    /// Failed items handed back.
    pub failed: u64,
    /// Items read and not yet handed back.
    pub in_flight: usize,
    /// Time the caller spent waiting for the next result.
    pub waiting: Duration,
    /// Each stage, in plan order.
    pub stages: Vec<StageFigures>,
}

/// Time a worker has spent idle and not yet counted in its stage's figures.
#[derive(Default)]
pub(super) struct Idle {
    pub(super) waiting: Duration,
    pub(super) blocked: Duration,
}

/// One stretch of a worker's sleep, and whether it began held up by what comes after it.
#[derive(Clone, Copy)]
pub(super) struct Sleep {
    pub(super) from: Instant,
    pub(super) to: Instant,
    pub(super) blocked: bool,
}

impl Idle {
    /// Counts `sleep`, ended by an item whose input the caller began reading at `read_at`: a
    /// sleep that began held up stayed so until then, and waited for that item after.
    pub(super) fn add(&mut self, sleep: Sleep, read_at: Option<Instant>) {
        let Sleep { from, to, blocked } = sleep;
        if !blocked {
            self.waiting += to - from;
            return;
        }
        let held_until = read_at.map_or(to, |read_at| read_at.clamp(from, to));
        self.blocked += held_until - from;
        self.waiting += to - held_until;
    }
}

#[cfg(test)]
mod tests {
    //! How a worker's sleep is split between waiting and blocked, on made-up instants: the rule
    //! itself, which the figures of a real stream follow (`benches/python/stream.py` shows them
    //! on a slow consumer and a slow input; timing has no place in a test).

    use std::time::{Duration, Instant};

    use super::{Idle, Sleep};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_sleep_begun_with_an_item_still_to_come_is_all_waiting() {
        let from = Instant::now();
        let mut idle = Idle::default();
        let sleep = Sleep {
            from,
            to: from + ms(30),
            blocked: false,
        };
        idle.add(sleep, Some(from + ms(10)));
        assert_eq!((idle.waiting, idle.blocked), (ms(30), ms(0)));
    }

    #[test]
    fn a_sleep_begun_held_up_is_blocked_until_the_next_input_is_read_and_waiting_after() {
        let from = Instant::now();
        let mut idle = Idle::default();
        let sleep = Sleep {
            from,
            to: from + ms(30),
            blocked: true,
        };
        idle.add(sleep, Some(from + ms(20)));
        assert_eq!((idle.waiting, idle.blocked), (ms(10), ms(20)));
    }

    #[test]
    fn a_sleep_begun_held_up_and_ended_without_an_item_is_all_blocked() {
        let from = Instant::now();
        let mut idle = Idle::default();
        let sleep = Sleep {
            from,
            to: from + ms(30),
            blocked: true,
        };
        idle.add(sleep, None);
        assert_eq!((idle.waiting, idle.blocked), (ms(0), ms(30)));
    }

    #[test]
    fn an_input_read_outside_the_sleep_is_taken_as_its_nearest_end() {
        let before = Instant::now();
        let from = before + ms(50);
        let after = from + ms(80);
        let mut idle = Idle::default();
        idle.add(
            Sleep {
                from,
                to: from + ms(30),
                blocked: true,
            },
            Some(before),
        );
        assert_eq!((idle.waiting, idle.blocked), (ms(30), ms(0)));
        idle.add(
            Sleep {
                from,
                to: from + ms(30),
                blocked: true,
            },
            Some(after),
        );
        assert_eq!((idle.waiting, idle.blocked), (ms(30), ms(30)));
    }
}
