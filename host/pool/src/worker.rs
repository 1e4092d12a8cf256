//! A worker: reads its inbox and runs its jobs' handler calls in order.
//!
//! One task per worker processes the inbox in order, so calls for one key
//! reach the handler in the order they were sent. It de-duplicates by
//! (key, token, seq): a start delivered twice under the same token, or an
//! event whose sequence number was already seen, is not handed to the
//! handler again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use pulse_streams::{ReaderEvent, ReaderOptions, ReaderSubscription, Start, Stream, StreamOptions};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::Instrument;

use crate::context::{Ended, JobContext};
use crate::error::Result;
use crate::job::{HandlerError, Job, JobHandler};
use crate::keys::PoolKeys;
use crate::node::Core;
use crate::scripts;
use crate::wire::{self, InboxEvent, Kind};

/// Inbox entries processed between two trims of the inbox.
const TRIM_EVERY: u64 = 256;
/// Replies kept in a node's reply stream (approximately): answers older than
/// that have no waiter any more.
const REPLIES_KEPT: usize = 10_000;

/// The node's handle on a worker's task.
#[derive(Debug)]
pub(crate) struct WorkerHandle {
    leave: mpsc::UnboundedSender<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl WorkerHandle {
    /// Hands every job back to the pool and ends the worker.
    pub(crate) async fn leave(self) {
        let (done, left) = oneshot::channel();
        if self.leave.send(done).is_ok() {
            let _ = left.await;
        }
        let _ = self.task.await;
    }
}

/// Starts worker `id` reading its inbox.
pub(crate) async fn spawn<H: JobHandler>(core: Arc<Core>, id: String, handler: H) -> Result<WorkerHandle> {
    let stream = Stream::open(
        &core.client,
        &PoolKeys::inbox_name(&id),
        StreamOptions::default().hash_tag(&core.keys.pool),
    )
    .await?;
    let reader = stream.reader(ReaderOptions::default().start(Start::Oldest).queue(65_536)).await?;
    let inbox = reader.subscribe();
    // One subscription for the worker's life: every change of the slot
    // table makes it check where its jobs belong.
    let slot_changes = core.slots.subscribe();
    let (leave_tx, leave_rx) = mpsc::unbounded_channel();
    let (ended_tx, ended_rx) = mpsc::unbounded_channel();
    let span = tracing::info_span!("pool.worker", worker = %id);
    let worker = Worker {
        inbox_key: core.keys.inbox(&id),
        core,
        id,
        handler,
        running: HashMap::new(),
        retrying: HashMap::new(),
        retry_at: BTreeMap::new(),
        ended_tx,
        last_id: "0-0".to_owned(),
        processed: 0,
        misplaced_start: false,
    };
    // Owned by the handle: awaited by `leave`, and it ends with its inbox.
    let task = tokio::spawn(worker.run(reader, inbox, slot_changes, leave_rx, ended_rx).instrument(span));
    Ok(WorkerHandle { leave: leave_tx, task })
}

/// A job this worker runs.
struct Running {
    token: String,
    last_seq: u64,
}

/// A job whose start failed with a retryable error, waiting to start again;
/// events that arrive meanwhile wait with it.
struct Retrying {
    event: InboxEvent,
    job: Job,
    waiting: VecDeque<InboxEvent>,
}

struct Worker<H> {
    core: Arc<Core>,
    id: String,
    inbox_key: String,
    handler: H,
    running: HashMap<String, Running>,
    retrying: HashMap<String, Retrying>,
    retry_at: BTreeMap<(Instant, String), ()>,
    ended_tx: mpsc::UnboundedSender<Ended>,
    /// The id of the last inbox entry processed.
    last_id: String,
    processed: u64,
    /// A job started here whose key no longer routes here (it was sent with
    /// an older slot table): hand it on after this event.
    misplaced_start: bool,
}

impl<H: JobHandler> Worker<H> {
    async fn run(
        mut self,
        reader: pulse_streams::Reader,
        mut inbox: ReaderSubscription,
        mut slot_changes: pulse_rmap::Subscription,
        mut leave: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
        mut ended: mpsc::UnboundedReceiver<Ended>,
    ) {
        loop {
            let next_retry = self.retry_at.keys().next().map(|(at, _)| *at);
            tokio::select! {
                biased;
                Some(end) = ended.recv() => self.on_ended(end),
                Some(done) = leave.recv() => {
                    let all: Vec<String> = self.running.keys().cloned().collect();
                    self.hand_back(all, &mut inbox, &mut ended).await;
                    for (key, retrying) in std::mem::take(&mut self.retrying) {
                        self.requeue(&key, &retrying.event.token).await;
                    }
                    reader.close().await;
                    self.delete_inbox().await;
                    let _ = done.send(());
                    return;
                }
                () = sleep_until(next_retry) => self.retry_due().await,
                Some(_) = slot_changes.recv() => self.rebalance(&mut inbox, &mut ended).await,
                event = inbox.recv() => match event {
                    Some(ReaderEvent::Event(event)) => {
                        self.on_entry(event).await;
                        if self.misplaced_start {
                            self.misplaced_start = false;
                            self.rebalance(&mut inbox, &mut ended).await;
                        }
                    }
                    Some(ReaderEvent::Lagged { resume_after }) => {
                        // 65,536 unread entries: the handler is far behind.
                        tracing::error!(resume_after, "inbox reader lagged; entries after this id were skipped");
                    }
                    None => return,
                },
            }
        }
    }

    async fn on_entry(&mut self, entry: pulse_streams::Event) {
        self.last_id.clone_from(&entry.id);
        match InboxEvent::decode(&entry.name, &entry.payload) {
            Some(event) => {
                let created = entry.created_at_ms();
                self.on_event(event, created).await;
            }
            None => tracing::warn!(id = %entry.id, "skipped a malformed inbox entry"),
        }
        self.processed += 1;
        if self.processed.is_multiple_of(TRIM_EVERY) {
            self.trim().await;
        }
    }

    async fn on_event(&mut self, event: InboxEvent, entry_ms: u64) {
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

    async fn on_start(&mut self, event: InboxEvent, entry_ms: u64) {
        match self.running.get(&event.key) {
            Some(running) if running.token == event.token => return, // delivered twice
            Some(_) => {
                // An older ownership of the same job: it was taken away and
                // given back without a stop here. Stop the old run first.
                self.running.remove(&event.key);
                if let Err(error) = self.handler.stop(&event.key).await {
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
    async fn start(&mut self, event: InboxEvent, job: Job, waiting: VecDeque<InboxEvent>) {
        let ctx = JobContext {
            core: self.core.clone(),
            worker: self.id.clone(),
            key: job.key.clone(),
            token: event.token.clone(),
            ended: self.ended_tx.clone(),
        };
        match self.handler.start(job.clone(), ctx).await {
            Ok(()) => {
                self.running
                    .insert(job.key.clone(), Running { token: event.token.clone(), last_seq: event.seq });
                self.reply(&event, "started", "").await;
                let (_, owner) = self.core.route(&job.key);
                self.misplaced_start |= !owner.is_empty() && owner != self.id;
                for waiting in waiting {
                    Box::pin(self.on_event(waiting, 0)).await;
                }
            }
            Err(HandlerError::InvalidInput(message)) => {
                self.finish(&job.key, &event.token).await;
                self.reply(&event, "refused", &message).await;
                self.answer_waiting(waiting, "missing").await;
            }
            Err(HandlerError::Retryable(message)) if job.attempt < self.core.options.max_attempts => {
                let wait =
                    self.core.options.retry_backoff * 2u32.saturating_pow(job.attempt.saturating_sub(1));
                tracing::info!(job.key = %job.key, attempt = job.attempt, error = %message, ?wait, "start failed; retrying");
                self.retry_at.insert((Instant::now() + wait, job.key.clone()), ());
                self.retrying.insert(job.key.clone(), Retrying { event, job, waiting });
            }
            Err(HandlerError::Retryable(message) | HandlerError::Fatal(message)) => {
                self.fail(&job.key, &event.token, &message, job.attempt).await;
                self.reply(&event, "failed", &message).await;
                self.answer_waiting(waiting, "failed").await;
            }
        }
    }

    async fn retry_due(&mut self) {
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
    async fn cancel_retry(&mut self, stop: InboxEvent) {
        if let Some(retrying) = self.retrying.remove(&stop.key) {
            self.retry_at.retain(|(_, key), ()| *key != stop.key);
            self.finish(&stop.key, &retrying.event.token).await;
            self.reply(&retrying.event, "refused", "stopped before it could start").await;
            self.answer_waiting(retrying.waiting, "missing").await;
        }
        self.reply(&stop, "stopped", "").await;
    }

    async fn on_stop(&mut self, event: InboxEvent) {
        let Some(running) = self.fresh(&event) else {
            self.reply(&event, "missing", "").await;
            return;
        };
        let token = running.token.clone();
        let result = self.handler.stop(&event.key).await;
        self.running.remove(&event.key);
        self.finish(&event.key, &token).await;
        match result {
            Ok(()) => self.reply(&event, "stopped", "").await,
            Err(error) => self.reply(&event, "error", &error.to_string()).await,
        }
    }

    async fn on_notify(&mut self, event: InboxEvent) {
        let Kind::Notify { payload } = &event.kind else { return };
        if self.fresh(&event).is_none() {
            self.reply(&event, "missing", "").await;
            return;
        }
        match self.handler.notify(&event.key, payload.clone(), event.seq).await {
            Ok(()) => self.reply(&event, "notified", "").await,
            Err(HandlerError::Fatal(message)) => {
                if let Some(running) = self.running.remove(&event.key) {
                    self.fail(&event.key, &running.token, &message, 0).await;
                }
                self.reply(&event, "failed", &message).await;
            }
            Err(error) => self.reply(&event, "error", &error.to_string()).await,
        }
    }

    /// The running job an event is for, if it is new (token matches, and
    /// its sequence number was not seen); records the sequence number.
    fn fresh(&mut self, event: &InboxEvent) -> Option<&Running> {
        let running = self.running.get_mut(&event.key)?;
        if running.token != event.token || event.seq <= running.last_seq {
            return None;
        }
        running.last_seq = event.seq;
        Some(running)
    }

    fn on_ended(&mut self, end: Ended) {
        let (Ended::Completed { key, token } | Ended::Failed { key, token }) = end;
        if self.running.get(&key).is_some_and(|r| r.token == token) {
            self.running.remove(&key);
        }
    }

    async fn answer_waiting(&self, waiting: VecDeque<InboxEvent>, outcome: &str) {
        for event in waiting {
            self.reply(&event, outcome, "").await;
        }
    }

    /// Moves every running job whose key routes to another worker: hands
    /// it back, then assigns it where it routes now.
    async fn rebalance(
        &mut self,
        inbox: &mut ReaderSubscription,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
    ) {
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
            return;
        }
        tracing::info!(jobs = misplaced.len(), "moving jobs whose keys route elsewhere");
        let handed = self.hand_back(misplaced, inbox, ended).await;
        for key in handed {
            if let Err(error) = self.core.assign(&key).await {
                tracing::warn!(job.key = %key, error = %error, "failed to assign a moved job; it stays queued");
            }
        }
    }

    /// Hands jobs `keys` back to the pool: marks them moving (their new
    /// events are held), processes what was sent to them before, stops
    /// them and queues them for their next worker. Returns the keys handed
    /// back.
    async fn hand_back(
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
        while id_after(&mark, &self.last_id) {
            tokio::select! {
                biased;
                Some(end) = ended.recv() => self.on_ended(end),
                event = inbox.recv() => match event {
                    Some(ReaderEvent::Event(event)) => self.on_entry(event).await,
                    _ => break,
                },
            }
        }
        let mut handed = Vec::new();
        for (key, token) in marked {
            // Still ours (not stopped, completed or failed meanwhile)?
            if self.running.get(&key).is_none_or(|r| r.token != token) {
                continue;
            }
            self.running.remove(&key);
            if let Err(error) = self.handler.stop(&key).await {
                tracing::warn!(job.key = %key, error = %error, "handler failed to stop a job it hands back");
            }
            self.requeue(&key, &token).await;
            handed.push(key);
        }
        handed
    }

    async fn requeue(&self, key: &str, token: &str) {
        let keys = &self.core.keys;
        let mut conn = self.core.conn.clone();
        let requeued: redis::RedisResult<i64> = scripts::REQUEUE
            .key(&keys.jobs)
            .key(keys.record(key))
            .key(&keys.queued)
            .key(keys.worker_jobs(&self.id))
            .arg(key)
            .arg(token)
            .invoke_async(&mut conn)
            .await;
        if let Err(error) = requeued {
            tracing::warn!(job.key = %key, error = %error, "failed to hand a job back");
        }
    }

    async fn finish(&self, key: &str, token: &str) {
        let keys = &self.core.keys;
        let mut conn = self.core.conn.clone();
        let finished: redis::RedisResult<i64> = scripts::FINISH
            .key(&keys.jobs)
            .key(keys.record(key))
            .key(keys.held(key))
            .key(keys.worker_jobs(&self.id))
            .arg(key)
            .arg(token)
            .invoke_async(&mut conn)
            .await;
        if let Err(error) = finished {
            tracing::warn!(job.key = %key, error = %error, "failed to remove a job");
        }
    }

    async fn fail(&self, key: &str, token: &str, reason: &str, attempt: u32) {
        if let Err(error) = self.core.fail(&self.id, key, token, reason, attempt).await {
            tracing::warn!(job.key = %key, error = %error, "failed to mark a job failed");
        }
    }

    /// Answers the caller waiting for `event`, if any.
    async fn reply(&self, event: &InboxEvent, outcome: &str, message: &str) {
        if event.reply.is_empty() {
            return;
        }
        let mut conn = self.core.conn.clone();
        // NOMKSTREAM: the answer to a node that is gone creates nothing.
        let sent: redis::RedisResult<Option<String>> = redis::cmd("XADD")
            .arg(&event.reply)
            .arg("NOMKSTREAM")
            .arg("MAXLEN")
            .arg("~")
            .arg(REPLIES_KEPT)
            .arg("*")
            .arg("n")
            .arg(outcome)
            .arg("p")
            .arg(wire::encode_reply(&event.request, message))
            .query_async(&mut conn)
            .await;
        if let Err(error) = sent {
            tracing::warn!(job.key = %event.key, error = %error, "failed to answer");
        }
    }

    /// Drops the processed part of the inbox.
    async fn trim(&self) {
        let mut conn = self.core.conn.clone();
        let trimmed: redis::RedisResult<i64> = redis::cmd("XTRIM")
            .arg(&self.inbox_key)
            .arg("MINID")
            .arg(&self.last_id)
            .query_async(&mut conn)
            .await;
        if let Err(error) = trimmed {
            tracing::debug!(error = %error, "failed to trim the inbox");
        }
    }

    async fn delete_inbox(&self) {
        let mut conn = self.core.conn.clone();
        let deleted: redis::RedisResult<()> = redis::cmd("DEL")
            .arg(&self.inbox_key)
            .arg(self.core.keys.worker_jobs(&self.id))
            .exec_async(&mut conn)
            .await;
        if let Err(error) = deleted {
            tracing::warn!(error = %error, "failed to delete the inbox");
        }
    }
}

/// Whether stream id `a` comes after `b`.
fn id_after(a: &str, b: &str) -> bool {
    let parse = |id: &str| -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    };
    parse(a) > parse(b)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
