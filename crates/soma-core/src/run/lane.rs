//! `Lane`: where a branch stands while it runs — its index in each wave around it, the crew
//! its own waves borrow threads from, the thread that started the run — and the state a wave
//! shares with its branches, through which a failing branch stops its later siblings.
//!
//! The executor walks a branch along its lane and a wave gives each of its branches one; kept
//! apart from both, so that the executor names a lane without importing the wave that extends
//! it, and the wave imports the executor one way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;

use super::aio::AioBranch;
use super::crew::Crew;
use super::detach::Detached;
use super::keys::RunKeys;
use super::program::{Program, Step};

/// How many enclosing waves a node boundary looks at for an earlier sibling's failure.
const CANCEL_REACH: usize = 64;

/// The state one wave shares with its branches.
pub(crate) struct WaveState {
    /// The smallest declared index of a branch that failed, `usize::MAX` while none has.
    /// Written with `fetch_min(AcqRel)` and read with `Acquire` at each node boundary: it is a
    /// hint to stop early, and which error is reported is decided after the join from the
    /// outcomes themselves, so a stale read only costs a node's time, never correctness.
    pub(crate) first_failed: AtomicUsize,
}

/// Where a branch stands: its index in its wave, the lane of the branch around that wave, the
/// crew the branches of its own waves run on, the thread that started the run and, for a run
/// its caller may stop waiting for, that run's bookkeeping (the last three the run's, the same
/// at every depth).
#[derive(Clone, Copy)]
pub(super) struct Lane<'s> {
    pub(super) wave: Option<(&'s WaveState, usize)>,
    pub(super) parent: Option<&'s Lane<'s>>,
    pub(super) crew: &'s Crew,
    pub(super) caller: thread::ThreadId,
    pub(super) detached: Option<&'s Detached>,
    /// The program run: its node ids by slot (a step keeps only its slot), and its policies.
    pub(super) program: &'s Program,
    /// Whether the run prefetches each next node ([`Program::prefetching`]).
    pub(super) prefetching: bool,
    /// The run's cache and the identities of its values, when it runs with a cache.
    pub(super) keys: Option<&'s RunKeys>,
    /// For sync work an async run lent a thread (see `run/aio`): the branch of the task that
    /// waits for it, whose cancellation — and the failures of its earlier siblings — stop this
    /// work at its next boundary too, and whose place in the waves begins this lane's path.
    pub(super) outer: Option<&'s AioBranch>,
}

impl<'s> Lane<'s> {
    /// The lane of a whole run, outside every wave.
    pub(super) fn root(
        crew: &'s Crew,
        program: &'s Program,
        detached: Option<&'s Detached>,
        keys: Option<&'s RunKeys>,
    ) -> Self {
        Lane {
            wave: None,
            parent: None,
            crew,
            caller: thread::current().id(),
            detached,
            program,
            prefetching: program.prefetching(),
            keys,
            outer: None,
        }
    }

    /// Marks `step` running, or no longer, in a run its caller may leave, which names the nodes
    /// still running when it gives up.
    pub(super) fn mark_running(&self, step: &Step, running: bool) {
        if let Some(run) = self.detached {
            run.set_running(
                self.program,
                step.slot(),
                &self.program.ids[step.slot()],
                running,
            );
        }
    }

    /// The index of this branch in each enclosing wave, outermost first.
    pub(super) fn path(&self) -> Vec<usize> {
        let mut path = Vec::new();
        let mut at = Some(self);
        while let Some(lane) = at {
            if let Some((_, index)) = lane.wave {
                path.push(index);
            }
            at = lane.parent;
        }
        path.reverse();
        match self.outer {
            Some(outer) => [outer.path(), path].concat(),
            None => path,
        }
    }

    /// Whether a branch declared before this one has failed, in any of the
    /// [`CANCEL_REACH`] waves around it.
    ///
    /// Asked at every node boundary, so it must not cost the depth of the graph: a branch
    /// nested deeper than that below a failure runs on to its own wave's end instead of
    /// stopping early. Which error is reported does not depend on it.
    pub(super) fn cancelled(&self) -> bool {
        let mut at = Some(self);
        for _ in 0..CANCEL_REACH {
            let Some(lane) = at else {
                return self.outer.is_some_and(AioBranch::stopped);
            };
            if let Some((wave, index)) = lane.wave {
                if wave.first_failed.load(Ordering::Acquire) < index {
                    return true;
                }
            }
            at = lane.parent;
        }
        false
    }
}
