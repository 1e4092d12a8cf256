//! Workers joining and leaving the slot table, and assigning queued jobs.
//!
//! The slot table is a replicated map, slot index -> worker id, of a fixed
//! number of slots (the pool's, recorded in its epoch). A joining worker
//! takes its share from the most loaded workers; a leaving one's slots go
//! to the least loaded (the scripts' `take_slots` and `give_up_slots`). So
//! a join moves about 1/(n+1) of the keys, a leave exactly the leaver's,
//! and no change moves a key between two workers that stay.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{Core, LocalWorkers, Node};
use crate::error::{Error, Result};
use crate::job::JobHandler;
use crate::options::WorkerOptions;
use crate::worker::{self, WorkerHandle};

/// How long to wait for the local slot table to show a change this node
/// made, before going on regardless.
const SETTLE: Duration = Duration::from_secs(5);

impl Node {
    /// Adds a worker running `handler` with the default
    /// [`WorkerOptions`]; returns its id (see [`Node::add_worker_with`]).
    ///
    /// # Errors
    /// [`Error::ClientOnly`] on a client-only node; Redis failures.
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Node::add_worker_with`]).
    pub async fn add_worker<H: JobHandler>(&self, handler: H) -> Result<String> {
        self.add_worker_with(handler, WorkerOptions::default()).await
    }

    /// Adds a worker running `handler` as `options` say; returns its id.
    /// Jobs waiting for a worker are assigned once it holds its slots.
    /// Once it returns, this node's listing of workers
    /// ([`Node::workers`]) shows it.
    ///
    /// # Errors
    /// [`Error::ClientOnly`] on a client-only node; Redis failures.
    ///
    /// # Cancel safety
    /// Not cancel safe: a worker that joined before the future was dropped
    /// stays a member without a handle; close the node.
    pub async fn add_worker_with<H: JobHandler>(&self, handler: H, options: WorkerOptions) -> Result<String> {
        if self.others.is_empty() {
            return self.spawn_worker(handler, options, None, None).await;
        }
        self.spawn_everywhere(Arc::new(handler), &options, None).await
    }

    /// Adds a worker running `handler` to every slot group, under the id
    /// group 0 gives it (holding `heir_of`'s slots in each when given).
    /// A group it cannot join undoes the groups it joined.
    async fn spawn_everywhere<H: JobHandler>(
        &self,
        handler: Arc<H>,
        options: &WorkerOptions,
        heir_of: Option<&str>,
    ) -> Result<String> {
        let id = self.spawn_worker(handler.clone(), options.clone(), heir_of, None).await?;
        for (done, node) in self.others.iter().enumerate() {
            if let Err(error) = node.spawn_worker(handler.clone(), options.clone(), heir_of, Some(&id)).await
            {
                let joined = std::iter::once(self).chain(&self.others[..done]);
                for node in joined {
                    if let Err(undo) = node.remove_workers(std::slice::from_ref(&id)).await {
                        tracing::warn!(worker = %id, error = %undo, "failed to undo a worker's join");
                    }
                }
                return Err(error);
            }
        }
        Ok(id)
    }

    /// Replaces worker `old` of this node by a new one running `handler`
    /// as `options` say (say, a new release of the plugin); returns the
    /// new worker's id. The new worker joins holding exactly `old`'s slots,
    /// so `old`'s jobs move once, to it, with the state they last saved
    /// (a `requeued` start), and no other job moves; then `old` leaves.
    ///
    /// # Errors
    /// [`Error::UnknownWorker`] when `old` is not a worker of this node;
    /// those of [`Node::add_worker_with`].
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Node::add_worker_with`] and
    /// [`Node::remove_worker`]).
    pub async fn replace_worker<H: JobHandler>(
        &self,
        old: &str,
        handler: H,
        options: WorkerOptions,
    ) -> Result<String> {
        if !self.lock_workers().contains_key(old) {
            return Err(Error::UnknownWorker(old.to_owned()));
        }
        let id = match self.others.is_empty() {
            true => self.spawn_worker(handler, options, Some(old), None).await?,
            false => self.spawn_everywhere(Arc::new(handler), &options, Some(old)).await?,
        };
        self.remove_worker(old).await?;
        Ok(id)
    }

    /// Starts a worker reading its inbox and makes it a member (holding
    /// `heir_of`'s slots when given); returns its id: `id` when given (the
    /// id the worker has in group 0), otherwise a new one.
    async fn spawn_worker<H: JobHandler>(
        &self,
        handler: H,
        options: WorkerOptions,
        heir_of: Option<&str>,
        id: Option<&str>,
    ) -> Result<String> {
        if self.client_only {
            return Err(Error::ClientOnly);
        }
        let release = &options.release;
        if release.digest.contains('|') || release.version.contains('|') {
            return Err(Error::InvalidRelease(format!("{}|{}", release.digest, release.version)));
        }
        let core = &self.core;
        let mut conn = core.conn.clone();
        let join: u64 = redis::cmd("INCR")
            .arg(&core.keys.joins)
            .query_async(&mut conn)
            .await
            .map_err(core.redis_error("join"))?;
        let id = id.map_or_else(|| format!("w{join}"), str::to_owned);
        // Reading before taking a slot: starts routed to it are not missed.
        let handle = worker::spawn(self.core.clone(), id.clone(), join, handler, &options).await?;
        if let Err(error) = core.join_worker(&id, join, &options.release, heir_of).await {
            handle.leave().await;
            return Err(error);
        }
        self.lock_workers().insert(id.clone(), handle);
        tracing::info!(worker = %id, "worker joined");
        core.assign_queued().await?;
        Ok(id)
    }

    /// Records `identity` (say, a plugin's name and digest) as the handler
    /// that serves the pool, unless one is recorded already. Returns the
    /// identity recorded before when it differs: a pool is served by one
    /// handler, and a host bringing another must not join it.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
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

    /// Records `identity` as the handler that serves the pool, in place of
    /// the one recorded: a new release of the pool's handler rolls
    /// through it (see [`Node::claim_handler`]).
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: one write, made or not.
    pub async fn record_handler(&self, identity: &str) -> Result<()> {
        let core = &self.core;
        let mut conn = core.conn.clone();
        let () = redis::cmd("SET")
            .arg(&core.keys.handler)
            .arg(identity)
            .query_async(&mut conn)
            .await
            .map_err(core.redis_error("record the pool's handler"))?;
        Ok(())
    }

    /// Removes worker `id` of this node: it leaves the slot table (no new
    /// job is routed to it), then stops its jobs (their handlers' `stop`,
    /// after every event sent to them before) and hands them back; they are
    /// assigned to the remaining workers, or wait for one.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped part way, the worker may have given up its
    /// slots without handing its jobs back; they are queued when it is
    /// evicted.
    pub async fn remove_worker(&self, id: &str) -> Result<()> {
        let ids = [id.to_owned()];
        let removed =
            futures_util::future::join_all(self.groups().map(|node| node.remove_workers(&ids))).await;
        removed.into_iter().collect()
    }

    /// Removes workers `ids` of this node together: all leave the slot
    /// table first, so their jobs move once, to the workers that stay (or
    /// wait queued), never from one leaving worker to another.
    pub(crate) async fn remove_workers(&self, ids: &[String]) -> Result<()> {
        let handles: Vec<(String, WorkerHandle)> = {
            let mut workers = self.lock_workers();
            ids.iter().filter_map(|id| workers.remove(id).map(|handle| (id.clone(), handle))).collect()
        };
        if handles.is_empty() {
            return Ok(());
        }
        let core = &self.core;
        let removed: Vec<String> = handles.iter().map(|(id, _)| id.clone()).collect();
        core.release_slots(&removed).await?;
        futures_util::future::join_all(handles.into_iter().map(|(id, handle)| async move {
            handle.leave().await;
            // Leaving for good is an eviction: anything the worker still
            // owned (it could not hand it back) is queued with its events.
            match core.evict(Some(&id)).await {
                Ok(evicted) => {
                    let left: u64 = evicted.iter().map(|(_, jobs)| jobs).sum();
                    if left > 0 {
                        tracing::warn!(worker = %id, jobs = left, "jobs the worker could not hand back were queued");
                    }
                }
                Err(error) => tracing::warn!(worker = %id, error = %error, "failed to leave the pool"),
            }
            tracing::info!(worker = %id, "worker left");
        }))
        .await;
        // This node's listing no longer shows them once this returns.
        core.workers
            .wait_until(SETTLE, |workers| !workers.snapshot().keys().any(|id| removed.contains(id)))
            .await;
        core.assign_queued().await
    }

    /// Shuts the pool down: every node stops every job (their handlers'
    /// `stop`) and its workers leave; then the pool's Redis state is
    /// removed. Nodes that do not answer within `timeout` (dead ones) are
    /// not waited for longer. While it runs, no node may join the pool.
    /// Returns the number of jobs the pool held.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Not cancel safe: once the shutdown flag is set the pool shuts down;
    /// call it again to finish removing its keys.
    pub async fn shutdown(&self, timeout: Duration) -> Result<u64> {
        // Every group's flag first, group 0's before the others: no node
        // joins while the groups go. Group 0's keys go last, so the pool
        // is not created anew meanwhile.
        let mut jobs = 0;
        for node in self.groups() {
            jobs += node.flag_shutdown().await?;
        }
        let others =
            futures_util::future::join_all(self.others.iter().map(|node| node.remove_group(timeout)));
        others.await.into_iter().collect::<Result<()>>()?;
        self.remove_group(timeout).await?;
        Ok(jobs)
    }

    /// Sets this slot group's shutdown flag; returns the jobs it held.
    async fn flag_shutdown(&self) -> Result<u64> {
        let core = &self.core;
        let mut conn = core.conn.clone();
        let (_, jobs): ((), u64) = redis::pipe()
            .set(&core.keys.shutdown, &core.id)
            .hlen(&core.keys.jobs)
            .query_async(&mut conn)
            .await
            .map_err(core.redis_error("shut the pool down"))?;
        tracing::info!(pool = %core.keys.pool, group = %core.keys.tag, jobs, "shutting the pool down");
        Ok(jobs)
    }

    /// Once its flag is set: waits for this slot group's workers to leave
    /// (evicting dead ones), then removes its keys, the flag last.
    async fn remove_group(&self, timeout: Duration) -> Result<()> {
        let core = &self.core;
        let mut conn = core.conn.clone();
        // Every full node sees the flag at its next renewal, stops its jobs
        // and its workers leave; dead nodes' workers are evicted here once
        // their leases expire (live nodes run no janitor any more).
        let deadline = tokio::time::Instant::now() + timeout;
        while !core.workers.wait_until(Duration::from_millis(250), |workers| workers.is_empty()).await {
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(workers = ?core.workers.keys(), "workers still listed after the shutdown timeout; removing the pool anyway");
                break;
            }
            core.evict(None).await?;
        }
        // Through the maps, so every replica sees them empty.
        core.slots.destroy().await?;
        core.workers.destroy().await?;
        // Every key of the pool shares its hash tag, so one server holds
        // them all: the scan is routed there, a batch at a time.
        let pattern = format!("{}*", core.keys.prefix);
        let mut cursor = 0;
        loop {
            let (next, batch) = conn
                .scan_beside(&core.keys.shutdown, &pattern, cursor)
                .await
                .map_err(core.redis_error("remove the pool's keys"))?;
            let batch: Vec<String> = batch.into_iter().filter(|key| *key != core.keys.shutdown).collect();
            if !batch.is_empty() {
                let _: () = redis::cmd("UNLINK")
                    .arg(&batch)
                    .query_async(&mut conn)
                    .await
                    .map_err(core.redis_error("remove the pool's keys"))?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
        // Last: from now on the pool may be created anew.
        let _: () = redis::cmd("DEL")
            .arg(&core.keys.shutdown)
            .query_async(&mut conn)
            .await
            .map_err(core.redis_error("remove the pool's keys"))?;
        tracing::info!(pool = %core.keys.pool, group = %core.keys.tag, "pool shut down");
        Ok(())
    }
}

impl Node {
    /// Waits until the shutdown's caller has removed the pool's keys (its
    /// flag goes last), for at most [`REMOVAL`]. Workers leave before the
    /// keys are removed, so a host that stops its embedded Redis once its
    /// workers left would cut the removal short and leave the flag behind:
    /// nobody could join the pool again.
    pub(super) async fn shutdown_removed(&self) {
        let core = &self.core;
        let mut conn = core.conn.clone();
        let deadline = tokio::time::Instant::now() + REMOVAL;
        loop {
            let flagged: redis::RedisResult<bool> =
                redis::cmd("EXISTS").arg(&core.keys.shutdown).query_async(&mut conn).await;
            match flagged {
                Ok(false) => return,
                Ok(true) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(REMOVAL_POLL).await;
                }
                Ok(true) => {
                    tracing::warn!(pool = %core.keys.pool, "the pool's keys were not removed within {REMOVAL:?} of its shutdown; going on");
                    return;
                }
                Err(error) => {
                    tracing::warn!(pool = %core.keys.pool, error = %error, "cannot tell whether the pool's keys were removed; going on");
                    return;
                }
            }
        }
    }
}

/// How long a node whose workers left waits for the shutdown's caller to
/// remove the pool's keys: the caller waits up to its own timeout for
/// other nodes' workers first (the command line's default is 60 s).
const REMOVAL: Duration = Duration::from_secs(90);

/// How often it looks.
const REMOVAL_POLL: Duration = Duration::from_millis(50);

/// Waits for the pool to shut down; then stops every job of this node's
/// workers and makes them leave.
pub(super) async fn on_shutdown(
    core: Arc<Core>,
    workers: LocalWorkers,
    mut shutdown: watch::Receiver<bool>,
    stopped: watch::Sender<bool>,
) {
    if shutdown.wait_for(|down| *down).await.is_err() {
        return; // the node closed first
    }
    // Every worker stops its jobs before any leaves the slot table: a
    // worker leaving first would make its siblings' keys route elsewhere.
    let handles: Vec<(String, WorkerHandle)> = super::lock_workers(&workers).drain().collect();
    let ids: Vec<String> = handles.iter().map(|(id, _)| id.clone()).collect();
    futures_util::future::join_all(handles.into_iter().map(|(_, handle)| handle.shut_down())).await;
    for id in ids {
        if let Err(error) = core.evict(Some(&id)).await {
            tracing::warn!(worker = %id, error = %error, "failed to leave the pool while it shuts down");
        }
    }
    tracing::info!(pool = %core.keys.pool, "the pool shuts down: this node's jobs are stopped");
    stopped.send_replace(true);
}
