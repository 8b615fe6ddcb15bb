//! Which machine a node runs on: a [`HostName`], checked where it is written, and the
//! [`HostPlacement`] that says which node runs on which host.
//!
//! A host is only a name here. What a name means — which Ray node, which process — is decided by
//! the transport that serves remote slices, outside the core; the core only needs to tell
//! names apart, draw them and group the steps that share one (see [`crate::distribute`]). Names
//! are kept to what every transport can carry unquoted (a Ray resource name, a DNS label, a
//! file name): a mistake is refused where it is written, not when a cluster is first asked.
//!
//! Like device placement, host placement is data beside the graph: it changes neither the graph
//! nor what [`crate::compile()`] makes of it; only the separate distribution step reads it.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::model::id::NodeId;

/// The longest name a host may have: a DNS label's limit, so a host can be named after one.
pub const HOST_NAME_LIMIT: usize = 63;

/// The name of a host: 1 to 63 ASCII letters, digits, `-`, `_` or `.`, starting with a letter
/// or a digit. Parsed with [`str::parse`]; clones in O(1).
///
/// ```
/// use soma_core::HostName;
/// let host: HostName = "gpu-box".parse()?;
/// assert_eq!(host.as_str(), "gpu-box");
/// assert!("gpu box".parse::<HostName>().is_err());
/// # Ok::<(), soma_core::HostError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostName(Arc<str>);

impl HostName {
    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// Why a host name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostError {
    /// Empty, too long, or with a character outside `[A-Za-z0-9._-]`, or not starting with a
    /// letter or a digit.
    Invalid {
        /// What was written.
        text: String,
    },
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostError::Invalid { text } => write!(
                f,
                "`{text}` is not a host name\nhint: name a host with 1 to {HOST_NAME_LIMIT} ASCII letters, digits, `-`, `_` or `.`, starting with a letter or a digit: `gpu-box`, `node_2`"
            ),
        }
    }
}

impl std::error::Error for HostError {}

impl FromStr for HostName {
    type Err = HostError;

    fn from_str(text: &str) -> Result<HostName, HostError> {
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
        let valid = !text.is_empty()
            && text.len() <= HOST_NAME_LIMIT
            && text.as_bytes()[0].is_ascii_alphanumeric()
            && text.bytes().all(allowed);
        if valid {
            Ok(HostName(text.into()))
        } else {
            Err(HostError::Invalid {
                text: text.to_owned(),
            })
        }
    }
}

/// Which node runs on which host: nodes not named here run locally.
///
/// Kept beside a graph, never in it: placing a node on a host changes neither the graph nor its
/// compiled plan, only what [`crate::distribute`] makes of that plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostPlacement {
    hosts: HashMap<NodeId, HostName>,
}

impl HostPlacement {
    /// No node placed on a host.
    pub fn new() -> Self {
        HostPlacement::default()
    }

    /// Places `node` on `host`, replacing where it was; returns where that was.
    pub fn place(&mut self, node: impl Into<NodeId>, host: HostName) -> Option<HostName> {
        self.hosts.insert(node.into(), host)
    }

    /// Brings `node` back to run locally; returns the host it was on.
    pub fn remove(&mut self, node: &str) -> Option<HostName> {
        self.hosts.remove(node)
    }

    /// The host `node` is placed on, if any.
    pub fn host(&self, node: &str) -> Option<&HostName> {
        self.hosts.get(node)
    }

    /// Every node placed on a host, and its host, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&NodeId, &HostName)> {
        self.hosts.iter()
    }

    /// How many nodes are placed on a host.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether every node runs locally.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }
}
