//! The job as the runtime hands it to a handler.

/// A job to start: the `job` record of the WIT contract.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Job {
    /// The job's key, unique in its pool.
    pub key: String,
    /// The payload given at dispatch.
    pub payload: Vec<u8>,
    /// When the pool accepted the job, in ms since the Unix epoch (Redis time).
    pub created_at_ms: u64,
    /// Whether the job ran before and is being started again.
    pub requeued: bool,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    /// The state the job last saved.
    pub state: Option<Vec<u8>>,
}

impl Job {
    /// A first attempt of a fresh job with `key` and `payload`.
    pub fn new(key: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self { key: key.into(), payload: payload.into(), attempt: 1, ..Self::default() }
    }
}
