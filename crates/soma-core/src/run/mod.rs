//! Running a plan: resolve it once into a [`Program`](program::Program), then walk it with an
//! [`Executor`](executor::Executor), the branches of each wave on threads of a
//! [`Crew`](crew::Crew).
//!
//! The executor is where an embedder plugs in: a [`Driver`](crate::Driver) serves nodes that
//! await, a [`Watch`](executor::Watch) says when to stop, a [`Host`](executor::Host) wraps each
//! branch and each wait (an interpreter lock, say), a [`Trace`](crate::Trace) records spans.

pub(crate) mod crew;
pub(crate) mod executor;
pub(crate) mod program;
