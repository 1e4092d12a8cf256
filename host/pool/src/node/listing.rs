//! What a pool holds: jobs, workers, status of a key. Listing reads Redis
//! (jobs are not replicated to nodes: bounded memory, I5); it costs O(n) in
//! what it lists, and nothing per dispatch.
//!
//! A [`Node`] lists workers and nodes from its replicas; a
//! [`super::PoolView`] (`view`) reads everything from Redis on each call and costs one connection to
//! open: no replica, no subscription, no reply stream (the command line's
//! read-only commands use it). Both read jobs the same way.

use std::collections::{BTreeMap, HashMap};

use redis::aio::ConnectionLike;

use super::Node;
use crate::error::Result;
use crate::job::{JobEvent, JobInfo, JobState};
use crate::keys::PoolKeys;

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
    /// How many slots of the slot table it holds (0 while it leaves).
    pub slots: u32,
    /// How many jobs it owns.
    pub jobs: u64,
    /// What it runs, as its host named it.
    pub release: crate::options::Release,
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

/// What the pool knows of a full node. Serialized (for the API and the
/// command line's `--json`) as `{"id", "workers", "releases"}`, and, once
/// the node's identity is read, its fields beside them (`host`, `pid`,
/// `version`, `http`) and `started_ms`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NodeInfo {
    /// Its id.
    pub id: String,
    /// The workers it hosts.
    pub workers: Vec<String>,
    /// What they run, each release once.
    pub releases: Vec<crate::options::Release>,
    /// What the node says of itself (its machine, process, version and
    /// HTTP address), once read ([`Node::described_nodes`]); `None` when
    /// not read, or when the node wrote none (a version before this one).
    #[serde(flatten)]
    pub identity: Option<crate::options::Identity>,
    /// When the node first renewed its leases, in ms of Redis time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
}

impl Node {
    /// The pool's full nodes (those hosting workers), from the workers
    /// they host; client-only nodes are not members and are not listed.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        nodes_of(self.core.workers.snapshot())
    }

    /// [`Node::nodes`], each with what it says of itself (one round trip).
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn described_nodes(&self) -> Result<Vec<NodeInfo>> {
        let mut nodes = self.nodes();
        describe(&mut self.core.conn.clone(), &self.core.keys, &mut nodes).await?;
        Ok(nodes)
    }

    /// What the pool knows of job `key`.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<Option<JobInfo>> {
        let core = &self.elsewhere(key).unwrap_or(self).core;
        status(&mut core.conn.clone(), &core.keys, key).await
    }

    /// Every job of the pool, in no particular order.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn jobs(&self) -> Result<Vec<JobInfo>> {
        let mut jobs = Vec::new();
        for node in self.groups() {
            jobs.extend(all_jobs(&mut node.core.conn.clone(), &node.core.keys).await?);
        }
        Ok(jobs)
    }

    /// One page of the pool's jobs, about `count` of them (Redis `HSCAN`:
    /// a page may hold a few more or fewer), from `cursor` (0 at first).
    /// Returns the next cursor, 0 after the last page. A job present the
    /// whole time is listed at least once; its cost is that of the page,
    /// whatever the number of jobs.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// With several slot groups, the groups are listed one after the
    /// other: the cursor carries the group in its top byte.
    pub async fn jobs_page(&self, cursor: u64, count: usize) -> Result<(u64, Vec<JobInfo>)> {
        self.jobs_page_matching(cursor, count, "").await
    }

    /// [`Node::jobs_page`] of the jobs whose keys start with `prefix`.
    async fn jobs_page_matching(
        &self,
        cursor: u64,
        count: usize,
        prefix: &str,
    ) -> Result<(u64, Vec<JobInfo>)> {
        let (group, inner) = split_cursor(cursor);
        let Some(node) = u32::try_from(group).ok().filter(|&g| g < self.slot_groups()).map(|g| self.group(g))
        else {
            return Ok((0, Vec::new()));
        };
        let page = jobs_page(&mut node.core.conn.clone(), &node.core.keys, inner, count, prefix).await?;
        join_cursor(group, u64::from(self.slot_groups()), page)
    }

    /// A page of the jobs `query` asks for (see [`JobsQuery`]).
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list_jobs(&self, query: &JobsQuery) -> Result<JobsPage> {
        collect(query, |cursor, count| self.jobs_page_matching(cursor, count, &query.prefix)).await
    }

    /// How many jobs the pool holds, by state: one script, costing
    /// O(workers), whatever the number of jobs.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn job_counts(&self) -> Result<JobCounts> {
        let mut counts = JobCounts::default();
        for node in self.groups() {
            let group = node.group_counts().await?;
            counts.running += group.running;
            counts.queued += group.queued;
            counts.failed += group.failed;
        }
        Ok(counts)
    }

    async fn group_counts(&self) -> Result<JobCounts> {
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

    /// Whether each of `keys` is a job of the pool: one `HMGET` per slot
    /// group.
    pub(crate) async fn existing(&self, keys: &[&str]) -> redis::RedisResult<Vec<bool>> {
        let mut answers = vec![false; keys.len()];
        for (node, indexes) in self.groups().zip(self.by_group(keys.iter().copied())) {
            if indexes.is_empty() {
                continue;
            }
            let mut hmget = redis::cmd("HMGET");
            hmget.arg(&node.core.keys.jobs);
            for &i in &indexes {
                hmget.arg(keys[i]);
            }
            let found: Vec<Option<String>> = hmget.query_async(&mut node.core.conn.clone()).await?;
            for (i, found) in indexes.into_iter().zip(found) {
                answers[i] = found.is_some();
            }
        }
        Ok(answers)
    }

    /// The worker `key` routes to now by this node's replica of the slot
    /// table; `None` when no worker holds its slot (none is a member).
    pub fn owner(&self, key: &str) -> Option<String> {
        Some(self.elsewhere(key).unwrap_or(self).core.route(key).1).filter(|worker| !worker.is_empty())
    }

    /// The pool's workers, by join number.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let mut per_group = Vec::with_capacity(self.others.len() + 1);
        for node in self.groups() {
            let core = &node.core;
            let (slots, workers) = (core.slots.value_counts(), core.workers.snapshot());
            per_group.push(workers_of(&mut core.conn.clone(), &core.keys, slots, workers).await?);
        }
        Ok(merge_workers(per_group))
    }
}

/// Where a page cursor of a pool of several slot groups keeps the group:
/// its top byte (`HSCAN` cursors of a hash of fewer than 2^56 buckets stay
/// below).
const GROUP_SHIFT: u32 = 56;

pub(super) fn nodes_of(workers: HashMap<String, String>) -> Vec<NodeInfo> {
    let mut nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
    for (worker, value) in workers {
        if let Some((node, _, release)) = crate::core::parse_entry(&value) {
            let info = nodes.entry(node.to_owned()).or_insert_with(|| NodeInfo {
                id: node.to_owned(),
                workers: Vec::new(),
                releases: Vec::new(),
                identity: None,
                started_ms: None,
            });
            info.workers.push(worker);
            if !info.releases.contains(&release) {
                info.releases.push(release);
            }
        }
    }
    nodes
        .into_values()
        .map(|mut info| {
            info.workers.sort();
            info.releases.sort_by(|a, b| (&a.version, &a.digest).cmp(&(&b.version, &b.digest)));
            info
        })
        .collect()
}

/// Fills in what each of `nodes` says of itself (its identity hash, kept
/// by its renewals in the pool's first slot group).
pub(super) async fn describe<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &PoolKeys,
    nodes: &mut [NodeInfo],
) -> Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for node in nodes.iter() {
        pipe.hgetall(keys.node(&node.id));
    }
    let described: Vec<HashMap<String, String>> =
        pipe.query_async(conn).await.map_err(keys.redis_error("read the nodes' identities"))?;
    for (node, mut fields) in nodes.iter_mut().zip(described) {
        if fields.is_empty() {
            continue;
        }
        let mut take = |name: &str| fields.remove(name).unwrap_or_default();
        let http = take("http");
        node.identity = Some(crate::options::Identity {
            host: take("host"),
            pid: take("pid").parse().unwrap_or_default(),
            version: take("version"),
            http: (!http.is_empty()).then_some(http),
        });
        node.started_ms = take("started").parse().ok();
    }
    Ok(())
}

pub(super) async fn status<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &PoolKeys,
    key: &str,
) -> Result<Option<JobInfo>> {
    type WithHistory = (Option<u64>, Option<u32>, Option<String>, Option<String>);
    let (ownership, record): (Option<String>, WithHistory) = redis::pipe()
        .hget(&keys.jobs, key)
        .cmd("HMGET")
        .arg(keys.record(key))
        .arg(&["created", "attempt", "reason", "history"])
        .query_async(conn)
        .await
        .map_err(keys.redis_error("read a job"))?;
    let (created, attempt, reason, history) = record;
    let mut jobs: Vec<JobInfo> =
        ownership.and_then(|o| info(key, &o, (created, attempt, reason))).into_iter().collect();
    if let Some(job) = jobs.first_mut() {
        job.history = history_of(job.created_at_ms, history.as_deref().unwrap_or_default());
    }
    mark_starting(conn, keys, &mut jobs).await?;
    Ok(jobs.pop())
}

/// Longest inbox tail read to find unconfirmed starts: a worker this far
/// behind lists its older starts as running.
const STARTING_SCAN: usize = 1_000;

/// Lists as [`JobState::Starting`] the running jobs whose start is still
/// in their worker's inbox: a worker deletes each entry in the round trip
/// that answers it, so a start there is one whose handler has not
/// returned. One `XRANGE` per worker of the jobs listed; nothing per
/// dispatch.
async fn mark_starting<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &PoolKeys,
    jobs: &mut [JobInfo],
) -> Result<()> {
    let workers: std::collections::BTreeSet<String> = jobs
        .iter()
        .filter(|job| job.state == JobState::Running)
        .filter_map(|job| job.worker.clone())
        .collect();
    if workers.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for worker in &workers {
        pipe.cmd("XRANGE").arg(keys.inbox(worker)).arg("-").arg("+").arg("COUNT").arg(STARTING_SCAN);
    }
    let inboxes: Vec<redis::streams::StreamRangeReply> =
        pipe.query_async(conn).await.map_err(keys.redis_error("list jobs"))?;
    let mut starting: std::collections::HashSet<(&str, String)> = std::collections::HashSet::new();
    for (worker, inbox) in workers.iter().zip(&inboxes) {
        for entry in &inbox.ids {
            let field = |name: &str| match entry.map.get(name) {
                Some(redis::Value::BulkString(bytes)) => Some(bytes.as_slice()),
                _ => None,
            };
            if field("n") != Some(b"start".as_slice()) {
                continue;
            }
            if let Some(event) =
                field("p").and_then(|payload| crate::wire::InboxEvent::decode("start", payload))
            {
                starting.insert((worker.as_str(), event.key));
            }
        }
    }
    for job in jobs.iter_mut().filter(|job| job.state == JobState::Running) {
        if let Some(worker) = job.worker.as_deref()
            && starting.contains(&(worker, job.key.clone()))
        {
            job.state = JobState::Starting;
        }
    }
    Ok(())
}

pub(super) async fn all_jobs<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &PoolKeys,
) -> Result<Vec<JobInfo>> {
    let mut jobs = Vec::new();
    let mut cursor = 0;
    loop {
        let (next, page) = jobs_page(conn, keys, cursor, 500, "").await?;
        jobs.extend(page);
        if next == 0 {
            return Ok(jobs);
        }
        cursor = next;
    }
}

/// What a listing asks for: a page of about `limit` jobs (1 to
/// [`MAX_PAGE`]) from `cursor` (0 at first; then the `next_cursor` of the
/// page before), only those in `state` when given, only those whose keys
/// start with `prefix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsQuery {
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs whose keys start with it (`""`: all).
    pub prefix: String,
    /// About how many jobs a page holds.
    pub limit: usize,
    /// Where the page starts.
    pub cursor: u64,
}

impl Default for JobsQuery {
    fn default() -> Self {
        Self { state: None, prefix: String::new(), limit: 100, cursor: 0 }
    }
}

/// A page of a listing: its jobs, sorted by key, and where the next page
/// starts (`None` after the last). A page may hold fewer jobs than asked
/// (even none) and still have a next one: a filtered listing reads at most
/// [`MAX_SCANS`] rounds of the pool per page, so that a page costs about
/// the same however few jobs match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsPage {
    /// The jobs, sorted by key.
    pub jobs: Vec<JobInfo>,
    /// The cursor of the next page.
    pub next_cursor: Option<u64>,
}

/// The largest page a listing gives.
pub const MAX_PAGE: usize = 1000;

/// `HSCAN` rounds one page of a filtered listing makes at most.
pub const MAX_SCANS: usize = 10;

/// Pages from `page` (cursor, count -> next cursor, jobs) until `query`'s
/// limit is reached, the listing ends or [`MAX_SCANS`] rounds were made.
pub(super) async fn collect<F, Fut>(query: &JobsQuery, mut page: F) -> Result<JobsPage>
where
    F: FnMut(u64, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, Vec<JobInfo>)>>,
{
    let limit = query.limit.clamp(1, MAX_PAGE);
    let mut cursor = query.cursor;
    let mut jobs = Vec::new();
    for _ in 0..MAX_SCANS {
        let (next, found) = page(cursor, limit - jobs.len()).await?;
        jobs.extend(found.into_iter().filter(|job| query.state.is_none_or(|state| job.state == state)));
        cursor = next;
        if cursor == 0 || jobs.len() >= limit {
            break;
        }
    }
    jobs.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(JobsPage { jobs, next_cursor: (cursor != 0).then_some(cursor) })
}

/// A listing cursor's slot group (its top byte) and `HSCAN` cursor.
pub(super) fn split_cursor(cursor: u64) -> (u64, u64) {
    (cursor >> GROUP_SHIFT, cursor & !(u64::MAX << GROUP_SHIFT))
}

/// The listing cursor after a page of group `group` (of `groups`) whose
/// `HSCAN` answered `next`: the group's next cursor, or the next group's
/// start, or 0 after the last group.
pub(super) fn join_cursor(
    group: u64,
    groups: u64,
    (next, jobs): (u64, Vec<JobInfo>),
) -> Result<(u64, Vec<JobInfo>)> {
    if next >> GROUP_SHIFT != 0 {
        return Err(crate::core::protocol("list jobs", &format!("a cursor of {next}")));
    }
    let next = match next {
        0 if group + 1 >= groups => 0,
        0 => (group + 1) << GROUP_SHIFT,
        next => (group << GROUP_SHIFT) | next,
    };
    Ok((next, jobs))
}

/// A `HSCAN MATCH` pattern for keys starting with `prefix`: its glob
/// characters escaped.
fn match_prefix(prefix: &str) -> String {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

pub(super) async fn jobs_page<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &PoolKeys,
    cursor: u64,
    count: usize,
    prefix: &str,
) -> Result<(u64, Vec<JobInfo>)> {
    let mut scan = redis::cmd("HSCAN");
    scan.arg(&keys.jobs).arg(cursor);
    if !prefix.is_empty() {
        scan.arg("MATCH").arg(match_prefix(prefix));
    }
    let (next, batch): (u64, Vec<(String, String)>) =
        scan.arg("COUNT").arg(count.max(1)).query_async(conn).await.map_err(keys.redis_error("list jobs"))?;
    if batch.is_empty() {
        return Ok((next, Vec::new()));
    }
    let mut pipe = redis::pipe();
    for (key, _) in &batch {
        pipe.cmd("HMGET").arg(keys.record(key)).arg(&["created", "attempt", "reason"]);
    }
    let records: Vec<Record> = pipe.query_async(conn).await.map_err(keys.redis_error("list jobs"))?;
    let mut jobs: Vec<JobInfo> = batch
        .iter()
        .zip(records)
        .filter_map(|((key, ownership), record)| info(key, ownership, record))
        .collect();
    mark_starting(conn, keys, &mut jobs).await?;
    Ok((next, jobs))
}

/// The workers of the workers map, with the slots each holds (`held`:
/// worker -> slots) and their job counts.
pub(super) async fn workers_of<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &PoolKeys,
    held: HashMap<String, usize>,
    workers: HashMap<String, String>,
) -> Result<Vec<WorkerInfo>> {
    let mut workers: Vec<WorkerInfo> = workers
        .into_iter()
        .filter_map(|(id, value)| {
            let (node, join, release) = crate::core::parse_entry(&value)?;
            Some(WorkerInfo {
                slots: held.get(&id).map_or(0, |&n| u32::try_from(n).unwrap_or(u32::MAX)),
                node: node.to_owned(),
                join,
                id,
                jobs: 0,
                release,
            })
        })
        .collect();
    if workers.is_empty() {
        return Ok(workers);
    }
    let mut pipe = redis::pipe();
    for worker in &workers {
        pipe.scard(keys.worker_jobs(&worker.id));
    }
    let counts: Vec<u64> = pipe.query_async(conn).await.map_err(keys.redis_error("list workers"))?;
    for (worker, count) in workers.iter_mut().zip(counts) {
        worker.jobs = count;
    }
    workers.sort_by_key(|w| w.join);
    Ok(workers)
}

/// One list of workers out of each slot group's (`per_group`, group 0's
/// first): a worker is a member of every group, under one id. Its jobs are
/// summed; its slots are its average share of a group's table (each group
/// has the pool's slot count); its join number and release are group 0's,
/// or those of the first group listing it.
pub(super) fn merge_workers(per_group: Vec<Vec<WorkerInfo>>) -> Vec<WorkerInfo> {
    let groups = per_group.len().max(1) as u64;
    if groups == 1 {
        return per_group.into_iter().next().unwrap_or_default();
    }
    let mut merged: BTreeMap<String, (WorkerInfo, u64)> = BTreeMap::new();
    for worker in per_group.into_iter().flatten() {
        let slots = u64::from(worker.slots);
        match merged.entry(worker.id.clone()) {
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert((worker, slots));
            }
            std::collections::btree_map::Entry::Occupied(mut entry) => {
                let (first, total) = entry.get_mut();
                first.jobs += worker.jobs;
                *total += slots;
            }
        }
    }
    let mut workers: Vec<WorkerInfo> = merged
        .into_values()
        .map(|(mut worker, slots)| {
            worker.slots = u32::try_from(slots / groups).unwrap_or(u32::MAX);
            worker
        })
        .collect();
    workers.sort_by_key(|w| w.join);
    workers
}

/// A job's history as its record keeps it (`<ms> <event> <worker>`
/// lines, see `note` in lua/prelude.lua), after its dispatch at `created`;
/// a line it cannot read is left out.
fn history_of(created: u64, lines: &str) -> Vec<JobEvent> {
    let dispatched = JobEvent { at_ms: created, event: "dispatched".into(), worker: None };
    let later = lines.lines().filter_map(|line| {
        let mut parts = line.splitn(3, ' ');
        let at_ms = parts.next()?.parse().ok()?;
        let event = parts.next().filter(|e| !e.is_empty())?.to_owned();
        let worker = parts.next().filter(|w| !w.is_empty()).map(str::to_owned);
        Some(JobEvent { at_ms, event, worker })
    });
    std::iter::once(dispatched).chain(later).collect()
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
        history: Vec::new(),
    })
}
