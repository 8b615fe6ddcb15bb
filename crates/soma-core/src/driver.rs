//! `Driver`: serves what awaiting nodes ask for.
//!
//! One driver is lent, as `&dyn Driver`, to every branch of every wave at once — which is why it
//! must be `Send + Sync` and why it should never serialize its callers: a driver that can serve
//! two requests at the same time keeps two branches' waits overlapping.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::value::Value;

/// A driver's failure: a message and, where there is one, the error underneath.
#[derive(Clone, Debug)]
pub struct DriverError {
    message: String,
    cause: Option<Arc<dyn Error + Send + Sync>>,
}

impl DriverError {
    /// A failure described by a message.
    pub fn new(message: impl Into<String>) -> Self {
        DriverError {
            message: message.into(),
            cause: None,
        }
    }

    /// A failure carrying the error that caused it; the message is the cause's.
    pub fn from_cause(cause: impl Error + Send + Sync + 'static) -> Self {
        DriverError {
            message: cause.to_string(),
            cause: Some(Arc::new(cause)),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The underlying error, if any.
    pub fn cause(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        self.cause.as_deref()
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for DriverError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.cause.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// Serves the requests of awaiting nodes.
pub trait Driver: Send + Sync {
    /// Answers `requests`, one result per request, in order. The executor checks the count.
    ///
    /// # Errors
    /// Whatever the driver reports; the executor attributes it to the node that asked.
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError>;
}
