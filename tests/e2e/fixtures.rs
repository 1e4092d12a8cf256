//! The test kit's promises, checked against real `redis-server` processes:
//! every other test relies on them.

use pulse_testkit::server::Listen;
use pulse_testkit::{RedisServer, assert_no_keys, keys_under, shared_redis_url, unique};

#[tokio::test]
async fn private_server_reads_back_what_was_written() {
    let server = RedisServer::start();
    let mut conn = server.connect().await;
    let name = unique("private_server_reads_back");
    let key = format!("pulse:{{{name}}}:greeting");

    redis::cmd("SET").arg(&key).arg("hello").exec_async(&mut conn).await.unwrap();
    let value: String = redis::cmd("GET").arg(&key).query_async(&mut conn).await.unwrap();
    assert_eq!(value, "hello");

    redis::cmd("DEL").arg(&key).exec_async(&mut conn).await.unwrap();
    assert_no_keys(&mut conn, &name).await;
}

#[tokio::test]
async fn leak_check_finds_what_a_test_left_behind() {
    let mut conn = pulse_testkit::connect(shared_redis_url()).await;
    let name = unique("leak_check_finds");
    let other = unique("leak_check_finds");
    let left = format!("pulse:{{{name}}}:left");
    redis::cmd("RPUSH").arg(&left).arg("x").exec_async(&mut conn).await.unwrap();

    assert_eq!(keys_under(&mut conn, &name).await, vec![left.clone()]);
    // Names from the same base never overlap, so a neighbour's check passes.
    assert_no_keys(&mut conn, &other).await;

    let report = tokio::spawn({
        let mut conn = conn.clone();
        let name = name.clone();
        async move { assert_no_keys(&mut conn, &name).await }
    })
    .await
    .expect_err("the leak check must fail while a key remains");
    let message = report.into_panic();
    let message = message.downcast_ref::<String>().expect("a formatted panic message");
    assert!(message.contains(&left) && message.contains("list"), "unexpected report: {message}");

    redis::cmd("DEL").arg(&left).exec_async(&mut conn).await.unwrap();
    assert_no_keys(&mut conn, &name).await;
}

#[tokio::test]
async fn restart_empties_the_server_on_the_same_address() {
    let mut server = RedisServer::start();
    let url = server.url().to_owned();
    let first_pid = server.pid().unwrap();
    let mut conn = server.connect().await;
    redis::cmd("SET").arg("before-restart").arg("1").exec_async(&mut conn).await.unwrap();

    server.kill();
    assert_eq!(server.pid(), None);
    let err = redis::cmd("PING").exec_async(&mut conn).await;
    assert!(err.is_err(), "a killed server must not answer");

    server.restart();
    assert_eq!(server.url(), url);
    assert_ne!(server.pid().unwrap(), first_pid);
    let mut conn = server.connect().await;
    let value: Option<String> = redis::cmd("GET").arg("before-restart").query_async(&mut conn).await.unwrap();
    assert_eq!(value, None, "the server keeps nothing across a restart");
}

#[tokio::test]
async fn tcp_server_serves_on_loopback_and_keeps_its_port() {
    let mut server = RedisServer::start_on(Listen::Tcp);
    assert!(server.url().starts_with("redis://127.0.0.1:"), "{}", server.url());
    let mut conn = server.connect().await;
    redis::cmd("PING").exec_async(&mut conn).await.unwrap();

    let url = server.url().to_owned();
    server.restart();
    assert_eq!(server.url(), url);
    let mut conn = server.connect().await;
    redis::cmd("PING").exec_async(&mut conn).await.unwrap();
}

#[tokio::test]
async fn paused_server_answers_once_resumed() {
    let server = RedisServer::start();
    let mut conn = server.connect().await;
    server.pause();
    let ping = {
        let mut conn = conn.clone();
        tokio::spawn(async move { redis::cmd("PING").query_async::<String>(&mut conn).await })
    };
    // A frozen server holds the reply back; nothing to wait on but time, so
    // give it a moment and check that no answer came.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!ping.is_finished(), "a paused server must not answer");
    server.resume();
    assert_eq!(ping.await.unwrap().unwrap(), "PONG");
    redis::cmd("PING").exec_async(&mut conn).await.unwrap();
}

#[tokio::test]
async fn dropping_a_server_kills_its_process() {
    let server = RedisServer::start();
    let pid = server.pid().unwrap();
    drop(server);
    let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
    assert!(!alive, "redis-server {pid} outlived its fixture");
}
