//! Membership in Redis: workers join (entry, lease, share of the slot
//! table), give up their slots, renew their leases and are evicted; the
//! pool epoch that tells a node Redis lost the pool's data.
//!
//! Every full node runs the janitor on each tick: one script evicts the
//! workers whose leases expired more than the grace ago and queues their
//! jobs, then queued jobs are assigned. It costs one command per node and
//! tick when nothing expired, so every node runs it: a killed node's jobs
//! move as soon as any node's tick sees the lease expired.

use std::time::Duration;

use redis::Value;

use super::fence::{grace, millis};
use super::{Core, Join};
use crate::error::{Error, Result};
use crate::hash::{VIRTUAL_SLOTS, slot_count, slot_groups};
use crate::keys::PoolKeys;
use crate::options::Release;
use crate::scripts;

/// Eviction rounds in a row that may find an expired worker's jobs
/// changed (assigned to it while it was read) before the janitor leaves it
/// to its next tick.
const EVICT_ATTEMPTS: usize = 8;

/// Tries of a leaving worker's eviction that fails (Redis slow to answer),
/// waiting twice as long before each.
const LEAVE_ATTEMPTS: usize = 5;

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
    /// slots, in one step; returns once this node's replicas of the slot
    /// table and of the workers map show the join (or after a few seconds
    /// regardless), so that this node's listings show the worker. With
    /// `heir_of`, its slots are exactly those of that worker (which keeps
    /// its entry and lease until it leaves): it takes over that worker's
    /// keys and no other worker's.
    pub(crate) async fn join_worker(
        &self,
        id: &str,
        join: u64,
        release: &Release,
        heir_of: Option<&str>,
    ) -> Result<()> {
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
            .arg(worker_entry(&self.id, join, release))
            .arg(millis(self.options.lease_ttl))
            .arg(epoch)
            .arg(slot_count)
            .arg(heir_of.unwrap_or(""));
        let answer: Vec<Value> =
            invocation.invoke_async(&mut conn).await.map_err(self.redis_error("join a worker"))?;
        match Join::parse(&answer)? {
            Join::Member(rev) => {
                self.lease.extend(sent, self.options.lease_ttl);
                self.lease.joined(id);
                self.catch_up(&rev).await;
                self.catch_up_worker(id).await;
                Ok(())
            }
            Join::ShuttingDown => Err(Error::ShuttingDown(keys.pool.clone())),
            Join::Epoch(epoch) => Err(Error::EpochChanged { pool: keys.pool.clone(), epoch }),
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
        // A worker leaving for good is evicted before its host goes, and
        // no janitor of that host comes after: a Redis slow to answer (a
        // machine busy with plugins looping in `stop`) gets a few more
        // tries before the worker's jobs are left to another host's
        // janitor.
        let mut wait = self.options.retry_backoff.max(Duration::from_millis(50));
        for _ in 1..LEAVE_ATTEMPTS {
            match self.evict_and_next(id).await {
                Ok((evicted, _)) => return Ok(evicted),
                Err(error) if id.is_some() => {
                    tracing::debug!(%error, "eviction failed; trying again");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(self.evict_and_next(id).await?.0)
    }

    /// [`Core::evict`], and with `None` also how long until the next
    /// worker may be evicted (the earliest lease's end plus the grace).
    ///
    /// Three steps, so the eviction script is given every key it touches:
    /// which workers (`expired.lua`, on Redis time), their job sets, then
    /// `evict.lua`, which refuses with `changed` when a set gained a job or
    /// another worker expired in between; then it starts again.
    async fn evict_and_next(&self, id: Option<&str>) -> Result<(Vec<(String, u64)>, Option<Duration>)> {
        let grace = millis(grace(self.options.lease_ttl));
        let mut conn = self.conn.clone();
        for _ in 0..EVICT_ATTEMPTS {
            let (leaving, next) = match id {
                Some(id) => (vec![id.to_owned()], None),
                None => self.expired(grace).await?,
            };
            if leaving.is_empty() {
                return Ok((Vec::new(), next));
            }
            let mut read = redis::pipe();
            for worker in &leaving {
                read.cmd("SMEMBERS").arg(self.keys.worker_jobs(worker));
            }
            let sets: Vec<Vec<String>> = read
                .query_async(&mut conn)
                .await
                .map_err(self.redis_error("read the jobs of expired workers"))?;
            let answer: Vec<Value> = self
                .evict_invocation(&leaving, &sets, grace, id.is_some())
                .invoke_async(&mut conn)
                .await
                .map_err(self.redis_error("evict workers"))?;
            if let [Value::BulkString(changed)] = answer.as_slice()
                && changed.as_slice() == b"changed"
            {
                continue;
            }
            let mut evicted = Vec::new();
            for pair in answer.chunks(2) {
                match pair {
                    [Value::BulkString(worker), Value::Int(jobs)] => evicted.push((
                        String::from_utf8_lossy(worker).into_owned(),
                        u64::try_from(*jobs).unwrap_or(0),
                    )),
                    _ => return Err(super::protocol("evict", &format!("{answer:?}"))),
                }
            }
            return Ok((evicted, next));
        }
        // Jobs kept being assigned to the workers as they were read: the
        // janitor's next round tries again, and a worker leaving is
        // evicted by a janitor once its lease ends.
        Err(super::protocol("evict", "the workers' job sets kept gaining jobs while they were read"))
    }

    /// The workers whose leases expired more than `grace` ms ago, and how
    /// long until the next one may be.
    async fn expired(&self, grace: u64) -> Result<(Vec<String>, Option<Duration>)> {
        let mut conn = self.conn.clone();
        let answer: Vec<Value> = scripts::EXPIRED
            .key(&self.keys.leases)
            .arg(grace)
            .invoke_async(&mut conn)
            .await
            .map_err(self.redis_error("read expired leases"))?;
        let bad = || super::protocol("expired", &format!("{answer:?}"));
        let Some((Value::Int(ms), workers)) = answer.split_first() else { return Err(bad()) };
        let next = u64::try_from(*ms).ok().map(Duration::from_millis);
        let workers = workers
            .iter()
            .map(|worker| match worker {
                Value::BulkString(worker) => Ok(String::from_utf8_lossy(worker).into_owned()),
                _ => Err(bad()),
            })
            .collect::<Result<_>>()?;
        Ok((workers, next))
    }

    /// `evict.lua` for `workers`, each with its job set as read (`sets`),
    /// naming every key it touches.
    fn evict_invocation<'a>(
        &self,
        workers: &[String],
        sets: &[Vec<String>],
        grace: u64,
        forced: bool,
    ) -> redis::ScriptInvocation<'a> {
        let keys = &self.keys;
        let mut invocation = self.membership_script(&scripts::EVICT);
        invocation.key(&keys.jobs).key(&keys.queued);
        invocation.arg(grace).arg(if forced { "1" } else { "" }).arg(workers.len());
        for (worker, set) in workers.iter().zip(sets) {
            invocation.key(keys.inbox(worker)).key(keys.worker_jobs(worker));
            invocation.arg(worker).arg(set.len());
        }
        for key in sets.iter().flatten() {
            invocation.key(keys.record(key)).key(keys.held(key));
            invocation.arg(key);
        }
        invocation
    }

    /// Renews the leases of this node's workers. Returns whether the pool
    /// is shutting down.
    pub(crate) async fn renew(&self) -> Result<bool> {
        let keys = &self.keys;
        let members = self.lease.members();
        let sent = self.lease.elapsed_ms();
        let mut conn = self.conn.clone();
        let mut invocation = scripts::RENEW.key(self.workers.redis_key());
        invocation
            .key(&keys.leases)
            .key(&keys.epoch)
            .key(&keys.shutdown)
            .key(keys.node(&self.id))
            .arg(millis(self.options.lease_ttl))
            .arg(self.lease.epoch())
            .arg(self.identity_entry());
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
            _ => Err(super::protocol("renew", &format!("{answer:?}"))),
        }
    }

    /// Redis no longer holds the pool's epoch: it lost the pool's data.
    /// Every worker of this node stops calling its handler, joins again in
    /// the epoch now in Redis (a new one if there is none) and writes back
    /// the jobs it runs.
    async fn epoch_changed(&self) -> Result<()> {
        let (epoch, slot_count) = pool_epoch(&self.conn, &self.keys, self.options.slot_groups).await?;
        tracing::error!(
            pool = %self.keys.pool,
            was = %self.lease.epoch(),
            now = %epoch,
            "Redis lost the pool's data (its epoch changed); this node's workers join again"
        );
        self.lease.adopt_epoch(epoch, slot_count);
        // Answers are written only to a reply stream that exists.
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        for stream in std::iter::once(self.replies.clone()).chain(self.worker_replies.keys()) {
            pipe.cmd("XADD").arg(stream).arg("*").arg("n").arg("hello").arg("p").arg("").ignore();
        }
        let recreated: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
        if let Err(error) = recreated {
            tracing::warn!(error = %error, "failed to recreate the reply stream");
        }
        Ok(())
    }

    /// One janitor round: evicts expired workers, then assigns queued jobs.
    /// Returns how long until the next worker may be evicted.
    pub(crate) async fn janitor(&self) -> Result<Option<Duration>> {
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

impl Core {
    /// The node's identity for `renew.lua` (`host|pid|version|http`); ''
    /// in slot groups but the first, where no listing looks for it.
    fn identity_entry(&self) -> String {
        if self.keys.tag != self.keys.pool {
            return String::new();
        }
        let identity = &self.options.identity;
        let clean = |text: &str| text.replace('|', "/");
        format!(
            "{}|{}|{}|{}",
            clean(&identity.host),
            identity.pid,
            clean(&identity.version),
            identity.http.as_deref().unwrap_or_default()
        )
    }
}

/// Reads the pool epoch, creating it first if Redis has none (random, and
/// the slot count of the pool's table, [`VIRTUAL_SLOTS`]); returns it with
/// the slot count it records.
///
/// With more than one slot group, the epoch records their number too
/// (`<hex>:<slots>:g<groups>`).
///
/// # Errors
/// [`Error::IncompatiblePool`] for an epoch without a slot count (a pool
/// this version cannot route for); [`Error::SlotGroupsDiffer`] for a pool
/// of another number of slot groups than `groups`; Redis failures.
pub(crate) async fn pool_epoch(
    conn: &pulse_redis::Shared,
    keys: &PoolKeys,
    groups: u32,
) -> Result<(String, u32)> {
    let mut conn = conn.clone();
    let mut candidate = format!("{:016x}:{VIRTUAL_SLOTS}", fastrand::u64(..));
    if groups > 1 {
        candidate.push_str(&format!(":g{groups}"));
    }
    let (epoch,): (String,) = redis::pipe()
        .set_nx(&keys.epoch, &candidate)
        .ignore()
        .get(&keys.epoch)
        .query_async(&mut conn)
        .await
        .map_err(keys.redis_error("read the epoch"))?;
    match (slot_count(&epoch), slot_groups(&epoch)) {
        (Some(_), Some(pool_has)) if pool_has != groups => {
            Err(Error::SlotGroupsDiffer { pool: keys.pool.clone(), configured: groups, pool_has })
        }
        (Some(slots), Some(_)) => Ok((epoch, slots)),
        _ => Err(Error::IncompatiblePool { pool: keys.pool.clone(), epoch }),
    }
}

/// The slot count and slot groups recorded in the pool's epoch; `None`
/// when it has none (the pool does not exist yet) or one this version
/// cannot read.
///
/// # Errors
/// Redis failures.
pub(crate) async fn pool_layout(conn: &pulse_redis::Shared, keys: &PoolKeys) -> Result<Option<(u32, u32)>> {
    let epoch: Option<String> = redis::cmd("GET")
        .arg(&keys.epoch)
        .query_async(&mut conn.clone())
        .await
        .map_err(keys.redis_error("read the epoch"))?;
    Ok(epoch.as_deref().and_then(crate::hash::epoch_layout))
}

/// The epoch given to a replicated map's hash if a script creates it.
fn map_epoch() -> String {
    format!("{:016x}", fastrand::u64(..))
}

/// A worker's entry in the workers map: `node|join|digest|version`.
pub(crate) fn worker_entry(node: &str, join: u64, release: &Release) -> String {
    format!("{node}|{join}|{}|{}", release.digest, release.version)
}

/// The node, join number and release of a workers entry (an entry that
/// ends after its join number has an empty release).
pub(crate) fn parse_entry(entry: &str) -> Option<(&str, u64, Release)> {
    let mut parts = entry.splitn(4, '|');
    let node = parts.next()?;
    let join = parts.next()?.parse().ok()?;
    let digest = parts.next().unwrap_or_default().to_owned();
    let version = parts.next().unwrap_or_default().to_owned();
    Some((node, join, Release { digest, version }))
}
