//! A worker: reads its inbox and runs its jobs' handler calls, in order
//! per key.
//!
//! One task per worker reads the inbox in order. A call for a key with no
//! call in flight starts at once, beside those of other keys (up to
//! `max_concurrent_calls`); later entries for a busy key wait behind its
//! call, so calls for one key reach the handler in the order they were
//! sent (see `calls`). It de-duplicates by
//! (key, token, seq): a start delivered twice under the same token, or an
//! event whose sequence number was already seen, is not handed to the
//! handler again.
//!
//! Each processed entry is deleted from the inbox in the same round trip as
//! its answers, so what an inbox holds is exactly what its worker has not
//! processed: eviction moves it to the jobs' next workers.
//!
//! Before every handler call the worker checks its own fence (see
//! `core::fence`). Once its lease may have ended it calls nothing more: it
//! drops its jobs without calling them, waits until its node renews again,
//! evicts itself (its jobs and unprocessed entries go back to the pool) and
//! joins again with an empty inbox.
//!
//! Every lease tick it also checks, without waiting for traffic, that its
//! jobs still route here after a membership change and that every job
//! Redis lists on it runs here (`reconcile`).
//!
//! # Layout
//! - this file: the worker's state and its loop (inbox, slot-table
//!   changes, retries, ticks, the node's requests).
//! - `handle`: the node's handle on the task; spawning it.
//! - `calls`: the calls in flight and the events waiting behind them.
//! - `events`: starts, stops, notifications, retries: what each needs,
//!   and applying what its call returned.
//! - `handoff`: rebalancing and leaving: jobs handed back in order.
//! - `outbox`: token-fenced writes and the answers sent per entry.
//! - `recovery`: leaving, shutting down, a lost lease, lost Redis data.
//! - `reconcile`: jobs listed here that run nowhere.

mod calls;
mod events;
mod handle;
mod handoff;
mod outbox;
mod reconcile;
mod recovery;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use pulse_streams::{ReaderEvent, ReaderSubscription, Stream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::context::Ended;
use crate::core::{Core, EmitQueue, Outgoing, WorkerFence};
use crate::job::{Job, JobHandler};
use crate::wire::InboxEvent;

use handle::{Control, Exit};
pub(crate) use handle::{WorkerHandle, spawn};

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
    /// What it runs (in its workers entry).
    release: crate::options::Release,
    /// Its own fence: falls when a renewal finds it evicted or it finds its
    /// lease may have ended; its jobs' contexts share it.
    fence: WorkerFence,
    /// A handler call was due while the lease may have ended: nothing more
    /// is called until the worker has joined again.
    lost: bool,
    /// A handler call of the entry being processed was skipped because
    /// Redis lost the pool's data: the entry stays in the inbox.
    skipped: bool,
    /// Answers to send with the next flush.
    outbox: Vec<Outgoing>,
    /// Inbox entries processed, to delete with the next flush.
    processed: Vec<String>,
    /// The events its jobs emitted, written with the next flush (see
    /// `core::emits`).
    emits: Arc<EmitQueue>,
    inbox_key: String,
    /// The inbox, as a stream.
    inbox: Stream,
    /// How its reader is opened (again after a lost lease): from the
    /// oldest entry, bounded, waiting when full.
    inbox_options: pulse_streams::ReaderOptions,
    handler: Arc<H>,
    /// The handler calls in flight.
    calls: calls::Calls,
    running: HashMap<String, Running>,
    retrying: HashMap<String, Retrying>,
    retry_at: BTreeMap<(Instant, String), ()>,
    ended_tx: mpsc::UnboundedSender<Ended>,
    /// The id of the last inbox entry read (processed, in flight or
    /// waiting behind its key's call).
    last_read: String,
    /// A job started here whose key no longer routes here (it was sent with
    /// an older slot table): hand it on after this event.
    misplaced_start: bool,
    /// The slot table changed since a check last found every job routing
    /// here: check again at the next tick.
    unsettled: bool,
    /// Jobs Redis lists on this worker that it does not run, found by the
    /// last check (see `reconcile`).
    orphans: Option<reconcile::Orphans>,
    /// The flush on its way to Redis, sent while the worker serves on
    /// (see `outbox`).
    flushing: Option<tokio::task::JoinHandle<()>>,
}

impl<H: JobHandler> Worker<H> {
    /// The span of one handler call: which call, pool, worker, job key
    /// and the token of the job's ownership.
    fn call_span(&self, call: &'static str, key: &str, token: &str) -> tracing::Span {
        tracing::info_span!("job.call", call, pool = %self.core.keys.pool, worker = %self.id, job.key = %key, token = %token)
    }

    /// The trace span of the handler's call for `event` (`worker.start`
    /// or `worker.notify`): a child of the span that sent the event and,
    /// for a notification, linked to the dispatch that started the job.
    /// Disabled unless traces are exported.
    fn trace_span(&self, name: &'static str, event: &InboxEvent) -> tracing::Span {
        let span = tracing::trace_span!(
            target: pulse_telemetry::TARGET,
            "pulse",
            otel.name = name,
            otel.kind = "consumer",
            otel.status_code = tracing::field::Empty,
            pulse.pool = %self.core.keys.pool,
            pulse.job.key = %event.key,
            pulse.worker = %self.id,
            pulse.node = %self.core.id,
            pulse.token = %event.token,
            pulse.outcome = tracing::field::Empty,
        );
        pulse_telemetry::follow(&span, &event.trace);
        pulse_telemetry::link(&span, &event.started_by);
        span
    }

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
            let exit =
                self.serve(&mut inbox, &mut slot_changes, &mut control, &mut ended, &mut data_losses).await;
            // Whatever comes next, no call is in flight: the calls made run
            // to their end (their writes stay fenced by the jobs' tokens)
            // and what waited for them is processed or left in the inbox.
            self.settle().await;
            match exit {
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
            let in_flight = !self.calls.is_idle();
            let has_jobs = !self.running.is_empty() || !self.retrying.is_empty() || in_flight;
            let room = self.calls.has_room() && !self.flush_backlogged();
            let fence = self.fence.clone();
            tokio::select! {
                biased;
                Some(end) = ended.recv() => self.on_ended(end),
                // What the next flush takes is sent below.
                () = outbox::flushed(&mut self.flushing) => self.flushing = None,
                Some(request) = control.recv() => return Exit::Control(request),
                () = self.core.token.cancelled() => {
                    // The node ends abruptly (see `NodeOptions::cancel`).
                    self.fence.fence();
                    return Exit::Closed;
                }
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
                Some(done) = self.calls.next(), if in_flight => {
                    self.complete(done).await;
                    self.complete_ready().await;
                }
                () = sleep_until(next_retry) => self.retry_due(),
                // An event was emitted: written by the flush below if no
                // call in flight will carry it (it came from a timer).
                () = self.emits.queued() => {}
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
                event = inbox.recv(), if room => match event {
                    Some(event) => {
                        self.on_read(event).await;
                        self.read_ahead(inbox).await;
                    }
                    None => return Exit::Closed,
                },
            }
            self.flush_soon();
            if self.lost {
                return Exit::Lost;
            }
            if self.misplaced_start {
                self.misplaced_start = false;
                self.rebalance(inbox, ended).await;
            }
        }
    }
}

impl<H: JobHandler> Worker<H> {
    /// What the inbox reader delivered: an entry, or news that entries
    /// were skipped.
    async fn on_read(&mut self, event: ReaderEvent) {
        match event {
            ReaderEvent::Event(event) => self.on_entry(event).await,
            ReaderEvent::Lagged { resume_after } => {
                // The inbox reader waits when full (`Overflow::Wait`):
                // a lag would be a reader opened otherwise.
                tracing::error!(resume_after, "inbox reader lagged; entries after this id were skipped");
            }
        }
    }

    /// Processes the entries read already (up to [`READ_AHEAD`], while
    /// calls have room), then applies the calls that finished at once, so
    /// that their answers and deletions share the next flush's round trip
    /// instead of taking one each. Stops early where the loop must act
    /// first: a lost lease, or a start that no longer routes here.
    async fn read_ahead(&mut self, inbox: &mut ReaderSubscription) {
        for _ in 1..READ_AHEAD {
            if self.lost || self.misplaced_start || !self.calls.has_room() {
                break;
            }
            match inbox.try_recv() {
                Some(event) => self.on_read(event).await,
                None => break,
            }
        }
        self.complete_ready().await;
    }
}

/// Inbox entries one turn of the worker's loop processes at most before it
/// flushes their answers.
const READ_AHEAD: usize = 64;

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
