//! The branch state both walks stand on: the state a wave (or a `Map`) shares with its
//! branches ([`WaveState`]), the chain of branches from a node boundary up to its run, read by
//! one walk of it ([`stopped`], [`path`]) for the sync walk's lanes and the async walk's tasks
//! alike, and why a walk stopped early ([`Halt`]).
//!
//! Kept below both walks so that neither imports the other to see its branch: sync work an
//! async run lends a thread sees the task that awaits it cancelled, and names its place in the
//! waves, through a [`Branch`] it holds, not through the async walk. The sync walk's lane is a
//! [`Link`] of the chain borrowed from its stack; the async walk's [`Branch`] is one held by
//! `Arc`, as a task that outlives the stack that spawned it needs; both are read by the same
//! loop.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use super::detach::{Detached, Remains};
use super::error::RunError;

/// How many enclosing branches a node boundary looks at for a cancellation or an earlier
/// sibling's failure: a boundary must not cost the depth of the graph. A branch nested deeper
/// than that below a failure runs on to its own wave's end instead of stopping early (an async
/// one is reached through its task instead: a cancelled join cancels its children's tasks);
/// which error is reported does not depend on it.
const CANCEL_REACH: usize = 64;

/// The state one wave shares with its branches.
pub(crate) struct WaveState {
    /// The smallest declared index of a branch that failed, `usize::MAX` while none has.
    /// Written with `fetch_min(AcqRel)` and read with `Acquire` at each node boundary: it is a
    /// hint to stop early, and which error is reported is decided after the join from the
    /// outcomes themselves, so a stale read only costs a node's time, never correctness.
    pub(crate) first_failed: AtomicUsize,
}

impl WaveState {
    /// The state of a wave none of whose branches has failed yet.
    pub(crate) fn new() -> Self {
        WaveState {
            first_failed: AtomicUsize::new(usize::MAX),
        }
    }

    /// Notes that branch `index` failed: the branches declared after it stop at their next
    /// node boundary.
    pub(crate) fn fail(&self, index: usize) {
        self.first_failed.fetch_min(index, Ordering::AcqRel);
    }

    /// Whether a branch declared before branch `index` has failed.
    pub(crate) fn failed_before(&self, index: usize) -> bool {
        self.first_failed.load(Ordering::Acquire) < index
    }

    /// Whether any branch has failed.
    pub(crate) fn any_failed(&self) -> bool {
        self.first_failed.load(Ordering::Acquire) != usize::MAX
    }
}

/// One link of the chain of branches from a node boundary up to its run: a sync walk's lane,
/// an async walk's branch.
pub(crate) trait Link {
    /// The wave this link is a branch of, and its index there; `None` outside any wave.
    fn wave(&self) -> Option<(&WaveState, usize)>;

    /// Whether this link itself was cancelled (an async branch whose task the embedder
    /// cancelled); a lane never is.
    fn cancelled(&self) -> bool;

    /// The link around this one, `None` at the root of its chain.
    fn parent(&self) -> Option<&Self>;

    /// Where the chain goes on past its root: the branch of the async run's task that awaits
    /// sync work lent a thread, if any.
    fn beyond(&self) -> Option<&Branch>;
}

/// Whether the branch at `from` must stop at its next node boundary: it or a branch around it
/// was cancelled, or a sibling declared before one of them failed, within [`CANCEL_REACH`]
/// links. Asked at every node boundary of both walks.
#[inline]
pub(crate) fn stopped<L: Link>(from: &L) -> bool {
    let mut at = from;
    for _ in 0..CANCEL_REACH {
        if at.cancelled() {
            return true;
        }
        if let Some((wave, index)) = at.wave() {
            if wave.failed_before(index) {
                return true;
            }
        }
        match at.parent() {
            Some(parent) => at = parent,
            None => return at.beyond().is_some_and(stopped),
        }
    }
    false
}

/// The index of the branch at `from` in each enclosing wave, outermost first: where a span or
/// an observer's event says it ran.
pub(crate) fn path<L: Link>(from: &L) -> Vec<usize> {
    let mut path = Vec::new();
    let mut at = from;
    loop {
        if let Some((_, index)) = at.wave() {
            path.push(index);
        }
        let Some(parent) = at.parent() else { break };
        at = parent;
    }
    path.reverse();
    match at.beyond() {
        Some(beyond) => [self::path(beyond), path].concat(),
        None => path,
    }
}

/// A branch as a node's call sees it, whichever walk it is in: whether it must stop, and where
/// it stands.
pub(crate) trait Standing: Sync {
    /// Whether the branch must stop at its next node boundary ([`stopped`]).
    fn stopped(&self) -> bool;

    /// The branch's index in each enclosing wave, outermost first ([`path`]).
    fn path(&self) -> Vec<usize>;
}

impl<L: Link + Sync> Standing for L {
    fn stopped(&self) -> bool {
        stopped(self)
    }

    fn path(&self) -> Vec<usize> {
        path(self)
    }
}

/// A task's place among the waves and items around it, held by `Arc` (a task may outlive the
/// task that spawned it): through it a boundary sees that the task was cancelled, or that a
/// sibling declared before it failed, and a span says which branch it ran in.
pub(crate) struct Branch {
    parent: Option<Arc<Branch>>,
    /// The wave (or `Map`) this branch is one of, and its index there.
    wave: Option<(Arc<WaveState>, usize)>,
    /// Set when the embedder cancelled the branch's task, or its run.
    cancelled: AtomicBool,
}

impl Branch {
    /// The branch of a whole run.
    pub(crate) fn root() -> Arc<Self> {
        Arc::new(Branch {
            parent: None,
            wave: None,
            cancelled: AtomicBool::new(false),
        })
    }

    /// Branch `index` of the wave `state`, inside `parent`.
    pub(crate) fn child(parent: &Arc<Branch>, state: &Arc<WaveState>, index: usize) -> Arc<Self> {
        Arc::new(Branch {
            parent: Some(Arc::clone(parent)),
            wave: Some((Arc::clone(state), index)),
            cancelled: AtomicBool::new(false),
        })
    }

    /// Stops the branch at its next node boundary. `Release`, read with `Acquire`: a hint to
    /// stop, as a wave's `first_failed` is.
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    /// Whether this branch itself was cancelled (not an ancestor).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

impl Link for Branch {
    fn wave(&self) -> Option<(&WaveState, usize)> {
        self.wave.as_ref().map(|(wave, index)| (&**wave, *index))
    }

    fn cancelled(&self) -> bool {
        self.is_cancelled()
    }

    fn parent(&self) -> Option<&Self> {
        self.parent.as_deref()
    }

    fn beyond(&self) -> Option<&Branch> {
        None
    }
}

impl Drop for Branch {
    /// Lets go of the chain of parents without recursing once per level: a branch nested a
    /// hundred thousand waves deep is dropped in a loop.
    fn drop(&mut self) {
        let mut parent = self.parent.take();
        while let Some(branch) = parent {
            parent = match Arc::try_unwrap(branch) {
                Ok(mut only) => only.parent.take(),
                Err(_) => None,
            };
        }
    }
}

/// Why a branch stopped: its own error, because an earlier-declared sibling failed, or because
/// the run's caller stopped waiting for it.
pub(crate) enum Halt {
    Failed(RunError),
    Cancelled,
    Abandoned,
}

impl Halt {
    /// The run's remains when a walk ended with its caller giving up (`self` is
    /// [`Halt::Abandoned`]), from the run's `detached` bookkeeping: where a frame that lent
    /// from itself leaves what branches still running may borrow, its one way out on that
    /// path; `None` on any other.
    pub(super) fn remains_if_given_up(&self, detached: Option<&Detached>) -> Option<Arc<Remains>> {
        match self {
            Halt::Abandoned => Some(
                detached
                    .expect("only a detachable run is given up")
                    .remains(),
            ),
            Halt::Failed(_) | Halt::Cancelled => None,
        }
    }
}

impl From<RunError> for Halt {
    fn from(error: RunError) -> Self {
        Halt::Failed(error)
    }
}
