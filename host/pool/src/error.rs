//! What can go wrong in a pool.

/// A pool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A pool name outside the allowed characters.
    #[error("invalid pool name {0:?}: allowed are 1 to 100 ASCII letters, digits, '-', '_' or '.'")]
    InvalidPool(String),
    /// A ticker or schedule name outside the allowed characters.
    #[error("invalid ticker name {0:?}: allowed are 1 to 100 ASCII letters, digits, '-', '_' or '.'")]
    InvalidTicker(String),
    /// A ticker interval of zero.
    #[error("ticker {0:?} needs an interval of at least 1 ms")]
    ZeroInterval(String),
    /// A job key that is empty, too long or has control characters.
    #[error("invalid job key {key:?}: {why}")]
    InvalidKey {
        /// The key given (cut to 40 characters).
        key: String,
        /// What is wrong and what is allowed.
        why: String,
    },
    /// A payload over the pool's limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A worker's release (digest or version) contains `|`.
    #[error("invalid worker release {0:?}: its digest and version may not contain '|'")]
    InvalidRelease(String),
    /// A worker to replace is not one of this node's.
    #[error("worker {0:?} is not a worker of this node")]
    UnknownWorker(String),
    /// A client-only node was asked to host a worker.
    #[error("a client-only node cannot host workers")]
    ClientOnly,
    /// The node is closed.
    #[error("the node is closed")]
    Closed,
    /// The pool is shutting down: no node may join it until it is gone.
    #[error("pool {0:?} is shutting down; join it again once its shutdown is complete")]
    ShuttingDown(String),
    /// Redis no longer holds the pool's epoch: it lost the pool's data
    /// (restarted empty, flushed, or evicted keys).
    #[error("Redis lost the data of pool {pool:?} (its epoch is now {epoch:?})")]
    EpochChanged {
        /// The pool.
        pool: String,
        /// The epoch Redis holds now (empty: none).
        epoch: String,
    },
    /// The pool was created by an earlier version, whose slot table has
    /// one slot per worker: this version routes keys differently and must
    /// not serve it.
    #[error(
        "pool {pool:?} was created by an earlier version of pulse-host, which routes keys over one slot per \
         worker (its epoch {epoch:?} records no slot count); shut it down with that version \
         (pulse-host shutdown --pool {pool}) before this version serves it"
    )]
    IncompatiblePool {
        /// The pool.
        pool: String,
        /// Its epoch.
        epoch: String,
    },
    /// A slot group count that is not a power of two from 1 to 64.
    #[error(
        "invalid slot_groups {0}: allowed are 1, 2, 4, 8, 16, 32 or 64 (a power of two dividing the 4,096 slots, at most 64)"
    )]
    InvalidSlotGroups(u32),
    /// The pool was created with another number of slot groups than this
    /// node is configured with.
    #[error(
        "pool {pool:?} has {pool_has} slot group(s) and this node is configured with {configured}: the groups \
         are fixed when a pool is created, since they decide where each job's keys live. Configure \
         slot_groups = {pool_has}, or move the pool to {configured} groups by shutting it down \
         (pulse-host shutdown --pool {pool}) and dispatching its jobs again"
    )]
    SlotGroupsDiffer {
        /// The pool.
        pool: String,
        /// The node's setting.
        configured: u32,
        /// The pool's.
        pool_has: u32,
    },
    /// An event id or position that is not one of the pool's: a pool of
    /// several slot groups reads its events from a position, one id per
    /// group.
    #[error(
        "{id:?} is not a position in the events of pool {pool:?}: it has {groups} slot groups, and a position \
         is one id (<ms>-<seq> or <ms>-<seq>.<index>) per group, joined by ','"
    )]
    InvalidEventId {
        /// The pool.
        pool: String,
        /// What was given.
        id: String,
        /// The pool's slot groups.
        groups: usize,
    },
    /// Redis may evict keys under memory pressure, which would lose jobs.
    #[error(
        "Redis has maxmemory-policy {policy:?}, which lets it evict keys and so lose jobs; \
         set it to \"noeviction\" (redis-cli CONFIG SET maxmemory-policy noeviction, and in redis.conf)"
    )]
    EvictingRedis {
        /// The policy Redis has.
        policy: String,
    },
    /// A replicated map failed.
    #[error(transparent)]
    Map(#[from] pulse_rmap::Error),
    /// A stream failed.
    #[error(transparent)]
    Stream(#[from] pulse_streams::Error),
    /// Redis refused or failed an operation.
    #[error("failed to {op} in pool {pool:?}")]
    Redis {
        /// The operation.
        op: &'static str,
        /// The pool.
        pool: String,
        /// Why.
        #[source]
        source: redis::RedisError,
    },
    /// Redis answered something this version does not understand.
    #[error("unexpected answer from Redis to {op}: {answer}")]
    Protocol {
        /// The operation.
        op: &'static str,
        /// The answer.
        answer: String,
    },
}

/// The result of pool operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
