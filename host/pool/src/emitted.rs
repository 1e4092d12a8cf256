//! What a pool's jobs emitted ([`crate::JobContext::emit`]), read back: the
//! newest events, every event up to now page by page, and new ones as they
//! come. The pool offers this so that its callers (the HTTP API, the
//! command line) never name the stream the events live in.

use pulse_streams::{
    Event, Reader, ReaderEvent, ReaderOptions, ReaderSubscription, Start, Stream, StreamOptions, id_after,
};

use crate::error::Result;
use crate::keys::{EVENTS_STREAM, validate_pool};

/// One event a job emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// Its id: `<ms>-<seq>`, unique and increasing in the pool.
    pub id: String,
    /// The key of the job that emitted it.
    pub key: String,
    /// Its name, as the job gave it.
    pub name: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// When Redis stored it, in ms since the Unix epoch.
    pub created_at_ms: u64,
}

impl From<Event> for Emitted {
    fn from(event: Event) -> Self {
        Self {
            created_at_ms: event.created_at_ms(),
            id: event.id,
            key: event.topic.unwrap_or_default(),
            name: event.name,
            payload: event.payload,
        }
    }
}

/// A pool's emitted events (a cheap handle: one connection manager).
#[derive(Debug, Clone)]
pub struct EmittedEvents {
    pool: String,
    /// Group 0's stream: the pool's, when it has one slot group.
    stream: Stream,
    /// The streams of the pool's other slot groups (each group's jobs
    /// emit to a stream of its own).
    others: Vec<Stream>,
}

impl EmittedEvents {
    /// The emitted events of pool `pool` on the Redis of `client`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidPool`]; Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only connects.
    pub async fn open(client: &pulse_redis::Redis, pool: &str) -> Result<Self> {
        validate_pool(pool)?;
        let stream = Stream::open(client, EVENTS_STREAM, StreamOptions::default().hash_tag(pool)).await?;
        let groups = crate::node::PoolView::open(client, pool).await?.slot_groups();
        let mut others = Vec::new();
        for group in 1..groups {
            let tag = crate::keys::group_tag(pool, group, groups);
            others.push(Stream::open(client, EVENTS_STREAM, StreamOptions::default().hash_tag(tag)).await?);
        }
        Ok(Self { pool: pool.to_owned(), stream, others })
    }

    /// Refuses what reads one stream in id order, for a pool of several
    /// slot groups (whose events are in one stream per group).
    fn one_stream(&self) -> Result<&Stream> {
        match self.others.is_empty() {
            true => Ok(&self.stream),
            false => Err(crate::Error::GroupedEvents(self.pool.clone())),
        }
    }

    /// The newest `limit` events, newest first (by the time Redis stored
    /// them, across slot groups).
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn newest(&self, limit: usize) -> Result<Vec<Emitted>> {
        let mut events: Vec<Emitted> =
            self.stream.latest(limit).await?.into_iter().map(Emitted::from).collect();
        if self.others.is_empty() {
            return Ok(events);
        }
        for stream in &self.others {
            events.extend(stream.latest(limit).await?.into_iter().map(Emitted::from));
        }
        events.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| b.id.cmp(&a.id)));
        events.truncate(limit);
        Ok(events)
    }

    /// The id of the newest event now, `None` when there is none: the
    /// bound for reading every event up to now with [`EmittedEvents::page`].
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn newest_id(&self) -> Result<Option<String>> {
        Ok(self.one_stream()?.last_id().await?)
    }

    /// Up to `limit` events after id `after` (`None`: from the oldest),
    /// oldest first, and the id to read on from (`None` once nothing is
    /// left).
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn page(&self, after: Option<&str>, limit: usize) -> Result<(Vec<Emitted>, Option<String>)> {
        let (events, next) = self.one_stream()?.range(after, limit).await?;
        Ok((events.into_iter().map(Emitted::from).collect(), next))
    }

    /// [`EmittedEvents::page`], up to id `bound` (inclusive): the next id
    /// is `None` once the bound is reached. Paging from the oldest to a
    /// bound read once ([`EmittedEvents::newest_id`]) gives every event up
    /// to it, however many are emitted meanwhile.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn page_until(
        &self,
        after: Option<&str>,
        bound: &str,
        limit: usize,
    ) -> Result<(Vec<Emitted>, Option<String>)> {
        let (mut events, next) = self.page(after, limit).await?;
        events.retain(|event| !id_after(&event.id, bound));
        Ok((events, next.filter(|next| id_after(bound, next))))
    }

    /// Follows the events emitted after id `after` (`None`: from the
    /// oldest).
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: a reader that was started is closed when dropped.
    pub async fn follow(&self, after: Option<String>) -> Result<Following> {
        let start = after.map_or(Start::Oldest, Start::After);
        let reader = self.one_stream()?.reader(ReaderOptions::default().start(start)).await?;
        let events = reader.subscribe();
        Ok(Following { reader, events })
    }
}

/// New events as they are emitted ([`EmittedEvents::follow`]).
#[derive(Debug)]
pub struct Following {
    reader: Reader,
    events: ReaderSubscription,
}

/// What following the events yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// The next event.
    Event(Emitted),
    /// The follower fell behind: events after `resume_after` were skipped.
    Lagged {
        /// The id to read on from ([`EmittedEvents::page`]) for what was
        /// skipped.
        resume_after: String,
    },
}

impl Following {
    /// The next event; `None` once the reader ended.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is taken from the queue only when returned.
    pub async fn recv(&mut self) -> Option<Followed> {
        Some(match self.events.recv().await? {
            ReaderEvent::Event(event) => Followed::Event(event.into()),
            ReaderEvent::Lagged { resume_after } => Followed::Lagged { resume_after },
        })
    }

    /// Stops reading.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn close(self) {
        self.reader.close().await;
    }
}
