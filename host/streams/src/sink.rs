//! [`Sink`]: one consumer of a consumer group; each event of the stream
//! goes to one consumer of the group, and stays pending until acknowledged.
//!
//! Three things keep a group from losing or stranding events:
//! - every consumer heartbeats on Redis time; entries left unacknowledged
//!   longer than the grace period are claimed (`XAUTOCLAIM`) by a live
//!   consumer and delivered again;
//! - a consumer silent for two grace periods is removed, but only once it
//!   holds no pending entry (removing it would discard them);
//! - when the group is gone (`NOGROUP`: Redis restarted empty, the stream
//!   was flushed, someone ran `XGROUP DESTROY`), the sink creates it again,
//!   reading from the oldest entry still in the stream: events that were
//!   acknowledged before may come again, none is skipped.
//!
//! Events that share an entry (see [`Event`]) go to one consumer together,
//! and the entry is acknowledged once each of them is; claimed again, they
//! all come again. A consumer tracks which events of such an entry it has
//! not acknowledged yet, until the entry is no longer pending there (each
//! upkeep round asks Redis): another consumer that claimed it
//! acknowledges it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::streams::StreamPendingCountReply;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::event::{Event, TopicFilter};
use crate::keys::validate_name;
use crate::reply::{Entry, claimed_entries, query, unexpected};
use crate::scripts;
use crate::stream::{Start, Stream};

/// Options of [`Stream::sink`].
///
/// Defaults:
/// - `start`: [`Start::Newest`]: where a group that does not exist yet
///   starts (an existing group keeps its position);
/// - `ack_grace`: 20 s: how long an entry may stay unacknowledged before a
///   live consumer gets it again; consumers silent for twice that are
///   removed once they hold nothing;
/// - `filter`: every topic (events of other topics are acknowledged
///   unseen);
/// - `block` 5 s and `count` 100 per `XREADGROUP`; `queue` 256 events
///   between the reading task and [`Sink::recv`].
#[derive(Debug, Clone)]
pub struct SinkOptions {
    start: Start,
    ack_grace: Duration,
    filter: TopicFilter,
    block: Duration,
    count: usize,
    queue: usize,
}

impl Default for SinkOptions {
    fn default() -> Self {
        Self {
            start: Start::Newest,
            ack_grace: Duration::from_secs(20),
            filter: TopicFilter::All,
            block: Duration::from_secs(5),
            count: 100,
            queue: 256,
        }
    }
}

impl SinkOptions {
    /// Where a new group starts.
    #[must_use]
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// The grace period before an unacknowledged entry is delivered again.
    #[must_use]
    pub fn ack_grace(mut self, grace: Duration) -> Self {
        self.ack_grace = grace;
        self
    }

    /// Which topics are delivered.
    #[must_use]
    pub fn filter(mut self, filter: TopicFilter) -> Self {
        self.filter = filter;
        self
    }

    /// Longest a single `XREADGROUP` blocks.
    #[must_use]
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }
}

/// One consumer of a consumer group.
#[derive(Debug)]
pub struct Sink {
    shared: Arc<SinkShared>,
    events: mpsc::Receiver<Event>,
    token: CancellationToken,
    tasks: TaskTracker,
}

#[derive(Debug)]
struct SinkShared {
    stream: Stream,
    group: String,
    consumer: String,
    consumers_key: String,
    options: SinkOptions,
    /// The entries whose events were delivered here and are not all
    /// acknowledged, by entry id: the ids of those not acknowledged yet
    /// (only entries of several events are tracked).
    unacked: Mutex<HashMap<String, Vec<String>>>,
}

impl Sink {
    pub(crate) async fn join(stream: Stream, group: &str, options: SinkOptions) -> Result<Self> {
        validate_name("group name", group)?;
        if options.ack_grace < Duration::from_millis(10) || options.count == 0 || options.queue == 0 {
            return Err(Error::InvalidOption(
                "a sink's ack_grace must be at least 10 ms, its count and queue at least 1".into(),
            ));
        }
        let consumer = format!("{}-{:08x}", std::process::id(), fastrand::u32(..));
        let consumers_key = stream.inner.keys.consumers(group);
        let shared = Arc::new(SinkShared {
            stream,
            group: group.to_owned(),
            consumer,
            consumers_key,
            options,
            unacked: Mutex::default(),
        });
        // A group cannot start inside an entry: after one of the events
        // that share an entry, it starts at that entry.
        let start =
            shared.options.start.resolve(&shared.stream).await.map_err(|e| shared.error("join", e))?;
        let start = crate::read_after(&start);
        let mut conn = shared.stream.inner.conn.clone();
        shared.create_group(&mut conn, &start).await.map_err(|e| shared.error("create the group", e))?;
        shared.heartbeat(&mut conn).await.map_err(|e| shared.error("register the consumer", e))?;

        let (tx, rx) = mpsc::channel(shared.options.queue);
        let token = CancellationToken::new();
        let tasks = TaskTracker::new();
        let span = tracing::info_span!("streams.sink", stream = %shared.stream.name(), group, consumer = %shared.consumer);
        tasks.spawn(read_loop(shared.clone(), tx.clone(), token.clone()).instrument(span.clone()));
        tasks.spawn(upkeep_loop(shared.clone(), tx, token.clone()).instrument(span));
        tasks.close();
        Ok(Self { shared, events: rx, token, tasks })
    }

    /// This consumer's name in the group.
    pub fn consumer(&self) -> &str {
        &self.shared.consumer
    }

    /// The next event for this consumer; `None` once closed. Acknowledge it
    /// with [`Sink::ack`] when it is handled, or it is delivered again after
    /// the grace period (here or to another consumer).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn recv(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Acknowledges event `id`: the group will not deliver it again.
    ///
    /// # Errors
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
    pub async fn ack(&self, id: &str) -> Result<()> {
        let mut conn = self.shared.stream.inner.conn.clone();
        self.shared.ack(&mut conn, id).await.map_err(|e| self.shared.error("acknowledge an event", e))
    }

    /// Stops consuming, promptly. The consumer leaves the group if it holds
    /// no pending entry; otherwise it stays until live consumers have
    /// claimed its entries. Events already received but not acknowledged
    /// will be delivered again. Safe to call twice.
    ///
    /// # Cancel safety
    /// Cancel safe: the sink's task is cancelled first; a second call
    /// finishes waiting for it.
    pub async fn close(&mut self) {
        self.token.cancel();
        self.tasks.wait().await;
        self.events.close();
        let shared = &self.shared;
        let mut conn = shared.stream.inner.conn.clone();
        let left: redis::RedisResult<i64> = scripts::LEAVE
            .key(&shared.stream.inner.keys.stream)
            .key(&shared.consumers_key)
            .arg(&shared.group)
            .arg(&shared.consumer)
            .invoke_async(&mut conn)
            .await;
        if let Err(error) = left {
            tracing::warn!(error = %error, consumer = %shared.consumer, "failed to leave the group; it will be reaped");
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

impl SinkShared {
    fn error(&self, op: &'static str, source: redis::RedisError) -> Error {
        Error::Redis { op, stream: self.stream.name().to_owned(), source }
    }

    /// Creates the group (and the stream) unless it exists, and records it
    /// for [`Stream::destroy`].
    async fn create_group(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        start: &str,
    ) -> redis::RedisResult<()> {
        let keys = &self.stream.inner.keys;
        let created: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&keys.stream)
            .arg(&self.group)
            .arg(start)
            .arg("MKSTREAM")
            .exec_async(conn)
            .await;
        match created {
            Err(error) if error.code() != Some("BUSYGROUP") => return Err(error),
            _ => {}
        }
        redis::cmd("SADD").arg(&keys.groups).arg(&self.group).exec_async(conn).await
    }

    async fn heartbeat(&self, conn: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<()> {
        let _: u64 =
            scripts::HEARTBEAT.key(&self.consumers_key).arg(&self.consumer).invoke_async(conn).await?;
        Ok(())
    }

    /// Acknowledges event `id`: its entry, once every event of it
    /// delivered here is acknowledged.
    async fn ack(&self, conn: &mut impl redis::aio::ConnectionLike, id: &str) -> redis::RedisResult<()> {
        let entry = crate::entry_of(id);
        if entry != id {
            let mut unacked = self.tracked();
            if let Some(left) = unacked.get_mut(entry) {
                left.retain(|event| event != id);
                if !left.is_empty() {
                    return Ok(());
                }
                unacked.remove(entry);
            }
        }
        self.ack_entry(conn, entry).await
    }

    /// Forgets the shared entries tracked here that are no longer pending
    /// here: another consumer claimed them past the grace period, and
    /// acknowledging them is its part now. Without this, events delivered
    /// here and never acknowledged would be tracked for the sink's life.
    async fn forget_claimed(&self, conn: &mut impl redis::aio::ConnectionLike) -> redis::RedisResult<()> {
        /// Pending entries listed at most; a consumer holding more keeps
        /// its tracked entries until it holds fewer.
        const LISTED: usize = 10_000;
        let tracked: Vec<String> = self.tracked().keys().cloned().collect();
        if tracked.is_empty() {
            return Ok(());
        }
        let reply: StreamPendingCountReply = redis::cmd("XPENDING")
            .arg(&self.stream.inner.keys.stream)
            .arg(&self.group)
            .arg("-")
            .arg("+")
            .arg(LISTED)
            .arg(&self.consumer)
            .query_async(conn)
            .await?;
        if reply.ids.len() >= LISTED {
            return Ok(());
        }
        let pending: HashSet<&str> = reply.ids.iter().map(|pending| pending.id.as_str()).collect();
        // Only entries tracked before the listing: one admitted since is
        // pending here, whether or not the listing shows it.
        let mut unacked = self.tracked();
        for entry in tracked.iter().filter(|entry| !pending.contains(entry.as_str())) {
            unacked.remove(entry);
        }
        Ok(())
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<String>>> {
        self.unacked.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    async fn ack_entry(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        id: &str,
    ) -> redis::RedisResult<()> {
        redis::cmd("XACK").arg(&self.stream.inner.keys.stream).arg(&self.group).arg(id).exec_async(conn).await
    }

    /// Decodes and filters an entry; acknowledges it when nothing of it is
    /// to be delivered (malformed, or other topics) so it does not come
    /// back.
    async fn admit(&self, conn: &mut impl redis::aio::ConnectionLike, entry: &Entry) -> Vec<Event> {
        let events = match entry.events() {
            Some(events) => events.into_iter().filter(|event| self.options.filter.accepts(event)).collect(),
            None => {
                tracing::warn!(id = %entry.id, "acknowledged a malformed stream entry without delivering it");
                Vec::new()
            }
        };
        if events.is_empty() {
            if let Err(error) = self.ack_entry(conn, &entry.id).await {
                tracing::warn!(id = %entry.id, error = %error, "failed to acknowledge a skipped entry");
            }
        } else if events.len() > 1 || events[0].id != entry.id {
            let ids = events.iter().map(|event| event.id.clone()).collect();
            self.tracked().insert(entry.id.clone(), ids);
        }
        events
    }
}

/// Reads new entries for this consumer.
async fn read_loop(shared: Arc<SinkShared>, tx: mpsc::Sender<Event>, token: CancellationToken) {
    let mut backoff = Backoff::new();
    let mut conn: Option<pulse_redis::Dedicated> = None;
    loop {
        let read = async {
            // A connection of its own: a blocked XREADGROUP holds it, and
            // dropping it makes close prompt.
            let conn = match conn.as_mut() {
                Some(conn) => conn,
                None => {
                    // A new connection resets the backoff: it grows only
                    // while Redis is unreachable.
                    let fresh =
                        crate::blocking::connect(&shared.stream.inner.client, shared.options.block).await?;
                    backoff.reset();
                    conn.insert(fresh)
                }
            };
            let mut cmd = redis::cmd("XREADGROUP");
            cmd.arg("GROUP")
                .arg(&shared.group)
                .arg(&shared.consumer)
                .arg("COUNT")
                .arg(shared.options.count)
                .arg("BLOCK")
                .arg(u64::try_from(shared.options.block.as_millis()).unwrap_or(u64::MAX))
                .arg("STREAMS")
                .arg(&shared.stream.inner.keys.stream)
                .arg(">");
            query(cmd, conn, "unexpected XREADGROUP reply").await
        };
        let reply = tokio::select! {
            biased;
            () = token.cancelled() => return,
            reply = read => reply,
        };
        match reply {
            Ok(entries) => {
                backoff.reset();
                for entry in entries {
                    let mut ack_conn = shared.stream.inner.conn.clone();
                    for event in shared.admit(&mut ack_conn, &entry).await {
                        // Waits for room: the entry is pending in Redis until
                        // acknowledged, so an abandoned send loses nothing.
                        tokio::select! {
                            biased;
                            () = token.cancelled() => return,
                            sent = tx.send(event) => if sent.is_err() { return },
                        }
                    }
                }
            }
            Err(error) if error.code() == Some("NOGROUP") => {
                tracing::warn!("the consumer group is gone; creating it again from the oldest entry");
                let mut conn = shared.stream.inner.conn.clone();
                if let Err(error) = shared.create_group(&mut conn, "0").await {
                    tracing::warn!(error = %error, "failed to create the group again");
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

/// Heartbeats, claims entries left unacknowledged past the grace period,
/// and removes dead consumers that hold nothing: every quarter grace period.
async fn upkeep_loop(shared: Arc<SinkShared>, tx: mpsc::Sender<Event>, token: CancellationToken) {
    let period = shared.options.ack_grace / 4;
    loop {
        tokio::select! {
            biased;
            () = token.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        let mut conn = shared.stream.inner.conn.clone();
        if let Err(error) = shared.heartbeat(&mut conn).await {
            tracing::debug!(error = %error, "heartbeat failed");
            continue;
        }
        if let Err(error) = claim(&shared, &tx, &token, &mut conn).await {
            tracing::debug!(error = %error, "claiming idle entries failed");
        }
        if let Err(error) = shared.forget_claimed(&mut conn).await {
            tracing::debug!(error = %error, "listing this consumer's pending entries failed");
        }
        let dead_after = u64::try_from((shared.options.ack_grace * 2).as_millis()).unwrap_or(u64::MAX);
        let reaped: redis::RedisResult<Vec<String>> = scripts::REAP
            .key(&shared.stream.inner.keys.stream)
            .key(&shared.consumers_key)
            .arg(&shared.group)
            .arg(dead_after)
            .invoke_async(&mut conn)
            .await;
        match reaped {
            Ok(reaped) if !reaped.is_empty() => tracing::info!(consumers = ?reaped, "removed dead consumers"),
            Ok(_) => {}
            Err(error) => tracing::debug!(error = %error, "removing dead consumers failed"),
        }
    }
}

/// Claims every entry idle longer than the grace period for this consumer
/// and delivers it.
async fn claim(
    shared: &SinkShared,
    tx: &mpsc::Sender<Event>,
    token: &CancellationToken,
    conn: &mut pulse_redis::Shared,
) -> redis::RedisResult<()> {
    let grace = u64::try_from(shared.options.ack_grace.as_millis()).unwrap_or(u64::MAX);
    let mut cursor = "0-0".to_owned();
    loop {
        let reply: redis::Value = redis::cmd("XAUTOCLAIM")
            .arg(&shared.stream.inner.keys.stream)
            .arg(&shared.group)
            .arg(&shared.consumer)
            .arg(grace)
            .arg(&cursor)
            .arg("COUNT")
            .arg(100)
            .query_async(conn)
            .await?;
        let (next, claimed) =
            claimed_entries(reply).map_err(|what| unexpected("unexpected XAUTOCLAIM reply", what))?;
        for entry in &claimed {
            for event in shared.admit(conn, entry).await {
                tokio::select! {
                    biased;
                    () = token.cancelled() => return Ok(()),
                    sent = tx.send(event) => if sent.is_err() { return Ok(()) },
                }
            }
        }
        if next == "0-0" {
            return Ok(());
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a panic is the failure report")]

    use crate::{SinkOptions, Start, Stream, StreamOptions};

    /// A shared entry delivered here stays tracked while it is pending
    /// here, and is forgotten once another consumer claimed and
    /// acknowledged it.
    #[tokio::test]
    async fn a_shared_entry_another_consumer_took_is_no_longer_tracked() {
        let redis = pulse_redis::Redis::open(pulse_testkit::shared_redis_url()).unwrap();
        let name = format!("claimed_{:08x}", fastrand::u32(..));
        let stream = Stream::open(&redis, &name, StreamOptions::default()).await.unwrap();
        let key = stream.inner.keys.stream.clone();
        let mut batch = Vec::new();
        for payload in ["b0", "b1"] {
            pulse_rmap::push_netstring(&mut batch, b"k");
            pulse_rmap::push_netstring(&mut batch, payload.as_bytes());
        }
        let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
        let entry: String = redis::cmd("XADD")
            .arg(&key)
            .arg("*")
            .arg(&["n", "emit", "b"])
            .arg(batch)
            .arg(&["k", "2"])
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut sink = stream.sink("g", SinkOptions::default().start(Start::Oldest)).await.unwrap();
        let first = sink.recv().await.unwrap();
        let second = sink.recv().await.unwrap();
        assert_eq!((first.payload.as_slice(), second.payload.as_slice()), (&b"b0"[..], &b"b1"[..]));
        sink.ack(&first.id).await.unwrap();

        sink.shared.forget_claimed(&mut conn).await.unwrap();
        assert_eq!(sink.shared.tracked().get(&entry), Some(&vec![second.id.clone()]), "pending here");

        // What another consumer does past the grace period: claims the
        // entry, and acknowledges it once it handled both events.
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(&key)
            .arg("g")
            .arg("other")
            .arg(0)
            .arg(&entry)
            .arg("JUSTID")
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: u64 = redis::cmd("XACK").arg(&key).arg("g").arg(&entry).query_async(&mut conn).await.unwrap();
        sink.shared.forget_claimed(&mut conn).await.unwrap();
        assert!(sink.shared.tracked().is_empty(), "{:?}", sink.shared.tracked());

        sink.close().await;
        stream.destroy().await.unwrap();
    }
}
