//! [`Reader`]: every reader sees every event of its stream, in order.
//!
//! The reading task starts with the first subscription, so no event is
//! read before anyone can receive it. Each subscriber has a queue bounded
//! by events and by bytes. What happens when it is full is the reader's
//! [`Overflow`]: with [`Overflow::Lag`] a subscriber that falls behind does
//! not stall the others; it stops receiving, and once it has read what
//! was queued it gets [`ReaderEvent::Lagged`] with the id to resume after
//! (with a new reader from [`crate::Start::After`]). With
//! [`Overflow::Wait`] the reader stops reading until the subscriber made
//! room: what it has not read stays in the stream, and nothing is skipped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::event::{Event, TopicFilter};
use crate::reply::{Entry, query};
use crate::stream::{Start, Stream};

/// How a reader's `XREAD` reply of another shape is named in its error.
const XREAD_REPLY: &str = "unexpected XREAD reply";

/// Options of [`Stream::reader`].
///
/// Defaults: start [`Start::Newest`], every topic, `XREAD` blocking up to
/// 5 s and returning up to 100 events, 1,024 events and 16 MiB queued per
/// subscriber, [`Overflow::Lag`], no doorbell. The block time does not
/// delay [`Reader::close`].
#[derive(Debug, Clone)]
pub struct ReaderOptions {
    start: Start,
    filter: TopicFilter,
    block: Duration,
    count: usize,
    queue: usize,
    max_bytes: usize,
    overflow: Overflow,
    doorbell: bool,
    poll: Duration,
}

/// What a reader does when a subscriber's queue is full.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Overflow {
    /// Skips the subscriber until it has read its queue, then tells it
    /// ([`ReaderEvent::Lagged`]): one slow subscriber does not hold up the
    /// others.
    #[default]
    Lag,
    /// Stops reading until the subscriber has room: the stream keeps what
    /// is not read yet, and no event is skipped. For a reader whose
    /// subscribers must each see every event.
    Wait,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        Self {
            start: Start::Newest,
            filter: TopicFilter::All,
            block: Duration::from_secs(5),
            count: 100,
            queue: 1024,
            max_bytes: 16 << 20,
            overflow: Overflow::Lag,
            doorbell: false,
            poll: DOORBELL_POLL,
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

    /// Events queued per subscriber at most.
    #[must_use]
    pub fn queue(mut self, events: usize) -> Self {
        self.queue = events;
        self
    }

    /// Bytes queued per subscriber at most (each event counts its
    /// payload, name and id, and 64 more; one event larger than this
    /// counts as this), 1 to 4 GiB.
    #[must_use]
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// What a full queue does.
    #[must_use]
    pub fn overflow(mut self, overflow: Overflow) -> Self {
        self.overflow = overflow;
        self
    }

    /// On a cluster, take entries from the stream's doorbell (see
    /// [`pulse_redis::Doorbell`]) instead of blocking in `XREAD` on a
    /// connection of its own. For streams whose writers publish, in the
    /// script that adds entries, `SPUBLISH <stream key> <message>`: the
    /// netstring of the id of the stream's last entry before them
    /// (`0-0` for none), then for each entry the netstrings of its id,
    /// name and payload. The reader takes the entries when it has read up
    /// to that id, and otherwise reads the stream (what a writer that does
    /// not publish added is never skipped). It reads the stream, without
    /// blocking, on the shared connection, where the doorbell says
    /// messages may have been missed and at least every `poll`
    /// ([`DOORBELL_POLL`] by default, see [`ReaderOptions::poll`]): what a
    /// writer adds without publishing is read within `poll`. Elsewhere
    /// the reader blocks as without it.
    #[must_use]
    pub fn doorbell(mut self, doorbell: bool) -> Self {
        self.doorbell = doorbell;
        self
    }

    /// With a doorbell, how long the reader waits for a ring before it
    /// reads all the same.
    #[must_use]
    pub fn poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }
}

/// How long a reader with a doorbell waits for a ring before it reads all
/// the same, by default: the bound on how late a lost ring (a failover, a
/// slot moving) makes an entry.
pub const DOORBELL_POLL: Duration = Duration::from_secs(1);

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

#[derive(Debug, Clone)]
struct Subscriber {
    events: mpsc::Sender<(ReaderEvent, u32)>,
    /// The bytes its queue may still take.
    room: Arc<Semaphore>,
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
    events: mpsc::Receiver<(ReaderEvent, u32)>,
    room: Arc<Semaphore>,
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
        let (event, bytes) = self.events.recv().await?;
        self.room.add_permits(bytes as usize);
        Some(event)
    }

    /// The next event if one is queued already (or news that events were
    /// skipped), without waiting; `None` when none is. The end of the
    /// subscription is left for [`ReaderSubscription::recv`] to report.
    pub fn try_recv(&mut self) -> Option<ReaderEvent> {
        if let Ok((event, bytes)) = self.events.try_recv() {
            self.room.add_permits(bytes as usize);
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
        if options.max_bytes == 0 || u32::try_from(options.max_bytes).is_err() {
            return Err(Error::InvalidOption(format!(
                "a reader's max_bytes is {}: allowed are 1 to {} (4 GiB)",
                options.max_bytes,
                u32::MAX
            )));
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
        let room = Arc::new(Semaphore::new(self.shared.options.max_bytes));
        lock(&self.shared.subscribers).push(Subscriber {
            events: tx,
            room: room.clone(),
            state: state.clone(),
        });
        if !self.shared.started.swap(true, Ordering::AcqRel) && !self.token.is_cancelled() {
            let span = tracing::info_span!("streams.reader", stream = %self.shared.stream.name());
            self.tasks.spawn(read_loop(self.shared.clone(), self.token.clone()).instrument(span));
        }
        ReaderSubscription { events: rx, room, state }
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
    if shared.options.doorbell {
        match doorbell(&shared, &token).await {
            Some(Some(bell)) => return read_when_rung(&shared, &bell, &token).await,
            Some(None) => {}
            None => return,
        }
    }
    read_blocking(&shared, &token).await;
}

/// The stream's doorbell, subscribed: `Some(None)` where Redis is not a
/// cluster, `None` once the reader is closed.
async fn doorbell(shared: &ReaderShared, token: &CancellationToken) -> Option<Option<pulse_redis::Doorbell>> {
    let stream = &shared.stream.inner;
    let mut backoff = Backoff::new();
    loop {
        let bell = tokio::select! {
            biased;
            () = token.cancelled() => return None,
            bell = stream.client.doorbell(&stream.keys.stream) => bell,
        };
        match bell {
            Ok(bell) => return Some(bell),
            Err(error) => {
                tracing::debug!(error = %error, "failed to subscribe the doorbell; retrying");
                if !backoff.wait(token).await {
                    return None;
                }
            }
        }
    }
}

/// Takes the entries each message of `bell` brings; reads the stream
/// (without blocking, on the shared connection) at the start, where the
/// doorbell says messages may have been missed, for a message without
/// entries, and every `poll` without a ring.
async fn read_when_rung(shared: &ReaderShared, bell: &pulse_redis::Doorbell, token: &CancellationToken) {
    let stream = &shared.stream.inner;
    let mut backoff = Backoff::new();
    let mut conn = stream.conn.clone();
    // The bell listens already: what is added after this first read rings.
    let mut must_read = true;
    loop {
        if must_read {
            let cmd = xread(shared, None);
            let read = query(cmd, &mut conn, XREAD_REPLY);
            let reply = tokio::select! {
                biased;
                () = token.cancelled() => return,
                reply = read => reply,
            };
            match reply {
                Ok(reply) => {
                    backoff.reset();
                    let Some(read) = take(shared, reply, token).await else { return };
                    must_read = read >= shared.options.count;
                }
                Err(error) => {
                    tracing::debug!(error = %error, "read failed; retrying");
                    if !backoff.wait(token).await {
                        return;
                    }
                }
            }
            continue;
        }
        let ring = tokio::select! {
            biased;
            () = token.cancelled() => return,
            ring = bell.next() => Some(ring),
            () = tokio::time::sleep(shared.options.poll) => None,
        };
        must_read = match ring {
            Some(pulse_redis::Ring::Message(message)) => match decode_ring(&message) {
                // The entries follow what the reader has read: taken.
                Some((prev, entries)) if !after_cursor(shared, &prev) => {
                    if !take_rung(shared, entries, token).await {
                        return;
                    }
                    false
                }
                // Something before them is unread (added by a writer that
                // does not ring, or announced by a ring that was lost),
                // or a ring this version cannot read: the stream has it
                // all.
                _ => true,
            },
            Some(pulse_redis::Ring::Missed) | None => true,
        };
    }
}

/// What a ring brings: the id of the entry before its entries, and its
/// entries, each as the netstrings of its id, name and payload (see the
/// pool's `ring` in lua/prelude.lua); `None` when malformed.
fn decode_ring(message: &[u8]) -> Option<(String, Vec<Event>)> {
    let fields = pulse_rmap::netstrings(message)?;
    if fields.len() % 3 != 1 {
        return None;
    }
    let prev = String::from_utf8(fields[0].to_vec()).ok()?;
    let entries = fields[1..]
        .chunks(3)
        .map(|entry| {
            Some(Event {
                id: String::from_utf8(entry[0].to_vec()).ok()?,
                name: String::from_utf8(entry[1].to_vec()).ok()?,
                topic: None,
                payload: entry[2].to_vec(),
            })
        })
        .collect::<Option<Vec<Event>>>()?;
    Some((prev, entries))
}

/// Whether event id `id` comes after the last one the reader read.
fn after_cursor(shared: &ReaderShared, id: &str) -> bool {
    lock(&shared.cursor).as_deref().is_none_or(|cursor| crate::id_after(id, cursor))
}

/// Delivers the entries a ring brought that come after the cursor, and
/// moves it past them; false once the reader is closed.
async fn take_rung(shared: &ReaderShared, entries: Vec<Event>, token: &CancellationToken) -> bool {
    for event in entries {
        // One that is not was read already, by a read before the ring.
        if after_cursor(shared, &event.id) && !offer(shared, event, token).await {
            return false;
        }
    }
    true
}

/// Hands `event` to the subscribers if it passes the filter, as the
/// reader's [`Overflow`] says, and moves the cursor past it (to the
/// event's id: within its entry, if it shares one); false once the reader
/// is closed.
async fn offer(shared: &ReaderShared, event: Event, token: &CancellationToken) -> bool {
    let id = event.id.clone();
    if shared.options.filter.accepts(&event) {
        if shared.options.overflow == Overflow::Wait {
            if !deliver_waiting(shared, event, token).await {
                return false;
            }
        } else {
            deliver(shared, event);
        }
    }
    *lock(&shared.cursor) = Some(id);
    true
}

/// Reads with `XREAD BLOCK` on a connection of its own.
async fn read_blocking(shared: &ReaderShared, token: &CancellationToken) {
    let stream = &shared.stream.inner;
    let mut backoff = Backoff::new();
    let mut conn = None;
    loop {
        let cmd = xread(shared, Some(shared.options.block));
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
            query(cmd, conn, XREAD_REPLY).await
        };
        let reply = tokio::select! {
            biased;
            () = token.cancelled() => return,
            reply = read => reply,
        };
        match reply {
            Ok(reply) => {
                backoff.reset();
                if take(shared, reply, token).await.is_none() {
                    return;
                }
            }
            Err(error) => {
                conn = None;
                tracing::debug!(error = %error, "read failed; retrying");
                if !backoff.wait(token).await {
                    return;
                }
            }
        }
    }
}

/// `XREAD` of what follows the cursor, blocking up to `block` if given.
fn xread(shared: &ReaderShared, block: Option<Duration>) -> redis::Cmd {
    let cursor = lock(&shared.cursor).as_deref().map_or_else(|| "0-0".to_owned(), crate::read_after);
    let mut cmd = redis::cmd("XREAD");
    cmd.arg("COUNT").arg(shared.options.count);
    if let Some(block) = block {
        cmd.arg("BLOCK").arg(u64::try_from(block.as_millis()).unwrap_or(u64::MAX));
    }
    cmd.arg("STREAMS").arg(&shared.stream.inner.keys.stream).arg(cursor);
    cmd
}

/// Delivers the entries read and moves the cursor past them: how many
/// entries there were, or `None` once the reader is closed.
async fn take(shared: &ReaderShared, entries: Vec<Entry>, token: &CancellationToken) -> Option<usize> {
    let read = entries.len();
    for entry in entries {
        match entry.events() {
            Some(events) => {
                for event in events {
                    // Not after the cursor: an event of a shared entry
                    // taken before the entry was read again.
                    if after_cursor(shared, &event.id) && !offer(shared, event, token).await {
                        return None;
                    }
                }
            }
            None => tracing::warn!(id = %entry.id, "skipped a malformed stream entry"),
        }
        *lock(&shared.cursor) = Some(entry.id);
    }
    Some(read)
}

/// What `event` takes of a subscriber's bytes: its payload, name and id
/// and 64 more, at most the whole of them (`max_bytes`, which fits a u32).
fn cost(event: &Event, max_bytes: usize) -> u32 {
    let bytes = event.payload.len() + event.name.len() + event.id.len() + 64;
    u32::try_from(bytes.min(max_bytes)).unwrap_or(u32::MAX)
}

/// Offers `event` to every subscriber without waiting ([`Overflow::Lag`]).
fn deliver(shared: &ReaderShared, event: Event) {
    let bytes = cost(&event, shared.options.max_bytes);
    lock(&shared.subscribers).retain(|subscriber| {
        let mut state = lock(&subscriber.state);
        if state.lagged {
            return !subscriber.events.is_closed();
        }
        let Ok(room) = subscriber.room.try_acquire_many(bytes) else {
            state.lagged = true;
            return true;
        };
        match subscriber.events.try_send((ReaderEvent::Event(event.clone()), bytes)) {
            Ok(()) => {
                room.forget();
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

/// Queues `event` for every subscriber, waiting for each to have room
/// ([`Overflow::Wait`]). False when the reader closed meanwhile.
async fn deliver_waiting(shared: &ReaderShared, event: Event, token: &CancellationToken) -> bool {
    let bytes = cost(&event, shared.options.max_bytes);
    let subscribers: Vec<Subscriber> = lock(&shared.subscribers).clone();
    let mut gone = false;
    for subscriber in subscribers {
        let queued = async {
            let room = subscriber.room.acquire_many(bytes).await.ok()?;
            subscriber.events.send((ReaderEvent::Event(event.clone()), bytes)).await.ok()?;
            room.forget();
            Some(())
        };
        tokio::select! {
            biased;
            () = token.cancelled() => return false,
            queued = queued => match queued {
                Some(()) => lock(&subscriber.state).last_queued.clone_from(&event.id),
                None => gone = true,
            },
        }
    }
    if gone {
        lock(&shared.subscribers).retain(|subscriber| !subscriber.events.is_closed());
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_brings_the_id_before_it_and_its_entries() {
        let (prev, entries) = decode_ring(b"3:1-0,3:2-0,5:start,2:ab,3:3-0,6:notify,0:,").unwrap();
        assert_eq!(prev, "1-0");
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["2-0", "3-0"]);
        assert_eq!((entries[0].name.as_str(), entries[0].payload.as_slice()), ("start", &b"ab"[..]));
        assert_eq!((entries[1].name.as_str(), entries[1].payload.as_slice()), ("notify", &b""[..]));
        for malformed in [&b""[..], b"3:1-0,3:2-0,", b"3:1-0,3:2-0,5:start,9:ab,", b"3:1-0;", b"x:1-0,"] {
            assert_eq!(decode_ring(malformed), None, "{}", String::from_utf8_lossy(malformed));
        }
    }
}
