//! `Driver`: serves what awaiting nodes ask for.
//!
//! One driver is lent, as `&dyn Driver`, to every branch of every wave at once — which is why it
//! must be `Send + Sync` and why it should never serialize its callers: a driver that can serve
//! two requests at the same time keeps two branches' waits overlapping.

use crate::model::value::Value;

crate::model::failure::failure! {
    /// A driver's failure: a message and, where there is one, the error underneath, which
    /// travels untouched.
    DriverError
}

/// Serves the requests of awaiting nodes.
pub trait Driver: Send + Sync {
    /// Answers `requests`, one result per request, in order. The executor checks the count.
    ///
    /// # Errors
    /// Whatever the driver reports; the executor attributes it to the node that asked.
    fn perform(&self, requests: &[Value]) -> Result<Vec<Value>, DriverError>;
}
