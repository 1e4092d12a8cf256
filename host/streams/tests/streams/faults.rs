//! Redis restarts and groups destroyed from outside: sinks carry on.

use std::time::Duration;

use pulse_streams::{SinkOptions, Start, Stream, StreamOptions};
use pulse_testkit::RedisServer;

use crate::sinks::next;
use crate::{payloads, text};

fn options() -> SinkOptions {
    SinkOptions::default()
        .start(Start::Oldest)
        .ack_grace(Duration::from_millis(400))
        .block(Duration::from_millis(500))
}

#[tokio::test]
async fn a_sink_recreates_its_group_after_redis_restarts_empty() {
    let mut server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let stream = Stream::open(&client, "inbox", StreamOptions::default()).await.unwrap();
    let mut sink = stream.sink("workers", options()).await.unwrap();
    stream.add("e", b"before", None).await.unwrap();
    let event = next(&mut sink).await;
    sink.ack(&event.id).await.unwrap();

    server.restart();
    // Adds fail until the connection is back; the event must land once.
    let deadline = tokio::time::Instant::now() + crate::PATIENCE;
    while stream.add("e", b"after", None).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the stream never accepted an add again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let event = next(&mut sink).await;
    assert_eq!(text(&event), "after");
    sink.ack(&event.id).await.unwrap();
    sink.close().await;
}

#[tokio::test]
async fn with_an_append_only_file_a_restart_loses_nothing_and_repeats_nothing_acknowledged() {
    let mut server = RedisServer::start_persistent();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let stream = Stream::open(&client, "inbox", StreamOptions::default()).await.unwrap();
    let mut sink = stream.sink("workers", options()).await.unwrap();
    for payload in ["acked-1", "acked-2", "held"] {
        stream.add("e", payload.as_bytes(), None).await.unwrap();
    }
    for _ in 0..2 {
        let event = next(&mut sink).await;
        sink.ack(&event.id).await.unwrap();
    }
    let held = next(&mut sink).await;
    assert_eq!(text(&held), "held");

    server.kill();
    server.restart();
    let deadline = tokio::time::Instant::now() + crate::PATIENCE;
    while stream.add("e", b"new", None).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the stream never accepted an add again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The held event comes back (after the grace period), the new one
    // arrives, and neither acknowledged event is seen again.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let event = next(&mut sink).await;
        sink.ack(&event.id).await.unwrap();
        seen.push(String::from_utf8(event.payload).unwrap());
    }
    seen.sort();
    assert_eq!(seen, ["held", "new"]);
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), sink.recv()).await.is_err(),
        "something came twice"
    );
    sink.close().await;
}

#[tokio::test]
async fn a_group_destroyed_from_outside_is_recreated_from_the_oldest_entry() {
    let server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let stream = Stream::open(&client, "inbox", StreamOptions::default()).await.unwrap();
    let mut sink = stream.sink("workers", options()).await.unwrap();
    stream.add("e", b"first", None).await.unwrap();
    let event = next(&mut sink).await;
    sink.ack(&event.id).await.unwrap();

    let mut conn = server.connect().await;
    redis::cmd("XGROUP")
        .arg("DESTROY")
        .arg("pulse:{inbox}:stream:inbox")
        .arg("workers")
        .exec_async(&mut conn)
        .await
        .unwrap();
    stream.add("e", b"second", None).await.unwrap();
    // Recreated from the oldest entry: the acknowledged `first` comes again
    // (documented), and `second` is not lost.
    let again = next(&mut sink).await;
    sink.ack(&again.id).await.unwrap();
    let then = next(&mut sink).await;
    sink.ack(&then.id).await.unwrap();
    assert_eq!(payloads(&[again, then]), ["first", "second"]);
    sink.close().await;
}
