//! Writes fenced by a job's token (requeue, finish, fail), each after what
//! its job wrote before, and the answers sent with the writes of the calls
//! they answer and the deletion of each processed inbox entry.

use crate::core::Outcome;
use crate::job::JobHandler;
use crate::scripts;
use crate::wire::{self, InboxEvent};

use super::Worker;
use std::sync::Arc;

use crate::core::{Core, EmitQueue, Outgoing};

impl<H: JobHandler> Worker<H> {
    /// Hands job `key` back to the pool under `token` (after the events
    /// its jobs emitted); whether it was.
    pub(super) async fn requeue(&self, key: &str, token: &str) -> bool {
        self.requeue_unstarted(key, token, None, std::iter::empty()).await
    }

    /// Hands job `key` back under `token` when it never started here:
    /// `start` is its start event (answered by the next worker, when
    /// somebody waits for it), `waiting` the events that waited behind it
    /// (held for the next worker, first and in order).
    pub(super) async fn requeue_unstarted<'a>(
        &self,
        key: &str,
        token: &str,
        start: Option<&InboxEvent>,
        waiting: impl Iterator<Item = &'a InboxEvent>,
    ) -> bool {
        let keys = &self.core.keys;
        let mut cmd = scripts::evalsha(
            &scripts::REQUEUE,
            &[
                keys.jobs.clone(),
                keys.record(key),
                keys.queued.clone(),
                keys.worker_jobs(&self.id),
                keys.held(key),
            ],
        );
        let (reply, request) = start.map_or(("", ""), |start| (start.reply.as_str(), start.request.as_str()));
        cmd.arg(key).arg(token).arg(reply).arg(request);
        for event in waiting {
            cmd.arg(wire::encode_held(event));
        }
        match self.emits.ordered::<i64>(&self.core, key, &scripts::REQUEUE, cmd).await {
            Ok(done) => done == 1,
            Err(error) => {
                tracing::warn!(job.key = %key, error = %error, "failed to hand a job back");
                false
            }
        }
    }

    pub(super) async fn finish(&self, key: &str, token: &str) {
        if let Err(error) = self.core.finish(&self.emits, &self.id, key, token).await {
            tracing::warn!(job.key = %key, error = %error, "failed to remove a job");
        }
    }

    pub(super) async fn fail(&self, key: &str, token: &str, reason: &str, attempt: u32) {
        if let Err(error) = self.core.fail(&self.emits, &self.id, key, token, reason, attempt).await {
            tracing::warn!(job.key = %key, error = %error, "failed to mark a job failed");
        }
    }

    /// Answers the caller waiting for `event`, if any, with the next flush.
    pub(super) fn reply(&mut self, event: &InboxEvent, outcome: Outcome, message: &str) {
        if event.reply.is_empty() {
            return;
        }
        self.outbox.push(Outgoing {
            stream: event.reply.clone(),
            outcome,
            request: event.request.clone(),
            message: message.to_owned(),
        });
    }

    /// Sends what the worker's jobs wrote in calls that ended, the answers
    /// waiting in the outbox, and deletes the entries processed since the
    /// last flush from the inbox: one round trip, after the flush on its
    /// way, if any. The writes of a call still running wait for its end.
    pub(super) async fn flush(&mut self) {
        if let Some(flushing) = self.flushing.take() {
            let _ = flushing.await;
        }
        self.hand_over();
        if self.emits.has_ready() {
            send_ready(&self.emits, &self.core).await;
        }
    }

    /// [`Self::flush`] without waiting for it: the worker reads, calls and
    /// applies on while one flush is on its way, and the next one takes
    /// everything that was done meanwhile. Waiting would cap a worker at
    /// what one turn of its loop does per round trip to Redis, and a
    /// round trip grows with the load (a script of a batch of starts holds
    /// Redis for milliseconds). One flush at a time keeps the order of
    /// the batches; writes made outside a call wait for it (see
    /// `core::emits`).
    pub(super) fn flush_soon(&mut self) {
        self.hand_over();
        if self.flushing.is_none() && self.emits.has_ready() {
            let (emits, core) = (self.emits.clone(), self.core.clone());
            self.flushing = Some(tokio::spawn(async move { send_ready(&emits, &core).await }));
        }
    }

    /// Whether the worker should read nothing more until the flush on its
    /// way is answered: what waits for the next one is
    /// [`FLUSH_BACKLOG`] answers, deletions and writes or more.
    pub(super) fn flush_backlogged(&self) -> bool {
        self.flushing.is_some() && self.emits.backlog() >= FLUSH_BACKLOG
    }

    /// Moves the answers and processed entries into the queue of writes.
    fn hand_over(&mut self) {
        if !self.outbox.is_empty() || !self.processed.is_empty() {
            self.emits.answer(std::mem::take(&mut self.outbox), std::mem::take(&mut self.processed));
        }
    }
}

/// Answers, deletions and writes waiting for the next flush, beyond which
/// a worker with a flush on its way reads no more from its inbox.
const FLUSH_BACKLOG: usize = 4096;

/// Sends what `emits` holds ready (with the next flush of the worker's
/// slot group when its jobs wrote, see `core::flushes::flush`); again when the
/// connection dropped: a lost answer leaves its caller waiting, and every
/// command may run twice (a second answer has no waiter; a second XDEL
/// deletes nothing; an event may be written twice).
async fn send_ready(emits: &Arc<EmitQueue>, core: &Arc<Core>) {
    for wait in [0, 20, 100, 500] {
        if wait > 0 {
            // (A zero sleep would still wait for the timer's next tick.)
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        }
        match crate::core::flush(core, emits).await {
            Ok(_) => return,
            Err(error) if error.is_connection_dropped() || error.is_io_error() => {
                tracing::debug!(error = %error, "the connection dropped while answering; sending again");
            }
            Err(error) => {
                tracing::warn!(error = %error, "failed to answer or to delete the entry from the inbox");
                return;
            }
        }
    }
    tracing::warn!("failed to answer or to delete the entry from the inbox: Redis is unreachable");
}

/// Resolves when the flush on its way (if any) was answered.
///
/// # Cancel safety
/// Cancel safe: the flush runs as a task of its own.
pub(super) async fn flushed(flushing: &mut Option<tokio::task::JoinHandle<()>>) {
    match flushing {
        Some(flushing) => {
            let _ = flushing.await;
        }
        None => std::future::pending().await,
    }
}
