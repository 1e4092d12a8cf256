//! Sinks: each event to one consumer; nothing stranded.

use std::collections::BTreeSet;
use std::time::Duration;

use pulse_streams::{Event, Sink, SinkOptions, Start, StreamOptions};
use pulse_testkit::unique;

use crate::{PATIENCE, destroy_and_check, open, payloads, text};

pub async fn next(sink: &mut Sink) -> Event {
    tokio::time::timeout(PATIENCE, sink.recv()).await.expect("an event in time").expect("an open sink")
}

fn quick_grace() -> SinkOptions {
    SinkOptions::default().start(Start::Oldest).ack_grace(Duration::from_millis(400))
}

#[tokio::test]
async fn each_event_goes_to_one_consumer_of_the_group() {
    let name = unique("one_each");
    let stream = open(&name, StreamOptions::default()).await;
    let mut sinks = Vec::new();
    for _ in 0..3 {
        sinks.push(stream.sink("workers", SinkOptions::default()).await.unwrap());
    }
    let mut other_group = stream.sink("auditors", SinkOptions::default()).await.unwrap();
    let sent: BTreeSet<String> = (0..60).map(|i| format!("{i:02}")).collect();
    for payload in &sent {
        stream.add("e", payload.as_bytes(), None).await.unwrap();
    }
    let mut received = Vec::new();
    while received.len() < sent.len() {
        for sink in &mut sinks {
            if let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(20), sink.recv()).await {
                sink.ack(&event.id).await.unwrap();
                received.push(String::from_utf8(event.payload).unwrap());
            }
        }
    }
    let unique_received: BTreeSet<String> = received.iter().cloned().collect();
    assert_eq!(received.len(), sent.len(), "an event was delivered twice");
    assert_eq!(unique_received, sent);
    // Another group gets its own copy of every event, in order.
    let mut audited = Vec::new();
    for _ in 0..sent.len() {
        let event = next(&mut other_group).await;
        other_group.ack(&event.id).await.unwrap();
        audited.push(event);
    }
    assert_eq!(payloads(&audited), sent.into_iter().collect::<Vec<_>>());
    for sink in &mut sinks {
        sink.close().await;
    }
    other_group.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn an_event_left_unacknowledged_by_a_dead_consumer_is_delivered_to_a_live_one() {
    let name = unique("redeliver");
    let stream = open(&name, StreamOptions::default()).await;
    let mut doomed = stream.sink("workers", quick_grace()).await.unwrap();
    stream.add("e", b"held", None).await.unwrap();
    let held = next(&mut doomed).await;
    let doomed_name = doomed.consumer().to_owned();
    // It dies holding the event: its tasks stop, nothing is acknowledged.
    drop(doomed);

    let mut survivor = stream.sink("workers", quick_grace()).await.unwrap();
    let redelivered = next(&mut survivor).await;
    assert_eq!(redelivered.id, held.id);
    survivor.ack(&redelivered.id).await.unwrap();

    // Once it holds nothing and stayed silent, the dead consumer is removed.
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let key = format!("pulse:{{{name}}}:stream:{name}");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let consumers: Vec<redis::Value> = redis::cmd("XINFO")
            .arg("CONSUMERS")
            .arg(&key)
            .arg("workers")
            .query_async(&mut conn)
            .await
            .unwrap();
        if !format!("{consumers:?}").contains(&doomed_name) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the dead consumer was never removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And an acknowledged event never comes back.
    stream.add("e", b"after", None).await.unwrap();
    let after = next(&mut survivor).await;
    assert_eq!(payloads(&[after]), ["after"]);
    survivor.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn a_malformed_entry_is_acknowledged_and_skipped() {
    let name = unique("malformed_sink");
    let stream = open(&name, StreamOptions::default()).await;
    let mut sink = stream.sink("workers", SinkOptions::default()).await.unwrap();
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let key = format!("pulse:{{{name}}}:stream:{name}");
    redis::cmd("XADD").arg(&key).arg("*").arg("garbage").arg("1").exec_async(&mut conn).await.unwrap();
    stream.add("e", b"fine", None).await.unwrap();
    let event = next(&mut sink).await;
    assert_eq!(text(&event), "fine");
    sink.ack(&event.id).await.unwrap();
    let pending: (i64, Option<String>, Option<String>, Option<Vec<redis::Value>>) =
        redis::cmd("XPENDING").arg(&key).arg("workers").query_async(&mut conn).await.unwrap();
    assert_eq!(pending.0, 0, "the malformed entry is not left pending");
    sink.close().await;
    destroy_and_check(&stream, &name).await;
}
