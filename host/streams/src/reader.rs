//! [`Reader`]: every reader sees every event of its stream, in order.
//!
//! The reading task starts with the first subscription, so no event is
//! read before anyone can receive it. Each subscriber has a bounded queue: a
//! subscriber that falls behind does not stall the others; it stops
//! receiving, and once it has read what was queued it gets
//! [`ReaderEvent::Lagged`] with the id to resume after (with a new reader
//! from [`crate::Start::After`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::streams::StreamReadReply;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::event::{Event, TopicFilter};
use crate::stream::{Start, Stream};

/// Options of [`Stream::reader`].
///
/// Defaults: start [`Start::Newest`], every topic, `XREAD` blocking up to
/// 5 s and returning up to 100 events, 1,024 events queued per subscriber.
/// The block time does not delay [`Reader::close`].
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    start: Start,
    filter: TopicFilter,
    block: Duration,
    count: usize,
    queue: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        Self {
            start: Start::Newest,
            filter: TopicFilter::All,
            block: Duration::from_secs(5),
            count: 100,
            queue: 1024,
        }
    }
}

impl ReaderOptions {
    /// Where reading starts.
    #[must_use]
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Which topics pass.
    #[must_use]
    pub fn filter(mut self, filter: TopicFilter) -> Self {
        self.filter = filter;
        self
    }

    /// Longest a single `XREAD` blocks.
    #[must_use]
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// Events queued per subscriber before it lags.
    #[must_use]
    pub fn queue(mut self, events: usize) -> Self {
        self.queue = events;
        self
    }
}

/// What a reader's subscriber receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReaderEvent {
    /// The next event.
    Event(Event),
    /// The subscriber fell behind and missed events after `resume_after`
    /// (the id of the last event it received, or the reader's start).
    Lagged {
        /// Read again after this id to get what was missed.
        resume_after: String,
    },
}

/// Reads a stream for any number of subscribers.
#[derive(Debug)]
pub struct Reader {
    shared: Arc<ReaderShared>,
    token: CancellationToken,
    tasks: TaskTracker,
}

#[derive(Debug)]
struct ReaderShared {
    stream: Stream,
    options: ReaderOptions,
    cursor: Mutex<Option<String>>,
    subscribers: Mutex<Vec<Subscriber>>,
    started: AtomicBool,
}

#[derive(Debug)]
struct Subscriber {
    events: mpsc::Sender<ReaderEvent>,
    state: Arc<Mutex<SubscriberState>>,
}

/// Shared by a subscriber and the reading task.
#[derive(Debug)]
struct SubscriberState {
    /// The id of the last event queued for it.
    last_queued: String,
    lagged: bool,
}

/// A subscription to a [`Reader`].
#[derive(Debug)]
pub struct ReaderSubscription {
    events: mpsc::Receiver<ReaderEvent>,
    state: Arc<Mutex<SubscriberState>>,
}

impl ReaderSubscription {
    /// The next event; `None` once the reader is closed and the queue read.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<ReaderEvent> {
        if let Some(event) = self.try_recv() {
            return Some(event);
        }
        self.events.recv().await
    }

    /// The next event if one is queued already (or news that events were
    /// skipped), without waiting; `None` when none is. The end of the
    /// subscription is left for [`ReaderSubscription::recv`] to report.
    pub fn try_recv(&mut self) -> Option<ReaderEvent> {
        if let Ok(event) = self.events.try_recv() {
            return Some(event);
        }
        let mut state = lock(&self.state);
        if state.lagged {
            state.lagged = false;
            return Some(ReaderEvent::Lagged { resume_after: state.last_queued.clone() });
        }
        None
    }
}

impl Reader {
    pub(crate) async fn new(stream: Stream, options: ReaderOptions) -> Result<Self> {
        if options.queue == 0 || options.count == 0 {
            return Err(Error::InvalidOption("a reader's queue and count must be at least 1".into()));
        }
        let cursor = options.start.resolve(&stream).await.map_err(|source| Error::Redis {
            op: "find the start of a reader",
            stream: stream.name().to_owned(),
            source,
        })?;
        let shared = ReaderShared {
            stream,
            options,
            cursor: Mutex::new(Some(cursor)),
            subscribers: Mutex::new(Vec::new()),
            started: AtomicBool::new(false),
        };
        Ok(Self { shared: Arc::new(shared), token: CancellationToken::new(), tasks: TaskTracker::new() })
    }

    /// A new subscriber; the first one starts the reading.
    pub fn subscribe(&self) -> ReaderSubscription {
        let (tx, rx) = mpsc::channel(self.shared.options.queue);
        let start = lock(&self.shared.cursor).clone().unwrap_or_default();
        let state = Arc::new(Mutex::new(SubscriberState { last_queued: start, lagged: false }));
        lock(&self.shared.subscribers).push(Subscriber { events: tx, state: state.clone() });
        if !self.shared.started.swap(true, Ordering::AcqRel) && !self.token.is_cancelled() {
            let span = tracing::info_span!("streams.reader", stream = %self.shared.stream.name());
            self.tasks.spawn(read_loop(self.shared.clone(), self.token.clone()).instrument(span));
        }
        ReaderSubscription { events: rx, state }
    }

    /// Stops reading, promptly (an `XREAD` in flight is abandoned with its
    /// connection), and ends every subscription. Safe to call twice.
    ///
    /// # Cancel safety
    /// Cancel safe: the reader's task is cancelled first; a second call
    /// finishes waiting for it.
    pub async fn close(&self) {
        self.token.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        lock(&self.shared.subscribers).clear();
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Std mutexes held for list and field updates only, never across an await.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

async fn read_loop(shared: Arc<ReaderShared>, token: CancellationToken) {
    let stream = &shared.stream.inner;
    let mut backoff = Backoff::new();
    let mut conn = None;
    loop {
        let cursor = lock(&shared.cursor).clone().unwrap_or_else(|| "0-0".to_owned());
        let read = async {
            // A connection of its own: a blocked XREAD holds its connection,
            // and dropping it is what makes close prompt. A new connection
            // resets the backoff: it grows only while Redis is unreachable.
            let conn = match conn.as_mut() {
                Some(conn) => conn,
                None => {
                    let fresh = crate::blocking::connect(&stream.client, shared.options.block).await?;
                    backoff.reset();
                    conn.insert(fresh)
                }
            };
            redis::cmd("XREAD")
                .arg("COUNT")
                .arg(shared.options.count)
                .arg("BLOCK")
                .arg(u64::try_from(shared.options.block.as_millis()).unwrap_or(u64::MAX))
                .arg("STREAMS")
                .arg(&stream.keys.stream)
                .arg(&cursor)
                .query_async::<Option<StreamReadReply>>(conn)
                .await
        };
        let reply = tokio::select! {
            biased;
            () = token.cancelled() => return,
            reply = read => reply,
        };
        match reply {
            Ok(reply) => {
                backoff.reset();
                for entry in reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids) {
                    match Event::decode(&entry) {
                        Some(event) if shared.options.filter.accepts(&event) => deliver(&shared, event),
                        Some(_) => {}
                        None => tracing::warn!(id = %entry.id, "skipped a malformed stream entry"),
                    }
                    *lock(&shared.cursor) = Some(entry.id);
                }
            }
            Err(error) => {
                conn = None;
                tracing::debug!(error = %error, "read failed; retrying");
                if !backoff.wait(&token).await {
                    return;
                }
            }
        }
    }
}

/// Offers `event` to every subscriber without waiting.
fn deliver(shared: &ReaderShared, event: Event) {
    lock(&shared.subscribers).retain(|subscriber| {
        let mut state = lock(&subscriber.state);
        if state.lagged {
            return !subscriber.events.is_closed();
        }
        match subscriber.events.try_send(ReaderEvent::Event(event.clone())) {
            Ok(()) => {
                state.last_queued = event.id.clone();
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                state.lagged = true;
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    });
}
