//! [`Stream`]: add events, bound the length without losing any, destroy.

use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::keys::{StreamKeys, validate_name};
use crate::reader::{Reader, ReaderOptions};
use crate::scripts;
use crate::sink::{Sink, SinkOptions};

/// How a stream expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// Expires this long after it was created; adds do not extend it.
    Absolute(Duration),
    /// Expires this long after the last add.
    Sliding(Duration),
}

/// Options of [`Stream::open`].
///
/// Defaults:
/// - `hash_tag`: the stream's name (give the pool's name);
/// - `max_len`: none. With one, an add that finds the stream full first
///   trims what every consumer group has acknowledged (or, with no group,
///   the oldest entries) and is refused with [`Error::Full`] when nothing can
///   go: no event is dropped for another;
/// - `ttl`: none.
#[derive(Debug, Clone, Default)]
pub struct StreamOptions {
    hash_tag: Option<String>,
    max_len: usize,
    ttl: Option<Ttl>,
}

impl StreamOptions {
    /// The hash tag of the stream's keys.
    #[must_use]
    pub fn hash_tag(mut self, tag: impl Into<String>) -> Self {
        self.hash_tag = Some(tag.into());
        self
    }

    /// The most entries the stream keeps.
    #[must_use]
    pub fn max_len(mut self, entries: usize) -> Self {
        self.max_len = entries;
        self
    }

    /// A time to live for the stream.
    #[must_use]
    pub fn ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = Some(ttl);
        self
    }
}

/// A Redis stream of events. Cheap to clone.
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

pub(crate) struct StreamInner {
    pub(crate) name: String,
    pub(crate) keys: StreamKeys,
    pub(crate) client: pulse_redis::Redis,
    pub(crate) conn: pulse_redis::Shared,
    options: StreamOptions,
}

impl Stream {
    /// A handle on stream `name` of the Redis of `client`; the stream itself
    /// is created by the first add (or sink).
    ///
    /// # Errors
    /// [`Error::InvalidName`], or [`Error::Redis`] when Redis cannot be
    /// reached.
    ///
    /// # Cancel safety
    /// Cancel safe: it only connects.
    pub async fn open(client: &pulse_redis::Redis, name: &str, options: StreamOptions) -> Result<Self> {
        validate_name("stream name", name)?;
        let conn = client.shared().await.map_err(|source| Error::Redis {
            op: "connect",
            stream: name.to_owned(),
            source,
        })?;
        Self::open_on(client, conn, name, options)
    }

    /// [`Stream::open`] on `conn`, a shared connection of `client`'s: a
    /// process with many streams need not connect once for each (on a
    /// cluster, a connection is one per master).
    ///
    /// # Errors
    /// [`Error::InvalidName`].
    pub fn open_on(
        client: &pulse_redis::Redis,
        conn: pulse_redis::Shared,
        name: &str,
        options: StreamOptions,
    ) -> Result<Self> {
        validate_name("stream name", name)?;
        let tag = options.hash_tag.clone().unwrap_or_else(|| name.to_owned());
        validate_name("hash tag", &tag)?;
        let keys = StreamKeys::new(&tag, name);
        Ok(Self {
            inner: Arc::new(StreamInner {
                name: name.to_owned(),
                keys,
                client: client.clone(),
                conn,
                options,
            }),
        })
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Adds an event; returns its id.
    ///
    /// # Errors
    /// [`Error::Full`] when the stream is at its max length with nothing
    /// acknowledged to trim; [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the event is added even if the future is
    /// dropped.
    pub async fn add(&self, name: &str, payload: &[u8], topic: Option<&str>) -> Result<String> {
        let options = &self.inner.options;
        let (ttl_ms, mode) = match options.ttl {
            None => (0, "absolute"),
            Some(Ttl::Absolute(ttl)) => (ttl.as_millis().max(1), "absolute"),
            Some(Ttl::Sliding(ttl)) => (ttl.as_millis().max(1), "sliding"),
        };
        let mut conn = self.inner.conn.clone();
        let result: redis::RedisResult<String> = scripts::ADD
            .key(&self.inner.keys.stream)
            .arg(options.max_len)
            .arg(ttl_ms.to_string())
            .arg(mode)
            .arg(name)
            .arg(payload)
            .arg(topic.unwrap_or(""))
            .invoke_async(&mut conn)
            .await;
        result.map_err(|source| {
            if source.code() == Some("STREAMFULL") {
                Error::Full { stream: self.inner.name.clone(), max_len: options.max_len }
            } else {
                Error::Redis { op: "add an event", stream: self.inner.name.clone(), source }
            }
        })
    }

    /// How many entries the stream holds.
    ///
    /// # Errors
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn len(&self) -> Result<usize> {
        let mut conn = self.inner.conn.clone();
        redis::cmd("XLEN")
            .arg(&self.inner.keys.stream)
            .query_async(&mut conn)
            .await
            .map_err(|source| Error::Redis { op: "count events", stream: self.inner.name.clone(), source })
    }

    /// The newest `count` events, newest first (entries that do not decode
    /// are skipped).
    ///
    /// # Errors
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn latest(&self, count: usize) -> Result<Vec<crate::Event>> {
        let reply = self.newest(count).await.map_err(|source| Error::Redis {
            op: "read events",
            stream: self.inner.name.clone(),
            source,
        })?;
        // Each entry holds one event or more: `count` entries are enough.
        let mut events = Vec::new();
        for entry in &reply.ids {
            events.extend(crate::Event::from_entry(entry).into_iter().flatten().rev());
        }
        events.truncate(count);
        Ok(events)
    }

    /// The newest `count` entries as Redis answers them, newest first.
    async fn newest(&self, count: usize) -> redis::RedisResult<redis::streams::StreamRangeReply> {
        let mut conn = self.inner.conn.clone();
        redis::cmd("XREVRANGE")
            .arg(&self.inner.keys.stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await
    }

    /// Up to `count` events after id `after` (exclusive; `None`: from the
    /// oldest), oldest first, and the id to page on from (the last event
    /// returned, or the last entry read, malformed ones included), or
    /// `None` once nothing is left. Paging from the oldest to a bound read
    /// once gives every event up to it, however many are added meanwhile.
    ///
    /// # Errors
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn range(
        &self,
        after: Option<&str>,
        count: usize,
    ) -> Result<(Vec<crate::Event>, Option<String>)> {
        let mut conn = self.inner.conn.clone();
        // After one of the events that share an entry: that entry again.
        let start = match after {
            None => "-".to_owned(),
            Some(id) if id.contains('.') => crate::entry_of(id).to_owned(),
            Some(id) => format!("({id}"),
        };
        let count = count.max(1);
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(&self.inner.keys.stream)
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut conn)
            .await
            .map_err(|source| Error::Redis { op: "read events", stream: self.inner.name.clone(), source })?;
        let mut next = reply.ids.last().map(|entry| entry.id.clone());
        let mut events: Vec<crate::Event> = reply
            .ids
            .iter()
            .filter_map(crate::Event::from_entry)
            .flatten()
            .filter(|event| after.is_none_or(|after| crate::id_after(&event.id, after)))
            .collect();
        if events.len() > count {
            events.truncate(count);
            next = events.last().map(|event| event.id.clone());
        }
        Ok((events, next))
    }

    /// The id of the stream's last entry now (malformed or not), `None`
    /// when it is empty: a bound that takes in every event of that entry.
    ///
    /// # Errors
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn last_id(&self) -> Result<Option<String>> {
        self.last_entry_id().await.map_err(|source| Error::Redis {
            op: "read the last id",
            stream: self.inner.name.clone(),
            source,
        })
    }

    async fn last_entry_id(&self) -> redis::RedisResult<Option<String>> {
        Ok(self.newest(1).await?.ids.into_iter().next().map(|entry| entry.id))
    }

    /// Deletes the stream, its groups and their bookkeeping. Readers and
    /// sinks of it see no more events; a sink recreates its group if events
    /// are added again.
    ///
    /// # Errors
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
    pub async fn destroy(&self) -> Result<()> {
        let keys = &self.inner.keys;
        let mut conn = self.inner.conn.clone();
        let redis_error = |source| Error::Redis { op: "destroy", stream: self.inner.name.clone(), source };
        let groups: Vec<String> =
            redis::cmd("SMEMBERS").arg(&keys.groups).query_async(&mut conn).await.map_err(redis_error)?;
        let mut del = redis::cmd("DEL");
        del.arg(&keys.stream).arg(&keys.groups);
        for group in &groups {
            del.arg(keys.consumers(group));
        }
        del.exec_async(&mut conn).await.map_err(redis_error)
    }

    /// A reader of this stream: every reader sees every event.
    ///
    /// # Errors
    /// [`Error::Redis`] when the start position cannot be resolved.
    ///
    /// # Cancel safety
    /// Cancel safe: a reader started but not returned is closed when dropped.
    pub async fn reader(&self, options: ReaderOptions) -> Result<Reader> {
        Reader::new(self.clone(), options).await
    }

    /// A new consumer of the group `group` of this stream: each event goes
    /// to one consumer of the group.
    ///
    /// # Errors
    /// [`Error::InvalidName`], [`Error::InvalidOption`] or [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Not cancel safe: the consumer group may be created before it is
    /// dropped (harmless: a later sink of the group joins it).
    pub async fn sink(&self, group: &str, options: SinkOptions) -> Result<Sink> {
        Sink::join(self.clone(), group, options).await
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").field("name", &self.inner.name).finish_non_exhaustive()
    }
}

/// Where reading starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// From the first entry still in the stream.
    Oldest,
    /// From the events added after the reader (or group) was created.
    Newest,
    /// From the events after this id.
    After(String),
    /// From the events added at or after this time (ms since the Unix epoch).
    At(u64),
}

impl Start {
    /// The id to read after (`XREAD` semantics); `Newest` is resolved to
    /// the stream's last id now, so events added between two reads are
    /// never skipped (as a literal `$` would).
    pub(crate) async fn resolve(&self, stream: &Stream) -> redis::RedisResult<String> {
        Ok(match self {
            Start::Oldest => "0-0".to_owned(),
            Start::After(id) => id.clone(),
            Start::At(ms) => match ms.checked_sub(1) {
                Some(before) => format!("{before}-{}", u64::MAX),
                None => "0-0".to_owned(),
            },
            Start::Newest => stream.last_entry_id().await?.unwrap_or_else(|| "0-0".to_owned()),
        })
    }
}
