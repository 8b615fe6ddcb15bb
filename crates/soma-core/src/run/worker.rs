//! The threads Soma starts to run branches: a crew's ([`crate::run::crew`]) and the one kept in
//! reserve for whichever crew next needs one ([`crate::run::reserve`]).
//!
//! One place names them and sizes their stack, so that a thread taken from the reserve is the
//! thread a crew would have started itself; the crew and the reserve both start threads here,
//! and neither starts them through the other.

use std::io;
use std::thread;

use super::trace::{set_thread_role, ThreadRole};

/// The stack a crew thread gets unless told otherwise: what a process's main thread usually has
/// (and a Python `threading.Thread` gets by default), so that whatever a node survives there —
/// a deep `repr`, pickling a deep structure — it survives on a crew thread. Reserved, not
/// used: only the pages a branch touches cost memory.
pub(crate) const DEFAULT_STACK: usize = 8 << 20;

/// Starts a thread of Soma's, named as every one is, with a stack of `stack_size` bytes, to run
/// `life`: a crew thread, or one for the reserve.
pub(super) fn start_worker(
    stack_size: usize,
    life: impl FnOnce() + Send + 'static,
) -> io::Result<()> {
    thread::Builder::new()
        .name("soma-worker".to_owned())
        .stack_size(stack_size)
        .spawn(move || {
            set_thread_role(ThreadRole::Crew);
            life();
        })
        .map(drop)
}
