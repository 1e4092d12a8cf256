//! Subscriptions to a pub/sub channel.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::{Stream, StreamExt};
use redis::{PushKind, Value};

use crate::target::{Redis, Target};

/// The messages of one channel, as their payloads, from when
/// [`Redis::subscribe`] returned. It ends when its connection drops (or, on
/// a cluster, when the node it listens on goes away): whatever was
/// published meanwhile is lost to it, so a subscriber that keeps a copy of
/// something subscribes again and reloads.
pub struct Subscription(Pin<Box<dyn Stream<Item = Vec<u8>> + Send>>);

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Subscription")
    }
}

impl Stream for Subscription {
    type Item = Vec<u8>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Vec<u8>>> {
        self.0.as_mut().poll_next(cx)
    }
}

impl Redis {
    /// Subscribes to `channel`, returning once Redis confirmed it: what is
    /// published from then on reaches the subscription.
    ///
    /// # Errors
    /// When Redis cannot be reached or refuses.
    pub async fn subscribe(&self, channel: &str) -> redis::RedisResult<Subscription> {
        if let Target::Cluster { pubsub, .. } = &*self.0 {
            // A cluster delivers a PUBLISH to every node, so any node's
            // subscription hears every message; the pushes come to `rx`.
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let config = redis::cluster::ClusterConfig::new().set_push_sender(tx);
            let mut conn = pubsub.get_async_connection_with_config(config).await?;
            conn.subscribe(channel).await?;
            let messages = futures_util::stream::unfold((rx, conn), |(mut rx, conn)| async move {
                loop {
                    let push = rx.recv().await?;
                    match push.kind {
                        PushKind::Message => {
                            if let Some(Value::BulkString(payload)) = push.data.into_iter().nth(1) {
                                return Some((payload, (rx, conn)));
                            }
                        }
                        // The library resubscribes on a new connection by
                        // itself, but what was published in between is
                        // lost: end, so the subscriber reloads.
                        PushKind::Disconnection | PushKind::Unsubscribe => return None,
                        _ => {}
                    }
                }
            });
            return Ok(Subscription(Box::pin(messages)));
        }
        let server = self.server().await?.expect("a single server or a primary behind Sentinel");
        let mut pubsub = server.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        let messages = pubsub.into_on_message().map(|message| message.get_payload_bytes().to_vec());
        Ok(Subscription(Box::pin(messages)))
    }
}
