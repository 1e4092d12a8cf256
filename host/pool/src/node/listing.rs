//! What a pool holds: jobs, workers, status of a key. Listing reads Redis
//! (jobs are not replicated to nodes: bounded memory, I5); it costs O(n) in
//! what it lists, and nothing per dispatch.

use std::collections::HashMap;

use super::Node;
use crate::error::Result;
use crate::job::{JobInfo, JobState};

/// The fields of a job's record that listing shows: created, attempt, reason.
type Record = (Option<u64>, Option<u32>, Option<String>);

/// What the pool knows of a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    /// Its id.
    pub id: String,
    /// The node hosting it.
    pub node: String,
    /// Its join number (order of joining the pool).
    pub join: u64,
    /// Its slot in the slot table, if it holds one.
    pub slot: Option<u32>,
    /// How many jobs it owns.
    pub jobs: u64,
}

/// How many jobs a pool holds, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Owned by a worker: running, or moving to another worker.
    pub running: u64,
    /// Waiting for a worker.
    pub queued: u64,
    /// Failed, waiting for `retry` or `forget`.
    pub failed: u64,
}

/// What the pool knows of a full node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its id.
    pub id: String,
    /// The workers it hosts.
    pub workers: Vec<String>,
}

impl Node {
    /// The pool's full nodes (those hosting workers), from the workers
    /// they host; client-only nodes are not members and are not listed.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let mut nodes: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
        for (worker, value) in self.core.workers.snapshot() {
            if let Some((node, _)) = value.split_once('|') {
                nodes.entry(node.to_owned()).or_default().push(worker);
            }
        }
        nodes
            .into_iter()
            .map(|(id, mut workers)| {
                workers.sort();
                NodeInfo { id, workers }
            })
            .collect()
    }

    /// What the pool knows of job `key`.
    ///
    /// # Errors
    /// Redis failures.
    pub async fn status(&self, key: &str) -> Result<Option<JobInfo>> {
        let keys = &self.core.keys;
        let mut conn = self.core.conn.clone();
        let (ownership, record): (Option<String>, Record) = redis::pipe()
            .hget(&keys.jobs, key)
            .cmd("HMGET")
            .arg(keys.record(key))
            .arg(&["created", "attempt", "reason"])
            .query_async(&mut conn)
            .await
            .map_err(self.core.redis_error("read a job"))?;
        Ok(ownership.and_then(|o| info(key, &o, record)))
    }

    /// Every job of the pool, in no particular order.
    ///
    /// # Errors
    /// Redis failures.
    pub async fn jobs(&self) -> Result<Vec<JobInfo>> {
        let mut jobs = Vec::new();
        let mut cursor = 0;
        loop {
            let (next, page) = self.jobs_page(cursor, 500).await?;
            jobs.extend(page);
            if next == 0 {
                return Ok(jobs);
            }
            cursor = next;
        }
    }

    /// One page of the pool's jobs, about `count` of them (Redis `HSCAN`:
    /// a page may hold a few more or fewer), from `cursor` (0 at first).
    /// Returns the next cursor, 0 after the last page. A job present the
    /// whole time is listed at least once; its cost is that of the page,
    /// whatever the number of jobs.
    ///
    /// # Errors
    /// Redis failures.
    pub async fn jobs_page(&self, cursor: u64, count: usize) -> Result<(u64, Vec<JobInfo>)> {
        let keys = &self.core.keys;
        let mut conn = self.core.conn.clone();
        let (next, batch): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
            .arg(&keys.jobs)
            .arg(cursor)
            .arg("COUNT")
            .arg(count.max(1))
            .query_async(&mut conn)
            .await
            .map_err(self.core.redis_error("list jobs"))?;
        if batch.is_empty() {
            return Ok((next, Vec::new()));
        }
        let mut pipe = redis::pipe();
        for (key, _) in &batch {
            pipe.cmd("HMGET").arg(keys.record(key)).arg(&["created", "attempt", "reason"]);
        }
        let records: Vec<Record> =
            pipe.query_async(&mut conn).await.map_err(self.core.redis_error("list jobs"))?;
        let jobs = batch
            .iter()
            .zip(records)
            .filter_map(|((key, ownership), record)| info(key, ownership, record))
            .collect();
        Ok((next, jobs))
    }

    /// How many jobs the pool holds, by state: one script, costing
    /// O(workers), whatever the number of jobs.
    ///
    /// # Errors
    /// Redis failures.
    pub async fn job_counts(&self) -> Result<JobCounts> {
        let keys = &self.core.keys;
        let mut invocation = crate::scripts::COUNTS.key(&keys.jobs);
        invocation.key(&keys.queued);
        for (worker, _) in self.core.workers.snapshot() {
            invocation.key(keys.worker_jobs(&worker));
        }
        let mut conn = self.core.conn.clone();
        let (total, queued, owned): (u64, u64, u64) =
            invocation.invoke_async(&mut conn).await.map_err(self.core.redis_error("count jobs"))?;
        Ok(JobCounts { running: owned, queued, failed: total.saturating_sub(queued + owned) })
    }

    /// The pool's workers, by join number.
    ///
    /// # Errors
    /// Redis failures.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let slots: HashMap<String, u32> = self
            .core
            .slots
            .snapshot()
            .into_iter()
            .filter_map(|(slot, worker)| Some((worker, slot.parse().ok()?)))
            .collect();
        let mut workers: Vec<WorkerInfo> = self
            .core
            .workers
            .snapshot()
            .into_iter()
            .filter_map(|(id, value)| {
                let (node, join) = value.split_once('|')?;
                Some(WorkerInfo {
                    slot: slots.get(&id).copied(),
                    node: node.to_owned(),
                    join: join.parse().ok()?,
                    id,
                    jobs: 0,
                })
            })
            .collect();
        if workers.is_empty() {
            return Ok(workers);
        }
        let mut pipe = redis::pipe();
        for worker in &workers {
            pipe.scard(self.core.keys.worker_jobs(&worker.id));
        }
        let mut conn = self.core.conn.clone();
        let counts: Vec<u64> =
            pipe.query_async(&mut conn).await.map_err(self.core.redis_error("list workers"))?;
        for (worker, count) in workers.iter_mut().zip(counts) {
            worker.jobs = count;
        }
        workers.sort_by_key(|w| w.join);
        Ok(workers)
    }
}

fn info(key: &str, ownership: &str, (created, attempt, reason): Record) -> Option<JobInfo> {
    let mut parts = ownership.split('|');
    let state = JobState::parse(parts.next()?)?;
    let worker = parts.next().filter(|w| !w.is_empty()).map(str::to_owned);
    Some(JobInfo {
        key: key.to_owned(),
        state,
        worker,
        created_at_ms: created.unwrap_or(0),
        attempt: attempt.unwrap_or(1),
        reason,
    })
}
