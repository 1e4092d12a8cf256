//! Replicated maps: a Redis hash mirrored in memory on every node, kept in
//! sync through a pub/sub channel.
//!
//! Pool membership, tickers and flags are small maps every node must see,
//! read locally without a round trip, and be told about when they change.
//!
//! # Layout
//! - `map`: [`Map`]: join, local reads, writes, [`Map::subscribe`].
//! - `replica`: the local copy and the revision rule that keeps it exact.
//! - `listener`: the task that applies changes, reloads and reconnects.
//! - `subscription`: [`Subscription`] and [`MapEvent`], bounded per subscriber.
//! - `codec`: netstrings: change messages and list values.
//! - `keys`: every Redis key and channel name, and name validation.
//! - `scripts`: the Lua scripts (`lua/`), one atomic script per mutation.
//!
//! # Consistency
//! Every mutation bumps the map's revision by one and publishes the change
//! in the same script. A replica applies the next revision only; a gap, a
//! change from another epoch (the hash expired, was destroyed or Redis lost
//! it) or a reconnect makes it reload the whole map. So at quiescence every
//! replica equals the hash in Redis.
//!
//! ```no_run
//! # async fn example() -> pulse_rmap::Result<()> {
//! use pulse_rmap::{Map, MapOptions};
//!
//! let client = pulse_redis::Redis::open("redis://127.0.0.1/").expect("a valid URL");
//! let map = Map::join(&client, "workers", MapOptions::default().hash_tag("orders")).await?;
//! let mut changes = map.subscribe();
//! map.set("worker-1", "slot-0").await?;
//! while let Some(event) = changes.recv().await {
//!     println!("{event:?}: now {} workers", map.len());
//! }
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod codec;
mod error;
mod keys;
mod listener;
mod map;
mod replica;
mod scripts;
mod subscription;

pub use codec::{decode_list, encode_list, netstring_len, netstrings, push_netstring};
pub use error::{Error, Result};
pub use map::{Map, MapOptions, Swap, Ttl};
pub use scripts::{SCRIPT_LIBRARY, assemble};
pub use subscription::{MapEvent, Subscription};
