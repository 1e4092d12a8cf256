//! Handing jobs back to the pool: when their keys route elsewhere after a
//! membership change, and when the worker leaves. Each job is marked
//! moving, what was sent to it before is processed, it is stopped and
//! queued for its next worker.

use std::collections::{HashMap, HashSet};

use futures_util::StreamExt as _;
use pulse_streams::{ReaderEvent, ReaderSubscription, id_after};
use tokio::sync::mpsc;
use tracing::Instrument as _;

use crate::context::Ended;
use crate::job::JobHandler;
use crate::scripts;

use super::Worker;

/// Stop calls a leaving worker makes at once.
const STOPS_AT_ONCE: usize = 16;

impl<H: JobHandler> Worker<H> {
    /// Moves every running job whose key routes to another worker: hands
    /// it back, then assigns it where it routes now. Returns whether any
    /// job routed elsewhere (so the next check looks again).
    pub(super) async fn rebalance(
        &mut self,
        inbox: &mut ReaderSubscription,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
    ) -> bool {
        let misplaced: Vec<String> = self
            .running
            .keys()
            .filter(|key| {
                let (_, owner) = self.core.route(key);
                !owner.is_empty() && owner != self.id
            })
            .cloned()
            .collect();
        if misplaced.is_empty() {
            return false;
        }
        tracing::info!(jobs = misplaced.len(), "moving jobs whose keys route elsewhere");
        let handed = self.hand_back(misplaced, inbox, ended).await;
        self.core.metrics.rebalances.increment(1);
        self.core.metrics.moved_jobs.increment(handed.len() as u64);
        self.assign_all(handed).await;
        true
    }

    /// Starts jobs this worker handed back where their keys route now; one
    /// that cannot be assigned stays queued for the janitor.
    pub(super) async fn assign_all(&self, keys: Vec<String>) {
        for key in keys {
            if let Err(error) = self.core.assign(&key).await {
                tracing::warn!(job.key = %key, error = %error, "failed to assign a job handed back; it stays queued");
            }
        }
    }

    /// Hands jobs `keys` back to the pool: marks them moving (their new
    /// events are held), processes what was sent to them before, stops
    /// them and queues them for their next worker. Returns the keys handed
    /// back.
    pub(super) async fn hand_back(
        &mut self,
        keys: Vec<String>,
        inbox: &mut ReaderSubscription,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
    ) -> Vec<String> {
        let mut marked: HashMap<String, String> = HashMap::new();
        let mut mark = "0-0".to_owned();
        for key in keys {
            let Some(running) = self.running.get(&key) else { continue };
            let mut conn = self.core.conn.clone();
            let last: redis::RedisResult<String> = scripts::MARK_MOVING
                .key(&self.core.keys.jobs)
                .key(&self.inbox_key)
                .arg(&key)
                .arg(&running.token)
                .invoke_async(&mut conn)
                .await;
            match last {
                Ok(last) if !last.is_empty() => {
                    if id_after(&last, &mark) {
                        mark = last;
                    }
                    marked.insert(key, running.token.clone());
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(job.key = %key, error = %error, "failed to mark a job moving"),
            }
        }
        // Process what was sent before the marks, in order: the handler
        // sees every event sent to the job before it stops here.
        self.drain_to(&mark, inbox, ended).await;
        // Still ours (not stopped, completed or failed meanwhile)?
        marked.retain(|key, token| self.running.get(key).is_some_and(|r| r.token == *token));
        if !self.may_call() {
            // Lost meanwhile: the jobs stay the worker's in Redis, and go
            // back to the pool when the worker evicts itself.
            return Vec::new();
        }
        let keys: Vec<String> = marked.keys().cloned().collect();
        for key in &keys {
            self.running.remove(key);
        }
        self.stop_all(&marked, "it hands back").await;
        for (key, token) in &marked {
            self.requeue(key, token).await;
        }
        keys
    }

    /// Calls `stop` for `keys` (job key -> token), [`STOPS_AT_ONCE`] at a
    /// time, all within `shutdown_timeout`: a plugin slow to stop (or
    /// looping in `stop`) delays a leave, a shutdown or a hand-back after a
    /// table change by that much at most. Jobs whose stop has not returned by then are
    /// abandoned: their tokens move on as they are handed back or
    /// finished, so nothing their code still does reaches the pool (and a
    /// leaving worker's fence falls with it).
    pub(super) async fn stop_all(&self, keys: &HashMap<String, String>, why: &str) {
        if keys.is_empty() {
            return;
        }
        let handler = &self.handler;
        let mut pending: HashSet<&str> = keys.keys().map(String::as_str).collect();
        // Made up front (none runs before it is polled), so that each
        // borrows for one known lifetime.
        let calls: Vec<_> = keys
            .iter()
            .map(|(key, token)| {
                let span = self.call_span("stop", key, token);
                async move { (key.as_str(), handler.stop(key).instrument(span).await) }
            })
            .collect();
        let stops = futures_util::stream::iter(calls).buffer_unordered(STOPS_AT_ONCE);
        let collect = async {
            futures_util::pin_mut!(stops);
            while let Some((key, result)) = stops.next().await {
                pending.remove(key);
                if let Err(error) = result {
                    tracing::warn!(job.key = %key, error = %error, "handler failed to stop a job {why}");
                }
            }
        };
        let timeout = self.core.options.shutdown_timeout;
        if tokio::time::timeout(timeout, collect).await.is_err() {
            tracing::warn!(
                jobs = pending.len(),
                ?timeout,
                "stop calls did not return within node.shutdown_timeout; those jobs go on without waiting for them"
            );
            for key in pending {
                handler.abandon(key).await;
            }
        }
    }

    /// Processes every entry of the inbox up to the last one there now.
    pub(super) async fn drain(
        &mut self,
        inbox: &mut ReaderSubscription,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
    ) {
        let Ok(Some(last)) = self.inbox.last_id().await else { return };
        self.drain_to(&last, inbox, ended).await;
    }

    /// Processes the inbox, in order, up to entry `mark`, and waits for the
    /// calls it made; stops reading early if the lease is lost (entries
    /// are then left for the jobs' next worker).
    pub(super) async fn drain_to(
        &mut self,
        mark: &str,
        inbox: &mut ReaderSubscription,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
    ) {
        while id_after(mark, &self.last_read) && !self.lost {
            let room = self.calls.has_room();
            let in_flight = !self.calls.is_idle();
            tokio::select! {
                biased;
                Some(end) = ended.recv() => self.on_ended(end),
                Some(done) = self.calls.next(), if in_flight => self.complete(done).await,
                event = inbox.recv(), if room => match event {
                    Some(ReaderEvent::Event(event)) => self.on_entry(event).await,
                    _ => break,
                },
            }
            self.flush().await;
        }
        self.settle().await;
    }
}
