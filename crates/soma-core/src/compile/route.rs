//! `Route`: which runner a call of a graph takes — the engine here, the slices on their hosts,
//! or a stream — decided once, from what the call asks and the graph's settings.
//!
//! An embedder has several runners (Python's: the engine's `forward`, its `soma.remote` for
//! hosts, the engine's `Stream` and `Flow` for micro-batches and `map`). Which one a call takes
//! is this one table, so that every combination of what a call asks (a stream or one run) and
//! what the graph holds (nodes on hosts, async nodes) is either a runner or a refusal that says
//! why, never whichever check an embedder happened to make first.

use std::fmt;

use crate::model::host::HostName;
use crate::model::id::NodeId;

/// The runner a call takes ([`Route::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// One run on the engine here: the program walks its async nodes on the embedder's event
    /// loop itself.
    Engine,
    /// One run with the slices on their hosts (see [`crate::distribute`]), the rest here.
    Hosts,
    /// Many items through the engine's [`Stream`](crate::Stream), its stages overlapped.
    Stream,
    /// Many items, each a run of its own on the event loop ([`Flow`](crate::Flow)): a graph
    /// with async nodes.
    Flow,
}

impl Route {
    /// The runner of a call that runs once, of a graph with a node on a host (`on_a_host`) or
    /// none: [`Route::of`] for a call that does not stream, which is never refused.
    pub fn of_one_run(on_a_host: bool) -> Route {
        if on_a_host {
            Route::Hosts
        } else {
            Route::Engine
        }
    }

    /// The runner of a call that streams (`streamed`: micro-batches, a map) or runs once, of a
    /// graph whose first node on a host, in node order, is `on_a_host` (`None`: none is), and
    /// which holds an async node at any depth when `is_async` (asked only of a stream with no
    /// host, the one route it decides).
    ///
    /// # Errors
    ///
    /// [`RouteError::StreamOnHosts`] for a stream of a graph with a node on a host.
    pub fn of(
        streamed: bool,
        on_a_host: Option<(NodeId, HostName)>,
        is_async: impl FnOnce() -> bool,
    ) -> Result<Route, RouteError> {
        match (streamed, on_a_host) {
            (false, on_a_host) => Ok(Route::of_one_run(on_a_host.is_some())),
            (true, Some((node, host))) => Err(RouteError::StreamOnHosts { node, host }),
            (true, None) if is_async() => Ok(Route::Flow),
            (true, None) => Ok(Route::Stream),
        }
    }
}

/// Why no runner takes a call ([`Route::of`]); nothing ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// A stream of a graph with a node on a host: a stream runs every step here, and would run
    /// that node here rather than there.
    StreamOnHosts {
        /// The first node on a host, in node order.
        node: NodeId,
        /// Its host.
        host: HostName,
    },
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::StreamOnHosts { node, host } => write!(
                f,
                "node `{node}` is placed on host `{host}`, and streams do not run slices on hosts yet\nhint: run each item with `forward`, or bring the nodes back here with `g.place_at(\"{node}\", None)`"
            ),
        }
    }
}

impl std::error::Error for RouteError {}
