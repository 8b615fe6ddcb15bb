//! `nested`: one more level of a walk whose depth the user's graph sets — the sub-graphs of
//! `each`, `switch` and `loop` steps, compiled and resolved one inside another — taken on a
//! fresh stack every few levels.
//!
//! Compiling or resolving a decision's sub-graph is the same work as for the graph around it,
//! so it is written once and entered again for each level; entered on the same stack, a step
//! nested ten thousand levels deep would overflow it. Every [`LEVELS_PER_STACK`] levels the
//! next runs on a thread started for it, with a stack of its own, while this one waits: a deep
//! nesting costs one short-lived, waiting thread per that many levels, and no stack grows with
//! depth (as a wave nested deep hops, in `run::wave`).

use std::panic;
use std::thread;

/// How many levels one stack takes before the next runs on a fresh one: few enough that their
/// frames fit the smallest stack a caller may compile on (256 KiB, a debug build's frames).
pub(crate) const LEVELS_PER_STACK: usize = 8;

/// The stack of a thread started to go deeper: reserved, not used, until the walk gets there.
const FRESH_STACK: usize = 64 << 20;

/// Runs `work`, the level `depth` of a nesting (the top is 0): here, or on a fresh stack
/// when this one holds [`LEVELS_PER_STACK`] levels already.
///
/// # Panics
/// Re-raises a panic of `work`; panics when no thread can be started to go deeper.
pub(crate) fn nested<R: Send>(depth: usize, work: impl FnOnce() -> R + Send) -> R {
    if depth == 0 || depth % LEVELS_PER_STACK != 0 {
        return work();
    }
    thread::scope(|scope| {
        thread::Builder::new()
            .name("soma-deeper".to_owned())
            .stack_size(FRESH_STACK)
            .spawn_scoped(scope, work)
            .expect("a thread to go deeper into a nesting of steps")
            .join()
            .unwrap_or_else(|payload| panic::resume_unwind(payload))
    })
}
