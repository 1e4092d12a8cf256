//! The inbox's entries: starts (with retries of retryable failures),
//! stops and notifications, each handed to the handler once and in order
//! per key. Deciding what an event needs and applying what its call
//! returned happen on the worker's task; the call itself runs beside the
//! calls of other keys (see `calls`).

use std::collections::VecDeque;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::context::{Ended, JobContext};
use crate::core::Outcome;
use crate::job::{HandlerError, Job, JobHandler};
use crate::wire::{InboxEvent, Kind};

use super::calls::{Call, Done, Finished, Queued};
use super::{Retrying, Running, Worker};

/// The longest wait before a retried start, whatever the backoff doubles
/// to.
const MAX_RETRY_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

impl<H: JobHandler> Worker<H> {
    /// An entry read from the inbox: processed now, or after the call in
    /// flight for its key.
    pub(super) async fn on_entry(&mut self, entry: pulse_streams::Event) {
        self.last_read.clone_from(&entry.id);
        let Some(event) = InboxEvent::decode(&entry.name, &entry.payload) else {
            tracing::warn!(id = %entry.id, "skipped a malformed inbox entry");
            self.processed.push(entry.id);
            return;
        };
        let queued = Queued { entry_ms: entry.created_at_ms(), entry: Some(entry.id), event };
        if self.calls.is_busy(&queued.event.key) {
            self.calls.wait(queued);
        } else {
            self.process(queued).await;
        }
    }

    /// Processes one event of a key with no call in flight: answers it, or
    /// starts its call. Its entry is deleted once it is processed; one left
    /// unprocessed (the lease may have ended, or Redis lost the pool's
    /// data) stays in the inbox for whoever runs its job next.
    async fn process(&mut self, queued: Queued) {
        self.skipped = false;
        if !self.may_call() {
            return;
        }
        let key = queued.event.key.clone();
        match self.on_event(queued.event, queued.entry_ms).await {
            Some(call) => self.launch(key, queued.entry, call),
            None => {
                if !self.lost
                    && !self.skipped
                    && let Some(id) = queued.entry
                {
                    self.processed.push(id);
                }
            }
        }
    }

    /// Applies a finished call, then processes what waited for its key, up
    /// to the next call.
    pub(super) async fn complete(&mut self, done: Done) {
        let Done { key, entry, finished } = done;
        let mut next = self.calls.release(&key);
        if !self.may_call() && self.lost {
            // The lease may have ended while the call ran: the job may run
            // elsewhere now (the runtime cuts such a call off), so what the
            // call returned is not this worker's to write. Its entry and
            // those that waited behind it stay in the inbox for the job's
            // next owner; a job the call started is dropped here.
            self.emits.discard(&key);
            if let Finished::Start { job, result: Ok(()), .. } = finished {
                self.handler.abandon(&job.key).await;
            }
            return;
        }
        let first = self.apply(finished).await;
        // The call was made: what it wrote, its answer and the deletion of
        // its entry are sent in one step.
        self.emits.end(&key, std::mem::take(&mut self.outbox), entry);
        for event in first.into_iter().rev() {
            next.push_front(Queued { entry: None, event, entry_ms: 0 });
        }
        while let Some(queued) = next.pop_front() {
            self.process(queued).await;
            if self.calls.is_busy(&key) {
                self.calls.wait_first(&key, next);
                break;
            }
        }
    }

    /// Starts `call` for job `key`, made for inbox entry `entry`: what the
    /// call writes waits for its end (see `core::emits`).
    fn launch(&mut self, key: String, entry: Option<String>, call: Call) {
        self.emits.begin(&key);
        self.calls.start(key, entry, call);
    }

    /// Applies every call finished already, without waiting.
    pub(super) async fn complete_ready(&mut self) {
        while let Some(done) = self.calls.ready() {
            self.complete(done).await;
        }
    }

    /// Waits until no call is in flight and no event waits for one,
    /// applying each as it finishes, and sends the answers.
    pub(super) async fn settle(&mut self) {
        while let Some(done) = self.calls.next().await {
            self.complete(done).await;
        }
        self.flush().await;
    }

    /// What `event` needs: a call, or nothing more (answered or held).
    async fn on_event(&mut self, event: InboxEvent, entry_ms: u64) -> Option<Call> {
        if let Some(retrying) = self.retrying.get_mut(&event.key)
            && retrying.event.token == event.token
        {
            if matches!(event.kind, Kind::Stop) {
                self.cancel_retry(event).await;
            } else if !matches!(event.kind, Kind::Start { .. }) {
                retrying.waiting.push_back(event);
            }
            return None;
        }
        match &event.kind {
            Kind::Start { .. } => self.on_start(event, entry_ms),
            Kind::Stop => self.on_stop(event),
            Kind::Notify { .. } => self.on_notify(event),
        }
    }

    fn on_start(&mut self, event: InboxEvent, entry_ms: u64) -> Option<Call> {
        let superseded = match self.running.get(&event.key) {
            Some(running) if running.token == event.token => return None, // delivered twice
            // An older ownership of the same job: it was taken away and
            // given back without a stop here. The old run stops first.
            Some(_) => true,
            None => false,
        };
        if superseded {
            if !self.may_call() {
                return None;
            }
            self.running.remove(&event.key);
        }
        let Kind::Start { attempt, requeued, created_at_ms, payload, state } = &event.kind else {
            return None;
        };
        let job = Job {
            key: event.key.clone(),
            payload: payload.clone(),
            created_at_ms: created_at_ms.unwrap_or(entry_ms),
            requeued: *requeued,
            attempt: *attempt,
            state: state.clone(),
        };
        self.start(event, job, VecDeque::new(), superseded)
    }

    /// The call of the handler's start (after the stop of a superseded
    /// run, if `superseded`); the events in `waiting` run after it.
    pub(super) fn start(
        &mut self,
        event: InboxEvent,
        job: Job,
        waiting: VecDeque<InboxEvent>,
        superseded: bool,
    ) -> Option<Call> {
        if !self.may_call() {
            return None;
        }
        let ctx = JobContext {
            core: self.core.clone(),
            worker: self.id.clone(),
            fence: self.fence.clone(),
            emits: self.emits.clone(),
            key: job.key.clone(),
            token: event.token.clone(),
            ended: self.ended_tx.clone(),
        };
        let handler = self.handler.clone();
        let stop_span = superseded.then(|| self.call_span("stop", &job.key, &event.token));
        let span = self.call_span("start", &job.key, &event.token);
        let traced = self.trace_span("worker.start", &event);
        Some(Box::pin(async move {
            if let Some(stop_span) = stop_span
                && let Err(error) = handler.stop(&job.key).instrument(stop_span).await
            {
                tracing::warn!(job.key = %job.key, error = %error, "handler failed to stop a superseded run");
            }
            let result = handler.start(job.clone(), ctx).instrument(traced.clone()).instrument(span).await;
            traced_result(&traced, &result);
            Finished::Start { event, job, waiting, result }
        }))
    }

    /// Applies what a call returned; returns the events to run next for
    /// its key, before any that waited behind the call.
    async fn apply(&mut self, finished: Finished) -> VecDeque<InboxEvent> {
        match finished {
            Finished::Start { event, job, waiting, result } => {
                return self.started(event, job, waiting, result).await;
            }
            Finished::Stop { event, token, result } => {
                self.running.remove(&event.key);
                self.finish(&event.key, &token).await;
                match result {
                    Ok(()) => self.reply(&event, Outcome::Stopped, ""),
                    Err(error) => self.reply(&event, Outcome::Error, &error.to_string()),
                }
            }
            Finished::Notify { event, result } => match result {
                Ok(()) => self.reply(&event, Outcome::Notified, ""),
                Err(HandlerError::Fatal(message)) => {
                    if let Some(running) = self.running.remove(&event.key) {
                        self.fail(&event.key, &running.token, &message, 0).await;
                    }
                    self.reply(&event, Outcome::Failed, &message);
                }
                Err(HandlerError::Held(message)) => self.hold(event, &message),
                Err(error) => self.reply(&event, Outcome::Error, &error.to_string()),
            },
        }
        VecDeque::new()
    }

    /// A running job whose notification the handler held: it waits, as
    /// if unstarted, with that notification and the events after it, until
    /// the worker leaves; then it goes back to the pool with them and
    /// starts again from its saved state on its next worker, where each
    /// event is answered (see [`HandlerError::Held`]).
    fn hold(&mut self, event: InboxEvent, why: &str) {
        let Some(running) = self.running.remove(&event.key) else {
            self.reply(&event, Outcome::Error, why);
            return;
        };
        tracing::info!(job.key = %event.key, reason = %why, "job held until the worker leaves");
        let job = running.job;
        let start = InboxEvent {
            kind: Kind::Start {
                attempt: job.attempt,
                requeued: true,
                created_at_ms: Some(job.created_at_ms),
                payload: job.payload.clone(),
                state: None,
            },
            key: event.key.clone(),
            token: running.token,
            seq: running.last_seq,
            reply: String::new(),
            request: String::new(),
            trace: String::new(),
            started_by: String::new(),
        };
        let key = event.key.clone();
        self.retrying.insert(key, Retrying { event: start, job, waiting: VecDeque::from([event]) });
    }

    async fn started(
        &mut self,
        event: InboxEvent,
        job: Job,
        waiting: VecDeque<InboxEvent>,
        result: Result<(), HandlerError>,
    ) -> VecDeque<InboxEvent> {
        match result {
            Ok(()) => {
                self.running.insert(
                    job.key.clone(),
                    Running {
                        token: event.token.clone(),
                        last_seq: event.seq,
                        job: Job { state: None, ..job.clone() },
                    },
                );
                self.reply(&event, Outcome::Started, "");
                let (_, owner) = self.core.route(&job.key);
                self.misplaced_start |= !owner.is_empty() && owner != self.id;
                return waiting;
            }
            Err(HandlerError::InvalidInput(message)) => {
                self.finish(&job.key, &event.token).await;
                self.reply(&event, Outcome::Refused, &message);
                self.answer_waiting(waiting, Outcome::Missing);
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
            Err(HandlerError::Held(message)) => {
                // Kept unstarted, with no retry due: it goes back to the
                // pool when this worker leaves.
                tracing::info!(job.key = %job.key, reason = %message, "start held until the worker leaves");
                self.retrying.insert(job.key.clone(), Retrying { event, job, waiting });
            }
            Err(HandlerError::Retryable(message) | HandlerError::Fatal(message)) => {
                self.fail(&job.key, &event.token, &message, job.attempt).await;
                self.reply(&event, Outcome::Failed, &message);
                self.answer_waiting(waiting, Outcome::Failed);
            }
        }
        VecDeque::new()
    }

    /// Starts again the job whose retry is due, if any.
    pub(super) fn retry_due(&mut self) {
        let Some(((at, key), ())) = self.retry_at.pop_first() else { return };
        if at > Instant::now() || self.calls.is_busy(&key) {
            // (Busy: a start of a newer ownership is in flight; its
            // answer decides.)
            let at = at.max(Instant::now() + self.core.options.retry_backoff);
            self.retry_at.insert((at, key), ());
            return;
        }
        if let Some(Retrying { event, mut job, waiting }) = self.retrying.remove(&key) {
            job.attempt += 1;
            if let Some(call) = self.start(event, job, waiting, false) {
                self.launch(key, None, call);
            }
        }
    }

    /// A stop for a job waiting to start again: it never ran, so it is
    /// removed without calling the handler.
    pub(super) async fn cancel_retry(&mut self, stop: InboxEvent) {
        if let Some(retrying) = self.retrying.remove(&stop.key) {
            self.retry_at.retain(|(_, key), ()| *key != stop.key);
            self.finish(&stop.key, &retrying.event.token).await;
            self.reply(&retrying.event, Outcome::Refused, "stopped before it could start");
            self.answer_waiting(retrying.waiting, Outcome::Missing);
        }
        self.reply(&stop, Outcome::Stopped, "");
    }

    fn on_stop(&mut self, event: InboxEvent) -> Option<Call> {
        let Some(running) = self.fresh(&event) else {
            self.reply(&event, Outcome::Missing, "");
            return None;
        };
        let token = running.token.clone();
        if !self.may_call() {
            return None;
        }
        let handler = self.handler.clone();
        let span = self.call_span("stop", &event.key, &token);
        Some(Box::pin(async move {
            let result = handler.stop(&event.key).instrument(span).await;
            Finished::Stop { event, token, result }
        }))
    }

    fn on_notify(&mut self, event: InboxEvent) -> Option<Call> {
        let Kind::Notify { payload } = &event.kind else { return None };
        let payload = payload.clone();
        if self.fresh(&event).is_none() {
            self.reply(&event, Outcome::Missing, "");
            return None;
        }
        if !self.may_call() {
            return None;
        }
        let handler = self.handler.clone();
        let span = self.call_span("notify", &event.key, &event.token);
        let traced = self.trace_span("worker.notify", &event);
        Some(Box::pin(async move {
            let result = handler
                .notify(&event.key, payload, event.seq)
                .instrument(traced.clone())
                .instrument(span)
                .await;
            traced_result(&traced, &result);
            Finished::Notify { event, result }
        }))
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
        // (A held start its handler ended through the job's context.)
        if self.retrying.get(&key).is_some_and(|r| r.event.token == token) {
            self.retrying.remove(&key);
            self.retry_at.retain(|(_, retried), ()| *retried != key);
        }
    }

    pub(super) fn answer_waiting(&mut self, waiting: VecDeque<InboxEvent>, outcome: Outcome) {
        for event in waiting {
            self.reply(&event, outcome, "");
        }
    }
}

/// Records a handler's error on the trace span of its call.
fn traced_result(span: &tracing::Span, result: &Result<(), HandlerError>) {
    if let Err(error) = result
        && !span.is_disabled()
    {
        span.record("otel.status_code", "ERROR").record("pulse.outcome", error.to_string());
    }
}
