//! A worker: reads its inbox and runs its jobs' handler calls in order.
//!
//! One task per worker processes the inbox in order, so calls for one key
//! reach the handler in the order they were sent. It de-duplicates by
//! (key, token, seq): a start delivered twice under the same token, or an
//! event whose sequence number was already seen, is not handed to the
//! handler again.
//!
//! Each processed entry is deleted from the inbox in the same round trip as
//! its answers, so what an inbox holds is exactly what its worker has not
//! processed: eviction moves that tail to the jobs' next worker.
//!
//! Before every handler call the worker checks its own fence (see
//! `node::lease`). Once its lease may have ended it calls nothing more: it
//! drops its jobs without calling them, waits until its node renews again,
//! evicts itself (its jobs and unprocessed entries go back to the pool) and
//! joins again with an empty inbox.
//!
//! Every lease tick it also checks, without waiting for traffic, that its
//! jobs still route here after a membership change and that every job
//! Redis lists on it runs here (`reconcile`).

mod reconcile;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures_util::StreamExt as _;
use pulse_streams::{ReaderEvent, ReaderOptions, ReaderSubscription, Start, Stream, StreamOptions, id_after};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::Instrument;

use crate::context::{Ended, JobContext};
use crate::core::{Core, WorkerFence};
use crate::error::Result;
use crate::job::{HandlerError, Job, JobHandler};
use crate::keys::PoolKeys;
use crate::scripts;
use crate::wire::{self, InboxEvent, Kind};

/// Stop calls a leaving worker makes at once.
const STOPS_AT_ONCE: usize = 16;

/// The longest wait before a retried start, whatever the backoff doubles
/// to.
const MAX_RETRY_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Replies kept in a node's reply stream (approximately): answers older than
/// that have no waiter any more.
const REPLIES_KEPT: usize = 10_000;

/// The node's handle on a worker's task.
#[derive(Debug)]
pub(crate) struct WorkerHandle {
    control: mpsc::UnboundedSender<Control>,
    /// Aborted when the handle is dropped unused (its node was dropped
    /// without closing): the worker stops where it is, as in a crash.
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What the node asks of a worker's task.
#[derive(Debug)]
enum Control {
    /// Hand every job back to the pool, then end.
    Leave(oneshot::Sender<()>),
    /// Stop every job for good (the pool shuts down), then end.
    ShutDown(oneshot::Sender<()>),
}

impl WorkerHandle {
    /// Hands every job back to the pool and ends the worker.
    pub(crate) async fn leave(self) {
        self.ask(Control::Leave).await;
    }

    /// Stops every job (their handlers' `stop`) and ends the worker.
    pub(crate) async fn shut_down(self) {
        self.ask(Control::ShutDown).await;
    }

    async fn ask(mut self, control: impl FnOnce(oneshot::Sender<()>) -> Control) {
        let (done, finished) = oneshot::channel();
        if self.control.send(control(done)).is_ok() {
            let _ = finished.await;
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// Why a worker stopped serving its inbox.
enum Exit {
    Control(Control),
    /// Its lease may have ended, or it was evicted.
    Lost,
    /// Redis lost the pool's data.
    DataLost,
    /// Its inbox reader ended.
    Closed,
}

/// Starts worker `id` reading its inbox.
pub(crate) async fn spawn<H: JobHandler>(
    core: Arc<Core>,
    id: String,
    join: u64,
    handler: H,
) -> Result<WorkerHandle> {
    let inbox_stream = Stream::open(
        &core.client,
        &PoolKeys::inbox_name(&id),
        StreamOptions::default().hash_tag(&core.keys.pool),
    )
    .await?;
    let (reader, inbox) = open_inbox(&inbox_stream).await?;
    // One subscription for the worker's life: every change of the slot
    // table makes it check where its jobs belong.
    let slot_changes = core.slots.subscribe();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (ended_tx, ended_rx) = mpsc::unbounded_channel();
    let span = tracing::info_span!("pool.worker", worker = %id);
    let fence = core.lease.add_member(&id, None);
    let worker = Worker {
        inbox_key: core.keys.inbox(&id),
        inbox: inbox_stream,
        core,
        id,
        join,
        fence,
        lost: false,
        skipped: false,
        outbox: Vec::new(),
        handler,
        running: HashMap::new(),
        retrying: HashMap::new(),
        retry_at: BTreeMap::new(),
        ended_tx,
        last_id: "0-0".to_owned(),
        misplaced_start: false,
        unsettled: true,
        orphans: None,
    };
    let on_panic =
        PanicFence { core: worker.core.clone(), id: worker.id.clone(), fence: worker.fence.clone() };
    // Owned by the handle: awaited by `leave`, and it ends with its inbox.
    let task = tokio::spawn(
        async move {
            let _on_panic = on_panic;
            worker.run(reader, inbox, slot_changes, control_rx, ended_rx).await;
        }
        .instrument(span),
    );
    Ok(WorkerHandle { control: control_tx, task: Some(task) })
}

/// Fences a worker whose task panicked (a handler's panic unwinds it): no
/// code of its jobs runs any more, and its lease is no longer renewed, so
/// once it ends the janitors hand its jobs to other workers. Without it
/// the node would go on renewing a lease for jobs nobody runs.
struct PanicFence {
    core: Arc<Core>,
    id: String,
    fence: WorkerFence,
}

impl Drop for PanicFence {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.fence.fence();
            self.core.lease.remove_member(&self.id);
            tracing::error!(
                worker = %self.id,
                "the worker's task panicked: it is fenced and its lease is no longer renewed; its jobs move to other workers when the lease ends"
            );
        }
    }
}

/// Reads a worker's inbox from its oldest entry.
async fn open_inbox(stream: &Stream) -> Result<(pulse_streams::Reader, ReaderSubscription)> {
    let reader = stream.reader(ReaderOptions::default().start(Start::Oldest).queue(65_536)).await?;
    let inbox = reader.subscribe();
    Ok((reader, inbox))
}

/// An answer waiting to be sent with the next flush.
struct Outgoing {
    stream: String,
    outcome: String,
    payload: Vec<u8>,
}

/// A job this worker runs.
struct Running {
    token: String,
    last_seq: u64,
    /// As it started (without its state), to write it back if Redis loses
    /// the pool's data.
    job: Job,
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
    /// Its join number (in its workers entry).
    join: u64,
    /// Its own fence: falls when a renewal finds it evicted or it finds its
    /// lease may have ended; its jobs' contexts share it.
    fence: WorkerFence,
    /// A handler call was due while the lease may have ended: nothing more
    /// is called until the worker has joined again.
    lost: bool,
    /// A handler call of the entry being processed was skipped because
    /// Redis lost the pool's data: the entry stays in the inbox.
    skipped: bool,
    /// Answers to send with the deletion of the entry being processed.
    outbox: Vec<Outgoing>,
    inbox_key: String,
    /// The inbox, as a stream.
    inbox: Stream,
    handler: H,
    running: HashMap<String, Running>,
    retrying: HashMap<String, Retrying>,
    retry_at: BTreeMap<(Instant, String), ()>,
    ended_tx: mpsc::UnboundedSender<Ended>,
    /// The id of the last inbox entry processed.
    last_id: String,
    /// A job started here whose key no longer routes here (it was sent with
    /// an older slot table): hand it on after this event.
    misplaced_start: bool,
    /// The slot table changed since a check last found every job routing
    /// here: check again at the next tick.
    unsettled: bool,
    /// Jobs Redis lists on this worker that it does not run, found by the
    /// last check (see `reconcile`).
    orphans: Option<reconcile::Orphans>,
}

impl<H: JobHandler> Worker<H> {
    async fn run(
        mut self,
        mut reader: pulse_streams::Reader,
        mut inbox: ReaderSubscription,
        mut slot_changes: pulse_rmap::Subscription,
        mut control: mpsc::UnboundedReceiver<Control>,
        mut ended: mpsc::UnboundedReceiver<Ended>,
    ) {
        let mut data_losses = self.core.lease.data_losses();
        loop {
            match self.serve(&mut inbox, &mut slot_changes, &mut control, &mut ended, &mut data_losses).await
            {
                Exit::Control(request) => {
                    self.on_control(request, &mut inbox, &mut ended).await;
                    reader.close().await;
                    break;
                }
                Exit::Closed => break,
                Exit::DataLost => {
                    let generation = *data_losses.borrow_and_update();
                    reader.close().await;
                    match self.join_again(&mut control).await {
                        Some((new_reader, new_inbox)) => {
                            (reader, inbox) = (new_reader, new_inbox);
                            self.reassert().await;
                            self.fence.written_back(generation);
                        }
                        None => break,
                    }
                }
                Exit::Lost => {
                    reader.close().await;
                    self.drop_jobs().await;
                    match self.rejoin(&mut control).await {
                        Some((new_reader, new_inbox)) => (reader, inbox) = (new_reader, new_inbox),
                        None => break,
                    }
                }
            }
        }
        self.core.lease.remove_member(&self.id);
    }

    /// Serves the inbox until the node asks something, the lease is lost
    /// or the inbox ends.
    async fn serve(
        &mut self,
        inbox: &mut ReaderSubscription,
        slot_changes: &mut pulse_rmap::Subscription,
        control: &mut mpsc::UnboundedReceiver<Control>,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
        data_losses: &mut watch::Receiver<u64>,
    ) -> Exit {
        let mut checks = tokio::time::interval(crate::core::tick(self.core.options.lease_ttl));
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        checks.reset();
        loop {
            let next_retry = self.retry_at.keys().next().map(|(at, _)| *at);
            let has_jobs = !self.running.is_empty() || !self.retrying.is_empty();
            let fence = self.fence.clone();
            tokio::select! {
                biased;
                Some(end) = ended.recv() => self.on_ended(end),
                Some(request) = control.recv() => return Exit::Control(request),
                Ok(()) = data_losses.changed() => return Exit::DataLost,
                () = fence.evicted() => return Exit::Lost,
                () = tokio::time::sleep_until(self.core.lease.fence_at()), if has_jobs => {
                    if !self.core.lease.valid_for(&self.fence) {
                        if self.core.lease.data_loss_pending(&self.fence) {
                            return Exit::DataLost;
                        }
                        self.fence.fence();
                        return Exit::Lost;
                    }
                }
                () = sleep_until(next_retry) => {
                    self.retry_due().await;
                    self.flush(None).await;
                }
                Some(_) = slot_changes.recv() => {
                    self.rebalance(inbox, ended).await;
                    self.unsettled = true;
                }
                _ = checks.tick() => {
                    if self.unsettled {
                        self.unsettled = self.rebalance(inbox, ended).await;
                    }
                    self.reconcile().await;
                }
                event = inbox.recv() => match event {
                    Some(ReaderEvent::Event(event)) => {
                        self.on_entry(event).await;
                        if self.misplaced_start && !self.lost {
                            self.misplaced_start = false;
                            self.rebalance(inbox, ended).await;
                        }
                    }
                    Some(ReaderEvent::Lagged { resume_after }) => {
                        // 65,536 unread entries: the handler is far behind.
                        tracing::error!(resume_after, "inbox reader lagged; entries after this id were skipped");
                    }
                    None => return Exit::Closed,
                },
            }
            if self.lost {
                return Exit::Lost;
            }
        }
    }

    async fn on_control(
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
                self.assign_all(handed).await;
                for (key, retrying) in std::mem::take(&mut self.retrying) {
                    self.requeue(&key, &retrying.event.token).await;
                }
                done
            }
            Control::ShutDown(done) => {
                let running = std::mem::take(&mut self.running);
                let keys: Vec<String> = running.keys().cloned().collect();
                if self.may_call() {
                    self.stop_all(&keys, "at shutdown").await;
                } else {
                    for key in &keys {
                        self.handler.abandon(key).await;
                    }
                }
                for (key, running) in running {
                    self.finish(&key, &running.token).await;
                }
                for (key, retrying) in std::mem::take(&mut self.retrying) {
                    self.finish(&key, &retrying.event.token).await;
                }
                done
            }
        };
        self.flush(None).await;
        let _ = done.send(());
    }

    /// Whether the lease allows a handler call now; if not, the worker is
    /// lost and calls nothing more.
    fn may_call(&mut self) -> bool {
        if !self.lost && !self.core.lease.valid_for(&self.fence) {
            if self.core.lease.data_loss_pending(&self.fence) {
                // Redis lost the pool's data: no call until the worker has
                // joined again and written its jobs back (what it skips
                // stays in its inbox, read again from the oldest entry).
                self.skipped = true;
                return false;
            }
            tracing::warn!("the lease may have ended: this worker calls no handler until it joins again");
            self.lost = true;
            self.fence.fence();
        }
        !self.lost
    }

    /// Drops every job without calling its handler: they may already run
    /// elsewhere.
    async fn drop_jobs(&mut self) {
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
    async fn rejoin(
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
    async fn join_again(
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
            self.last_id = "0-0".to_owned();
            let joined = match open_inbox(&self.inbox).await {
                Ok((reader, inbox)) => match self.core.join_worker(&self.id, self.join).await {
                    Ok(()) => Ok((reader, inbox)),
                    Err(error) => {
                        reader.close().await;
                        Err(error)
                    }
                },
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
    async fn reassert(&mut self) {
        let keys = &self.core.keys;
        let mut kept = 0;
        for (key, retrying) in std::mem::take(&mut self.retrying) {
            tracing::warn!(job.key = %key, attempt = retrying.job.attempt, "dropped a job waiting to start again: Redis lost it");
            self.handler.abandon(&key).await;
        }
        self.retry_at.clear();
        let running: Vec<String> = self.running.keys().cloned().collect();
        for key in running {
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

    async fn on_entry(&mut self, entry: pulse_streams::Event) {
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
                if !self.may_call() {
                    return;
                }
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
            fence: self.fence.clone(),
            key: job.key.clone(),
            token: event.token.clone(),
            ended: self.ended_tx.clone(),
        };
        if !self.may_call() {
            return;
        }
        match self.handler.start(job.clone(), ctx).await {
            Ok(()) => {
                self.running.insert(
                    job.key.clone(),
                    Running {
                        token: event.token.clone(),
                        last_seq: event.seq,
                        job: Job { state: None, ..job.clone() },
                    },
                );
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
        if !self.may_call() {
            return;
        }
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
        if !self.may_call() {
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

    async fn answer_waiting(&mut self, waiting: VecDeque<InboxEvent>, outcome: &str) {
        for event in waiting {
            self.reply(&event, outcome, "").await;
        }
    }

    /// Moves every running job whose key routes to another worker: hands
    /// it back, then assigns it where it routes now. Returns whether any
    /// job routed elsewhere (so the next check looks again).
    async fn rebalance(
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
    async fn assign_all(&self, keys: Vec<String>) {
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
        self.stop_all(&keys, "it hands back").await;
        for (key, token) in &marked {
            self.requeue(key, token).await;
        }
        keys
    }

    /// Calls `stop` for `keys`, [`STOPS_AT_ONCE`] at a time, all within
    /// `shutdown_timeout`: a plugin slow to stop (or looping in `stop`)
    /// delays a leave, a shutdown or a hand-back after a table change by
    /// that much at most. Jobs whose stop has not returned by then are
    /// abandoned: their tokens move on as they are handed back or
    /// finished, so nothing their code still does reaches the pool (and a
    /// leaving worker's fence falls with it).
    async fn stop_all(&self, keys: &[String], why: &str) {
        if keys.is_empty() {
            return;
        }
        let handler = &self.handler;
        let mut pending: HashSet<&str> = keys.iter().map(String::as_str).collect();
        // Made up front (none runs before it is polled), so that each
        // borrows for one known lifetime.
        let calls: Vec<_> =
            keys.iter().map(|key| async move { (key.as_str(), handler.stop(key).await) }).collect();
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
    async fn drain(&mut self, inbox: &mut ReaderSubscription, ended: &mut mpsc::UnboundedReceiver<Ended>) {
        let Ok(Some(last)) = self.inbox.last_id().await else { return };
        self.drain_to(&last, inbox, ended).await;
    }

    /// Processes the inbox, in order, up to entry `mark`; stops early if
    /// the lease is lost (entries are then left for the jobs' next worker).
    async fn drain_to(
        &mut self,
        mark: &str,
        inbox: &mut ReaderSubscription,
        ended: &mut mpsc::UnboundedReceiver<Ended>,
    ) {
        while id_after(mark, &self.last_id) && !self.lost {
            tokio::select! {
                biased;
                Some(end) = ended.recv() => self.on_ended(end),
                event = inbox.recv() => match event {
                    Some(ReaderEvent::Event(event)) => self.on_entry(event).await,
                    _ => break,
                },
            }
        }
    }

    /// Hands job `key` back to the pool under `token`; whether it was.
    async fn requeue(&self, key: &str, token: &str) -> bool {
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
        match requeued {
            Ok(done) => done == 1,
            Err(error) => {
                tracing::warn!(job.key = %key, error = %error, "failed to hand a job back");
                false
            }
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

    /// Answers the caller waiting for `event`, if any, with the next flush.
    async fn reply(&mut self, event: &InboxEvent, outcome: &str, message: &str) {
        if event.reply.is_empty() {
            return;
        }
        self.outbox.push(Outgoing {
            stream: event.reply.clone(),
            outcome: outcome.to_owned(),
            payload: wire::encode_reply(&event.request, message),
        });
    }

    /// Sends the answers waiting in the outbox and, with `processed`,
    /// deletes that entry from the inbox: one round trip.
    async fn flush(&mut self, processed: Option<&str>) {
        if self.outbox.is_empty() && processed.is_none() {
            return;
        }
        let mut pipe = redis::pipe();
        for out in self.outbox.drain(..) {
            // NOMKSTREAM: the answer to a node that is gone creates nothing.
            pipe.cmd("XADD")
                .arg(&out.stream)
                .arg("NOMKSTREAM")
                .arg("MAXLEN")
                .arg("~")
                .arg(REPLIES_KEPT)
                .arg("*")
                .arg("n")
                .arg(&out.outcome)
                .arg("p")
                .arg(out.payload)
                .ignore();
        }
        if let Some(id) = processed {
            // XDEL, not XTRIM MINID: an exact trim scans the head node of
            // the stream on every call; deleting one entry is a lookup.
            pipe.cmd("XDEL").arg(&self.inbox_key).arg(id).ignore();
        }
        // Sent again when the connection dropped: a lost answer leaves its
        // caller waiting, and both commands may run twice (a second answer
        // has no waiter; a second XDEL deletes nothing).
        for wait in [0, 20, 100, 500] {
            if wait > 0 {
                // (A zero sleep would still wait for the timer's next tick.)
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            }
            let mut conn = self.core.conn.clone();
            match pipe.query_async::<()>(&mut conn).await {
                Ok(()) => return,
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
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Between attempts to evict itself or join again: a short, jittered
/// pause, cut short by the node's next renewal when `renewals` is given.
/// False when the node asks the worker to end meanwhile (the request is
/// answered) or the node is gone.
async fn wait_or_end(
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
