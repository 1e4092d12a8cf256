//! Every Redis key of a pool. All share one hash tag, so they live in one
//! Redis Cluster slot and a script may touch any of them: `{pool}` for a
//! pool of one slot group (and for group 0 of any pool), and a tag of its
//! own for each other group (see [`group_tag`]).

use crate::error::Error;

/// The Redis names of one pool.
#[derive(Debug, Clone)]
pub(crate) struct PoolKeys {
    pub(crate) pool: String,
    /// The hash tag every key below carries: the pool's name, or its
    /// group's tag.
    pub(crate) tag: String,
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
    /// The bytes ever written to the events stream (see `write.lua`).
    pub(crate) events_written: String,
    /// The events ever written to the events stream (see `write.lua`).
    pub(crate) events_count: String,
    /// The payload bytes the events stream held, as versions whose events
    /// carried no byte counter kept them: the counter above starts there.
    pub(crate) events_bytes_earlier: String,
    /// The identity of the handler that serves the pool.
    pub(crate) handler: String,
    /// Releases the pool refuses (a host's upgrade gate failed them):
    /// digest -> why, in words.
    pub(crate) refused: String,
    /// The release announced for the whole pool (`rollout start`), with
    /// its state, whose turn it is and each host's outcome.
    pub(crate) rollout: String,
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
    /// What the key of every reply stream starts with.
    replies_prefix: String,
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

    /// The keys of pool `pool` of one slot group, or of its group 0.
    pub(crate) fn new(pool: &str) -> Self {
        Self::group(pool, 0, 1)
    }

    /// The keys of slot group `group` of pool `pool` of `groups` groups.
    pub(crate) fn group(pool: &str, group: u32, groups: u32) -> Self {
        let tag = group_tag(pool, group, groups);
        let key = |suffix: &str| format!("pulse:{{{tag}}}:{suffix}");
        Self {
            pool: pool.to_owned(),
            jobs: key("jobs"),
            tokens: key("tokens"),
            joins: key("joins"),
            queued: key("queued"),
            events: pulse_streams::stream_key(&tag, EVENTS_STREAM),
            events_written: key("events-written"),
            events_count: key("events-count"),
            events_bytes_earlier: key("events-bytes"),
            handler: key("handler"),
            refused: key("refused"),
            rollout: key("rollout"),
            leases: key("leases"),
            epoch: key("epoch"),
            shutdown: key("shutdown"),
            tickers: key("tickers"),
            prefix: key(""),
            replies_prefix: pulse_streams::stream_key(&tag, "replies."),
            tag,
        }
    }

    /// A job's record: payload, created, attempt, state, reason.
    pub(crate) fn record(&self, key: &str) -> String {
        format!("pulse:{{{}}}:job:{key}", self.tag)
    }

    /// Events held for a job while it waits for a worker.
    pub(crate) fn held(&self, key: &str) -> String {
        format!("pulse:{{{}}}:held:{key}", self.tag)
    }

    /// The keys of the jobs a schedule started (a set).
    pub(crate) fn schedule(&self, name: &str) -> String {
        format!("pulse:{{{}}}:schedule:{name}", self.tag)
    }

    /// A node's identity (a hash: host, pid, version, http, started), kept
    /// by its lease renewals and expiring with them.
    pub(crate) fn node(&self, node: &str) -> String {
        format!("pulse:{{{}}}:node:{node}", self.tag)
    }

    /// The jobs a worker owns.
    pub(crate) fn worker_jobs(&self, worker: &str) -> String {
        format!("pulse:{{{}}}:worker:{worker}:jobs", self.tag)
    }

    /// The name of a worker's inbox stream.
    pub(crate) fn inbox_name(worker: &str) -> String {
        format!("inbox.{worker}")
    }

    /// The key of a worker's inbox stream.
    pub(crate) fn inbox(&self, worker: &str) -> String {
        pulse_streams::stream_key(&self.tag, &Self::inbox_name(worker))
    }

    /// The name of a node's reply stream.
    pub(crate) fn replies_name(node: &str) -> String {
        format!("replies.{node}")
    }

    /// The key of a node's reply stream.
    pub(crate) fn replies(&self, node: &str) -> String {
        pulse_streams::stream_key(&self.tag, &Self::replies_name(node))
    }

    /// The name of the stream where `worker` answers `node`'s dispatches
    /// (on a pool read by doorbells: see `core::replies`).
    pub(crate) fn worker_replies_name(node: &str, worker: &str) -> String {
        format!("replies.{node}.{worker}")
    }

    /// Whether `stream` is where `worker` answers some node's dispatches
    /// ([`Self::worker_replies_name`]): the worker picks the ids of what
    /// it adds there. Node ids are ULIDs and worker ids `w<n>`, neither
    /// with a dot.
    pub(crate) fn answered_by(&self, stream: &str, worker: &str) -> bool {
        stream
            .strip_prefix(&self.replies_prefix)
            .and_then(|rest| rest.strip_suffix(worker))
            .and_then(|rest| rest.strip_suffix('.'))
            .is_some_and(|node| !node.is_empty() && !node.contains('.'))
    }
}

/// Slot groups a pool may have at most. Each group is a full set of
/// membership keys, and each worker reads one inbox per group and renews
/// one lease per group: beyond 64 that cost outgrows what more Redis
/// masters bring.
pub(crate) const MAX_SLOT_GROUPS: u32 = 64;

/// The hash tag of slot group `group` of pool `pool` of `groups` groups.
///
/// Group 0's is the pool's name, so a pool of one group keeps the keys it
/// always had, and the pool-wide records (epoch, handler, tickers,
/// schedules, shutdown) stay where every version looks for them. Every
/// other group's tag is `<pool>:g<group>:<n>` (`:` is not allowed in pool
/// names, so no pool's tag can be another's), with the smallest `n` that
/// puts the tag's Redis Cluster slot near the middle of a part of the
/// 16,384 cluster slots of its own: cut into `groups` equal parts, group 0
/// takes the part its slot falls in and groups 1, 2, … the others in
/// order, each within the middle eighth of its part. A cluster serves
/// contiguous ranges of slots per master, so the groups spread over the
/// masters evenly (16 groups over 3 masters: 5 or 6 on each; 8: 2 or 3)
/// instead of as a hash happens to fall, and a part that straddles two
/// masters' ranges goes to the one holding its middle.
pub fn group_tag(pool: &str, group: u32, groups: u32) -> String {
    if group == 0 || groups <= 1 {
        return pool.to_owned();
    }
    const CLUSTER_SLOTS: u32 = 16_384;
    let slot = |tag: &str| u32::from(pulse_redis::key_slot(tag.as_bytes()));
    let part = CLUSTER_SLOTS / groups;
    let first = slot(pool) / part;
    let target = if group <= first { group - 1 } else { group };
    let middle = target * part + part * 7 / 16..target * part + part * 9 / 16;
    (0u32..)
        .map(|n| format!("{pool}:g{group}:{n}"))
        .find(|tag| middle.contains(&slot(tag)))
        .unwrap_or_else(|| unreachable!("CRC16 reaches every slot"))
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

    #[test]
    fn group_0_keeps_the_pool_s_keys_and_other_groups_fill_the_other_parts_of_the_cluster() {
        assert_eq!(PoolKeys::group("p", 0, 16).jobs, PoolKeys::new("p").jobs);
        assert_eq!(PoolKeys::new("p").jobs, "pulse:{p}:jobs");
        for pool in ["p", "orders", "bench"] {
            for groups in [2, 16, 64] {
                let mut parts: Vec<u32> = (0..groups)
                    .map(|g| {
                        u32::from(pulse_redis::key_slot(group_tag(pool, g, groups).as_bytes())) * groups
                            / 16_384
                    })
                    .collect();
                parts.sort_unstable();
                assert_eq!(parts, (0..groups).collect::<Vec<_>>(), "{pool} over {groups} groups");
            }
        }
        let keys = PoolKeys::group("p", 3, 16);
        assert!(keys.jobs.starts_with("pulse:{p:g3:"), "{}", keys.jobs);
        assert_eq!(keys.record("k"), format!("{}job:k", keys.prefix));
    }

    #[test]
    fn a_worker_knows_the_streams_where_it_answers_dispatches() {
        let keys = PoolKeys::group("p", 3, 16);
        let node = "01JF4Q8Z6V3N5K2M7X9A1B2C3D";
        let stream = pulse_streams::stream_key(&keys.tag, &PoolKeys::worker_replies_name(node, "w12"));
        assert!(keys.answered_by(&stream, "w12"));
        assert!(!keys.answered_by(&stream, "w2"), "another worker's, by the end of its id");
        assert!(!keys.answered_by(&keys.replies(node), "w12"), "the node's own reply stream");
        assert!(!PoolKeys::group("p", 4, 16).answered_by(&stream, "w12"), "another group's");
        let dotted = pulse_streams::stream_key(&keys.tag, "replies.a.b.w12");
        assert!(!keys.answered_by(&dotted, "w12"));
        assert!(!keys.answered_by(&pulse_streams::stream_key(&keys.tag, "replies..w12"), "w12"));
    }
}
