//! Adding events; a bounded length that never drops an unacknowledged one.

use std::time::Duration;

use pulse_streams::{Error, SinkOptions, Start, StreamOptions, Ttl};
use pulse_testkit::unique;

use crate::{PATIENCE, destroy_and_check, open};

#[tokio::test]
async fn add_returns_increasing_ids_and_stores_name_payload_and_topic() {
    let name = unique("add");
    let stream = open(&name, StreamOptions::default()).await;
    let first = stream.add("created", b"\x00\xffbinary", Some("orders")).await.unwrap();
    let second = stream.add("updated", b"", None).await.unwrap();
    assert!(first < second || first.len() < second.len(), "{first} then {second}");
    assert_eq!(stream.len().await.unwrap(), 2);

    let entries = entries(&name).await;
    let fields: Vec<_> =
        entries.ids[0].map.keys().cloned().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(fields, ["n", "p", "t"]);
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn latest_reads_the_newest_events_newest_first() {
    let name = unique("latest");
    let stream = open(&name, StreamOptions::default()).await;
    assert!(stream.latest(5).await.unwrap().is_empty(), "a stream not yet created has no events");
    for i in 0..4 {
        stream.add("e", i.to_string().as_bytes(), Some("k")).await.unwrap();
    }
    let latest = stream.latest(3).await.unwrap();
    assert_eq!(crate::payloads(&latest), ["3", "2", "1"]);
    assert_eq!(latest[0].topic.as_deref(), Some("k"));
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn a_full_stream_trims_only_what_every_group_acknowledged_then_refuses() {
    let name = unique("bounded");
    let stream = open(&name, StreamOptions::default().max_len(4)).await;
    let mut fast = stream.sink("fast", SinkOptions::default().start(Start::Oldest)).await.unwrap();
    let mut slow = stream.sink("slow", SinkOptions::default().start(Start::Oldest)).await.unwrap();
    for i in 0..4 {
        stream.add("e", i.to_string().as_bytes(), None).await.unwrap();
    }
    // `fast` acknowledges everything, `slow` only the first two.
    for _ in 0..4 {
        let event = tokio::time::timeout(PATIENCE, fast.recv()).await.unwrap().unwrap();
        fast.ack(&event.id).await.unwrap();
    }
    for i in 0..4 {
        let event = tokio::time::timeout(PATIENCE, slow.recv()).await.unwrap().unwrap();
        if i < 2 {
            slow.ack(&event.id).await.unwrap();
        }
    }
    // Room is made from the two entries both groups acknowledged.
    stream.add("e", b"4", None).await.unwrap();
    stream.add("e", b"5", None).await.unwrap();
    let error = stream.add("e", b"6", None).await.unwrap_err();
    assert!(matches!(error, Error::Full { max_len: 4, .. }), "{error}");
    assert!(error.to_string().contains("full"), "{error}");

    // What `slow` has not acknowledged is all still there.
    let kept: Vec<String> = entries(&name)
        .await
        .ids
        .iter()
        .map(|e| match &e.map["p"] {
            redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kept, ["2", "3", "4", "5"]);
    fast.close().await;
    slow.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn ttl_is_absolute_or_sliding() {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    for (ttl, renewed) in
        [(Ttl::Absolute(Duration::from_secs(60)), false), (Ttl::Sliding(Duration::from_secs(60)), true)]
    {
        let name = unique("ttl");
        let key = format!("pulse:{{{name}}}:stream:{name}");
        let stream = open(&name, StreamOptions::default().ttl(ttl)).await;
        stream.add("e", b"", None).await.unwrap();
        redis::cmd("PEXPIRE").arg(&key).arg(30_000).exec_async(&mut conn).await.unwrap();
        stream.add("e", b"", None).await.unwrap();
        let left: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut conn).await.unwrap();
        assert_eq!(left > 30_000, renewed, "{ttl:?}: {left} ms left");
        destroy_and_check(&stream, &name).await;
    }
}

#[tokio::test]
async fn invalid_names_are_refused() {
    let error = pulse_streams::Stream::open(&crate::client(), "no spaces", StreamOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidName { .. }), "{error}");
    let stream = open(&unique("names"), StreamOptions::default()).await;
    let error = stream.sink("bad group", SinkOptions::default()).await.unwrap_err();
    assert!(error.to_string().contains("group name"), "{error}");
}

/// Every entry of stream `name`, read straight from Redis.
async fn entries(name: &str) -> redis::streams::StreamRangeReply {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    redis::cmd("XRANGE")
        .arg(format!("pulse:{{{name}}}:stream:{name}"))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap()
}
