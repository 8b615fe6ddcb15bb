//! The table of values one run writes, as each branch sees it: its own cells mutable, what its
//! ancestors produced before its wave started shared and read-only.

use crate::model::value::Value;
use crate::run::program::Read;

/// The part of the table a branch may only read: what its ancestors had produced when the
/// wave started, one segment per enclosing wave.
pub(super) struct Shared<'t> {
    pub(super) base: usize,
    pub(super) cells: &'t [Option<Value>],
    pub(super) outer: Option<&'t Shared<'t>>,
}

/// The table as one branch sees it: its own range, mutable, and the shared segments around it.
pub(super) struct Frame<'t> {
    pub(super) base: usize,
    pub(super) own: &'t mut [Option<Value>],
    pub(super) shared: Option<&'t Shared<'t>>,
}

impl Frame<'_> {
    /// The same window on the table, borrowed anew: for a frame handed to another thread while
    /// this one waits for it.
    pub(super) fn reborrow(&mut self) -> Frame<'_> {
        Frame {
            base: self.base,
            own: &mut *self.own,
            shared: self.shared,
        }
    }

    pub(super) fn read(&self, slot: usize) -> Option<&Value> {
        if let Some(cell) = slot.checked_sub(self.base).and_then(|at| self.own.get(at)) {
            return cell.as_ref();
        }
        let mut at = self.shared;
        while let Some(segment) = at {
            if let Some(cell) = slot
                .checked_sub(segment.base)
                .and_then(|i| segment.cells.get(i))
            {
                return cell.as_ref();
            }
            at = segment.outer;
        }
        None
    }

    /// The value, taken out of the table when this frame owns its cell.
    pub(super) fn take(&mut self, slot: usize) -> Option<Value> {
        match slot
            .checked_sub(self.base)
            .and_then(|at| self.own.get_mut(at))
        {
            Some(cell) => cell.take(),
            None => self.read(slot).cloned(),
        }
    }

    /// What a step reads through `read`: taken out when the step is its last reader, cloned
    /// otherwise.
    ///
    /// # Panics
    /// When the cell is empty: `Program::new` lets a read through only if an earlier step it
    /// can see writes the cell, and only its last reader takes it.
    // Inlined into a node's call: what most steps read is the one value before them, taken
    // from the branch's own cells.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub(super) fn gather(&mut self, read: Read) -> Value {
        if read.take {
            if let Some(cell) = read
                .slot()
                .checked_sub(self.base)
                .and_then(|at| self.own.get_mut(at))
            {
                return cell
                    .take()
                    .expect("a resolved program reads only values it can see");
            }
        }
        self.gather_elsewhere(read)
    }

    /// [`Frame::gather`] of a value cloned, or read from a segment shared with this frame.
    #[inline(never)]
    fn gather_elsewhere(&mut self, read: Read) -> Value {
        let value = if read.take {
            self.take(read.slot())
        } else {
            self.read(read.slot()).cloned()
        };
        value.expect("a resolved program reads only values it can see")
    }

    pub(super) fn cell(&mut self, slot: usize) -> &mut Option<Value> {
        &mut self.own[slot - self.base]
    }
}
