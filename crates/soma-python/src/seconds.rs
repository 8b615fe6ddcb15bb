//! A number of seconds from Python as a `Duration`: the one conversion every run's `timeout=`,
//! every node's time limit and every retry's pause takes, so that a number means the same
//! wherever it is given.
//!
//! A `Duration` holds about 584 billion years; a float of seconds holds far more. A number past
//! what a `Duration` holds (`sys.maxsize`, `1e300`) is the longest one, a deadline no run
//! reaches: every deadline made from it (`Instant::checked_add`) reads as none, so a huge timeout
//! is no deadline, never an overflow. What is no number of seconds at all — NaN, infinity, a
//! negative number — is refused by the caller, which words its own refusal.

use std::time::Duration;

/// `seconds` as a `Duration`, the longest one past what a `Duration` holds; `None` when it is
/// NaN, infinite or negative.
pub(crate) fn as_duration(seconds: f64) -> Option<Duration> {
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX))
}
