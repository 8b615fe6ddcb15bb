//! What a stream hands back instead of a result: an item that failed, in its place in the output,
//! or the stream as a whole stopped.
//!
//! Apart from the run's own [`RunError`], which an item's failure carries: a stream's error also
//! says which item it was and what its input was, which a consumer that goes on after it
//! ([`OnError::Continue`](super::OnError::Continue)) needs to tell its failures apart.

use std::fmt;

use crate::model::value::Value;
use crate::run::error::RunError;

/// An item that failed: where it was, what it was, and why.
#[derive(Clone, Debug)]
pub struct Failed {
    /// Its position in the input, from 0.
    pub index: u64,
    /// The input it was.
    pub input: Value,
    /// What stopped it (naming the node, when a node is to blame).
    pub error: RunError,
}

/// Why a stream handed back an error instead of a result.
#[derive(Clone, Debug)]
pub enum StreamError {
    /// One item failed.
    Item(Failed),
    /// The stream as a whole stopped: its watch said so, or a stage never got a thread.
    Stopped(RunError),
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::Item(failed) => write!(f, "item {}: {}", failed.index, failed.error),
            StreamError::Stopped(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for StreamError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StreamError::Item(failed) => Some(&failed.error),
            StreamError::Stopped(error) => Some(error),
        }
    }
}
