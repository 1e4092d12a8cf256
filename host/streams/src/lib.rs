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
//! - `reader`: [`Reader`], [`ReaderSubscription`], [`ReaderEvent`];
//!   `reply`: the entries of an `XREAD` reply, read in place.
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
mod reply;
mod scripts;
mod sink;
mod stream;

pub use error::{Error, Result};
pub use event::{Event, TopicFilter};
pub use reader::{DOORBELL_POLL, Overflow, Reader, ReaderEvent, ReaderOptions, ReaderSubscription};
pub use sink::{Sink, SinkOptions};
pub use stream::{Start, Stream, StreamOptions, Ttl};

/// The Redis key of stream `name` under hash tag `tag`: for scripts of other
/// crates that add to a stream atomically with their own keys (entries as
/// [`Event::from_entry`] reads them).
pub fn stream_key(tag: &str, name: &str) -> String {
    keys::StreamKeys::new(tag, name).stream
}

/// Whether event id `a` comes after `b`. Ids are entry ids (`<ms>-<seq>`)
/// or ids of events that share an entry (`<ms>-<seq>.<index>`); an entry
/// id stands for its whole entry, so it comes after each of its events.
pub fn id_after(a: &str, b: &str) -> bool {
    id_order(a) > id_order(b)
}

/// An id as a sortable key: time, sequence, index (`u64::MAX` for a whole
/// entry); a part that does not parse counts as 0.
pub fn id_order(id: &str) -> (u64, u64, u64) {
    let (ms, seq, index) = id_fields(id);
    let number = |text: &str| text.parse().unwrap_or(0);
    (number(ms), seq.map_or(0, number), index.map_or(u64::MAX, number))
}

/// Whether `id` is an event id: `<ms>-<seq>` or `<ms>-<seq>.<index>`.
pub fn is_event_id(id: &str) -> bool {
    let (ms, seq, index) = id_fields(id);
    let number = |text: &str| text.parse::<u64>().is_ok();
    number(ms) && seq.is_some_and(number) && index.is_none_or(number)
}

/// The time, sequence and index of an id, as text.
fn id_fields(id: &str) -> (&str, Option<&str>, Option<&str>) {
    let (entry, index) = id.split_once('.').map_or((id, None), |(entry, index)| (entry, Some(index)));
    let (ms, seq) = entry.split_once('-').map_or((entry, None), |(ms, seq)| (ms, Some(seq)));
    (ms, seq, index)
}

/// The entry id of event id `id` (itself for an entry of one event).
pub(crate) fn entry_of(id: &str) -> &str {
    id.split_once('.').map_or(id, |(entry, _)| entry)
}

/// Where `XREAD` continues to take what comes after event id `id`: the id
/// itself, or for one of the events that share an entry the id just before
/// that entry (it is read again, and the events up to `id` skipped).
pub(crate) fn read_after(id: &str) -> String {
    if !id.contains('.') {
        return id.to_owned();
    }
    let (ms, seq, _) = id_order(id);
    match (ms, seq) {
        (ms, 0) if ms > 0 => format!("{}-{}", ms - 1, u64::MAX),
        (ms, seq) => format!("{ms}-{}", seq.saturating_sub(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_of_shared_entries_sort_inside_their_entry() {
        assert!(id_after("5-1", "5-0"));
        assert!(id_after("5-0.1", "5-0.0"));
        assert!(id_after("5-0", "5-0.7"), "an entry id stands for its whole entry");
        assert!(!id_after("5-0.7", "5-0"));
        assert!(id_after("5-1.0", "5-0"));
        assert!(id_after("6-0.0", "5-9.9"));
        assert_eq!(entry_of("5-3.2"), "5-3");
        assert_eq!(entry_of("5-3"), "5-3");
        assert_eq!(read_after("5-3"), "5-3");
        assert_eq!(read_after("5-3.2"), "5-2");
        assert_eq!(read_after("5-0.2"), format!("4-{}", u64::MAX));
        assert_eq!(read_after("0-1.0"), "0-0");
        for id in ["5-3", "5-3.0", "17-0.12"] {
            assert!(is_event_id(id), "{id}");
        }
        for id in ["5", "5-", "5-x", "5-3.", "5-3.x", "-3", "5-3.1.2", ""] {
            assert!(!is_event_id(id), "{id}");
        }
    }
}
