//! Reconcile: every job Redis lists as running on a worker runs there.
//!
//! A job can be listed on a worker whose handler does not run it: a write
//! back after Redis lost its data raced a start, a hand-back failed half
//! way, a start was skipped while the worker was fenced. Nothing would ever
//! send such a job anywhere: it looks running and runs nowhere. So every
//! lease tick a worker compares what Redis lists on it with what it runs:
//!
//! - The cheap check, one atomic round trip: the size of its job set
//!   against the jobs it runs plus the entries still in its inbox (each
//!   unprocessed start accounts for at most one listed job). Listed jobs
//!   beyond that are certainly not run here.
//! - Only then, the full list: the listed jobs it does not run, with the
//!   token each is listed under, and the id of its inbox's last entry.
//! - At the next tick, once every entry up to that id was processed (a
//!   start among them may have been for one of them), each suspect still
//!   not run here is handed back under its token (the requeue script
//!   refuses if the token changed meanwhile) and assigned where its key
//!   routes now: it starts again, with its saved state, here or elsewhere.
//!
//! So an orphan runs again within about two ticks (half a lease), and a
//! steady worker pays one `SCARD` and one `XLEN` per tick.

use std::collections::HashMap;

use pulse_streams::id_after;

use super::Worker;
use crate::error::Result;
use crate::job::JobHandler;

/// Suspects of the last check: key -> the token it was listed under, and
/// the id of the inbox's last entry then.
pub(super) struct Orphans {
    mark: String,
    suspects: HashMap<String, String>,
}

impl<H: JobHandler> Worker<H> {
    /// One reconcile round (see the module's documentation).
    pub(super) async fn reconcile(&mut self) {
        if self.lost {
            self.orphans = None;
            return;
        }
        if let Some(orphans) = self.orphans.take() {
            if id_after(&orphans.mark, &self.last_read) {
                self.orphans = Some(orphans); // not read up to the mark yet
            } else {
                // Every entry up to the mark processed, calls included.
                self.settle().await;
                self.hand_back_orphans(orphans.suspects).await;
            }
            return;
        }
        match self.find_orphans().await {
            Ok(orphans) => self.orphans = orphans,
            Err(error) => tracing::debug!(error = %error, "reconcile check failed"),
        }
    }

    async fn find_orphans(&self) -> Result<Option<Orphans>> {
        let keys = &self.core.keys;
        let set = keys.worker_jobs(&self.id);
        let mut conn = self.core.conn.clone();
        let redis_error = || self.core.redis_error("reconcile");
        let (listed, pending): (usize, usize) = redis::pipe()
            .atomic()
            .scard(&set)
            .xlen(&self.inbox_key)
            .query_async(&mut conn)
            .await
            .map_err(redis_error())?;
        let local = self.running.len() + self.retrying.len();
        if listed <= local + pending {
            return Ok(None);
        }
        let mut suspects = HashMap::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(&set)
                .arg(cursor)
                .arg("COUNT")
                .arg(500)
                .query_async(&mut conn)
                .await
                .map_err(redis_error())?;
            let batch: Vec<String> = batch.into_iter().filter(|key| !self.runs(key)).collect();
            if !batch.is_empty() {
                let owners: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(&keys.jobs)
                    .arg(&batch)
                    .query_async(&mut conn)
                    .await
                    .map_err(redis_error())?;
                for (key, owner) in batch.into_iter().zip(owners) {
                    if let Some(token) = owner.as_deref().and_then(|owner| self.listed_token(owner)) {
                        suspects.insert(key, token.to_owned());
                    }
                }
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        if suspects.is_empty() {
            return Ok(None);
        }
        // After the tokens were read: a start for any of them is at or
        // before this entry.
        let mark = self.inbox.last_id().await?.unwrap_or_else(|| "0-0".to_owned());
        tracing::debug!(jobs = suspects.len(), %mark, "jobs listed here that do not run here; checking again");
        Ok(Some(Orphans { mark, suspects }))
    }

    /// The token of an ownership value `state|worker|token|seq` that lists
    /// a job as running (or moving) on this worker.
    fn listed_token<'a>(&self, ownership: &'a str) -> Option<&'a str> {
        let mut parts = ownership.split('|');
        let (state, worker, token) = (parts.next()?, parts.next()?, parts.next()?);
        (matches!(state, "running" | "moving") && worker == self.id).then_some(token)
    }

    fn runs(&self, key: &str) -> bool {
        self.running.contains_key(key) || self.retrying.contains_key(key)
    }

    async fn hand_back_orphans(&mut self, suspects: HashMap<String, String>) {
        let mut handed = Vec::new();
        for (key, token) in suspects {
            if !self.runs(&key) && self.requeue(&key, &token).await {
                handed.push(key);
            }
        }
        if handed.is_empty() {
            return;
        }
        tracing::warn!(
            jobs = handed.len(),
            "jobs listed on this worker did not run here; handed back to start again"
        );
        self.core.metrics.moved_jobs.increment(handed.len() as u64);
        self.assign_all(handed).await;
    }
}
