//! [`NodeOptions`]: what a node is told, and [`WorkerOptions`]: what each
//! of its workers is; with the defaults.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Options of a node.
///
/// Defaults:
/// - `max_jobs`: 0 (no limit) jobs in the pool; dispatches beyond it are
///   answered `PoolFull` (jobs that move are exempt);
/// - `max_key_len`: 256 bytes; `max_payload`: 1 MiB (also the limit of
///   saved state and emitted events);
/// - `reply_timeout`: 10 s to wait for a worker's confirmation;
/// - `confirm_replicas`: 0 (a dispatch is confirmed once the primary holds
///   it and the worker started it);
/// - `max_attempts`: 3 starts of a job whose handler answers `retryable`,
///   `retry_backoff` 100 ms before the second, doubled each time;
/// - `events_retention`: the pool's events stream keeps 10,000 events
///   (once that many were written; 127 more at most), and
///   `events_max_bytes` 64 MiB of events (keys and payloads) at most
///   (older entries are trimmed, whole);
/// - `shutdown_timeout`: 30 s for the `stop` calls of a worker that hands
///   jobs back (it leaves, or the slot table changed) or shuts down (16 at
///   a time); jobs whose stop has not returned by then are handed on
///   without waiting (their tokens move on, so their code reaches
///   nothing);
/// - `lease_ttl`: 10 s. A worker of a node that cannot renew its lease
///   stops running its jobs after `lease_ttl` minus a tenth; its jobs move
///   to other workers `lease_ttl` plus a fifth after its last renewal (the
///   janitors wake then);
/// - `slot_groups`: 1: the pool lives under one hash tag, on one Redis
///   thread (see [`NodeOptions::slot_groups`]);
/// - `cancel`: a token of the node's own;
/// - `identity`: this machine and process ([`Identity::default`]).
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Jobs the pool holds at most (0: no limit).
    pub max_jobs: u64,
    /// Longest job key, in bytes.
    pub max_key_len: usize,
    /// Largest payload, state or emitted event, in bytes.
    pub max_payload: usize,
    /// How long dispatch, stop and notify wait for the worker's answer.
    pub reply_timeout: Duration,
    /// Replicas that must acknowledge a dispatch (`WAIT`, up to
    /// `reply_timeout`) before it is confirmed `Started`; without them it
    /// is `Unconfirmed`. 0 (the default) confirms what the primary holds:
    /// a primary that dies before replicating loses it.
    pub confirm_replicas: u32,
    /// Starts of a job before a retryable failure becomes final.
    pub max_attempts: u32,
    /// Wait before the second start; doubled for each further one.
    pub retry_backoff: Duration,
    /// Events the pool's events stream keeps.
    pub events_retention: usize,
    /// Bytes of events (keys and payloads) the pool's events stream keeps.
    pub events_max_bytes: u64,
    /// How long the `stop` calls of a worker handing jobs back or shutting
    /// down may take in all.
    pub shutdown_timeout: Duration,
    /// How long a worker's lease lasts without renewal (renewed every
    /// quarter of it).
    pub lease_ttl: Duration,
    /// Slot groups of the pool: 1, 2, 4, … 64. The pool's slots fall into
    /// this many groups (slot `s` in group `s mod G`), each with the keys
    /// of its jobs under a hash tag of its own, so a Redis Cluster spreads
    /// the pool over its masters. Fixed when the pool is created: a full
    /// node configured otherwise is refused
    /// ([`crate::Error::SlotGroupsDiffer`]); a client-only node follows the
    /// pool's, and uses this only to create a pool that does not exist.
    /// Each group costs every worker an inbox reader and a lease.
    pub slot_groups: u32,
    /// The node takes a child of this token for its tasks: a process
    /// passes its root token to every node it joins. Cancelling it ends
    /// the node abruptly, as the end of the process would: its workers
    /// fence themselves at once (no handler call and no effect of their
    /// jobs from then on) and stop, its leases are no longer renewed, and
    /// its jobs move to other workers when the leases end. [`Node::close`]
    /// is the orderly way out.
    ///
    /// [`Node::close`]: crate::Node::close
    pub cancel: CancellationToken,
    /// What the pool's listings say of this node: its machine, process,
    /// version and HTTP address (see [`Identity`]).
    pub identity: Identity,
}

/// Who a node is, beyond its id: shown by the pool's node listings
/// ([`crate::NodeInfo::identity`]), so an operator knows which machine
/// runs which worker. Default: this machine's host name, this process's
/// id, this crate's version, no HTTP address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Identity {
    /// The machine's host name.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// The version of the program the node runs in.
    pub version: String,
    /// The address its HTTP API serves, when it has one.
    pub http: Option<String>,
}

impl Default for Identity {
    fn default() -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|name| name.trim().to_owned())
            .unwrap_or_default();
        Self { host, pid: std::process::id(), version: env!("CARGO_PKG_VERSION").to_owned(), http: None }
    }
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            max_jobs: 0,
            max_key_len: 256,
            max_payload: 1 << 20,
            reply_timeout: Duration::from_secs(10),
            confirm_replicas: 0,
            max_attempts: 3,
            retry_backoff: Duration::from_millis(100),
            events_retention: 10_000,
            events_max_bytes: 64 << 20,
            shutdown_timeout: Duration::from_secs(30),
            lease_ttl: Duration::from_secs(10),
            slot_groups: 1,
            cancel: CancellationToken::new(),
            identity: Identity::default(),
        }
    }
}

impl NodeOptions {
    /// Whether a node with these options takes a job of key `key` and a
    /// payload of `payload` bytes: what [`crate::Node::dispatch`] checks
    /// first, for callers that check a whole list before sending any.
    ///
    /// # Errors
    /// [`crate::Error::InvalidKey`] (empty, longer than `max_key_len`, or
    /// with a control character; it says what a key may be) or
    /// [`crate::Error::PayloadTooLarge`].
    pub fn check_job(&self, key: &str, payload: usize) -> crate::Result<()> {
        // Long keys are cut: whoever gave the key has the rest.
        let shown: String = key.chars().take(40).collect();
        let shown = if shown.len() < key.len() { format!("{shown}…") } else { shown };
        let allowed = format!("a key is 1 to {} bytes with no control characters", self.max_key_len);
        let invalid =
            |why: String| crate::Error::InvalidKey { key: shown.clone(), why: format!("{why}: {allowed}") };
        if key.is_empty() {
            return Err(invalid("it is empty".into()));
        }
        if key.len() > self.max_key_len {
            return Err(invalid(format!(
                "it is {} bytes, over the limit of {}",
                key.len(),
                self.max_key_len
            )));
        }
        if let Some(control) = key.chars().find(|c| c.is_control()) {
            return Err(invalid(format!("it holds the control character {control:?}")));
        }
        if payload > self.max_payload {
            return Err(crate::Error::PayloadTooLarge { size: payload, limit: self.max_payload });
        }
        Ok(())
    }
}

/// Options of one worker.
///
/// Defaults: `max_concurrent_calls`: 32 (calls of different jobs a
/// worker makes at once; 1 makes it one call at a time); `release`: empty;
/// `inbox_entries` 1,024 and `inbox_bytes` 8 MiB.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Handler calls of different jobs a worker makes at once. Calls for
    /// one job are made one after the other, in order, whatever this is; 1
    /// makes every call wait for the one before.
    pub max_concurrent_calls: usize,
    /// What the worker runs, as the pool's listings show it.
    pub release: Release,
    /// Entries of its inbox a worker holds read ahead, at most; beyond
    /// them it stops reading (what it has not read stays in Redis, and no
    /// entry is skipped).
    pub inbox_entries: usize,
    /// Bytes of inbox entries a worker holds read ahead, at most (an entry
    /// larger than this is still read, alone).
    pub inbox_bytes: usize,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            max_concurrent_calls: 32,
            release: Release::default(),
            inbox_entries: 1024,
            inbox_bytes: 8 << 20,
        }
    }
}

/// What a worker runs, as its host names it: a digest of the handler's
/// code and a version name, each empty when not told. Recorded with the
/// worker's membership, so every node's listings show which workers run
/// which code while a new version rolls through a pool. Neither may
/// contain `|`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Release {
    /// A digest of the handler's code (say, `sha256:…` of its file).
    pub digest: String,
    /// A version name (say, `2.1.0`).
    pub version: String,
}

/// `version digest` with the digest cut to its algorithm and 12 hex
/// digits (`2.1.0 sha256:0123456789ab`), or what is set, or `-`.
impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digest: String = self.digest.chars().take(19).collect();
        match (self.version.is_empty(), digest.is_empty()) {
            (true, true) => f.write_str("-"),
            (false, true) => f.write_str(&self.version),
            (true, false) => f.write_str(&digest),
            (false, false) => write!(f, "{} {digest}", self.version),
        }
    }
}
