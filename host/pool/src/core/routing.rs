//! Routing keys over the slot table, and starting queued jobs where their
//! keys route: what dispatchers and workers both do.

use std::time::Duration;

use redis::Value;

use super::Core;
use crate::error::Result;
use crate::hash::slot_of;
use crate::scripts;

/// How long a caller waits for its membership replica to catch up with the
/// revision a script reported, before it retries anyway.
const CATCH_UP: Duration = Duration::from_secs(5);

impl Core {
    /// The slot table revision and the worker `key` routes to (`""` when
    /// there is no worker).
    pub(crate) fn route(&self, key: &str) -> (u64, String) {
        let slot = slot_of(key, self.lease.slot_count()).to_string();
        // The worker and the revision of one read of the table: a
        // consistent view, and one lock taken where every dispatcher of the
        // process takes it. A slot with no worker (no worker is a member)
        // routes nowhere: the job waits, queued, until a worker joins.
        let (rev, worker) = self.slots.get_with_revision(&slot);
        (rev, worker.unwrap_or_default())
    }

    /// Waits until the local slot table reaches revision `rev`.
    pub(crate) async fn catch_up(&self, rev: &str) {
        let rev: u64 = rev.parse().unwrap_or(0);
        self.slots.wait_until(CATCH_UP, |slots| slots.revision() >= rev).await;
    }

    /// Waits until this node's replica of the workers map holds worker
    /// `id` (at most [`CATCH_UP`]): a join writes the map in the step that
    /// gives the slots, but its replica hears of it on its own.
    pub(crate) async fn catch_up_worker(&self, id: &str) {
        self.workers.wait_until(CATCH_UP, |workers| workers.get(id).is_some()).await;
    }

    /// The keys of `dispatch.lua` for jobs `jobs` that route to `workers`:
    /// the jobs hash, the slot table, the token counter, the queued set,
    /// each worker's inbox and job set, then each job's record.
    pub(crate) fn dispatch_keys<'k>(
        &self,
        workers: &[&str],
        jobs: impl Iterator<Item = &'k str>,
    ) -> Vec<String> {
        let keys = &self.keys;
        let mut all = vec![
            keys.jobs.clone(),
            self.slots.redis_key().to_owned(),
            keys.tokens.clone(),
            keys.queued.clone(),
        ];
        for worker in workers {
            all.push(keys.inbox(worker));
            all.push(keys.worker_jobs(worker));
        }
        all.extend(jobs.map(|key| keys.record(key)));
        all
    }

    /// Starts queued job `key` on the worker its key routes to.
    pub(crate) async fn assign(&self, key: &str) -> Result<()> {
        let core = self;
        let keys = &core.keys;
        for _ in 0..20 {
            let (rev, worker) = self.route(key);
            if worker.is_empty() {
                return Ok(());
            }
            let mut conn = core.conn.clone();
            let answer: Vec<Value> = scripts::ASSIGN
                .key(&keys.jobs)
                .key(keys.record(key))
                .key(self.slots.redis_key())
                .key(&keys.tokens)
                .key(&keys.queued)
                .key(keys.inbox(&worker))
                .key(keys.worker_jobs(&worker))
                .key(keys.held(key))
                .key(&keys.shutdown)
                .arg(key)
                .arg(rev.to_string())
                .arg(&worker)
                .arg(core.ring())
                .invoke_async(&mut conn)
                .await
                .map_err(core.redis_error("assign a queued job"))?;
            match super::Assigned::parse(&answer)? {
                super::Assigned::Done => return Ok(()),
                super::Assigned::Stale(rev) => self.catch_up(&rev).await,
            }
        }
        Ok(())
    }
}
