//! Test fixtures for pulse-host: every test gets real Redis and real plugins.
//!
//! # Layout
//! - [`server`]: [`RedisServer`], a private `redis-server` process that a
//!   test owns and can kill and restart, and [`shared_redis_url`], the server
//!   the tests of one binary share.
//! - [`topology`]: [`RedisCluster`] and [`RedisSentinels`], local
//!   deployments of several servers for tests of Cluster and Sentinel.
//! - [`names`]: [`unique`] names, so tests on one server never see each
//!   other's keys, and the leak check [`assert_no_keys`].
//! - [`plugins`]: paths to the components `scripts/build-plugins` built.
//! - [`http`]: [`HttpServer`], a loopback HTTP server that counts requests,
//!   for plugins' outgoing requests.
//! - [`otlp`]: [`otlp::collector`], an OTLP/HTTP collector, and the spans
//!   it received, for tests of traces.
//! - [`registry`]: [`Registry`], a private OCI registry for plugins
//!   pushed and pulled.
//! - [`logs`]: [`logs::capture`], log lines with their span fields, for
//!   tests that check what was logged.
//! - [`init_tracing`]: log output for tests, filtered by `RUST_LOG`.
//!
//! ```no_run
//! # async fn example() -> redis::RedisResult<()> {
//! let name = pulse_testkit::unique("set_then_get");
//! let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
//! redis::cmd("SET").arg(format!("{name}:k")).arg("v").exec_async(&mut conn).await?;
//! redis::cmd("DEL").arg(format!("{name}:k")).exec_async(&mut conn).await?;
//! pulse_testkit::assert_no_keys(&mut conn, &name).await;
//! # Ok(())
//! # }
//! ```
//!
//! Fixtures panic on failure: in a test, a panic with the full context is
//! the most useful report.
#![warn(missing_docs)]

pub mod http;
pub mod logs;
pub mod names;
pub mod otlp;
pub mod plugins;
pub mod pools;
pub mod registry;
pub mod server;
pub mod topology;

pub use http::{FencedWrite, HttpServer};
pub use names::{assert_no_keys, keys_under, unique};
pub use pools::slot_table;
pub use registry::Registry;
pub use server::{RedisServer, connect, free_address, shared_redis_url};
pub use topology::{RedisCluster, RedisSentinels, start_replica};

/// Sends `tracing` output of the code under test to the test's captured
/// output, filtered by `RUST_LOG` (default: `warn`). Safe to call from every
/// test; the first call installs the subscriber.
pub fn init_tracing() {
    logs::install();
}
