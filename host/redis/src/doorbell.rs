//! Doorbells: wake-ups for the readers of many streams on a cluster.
//!
//! A reader that blocks in `XREAD` holds a connection of its own per
//! stream. On a cluster a pool of slot groups has many streams that each
//! carry little (an inbox per worker and group, a reply stream per node
//! and group), so every entry wakes its reader alone, and each wake costs
//! its master the socket work of an answer and of the next blocked read.
//! A doorbell hears instead a sharded pub/sub message on the stream's key
//! name, which the script that adds the entry publishes in the same step
//! (`SPUBLISH`, local to the stream's master). One connection per process
//! carries the rings of every stream, and the reader then reads without
//! blocking on the shared connection, where the reads of many streams
//! share round trips.
//!
//! A ring can be lost: the connection drops, a master fails over, a slot
//! moves. redis-rs subscribes again by itself, and each of those events
//! (a disconnection, an unsubscription, a subscription made again) rings
//! every doorbell, so every reader reads once more. A reader also reads
//! now and then without a ring (see `pulse_streams`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use redis::PushKind;
use redis::cluster_async::ClusterConnection;
use tokio::sync::Notify;

use crate::target::{Redis, Target};

/// Rings for one channel: [`Doorbell::rung`] returns after the next one
/// (or at once if one came since the last call). Dropping it stops
/// listening.
pub struct Doorbell {
    bell: Arc<Notify>,
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
    /// Waits for a ring; one that came while nobody waited is kept.
    ///
    /// # Cancel safety
    /// Cancel safe: a ring is consumed only by a call that returns.
    pub async fn rung(&self) {
        self.bell.notified().await;
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        self.bells.release(&self.channel, self.id);
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
type ByChannel = HashMap<String, Vec<(u64, Arc<Notify>)>>;

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

    fn ring(&self, channel: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else { return };
        if let Some(bells) = self.lock().get(channel) {
            bells.iter().for_each(|(_, bell)| bell.notify_one());
        }
    }

    fn ring_all(&self) {
        self.lock().values().flatten().for_each(|(_, bell)| bell.notify_one());
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
                match push.kind {
                    PushKind::SMessage => {
                        if let Some(redis::Value::BulkString(channel)) = push.data.first() {
                            heard.ring(channel);
                        }
                    }
                    // Rings may have been lost: the readers read again.
                    PushKind::Disconnection => heard.ring_all(),
                    // A channel unsubscribed by the server (its slot moved)
                    // or subscribed again after a reconnection; also the
                    // confirmations of our own requests, which ring a
                    // reader that is about to read anyway.
                    PushKind::SUnsubscribe | PushKind::SSubscribe => {
                        if let Some(redis::Value::BulkString(channel)) = push.data.first() {
                            heard.ring(channel);
                        }
                    }
                    _ => {}
                }
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
    /// (what is published from then on rings it); `None` for a single
    /// server or a primary behind Sentinel, whose readers block instead.
    ///
    /// # Errors
    /// When the cluster cannot be reached.
    pub async fn doorbell(&self, channel: &str) -> redis::RedisResult<Option<Doorbell>> {
        let Target::Cluster { pubsub, bells, .. } = &*self.0 else { return Ok(None) };
        let bells = bells.get_or_try_init(|| Bells::connect(pubsub)).await?.clone();
        let bell = Arc::new(Notify::new());
        let id = bells.listeners.next_id.fetch_add(1, Ordering::Relaxed);
        let mut conn = bells.conn.lock().await;
        bells.listeners.lock().entry(channel.to_owned()).or_default().push((id, bell.clone()));
        let doorbell = Doorbell { bell, id, channel: channel.to_owned(), bells: bells.clone() };
        // On an error the doorbell is dropped, which takes its listener
        // back out.
        conn.ssubscribe(channel).await?;
        drop(conn);
        Ok(Some(doorbell))
    }
}
