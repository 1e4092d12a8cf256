//! Change notifications: any number of subscribers, each with its own
//! bounded queue, none able to stall the others or the map.
//!
//! A subscriber that falls behind loses events instead of blocking the map:
//! its queue stops taking events, and once it has read what was queued it
//! receives [`MapEvent::Lagged`], its cue to re-read the map, then events
//! again. Dropping a [`Subscription`] unsubscribes it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;

/// A change of a map, as its subscribers hear of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapEvent {
    /// `key` now holds `value`.
    Set {
        /// The key.
        key: String,
        /// Its new value.
        value: String,
    },
    /// Each key of `entries` now holds its value: one change that set
    /// several keys at once.
    SetMany {
        /// The keys and their new values.
        entries: Vec<(String, String)>,
    },
    /// `key` was deleted.
    Deleted {
        /// The key.
        key: String,
    },
    /// Every key was removed (reset or destroy).
    Reset,
    /// The replica reloaded the whole map (after a reconnect, a missed
    /// change, or the map being recreated): re-read it.
    Resynced,
    /// This subscriber fell behind and missed events: re-read the map.
    Lagged,
}

/// A subscription to a map's changes.
#[derive(Debug)]
pub struct Subscription {
    events: mpsc::Receiver<MapEvent>,
    lagged: Arc<AtomicBool>,
}

impl Subscription {
    /// The next change; `None` once the map is closed.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is removed from the queue only when returned.
    pub async fn recv(&mut self) -> Option<MapEvent> {
        match self.events.try_recv() {
            Ok(event) => return Some(event),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) => {}
        }
        if self.lagged.swap(false, Ordering::AcqRel) {
            return Some(MapEvent::Lagged);
        }
        self.events.recv().await
    }
}

/// The map's side of its subscriptions.
#[derive(Debug)]
pub(crate) struct Subscribers {
    queue: usize,
    list: Mutex<Vec<Subscriber>>,
}

#[derive(Debug)]
struct Subscriber {
    events: mpsc::Sender<MapEvent>,
    lagged: Arc<AtomicBool>,
}

impl Subscribers {
    pub(crate) fn new(queue: usize) -> Self {
        Self { queue: queue.max(1), list: Mutex::new(Vec::new()) }
    }

    pub(crate) fn subscribe(&self) -> Subscription {
        let (tx, rx) = mpsc::channel(self.queue);
        let lagged = Arc::new(AtomicBool::new(false));
        self.lock().push(Subscriber { events: tx, lagged: lagged.clone() });
        Subscription { events: rx, lagged }
    }

    /// Offers `event` to every subscriber without waiting; forgets the ones
    /// that were dropped.
    pub(crate) fn publish(&self, event: &MapEvent) {
        self.lock().retain(|subscriber| {
            if subscriber.lagged.load(Ordering::Acquire) {
                // Until it has read its Lagged marker, it gets nothing newer:
                // it re-reads the map anyway.
                return !subscriber.events.is_closed();
            }
            match subscriber.events.try_send(event.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    subscriber.lagged.store(true, Ordering::Release);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// How many subscriptions are alive.
    pub(crate) fn count(&self) -> usize {
        let mut list = self.lock();
        list.retain(|subscriber| !subscriber.events.is_closed());
        list.len()
    }

    /// Ends every subscription (their `recv` returns `None` once drained).
    pub(crate) fn close(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Subscriber>> {
        // Held only to walk the list, never across an await (a std mutex).
        self.list.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_slow_subscriber_lags_without_blocking_others() {
        let subscribers = Subscribers::new(2);
        let mut slow = subscribers.subscribe();
        let mut fast = subscribers.subscribe();
        for i in 0..5 {
            subscribers.publish(&MapEvent::Deleted { key: i.to_string() });
            assert_eq!(fast.recv().await, Some(MapEvent::Deleted { key: i.to_string() }));
        }
        assert_eq!(slow.recv().await, Some(MapEvent::Deleted { key: "0".into() }));
        assert_eq!(slow.recv().await, Some(MapEvent::Deleted { key: "1".into() }));
        assert_eq!(slow.recv().await, Some(MapEvent::Lagged));
        subscribers.publish(&MapEvent::Reset);
        assert_eq!(slow.recv().await, Some(MapEvent::Reset));
    }

    #[tokio::test]
    async fn dropping_a_subscription_unsubscribes_it() {
        let subscribers = Subscribers::new(4);
        let kept = subscribers.subscribe();
        drop(subscribers.subscribe());
        assert_eq!(subscribers.count(), 1);
        subscribers.close();
        drop(kept);
        assert_eq!(subscribers.count(), 0);
    }
}
