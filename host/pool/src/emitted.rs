//! What a pool's jobs emitted ([`crate::JobContext::emit`]), read back: the
//! newest events, every event up to now page by page, and new ones as they
//! come. The pool offers this so that its callers (the HTTP API, the
//! command line) never name the stream the events live in.

use pulse_streams::{
    Event, Reader, ReaderEvent, ReaderOptions, ReaderSubscription, Start, Stream, StreamOptions, id_after,
    id_order, is_event_id,
};

use crate::error::Result;
use crate::keys::{EVENTS_STREAM, validate_pool};

/// One event a job emitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// Its id: `<ms>-<seq>.<index>` (events written together share a
    /// stream entry, `<ms>-<seq>`; an earlier version wrote one entry per
    /// event, whose id is the entry's), unique and increasing in the pool;
    /// in a pool of several slot groups followed by `@<group>`, unique in
    /// the pool and increasing in its group.
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
        let keys = crate::keys::PoolKeys::new(pool);
        let conn = client.shared().await.map_err(keys.redis_error("connect"))?;
        let groups = crate::core::pool_layout(&conn, &keys).await?.map_or(1, |(_, groups)| groups);
        let mut others = Vec::new();
        for group in 1..groups {
            let tag = crate::keys::group_tag(pool, group, groups);
            others.push(Stream::open(client, EVENTS_STREAM, StreamOptions::default().hash_tag(tag)).await?);
        }
        Ok(Self { pool: pool.to_owned(), stream, others })
    }

    /// Every slot group's stream, group 0's first.
    fn streams(&self) -> impl Iterator<Item = &Stream> {
        std::iter::once(&self.stream).chain(&self.others)
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
        if self.others.is_empty() {
            return Ok(self.stream.latest(limit).await?.into_iter().map(Emitted::from).collect());
        }
        let mut events = Vec::new();
        for (group, stream) in self.streams().enumerate() {
            events.extend(stream.latest(limit).await?.into_iter().map(|event| in_group(event, group)));
        }
        events.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| b.id.cmp(&a.id)));
        events.truncate(limit);
        Ok(events)
    }

    /// The id of the newest event now, `None` when there is none: the
    /// bound for reading every event up to now with [`EmittedEvents::page`].
    /// For a pool of several slot groups it is a position: each group's
    /// newest id, in group order, joined by `,`.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn newest_id(&self) -> Result<Option<String>> {
        if self.others.is_empty() {
            return Ok(self.stream.last_id().await?);
        }
        let mut ids = Vec::new();
        for stream in self.streams() {
            ids.push(stream.last_id().await?);
        }
        if ids.iter().all(Option::is_none) {
            return Ok(None);
        }
        Ok(Some(
            ids.into_iter().map(|id| id.unwrap_or_else(|| START.to_owned())).collect::<Vec<_>>().join(","),
        ))
    }

    /// Up to `limit` events after id `after` (`None`: from the oldest),
    /// oldest first, and the id to read on from (`None` once nothing is
    /// left). For a pool of several slot groups, `after` and the id
    /// returned are positions (see [`EmittedEvents::newest_id`]), and the
    /// groups' events are merged by their ids' times.
    ///
    /// # Errors
    /// Redis failures; [`crate::Error::InvalidEventId`] for a position
    /// that is not one of this pool's.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn page(&self, after: Option<&str>, limit: usize) -> Result<(Vec<Emitted>, Option<String>)> {
        if self.others.is_empty() {
            let (events, next) = self.stream.range(after, limit).await?;
            return Ok((events.into_iter().map(Emitted::from).collect(), next));
        }
        let mut position = self.position(after)?;
        // Each group's next `limit`, merged; the first `limit` taken.
        let mut read: Vec<((u64, u64, u64), usize, Event)> = Vec::new();
        // Per group: where its read ended, and how many of its events are
        // not taken yet.
        let mut ends: Vec<(Option<String>, usize)> = Vec::new();
        for (group, stream) in self.streams().enumerate() {
            let (events, next) = stream.range(Some(&position[group]), limit).await?;
            ends.push((next, events.len()));
            read.extend(events.into_iter().map(|event| (id_order(&event.id), group, event)));
        }
        read.sort_by_key(|(order, group, _)| (*order, *group));
        let more = read.len() > limit || ends.iter().any(|(next, _)| next.is_some());
        let mut page = Vec::new();
        for (_, group, event) in read.into_iter().take(limit) {
            position[group].clone_from(&event.id);
            ends[group].1 -= 1;
            page.push(in_group(event, group));
        }
        // A group whose events were all taken goes on from where its read
        // ended: past the rest of an entry shared by several events, and
        // past entries that do not decode.
        for (group, (next, left)) in ends.into_iter().enumerate() {
            if let (Some(next), 0) = (next, left) {
                position[group] = next;
            }
        }
        Ok((page, more.then(|| position.join(","))))
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
        if self.others.is_empty() {
            events.retain(|event| !id_after(&event.id, bound));
            return Ok((events, next.filter(|next| id_after(bound, next))));
        }
        let bound = self.position(Some(bound))?;
        events.retain(|event| {
            let (id, group) = event.id.rsplit_once('@').unwrap_or((&event.id, "0"));
            group.parse::<usize>().is_ok_and(|group| !id_after(id, &bound[group]))
        });
        let before_bound = |next: &String| {
            self.position(Some(next))
                .is_ok_and(|at| at.iter().zip(&bound).any(|(at, bound)| id_after(bound, at)))
        };
        Ok((events, next.filter(before_bound)))
    }

    /// Follows the events emitted after id `after` (`None`: from the
    /// oldest; a position for a pool of several slot groups).
    ///
    /// # Errors
    /// Redis failures; [`crate::Error::InvalidEventId`].
    ///
    /// # Cancel safety
    /// Cancel safe: a reader that was started is closed when dropped.
    pub async fn follow(&self, after: Option<String>) -> Result<Following> {
        if self.others.is_empty() {
            let start = after.map_or(Start::Oldest, Start::After);
            let reader = self.stream.reader(ReaderOptions::default().start(start)).await?;
            let events = vec![reader.subscribe()];
            return Ok(Following { readers: vec![reader], events, grouped: false });
        }
        let position = self.position(after.as_deref())?;
        let (mut readers, mut events) = (Vec::new(), Vec::new());
        for (stream, after) in self.streams().zip(position) {
            let reader = stream.reader(ReaderOptions::default().start(Start::After(after))).await?;
            events.push(reader.subscribe());
            readers.push(reader);
        }
        Ok(Following { readers, events, grouped: true })
    }

    /// The ids of position `after` (`None`: the start of every group).
    fn position(&self, after: Option<&str>) -> Result<Vec<String>> {
        let groups = self.others.len() + 1;
        let Some(after) = after else { return Ok(vec![START.to_owned(); groups]) };
        let ids: Vec<String> = after.split(',').map(str::to_owned).collect();
        if ids.len() != groups || !ids.iter().all(|id| is_event_id(id)) {
            return Err(crate::Error::InvalidEventId {
                pool: self.pool.clone(),
                id: after.to_owned(),
                groups,
            });
        }
        Ok(ids)
    }
}

/// Before every id: where a group's stream is read from the start.
const START: &str = "0-0";

/// An event of slot group `group`'s stream: its id says the group
/// (`<id>@<group>`), since ids repeat across streams.
fn in_group(event: Event, group: usize) -> Emitted {
    let mut emitted = Emitted::from(event);
    emitted.id = format!("{}@{group}", emitted.id);
    emitted
}

/// New events as they are emitted ([`EmittedEvents::follow`]).
#[derive(Debug)]
pub struct Following {
    readers: Vec<Reader>,
    /// One subscription per slot group's stream.
    events: Vec<ReaderSubscription>,
    /// Whether the ids say their group (a pool of several groups).
    grouped: bool,
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
        let (event, group) = match self.events.as_mut_slice() {
            [one] => (one.recv().await?, 0),
            many => {
                let next = many.iter_mut().map(|events| Box::pin(events.recv()));
                let (event, group, _) = futures_util::future::select_all(next).await;
                (event?, group)
            }
        };
        Some(match (event, self.grouped) {
            (ReaderEvent::Event(event), false) => Followed::Event(event.into()),
            (ReaderEvent::Event(event), true) => Followed::Event(in_group(event, group)),
            (ReaderEvent::Lagged { resume_after }, false) => Followed::Lagged { resume_after },
            (ReaderEvent::Lagged { resume_after }, true) => {
                Followed::Lagged { resume_after: format!("{resume_after}@{group}") }
            }
        })
    }

    /// Stops reading.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn close(self) {
        for reader in self.readers {
            reader.close().await;
        }
    }
}
