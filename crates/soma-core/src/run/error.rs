//! The errors of the run stage: [`ProgramError`] when a plan cannot be resolved into a program,
//! [`RunError`] when a run stops. Each variant names its node.

use std::fmt;

use crate::model::driver::DriverError;
use crate::model::host::HostName;
use crate::model::id::NodeId;
use crate::model::node::NodeError;

/// Why a run stopped.
#[derive(Clone, Debug)]
pub enum RunError {
    /// A node reported an error.
    NodeFailed {
        /// The node.
        node: NodeId,
        /// What it reported.
        error: NodeError,
    },
    /// A node awaited, and the executor has no driver.
    NoDriver {
        /// The node.
        node: NodeId,
    },
    /// The driver failed while serving a node's requests.
    DriverFailed {
        /// The node whose requests were being served.
        node: NodeId,
        /// What the driver reported.
        error: DriverError,
    },
    /// The driver answered a different number of results than the node asked for.
    WrongResultCount {
        /// The node.
        node: NodeId,
        /// Requests made.
        asked: usize,
        /// Results returned.
        got: usize,
    },
    /// A node was still awaiting on its last allowed turn.
    TurnLimit {
        /// The node.
        node: NodeId,
        /// The limit in force.
        limit: u32,
    },
    /// The plan does not fit its catalog, or was not made by [`crate::compile()`]; caught
    /// before any node runs.
    Invalid(ProgramError),
    /// The operating system refused a thread that a branch of a wave needed. The branches that
    /// had one ran on; the graph stays usable.
    NoThread {
        /// What the operating system said.
        reason: String,
    },
    /// A node's call ran past its [time limit](crate::Policy::time_limit); its thread was
    /// left to finish it, its result dropped.
    TimeLimit {
        /// The node.
        node: NodeId,
        /// The limit in force.
        limit: std::time::Duration,
    },
    /// A node's call failed on every attempt its [`crate::Retry`] allowed: `last` is the last
    /// attempt's error.
    Retried {
        /// Attempts made, the first included.
        attempts: u32,
        /// The last attempt's error.
        last: Box<RunError>,
    },
    /// What a `Map` step read is not a list of items ([`crate::Reading::items`]).
    NotAList {
        /// The `Map` step.
        node: NodeId,
        /// The type of what it read.
        found: String,
    },
    /// A `Switch` step's selector returned a key no case has.
    UnknownCase {
        /// The `Switch` step.
        node: NodeId,
        /// The key, as it reads.
        key: String,
        /// The keys of its cases, in order.
        known: Vec<String>,
    },
    /// A `Loop` step's body ran `max_iterations` times and its predicate still said not done.
    LoopLimit {
        /// The `Loop` step.
        node: NodeId,
        /// The bound.
        max_iterations: u32,
        /// The type of the body's last output.
        last: String,
    },
    /// The event loop refused a task that a branch of an async run needed
    /// ([`crate::Tasks::spawn`]); the branches that had one ran on.
    NoTask {
        /// What the loop said.
        reason: String,
    },
    /// The program has an async node, and was run without an event loop to await it on: such
    /// a program runs through [`crate::Executor::start`].
    NeedsLoop {
        /// Its first async node, in plan order.
        node: NodeId,
    },
    /// The [`crate::Watch`] asked the run to stop.
    Interrupted,
    /// The run finished, but past its [deadline](crate::Watch::deadline): its result is dropped,
    /// since a deadline is never reported as met when it was not.
    PastDeadline,
    /// A run with async nodes ([`crate::Executor::start`]) was cancelled — by its caller, Ctrl-C
    /// or its deadline — and its caller stopped waiting: its async nodes' calls were cancelled,
    /// and its sync nodes still running finish in the background.
    Cancelled {
        /// The nodes that were still running, innermost, in program order.
        running: Vec<NodeId>,
    },
    /// The [`crate::Watch`] asked the run to stop, and its caller stopped waiting for the nodes
    /// still running ([`crate::Executor::run_detachable`]); they finish in the background.
    Abandoned {
        /// The nodes that were still running, in program order.
        running: Vec<NodeId>,
    },
}

impl RunError {
    /// The node the error is about, if it is about one.
    pub fn node(&self) -> Option<&NodeId> {
        match self {
            // A limit of 0 stops the run before any node is called: no node is to blame.
            RunError::TurnLimit { limit: 0, .. }
            | RunError::NoThread { .. }
            | RunError::NoTask { .. }
            | RunError::Interrupted
            | RunError::PastDeadline
            | RunError::Cancelled { .. }
            | RunError::Abandoned { .. } => None,
            RunError::NodeFailed { node, .. }
            | RunError::NoDriver { node }
            | RunError::DriverFailed { node, .. }
            | RunError::WrongResultCount { node, .. }
            | RunError::TurnLimit { node, .. }
            | RunError::TimeLimit { node, .. }
            | RunError::NotAList { node, .. }
            | RunError::UnknownCase { node, .. }
            | RunError::LoopLimit { node, .. }
            | RunError::NeedsLoop { node } => Some(node),
            RunError::Retried { last, .. } => last.node(),
            RunError::Invalid(error) => Some(error.node()),
        }
    }

    /// Whether the error is a node's call waiting rather than failing (a question for a
    /// person: [`NodeError::suspending`](crate::NodeError::suspending)): the run pauses, and
    /// siblings run on.
    pub fn suspends(&self) -> bool {
        matches!(self, RunError::NodeFailed { error, .. } if error.suspends())
    }

    /// Whether the error is a time running out: a call's time limit, or the run's deadline
    /// (a call the run's cancellation ended past it, or a run that finished past it) — what an
    /// observer reports as timed out rather than failed.
    pub fn timed_out(&self) -> bool {
        match self {
            RunError::TimeLimit { .. } | RunError::PastDeadline => true,
            RunError::Retried { last, .. } => last.timed_out(),
            RunError::NodeFailed { .. }
            | RunError::NoDriver { .. }
            | RunError::DriverFailed { .. }
            | RunError::WrongResultCount { .. }
            | RunError::TurnLimit { .. }
            | RunError::NotAList { .. }
            | RunError::UnknownCase { .. }
            | RunError::LoopLimit { .. }
            | RunError::NeedsLoop { .. }
            | RunError::Invalid(_)
            | RunError::NoThread { .. }
            | RunError::NoTask { .. }
            | RunError::Interrupted
            | RunError::Cancelled { .. }
            | RunError::Abandoned { .. } => false,
        }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::NodeFailed { node, error } => write!(f, "node `{node}` failed: {error}"),
            RunError::NoDriver { node } => write!(
                f,
                "node `{node}` awaited, but no driver was given\nhint: pass a driver that serves its requests"
            ),
            RunError::DriverFailed { node, error } => write!(
                f,
                "the driver failed serving node `{node}`: {error}\nhint: the driver's own error is the cause; fix the driver, or the requests `{node}` makes"
            ),
            RunError::WrongResultCount { node, asked, got } => write!(
                f,
                "the driver answered {got} result(s) to the {asked} request(s) of node `{node}`\nhint: a driver returns exactly one result per request, in order"
            ),
            // A limit of 0 is refused at the first node, before it is called: no node awaited.
            RunError::TurnLimit { limit: 0, .. } => write!(
                f,
                "a turn limit of 0 lets no node run, so none was called\nhint: the turn limit is the number of calls each node gets; pass at least 1, or leave it out for the default of {}",
                crate::model::node::DEFAULT_TURN_LIMIT
            ),
            RunError::TurnLimit { node, limit } => write!(
                f,
                "node `{node}` was still awaiting after {limit} turns\nhint: make it finish, or raise the turn limit"
            ),
            RunError::TimeLimit { node, limit } => write!(
                f,
                "node `{node}` ran past its time limit of {} s\nhint: a sync call goes on in the background, its result dropped, and an async one is cancelled; raise the limit, or let `.retry(on=(TimeoutError,))` try it again",
                limit.as_secs_f64()
            ),
            RunError::Retried { attempts, last } => {
                write!(f, "{last}\n(failed on each of {attempts} attempts)")
            }
            RunError::Invalid(error) => error.fmt(f),
            RunError::NoThread { reason } => write!(
                f,
                "the operating system refused a thread for a branch of a wave: {reason}\nhint: too many threads in this process (see `ulimit -u` and /proc/sys/kernel/threads-max); the graph stays usable, so the run can be tried again"
            ),
            RunError::NotAList { node, found } => write!(
                f,
                "`each` step `{node}` read a `{found}`, not a list of items\nhint: the step before it returns the items, a list (any sized sequence); wrap a single item in one"
            ),
            RunError::UnknownCase { node, key, known } => {
                write!(f, "`switch` step `{node}` has no case for key `{key}`; its cases: ")?;
                for (at, known) in known.iter().enumerate() {
                    let comma = if at == 0 { "" } else { ", " };
                    write!(f, "{comma}`{known}`")?;
                }
                f.write_str("\nhint: make the selector return one of these keys, or add a case for it")
            }
            RunError::LoopLimit {
                node,
                max_iterations,
                last,
            } => write!(
                f,
                "`loop` step `{node}` ran its body {max_iterations} times and `until` still said not done; the last output was a `{last}`\nhint: raise `max_iterations`, or check that `until` can become true"
            ),
            RunError::NoTask { reason } => write!(
                f,
                "the event loop refused a task a branch needed: {reason}\nhint: keep the loop running until the run is done"
            ),
            RunError::NeedsLoop { node } => write!(
                f,
                "node `{node}` is async, and the run has no event loop to await it on\nhint: run the program with `Executor::start` on an event loop"
            ),
            RunError::Interrupted => f.write_str(
                "the run was interrupted\nhint: its watch asked it to stop (Ctrl-C, a deadline); every branch stopped at a node boundary, and the run can be started again"
            ),
            RunError::PastDeadline => f.write_str(
                "the run finished past its deadline, and its result was dropped\nhint: a run with a deadline returns its result only when it finishes within it; give it more time, or make its slowest node faster"
            ),
            RunError::Cancelled { running } => {
                f.write_str("the run was cancelled")?;
                if !running.is_empty() {
                    f.write_str("; still running: ")?;
                    for (at, node) in running.iter().enumerate() {
                        let comma = if at == 0 { "" } else { ", " };
                        write!(f, "{comma}`{node}`")?;
                    }
                    f.write_str(" (cancelled)")?;
                }
                f.write_str("\nhint: the graph can run again at once")
            }
            RunError::Abandoned { running } => {
                write!(f, "the run was interrupted, and its caller stopped waiting for ")?;
                match running.as_slice() {
                    [] => f.write_str("branches between nodes")?,
                    nodes => {
                        f.write_str("node(s) still running: ")?;
                        for (at, node) in nodes.iter().enumerate() {
                            let comma = if at == 0 { "" } else { ", " };
                            write!(f, "{comma}`{node}`")?;
                        }
                    }
                }
                f.write_str("\nhint: they finish in the background and their results are dropped; the graph can run again at once, and a node that waits for something that will not come should wait with a timeout")
            }
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::NodeFailed { error, .. } => Some(error),
            RunError::DriverFailed { error, .. } => Some(error),
            RunError::Retried { last, .. } => Some(&**last),
            RunError::NoDriver { .. }
            | RunError::TimeLimit { .. }
            | RunError::WrongResultCount { .. }
            | RunError::TurnLimit { .. }
            | RunError::Invalid(_)
            | RunError::NoThread { .. }
            | RunError::NotAList { .. }
            | RunError::UnknownCase { .. }
            | RunError::LoopLimit { .. }
            | RunError::NeedsLoop { .. }
            | RunError::NoTask { .. }
            | RunError::Interrupted
            | RunError::PastDeadline
            | RunError::Cancelled { .. }
            | RunError::Abandoned { .. } => None,
        }
    }
}

/// Why a plan could not be resolved into a [`crate::Program`]. Plans made by
/// [`crate::compile()`] against the same catalog never fail this way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramError {
    /// The plan names a node the catalog does not implement.
    NotInCatalog {
        /// The node.
        node: NodeId,
    },
    /// A step reads a node that no step it can see runs before it: none at all, a later one,
    /// or one in a sibling branch of a wave (which runs at the same time).
    MissingInput {
        /// The step.
        node: NodeId,
        /// The node it reads.
        from: NodeId,
    },
    /// The plan runs the same node twice.
    StepTwice {
        /// The node.
        node: NodeId,
    },
    /// The plan holds a remote slice ([`crate::distribute`]), which a program, running every
    /// step in this process, cannot run; a transport runs slices.
    RemoteSlice {
        /// The slice's first step.
        node: NodeId,
        /// Where the slice runs.
        host: HostName,
    },
}

impl ProgramError {
    /// The node the error is about.
    pub fn node(&self) -> &NodeId {
        match self {
            ProgramError::NotInCatalog { node }
            | ProgramError::MissingInput { node, .. }
            | ProgramError::StepTwice { node }
            | ProgramError::RemoteSlice { node, .. } => node,
        }
    }
}

impl fmt::Display for ProgramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProgramError::NotInCatalog { node } => write!(
                f,
                "node `{node}` has no implementation in the catalog\nhint: run a plan with the catalog it was compiled against"
            ),
            ProgramError::MissingInput { node, from } => write!(
                f,
                "node `{node}` reads `{from}`, which no step before it produces\nhint: run plans made by `compile`; a step sees the steps before it in its branch and before its wave, never a sibling branch's"
            ),
            ProgramError::StepTwice { node } => write!(
                f,
                "node `{node}` is run twice by the plan\nhint: run plans made by `compile`, where each node is one step"
            ),
            ProgramError::RemoteSlice { node, host } => write!(
                f,
                "node `{node}` is in a slice for host `{host}`, and a program runs every step in this process\nhint: resolve the plan `compile` made, before `distribute`; a transport (Soma's Python front runs slices on Ray) runs distributed plans"
            ),
        }
    }
}

impl std::error::Error for ProgramError {}

impl From<ProgramError> for RunError {
    fn from(error: ProgramError) -> Self {
        RunError::Invalid(error)
    }
}
