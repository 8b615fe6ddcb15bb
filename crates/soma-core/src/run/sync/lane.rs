//! `Walk` and `Lane`: what every branch of one walk of a run shares — the crew its waves borrow
//! threads from, the thread that started the run, the run's bookkeeping — and where one branch
//! stands in it — the program it runs, its index in each wave around it. A lane is a link of
//! the branch chain both walks read ([`crate::run::branch`]): through it a failing branch stops
//! its later siblings, and sync work an async run lent a thread sees the task awaiting it
//! stopped.
//!
//! Kept apart because they change at different rates: a walk's constants are made once, where
//! the walk begins, and lent by reference; a lane is made for every branch and every
//! sub-program a step runs, and passed by value down the walk, so it holds only what differs
//! between them.
//!
//! The executor walks a branch along its lane and a wave gives each of its branches one; kept
//! apart from both, so that the executor names a lane without importing the wave that extends
//! it, and the wave imports the executor one way.
//!
//! A lane points only to what lives as long as every branch that may hold a copy of it: in a
//! run its caller may leave, the walk is kept on the heap with the run's parts
//! ([`crate::run::detach`]), as is the lane a fan-out lends its branches (their parent).

use std::thread;

use crate::run::board::Board;
use crate::run::branch::{self, Branch, Link, WaveState};
use crate::run::call::Site;
use crate::run::crew::Crew;
use crate::run::detach::Detached;
use crate::run::keys::RunKeys;
use crate::run::program::Program;

/// One walk of a run, as every branch of it shares it, by reference: the crew the branches of
/// its waves run on, the thread that started the run and, for a run its caller may stop waiting
/// for, that run's bookkeeping. The same from the walk's root to its deepest branch, through
/// the sub-programs its `Map`, `Switch` and `Loop` steps run. A walk is a whole run's, a
/// stream's stage's for one item, or a piece of sync work an async run lends a thread.
pub(super) struct Walk<'s> {
    pub(super) crew: &'s Crew,
    pub(super) caller: thread::ThreadId,
    pub(super) detached: Option<&'s Detached>,
    /// For sync work an async run lent a thread (see `run/aio`): the branch of the task that
    /// waits for it, whose cancellation — and the failures of its earlier siblings — stop this
    /// work at its next boundary too, and whose place in the waves begins this walk's paths.
    pub(super) awaited_by: Option<&'s Branch>,
    /// The board the run keeps its nodes' states on, when it keeps one: the executor's for a
    /// whole run, the item's own for a streamed item's.
    pub(super) board: Option<&'s Board>,
}

/// Where a branch stands in its walk, passed by value down it: the program it runs (the run's,
/// or a sub-program of a step around it) with that program's cache keys, its index in the
/// wave it is a branch of, and the lane of the branch around that wave.
#[derive(Clone, Copy)]
pub(super) struct Lane<'s> {
    pub(super) walk: &'s Walk<'s>,
    /// The program run: its node ids by slot (a step keeps only its slot), and its policies.
    pub(super) program: &'s Program,
    /// The run's cache and the identities of the program's values, when it runs with a cache.
    pub(super) keys: Option<&'s RunKeys>,
    /// Whether the branch prefetches each next node ([`Program::prefetching`]).
    pub(super) prefetching: bool,
    wave: Option<(&'s WaveState, usize)>,
    parent: Option<&'s Lane<'s>>,
}

impl<'s> Walk<'s> {
    /// A walk on `crew`, of the run `caller` started, with that run's `detached` bookkeeping,
    /// the branch of an async run's task that awaits it, if any, and the run's board, if it
    /// keeps one.
    pub(super) fn new(
        crew: &'s Crew,
        caller: thread::ThreadId,
        detached: Option<&'s Detached>,
        awaited_by: Option<&'s Branch>,
        board: Option<&'s Board>,
    ) -> Self {
        Walk {
            crew,
            caller,
            detached,
            awaited_by,
            board,
        }
    }
}

impl<'s> Lane<'s> {
    /// The lane at the root of `walk`, outside every wave, running `program` with `keys`,
    /// prefetching each next node or not.
    pub(super) fn new(
        walk: &'s Walk<'s>,
        program: &'s Program,
        keys: Option<&'s RunKeys>,
        prefetching: bool,
    ) -> Self {
        Lane {
            walk,
            program,
            keys,
            prefetching,
            wave: None,
            parent: None,
        }
    }

    /// The lane of branch `index` of the wave `wave`, inside this one.
    pub(super) fn branch(&'s self, wave: &'s WaveState, index: usize) -> Self {
        Lane {
            wave: Some((wave, index)),
            parent: Some(self),
            ..*self
        }
    }

    /// This lane, running the sub-program `body` with `keys` instead (an item, a case or an
    /// iteration of a step): in the step's place in the waves around it, never prefetching.
    pub(super) fn body<'b>(&self, body: &'b Program, keys: Option<&'b RunKeys>) -> Lane<'b>
    where
        's: 'b,
    {
        Lane {
            program: body,
            keys,
            prefetching: false,
            ..*self
        }
    }

    /// Where a node's call is made along this lane: its program and keys, the walk's crew and
    /// bookkeeping, and this lane as its branch.
    #[inline]
    pub(super) fn site(&self) -> Site<'_> {
        Site {
            program: self.program,
            keys: self.keys,
            crew: self.walk.crew,
            detached: self.walk.detached,
            board: self.walk.board,
            branch: self,
        }
    }

    /// The index of this branch in each enclosing wave, outermost first, from the task that
    /// awaits this walk, if any ([`branch::path`]).
    pub(super) fn path(&self) -> Vec<usize> {
        branch::path(self)
    }

    /// Whether a branch declared before this one has failed, in any of the waves around it
    /// that a node boundary looks at, or the task that awaits this walk was stopped
    /// ([`branch::stopped`]).
    ///
    /// Asked at every node boundary, so it must not cost the depth of the graph. Which error
    /// is reported does not depend on it.
    #[inline]
    pub(super) fn cancelled(&self) -> bool {
        branch::stopped(self)
    }
}

impl Link for Lane<'_> {
    #[inline]
    fn wave(&self) -> Option<(&WaveState, usize)> {
        self.wave
    }

    #[inline]
    fn cancelled(&self) -> bool {
        false
    }

    #[inline]
    fn parent(&self) -> Option<&Self> {
        self.parent
    }

    fn beyond(&self) -> Option<&Branch> {
        self.walk.awaited_by
    }
}
