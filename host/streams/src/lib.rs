//! Streams of events over Redis streams, losing none.
//!
//! Worker inboxes, dispatch replies and the events plugins emit travel on
//! streams. A [`Stream`] adds events; a [`Reader`] sees every event (fan-out);
//! a [`Sink`] is one consumer of a consumer group, where each event goes to
//! one consumer and stays pending until acknowledged.
//!
//! # Layout
//! - `stream`: [`Stream`], [`StreamOptions`], [`Start`]; bounded length
//!   that never drops an unacknowledged event.
//! - `reader`: [`Reader`], [`ReaderSubscription`], [`ReaderEvent`].
//! - `sink`: [`Sink`], [`SinkOptions`]: heartbeats, claiming, reaping, and
//!   recreation of a lost group.
//! - `event`: [`Event`], [`TopicFilter`], defensive decoding.
//! - `keys`: every Redis key name; `scripts`: the Lua scripts (`lua/`).
//! - `backoff`: waits between reconnection attempts; `blocking`: the
//!   connections of blocking reads (no response timeout shorter than BLOCK).
//!
//! ```no_run
//! # async fn example() -> pulse_streams::Result<()> {
//! use pulse_streams::{SinkOptions, Stream, StreamOptions};
//!
//! let client = pulse_redis::Redis::open("redis://127.0.0.1/").expect("a valid URL");
//! let stream = Stream::open(&client, "inbox", StreamOptions::default().hash_tag("orders")).await?;
//! let mut sink = stream.sink("workers", SinkOptions::default()).await?;
//! stream.add("start", b"payload", None).await?;
//! if let Some(event) = sink.recv().await {
//!     sink.ack(&event.id).await?;
//! }
//! sink.close().await;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod backoff;
mod blocking;
mod error;
mod event;
mod keys;
mod reader;
mod scripts;
mod sink;
mod stream;

pub use error::{Error, Result};
pub use event::{Event, TopicFilter};
pub use reader::{DOORBELL_POLL, Overflow, Reader, ReaderEvent, ReaderOptions, ReaderSubscription};
pub use sink::{Sink, SinkOptions};
pub use stream::{Start, Stream, StreamOptions, Ttl};

/// The Redis key of stream `name` under hash tag `tag`: for scripts of other
/// crates that add to a stream atomically with their own keys (entries with
/// fields `n`, `p` and optionally `t`, as [`Stream::add`] writes them).
pub fn stream_key(tag: &str, name: &str) -> String {
    keys::StreamKeys::new(tag, name).stream
}

/// Whether stream entry id `a` (`ms-seq`) comes after `b`.
pub fn id_after(a: &str, b: &str) -> bool {
    let parse = |id: &str| -> (u64, u64) {
        let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
        (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
    };
    parse(a) > parse(b)
}
