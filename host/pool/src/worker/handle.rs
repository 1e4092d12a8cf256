//! The node's handle on a worker's task, and the task's start: its inbox
//! opened before it joins, a drop guard that fences it if it panics.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use pulse_streams::{Overflow, ReaderOptions, ReaderSubscription, Start, Stream, StreamOptions};
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::core::{Core, EmitQueue, WorkerFence};
use crate::error::Result;
use crate::job::JobHandler;
use crate::keys::PoolKeys;
use crate::options::WorkerOptions;

use super::Worker;

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
pub(super) enum Control {
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
pub(super) enum Exit {
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
    options: &WorkerOptions,
) -> Result<WorkerHandle> {
    // Loaded before the worker's first writes: a batch that met an unknown
    // script would land after the commands sent with it (see
    // `core::emits`).
    crate::scripts::load(&crate::scripts::WRITE, &mut core.conn.clone())
        .await
        .map_err(core.redis_error("load the write script"))?;
    let inbox_stream = Stream::open(
        &core.client,
        &PoolKeys::inbox_name(&id),
        StreamOptions::default().hash_tag(&core.keys.tag),
    )
    .await?;
    let inbox_options = ReaderOptions::default()
        .start(Start::Oldest)
        .queue(options.inbox_entries)
        .max_bytes(options.inbox_bytes)
        .overflow(Overflow::Wait)
        .doorbell(core.doorbells);
    let (reader, inbox) = open_inbox(&inbox_stream, &inbox_options).await?;
    // One subscription for the worker's life: every change of the slot
    // table makes it check where its jobs belong.
    let slot_changes = core.slots.subscribe();
    let (control_tx, control_rx) = mpsc::unbounded_channel();
    let (ended_tx, ended_rx) = mpsc::unbounded_channel();
    let span = tracing::info_span!("pool.worker", worker = %id);
    let fence = core.lease.add_member(&id, None);
    let emits = Arc::new(EmitQueue::new(&id));
    let worker = Worker {
        inbox_key: core.keys.inbox(&id),
        inbox: inbox_stream,
        inbox_options,
        core,
        id,
        join,
        release: options.release.clone(),
        fence,
        lost: false,
        skipped: false,
        outbox: Vec::new(),
        processed: Vec::new(),
        emits,
        handler: Arc::new(handler),
        calls: super::calls::Calls::new(options.max_concurrent_calls),
        running: HashMap::new(),
        retrying: HashMap::new(),
        retry_at: BTreeMap::new(),
        ended_tx,
        last_read: "0-0".to_owned(),
        misplaced_start: false,
        unsettled: true,
        orphans: None,
        flushing: None,
    };
    let on_panic =
        PanicFence { core: worker.core.clone(), id: worker.id.clone(), fence: worker.fence.clone() };
    // Owned by the handle (awaited by `leave`; it ends with its inbox) and
    // tracked by the node, whose close waits for it.
    let task = worker.core.tasks.clone().spawn(
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

/// Reads a worker's inbox from its oldest entry, holding at most what
/// `options` bound read ahead: beyond that the reader waits, and no entry
/// is skipped.
pub(super) async fn open_inbox(
    stream: &Stream,
    options: &ReaderOptions,
) -> Result<(pulse_streams::Reader, ReaderSubscription)> {
    let reader = stream.reader(options.clone()).await?;
    let inbox = reader.subscribe();
    Ok((reader, inbox))
}
