//! The hooks an embedder gives the executor: a [`Watch`] that says when to stop, and a
//! [`Host`] that wraps each branch and each wait (an interpreter lock, say) and carries the
//! context a wave was reached in into each of its branches ([`Captured`]), and a stream's
//! context into each of its items, from stage to stage ([`ItemContext`]).

/// Asked at every node boundary whether the run should stop — how a host turns Ctrl-C or a
/// deadline into [`crate::RunError::Interrupted`].
pub trait Watch: Send + Sync {
    /// Whether to stop. Once it has said yes it should keep saying yes. Called on every node
    /// boundary of every branch, so it should be a flag read.
    fn interrupted(&self) -> bool;

    /// Called every few milliseconds by a thread that waits for a wave's branches: the time to
    /// do what is too slow for every boundary (looking for a host's pending signals, say).
    fn poll(&self) {}

    /// When the run must stop, if it has a time limit: [`Watch::interrupted`] says yes from
    /// then on. A run with one is walked on a lent thread while its caller only waits
    /// ([`crate::Executor::run_detachable`]), so that the caller returns by the deadline
    /// whatever a node does, and a run that ends past it is reported as stopped, never as a
    /// success. `None`, the default, for a run without one.
    fn deadline(&self) -> Option<std::time::Instant> {
        None
    }
}

/// How a host runtime takes part in a run: an interpreter with a global lock, say, which a
/// branch holds from node to node and gives back whenever the engine blocks.
///
/// The executor calls [`Host::branch`] on a branch's thread around the whole branch, and
/// [`Host::blocking`] around everything that waits: handing a wave's branches to their threads
/// and joining them, and calling the driver. Nothing else blocks inside the engine.
pub trait Host: Send + Sync {
    /// Runs a whole branch, on the thread that will run it.
    fn branch(&self, run: &mut dyn FnMut());
    /// Runs something that blocks.
    fn blocking(&self, run: &mut (dyn FnMut() + Send));

    /// What the branches of a wave about to start must run in, captured on the thread that
    /// reached the wave (the caller of the run for an outermost wave, the enclosing branch for
    /// a nested one), inside the host's own hold on that thread ([`Host::branch`], or the
    /// caller's). `None`, the default, when the host carries nothing: branches then run in
    /// whatever their thread holds.
    ///
    /// Called once per wave, never per branch: the per-branch cost is [`Captured::enter`]'s.
    fn capture(&self) -> Option<Box<dyn Captured>> {
        None
    }
}

/// A context captured by [`Host::capture`], entered once per branch of the wave it was captured
/// for — on whichever thread runs the branch, the caller's own included.
///
/// Shared by every branch of the wave at once, from their threads.
pub trait Captured: Send + Sync {
    /// Runs one branch in a copy of the captured context of its own, and puts back what the
    /// thread had before when `run` returns: whatever the branch changes stays its own, seen
    /// neither by its siblings nor by the next branch its thread is lent. Called inside the
    /// host's hold on the thread. `run` never unwinds (the executor catches a branch's panic
    /// inside it).
    fn enter(&self, run: &mut dyn FnMut());

    /// A copy of the captured context for one item of a [`crate::Stream`], of its own, to
    /// travel with the item through the stream's stages as a run's context goes from node to
    /// node: what a stage's nodes set in it is seen by the item's later stages, and by no other
    /// item. Made on the stream's calling thread as the item is read, inside the host's hold on
    /// that thread. `None`, the default, when the host carries nothing per item.
    fn for_item(&self) -> Option<Box<dyn ItemContext>> {
        None
    }

    /// Whether the wave's branches must all run on the thread that reached it, one after
    /// another in declared order, rather than side by side on the crew: for a context in which
    /// what a branch computes depends on which thread ran it and when. (torch's autograd
    /// numbers the operations it records with a counter per thread, and backward sums the
    /// gradients a value receives from several branches in the order of those numbers: branches
    /// on the crew's threads make that order, and the sum's last bits, change from run to run.)
    /// `false`, the default: the branches run side by side.
    fn in_order(&self) -> bool {
        false
    }
}

/// One stream item's own context ([`Captured::for_item`]), entered around each stage the item
/// goes through, on that stage's thread, inside the stage's [`Captured::enter`].
///
/// An item is in one stage at a time, so its context is entered by one thread at a time.
pub trait ItemContext: Send {
    /// Runs one stage of the item in this context, keeps what the stage's nodes changed there
    /// for the item's next stage, and puts back what the thread had before. `run` never unwinds
    /// (the stream catches a stage's panic inside it).
    fn enter(&mut self, run: &mut dyn FnMut());
}
