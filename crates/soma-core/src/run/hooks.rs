//! The hooks an embedder gives the executor: a [`Watch`] that says when to stop, and a
//! [`Host`] that wraps each branch and each wait (an interpreter lock, say).

/// Asked at every node boundary whether the run should stop — how a host turns Ctrl-C or a
/// deadline into [`crate::RunError::Interrupted`].
pub trait Watch: Send + Sync {
    /// Whether to stop. Once it has said yes it should keep saying yes. Called on every node
    /// boundary of every branch, so it should be a flag read.
    fn interrupted(&self) -> bool;

    /// Called every few milliseconds by a thread that waits for a wave's branches: the time to
    /// do what is too slow for every boundary (looking for a host's pending signals, say).
    fn poll(&self) {}
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
}
