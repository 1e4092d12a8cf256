//! The connection every command shares, and how it follows a Sentinel
//! failover.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::target::{Error, Redis, Sentinel, Target};

/// The multiplexed connection commands and scripts share: clone it
/// freely. It reconnects by itself after a drop. On a cluster it routes
/// each command by its key's slot and follows `MOVED`; behind Sentinel it
/// asks the sentinels for the primary again when the one it knows stops
/// answering or turned replica (`READONLY`), and moves to the new one.
#[derive(Clone)]
pub struct Shared(Kind);

#[derive(Clone)]
enum Kind {
    Single(ConnectionManager),
    /// With how long a command may take, in all (see [`bounded`]).
    Cluster(ClusterConnection, Duration),
    Following(Arc<Following>),
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            Kind::Single(_) => "Shared(single)",
            Kind::Cluster(..) => "Shared(cluster)",
            Kind::Following(_) => "Shared(sentinel)",
        })
    }
}

impl Redis {
    /// A new shared connection.
    ///
    /// # Errors
    /// When Redis cannot be reached (behind Sentinel: when no sentinel
    /// names a primary that answers).
    pub async fn shared(&self) -> redis::RedisResult<Shared> {
        let kind = match &*self.0 {
            Target::Single(client) => Kind::Single(manager(client.clone(), self.response_timeout()).await?),
            Target::Cluster { data: client, .. } => {
                Kind::Cluster(client.get_async_connection().await?, self.response_timeout())
            }
            Target::Sentinel(sentinel) => {
                let (address, conn) = Following::primary(sentinel, self.response_timeout()).await?;
                Kind::Following(Arc::new(Following {
                    redis: self.clone(),
                    current: RwLock::new(Current { generation: 0, address, conn }),
                    follow: tokio::sync::Mutex::new(()),
                }))
            }
        };
        Ok(Shared(kind))
    }
}

/// A connection manager for one server whose answers may take up to
/// `response_timeout` (redis-rs's own default is 500 ms).
async fn manager(client: redis::Client, response_timeout: Duration) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new().set_response_timeout(Some(response_timeout));
    ConnectionManager::new_with_config(client, config).await
}

/// A connection to the primary the sentinels named last.
struct Following {
    redis: Redis,
    current: RwLock<Current>,
    /// Held while the sentinels are asked, so one failure asks once.
    follow: tokio::sync::Mutex<()>,
}

struct Current {
    /// Counts the moves, so a caller whose command failed on a primary
    /// already left does not ask again.
    generation: u64,
    address: String,
    conn: ConnectionManager,
}

/// Whether a failure may mean the primary changed: it stopped answering,
/// or it answers as a replica now.
fn may_have_moved(error: &redis::RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "UNBLOCKED"))
}

impl Following {
    fn current(&self) -> (u64, ConnectionManager) {
        // A poisoned lock only means a panic elsewhere while cloning; the
        // value inside is whole.
        let current = self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        (current.generation, current.conn.clone())
    }

    /// Asks the sentinels for the primary and moves there if it is another
    /// server than the one that failed (`generation`). Failures are logged
    /// and left: the command that failed reports its own error, and the
    /// next failure asks again.
    async fn follow(&self, generation: u64) {
        let _asking = self.follow.lock().await;
        if self.current().0 != generation {
            return;
        }
        let Target::Sentinel(sentinel) = &*self.redis.0 else { return };
        match Self::primary(sentinel, self.redis.response_timeout()).await {
            Ok((address, conn)) => {
                let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                if current.address != address {
                    tracing::info!(from = %current.address, to = %address, "following the primary the sentinels name");
                    *current = Current { generation: generation + 1, address, conn };
                }
            }
            Err(error) => {
                tracing::debug!(%error, "no sentinel named a primary that answers; asking again on the next failure")
            }
        }
    }

    /// Runs `request` on the current primary's connection; a failure that
    /// may mean the primary moved makes it ask the sentinels first.
    async fn run<T>(
        &self,
        request: impl AsyncFnOnce(&mut ConnectionManager) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let (generation, mut conn) = self.current();
        let result = request(&mut conn).await;
        if let Err(error) = &result
            && may_have_moved(error)
        {
            self.follow(generation).await;
        }
        result
    }

    async fn primary(
        sentinel: &Sentinel,
        response_timeout: Duration,
    ) -> Result<(String, ConnectionManager), Error> {
        let client = sentinel.primary().await?;
        let address = client.get_connection_info().addr().to_string();
        Ok((address, manager(client, response_timeout).await?))
    }
}

/// `request`, or a timeout error once `timeout` has passed.
///
/// On a cluster the bound is kept here, around the whole request, and not
/// given to redis-rs as each node connection's response timeout: a request
/// that timed out on a node connection and was retried by the cluster
/// connection had not returned 5 minutes later (redis-rs 1.8.1, masters
/// paused with `CLIENT PAUSE`; this crate's tests cover the bound). A late
/// answer is then read and dropped, and the connection stays in use.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(timeout, request).await {
        Ok(answer) => answer,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("Redis did not answer within {timeout:?} (redis.response_timeout)"),
        )
        .into()),
    }
}

impl ConnectionLike for Shared {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Kind::Single(conn) => conn.req_packed_command(cmd),
            Kind::Cluster(conn, timeout) => Box::pin(bounded(*timeout, conn.req_packed_command(cmd))),
            Kind::Following(following) => {
                let following = following.clone();
                Box::pin(async move { following.run(async |conn| conn.req_packed_command(cmd).await).await })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Kind::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Kind::Cluster(conn, timeout) => {
                Box::pin(bounded(*timeout, conn.req_packed_commands(pipeline, offset, count)))
            }
            Kind::Following(following) => {
                let following = following.clone();
                Box::pin(async move {
                    following.run(async |conn| conn.req_packed_commands(pipeline, offset, count).await).await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Kind::Single(conn) => conn.get_db(),
            Kind::Cluster(conn, _) => conn.get_db(),
            Kind::Following(following) => following.current().1.get_db(),
        }
    }
}

impl Shared {
    /// One `SCAN` step (from `cursor`; `0` starts) over the keys matching
    /// `pattern` on the server that holds `beside`'s slot: the next cursor
    /// (`0` when done) and a batch of keys. The keys of one hash tag share
    /// a slot, so with `beside` of that tag this finds all of them; an
    /// unrouted `SCAN` on a cluster would read one node picked at random.
    ///
    /// # Errors
    /// When Redis fails.
    pub async fn scan_beside(
        &mut self,
        beside: &str,
        pattern: &str,
        cursor: u64,
    ) -> redis::RedisResult<(u64, Vec<String>)> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000);
        let answer = match &mut self.0 {
            Kind::Cluster(conn, timeout) => {
                let route = Route::new(key_slot(beside.as_bytes()), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                bounded(*timeout, conn.route_command(scan, routing)).await?
            }
            _ => scan.query_async::<Value>(self).await?,
        };
        Ok(redis::from_redis_value(answer)?)
    }
}

/// The cluster hash slot of `key`: CRC16 (XModem) of its hash tag (the
/// text between the first `{` and the next `}`, when not empty) or of the
/// whole key, modulo 16,384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter().position(|&b| b == b'}').filter(|&close| close > 0).map(|close| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(key) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16_384
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_slots_are_those_of_redis() {
        // From the cluster specification and `CLUSTER KEYSLOT` of Redis 7.0.
        assert_eq!(super::key_slot(b"123456789"), 0x31C3);
        assert_eq!(super::key_slot(b"foo"), 12182);
        assert_eq!(super::key_slot(b"pulse:{p}:jobs"), super::key_slot(b"p"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(super::key_slot(b"foo{}"), 5542);
    }
}
