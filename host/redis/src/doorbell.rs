//! Doorbells: what the writers of many streams on a cluster tell their
//! readers.
//!
//! A reader that blocks in `XREAD` holds a connection of its own per
//! stream. On a cluster a pool of slot groups has many streams that each
//! carry little (an inbox per worker and group, a reply stream per node
//! and group), so every entry wakes its reader alone, and each wake costs
//! its master the socket work of an answer and of the next blocked read.
//! A doorbell hears instead a sharded pub/sub message on the stream's key
//! name, which the script that adds entries publishes in the same step
//! (`SPUBLISH`, local to the stream's master) with the entries in it. One
//! connection per process carries the messages of every stream, and the
//! reader takes the entries from the message without reading the stream.
//!
//! Messages can be lost: a node's connection drops, a master fails over, a
//! slot moves, a reader falls behind. So a doorbell hands its reader, in
//! the order heard, the messages and [`Ring::Missed`] where some may have
//! been lost: at the subscription's confirmation (the first, and each one
//! redis-rs makes again after a reconnection or a slot move), when a
//! node's connection drops or the server unsubscribes a channel, and when
//! its queue is full. The reader then reads the stream from where it
//! stands, so what was lost is read there, and every message after the
//! `Missed` was published after it was heard: nothing between is skipped.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::PushKind;
use redis::cluster_async::ClusterConnection;
use tokio::sync::Notify;

use crate::target::{Redis, Target};

/// Messages a doorbell keeps for its reader at most, by count and by
/// bytes: beyond either, what comes is dropped and the reader told to
/// read (see [`Ring::Missed`]).
const QUEUE_MESSAGES: usize = 1024;
const QUEUE_BYTES: usize = 8 << 20;

/// What a doorbell heard, in the order it heard it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ring {
    /// A message published on the channel: what the writer put in it
    /// (the entries it added, or nothing).
    Message(Vec<u8>),
    /// Messages may have been lost here (the subscription was made, made
    /// again, or dropped, or the queue was full): what the channel
    /// announces must be read from where the reader stands. Every message
    /// after this one was published after it was heard.
    Missed,
}

/// Rings for one channel, in order: [`Doorbell::next`] returns them.
/// Dropping it stops listening.
pub struct Doorbell {
    queue: Arc<Queue>,
    id: u64,
    channel: String,
    bells: Arc<Bells>,
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Doorbell").field(&self.channel).finish()
    }
}

impl Doorbell {
    /// The next ring, waiting for one.
    ///
    /// # Cancel safety
    /// Cancel safe: a ring is taken only by a call that returns it.
    pub async fn next(&self) -> Ring {
        loop {
            let notified = self.queue.notify.notified();
            if let Some(ring) = self.queue.pop() {
                return ring;
            }
            notified.await;
        }
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        self.bells.release(&self.channel, self.id);
    }
}

/// One doorbell's rings, waiting to be taken.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
}

#[derive(Default)]
struct QueueState {
    rings: VecDeque<Ring>,
    bytes: usize,
}

impl QueueState {
    /// Queues a [`Ring::Missed`], one for a run of them: a reader reads
    /// once for all.
    fn missed(&mut self) {
        if self.rings.back() != Some(&Ring::Missed) {
            self.rings.push_back(Ring::Missed);
        }
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Held for a push or a pop, never across an await.
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Queues `message`, or, when the queue is full, drops it behind a
    /// [`Ring::Missed`] (one for a run of dropped messages): the reader
    /// takes that after everything queued before it, and its read covers
    /// what was dropped.
    fn message(&self, message: Vec<u8>) {
        {
            let mut state = self.lock();
            if state.rings.len() >= QUEUE_MESSAGES || state.bytes + message.len() > QUEUE_BYTES {
                state.missed();
            } else {
                state.bytes += message.len();
                state.rings.push_back(Ring::Message(message));
            }
        }
        self.notify.notify_one();
    }

    fn missed(&self) {
        self.lock().missed();
        self.notify.notify_one();
    }

    fn pop(&self) -> Option<Ring> {
        let mut state = self.lock();
        let ring = state.rings.pop_front()?;
        if let Ring::Message(message) = &ring {
            state.bytes -= message.len();
        }
        Some(ring)
    }
}

/// The process's doorbells on one cluster: their subscriptions'
/// connection and who listens to which channel.
pub(crate) struct Bells {
    /// Held while subscribing or unsubscribing, so those reach Redis in
    /// the order they were decided.
    conn: tokio::sync::Mutex<ClusterConnection>,
    listeners: Arc<Listeners>,
}

/// The doorbells listening to each channel, each with its id.
type ByChannel = HashMap<String, Vec<(u64, Arc<Queue>)>>;

#[derive(Default)]
struct Listeners {
    by_channel: Mutex<ByChannel>,
    next_id: AtomicU64,
}

impl Listeners {
    fn lock(&self) -> MutexGuard<'_, ByChannel> {
        // Held for a map update or a lookup, never across an await.
        self.by_channel.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn each(&self, channel: &[u8], f: impl Fn(&Queue)) {
        let Ok(channel) = std::str::from_utf8(channel) else { return };
        if let Some(queues) = self.lock().get(channel) {
            queues.iter().for_each(|(_, queue)| f(queue));
        }
    }

    /// What the subscriptions' connection heard.
    fn heard(&self, push: redis::PushInfo) {
        let mut data = push.data.into_iter();
        let channel = match data.next() {
            Some(redis::Value::BulkString(channel)) => channel,
            _ => Vec::new(),
        };
        match push.kind {
            PushKind::SMessage => {
                let message = match data.next() {
                    Some(redis::Value::BulkString(message)) => message,
                    _ => Vec::new(),
                };
                self.each(&channel, |queue| queue.message(message.clone()));
            }
            // A node's connection dropped: what it would have delivered
            // until its channels are subscribed again is lost.
            PushKind::Disconnection => {
                self.lock().values().flatten().for_each(|(_, queue)| queue.missed());
            }
            // Subscribed (again, after a reconnection or a slot moving):
            // what was published before is read; unsubscribed by the
            // server (its slot moved away): nothing more comes from there.
            PushKind::SSubscribe | PushKind::SUnsubscribe => self.each(&channel, Queue::missed),
            _ => {}
        }
    }
}

impl Bells {
    async fn connect(cluster: &redis::cluster::ClusterClient) -> redis::RedisResult<Arc<Self>> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let config = redis::cluster::ClusterConfig::new().set_push_sender(tx);
        let conn = cluster.get_async_connection_with_config(config).await?;
        let listeners = Arc::new(Listeners::default());
        let heard = listeners.clone();
        // Ends when the connection is dropped with the last `Redis` handle.
        tokio::spawn(async move {
            while let Some(push) = rx.recv().await {
                heard.heard(push);
            }
        });
        Ok(Arc::new(Self { conn: tokio::sync::Mutex::new(conn), listeners }))
    }

    /// Stops `id` listening; the last listener of a channel unsubscribes
    /// it, unless another has come by the time that is sent.
    fn release(self: &Arc<Self>, channel: &str, id: u64) {
        let empty = {
            let mut listeners = self.listeners.lock();
            let Some(list) = listeners.get_mut(channel) else { return };
            list.retain(|(other, _)| *other != id);
            list.is_empty()
        };
        if !empty {
            return;
        }
        let bells = self.clone();
        let channel = channel.to_owned();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        runtime.spawn(async move {
            let mut conn = bells.conn.lock().await;
            let still_empty = {
                let mut listeners = bells.listeners.lock();
                let empty = listeners.get(&channel).is_some_and(Vec::is_empty);
                if empty {
                    listeners.remove(&channel);
                }
                empty
            };
            if still_empty && let Err(error) = conn.sunsubscribe(&channel).await {
                tracing::debug!(error = %error, channel, "failed to unsubscribe a doorbell");
            }
        });
    }
}

impl Redis {
    /// A doorbell for `channel` on a cluster, subscribed when this returns
    /// (what is published from then on rings it, after a first
    /// [`Ring::Missed`] for what came before); `None` for a single
    /// server or a primary behind Sentinel, whose readers block instead.
    ///
    /// # Errors
    /// When the cluster cannot be reached.
    pub async fn doorbell(&self, channel: &str) -> redis::RedisResult<Option<Doorbell>> {
        let Target::Cluster { pubsub, bells, .. } = &*self.0 else { return Ok(None) };
        let bells = bells.get_or_try_init(|| Bells::connect(pubsub)).await?.clone();
        let queue = Arc::new(Queue::default());
        let id = bells.listeners.next_id.fetch_add(1, Ordering::Relaxed);
        let mut conn = bells.conn.lock().await;
        // Listening before subscribing: the confirmation rings `Missed`,
        // after which every message is heard.
        bells.listeners.lock().entry(channel.to_owned()).or_default().push((id, queue.clone()));
        let doorbell = Doorbell { queue, id, channel: channel.to_owned(), bells: bells.clone() };
        // On an error the doorbell is dropped, which takes its listener
        // back out.
        conn.ssubscribe(channel).await?;
        drop(conn);
        Ok(Some(doorbell))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(n: usize) -> Vec<u8> {
        n.to_string().into_bytes()
    }

    #[test]
    fn a_full_queue_drops_behind_one_missed_and_queues_again_after_it() {
        let queue = Queue::default();
        for n in 0..QUEUE_MESSAGES + 5 {
            queue.message(message(n));
        }
        for n in 0..QUEUE_MESSAGES {
            assert_eq!(queue.pop(), Some(Ring::Message(message(n))));
        }
        assert_eq!(queue.pop(), Some(Ring::Missed), "one for the five dropped");
        assert_eq!(queue.pop(), None);
        queue.message(message(7));
        assert_eq!(queue.pop(), Some(Ring::Message(message(7))));
        assert_eq!(queue.lock().bytes, 0);
    }

    #[test]
    fn a_message_heard_after_a_miss_comes_after_it() {
        let queue = Queue::default();
        queue.message(message(1));
        queue.missed();
        queue.missed();
        queue.message(message(2));
        let rings: Vec<Ring> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(rings, [Ring::Message(message(1)), Ring::Missed, Ring::Message(message(2))]);
    }

    #[test]
    fn the_queue_is_bounded_by_bytes_too() {
        let queue = Queue::default();
        queue.message(vec![0; QUEUE_BYTES - 10]);
        queue.message(vec![0; 11]);
        queue.message(vec![0; 10]);
        assert!(matches!(queue.pop(), Some(Ring::Message(m)) if m.len() == QUEUE_BYTES - 10));
        assert_eq!(queue.pop(), Some(Ring::Missed));
        assert!(matches!(queue.pop(), Some(Ring::Message(m)) if m.len() == 10), "room again after the miss");
    }
}
