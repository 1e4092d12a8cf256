//! Replicated maps against real private Redis servers.
//!
//! - `ops`: every operation, including conditional ones losing their condition.
//! - `replication`: replicas converge; `set_and_wait`; subscriptions.
//! - `faults`: Redis restarts, lost data, expiry; nothing leaks.
#![allow(clippy::unwrap_used, reason = "tests and their helpers: a panic is the failure report")]

mod faults;
mod ops;
mod replication;

use std::time::Duration;

use pulse_rmap::{Map, MapOptions};

/// How long a test waits for something that takes milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A client of the binary's shared private Redis.
pub fn client() -> pulse_redis::Redis {
    pulse_redis::Redis::open(pulse_testkit::shared_redis_url()).unwrap()
}

/// Joins map `name` of the shared Redis.
pub async fn join(name: &str) -> Map {
    Map::join(&client(), name, MapOptions::default()).await.unwrap()
}

/// Waits until `done` holds, checking after every change of `map` (and at
/// least every 50 ms); panics with `what` after [`PATIENCE`].
pub async fn eventually(map: &Map, what: &str, done: impl Fn(&Map) -> bool) {
    let mut changes = map.subscribe();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done(map) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {:?}",
            map.snapshot()
        );
        let _ = tokio::time::timeout(Duration::from_millis(50), changes.recv()).await;
    }
}
