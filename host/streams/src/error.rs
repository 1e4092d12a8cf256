//! What can go wrong with streams.

/// A stream operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A name outside the allowed characters.
    #[error("invalid {what} {name:?}: allowed are {allowed}")]
    InvalidName {
        /// What the name names.
        what: &'static str,
        /// The name given.
        name: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// An invalid option; the message says what is allowed.
    #[error("invalid option: {0}")]
    InvalidOption(String),
    /// The stream is at its max length and every entry is still needed by a
    /// consumer group: the event was not added.
    #[error("stream {stream:?} is full: {max_len} events not yet acknowledged by every group")]
    Full {
        /// The stream.
        stream: String,
        /// Its max length.
        max_len: usize,
    },
    /// Redis refused or failed the operation.
    #[error("failed to {op} on stream {stream:?}")]
    Redis {
        /// The operation.
        op: &'static str,
        /// The stream.
        stream: String,
        /// Why.
        #[source]
        source: redis::RedisError,
    },
}

/// The result of stream operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
