//! # soma-core
//!
//! Soma's engine, with no Python in it: a [`Graph`] of node ids, a [`Catalog`] of what each node
//! does, [`compile()`] to turn them into a [`Plan`] — a series-parallel tree of `Sequence`s,
//! `Wave`s and `Execute` steps — and an [`Executor`] that runs it, the branches of each wave
//! launched together and each run start to finish on one thread, lent from a pool that holds
//! about as many threads as branches are in flight at once.
//!
//! With a [`NodeCache`] ([`Executor::with_cache`]), a run computes only what changed since the
//! last: a node whose [`Key`] — chained from its fingerprint and its inputs' keys — is in the
//! cache is not called.
//!
//! A [`Stream`] runs a program over many items, its stages overlapped: each node on one item at
//! a time and in order, different nodes on different items at once, in bounded memory.
//!
//! ```
//! use soma_core::{compile, node, Executor, NodeError, Value};
//!
//! let double = |x: &Value| -> Result<Value, NodeError> {
//!     Ok(Value::Int(x.as_int().unwrap_or(0) * 2))
//! };
//! let sum = |x: &Value| -> Result<Value, NodeError> {
//!     let pairs = x.as_map().ok_or_else(|| NodeError::new("expected a map"))?;
//!     Ok(Value::Int(pairs.iter().filter_map(|(_, v)| v.as_int()).sum()))
//! };
//! let (graph, catalog) = (node("source", double)
//!     >> ((node("left", double) >> node("left2", double)) | node("right", double))
//!     >> node("join", sum))
//! .somatize()?;
//! let plan = compile(&graph, &catalog)?;
//! assert_eq!(plan.shape(), "Sequence([Execute, Wave([Sequence([Execute, Execute]), Execute]), Execute])");
//! assert_eq!(Executor::new().run(&plan, &catalog, Value::Int(1))?, Value::Int(8 + 4));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

mod compile;
mod model;
mod nesting;
mod observe;
mod plan;
mod run;

pub use compile::{
    compile, compile_decided, decompose, distribute, CompileError, Route, RouteError,
};
pub use model::catalog::Catalog;
pub use model::decision::{Decision, Decisions, Setting, SettingError};
pub use model::device::{Device, DeviceError, DeviceKind, Placement};
pub use model::driver::{Driver, DriverError};
pub use model::expr::{each, node, node_arc, repeat, switch, Expr};
pub use model::graph::{Graph, GraphError};
pub use model::host::{HostError, HostName, HostPlacement, HOST_NAME_LIMIT};
pub use model::id::NodeId;
pub use model::key::Key;
pub use model::node::{Call, Ctx, Node, NodeError, Transition, DEFAULT_TURN_LIMIT};
pub use model::policy::{AttemptError, RetryFilter, RetryPolicy, WrittenPolicies, WrittenPolicy};
pub use model::reading::{NativeReading, NotItems, Reading};
pub use model::value::Value;
pub use observe::devices::{Drawing, GraphWithDevices};
pub use plan::Plan;
pub use run::aio::hooks::{Interrupt, Pause, Spawned, Tasks};
pub use run::aio::{Flow, FlowSettings, ItemOutcome, Settled, Task};
pub use run::board::{Board, Change, NodeState, RESOLUTION};
pub use run::cache::{Entry, Found, MemoryCache, NodeCache, Unread};
pub use run::crew::DEFAULT_IDLE_THREADS;
pub use run::detach::STOP_GRACE;
pub use run::error::{ProgramError, RunError};
pub use run::executor::{prefetch_line, Executor};
pub use run::hooks::{Captured, Host, ItemContext, Watch};
pub use run::latch::WATCH_INTERVAL;
pub use run::lru::{Inserted, Lru};
pub use run::observer::{Begun, Ended, Observer, Opened, Part};
pub use run::policy::{Clock, Policies, Policy, Retry, RetryOn, SystemClock, JITTER, MAX_BACKOFF};
pub use run::program::Program;
pub use run::reserve::{keep_a_thread_in_reserve, thread_in_reserve};
pub use run::stream::{
    Failed, OnError, StageFigures, Stream, StreamError, StreamFigures, StreamSettings,
    DEFAULT_IN_FLIGHT,
};
pub use run::trace::{thread_number, thread_role, Span, ThreadRole, Trace};
