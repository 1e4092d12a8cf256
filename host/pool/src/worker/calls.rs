//! Handler calls in flight. The worker reads its inbox in order; a call for
//! a key with no call in flight starts at once and runs beside the calls of
//! other keys, up to the worker's `max_concurrent_calls`; an entry for a key
//! whose call is still running waits behind it, so each key's calls reach
//! the handler one after the other, in the order their entries were read.
//!
//! The calls are futures polled by the worker's own task (no task per call):
//! their results are applied by that task, one at a time, so the worker's
//! state needs no lock. Paths that must see every call finished first
//! (handing jobs back, leaving, a lost lease, lost Redis data, reconcile)
//! settle: they wait until nothing is in flight and nothing waits.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;

use crate::job::{HandlerError, Job};
use crate::wire::InboxEvent;

/// An event waiting for its key's call in flight: an inbox entry, or an
/// event held while its job's start was retried (`entry` is then `None`:
/// its entry is deleted already).
pub(super) struct Queued {
    /// The inbox entry to delete once the event is processed.
    pub entry: Option<String>,
    pub event: InboxEvent,
    /// When the entry was added (ms since the Unix epoch), 0 if unknown.
    pub entry_ms: u64,
}

/// A handler call as it runs: resolves to what it returned.
pub(super) type Call = BoxFuture<'static, Finished>;

/// What a call returned, with what the worker needs to apply it.
pub(super) enum Finished {
    Start { event: InboxEvent, job: Job, waiting: VecDeque<InboxEvent>, result: Result<(), HandlerError> },
    Stop { event: InboxEvent, token: String, result: Result<(), HandlerError> },
    Notify { event: InboxEvent, result: Result<(), HandlerError> },
}

/// A finished call of job `key`, made for inbox entry `entry`.
pub(super) struct Done {
    pub key: String,
    pub entry: Option<String>,
    pub finished: Finished,
}

/// The calls in flight and what waits behind them.
pub(super) struct Calls {
    /// Only ever reached through `&mut self` (`get_mut`, no locking): the
    /// mutex makes the worker `Sync` (a boxed call is only `Send`).
    in_flight: Mutex<FuturesUnordered<BoxFuture<'static, Done>>>,
    /// The keys with a call in flight, each with the events waiting for it.
    busy: HashMap<String, VecDeque<Queued>>,
    /// Events waiting, over all keys.
    waiting: usize,
    max: usize,
}

impl Calls {
    pub(super) fn new(max: usize) -> Self {
        Self {
            in_flight: Mutex::new(FuturesUnordered::new()),
            busy: HashMap::new(),
            waiting: 0,
            max: max.max(1),
        }
    }

    /// Whether job `key` has a call in flight.
    pub(super) fn is_busy(&self, key: &str) -> bool {
        self.busy.contains_key(key)
    }

    /// Whether nothing is in flight (and so nothing waits).
    pub(super) fn is_idle(&self) -> bool {
        // A key is busy exactly while its call is in flight.
        self.busy.is_empty()
    }

    /// Whether the worker may read another entry: fewer calls in flight
    /// than allowed, and a bounded number of events waiting behind them.
    pub(super) fn has_room(&self) -> bool {
        self.busy.len() < self.max && self.waiting < self.max.max(64) * 4
    }

    /// Starts `call` for job `key`, made for inbox entry `entry`; the key
    /// is busy until it finishes.
    pub(super) fn start(&mut self, key: String, entry: Option<String>, call: Call) {
        debug_assert!(!self.busy.contains_key(&key), "one call per key at a time");
        self.busy.insert(key.clone(), VecDeque::new());
        self.calls().push(Box::pin(async move { Done { key, entry, finished: call.await } }));
    }

    /// Puts `queued` behind the call in flight for its key.
    pub(super) fn wait(&mut self, queued: Queued) {
        if let Some(queue) = self.busy.get_mut(&queued.event.key) {
            queue.push_back(queued);
            self.waiting += 1;
        }
    }

    /// Puts `queue` back in front of what waits for `key` (after one of
    /// its events started a call).
    pub(super) fn wait_first(&mut self, key: &str, mut queue: VecDeque<Queued>) {
        if let Some(waiting) = self.busy.get_mut(key) {
            self.waiting += queue.len();
            queue.append(waiting);
            *waiting = queue;
        }
    }

    /// The key of a finished call is no longer busy: what waited for it.
    pub(super) fn release(&mut self, key: &str) -> VecDeque<Queued> {
        let queue = self.busy.remove(key).unwrap_or_default();
        self.waiting -= queue.len();
        queue
    }

    /// The next call to finish; `None` when none is in flight.
    ///
    /// # Cancel safety
    /// Cancel safe: a call that has not finished stays in flight.
    pub(super) async fn next(&mut self) -> Option<Done> {
        self.calls().next().await
    }

    /// A call that has finished already, without waiting.
    pub(super) fn ready(&mut self) -> Option<Done> {
        futures_util::FutureExt::now_or_never(self.calls().next()).flatten()
    }

    fn calls(&mut self) -> &mut FuturesUnordered<BoxFuture<'static, Done>> {
        self.in_flight.get_mut().unwrap_or_else(|poison| poison.into_inner())
    }
}
