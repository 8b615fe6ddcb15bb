//! The shape shared by the errors a node or a driver reports: a message and, where there is
//! one, the error underneath, carried untouched.
//!
//! The two stay distinct types — an error says which phase it belongs to — but they are one
//! definition, so they cannot drift apart. The cause travels as it is: a binding can put its
//! host language's exception there and take the very same object back out when the error
//! leaves the engine.

/// Defines a failure type: `new(message)`, `from_cause(error)`, `message()`, `cause()`,
/// `Display` (the message) and `Error` (the cause as source).
macro_rules! failure {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $name {
            message: String,
            cause: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
            suspends: bool,
        }

        impl $name {
            /// A failure described by a message.
            pub fn new(message: impl Into<String>) -> Self {
                $name {
                    message: message.into(),
                    cause: None,
                    suspends: false,
                }
            }

            /// A failure carrying the error that caused it; the message is the cause's.
            pub fn from_cause(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
                $name {
                    message: cause.to_string(),
                    cause: Some(std::sync::Arc::new(cause)),
                    suspends: false,
                }
            }

            /// A call that ended waiting for what no run can give it here — a person's answer
            /// to a question its embedder keeps — carrying what said so: the run pauses rather
            /// than fails. Its siblings are not stopped by it (each runs on until it ends or
            /// waits too), and a sibling's failure or a stop of the run comes out before it.
            pub fn suspending(cause: impl std::error::Error + Send + Sync + 'static) -> Self {
                $name {
                    suspends: true,
                    ..$name::from_cause(cause)
                }
            }

            /// Whether it is a call waiting rather than failing ([`Self::suspending`]).
            pub fn suspends(&self) -> bool {
                self.suspends
            }

            /// The message.
            pub fn message(&self) -> &str {
                &self.message
            }

            /// The underlying error, if any.
            pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
                self.cause.as_deref()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.message)
            }
        }

        impl std::error::Error for $name {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                self.cause
                    .as_deref()
                    .map(|e| e as &(dyn std::error::Error + 'static))
            }
        }
    };
}

pub(crate) use failure;
