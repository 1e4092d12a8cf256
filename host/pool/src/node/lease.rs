//! Leases, fencing and eviction.
//!
//! Every worker holds a lease in Redis: a deadline on Redis time, renewed
//! for all of a node's workers by one script every quarter of the lease's
//! time to live. The renewal checks membership, so an evicted worker is
//! never brought back by a late renewal.
//!
//! A node fences its own workers: they run no handler call once the send
//! time of the last successful renewal plus the TTL minus a margin has
//! passed on the node's monotonic clock. Their leases end in Redis no
//! sooner than that (the renewal ran after it was sent), and eviction waits
//! a grace longer still, so a worker has dropped its jobs before anyone may
//! take them (ARCHITECTURE I1).
//!
//! The fence is also per worker ([`WorkerFence`]): a renewal that finds a
//! worker evicted fences that worker before the node's lease moves on, so
//! no guest call, timer or effect of its jobs starts afterwards, whatever
//! the node's other leases say.
//!
//! Every full node runs the janitor on each tick: one script evicts the
//! workers whose leases expired more than the grace ago and queues their
//! jobs, then queued jobs are assigned. It costs one command per node and
//! tick when nothing expired, so every node runs it: a killed node's jobs
//! move as soon as any node's tick sees the lease expired.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::Value;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Core;
use crate::error::{Error, Result};
use crate::hash::{VIRTUAL_SLOTS, slot_count};
use crate::scripts;

/// One worker's own fence: once it falls, none of the worker's jobs may
/// run guest code, whatever the node's lease says. It falls when a renewal
/// finds the worker evicted, or when the worker finds its lease may have
/// ended; it is new (up) again when the worker joins again.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkerFence {
    fenced: Arc<AtomicBool>,
    evicted: Arc<Notify>,
    /// The last loss of the pool's data (a [`Lease::data_losses`]
    /// generation) after which the worker wrote its jobs back: until then a
    /// refusal of its jobs' requests is the loss's doing, not a move's.
    written_back: Arc<AtomicU64>,
}

impl WorkerFence {
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Fences the worker (its own decision: nobody needs telling).
    pub(crate) fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
    }

    /// Fences the worker and tells it it was evicted.
    fn evict(&self) {
        self.fence();
        self.evicted.notify_one();
    }

    /// Resolves once a renewal found the worker evicted.
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await;
    }

    /// The worker wrote its jobs back after data loss `generation`.
    pub(crate) fn written_back(&self, generation: u64) {
        self.written_back.fetch_max(generation, Ordering::AcqRel);
    }
}

/// A node's lease on its workers' membership, as its own clock sees it.
#[derive(Debug)]
pub(crate) struct Lease {
    base: Instant,
    /// Milliseconds after `base` until which this node's workers may call
    /// their handlers.
    until_ms: AtomicU64,
    /// Bumped by every successful renewal: fenced workers wait for it.
    renewed: watch::Sender<u64>,
    /// Bumped when Redis lost the pool's data: workers write back the
    /// jobs they run.
    data_lost: watch::Sender<u64>,
    /// This node's workers, each with its fence and whether it joined
    /// (only those are renewed).
    members: Mutex<HashMap<String, (WorkerFence, bool)>>,
    /// The pool epoch this node works in.
    epoch: Mutex<String>,
    /// The slot count recorded in that epoch.
    slot_count: AtomicU32,
}

impl Lease {
    pub(crate) fn new(epoch: String, slot_count: u32) -> Self {
        Self {
            slot_count: AtomicU32::new(slot_count),
            base: Instant::now(),
            until_ms: AtomicU64::new(0),
            renewed: watch::Sender::new(0),
            data_lost: watch::Sender::new(0),
            members: Mutex::new(HashMap::new()),
            epoch: Mutex::new(epoch),
        }
    }

    /// Whether this node's workers may call their handlers now.
    pub(crate) fn valid(&self) -> bool {
        self.elapsed_ms() < self.until_ms.load(Ordering::Acquire)
    }

    /// Whether the worker behind `fence` may call its handler now.
    pub(crate) fn valid_for(&self, fence: &WorkerFence) -> bool {
        !fence.is_fenced() && self.valid()
    }

    /// When the fence falls, unless a renewal moves it.
    pub(crate) fn fence_at(&self) -> Instant {
        self.base + Duration::from_millis(self.until_ms.load(Ordering::Acquire))
    }

    /// A renewal (or join) sent at `sent_ms` succeeded: the fence moves to
    /// `sent_ms + ttl - margin`.
    fn extend(&self, sent_ms: u64, ttl: Duration) {
        let until = sent_ms + millis(ttl) - millis(margin(ttl));
        self.until_ms.fetch_max(until, Ordering::AcqRel);
        self.renewed.send_modify(|n| *n += 1);
    }

    /// Fences every worker of the node at once.
    fn fence_now(&self) {
        self.until_ms.store(0, Ordering::Release);
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        millis(self.base.elapsed())
    }

    pub(crate) fn renewals(&self) -> watch::Receiver<u64> {
        self.renewed.subscribe()
    }

    pub(crate) fn data_losses(&self) -> watch::Receiver<u64> {
        self.data_lost.subscribe()
    }

    pub(crate) fn epoch(&self) -> String {
        lock(&self.epoch).clone()
    }

    /// The pool's slot count, as its epoch records it.
    pub(crate) fn slot_count(&self) -> u32 {
        self.slot_count.load(Ordering::Acquire)
    }

    /// Registers worker `id`, not joined yet; returns its fence: `keep`
    /// when given and still up (the worker joins again with the jobs it
    /// runs, whose contexts share it), otherwise a new one.
    pub(crate) fn add_member(&self, id: &str, keep: Option<WorkerFence>) -> WorkerFence {
        let fence = keep.filter(|fence| !fence.is_fenced()).unwrap_or_else(|| {
            let fence = WorkerFence::default();
            fence.written_back(*self.data_lost.borrow());
            fence
        });
        lock(&self.members).insert(id.to_owned(), (fence.clone(), false));
        fence
    }

    /// The epoch this node works in, and whether a loss of the pool's data
    /// happened that `fence`'s worker has not written its jobs back after
    /// yet: read together, as [`Lease::adopt_epoch`] changes them.
    pub(crate) fn epoch_and_pending(&self, fence: &WorkerFence) -> (String, bool) {
        let epoch = lock(&self.epoch);
        (epoch.clone(), self.data_loss_pending(fence))
    }

    /// Redis lost the pool's data: the node works in `epoch` from now on,
    /// and its workers call no handler until they joined again and wrote
    /// their jobs back. The loss is recorded before the fence falls, so a
    /// worker that finds the fence fallen also finds the loss (and writes
    /// its jobs back rather than dropping them).
    fn adopt_epoch(&self, epoch: String, slot_count: u32) {
        {
            let mut current = lock(&self.epoch);
            *current = epoch;
            self.slot_count.store(slot_count, Ordering::Release);
            self.data_lost.send_modify(|n| *n += 1);
        }
        self.fence_now();
    }

    /// Whether `fence`'s worker has not written its jobs back since the
    /// last loss of the pool's data.
    pub(crate) fn data_loss_pending(&self, fence: &WorkerFence) -> bool {
        fence.written_back.load(Ordering::Acquire) < *self.data_lost.borrow()
    }

    /// Worker `id` joined: its lease is renewed from now on.
    fn joined(&self, id: &str) {
        if let Some((_, joined)) = lock(&self.members).get_mut(id) {
            *joined = true;
        }
    }

    pub(crate) fn remove_member(&self, id: &str) {
        lock(&self.members).remove(id);
    }

    fn members(&self) -> Vec<String> {
        lock(&self.members).iter().filter(|(_, (_, joined))| *joined).map(|(id, _)| id.clone()).collect()
    }

    fn evicted(&self, id: &str) {
        if let Some((fence, _)) = lock(&self.members).get(id) {
            fence.evict();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Held for one read or update, never across an await.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How long before its lease ends (by its own clock) a node fences its
/// workers: a tenth of the TTL.
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / 10
}

/// How long after a lease ends its worker may be evicted: the margin plus
/// as long again for the fenced worker to drop its jobs.
pub(crate) fn grace(ttl: Duration) -> Duration {
    margin(ttl) * 2
}

/// How often a node renews its leases and runs the janitor.
pub(crate) fn tick(ttl: Duration) -> Duration {
    ttl / 4
}

impl Core {
    /// `script` with what every membership script takes first: KEYS the
    /// slot table, the workers map and the leases; ARGV the two maps'
    /// change channels and an epoch for a map that has none.
    fn membership_script<'a>(&self, script: &'a redis::Script) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.key(self.slots.redis_key());
        invocation
            .key(self.workers.redis_key())
            .key(&self.keys.leases)
            .arg(self.slots.channel())
            .arg(self.workers.channel())
            .arg(map_epoch());
        invocation
    }

    /// Makes worker `id` a member: entry, lease and its share of the
    /// slots, in one step; returns once this node's replica of the slot
    /// table shows the join (or after a few seconds regardless).
    pub(crate) async fn join_worker(&self, id: &str, join: u64) -> Result<()> {
        let keys = &self.keys;
        // Read together: the slot count is the epoch's.
        let (epoch, slot_count) = (self.lease.epoch(), self.lease.slot_count());
        let sent = self.lease.elapsed_ms();
        let mut conn = self.conn.clone();
        let mut invocation = self.membership_script(&scripts::JOIN);
        invocation
            .key(&keys.shutdown)
            .key(&keys.epoch)
            .arg(id)
            .arg(format!("{}|{join}", self.id))
            .arg(millis(self.options.lease_ttl))
            .arg(epoch)
            .arg(slot_count);
        let answer: Vec<Value> =
            invocation.invoke_async(&mut conn).await.map_err(self.redis_error("join a worker"))?;
        let (status, detail) = super::dispatch::status(&answer, "join")?;
        match status.as_str() {
            "joined" => {
                self.lease.extend(sent, self.options.lease_ttl);
                self.lease.joined(id);
                self.catch_up(&detail).await;
                Ok(())
            }
            "shutdown" => Err(Error::ShuttingDown(keys.pool.clone())),
            "epoch" => Err(Error::EpochChanged { pool: keys.pool.clone(), epoch: detail }),
            other => Err(Error::Protocol { op: "join", answer: other.to_owned() }),
        }
    }

    /// Workers `ids` give up their slots, in one step: no new job is
    /// routed to them while they hand their jobs back (they stay members,
    /// with their leases; they leave for good by [`Core::evict`]). Returns
    /// once this node's replica of the slot table shows the change (or
    /// after a few seconds regardless).
    pub(crate) async fn release_slots(&self, ids: &[String]) -> Result<()> {
        let mut conn = self.conn.clone();
        let mut invocation = self.membership_script(&scripts::RELEASE_SLOT);
        for id in ids {
            invocation.arg(id);
        }
        let rev: u64 = invocation.invoke_async(&mut conn).await.map_err(self.redis_error("release slots"))?;
        self.catch_up(&rev.to_string()).await;
        Ok(())
    }

    /// Evicts worker `id` now (it fenced itself), or, with `None`, every
    /// worker whose lease expired more than the grace ago. Returns the
    /// evicted workers with the number of jobs each had.
    pub(crate) async fn evict(&self, id: Option<&str>) -> Result<Vec<(String, u64)>> {
        Ok(self.evict_and_next(id).await?.0)
    }

    /// [`Core::evict`], and with `None` also how long until the next
    /// worker may be evicted (the earliest lease's end plus the grace).
    async fn evict_and_next(&self, id: Option<&str>) -> Result<(Vec<(String, u64)>, Option<Duration>)> {
        let keys = &self.keys;
        let mut conn = self.conn.clone();
        let mut invocation = self.membership_script(&scripts::EVICT);
        invocation
            .key(&keys.jobs)
            .key(&keys.queued)
            .arg(&keys.prefix)
            .arg(keys.inbox_prefix())
            .arg(millis(grace(self.options.lease_ttl)))
            .arg(id.unwrap_or(""));
        let answer: Vec<Value> =
            invocation.invoke_async(&mut conn).await.map_err(self.redis_error("evict workers"))?;
        let (mut evicted, mut next) = (Vec::new(), None);
        for pair in answer.chunks(2) {
            match pair {
                [Value::BulkString(tag), Value::Int(ms)] if tag.as_slice() == b"next" => {
                    next = Some(Duration::from_millis(u64::try_from(*ms).unwrap_or(0)));
                }
                [Value::BulkString(worker), Value::Int(jobs)] => evicted
                    .push((String::from_utf8_lossy(worker).into_owned(), u64::try_from(*jobs).unwrap_or(0))),
                _ => {}
            }
        }
        Ok((evicted, next))
    }

    /// Renews the leases of this node's workers. Returns whether the pool
    /// is shutting down.
    async fn renew(&self) -> Result<bool> {
        let keys = &self.keys;
        let members = self.lease.members();
        let sent = self.lease.elapsed_ms();
        let mut conn = self.conn.clone();
        let mut invocation = scripts::RENEW.key(self.workers.redis_key());
        invocation
            .key(&keys.leases)
            .key(&keys.epoch)
            .key(&keys.shutdown)
            .arg(millis(self.options.lease_ttl))
            .arg(self.lease.epoch());
        for member in &members {
            invocation.arg(member);
        }
        let answer: Vec<String> =
            invocation.invoke_async(&mut conn).await.map_err(self.redis_error("renew leases"))?;
        match answer.first().map(String::as_str) {
            Some("epoch") => {
                self.epoch_changed().await?;
                Ok(false)
            }
            Some(state @ ("ok" | "shutdown")) => {
                // Evicted workers are fenced before the node's lease moves
                // on: none of their jobs may run from now on.
                for (member, flag) in members.iter().zip(&answer[1..]) {
                    if flag == "0" {
                        tracing::warn!(worker = %member, "the worker was evicted: it lost its jobs and joins again");
                        self.lease.evicted(member);
                    }
                }
                self.lease.extend(sent, self.options.lease_ttl);
                Ok(state == "shutdown")
            }
            _ => Err(Error::Protocol { op: "renew", answer: format!("{answer:?}") }),
        }
    }

    /// Redis no longer holds the pool's epoch: it lost the pool's data.
    /// Every worker of this node stops calling its handler, joins again in
    /// the epoch now in Redis (a new one if there is none) and writes back
    /// the jobs it runs.
    async fn epoch_changed(&self) -> Result<()> {
        let epoch =
            ensure_epoch(&self.conn, &self.keys.epoch).await.map_err(self.redis_error("read the epoch"))?;
        let slot_count = checked_slot_count(&self.keys.pool, &epoch)?;
        tracing::error!(
            pool = %self.keys.pool,
            was = %self.lease.epoch(),
            now = %epoch,
            "Redis lost the pool's data (its epoch changed); this node's workers join again"
        );
        self.lease.adopt_epoch(epoch, slot_count);
        // Answers are written only to a reply stream that exists.
        let mut conn = self.conn.clone();
        let recreated: redis::RedisResult<()> = redis::pipe()
            .cmd("XADD")
            .arg(&self.replies)
            .arg("*")
            .arg("n")
            .arg("hello")
            .arg("p")
            .arg("")
            .ignore()
            .query_async(&mut conn)
            .await;
        if let Err(error) = recreated {
            tracing::warn!(error = %error, "failed to recreate the reply stream");
        }
        Ok(())
    }

    /// One janitor round: evicts expired workers, then assigns queued jobs.
    /// Returns how long until the next worker may be evicted.
    async fn janitor(&self) -> Result<Option<Duration>> {
        let (evicted, next) = self.evict_and_next(None).await?;
        for (worker, jobs) in evicted {
            self.metrics.evictions.increment(1);
            self.metrics.evicted_jobs.increment(jobs);
            tracing::warn!(worker = %worker, jobs, "evicted a worker whose lease expired; its jobs are queued");
        }
        self.assign_queued().await?;
        Ok(next)
    }

    /// Assigns every queued job to the worker its key routes to.
    pub(crate) async fn assign_queued(&self) -> Result<()> {
        if self.slots.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(&self.keys.queued)
                .arg(cursor)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await
                .map_err(self.redis_error("list queued jobs"))?;
            for key in batch {
                self.assign(&key).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

/// Reads the pool epoch, creating it first if Redis has none: random, and
/// the slot count of the pool's table ([`VIRTUAL_SLOTS`]).
pub(crate) async fn ensure_epoch(
    conn: &redis::aio::ConnectionManager,
    key: &str,
) -> redis::RedisResult<String> {
    let mut conn = conn.clone();
    let candidate = format!("{:016x}:{VIRTUAL_SLOTS}", fastrand::u64(..));
    let (epoch,): (String,) =
        redis::pipe().set_nx(key, &candidate).ignore().get(key).query_async(&mut conn).await?;
    Ok(epoch)
}

/// The slot count recorded in pool epoch `epoch`, or the error of a pool
/// this version cannot route for.
pub(crate) fn checked_slot_count(pool: &str, epoch: &str) -> Result<u32> {
    slot_count(epoch)
        .ok_or_else(|| Error::IncompatiblePool { pool: pool.to_owned(), epoch: epoch.to_owned() })
}

/// The epoch given to a replicated map's hash if a script creates it.
fn map_epoch() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// The task of a full node: renews its leases, runs the janitor and
/// watches for the pool shutting down, every tick until `token` is
/// cancelled.
pub(crate) async fn run(core: Arc<Core>, token: CancellationToken, shutdown: watch::Sender<bool>) {
    let mut ticks = tokio::time::interval(tick(core.options.lease_ttl));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When a lease ends (plus the grace) before the next tick, the janitor
    // wakes then too: a dead node's jobs move up to a tick sooner.
    let mut evict_at: Option<Instant> = None;
    loop {
        let due = async {
            match evict_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = token.cancelled() => return,
            _ = ticks.tick() => {}
            () = due => {
                evict_at = None;
                janitor_round(&core, &mut evict_at).await;
                continue;
            }
        }
        match core.renew().await {
            Ok(true) => {
                // The pool is going away: its keys are about to be removed,
                // and a renewal then would take that for lost data.
                shutdown.send_replace(true);
                token.cancelled().await;
                return;
            }
            Ok(false) => {}
            Err(error) => {
                core.metrics.renewals_failed.increment(1);
                tracing::warn!(error = %error, "failed to renew leases");
            }
        }
        janitor_round(&core, &mut evict_at).await;
    }
}

/// Runs the janitor; sets `evict_at` when the next eviction is due before
/// the next tick.
async fn janitor_round(core: &Core, evict_at: &mut Option<Instant>) {
    match core.janitor().await {
        Ok(Some(next)) if next < tick(core.options.lease_ttl) => {
            // A millisecond late rather than early: Redis's clock decides.
            *evict_at = Some(Instant::now() + next + Duration::from_millis(1));
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %error, "janitor round failed"),
    }
}
