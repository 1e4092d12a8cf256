//! Workers joining and leaving the slot table, and assigning queued jobs.
//!
//! The slot table is a replicated map, slot index -> worker id. A joining
//! worker appends a slot; a leaving one is replaced by the last slot's
//! worker (swap-remove), so with Jump Consistent Hash a join moves about
//! 1/(n+1) of the keys and a leave about 2/n.

use std::time::Duration;

use super::Node;
use crate::error::{Error, Result};
use crate::job::JobHandler;
use crate::worker;

/// How long to wait for the local slot table to show a change this node
/// made, before going on regardless.
const SETTLE: Duration = Duration::from_secs(5);

impl Node {
    /// Adds a worker running `handler`; returns its id. Jobs waiting for a
    /// worker are assigned once it holds its slot.
    ///
    /// # Errors
    /// [`Error::ClientOnly`] on a client-only node; Redis failures.
    pub async fn add_worker<H: JobHandler>(&self, handler: H) -> Result<String> {
        if self.client_only {
            return Err(Error::ClientOnly);
        }
        let core = &self.core;
        let mut conn = core.conn.clone();
        let join: u64 = redis::cmd("INCR")
            .arg(&core.keys.joins)
            .query_async(&mut conn)
            .await
            .map_err(core.redis_error("join"))?;
        let id = format!("w{join}");
        core.workers.set(&id, &format!("{}|{join}", core.id)).await?;
        // Reading before taking a slot: starts routed to it are not missed.
        let handle = worker::spawn(self.core.clone(), id.clone(), handler).await?;
        self.lock_workers().insert(id.clone(), handle);
        loop {
            let next = core.slots.len();
            if core.slots.set_if_not_exists(&next.to_string(), &id).await? {
                break;
            }
            // Another worker took that slot: wait until the replica shows it.
            core.slots.wait_until(SETTLE, |slots| slots.len() > next).await;
        }
        core.slots.wait_until(SETTLE, |slots| slots.snapshot().values().any(|w| *w == id)).await;
        tracing::info!(worker = %id, slots = core.slots.len(), "worker joined");
        self.assign_queued().await?;
        Ok(id)
    }

    /// Records `identity` (say, a plugin's name and digest) as the handler
    /// that serves the pool, unless one is recorded already. Returns the
    /// identity recorded before when it differs: a pool is served by one
    /// handler, and a host bringing another must not join it.
    ///
    /// # Errors
    /// Redis failures.
    pub async fn claim_handler(&self, identity: &str) -> Result<Option<String>> {
        let core = &self.core;
        let mut conn = core.conn.clone();
        let (recorded,): (String,) = redis::pipe()
            .set_nx(&core.keys.handler, identity)
            .ignore()
            .get(&core.keys.handler)
            .query_async(&mut conn)
            .await
            .map_err(core.redis_error("record the pool's handler"))?;
        Ok((recorded != identity).then_some(recorded))
    }

    /// Removes worker `id` of this node: it leaves the slot table (no new
    /// job is routed to it), then stops its jobs (their handlers' `stop`,
    /// after every event sent to them before) and hands them back; they are
    /// assigned to the remaining workers, or wait for one.
    ///
    /// # Errors
    /// Redis failures.
    pub async fn remove_worker(&self, id: &str) -> Result<()> {
        let Some(handle) = self.lock_workers().remove(id) else { return Ok(()) };
        self.release_slot(id).await?;
        handle.leave().await;
        self.core.workers.delete(id).await?;
        tracing::info!(worker = %id, slots = self.core.slots.len(), "worker left");
        self.assign_queued().await
    }

    /// Swap-removes the slot of `worker`.
    async fn release_slot(&self, worker: &str) -> Result<()> {
        let slots = &self.core.slots;
        let Some(index) = slots.snapshot().into_iter().find(|(_, w)| w == worker).map(|(slot, _)| slot)
        else {
            return Ok(());
        };
        let before = slots.len();
        let last = (before - 1).to_string();
        if index == last {
            slots.test_and_delete(&last, worker).await?;
        } else if let Some(last_worker) = slots.get(&last) {
            // Between the two writes both slots name `last_worker`: routing
            // stays valid, it only sends that worker one more slot's keys.
            slots.test_and_set(&index, worker, &last_worker).await?;
            slots.test_and_delete(&last, &last_worker).await?;
        }
        slots.wait_until(SETTLE, |s| s.len() < before && !s.snapshot().values().any(|w| w == worker)).await;
        Ok(())
    }

    /// Assigns every queued job to the worker its key routes to.
    pub(crate) async fn assign_queued(&self) -> Result<()> {
        if self.core.slots.is_empty() {
            return Ok(());
        }
        let mut conn = self.core.conn.clone();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(&self.core.keys.queued)
                .arg(cursor)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await
                .map_err(self.core.redis_error("list queued jobs"))?;
            for key in batch {
                self.core.assign(&key).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}
