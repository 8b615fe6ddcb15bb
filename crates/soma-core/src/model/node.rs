//! The contract of one executable unit: `Node::forward`.
//!
//! A node either answers (`Done`) or asks the [`crate::Driver`] for something (`Await`) and is
//! polled again with the answers. Awaiting instead of blocking is what lets a driver batch,
//! pace or simulate I/O for many nodes, and lets a run be traced turn by turn.
//!
//! `Send + Sync` is required because the branches of a wave borrow the catalog, and so every
//! node in it, from several threads at once.
//!
//! An *async* node ([`Node::is_async`]) is called differently: [`Node::start`] returns its call
//! as a future ([`Call`]), which the run's task polls on the embedder's event loop
//! ([`crate::Tasks`]) until it is done. A branch waiting on one holds no thread: where it stands
//! in the plan is kept in the future that walks it (see `run/aio`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::model::device::Device;
use crate::model::id::NodeId;
use crate::model::value::Value;

/// How many turns (calls of [`Node::forward`]) a node gets unless the executor is told
/// otherwise ([`crate::Executor::with_turn_limit`]): a node still awaiting after them fails.
pub const DEFAULT_TURN_LIMIT: u32 = 64;

/// What one call to [`Node::forward`] decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    /// The node's output.
    Done(Value),
    /// Requests for the driver; the node is called again with its answers in
    /// [`Ctx::results`].
    Await(Vec<Value>),
}

/// What a node knows about the call it is in.
#[derive(Clone, Copy, Debug)]
pub struct Ctx<'a> {
    node: &'a NodeId,
    turn: u32,
    results: &'a [Value],
    device: Option<Device>,
    own_context: bool,
}

impl<'a> Ctx<'a> {
    /// A context; the executor builds these, tests of a node may too.
    pub fn new(node: &'a NodeId, turn: u32, results: &'a [Value]) -> Self {
        Ctx {
            node,
            turn,
            results,
            device: None,
            own_context: false,
        }
    }

    /// The same context, for a call that runs in a context of its own (`own`): what it sets
    /// stays its own, the nodes after it never see it — a time-limited call's, which the sync
    /// walk runs on a lent thread in a copy of the branch's context, and an async node's call
    /// asks of the embedder.
    #[must_use]
    pub fn in_own_context(mut self, own: bool) -> Self {
        self.own_context = own;
        self
    }

    /// Whether the call runs in a context of its own ([`Ctx::in_own_context`]).
    pub fn has_own_context(&self) -> bool {
        self.own_context
    }

    /// The same context, for a node placed on `device`.
    #[must_use]
    pub fn on(mut self, device: Option<Device>) -> Self {
        self.device = device;
        self
    }

    /// The id of the node being called.
    pub fn node(&self) -> &'a NodeId {
        self.node
    }

    /// 0 on the first call; one more after each `Await` the driver answered.
    pub fn turn(&self) -> u32 {
        self.turn
    }

    /// The driver's answers to the previous `Await`, one per request, in order; empty on turn 0.
    pub fn results(&self) -> &'a [Value] {
        self.results
    }

    /// The device the node is placed on ([`crate::Placement`]); `None` when unplaced.
    pub fn device(&self) -> Option<Device> {
        self.device
    }
}

crate::model::failure::failure! {
    /// A node's own failure: a message and, where there is one, the error underneath (an
    /// exception of the host language, say), which travels untouched.
    NodeError
}

/// An async node's call in flight ([`Node::start`]): polled by the task of the branch that
/// made it, on the embedder's event loop, until it gives the node's output or its error.
pub type Call = Pin<Box<dyn Future<Output = Result<Value, NodeError>> + Send>>;

/// One executable unit.
pub trait Node: Send + Sync {
    /// Computes this node's output from its input, or asks the driver for something.
    ///
    /// `input` is the graph's input for a root, the predecessor's output for a node with one
    /// predecessor, and a [`Value::Map`] keyed by source id, in edge-declaration order, for a
    /// node with several.
    ///
    /// # Errors
    /// Whatever the node reports; the executor attributes it to the node.
    fn forward(&self, input: &Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError>;

    /// [`Node::forward`] on an input the executor drops once the node is done — taken from the
    /// table by its last reader, or a copy made for this call: a node may take from it what its output can reuse — the shared
    /// box an opaque value lives in, which the output of a node of the same embedder can live
    /// in instead of a new one — leaving [`Value::Null`] in its place. Only when it returns
    /// [`Transition::Done`]: a node that asks its driver is called again on the same input. The
    /// default takes nothing.
    ///
    /// # Errors
    /// As [`Node::forward`].
    fn forward_taking(&self, input: &mut Value, ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        self.forward(input, ctx)
    }

    /// Asks the processor to bring into its cache what this node's next call reads first,
    /// without waiting for it. The executor calls it on the step that comes next in a sequence
    /// before it runs the current one, so that once a graph outgrows the caches the next node's
    /// memory arrives while this node runs, instead of being waited for when it is called. A
    /// hint only: it must not block or fail; the default does nothing.
    fn prefetch(&self) {}

    /// What the node runs, for whoever watches a run ([`crate::Observer`]): the qualified name
    /// of its code (`module.Class.forward`), say, which telemetry reports as `code.function`.
    /// Asked only while a run is observed, on each call; `None`, the default, says nothing.
    fn described(&self) -> Option<String> {
        None
    }

    /// Whether the node is async: its calls are made with [`Node::start`] and awaited by its
    /// branch's task on the embedder's event loop, never with [`Node::forward`] on a thread.
    /// Asked once, when a program is resolved; `false`, the default, for a node that computes.
    fn is_async(&self) -> bool {
        false
    }

    /// Starts a call of an async node on `input`: the future the branch's task polls until the
    /// node is done. Polled only on the thread of the embedder's loop, inside a task it drives
    /// ([`crate::Tasks`]). The default makes the call with [`Node::forward`] at once, for a node
    /// that says it is async without having a call of its own; an `Await` is refused there, as
    /// an async node waits for what it needs itself.
    ///
    /// Called on the node itself, shared: the call may keep it for as long as it runs.
    fn start(self: Arc<Self>, input: &Value, ctx: &Ctx<'_>) -> Call {
        let outcome = self.forward(input, ctx).and_then(|transition| match transition {
            Transition::Done(value) => Ok(value),
            Transition::Await(_) => Err(NodeError::new(
                "an async node awaits what it needs itself: it cannot return an `Await` for a driver",
            )),
        });
        Box::pin(std::future::ready(outcome))
    }
}

impl<F> Node for F
where
    F: Fn(&Value) -> Result<Value, NodeError> + Send + Sync,
{
    fn forward(&self, input: &Value, _ctx: &Ctx<'_>) -> Result<Transition, NodeError> {
        self(input).map(Transition::Done)
    }
}
