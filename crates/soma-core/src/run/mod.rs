//! Running a plan: resolve it once into a [`Program`](program::Program), then walk it with an
//! [`Executor`](executor::Executor), the branches of each wave on threads of a
//! [`Crew`](crew::Crew).
//!
//! The executor is where an embedder plugs in: a [`Driver`](crate::Driver) serves nodes that
//! await, a [`Watch`](hooks::Watch) says when to stop, a [`Host`](hooks::Host) wraps each
//! branch and each wait (an interpreter lock, say), a [`Trace`](trace::Trace) records spans, an [`Observer`](observer::Observer) is told each work as
//! it begins and ends, a [`NodeCache`](cache::NodeCache) serves outputs
//! already computed.
//!
//! A [`Stream`](stream::Stream) runs a program over many items, its stages overlapped.
//!
//! Two walks stand on one floor. The floor: the hooks a run holds (`executor`), the branch
//! chain and why a walk stopped (`branch`), one node's call (`call`, with the policy's side in
//! `attempt`), a step that decides (`decision`), how a fan-out settles (`settle`), beside the
//! run's vocabulary (`program`, `table`, `cache`, `keys`, `trace`, `observer`, `board`, `crew`, …). The
//! walks: `sync`, on threads, and `aio`, as futures, which lends its sync pieces to the sync
//! walk through its one entry (`Executor::walk_from`). Neither walk calls the other's private
//! methods, and no module of the floor names a walk.

pub(crate) mod aio;
mod attempt;
pub(crate) mod board;
mod branch;
pub(crate) mod cache;
mod call;
pub(crate) mod crew;
mod decision;
mod deferred;
pub(crate) mod detach;
pub(crate) mod error;
pub(crate) mod executor;
mod fork;
pub(crate) mod hooks;
mod keys;
pub(crate) mod latch;
mod lookahead;
pub(crate) mod lru;
pub(crate) mod observer;
pub(crate) mod policy;
pub(crate) mod program;
pub(crate) mod reserve;
mod settle;
pub(crate) mod stream;
mod sync;
mod table;
pub(crate) mod trace;
mod worker;
