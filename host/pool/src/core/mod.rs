//! What a node's parts share, below both the node and its workers: the
//! [`Core`] (keys, connection, replicated maps, lease, reply waiters),
//! leases and fences, membership scripts, routing. Nothing here imports
//! `node` or `worker`.
//!
//! # Layout
//! - this file: [`Core`].
//! - `answered`: where a worker answers dispatches with plain commands.
//! - `answers`: the scripts' and the workers' answers, typed.
//! - `emits`: a worker's writes in its jobs' names (events, states,
//!   completions), each call's written in one step with its answer.
//! - `fence`: [`Lease`] and [`WorkerFence`]: when handler calls may run.
//! - `flushes`: a host's workers of one slot group flush together.
//! - `membership`: join, release, renew, evict, the pool epoch.
//! - `routing`: keys to workers over the slot table; assigning queued jobs.
//! - `replies`: a node's reply streams and the waiters registered on them.

mod answered;
mod answers;
mod emits;
mod fence;
mod flushes;
mod membership;
mod replies;
mod routing;

use std::sync::atomic::AtomicU64;

use pulse_rmap::Map;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::Error;
use crate::keys::PoolKeys;
use crate::options::NodeOptions;
use crate::scripts;

pub(crate) use answers::{Assigned, Dispatched, Join, Outcome, Routed, protocol};
pub use emits::CallScope;
pub(crate) use emits::{EmitQueue, Outgoing, What, Write};
pub(crate) use fence::{Lease, WorkerFence, tick};
pub(crate) use flushes::flush;
pub(crate) use membership::{parse_entry, pool_epoch, pool_layout};
pub(crate) use replies::{Answer, Waiter, Waiters, WorkerReplies, start as start_replies};

/// What a node's parts share.
pub(crate) struct Core {
    pub(crate) id: String,
    pub(crate) client: pulse_redis::Redis,
    pub(crate) keys: PoolKeys,
    /// This node's reply stream key, where workers answer its requests.
    pub(crate) replies: String,
    /// Where each worker answers this node's dispatches, on a pool read
    /// by doorbells (see [`Core::dispatch_replies`]).
    pub(crate) worker_replies: WorkerReplies,
    pub(crate) conn: pulse_redis::Shared,
    pub(crate) options: NodeOptions,
    pub(crate) slots: Map,
    pub(crate) workers: Map,
    pub(crate) waiters: Waiters,
    pub(crate) lease: Lease,
    /// Every task of the node: its reply reader, its lease task, its
    /// workers, its tickers and schedules. Closing the node waits for all
    /// of them.
    pub(crate) tasks: TaskTracker,
    /// Cancelled when the node closes, once its workers have left: the
    /// tasks that would otherwise run on (reply reader, lease task,
    /// tickers, schedules) end.
    pub(crate) token: CancellationToken,
    pub(crate) metrics: crate::metrics::PoolMetrics,
    /// Scripts refused for a stale slot table or a moved owner, retried.
    pub(crate) routing_retries: AtomicU64,
    /// Whether inboxes and reply streams are read when their doorbells
    /// ring (on a cluster, for a pool of more than one slot group: each
    /// of its many streams carries little, and blocked reads would wake
    /// one by one), so the scripts that add to them ring.
    pub(crate) doorbells: bool,
    /// The workers' flushes waiting for the one on its way.
    pub(crate) flushes: flushes::Flushes,
}

impl Core {
    /// The core of node `id`; `maps` are its replicas of the slot table
    /// and the workers map.
    pub(crate) fn new(
        id: String,
        client: pulse_redis::Redis,
        keys: PoolKeys,
        conn: pulse_redis::Shared,
        options: NodeOptions,
        (slots, workers): (Map, Map),
        lease: Lease,
    ) -> Self {
        let token = options.cancel.child_token();
        let doorbells = client.form() == pulse_redis::Form::Cluster && options.slot_groups > 1;
        Self {
            doorbells,
            replies: keys.replies(&id),
            worker_replies: WorkerReplies::default(),
            metrics: crate::metrics::PoolMetrics::new(&keys.pool),
            id,
            client,
            keys,
            conn,
            options,
            slots,
            workers,
            waiters: Waiters::default(),
            lease,
            tasks: TaskTracker::new(),
            token,
            routing_retries: AtomicU64::new(0),
            flushes: flushes::Flushes::default(),
        }
    }

    /// The scripts' argument that rings the doorbells of the streams they
    /// add to (see [`Core::doorbells`]).
    pub(crate) fn ring(&self) -> &'static str {
        if self.doorbells { "1" } else { "" }
    }

    pub(crate) fn redis_error(&self, op: &'static str) -> impl FnOnce(redis::RedisError) -> Error + '_ {
        self.keys.redis_error(op)
    }

    /// A request id unique in the pool: a ULID, after the mark of a node
    /// that reads its answers in batches ([`crate::wire::BATCHED`]).
    pub(crate) fn next_request(&self) -> String {
        format!("{}{}", crate::wire::BATCHED, ulid::Ulid::new())
    }

    /// Removes a finished job (completed, stopped, or refused at its
    /// start), fenced by `token`, after the events `emits` holds; false
    /// when it is not the worker's any more.
    pub(crate) async fn finish(
        &self,
        emits: &EmitQueue,
        worker: &str,
        key: &str,
        token: &str,
    ) -> redis::RedisResult<bool> {
        let keys = &self.keys;
        let mut cmd = scripts::evalsha(
            &scripts::FINISH,
            &[keys.jobs.clone(), keys.record(key), keys.held(key), keys.worker_jobs(worker)],
        );
        cmd.arg(key).arg(token);
        let done: i64 = emits.ordered(self, key, &scripts::FINISH, cmd).await?;
        Ok(done == 1)
    }

    /// Marks a job failed, fenced by `token`, after the events `emits`
    /// holds; false when it is not the worker's any more.
    pub(crate) async fn fail(
        &self,
        emits: &EmitQueue,
        worker: &str,
        key: &str,
        token: &str,
        reason: &str,
        attempt: u32,
    ) -> redis::RedisResult<bool> {
        let keys = &self.keys;
        let mut cmd = scripts::evalsha(
            &scripts::FAIL,
            &[keys.jobs.clone(), keys.record(key), keys.worker_jobs(worker)],
        );
        cmd.arg(key).arg(token).arg(reason).arg(attempt);
        let done: i64 = emits.ordered(self, key, &scripts::FAIL, cmd).await?;
        Ok(done == 1)
    }
}
