//! Redis restarts, loses data or expires the map: replicas notice, reload
//! and converge, and leak no task or subscription.

use std::time::Duration;

use pulse_rmap::{Map, MapEvent, MapOptions, Ttl};
use pulse_testkit::{RedisServer, unique};
use tokio_util_free::Stop;

use crate::{PATIENCE, eventually, join};

/// A tiny stop flag for writer loops (no extra dependency).
mod tokio_util_free {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Clone, Default)]
    pub struct Stop(Arc<AtomicBool>);

    impl Stop {
        pub fn stop(&self) {
            self.0.store(true, Ordering::Release);
        }
        pub fn stopped(&self) -> bool {
            self.0.load(Ordering::Acquire)
        }
    }
}

async fn content(
    conn: &mut redis::aio::MultiplexedConnection,
    hash: &str,
) -> std::collections::HashMap<String, String> {
    let mut fields: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(hash).query_async(conn).await.unwrap();
    fields.retain(|k, _| !k.starts_with('='));
    fields
}

async fn numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> i64 {
    let (_, count): (String, i64) =
        redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(conn).await.unwrap();
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_recover_from_a_redis_restart_with_a_writer_active() {
    let mut server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let name = "restarted";
    let hash = format!("pulse:{{{name}}}:map:{name}");
    let channel = format!("{hash}:changes");
    let replicas = [
        Map::join(&client, name, MapOptions::default()).await.unwrap(),
        Map::join(&client, name, MapOptions::default()).await.unwrap(),
    ];
    let mut heard = replicas[0].subscribe();
    replicas[0].set_and_wait("before", "restart", PATIENCE).await.unwrap();

    let stop = Stop::default();
    let writer = {
        let map = replicas[1].clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut written = 0u64;
            while !stop.stopped() {
                // Fails while Redis is down: the writer carries on.
                if map.set("counter", &written.to_string()).await.is_ok() {
                    written += 1;
                }
                tokio::task::yield_now().await;
            }
            written
        })
    };
    eventually(&replicas[0], "the writer writes", |m| m.get("counter").is_some()).await;
    server.restart();
    let mut conn = server.connect().await;
    // Writes land in the new, empty Redis.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !content(&mut conn, &hash).await.contains_key("counter") {
        assert!(tokio::time::Instant::now() < deadline, "no write reached the restarted Redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.stop();
    writer.await.unwrap();

    let expected = content(&mut conn, &hash).await;
    assert!(!expected.contains_key("before"), "the restarted Redis is empty but for new writes");
    for map in &replicas {
        eventually(map, "the replica equals the restarted Redis", |m| m.snapshot() == expected).await;
        assert_eq!(map.background_tasks(), 1, "one listener, however many reconnects");
    }
    // The subscriber heard of the reload.
    let mut resynced = false;
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(100), heard.recv()).await {
        resynced |= matches!(event, MapEvent::Resynced | MapEvent::Lagged);
    }
    assert!(resynced, "the subscriber was not told about the reload");
    assert_eq!(numsub(&mut conn, &channel).await, 2, "exactly one subscription per replica on the server");
    assert_eq!(replicas[0].subscriber_count(), 1);

    for map in &replicas {
        map.close().await;
        assert_eq!(map.background_tasks(), 0);
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while numsub(&mut conn, &channel).await != 0 {
        assert!(tokio::time::Instant::now() < deadline, "closed replicas are still subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_map_deleted_behind_the_replicas_back_is_detected_by_its_epoch() {
    let name = unique("deleted_behind");
    let (writer, watcher) = (join(&name).await, join(&name).await);
    writer.set("old-1", "x").await.unwrap();
    writer.set_and_wait("old-2", "y", PATIENCE).await.unwrap();
    eventually(&watcher, "the watcher has both keys", |m| m.len() == 2).await;

    // Redis loses the hash (an operator, a flush, an eviction): no message.
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    redis::cmd("DEL").arg(format!("pulse:{{{name}}}:map:{name}")).exec_async(&mut conn).await.unwrap();
    // The next write starts a new epoch at revision 1; replicas must not
    // ignore it as an old revision, but reload.
    writer.set("new", "z").await.unwrap();
    for map in [&writer, &watcher] {
        eventually(map, "the replica shows only the new key", |m| {
            m.keys() == ["new"] && m.get("new").as_deref() == Some("z")
        })
        .await;
    }
    writer.destroy().await.unwrap();
    writer.close().await;
    watcher.close().await;
}

#[tokio::test]
async fn absolute_ttl_is_set_once_and_sliding_ttl_is_renewed() {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;

    let (map, left) =
        ttl_after_a_write(&mut conn, "absolute_ttl", Ttl::Absolute(Duration::from_secs(60))).await;
    assert!(left > 0 && left <= 30_000, "an absolute TTL is not extended by writes: {left} ms");
    map.destroy().await.unwrap();
    map.close().await;

    let (map, left) =
        ttl_after_a_write(&mut conn, "sliding_ttl", Ttl::Sliding(Duration::from_secs(60))).await;
    assert!(left > 30_000, "a sliding TTL is renewed by writes: {left} ms");
    let name = map.name().to_owned();

    // Once expired, the map starts over under a new epoch and replicas follow.
    redis::cmd("PEXPIRE")
        .arg(format!("pulse:{{{name}}}:map:{name}"))
        .arg(1)
        .exec_async(&mut conn)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while pttl(&mut conn, &name).await != -2 {
        assert!(tokio::time::Instant::now() < deadline, "the map did not expire");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    map.set("after", "3").await.unwrap();
    eventually(&map, "only the key written after expiry remains", |m| m.keys() == ["after"]).await;
    map.destroy().await.unwrap();
    map.close().await;
}

/// The map's remaining time to live in ms (-2: gone).
async fn pttl(conn: &mut redis::aio::MultiplexedConnection, name: &str) -> i64 {
    redis::cmd("PTTL").arg(format!("pulse:{{{name}}}:map:{name}")).query_async(conn).await.unwrap()
}

/// Joins a map with `ttl`, writes, cuts its TTL to 30 s from outside,
/// writes again, and returns the map and what is left of its TTL.
async fn ttl_after_a_write(conn: &mut redis::aio::MultiplexedConnection, base: &str, ttl: Ttl) -> (Map, i64) {
    let name = unique(base);
    let map = Map::join(&crate::client(), &name, MapOptions::default().ttl(ttl)).await.unwrap();
    map.set("a", "1").await.unwrap();
    redis::cmd("PEXPIRE")
        .arg(format!("pulse:{{{name}}}:map:{name}"))
        .arg(30_000)
        .exec_async(conn)
        .await
        .unwrap();
    map.set("b", "2").await.unwrap();
    let left = pttl(conn, &name).await;
    (map, left)
}

/// Redis goes back to an earlier revision (a failover lost changes it had
/// published) and numbers its next change again: a replica that heard the
/// lost changes reloads instead of skipping the new one as old.
#[tokio::test]
async fn a_revision_heard_twice_makes_the_replicas_reload() {
    let name = unique("went_back");
    let (writer, watcher) = (join(&name).await, join(&name).await);
    writer.set("a", "1").await.unwrap();
    writer.set_and_wait("b", "2", PATIENCE).await.unwrap();
    eventually(&watcher, "the watcher has both keys", |m| m.len() == 2).await;

    // What a promoted replica that missed the last change holds.
    let hash = format!("pulse:{{{name}}}:map:{name}");
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let () = redis::pipe()
        .cmd("HDEL")
        .arg(&hash)
        .arg("b")
        .ignore()
        .cmd("HINCRBY")
        .arg(&hash)
        .arg("=rev")
        .arg(-1)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    writer.set("c", "3").await.unwrap();
    for map in [&writer, &watcher] {
        eventually(map, "the replica holds what Redis holds", |m| {
            let mut keys = m.keys();
            keys.sort();
            keys == ["a", "c"] && m.get("c").as_deref() == Some("3")
        })
        .await;
    }
    writer.destroy().await.unwrap();
    writer.close().await;
    watcher.close().await;
}

/// The map changes without a message (as when a cluster node's
/// subscription is cut off from the others): the replicas find it by
/// comparing revisions, and reload.
#[tokio::test]
async fn a_change_no_message_told_of_is_found_by_the_revision_check() {
    let name = unique("silent");
    let watcher = join(&name).await;
    watcher.set_and_wait("a", "1", PATIENCE).await.unwrap();
    let hash = format!("pulse:{{{name}}}:map:{name}");
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let () = redis::pipe()
        .cmd("HSET")
        .arg(&hash)
        .arg("unheard")
        .arg("2")
        .ignore()
        .cmd("HINCRBY")
        .arg(&hash)
        .arg("=rev")
        .arg(1)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    eventually(&watcher, "the replica has the change", |m| m.get("unheard").as_deref() == Some("2")).await;
    watcher.destroy().await.unwrap();
    watcher.close().await;
}
