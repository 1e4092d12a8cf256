//! Streams, readers and sinks against real private Redis servers.
//!
//! - `streams`: adding, bounded length without loss, TTL, destroy.
//! - `readers`: order, fan-out, filters, start positions, lag, prompt close.
//! - `sinks`: one consumer per event, redelivery, dead consumers, bad entries.
//! - `shared`: events that share an entry, read and acknowledged one by one.
//! - `faults`: Redis restarts (empty and with an append-only file), a group
//!   destroyed from outside.
#![allow(clippy::unwrap_used, reason = "tests and their helpers: a panic is the failure report")]

mod faults;
mod readers;
mod shared;
mod sinks;
mod streams;

use std::time::Duration;

use pulse_streams::{Event, Stream, StreamOptions};

/// How long a test waits for something that takes milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A client of the binary's shared private Redis.
pub fn client() -> pulse_redis::Redis {
    pulse_redis::Redis::open(pulse_testkit::shared_redis_url()).unwrap()
}

/// Opens stream `name` of the shared Redis.
pub async fn open(name: &str, options: StreamOptions) -> Stream {
    Stream::open(&client(), name, options).await.unwrap()
}

/// The payloads of `events`, as text.
pub fn payloads(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| String::from_utf8_lossy(&e.payload).into_owned()).collect()
}

/// The payload of `event`, as text.
pub fn text(event: &Event) -> String {
    String::from_utf8_lossy(&event.payload).into_owned()
}

/// Destroys the stream and checks nothing of it is left.
pub async fn destroy_and_check(stream: &Stream, name: &str) {
    stream.destroy().await.unwrap();
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    pulse_testkit::assert_no_keys(&mut conn, name).await;
}
