//! One way to reach Redis for the whole process: a single server, a
//! primary behind Sentinel, or a Redis Cluster, each named by one URL.
//!
//! Every crate above this one (maps, streams, the pool) takes a [`Redis`]
//! and asks it for the three kinds of connection it needs, so none of them
//! knows which form of deployment it runs on:
//! - [`Redis::shared`]: the multiplexed connection that ordinary commands
//!   and scripts share; it reconnects by itself and, behind Sentinel,
//!   follows a failover to the new primary. Its answers may take up to
//!   [`Redis::response_timeout`] (5 s unless set), on every form.
//! - [`Redis::dedicated`]: a connection of its own, for reads that block
//!   (a blocked read would hold up every command queued behind it).
//! - [`Redis::subscribe`]: the messages of one pub/sub channel, ending
//!   when the connection drops, so the subscriber knows to catch up.
//! - [`Redis::doorbell`]: on a cluster, what a stream's writers publish
//!   for its readers (sharded pub/sub), on one connection for every
//!   stream of the process.
//!
//! # Layout
//! - `target`: the URL forms ([`Redis::open`]), their settings (TLS, ACL
//!   users, `TCP_NODELAY`) and the check that the server is of the form
//!   the URL names ([`Redis::verify`]).
//! - `shared`: [`Shared`], and how it follows a Sentinel failover.
//! - `dedicated`: [`Dedicated`].
//! - `subscribe`: [`Subscription`].
//! - `doorbell`: [`Doorbell`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), pulse_redis::Error> {
//! let redis = pulse_redis::Redis::open("redis+cluster://127.0.0.1:7000,127.0.0.1:7001/")?;
//! redis.verify().await?;
//! let mut conn = redis.shared().await?;
//! let _: () = redis::cmd("SET").arg("{p}:a").arg(1).query_async(&mut conn).await?;
//! # Ok(())
//! # }
//! ```

mod dedicated;
mod doorbell;
mod shared;
mod subscribe;
mod target;

pub use dedicated::Dedicated;
pub use doorbell::{Doorbell, Ring};
pub use shared::{Shared, key_slot};
pub use subscribe::Subscription;
pub use target::{DEFAULT_RESPONSE_TIMEOUT, Error, Form, Redis, cluster_seeds};
