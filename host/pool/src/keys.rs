//! Every Redis key of a pool. All share the hash tag `{pool}`, so the pool
//! lives in one Redis Cluster slot and its scripts may touch any of them.

use crate::error::Error;

/// The Redis names of one pool.
#[derive(Debug, Clone)]
pub(crate) struct PoolKeys {
    pub(crate) pool: String,
    /// key -> `state|worker|token|seq`
    pub(crate) jobs: String,
    /// Fencing token counter.
    pub(crate) tokens: String,
    /// Worker join numbers.
    pub(crate) joins: String,
    /// Jobs waiting for a worker.
    pub(crate) queued: String,
    /// What plugins emit.
    pub(crate) events: String,
    /// The payload bytes ever written to the events stream (see
    /// `emit.lua`).
    pub(crate) events_written: String,
    /// The payload bytes the events stream held, as versions whose events
    /// carried no byte counter kept them: the counter above starts there.
    pub(crate) events_bytes_earlier: String,
    /// The identity of the handler that serves the pool.
    pub(crate) handler: String,
    /// Worker leases: worker -> deadline, ms of Redis time.
    pub(crate) leases: String,
    /// The pool epoch: random, set once; another value (or none) means
    /// Redis lost the pool's data.
    pub(crate) epoch: String,
    /// Present while the pool shuts down.
    pub(crate) shutdown: String,
    /// Tickers: name -> `next_due_ms:interval_ms:last_seq` (Redis time), or
    /// `stopped`.
    pub(crate) tickers: String,
    /// What every key of the pool starts with.
    pub(crate) prefix: String,
}

/// Name of the stream of what jobs emit.
pub(crate) const EVENTS_STREAM: &str = "events";
/// Name of the slot table map (slot index -> worker id).
pub(crate) const SLOTS_MAP: &str = "slots";
/// Name of the workers map (worker id -> node and join number).
pub(crate) const WORKERS_MAP: &str = "workers";

impl PoolKeys {
    /// Maps a Redis failure of operation `op` to this pool's error.
    pub(crate) fn redis_error(&self, op: &'static str) -> impl FnOnce(redis::RedisError) -> Error + '_ {
        move |source| Error::Redis { op, pool: self.pool.clone(), source }
    }

    pub(crate) fn new(pool: &str) -> Self {
        let key = |suffix: &str| format!("pulse:{{{pool}}}:{suffix}");
        Self {
            pool: pool.to_owned(),
            jobs: key("jobs"),
            tokens: key("tokens"),
            joins: key("joins"),
            queued: key("queued"),
            events: pulse_streams::stream_key(pool, EVENTS_STREAM),
            events_written: key("events-written"),
            events_bytes_earlier: key("events-bytes"),
            handler: key("handler"),
            leases: key("leases"),
            epoch: key("epoch"),
            shutdown: key("shutdown"),
            tickers: key("tickers"),
            prefix: key(""),
        }
    }

    /// A job's record: payload, created, attempt, state, reason.
    pub(crate) fn record(&self, key: &str) -> String {
        format!("pulse:{{{}}}:job:{key}", self.pool)
    }

    /// Events held for a job while it waits for a worker.
    pub(crate) fn held(&self, key: &str) -> String {
        format!("pulse:{{{}}}:held:{key}", self.pool)
    }

    /// The keys of the jobs a schedule started (a set).
    pub(crate) fn schedule(&self, name: &str) -> String {
        format!("pulse:{{{}}}:schedule:{name}", self.pool)
    }

    /// The jobs a worker owns.
    pub(crate) fn worker_jobs(&self, worker: &str) -> String {
        format!("pulse:{{{}}}:worker:{worker}:jobs", self.pool)
    }

    /// The name of a worker's inbox stream.
    pub(crate) fn inbox_name(worker: &str) -> String {
        format!("inbox.{worker}")
    }

    /// The key of a worker's inbox stream.
    pub(crate) fn inbox(&self, worker: &str) -> String {
        pulse_streams::stream_key(&self.pool, &Self::inbox_name(worker))
    }

    /// The name of a node's reply stream.
    pub(crate) fn replies_name(node: &str) -> String {
        format!("replies.{node}")
    }

    /// The key of a node's reply stream.
    pub(crate) fn replies(&self, node: &str) -> String {
        pulse_streams::stream_key(&self.pool, &Self::replies_name(node))
    }
}

/// Checks a pool name: 1 to 100 ASCII letters, digits, `-`, `_`, `.`.
pub(crate) fn validate_pool(name: &str) -> Result<(), Error> {
    if !is_name(name) {
        return Err(Error::InvalidPool(name.to_owned()));
    }
    Ok(())
}

/// Whether `name` is 1 to 100 ASCII letters, digits, `-`, `_`, `.`: what
/// pool, ticker and schedule names may be.
pub(crate) fn is_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    !name.is_empty() && name.len() <= 100 && name.chars().all(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_can_build_a_workers_keys_from_the_prefixes() {
        let keys = PoolKeys::new("p");
        assert_eq!(keys.worker_jobs("w7"), format!("{}worker:w7:jobs", keys.prefix));
        assert_eq!(keys.record("k"), format!("{}job:k", keys.prefix));
        assert_eq!(keys.held("k"), format!("{}held:k", keys.prefix));
    }
}
