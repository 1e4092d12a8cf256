//! What a worker does when the node asks it to leave or shut down, when
//! its lease may have ended (it drops its jobs without calling them and
//! joins again) and when Redis lost the pool's data (it joins again and
//! writes its jobs back).

use std::collections::HashMap;

use pulse_streams::ReaderSubscription;
use tokio::sync::{mpsc, watch};

use crate::context::Ended;
use crate::job::JobHandler;
use crate::scripts;

use super::handle::{Control, open_inbox};
use super::{Retrying, Worker};

impl<H: JobHandler> Worker<H> {
    pub(super) async fn on_control(
        &mut self,
        request: Control,
        inbox: &mut ReaderSubscription,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
    ) {
        let done = match request {
            Control::Leave(done) => {
                // What was sent before the slot was given up comes first:
                // a start among it makes one more job to hand back.
                self.drain(inbox, ended).await;
                // Straight to where they route now: this worker's slots
                // (and its leaving siblings') are given up already.
                let all: Vec<String> = self.running.keys().cloned().collect();
                let handed = self.hand_back(all, inbox, ended).await;
                self.core.metrics.moved_jobs.increment(handed.len() as u64);
                self.assign_all(handed).await;
                // Jobs that never started here (retrying, or held) go
                // back with the events that waited for them.
                let mut unstarted = Vec::new();
                for (key, retrying) in std::mem::take(&mut self.retrying) {
                    let Retrying { event, waiting, .. } = &retrying;
                    if self.requeue_unstarted(&key, &event.token, Some(event), waiting.iter()).await {
                        unstarted.push(key);
                    }
                }
                self.retry_at.clear();
                self.core.metrics.moved_jobs.increment(unstarted.len() as u64);
                self.assign_all(unstarted).await;
                done
            }
            Control::ShutDown(done) => {
                let tokens: HashMap<String, String> = std::mem::take(&mut self.running)
                    .into_iter()
                    .map(|(key, run)| (key, run.token))
                    .collect();
                if self.may_call() {
                    self.stop_all(&tokens, "at shutdown").await;
                } else {
                    for key in tokens.keys() {
                        self.handler.abandon(key).await;
                    }
                }
                for (key, token) in &tokens {
                    self.finish(key, token).await;
                }
                for (key, retrying) in std::mem::take(&mut self.retrying) {
                    self.finish(&key, &retrying.event.token).await;
                }
                done
            }
        };
        self.flush().await;
        let _ = done.send(());
    }

    /// Whether the lease allows a handler call now; if not, the worker is
    /// lost and calls nothing more.
    pub(super) fn may_call(&mut self) -> bool {
        if self.lost {
            return false;
        }
        if self.core.lease.data_loss_pending(&self.fence) {
            // Redis lost the pool's data: no call until the worker has
            // joined again and written its jobs back, even once the node's
            // lease is up again (what it skips stays in its inbox, read
            // again from the oldest entry; a later event of the same job
            // called meanwhile would overtake it).
            self.skipped = true;
            return false;
        }
        if !self.core.lease.valid_for(&self.fence) {
            tracing::warn!("the lease may have ended: this worker calls no handler until it joins again");
            self.lost = true;
            self.fence.fence();
        }
        !self.lost
    }

    /// Drops every job without calling its handler: they may already run
    /// elsewhere.
    pub(super) async fn drop_jobs(&mut self) {
        let keys: Vec<String> = self
            .running
            .drain()
            .map(|(key, _)| key)
            .chain(self.retrying.drain().map(|(key, _)| key))
            .collect();
        self.retry_at.clear();
        self.outbox.clear();
        if !keys.is_empty() {
            tracing::warn!(jobs = keys.len(), "dropped its jobs without calling them: the lease was lost");
        }
        for key in keys {
            self.handler.abandon(&key).await;
        }
    }

    /// After the lease was lost: waits until the node renews again, evicts
    /// this worker (its jobs and its unprocessed entries go back to the
    /// pool), and joins again under the same id with an empty inbox. `None`
    /// when the node asks the worker to end meanwhile, or the pool shuts
    /// down.
    pub(super) async fn rejoin(
        &mut self,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> Option<(pulse_streams::Reader, ReaderSubscription)> {
        let mut renewals = self.core.lease.renewals();
        loop {
            if self.core.lease.valid() {
                match self.core.evict(Some(&self.id)).await {
                    Ok(evicted) => {
                        let jobs: u64 = evicted.iter().map(|(_, jobs)| jobs).sum();
                        tracing::info!(jobs, "evicted itself: its jobs went back to the pool");
                        break;
                    }
                    Err(error) => tracing::warn!(error = %error, "failed to evict itself; trying again"),
                }
            }
            if !wait_or_end(control, Some(&mut renewals)).await {
                return None;
            }
        }
        self.join_again(control).await
    }

    /// Joins the pool again under the same id with a new, empty inbox.
    /// `None` when the node asks the worker to end meanwhile, or the pool
    /// shuts down.
    pub(super) async fn join_again(
        &mut self,
        control: &mut mpsc::UnboundedReceiver<Control>,
    ) -> Option<(pulse_streams::Reader, ReaderSubscription)> {
        loop {
            // A fresh signal: a renewal that raced with the eviction may
            // have told the old one.
            // The same fence when it is up: the jobs this worker still runs
            // (after a data loss) keep their contexts.
            self.fence = self.core.lease.add_member(&self.id, Some(self.fence.clone()));
            self.lost = false;
            // Reconcile's mark was an entry of the inbox as it was.
            self.orphans = None;
            self.last_read = "0-0".to_owned();
            let joined = match open_inbox(&self.inbox, &self.inbox_options).await {
                Ok((reader, inbox)) => {
                    match self.core.join_worker(&self.id, self.join, &self.release, None).await {
                        Ok(()) => Ok((reader, inbox)),
                        Err(error) => {
                            reader.close().await;
                            Err(error)
                        }
                    }
                }
                Err(error) => Err(error),
            };
            match joined {
                Ok(inbox) => {
                    tracing::info!("joined again");
                    if let Err(error) = self.core.assign_queued().await {
                        tracing::warn!(error = %error, "failed to assign queued jobs");
                    }
                    return Some(inbox);
                }
                Err(crate::Error::ShuttingDown(_)) => return None,
                Err(error) => tracing::warn!(error = %error, "failed to join again; trying again"),
            }
            if !wait_or_end(control, None).await {
                return None;
            }
        }
    }

    /// After Redis lost the pool's data: writes back every job this worker
    /// runs, under the token it holds; drops those whose key was taken
    /// meanwhile, and those waiting to start again.
    pub(super) async fn reassert(&mut self) {
        let keys = &self.core.keys;
        let mut kept = 0;
        for (key, retrying) in std::mem::take(&mut self.retrying) {
            tracing::warn!(job.key = %key, attempt = retrying.job.attempt, "dropped a job waiting to start again: Redis lost it");
            self.handler.abandon(&key).await;
        }
        self.retry_at.clear();
        let running: Vec<String> = self.running.keys().cloned().collect();
        for key in running {
            // Redis lost the state the job saved; the handler may keep it.
            let state = self.handler.saved_state(&key).await;
            let Some(run) = self.running.get(&key) else { continue };
            let mut conn = self.core.conn.clone();
            let written: redis::RedisResult<i64> = scripts::REASSERT
                .key(&keys.jobs)
                .key(keys.record(&key))
                .key(keys.worker_jobs(&self.id))
                .key(&keys.tokens)
                .arg(&key)
                .arg(&run.token)
                .arg(run.last_seq)
                .arg(&self.id)
                .arg(&run.job.payload)
                .arg(run.job.created_at_ms)
                .arg(run.job.attempt)
                .arg(state.as_deref().unwrap_or_default())
                .arg(if state.is_some() { "1" } else { "0" })
                .invoke_async(&mut conn)
                .await;
            match written {
                Ok(1) => kept += 1,
                Ok(_) => {
                    tracing::warn!(job.key = %key, "dropped a job whose key was dispatched anew after Redis lost it");
                    self.running.remove(&key);
                    self.handler.abandon(&key).await;
                }
                Err(error) => {
                    // Not written back: it is not this worker's any more.
                    tracing::warn!(job.key = %key, error = %error, "failed to write a job back; dropping it");
                    self.running.remove(&key);
                    self.handler.abandon(&key).await;
                }
            }
        }
        tracing::warn!(jobs = kept, "wrote back the jobs it runs after Redis lost the pool's data");
    }
}

/// Between attempts to evict itself or join again: a short, jittered
/// pause, cut short by the node's next renewal when `renewals` is given.
/// False when the node asks the worker to end meanwhile (the request is
/// answered) or the node is gone.
pub(super) async fn wait_or_end(
    control: &mut mpsc::UnboundedReceiver<Control>,
    renewals: Option<&mut watch::Receiver<u64>>,
) -> bool {
    let renewed = async {
        match renewals {
            Some(renewals) => renewals.changed().await.is_ok(),
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        request = control.recv() => {
            if let Some(Control::Leave(done) | Control::ShutDown(done)) = request {
                let _ = done.send(());
            }
            false
        }
        alive = renewed => alive,
        () = tokio::time::sleep(std::time::Duration::from_millis(200 + fastrand::u64(..300))) => true,
    }
}
