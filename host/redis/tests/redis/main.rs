//! The three forms of deployment against real servers: a single server, a
//! local Redis Cluster, a primary and replica behind three sentinels.
#![allow(clippy::unwrap_used, reason = "tests: a panic is the failure report")]

use std::time::Duration;

use futures_util::StreamExt;
use pulse_redis::{Error, Redis};
use pulse_testkit::{RedisCluster, RedisSentinels, RedisServer};

/// How long a test waits for something that takes seconds (a failover).
const PATIENCE: Duration = Duration::from_secs(60);

fn wrong_form(error: Error) -> String {
    match error {
        Error::WrongForm(message) => message,
        other => panic!("expected a wrong form, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_form_refuses_a_server_of_another_form() {
    let single = RedisServer::start_tcp_with(&[]);
    let cluster = RedisCluster::start(3, 0);
    let sentinels = RedisSentinels::start();
    let single_port = single.port();

    let cluster_at_single = Redis::open(&format!("redis+cluster://127.0.0.1:{single_port}/")).unwrap();
    let message = wrong_form(cluster_at_single.verify().await.unwrap_err());
    assert!(message.contains("not a Redis Cluster") && message.contains("redis://"), "{message}");

    let node_url = format!(
        "redis://{}/",
        cluster.url().trim_start_matches("redis+cluster://").split(',').next().unwrap()
    );
    let message = wrong_form(Redis::open(&node_url).unwrap().verify().await.unwrap_err());
    assert!(message.contains("Redis Cluster node") && message.contains("redis+cluster://"), "{message}");

    let sentinel_port = sentinels.sentinels[0].port();
    let single_at_sentinel = Redis::open(&format!("redis://127.0.0.1:{sentinel_port}/")).unwrap();
    let message = wrong_form(single_at_sentinel.verify().await.unwrap_err());
    assert!(message.contains("Sentinel") && message.contains("redis+sentinel://"), "{message}");

    let unknown = Redis::open(&format!("redis+sentinel://127.0.0.1:{sentinel_port}/no-such-master")).unwrap();
    let message = wrong_form(unknown.verify().await.unwrap_err());
    assert!(message.contains("no-such-master"), "{message}");

    // Seeds that do not answer: a Redis error, not a hang.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let nobody = Redis::open(&format!("redis+cluster://127.0.0.1:{silent}/")).unwrap();
    let error = tokio::time::timeout(PATIENCE, nobody.verify()).await.expect("verify answers");
    assert!(matches!(error, Err(Error::Redis(_))), "{error:?}");

    // And each form accepts its own.
    Redis::open(&cluster.url()).unwrap().verify().await.unwrap();
    Redis::open(&sentinels.url()).unwrap().verify().await.unwrap();
    Redis::open(single.url()).unwrap().verify().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_routes_by_slot_and_its_subscriptions_hear_every_node() {
    let cluster = RedisCluster::start(3, 0);
    let redis = Redis::open(&cluster.url()).unwrap();
    let mut conn = redis.shared().await.unwrap();
    // Keys of many slots, through one connection.
    for i in 0..64 {
        let _: () = redis::cmd("SET").arg(format!("key-{i}")).arg(i).query_async(&mut conn).await.unwrap();
    }
    for i in 0..64 {
        let value: i64 = redis::cmd("GET").arg(format!("key-{i}")).query_async(&mut conn).await.unwrap();
        assert_eq!(value, i);
    }
    // A pipeline of one hash tag goes to one node.
    let (a, b): (i64, i64) =
        redis::pipe().incr("{t}:a", 1).incr("{t}:b", 2).query_async(&mut conn).await.unwrap();
    assert_eq!((a, b), (1, 2));
    // Published through any node, heard by one subscription.
    let mut messages = redis.subscribe("changes").await.unwrap();
    let mut cluster = cluster;
    for (i, node) in cluster.nodes().iter().enumerate() {
        let mut direct = pulse_testkit::connect(&format!("redis://127.0.0.1:{}/", node.port())).await;
        let _: i64 =
            redis::cmd("PUBLISH").arg("changes").arg(format!("m{i}")).query_async(&mut direct).await.unwrap();
    }
    for i in 0..3 {
        let message = tokio::time::timeout(PATIENCE, messages.next()).await.unwrap().unwrap();
        assert_eq!(message, format!("m{i}").into_bytes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_connection_follows_a_sentinel_failover() {
    let mut set = RedisSentinels::start();
    let redis = Redis::open(&set.url()).unwrap();
    let mut conn = redis.shared().await.unwrap();
    let _: () = redis::cmd("SET").arg("before").arg("1").query_async(&mut conn).await.unwrap();
    let _: i64 = redis::cmd("WAIT").arg(1).arg(5000).query_async(&mut conn).await.unwrap();
    let old = set.primary_port();
    assert_eq!(old, set.servers[0].port());
    set.servers[0].kill();
    // Writes fail until the sentinels promote the replica, then go there.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let written: redis::RedisResult<()> =
            redis::cmd("SET").arg("after").arg("2").query_async(&mut conn).await;
        if written.is_ok() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no write after the failover: {written:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(set.primary_port(), set.servers[1].port());
    let before: String = redis::cmd("GET").arg("before").query_async(&mut conn).await.unwrap();
    assert_eq!(before, "1");
    // A new dedicated connection and subscription go to the new primary.
    let mut dedicated = redis.dedicated(Duration::from_secs(5)).await.unwrap();
    let after: String = redis::cmd("GET").arg("after").query_async(&mut dedicated).await.unwrap();
    assert_eq!(after, "2");
}

/// Stops every client's commands on the servers at `urls` for `pause`
/// (`CLIENT PAUSE … ALL`): what a Redis busy with a long script or a fork
/// looks like to its clients.
async fn pause_servers(urls: &[String], pause: Duration) {
    for url in urls {
        let mut direct = pulse_testkit::connect(url).await;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(pause.as_millis() as u64)
            .arg("ALL")
            .query_async(&mut direct)
            .await
            .unwrap();
    }
}

/// A command on a shared connection waits for a Redis that answers late
/// (past redis-rs's own 500 ms) and fails once the response timeout set
/// has passed; the connection then serves the next command.
async fn answers_late_and_times_out(redis: &Redis, servers: &[String]) {
    assert_eq!(redis.response_timeout(), pulse_redis::DEFAULT_RESPONSE_TIMEOUT);
    let mut conn = redis.shared().await.unwrap();
    let _: () = redis::cmd("SET").arg("late").arg("1").query_async(&mut conn).await.unwrap();
    // Well within the 5 s, and past 500 ms even on a slow machine.
    pause_servers(servers, Duration::from_secs(2)).await;
    let late: String = redis::cmd("GET").arg("late").query_async(&mut conn).await.unwrap();
    assert_eq!(late, "1");

    let short = redis.clone().with_response_timeout(Duration::from_millis(300));
    let mut conn = short.shared().await.unwrap();
    // Far past 300 ms: the GET below is sent while it lasts.
    pause_servers(servers, Duration::from_secs(3)).await;
    let failed: redis::RedisResult<String> = redis::cmd("GET").arg("late").query_async(&mut conn).await;
    let error = failed.expect_err("a GET past a 300 ms response timeout fails");
    assert!(error.is_timeout(), "a timeout: {error:?}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let again: redis::RedisResult<String> = redis::cmd("GET").arg("late").query_async(&mut conn).await;
        match again {
            Ok(value) => break assert_eq!(value, "1"),
            Err(error) => {
                assert!(tokio::time::Instant::now() < deadline, "no answer after the pause: {error:?}")
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_connection_waits_for_a_late_answer_up_to_its_response_timeout() {
    let single = RedisServer::start_tcp_with(&[]);
    answers_late_and_times_out(&Redis::open(single.url()).unwrap(), &[single.url().to_owned()]).await;
    let mut cluster = RedisCluster::start(3, 0);
    let masters: Vec<String> =
        cluster.nodes().iter().map(|node| format!("redis://127.0.0.1:{}/", node.port())).collect();
    answers_late_and_times_out(&Redis::open(&cluster.url()).unwrap(), &masters).await;
}
