//! Leases and fencing: what a node knows of its workers' leases, and the
//! fence that stops their handler calls.
//!
//! Every worker holds a lease in Redis: a deadline on Redis time, renewed
//! for all of a node's workers by one script every quarter of the lease's
//! time to live. The renewal checks membership, so an evicted worker is
//! never brought back by a late renewal.
//!
//! A node fences its own workers: they run no handler call once the send
//! time of the last successful renewal plus the TTL minus a margin has
//! passed on the node's monotonic clock. Their leases end in Redis no
//! sooner than that (the renewal ran after it was sent), and eviction waits
//! a grace longer still, so a worker has dropped its jobs before anyone may
//! take them (ARCHITECTURE I1).
//!
//! The fence is also per worker ([`WorkerFence`]): a renewal that finds a
//! worker evicted fences that worker before the node's lease moves on, so
//! no guest call, timer or effect of its jobs starts afterwards, whatever
//! the node's other leases say.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// One worker's own fence: once it falls, none of the worker's jobs may
/// run guest code, whatever the node's lease says. It falls when a renewal
/// finds the worker evicted, or when the worker finds its lease may have
/// ended; it is new (up) again when the worker joins again.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkerFence {
    fenced: Arc<AtomicBool>,
    evicted: Arc<Notify>,
    /// The last loss of the pool's data (a [`Lease::data_losses`]
    /// generation) after which the worker wrote its jobs back: until then a
    /// refusal of its jobs' requests is the loss's doing, not a move's.
    written_back: Arc<AtomicU64>,
}

impl WorkerFence {
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Fences the worker (its own decision: nobody needs telling).
    pub(crate) fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
    }

    /// Fences the worker and tells it it was evicted.
    fn evict(&self) {
        self.fence();
        self.evicted.notify_one();
    }

    /// Resolves once a renewal found the worker evicted.
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await;
    }

    /// The worker wrote its jobs back after data loss `generation`.
    pub(crate) fn written_back(&self, generation: u64) {
        self.written_back.fetch_max(generation, Ordering::AcqRel);
    }
}

/// A node's lease on its workers' membership, as its own clock sees it.
#[derive(Debug)]
pub(crate) struct Lease {
    base: Instant,
    /// Milliseconds after `base` until which this node's workers may call
    /// their handlers.
    until_ms: AtomicU64,
    /// Bumped by every successful renewal: fenced workers wait for it.
    renewed: watch::Sender<u64>,
    /// Bumped when Redis lost the pool's data: workers write back the
    /// jobs they run.
    data_lost: watch::Sender<u64>,
    /// This node's workers, each with its fence and whether it joined
    /// (only those are renewed).
    members: Mutex<HashMap<String, (WorkerFence, bool)>>,
    /// The pool epoch this node works in.
    epoch: Mutex<String>,
    /// The slot count recorded in that epoch.
    slot_count: AtomicU32,
}

impl Lease {
    pub(crate) fn new(epoch: String, slot_count: u32) -> Self {
        Self {
            slot_count: AtomicU32::new(slot_count),
            base: Instant::now(),
            until_ms: AtomicU64::new(0),
            renewed: watch::Sender::new(0),
            data_lost: watch::Sender::new(0),
            members: Mutex::new(HashMap::new()),
            epoch: Mutex::new(epoch),
        }
    }

    /// Whether this node's workers may call their handlers now.
    pub(crate) fn valid(&self) -> bool {
        self.elapsed_ms() < self.until_ms.load(Ordering::Acquire)
    }

    /// Whether the worker behind `fence` may call its handler now.
    pub(crate) fn valid_for(&self, fence: &WorkerFence) -> bool {
        !fence.is_fenced() && self.valid()
    }

    /// When the fence falls, unless a renewal moves it.
    pub(crate) fn fence_at(&self) -> Instant {
        self.base + Duration::from_millis(self.until_ms.load(Ordering::Acquire))
    }

    /// A renewal (or join) sent at `sent_ms` succeeded: the fence moves to
    /// `sent_ms + ttl - margin`.
    pub(super) fn extend(&self, sent_ms: u64, ttl: Duration) {
        let until = sent_ms + millis(ttl) - millis(margin(ttl));
        self.until_ms.fetch_max(until, Ordering::AcqRel);
        self.renewed.send_modify(|n| *n += 1);
    }

    /// Fences every worker of the node at once.
    pub(super) fn fence_now(&self) {
        self.until_ms.store(0, Ordering::Release);
    }

    pub(crate) fn elapsed_ms(&self) -> u64 {
        millis(self.base.elapsed())
    }

    pub(crate) fn renewals(&self) -> watch::Receiver<u64> {
        self.renewed.subscribe()
    }

    pub(crate) fn data_losses(&self) -> watch::Receiver<u64> {
        self.data_lost.subscribe()
    }

    pub(crate) fn epoch(&self) -> String {
        lock(&self.epoch).clone()
    }

    /// The pool's slot count, as its epoch records it.
    pub(crate) fn slot_count(&self) -> u32 {
        self.slot_count.load(Ordering::Acquire)
    }

    /// Registers worker `id`, not joined yet; returns its fence: `keep`
    /// when given and still up (the worker joins again with the jobs it
    /// runs, whose contexts share it), otherwise a new one.
    pub(crate) fn add_member(&self, id: &str, keep: Option<WorkerFence>) -> WorkerFence {
        let fence = keep.filter(|fence| !fence.is_fenced()).unwrap_or_else(|| {
            let fence = WorkerFence::default();
            fence.written_back(*self.data_lost.borrow());
            fence
        });
        lock(&self.members).insert(id.to_owned(), (fence.clone(), false));
        fence
    }

    /// The epoch this node works in, and whether a loss of the pool's data
    /// happened that `fence`'s worker has not written its jobs back after
    /// yet: read together, as [`Lease::adopt_epoch`] changes them.
    pub(crate) fn epoch_and_pending(&self, fence: &WorkerFence) -> (String, bool) {
        let epoch = lock(&self.epoch);
        (epoch.clone(), self.data_loss_pending(fence))
    }

    /// Redis lost the pool's data: the node works in `epoch` from now on,
    /// and its workers call no handler until they joined again and wrote
    /// their jobs back. The loss is recorded before the fence falls, so a
    /// worker that finds the fence fallen also finds the loss (and writes
    /// its jobs back rather than dropping them).
    pub(super) fn adopt_epoch(&self, epoch: String, slot_count: u32) {
        {
            let mut current = lock(&self.epoch);
            *current = epoch;
            self.slot_count.store(slot_count, Ordering::Release);
            self.data_lost.send_modify(|n| *n += 1);
        }
        self.fence_now();
    }

    /// What `fence`'s worker knows of losses of the pool's data: the last
    /// loss (a generation) and the last one after which it wrote its jobs
    /// back. Read before a job's request: a refusal is the loss's doing
    /// when a loss was pending then, or either changed meanwhile.
    pub(crate) fn losses(&self, fence: &WorkerFence) -> (u64, u64) {
        (*self.data_lost.borrow(), fence.written_back.load(Ordering::Acquire))
    }

    /// Whether `fence`'s worker has not written its jobs back since the
    /// last loss of the pool's data.
    pub(crate) fn data_loss_pending(&self, fence: &WorkerFence) -> bool {
        fence.written_back.load(Ordering::Acquire) < *self.data_lost.borrow()
    }

    /// Worker `id` joined: its lease is renewed from now on.
    pub(super) fn joined(&self, id: &str) {
        if let Some((_, joined)) = lock(&self.members).get_mut(id) {
            *joined = true;
        }
    }

    pub(crate) fn remove_member(&self, id: &str) {
        lock(&self.members).remove(id);
    }

    pub(super) fn members(&self) -> Vec<String> {
        lock(&self.members).iter().filter(|(_, (_, joined))| *joined).map(|(id, _)| id.clone()).collect()
    }

    pub(super) fn evicted(&self, id: &str) {
        if let Some((fence, _)) = lock(&self.members).get(id) {
            fence.evict();
        }
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Held for one read or update, never across an await.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How long before its lease ends (by its own clock) a node fences its
/// workers: a tenth of the TTL.
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / 10
}

/// How long after a lease ends its worker may be evicted: the margin plus
/// as long again for the fenced worker to drop its jobs.
pub(crate) fn grace(ttl: Duration) -> Duration {
    margin(ttl) * 2
}

/// How often a node renews its leases and runs the janitor.
pub(crate) fn tick(ttl: Duration) -> Duration {
    ttl / 4
}
