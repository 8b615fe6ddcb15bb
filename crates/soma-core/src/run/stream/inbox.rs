//! A stage's inbox: the items waiting for it, keyed by index, which puts them back in input order
//! for a stage of one worker however the stages before finished them.
//!
//! The order a node sees is decided here and nowhere else: a serial stage takes only the next
//! index, a stage of several workers whichever comes first. The inbox also counts who sleeps on
//! it and who was already woken, so that items arriving faster than a woken worker gets back
//! under the lock cost one wake-up, not one each.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Condvar;

use super::item::Item;

/// Items waiting for one stage, keyed by index. Boxed: a map's node shifts its entries as the
/// first is taken, and an item is large.
pub(super) struct Inbox {
    pub(super) items: BTreeMap<u64, Box<Item>>,
    /// One worker: it takes only the next index, so its nodes see the input order.
    pub(super) serial: bool,
    /// For a serial stage, the index it takes next.
    pub(super) expected: u64,
    /// Workers asleep on the stage's condvar.
    pub(super) sleeping: usize,
    /// Wake-ups sent and not yet taken up: a worker already woken is not woken again (each
    /// wake-up is a system call), however many items arrive before it is back under the lock.
    pub(super) waking: usize,
    /// Items its workers have taken and not yet passed on.
    pub(super) held: usize,
}

impl Inbox {
    pub(super) fn ready(&self) -> bool {
        match self.items.first_key_value() {
            None => false,
            Some((&index, _)) => !self.serial || index == self.expected,
        }
    }

    /// Moves the items this stage may run next into `batch`: for a serial stage every item
    /// that follows in index order, for a stage of several workers one (its nodes are slow,
    /// and the others take the rest).
    pub(super) fn take(&mut self, batch: &mut VecDeque<Box<Item>>) {
        while self.ready() {
            let Some((_, item)) = self.items.pop_first() else {
                break;
            };
            self.expected += 1;
            self.held += 1;
            batch.push_back(item);
            if !self.serial {
                break;
            }
        }
    }

    /// After items arrived: wakes a sleeping worker if one can take them and none is on its way.
    pub(super) fn wake(&mut self, ready: &Condvar) {
        if self.sleeping > self.waking && self.ready() {
            self.waking += 1;
            ready.notify_one();
        }
    }
}
