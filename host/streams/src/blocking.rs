//! Connections for blocking reads.
//!
//! A blocked `XREAD`/`XREADGROUP` holds its connection for up to its BLOCK
//! time. redis-rs times a response out after 500 ms by default: a reader
//! blocking longer than that saw its idle reads fail, reconnected and backed
//! off, and was deaf meanwhile (one dispatch into an idle pool took seconds).
//! A blocking read's connection therefore waits for its answer for the
//! block time plus [`SLACK`]: long enough never to race the server's own
//! timeout, short enough to notice a connection that died silently.

use std::time::Duration;

/// How much longer than its BLOCK a read waits for the server's answer.
pub(crate) const SLACK: Duration = Duration::from_secs(2);

/// A new connection of its own for reads that block up to `block`.
pub(crate) async fn connect(
    redis: &pulse_redis::Redis,
    block: Duration,
) -> redis::RedisResult<pulse_redis::Dedicated> {
    redis.dedicated(block + SLACK).await
}
