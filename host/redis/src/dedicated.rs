//! Connections of their own, for reads that block.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, Value};

use crate::shared::bounded;
use crate::target::{Redis, Target};

/// A connection of its own: a blocked `XREAD` holds up whatever is queued
/// behind it on its connection, so each blocking reader has one. It does
/// not reconnect: a reader whose read failed asks for a new one, which
/// behind Sentinel goes to the primary the sentinels name then (a
/// primary turned replica ends its blocked reads with `UNBLOCKED`).
pub struct Dedicated(Kind);

enum Kind {
    Server(MultiplexedConnection),
    /// With how long a request may take.
    Cluster(ClusterConnection, Duration),
}

impl std::fmt::Debug for Dedicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Kind::Server(_) => "Dedicated(server)",
            Kind::Cluster(..) => "Dedicated(cluster)",
        })
    }
}

impl Redis {
    /// A new connection of its own whose answers may take up to
    /// `response_timeout` (a blocking read's block time and some slack).
    ///
    /// # Errors
    /// When Redis cannot be reached.
    pub async fn dedicated(&self, response_timeout: Duration) -> redis::RedisResult<Dedicated> {
        let connect = Duration::from_secs(1);
        if let Target::Cluster { data: client, .. } = &*self.0 {
            // The bound goes around each request, not to redis-rs (see
            // `shared::bounded`).
            let config = redis::cluster::ClusterConfig::new().set_connection_timeout(connect);
            let conn = client.get_async_connection_with_config(config).await?;
            return Ok(Dedicated(Kind::Cluster(conn, response_timeout)));
        }
        let server = self.server().await?.expect("a single server or a primary behind Sentinel");
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(response_timeout));
        Ok(Dedicated(Kind::Server(server.get_multiplexed_async_connection_with_config(&config).await?)))
    }
}

impl ConnectionLike for Dedicated {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Kind::Server(conn) => conn.req_packed_command(cmd),
            Kind::Cluster(conn, timeout) => Box::pin(bounded(*timeout, conn.req_packed_command(cmd))),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Kind::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            Kind::Cluster(conn, timeout) => {
                Box::pin(bounded(*timeout, conn.req_packed_commands(pipeline, offset, count)))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Kind::Server(conn) => conn.get_db(),
            Kind::Cluster(conn, _) => conn.get_db(),
        }
    }
}
