//! [`Node`]: a process's membership in a pool, the top of the pool's
//! layers: it owns the [`Core`] (in `crate::core`) its workers share and
//! the workers (`crate::worker`); neither imports this module.
//!
//! # Layout
//! - this file: [`Node`], join and close.
//! - `batch`: dispatching many jobs in pipelines.
//! - `confirm`: dispatches confirmed on replicas (`WAIT`).
//! - `dispatch`: dispatch, stop, notify, retry, forget.
//! - `membership`: workers joining and leaving; the pool's shutdown.
//! - `upkeep`: the full node's task: lease renewals, the janitor.
//! - `listing`: jobs, workers, status, and the Redis reads behind them.
//! - `releases`: the releases the pool refuses.
//! - `rollout`: a release announced for the whole pool.
//! - `view`: [`PoolView`], the same listings without joining.

mod batch;
mod confirm;
mod dispatch;
mod lanes;
mod listing;
mod membership;
mod releases;
mod rollout;
mod upkeep;
mod view;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use pulse_rmap::{Map, MapOptions};
use tracing::Instrument;

use crate::core::{self, Core};
use crate::error::{Error, Result};
use crate::keys::{MAX_SLOT_GROUPS, PoolKeys, SLOTS_MAP, WORKERS_MAP, validate_pool};
use crate::options::NodeOptions;
use crate::worker::WorkerHandle;

pub use listing::{JobCounts, JobsPage, JobsQuery, MAX_PAGE, MAX_SCANS, NodeInfo, WorkerInfo};
pub use releases::RefusedRelease;
pub use rollout::{Rollout, RolloutOutcome, RolloutState};
pub use view::PoolView;

/// The workers a node hosts, by id.
pub(crate) type LocalWorkers = Arc<Mutex<HashMap<String, WorkerHandle>>>;

/// Refuses a Redis that may evict keys under memory pressure: it would
/// drop jobs silently. A Redis that does not let us read its configuration
/// (some managed services) is accepted with a warning.
async fn refuse_evicting_redis(conn: &pulse_redis::Shared) -> Result<()> {
    let mut conn = conn.clone();
    let answer: redis::RedisResult<Vec<String>> =
        redis::cmd("CONFIG").arg("GET").arg("maxmemory-policy").query_async(&mut conn).await;
    match answer {
        Ok(pair) => match pair.get(1).map(String::as_str) {
            Some("noeviction") | None => Ok(()),
            Some(policy) => Err(Error::EvictingRedis { policy: policy.to_owned() }),
        },
        Err(error) => {
            tracing::warn!(error = %error, "cannot read Redis's maxmemory-policy; make sure it is noeviction");
            Ok(())
        }
    }
}

/// A process's membership in a pool: dispatches, stops and notifies jobs,
/// and (unless client-only) hosts workers.
pub struct Node {
    pub(crate) core: Arc<Core>,
    client_only: bool,
    pub(crate) local_workers: LocalWorkers,
    /// With `confirm_replicas`: the connections dispatches go on.
    confirm: Option<Arc<confirm::Confirm>>,
    /// Single dispatches on their way, by slot table revision (see `lanes`).
    lanes: Arc<lanes::Lanes>,
    /// Becomes true once the pool shut down and this node's workers left.
    stopped: tokio::sync::watch::Receiver<bool>,
    /// The pool's other slot groups (none for a pool of one group), each
    /// joined as a node of its own in its group's keys, under this node's
    /// id and with the same workers. This node is group 0, where the
    /// pool-wide records live (epoch, handler, tickers, schedules).
    others: Vec<Node>,
}

impl Node {
    /// Joins pool `pool` on the Redis of `client` as a full node, which can
    /// host workers.
    ///
    /// # Errors
    /// [`Error::InvalidPool`], or Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: a node dropped before it returns has no workers; its
    /// tasks end with it.
    pub async fn join(client: &pulse_redis::Redis, pool: &str, options: NodeOptions) -> Result<Self> {
        Self::start(client, pool, options, false).await
    }

    /// Joins pool `pool` as a client-only node: it dispatches, stops,
    /// notifies and lists, but hosts no workers and is not a member.
    ///
    /// # Errors
    /// As [`Node::join`].
    ///
    /// # Cancel safety
    /// Cancel safe (see [`Node::join`]).
    pub async fn client(client: &pulse_redis::Redis, pool: &str, options: NodeOptions) -> Result<Self> {
        Self::start(client, pool, options, true).await
    }

    async fn start(
        client: &pulse_redis::Redis,
        pool: &str,
        options: NodeOptions,
        client_only: bool,
    ) -> Result<Self> {
        validate_pool(pool)?;
        let keys = PoolKeys::new(pool);
        // One connection for every group: multiplexed, as one group's
        // workers and dispatches share one.
        let conn = client.shared().await.map_err(keys.redis_error("connect"))?;
        if !client_only {
            refuse_evicting_redis(&conn).await?;
        }
        let mut options = options;
        if client_only && let Some((_, groups)) = core::pool_layout(&conn, &keys).await? {
            // A client follows the pool's layout, whatever it was told: it
            // hosts nothing, and `dispatch` from any machine should not
            // need the pool's settings.
            options.slot_groups = groups;
        }
        let groups = options.slot_groups;
        if !(crate::hash::valid_groups(groups, crate::hash::VIRTUAL_SLOTS) && groups <= MAX_SLOT_GROUPS) {
            return Err(Error::InvalidSlotGroups(groups));
        }
        // A ULID: unique across hosts (every container's process may be
        // pid 1) and sortable by when the node joined.
        let id = ulid::Ulid::new().to_string();
        // One set of confirming connections for every group: each sends a
        // group's scripts with their `WAIT`, to the group's master.
        let confirm = confirm::Confirm::new(client, &options).map(Arc::new);
        let start = |keys| {
            Self::start_group(client, conn.clone(), keys, &options, (client_only, confirm.clone()), &id)
        };
        // Group 0 first: its epoch says whether the pool has `groups`
        // groups before any other group's keys are written.
        let mut node = start(keys).await?;
        for group in 1..groups {
            match start(PoolKeys::group(pool, group, groups)).await {
                Ok(member) => node.others.push(member),
                Err(error) => {
                    node.close().await;
                    return Err(error);
                }
            }
        }
        tracing::info!(pool, node = %id, client_only, groups, "joined the pool");
        Ok(node)
    }

    /// Joins the slot group whose keys are `keys` as node `id`, on `conn`.
    async fn start_group(
        client: &pulse_redis::Redis,
        conn: pulse_redis::Shared,
        keys: PoolKeys,
        options: &NodeOptions,
        (client_only, confirm): (bool, Option<Arc<confirm::Confirm>>),
        id: &str,
    ) -> Result<Self> {
        let mut options = options.clone();
        // No counter spans the groups: each admits its share.
        options.max_jobs = options.max_jobs.div_ceil(u64::from(options.slot_groups));
        if !client_only {
            let mut c = conn.clone();
            let shutting_down: bool = redis::cmd("EXISTS")
                .arg(&keys.shutdown)
                .query_async(&mut c)
                .await
                .map_err(keys.redis_error("join"))?;
            if shutting_down {
                return Err(Error::ShuttingDown(keys.pool.clone()));
            }
        }
        let (epoch, slot_count) = core::pool_epoch(&conn, &keys, options.slot_groups).await?;
        let tag = MapOptions::default().hash_tag(&keys.tag);
        let slots = Map::join(client, SLOTS_MAP, tag.clone()).await?;
        let workers = Map::join(client, WORKERS_MAP, tag).await?;
        let lease = core::Lease::new(epoch, slot_count);
        let core =
            Arc::new(Core::new(id.to_owned(), client.clone(), keys, conn, options, (slots, workers), lease));
        let token = core.token.clone();
        core::start_replies(&core).await?;
        let tasks = &core.tasks;
        let local_workers: LocalWorkers = Arc::default();
        let (stopped_tx, stopped) = tokio::sync::watch::channel(false);
        if !client_only {
            let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
            let span = tracing::info_span!("pool.lease", node = %core.id, group = %core.keys.tag);
            tasks.spawn(upkeep::run(core.clone(), token.clone(), shutdown_tx).instrument(span.clone()));
            tasks.spawn(
                membership::on_shutdown(core.clone(), local_workers.clone(), shutdown_rx, stopped_tx)
                    .instrument(span),
            );
        }
        Ok(Self {
            core,
            client_only,
            local_workers,
            confirm,
            lanes: Arc::default(),
            stopped,
            others: Vec::new(),
        })
    }

    /// The node of slot group `group` (0: this one).
    fn group(&self, group: u32) -> &Node {
        match group {
            0 => self,
            group => &self.others[group as usize - 1],
        }
    }

    /// Every slot group's node, group 0's (this one) first.
    fn groups(&self) -> impl Iterator<Item = &Node> {
        std::iter::once(self).chain(&self.others)
    }

    /// The slot group of `key`.
    fn group_of(&self, key: &str) -> u32 {
        crate::hash::group_of(key, self.core.lease.slot_count(), self.slot_groups())
    }

    /// The node of `key`'s slot group when it is not this one.
    fn elsewhere(&self, key: &str) -> Option<&Node> {
        match self.group_of(key) {
            0 => None,
            group => Some(self.group(group)),
        }
    }

    /// The places of `keys` in their order, by slot group (group 0's
    /// first).
    fn by_group<'a>(&self, keys: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
        let mut by_group = vec![Vec::new(); self.others.len() + 1];
        for (index, key) in keys.enumerate() {
            by_group[self.group_of(key) as usize].push(index);
        }
        by_group
    }

    /// Waits until the pool shuts down ([`Node::shutdown`], from any node),
    /// this node's workers have stopped their jobs and left, and the
    /// shutdown has removed the pool's keys (see
    /// `Node::shutdown_removed`). Never resolves on a client-only node.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn pool_shut_down(&self) {
        futures_util::future::join_all(self.groups().map(Node::group_shut_down)).await;
    }

    async fn group_shut_down(&self) {
        let mut stopped = self.stopped.clone();
        if stopped.wait_for(|stopped| *stopped).await.is_err() {
            std::future::pending::<()>().await;
        }
        self.shutdown_removed().await;
    }

    /// The pool's slot groups (see [`NodeOptions::slot_groups`]).
    pub fn slot_groups(&self) -> u32 {
        u32::try_from(self.others.len() + 1).unwrap_or(u32::MAX)
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.core.id
    }

    /// How many dispatches, stops and notifications this node had to send
    /// again because its slot table was stale or the job's owner had
    /// changed: a measure of membership churn (0 in a steady pool).
    pub fn routing_retries(&self) -> u64 {
        self.groups().map(|node| node.core.routing_retries.load(Ordering::Relaxed)).sum()
    }

    /// What the pool's jobs emitted.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only connects.
    pub async fn emitted(&self) -> Result<crate::EmittedEvents> {
        crate::EmittedEvents::open(&self.core.client, &self.core.keys.pool).await
    }

    /// The Redis client this node was made with.
    pub fn redis_client(&self) -> pulse_redis::Redis {
        self.core.client.clone()
    }

    /// The pool's name.
    pub fn pool(&self) -> &str {
        &self.core.keys.pool
    }

    /// Leaves the pool: every worker of this node leaves (its jobs are
    /// handed to the remaining workers, or wait for one), then the node's
    /// tasks stop. Never panics; errors are logged.
    ///
    /// # Cancel safety
    /// Not cancel safe: call it to completion so every worker hands its jobs
    /// back.
    pub async fn close(&self) {
        futures_util::future::join_all(self.groups().map(Node::close_group)).await;
        tracing::info!(pool = %self.core.keys.pool, node = %self.core.id, "left the pool");
    }

    async fn close_group(&self) {
        let workers: Vec<String> = self.lock_workers().keys().cloned().collect();
        if let Err(error) = self.remove_workers(&workers).await {
            tracing::warn!(error = %error, "failed to remove the workers while closing");
        }
        // Workers that could not leave (Redis unreachable) stop where they
        // are, as in a crash: their leases end and their jobs move on.
        let stranded: Vec<WorkerHandle> = self.lock_workers().drain().map(|(_, handle)| handle).collect();
        if !stranded.is_empty() {
            tracing::warn!(
                workers = stranded.len(),
                "workers that could not leave were stopped where they were"
            );
        }
        drop(stranded);
        self.core.token.cancel();
        self.core.tasks.close();
        self.core.tasks.wait().await;
        let mut conn = self.core.conn.clone();
        let mut del = redis::cmd("DEL");
        del.arg(&self.core.replies).arg(self.core.worker_replies.keys());
        if self.core.keys.tag == self.core.keys.pool {
            // Its identity: no listing names a node that left.
            del.arg(self.core.keys.node(&self.core.id));
        }
        let _: redis::RedisResult<()> = del.exec_async(&mut conn).await;
        self.core.slots.close().await;
        self.core.workers.close().await;
    }

    fn lock_workers(&self) -> std::sync::MutexGuard<'_, HashMap<String, WorkerHandle>> {
        lock_workers(&self.local_workers)
    }
}

fn lock_workers(workers: &LocalWorkers) -> std::sync::MutexGuard<'_, HashMap<String, WorkerHandle>> {
    // Held for map updates only, never across an await (a std mutex).
    workers.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("pool", &self.core.keys.pool)
            .field("id", &self.core.id)
            .field("client_only", &self.client_only)
            .finish_non_exhaustive()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.core.token.cancel();
    }
}
