//! [`Map`]: join, local reads, atomic writes, subscriptions.

mod writes;

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::codec::decode_list;
use crate::error::{Error, Result};
use crate::keys::{MapKeys, validate_name};
use crate::listener;
use crate::replica::{Position, Replica};
use crate::subscription::{Subscribers, Subscription};

/// How a map's hash expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// Expires this long after it was created; writes do not extend it.
    Absolute(Duration),
    /// Expires this long after the last write.
    Sliding(Duration),
}

/// Options of [`Map::join`].
///
/// Defaults:
/// - `hash_tag`: the map's name (give the pool's name, so the map shares
///   the pool's Redis Cluster slot);
/// - `ttl`: none;
/// - `subscriber_queue`: 64 events per subscriber before it lags.
#[derive(Debug, Clone)]
pub struct MapOptions {
    hash_tag: Option<String>,
    ttl: Option<Ttl>,
    subscriber_queue: usize,
}

impl Default for MapOptions {
    fn default() -> Self {
        Self { hash_tag: None, ttl: None, subscriber_queue: 64 }
    }
}

impl MapOptions {
    /// The hash tag of the map's keys.
    #[must_use]
    pub fn hash_tag(mut self, tag: impl Into<String>) -> Self {
        self.hash_tag = Some(tag.into());
        self
    }

    /// A time to live for the whole map.
    #[must_use]
    pub fn ttl(mut self, ttl: Ttl) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Events queued per subscriber before it lags.
    #[must_use]
    pub fn subscriber_queue(mut self, events: usize) -> Self {
        self.subscriber_queue = events;
        self
    }
}

/// The outcome of a conditional write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swap {
    /// The value before the operation.
    pub previous: Option<String>,
    /// Whether the condition held and the write happened.
    pub done: bool,
}

/// A replicated map: a Redis hash mirrored in memory, read locally and
/// written through atomic scripts whose changes every replica applies in
/// revision order. Cheap to clone; the replica stops following Redis when
/// the last clone is dropped or [`Map::close`] is called.
#[derive(Clone)]
pub struct Map {
    shared: Arc<Shared>,
    handle: Arc<Handle>,
}

/// State shared with the listener task.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) keys: MapKeys,
    pub(crate) client: pulse_redis::Redis,
    pub(crate) conn: pulse_redis::Shared,
    ttl: Option<Ttl>,
    replica: RwLock<Replica>,
    pub(crate) position: watch::Sender<Position>,
    pub(crate) subscribers: Subscribers,
}

/// Owns the listener: cancels it when the last [`Map`] clone goes.
struct Handle {
    token: CancellationToken,
    tasks: TaskTracker,
    _cancel_on_drop: DropGuard,
}

impl Map {
    /// The content of map `name` as Redis holds it now, read once: one
    /// `HGETALL`, no replica, no subscription. For short-lived readers (a
    /// command-line listing) that would pay more to join than to read.
    ///
    /// # Errors
    /// [`Error::InvalidName`]; [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn read_once<C>(
        conn: &mut C,
        name: &str,
        options: &MapOptions,
    ) -> Result<HashMap<String, String>>
    where
        C: redis::aio::ConnectionLike + Send,
    {
        validate_name("map name", name)?;
        let tag = options.hash_tag.clone().unwrap_or_else(|| name.to_owned());
        validate_name("hash tag", &tag)?;
        let mut fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(MapKeys::new(&tag, name).hash)
            .query_async(conn)
            .await
            .map_err(|source| Error::Redis { op: "read", map: name.to_owned(), source })?;
        fields.retain(|key, _| !key.starts_with('='));
        Ok(fields)
    }

    /// Joins the map `name` on the Redis of `client`: subscribes to its
    /// changes, then loads it, so no change is missed between the two.
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a bad name or hash tag; [`Error::Redis`]
    /// when Redis cannot be reached.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves nothing behind.
    pub async fn join(client: &pulse_redis::Redis, name: &str, options: MapOptions) -> Result<Self> {
        validate_name("map name", name)?;
        let tag = options.hash_tag.clone().unwrap_or_else(|| name.to_owned());
        validate_name("hash tag", &tag)?;
        let redis_error = |source| Error::Redis { op: "join", map: name.to_owned(), source };
        let conn = client.shared().await.map_err(redis_error)?;
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            keys: MapKeys::new(&tag, name),
            client: client.clone(),
            conn,
            ttl: options.ttl,
            replica: RwLock::new(Replica::default()),
            position: watch::Sender::new(Position::default()),
            subscribers: Subscribers::new(options.subscriber_queue),
        });
        let stream = listener::subscribe(&shared).await.map_err(redis_error)?;
        let fields = listener::snapshot(&shared).await.map_err(redis_error)?;
        shared.load(fields);

        let token = CancellationToken::new();
        let tasks = TaskTracker::new();
        let span = tracing::info_span!("rmap.listener", map = %name);
        tasks.spawn(listener::listen(shared.clone(), stream, token.clone()).instrument(span));
        tasks.close();
        tracing::debug!(map = %name, "joined");
        let handle = Handle { _cancel_on_drop: token.clone().drop_guard(), token, tasks };
        Ok(Self { shared, handle: Arc::new(handle) })
    }

    /// The map's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The Redis key of the map's hash, for scripts of other crates that
    /// read the map's revision (`=rev`) atomically with their own keys.
    pub fn redis_key(&self) -> &str {
        &self.shared.keys.hash
    }

    /// The pub/sub channel of the map's changes, for scripts of other
    /// crates that change the map with [`crate::SCRIPT_LIBRARY`].
    pub fn channel(&self) -> &str {
        &self.shared.keys.channel
    }

    /// The value at `key` in the local replica.
    pub fn get(&self, key: &str) -> Option<String> {
        self.shared.read().content.get(key).cloned()
    }

    /// The value at `key` in the local replica with the revision it was
    /// read at: one read of the replica, so the two agree (a value and a
    /// revision read one after the other may straddle a change).
    pub fn get_with_revision(&self, key: &str) -> (u64, Option<String>) {
        let replica = self.shared.read();
        (replica.position.rev, replica.content.get(key).cloned())
    }

    /// The list at `key` (written by [`Map::append_values`] and friends), or
    /// `None` when the key is absent or does not hold a list.
    pub fn get_values(&self, key: &str) -> Option<Vec<String>> {
        self.shared.read().content.get(key).and_then(|value| decode_list(value))
    }

    /// The keys of the local replica, in no particular order.
    pub fn keys(&self) -> Vec<String> {
        self.shared.read().content.keys().cloned().collect()
    }

    /// How many keys the local replica holds.
    pub fn len(&self) -> usize {
        self.shared.read().content.len()
    }

    /// Whether the local replica is empty.
    pub fn is_empty(&self) -> bool {
        self.shared.read().content.is_empty()
    }

    /// A copy of the local replica.
    pub fn snapshot(&self) -> HashMap<String, String> {
        self.shared.read().content.clone()
    }

    /// How many keys of the local replica hold each value (say, how many
    /// slots each worker holds), without copying the map.
    pub fn value_counts(&self) -> HashMap<String, usize> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for value in self.shared.read().content.values() {
            // A value is copied once, however many keys hold it.
            match counts.get_mut(value) {
                Some(count) => *count += 1,
                None => {
                    counts.insert(value.clone(), 1);
                }
            }
        }
        counts
    }

    /// The last revision the local replica applied (0 for a map never
    /// written, or destroyed).
    pub fn revision(&self) -> u64 {
        self.shared.read().position.rev
    }

    /// Waits until `done` holds for the local replica, checking after every
    /// change it applies; returns whether it held within `timeout`.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&Map) -> bool) -> bool {
        let mut position = self.shared.position.subscribe();
        let waited = tokio::time::timeout(timeout, async {
            loop {
                position.borrow_and_update();
                if done(self) {
                    return;
                }
                if position.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        waited.is_ok() && done(self)
    }

    /// Subscribes to changes; dropping the subscription unsubscribes.
    pub fn subscribe(&self) -> Subscription {
        self.shared.subscribers.subscribe()
    }

    /// Live subscriptions (dropped ones are not counted).
    pub fn subscriber_count(&self) -> usize {
        self.shared.subscribers.count()
    }

    /// Background tasks the map runs: 1 while it follows Redis, 0 once
    /// closed. For diagnostics and leak checks.
    pub fn background_tasks(&self) -> usize {
        self.handle.tasks.len()
    }

    /// Stops following Redis and ends every subscription. Reads keep
    /// answering from the last state; writes fail with [`Error::Closed`].
    /// Idempotent.
    ///
    /// # Cancel safety
    /// Cancel safe: the map's tasks are cancelled first; a second call
    /// finishes waiting for them.
    pub async fn close(&self) {
        self.handle.token.cancel();
        self.handle.tasks.wait().await;
        self.shared.subscribers.close();
        tracing::debug!(map = %self.shared.name, "closed");
    }
}

impl std::fmt::Debug for Map {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Map")
            .field("name", &self.shared.name)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl Shared {
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Replica> {
        // A std lock: held for map lookups only, never across an await.
        self.replica.read().unwrap_or_else(|poison| poison.into_inner())
    }

    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Replica> {
        self.replica.write().unwrap_or_else(|poison| poison.into_inner())
    }
}
