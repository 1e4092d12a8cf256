//! What can go wrong with a map.

use std::time::Duration;

/// A map operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A map name or hash tag outside the allowed characters.
    #[error("invalid {what} {name:?}: allowed are {allowed}")]
    InvalidName {
        /// What the name names.
        what: &'static str,
        /// The name given.
        name: String,
        /// What is allowed.
        allowed: &'static str,
    },
    /// A key that is empty or starts with `=` (reserved for the map's own fields).
    #[error("invalid map key {key:?}: a key must not be empty or start with '='")]
    InvalidKey {
        /// The key given.
        key: String,
    },
    /// Redis refused or failed the operation.
    #[error("failed to {op} on map {map:?}")]
    Redis {
        /// The operation.
        op: &'static str,
        /// The map.
        map: String,
        /// Why.
        #[source]
        source: redis::RedisError,
    },
    /// The map was closed: it still answers reads, not writes.
    #[error("map {0:?} is closed")]
    Closed(String),
    /// The local replica did not show a write in time.
    #[error("map {map:?}: the local replica did not apply the write within {timeout:?}")]
    Timeout {
        /// The map.
        map: String,
        /// How long the caller waited.
        timeout: Duration,
    },
}

/// The result of map operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
