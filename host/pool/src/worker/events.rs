//! The inbox's entries: starts (with retries of retryable failures),
//! stops and notifications, each handed to the handler once and in order
//! per key.

use std::collections::VecDeque;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::context::{Ended, JobContext};
use crate::core::Outcome;
use crate::job::{HandlerError, Job, JobHandler};
use crate::wire::{InboxEvent, Kind};

use super::{Retrying, Running, Worker};

/// The longest wait before a retried start, whatever the backoff doubles
/// to.
const MAX_RETRY_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

impl<H: JobHandler> Worker<H> {
    pub(super) async fn on_entry(&mut self, entry: pulse_streams::Event) {
        self.skipped = false;
        if !self.may_call() {
            // Left in the inbox: whoever runs its job next receives it.
            return;
        }
        match InboxEvent::decode(&entry.name, &entry.payload) {
            Some(event) => {
                let created = entry.created_at_ms();
                self.on_event(event, created).await;
            }
            None => tracing::warn!(id = %entry.id, "skipped a malformed inbox entry"),
        }
        if self.lost || self.skipped {
            // A call was not made: the entry stays for the job's next worker
            // (or for this one, once it wrote its jobs back).
            self.flush(None).await;
            return;
        }
        self.last_id.clone_from(&entry.id);
        self.flush(Some(&entry.id)).await;
    }

    pub(super) async fn on_event(&mut self, event: InboxEvent, entry_ms: u64) {
        if let Some(retrying) = self.retrying.get_mut(&event.key)
            && retrying.event.token == event.token
        {
            if matches!(event.kind, Kind::Stop) {
                self.cancel_retry(event).await;
            } else if !matches!(event.kind, Kind::Start { .. }) {
                retrying.waiting.push_back(event);
            }
            return;
        }
        match &event.kind {
            Kind::Start { .. } => self.on_start(event, entry_ms).await,
            Kind::Stop => self.on_stop(event).await,
            Kind::Notify { .. } => self.on_notify(event).await,
        }
    }

    pub(super) async fn on_start(&mut self, event: InboxEvent, entry_ms: u64) {
        match self.running.get(&event.key) {
            Some(running) if running.token == event.token => return, // delivered twice
            Some(_) => {
                // An older ownership of the same job: it was taken away and
                // given back without a stop here. Stop the old run first.
                if !self.may_call() {
                    return;
                }
                self.running.remove(&event.key);
                let span = self.call_span("stop", &event.key, &event.token);
                if let Err(error) = self.handler.stop(&event.key).instrument(span).await {
                    tracing::warn!(job.key = %event.key, error = %error, "handler failed to stop a superseded run");
                }
            }
            None => {}
        }
        let Kind::Start { attempt, requeued, created_at_ms, payload, state } = &event.kind else { return };
        let job = Job {
            key: event.key.clone(),
            payload: payload.clone(),
            created_at_ms: created_at_ms.unwrap_or(entry_ms),
            requeued: *requeued,
            attempt: *attempt,
            state: state.clone(),
        };
        self.start(event, job, VecDeque::new()).await;
    }

    /// Calls the handler's start; on success runs the events that waited.
    pub(super) async fn start(&mut self, event: InboxEvent, job: Job, waiting: VecDeque<InboxEvent>) {
        let ctx = JobContext {
            core: self.core.clone(),
            worker: self.id.clone(),
            fence: self.fence.clone(),
            key: job.key.clone(),
            token: event.token.clone(),
            ended: self.ended_tx.clone(),
        };
        if !self.may_call() {
            return;
        }
        let span = self.call_span("start", &job.key, &event.token);
        match self.handler.start(job.clone(), ctx).instrument(span).await {
            Ok(()) => {
                self.running.insert(
                    job.key.clone(),
                    Running {
                        token: event.token.clone(),
                        last_seq: event.seq,
                        job: Job { state: None, ..job.clone() },
                    },
                );
                self.reply(&event, Outcome::Started, "").await;
                let (_, owner) = self.core.route(&job.key);
                self.misplaced_start |= !owner.is_empty() && owner != self.id;
                for waiting in waiting {
                    Box::pin(self.on_event(waiting, 0)).await;
                }
            }
            Err(HandlerError::InvalidInput(message)) => {
                self.finish(&job.key, &event.token).await;
                self.reply(&event, Outcome::Refused, &message).await;
                self.answer_waiting(waiting, Outcome::Missing).await;
            }
            Err(HandlerError::Retryable(message)) if job.attempt < self.core.options.max_attempts => {
                let wait = self
                    .core
                    .options
                    .retry_backoff
                    .saturating_mul(2u32.saturating_pow(job.attempt.saturating_sub(1)))
                    .min(MAX_RETRY_WAIT);
                tracing::info!(job.key = %job.key, attempt = job.attempt, error = %message, ?wait, "start failed; retrying");
                self.retry_at.insert((Instant::now() + wait, job.key.clone()), ());
                self.retrying.insert(job.key.clone(), Retrying { event, job, waiting });
            }
            Err(HandlerError::Retryable(message) | HandlerError::Fatal(message)) => {
                self.fail(&job.key, &event.token, &message, job.attempt).await;
                self.reply(&event, Outcome::Failed, &message).await;
                self.answer_waiting(waiting, Outcome::Failed).await;
            }
        }
    }

    pub(super) async fn retry_due(&mut self) {
        let Some(((at, key), ())) = self.retry_at.pop_first() else { return };
        if at > Instant::now() {
            self.retry_at.insert((at, key), ());
            return;
        }
        if let Some(Retrying { event, mut job, waiting }) = self.retrying.remove(&key) {
            job.attempt += 1;
            self.start(event, job, waiting).await;
        }
    }

    /// A stop for a job waiting to start again: it never ran, so it is
    /// removed without calling the handler.
    pub(super) async fn cancel_retry(&mut self, stop: InboxEvent) {
        if let Some(retrying) = self.retrying.remove(&stop.key) {
            self.retry_at.retain(|(_, key), ()| *key != stop.key);
            self.finish(&stop.key, &retrying.event.token).await;
            self.reply(&retrying.event, Outcome::Refused, "stopped before it could start").await;
            self.answer_waiting(retrying.waiting, Outcome::Missing).await;
        }
        self.reply(&stop, Outcome::Stopped, "").await;
    }

    pub(super) async fn on_stop(&mut self, event: InboxEvent) {
        let Some(running) = self.fresh(&event) else {
            self.reply(&event, Outcome::Missing, "").await;
            return;
        };
        let token = running.token.clone();
        if !self.may_call() {
            return;
        }
        let span = self.call_span("stop", &event.key, &token);
        let result = self.handler.stop(&event.key).instrument(span).await;
        self.running.remove(&event.key);
        self.finish(&event.key, &token).await;
        match result {
            Ok(()) => self.reply(&event, Outcome::Stopped, "").await,
            Err(error) => self.reply(&event, Outcome::Error, &error.to_string()).await,
        }
    }

    pub(super) async fn on_notify(&mut self, event: InboxEvent) {
        let Kind::Notify { payload } = &event.kind else { return };
        if self.fresh(&event).is_none() {
            self.reply(&event, Outcome::Missing, "").await;
            return;
        }
        if !self.may_call() {
            return;
        }
        let span = self.call_span("notify", &event.key, &event.token);
        match self.handler.notify(&event.key, payload.clone(), event.seq).instrument(span).await {
            Ok(()) => self.reply(&event, Outcome::Notified, "").await,
            Err(HandlerError::Fatal(message)) => {
                if let Some(running) = self.running.remove(&event.key) {
                    self.fail(&event.key, &running.token, &message, 0).await;
                }
                self.reply(&event, Outcome::Failed, &message).await;
            }
            Err(error) => self.reply(&event, Outcome::Error, &error.to_string()).await,
        }
    }

    /// The running job an event is for, if it is new (token matches, and
    /// its sequence number was not seen); records the sequence number.
    pub(super) fn fresh(&mut self, event: &InboxEvent) -> Option<&Running> {
        let running = self.running.get_mut(&event.key)?;
        if running.token != event.token || event.seq <= running.last_seq {
            return None;
        }
        running.last_seq = event.seq;
        Some(running)
    }

    pub(super) fn on_ended(&mut self, end: Ended) {
        let (Ended::Completed { key, token } | Ended::Failed { key, token }) = end;
        if self.running.get(&key).is_some_and(|r| r.token == token) {
            self.running.remove(&key);
        }
    }

    pub(super) async fn answer_waiting(&mut self, waiting: VecDeque<InboxEvent>, outcome: Outcome) {
        for event in waiting {
            self.reply(&event, outcome, "").await;
        }
    }
}
