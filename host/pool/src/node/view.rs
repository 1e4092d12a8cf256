//! [`PoolView`]: a read-only look at a pool, read from Redis on each call;
//! it lists what a [`super::Node`] lists, the same way (see `listing`).

use std::collections::HashMap;

use pulse_rmap::{Map, MapOptions};

use super::listing::{
    JobsPage, JobsQuery, NodeInfo, WorkerInfo, all_jobs, collect, jobs_page, join_cursor, merge_workers,
    nodes_of, split_cursor, status, workers_of,
};
use crate::error::Result;
use crate::job::JobInfo;
use crate::keys::{PoolKeys, SLOTS_MAP, WORKERS_MAP, validate_pool};

/// A read-only look at a pool, read from Redis on each call.
///
/// Opening one costs a connection and nothing else: it neither joins the
/// pool nor replicates its membership, so a short-lived reader (a listing
/// from the command line) answers in a few round trips.
#[derive(Clone)]
pub struct PoolView {
    pub(super) conn: pulse_redis::Shared,
    /// Every slot group's keys, group 0's (where the pool-wide records
    /// are) first.
    groups: Vec<PoolKeys>,
    /// The pool's slot count (a key's group comes from its slot).
    slot_count: u32,
}

impl std::fmt::Debug for PoolView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolView").field("pool", &self.keys().pool).finish_non_exhaustive()
    }
}

impl PoolView {
    /// Opens a view of pool `pool` on the Redis of `client`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidPool`]; Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only connects.
    pub async fn open(client: &pulse_redis::Redis, pool: &str) -> Result<Self> {
        validate_pool(pool)?;
        let keys = PoolKeys::new(pool);
        let conn = client.shared().await.map_err(keys.redis_error("connect"))?;
        // A pool that does not exist (yet) lists as one empty group.
        let (slot_count, groups) =
            crate::core::pool_layout(&conn, &keys).await?.unwrap_or((crate::hash::VIRTUAL_SLOTS, 1));
        let groups = (0..groups).map(|group| PoolKeys::group(pool, group, groups)).collect();
        Ok(Self { conn, groups, slot_count })
    }

    /// The pool's name.
    pub fn pool(&self) -> &str {
        &self.keys().pool
    }

    /// The pool's slot groups (1 for a pool that does not exist).
    pub fn slot_groups(&self) -> u32 {
        u32::try_from(self.groups.len()).unwrap_or(1)
    }

    /// Group 0's keys, where the pool-wide records are.
    pub(super) fn keys(&self) -> &PoolKeys {
        &self.groups[0]
    }

    /// The keys of `key`'s slot group.
    fn keys_of(&self, key: &str) -> &PoolKeys {
        &self.groups[crate::hash::group_of(key, self.slot_count, self.slot_groups()) as usize]
    }

    /// What the pool knows of job `key`.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<Option<JobInfo>> {
        status(&mut self.conn.clone(), self.keys_of(key), key).await
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
        for keys in &self.groups {
            jobs.extend(all_jobs(&mut self.conn.clone(), keys).await?);
        }
        Ok(jobs)
    }

    /// A page of the jobs `query` asks for (see [`JobsQuery`]): the same
    /// pages as [`super::Node::list_jobs`].
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn list_jobs(&self, query: &JobsQuery) -> Result<JobsPage> {
        let groups = self.groups.len() as u64;
        collect(query, |cursor, count| async move {
            let (group, inner) = split_cursor(cursor);
            let Some(keys) = usize::try_from(group).ok().and_then(|group| self.groups.get(group)) else {
                return Ok((0, Vec::new()));
            };
            let page = jobs_page(&mut self.conn.clone(), keys, inner, count, &query.prefix).await?;
            join_cursor(group, groups, page)
        })
        .await
    }

    /// The pool's workers, by join number.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let mut per_group = Vec::with_capacity(self.groups.len());
        for keys in &self.groups {
            let (slots, workers) = self.maps(keys).await?;
            let mut held: HashMap<String, usize> = HashMap::new();
            for worker in slots.into_values() {
                *held.entry(worker).or_default() += 1;
            }
            per_group.push(workers_of(&mut self.conn.clone(), keys, held, workers).await?);
        }
        Ok(merge_workers(per_group))
    }

    /// The handler recorded as the pool's (see [`super::Node::claim_handler`]);
    /// `None` before any host claimed it.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn handler(&self) -> Result<Option<String>> {
        redis::cmd("GET")
            .arg(&self.keys().handler)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(self.keys().redis_error("read the pool's handler"))
    }

    /// The pool's full nodes, from the workers they host, each with what
    /// it says of itself.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>> {
        let (_, workers) = self.maps(self.keys()).await?;
        let mut nodes = nodes_of(workers);
        super::listing::describe(&mut self.conn.clone(), self.keys(), &mut nodes).await?;
        Ok(nodes)
    }

    /// The slot table and the workers map of the group of `keys`, each
    /// read once.
    async fn maps(&self, keys: &PoolKeys) -> Result<(HashMap<String, String>, HashMap<String, String>)> {
        let options = MapOptions::default().hash_tag(&keys.tag);
        let mut conn = self.conn.clone();
        let slots = Map::read_once(&mut conn, SLOTS_MAP, &options).await?;
        let workers = Map::read_once(&mut conn, WORKERS_MAP, &options).await?;
        Ok((slots, workers))
    }
}
