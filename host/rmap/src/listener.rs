//! The task that keeps a replica in sync: it reads the change channel,
//! applies changes under the revision rule, reloads the map when it missed
//! something, reconnects when the subscription drops, and now and then
//! compares its revision with the hash's, for what no message says.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use pulse_redis::Subscription;
use tokio_util::sync::CancellationToken;

use crate::codec::Change;
use crate::map::Shared;
use crate::replica::Applied;
use crate::subscription::MapEvent;

/// First wait before reconnecting; doubled per failure up to
/// [`MAX_BACKOFF`]. Short, because a replica that is not subscribed is
/// blind to changes.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often a replica compares its epoch and revision with the hash's
/// (one `HMGET`). It reloads at once when Redis went back (a failover lost
/// changes it had published) or holds another map, and when Redis was
/// ahead at two checks in a row with nothing applied between: a
/// subscription that hears nothing while the map changes (on a cluster,
/// its node cut off from the others) is found within two of these.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// Serves the replica until `token` is cancelled.
pub(crate) async fn listen(shared: Arc<Shared>, mut stream: Subscription, token: CancellationToken) {
    // Set when a reload failed: the next message tries again.
    let mut stale = false;
    let mut checks = tokio::time::interval(CHECK_EVERY);
    checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    checks.reset();
    // The revision the replica had when a check last found Redis ahead.
    let mut behind_at = None;
    loop {
        let message = tokio::select! {
            biased;
            () = token.cancelled() => return,
            message = stream.next() => message,
            _ = checks.tick() => {
                if stale || check(&shared, &mut behind_at).await {
                    stale = reload(&shared).await;
                }
                continue;
            }
        };
        let Some(message) = message else {
            tracing::warn!("disconnected from the change channel; reconnecting");
            match reconnect(&shared, &token).await {
                Some(new_stream) => {
                    stream = new_stream;
                    stale = false;
                    tracing::info!("reconnected");
                    continue;
                }
                None => return,
            }
        };
        let Some(change) = Change::parse(&message) else {
            tracing::warn!(message = %String::from_utf8_lossy(&message), "skipped a malformed change message");
            continue;
        };
        let applied = if stale { Applied::Resync } else { shared.apply(change) };
        if applied == Applied::Resync {
            stale = reload(&shared).await;
        }
    }
}

/// Loads the whole map; true when that failed (the next message or check
/// tries again).
async fn reload(shared: &Shared) -> bool {
    match snapshot(shared).await {
        Ok(fields) => {
            shared.load(fields);
            false
        }
        Err(error) => {
            tracing::warn!(error = %error, "failed to reload the map; retrying on the next change");
            true
        }
    }
}

/// Whether the replica must reload: the hash holds another epoch (or is
/// gone), an earlier revision, or a later one for the second check in a
/// row at the same revision of the replica (see [`CHECK_EVERY`]). A
/// failed read says nothing.
async fn check(shared: &Shared, behind_at: &mut Option<u64>) -> bool {
    let mut conn = shared.conn.clone();
    let read: redis::RedisResult<(Option<String>, Option<u64>)> =
        redis::cmd("HMGET").arg(&shared.keys.hash).arg("=epoch").arg("=rev").query_async(&mut conn).await;
    let Ok((epoch, rev)) = read else { return false };
    let local = shared.position.borrow().clone();
    let rev = rev.unwrap_or(0);
    if epoch != local.epoch || rev < local.rev {
        if epoch.is_some() || local.epoch.is_some() {
            tracing::warn!(local = local.rev, redis = rev, "the map's replica and Redis differ; reloading");
        }
        *behind_at = None;
        return true;
    }
    if rev > local.rev {
        if *behind_at == Some(local.rev) {
            tracing::warn!(
                local = local.rev,
                redis = rev,
                "the change channel is silent while the map changes; reloading"
            );
            *behind_at = None;
            return true;
        }
        *behind_at = Some(local.rev);
        return false;
    }
    *behind_at = None;
    false
}

/// Subscribes again and reloads the map, until it works or `token` is
/// cancelled.
async fn reconnect(shared: &Shared, token: &CancellationToken) -> Option<Subscription> {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let attempt = async {
            let stream = subscribe(shared).await?;
            let fields = snapshot(shared).await?;
            Ok::<_, redis::RedisError>((stream, fields))
        };
        let result = tokio::select! {
            biased;
            () = token.cancelled() => return None,
            result = attempt => result,
        };
        match result {
            Ok((stream, fields)) => {
                shared.load(fields);
                return Some(stream);
            }
            Err(error) => tracing::debug!(error = %error, ?backoff, "reconnection failed"),
        }
        // Jitter spreads the reconnections of many replicas after a restart.
        let wait = backoff.mul_f64(0.5 + fastrand::f64());
        tokio::select! {
            biased;
            () = token.cancelled() => return None,
            () = tokio::time::sleep(wait) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A new subscription to the map's change channel, confirmed by Redis.
pub(crate) async fn subscribe(shared: &Shared) -> redis::RedisResult<Subscription> {
    // Returns once Redis confirmed the subscription: changes from here on
    // are queued for us, so a snapshot taken now misses nothing.
    shared.client.subscribe(&shared.keys.channel).await
}

/// The whole hash, for a replica to load.
pub(crate) async fn snapshot(shared: &Shared) -> redis::RedisResult<HashMap<String, String>> {
    let mut conn = shared.conn.clone();
    redis::cmd("HGETALL").arg(&shared.keys.hash).query_async(&mut conn).await
}

impl Shared {
    /// Applies one change and tells subscribers.
    fn apply(&self, change: Change) -> Applied {
        let (applied, position) = {
            let mut replica = self.write();
            let applied = replica.apply(change);
            (applied, replica.position.clone())
        };
        if let Applied::Changed(event) = &applied {
            self.position.send_replace(position);
            self.subscribers.publish(event);
        }
        applied
    }

    /// Replaces the replica with a snapshot and tells subscribers.
    pub(crate) fn load(&self, fields: HashMap<String, String>) {
        let position = {
            let mut replica = self.write();
            replica.load(fields);
            replica.position.clone()
        };
        self.position.send_replace(position);
        self.subscribers.publish(&MapEvent::Resynced);
    }
}
