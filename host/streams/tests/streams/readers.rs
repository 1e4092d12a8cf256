//! Readers: every reader sees every event, in order.

use std::time::{Duration, Instant};

use pulse_streams::{
    Event, Overflow, ReaderEvent, ReaderOptions, ReaderSubscription, Start, StreamOptions, TopicFilter,
};
use pulse_testkit::unique;

use crate::{PATIENCE, destroy_and_check, open, payloads};

async fn next(subscription: &mut ReaderSubscription) -> ReaderEvent {
    tokio::time::timeout(PATIENCE, subscription.recv())
        .await
        .expect("an event in time")
        .expect("an open reader")
}

async fn events(subscription: &mut ReaderSubscription, count: usize) -> Vec<Event> {
    let mut events = Vec::new();
    while events.len() < count {
        match next(subscription).await {
            ReaderEvent::Event(event) => events.push(event),
            other => panic!("unexpected {other:?}"),
        }
    }
    events
}

#[tokio::test]
async fn every_reader_and_subscriber_sees_every_event_in_order() {
    let name = unique("fan_out");
    let stream = open(&name, StreamOptions::default()).await;
    let first = stream.reader(ReaderOptions::default()).await.unwrap();
    let second = stream.reader(ReaderOptions::default()).await.unwrap();
    let mut subscriptions = [first.subscribe(), first.subscribe(), second.subscribe()];
    let sent: Vec<String> = (0..50).map(|i| format!("event-{i}")).collect();
    for payload in &sent {
        stream.add("e", payload.as_bytes(), None).await.unwrap();
    }
    for subscription in &mut subscriptions {
        assert_eq!(payloads(&events(subscription, sent.len()).await), sent);
    }
    first.close().await;
    second.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn filters_pass_exact_topics_and_patterns() {
    let name = unique("filters");
    let stream = open(&name, StreamOptions::default()).await;
    let exact = stream
        .reader(ReaderOptions::default().filter(TopicFilter::Exact("orders.created".into())))
        .await
        .unwrap();
    let pattern = stream
        .reader(ReaderOptions::default().filter(TopicFilter::Pattern("orders.*".into())))
        .await
        .unwrap();
    let (mut exact_sub, mut pattern_sub) = (exact.subscribe(), pattern.subscribe());
    stream.add("e", b"1", Some("orders.created")).await.unwrap();
    stream.add("e", b"2", Some("users.created")).await.unwrap();
    stream.add("e", b"3", None).await.unwrap();
    stream.add("e", b"4", Some("orders.shipped")).await.unwrap();
    stream.add("e", b"5", Some("orders.created")).await.unwrap();
    assert_eq!(payloads(&events(&mut exact_sub, 2).await), ["1", "5"]);
    assert_eq!(payloads(&events(&mut pattern_sub, 3).await), ["1", "4", "5"]);
    exact.close().await;
    pattern.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn readers_start_at_oldest_newest_an_id_or_a_time() {
    let name = unique("starts");
    let stream = open(&name, StreamOptions::default()).await;
    let first = stream.add("e", b"old-1", None).await.unwrap();
    stream.add("e", b"old-2", None).await.unwrap();
    let newest = stream.reader(ReaderOptions::default()).await.unwrap();
    let oldest = stream.reader(ReaderOptions::default().start(Start::Oldest)).await.unwrap();
    let after = stream.reader(ReaderOptions::default().start(Start::After(first.clone()))).await.unwrap();
    let ms: u64 = first.split('-').next().unwrap().parse().unwrap();
    let at = stream.reader(ReaderOptions::default().start(Start::At(ms))).await.unwrap();
    // Added before anyone subscribed, after the reader was created: a
    // reader starting at the newest event still gets it.
    stream.add("e", b"new", None).await.unwrap();

    assert_eq!(payloads(&events(&mut newest.subscribe(), 1).await), ["new"]);
    assert_eq!(payloads(&events(&mut oldest.subscribe(), 3).await), ["old-1", "old-2", "new"]);
    assert_eq!(payloads(&events(&mut after.subscribe(), 2).await), ["old-2", "new"]);
    let from_time = events(&mut at.subscribe(), 3).await;
    assert_eq!(payloads(&from_time), ["old-1", "old-2", "new"]);
    assert_eq!(from_time[0].created_at_ms(), ms);
    for reader in [newest, oldest, after, at] {
        reader.close().await;
    }
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn a_slow_subscriber_lags_with_a_resume_point_and_stalls_no_one() {
    let name = unique("lag");
    let stream = open(&name, StreamOptions::default()).await;
    let reader = stream.reader(ReaderOptions::default().queue(2)).await.unwrap();
    let (mut slow, mut fast) = (reader.subscribe(), reader.subscribe());
    // The fast one drains as events come; the slow one does not read yet.
    for i in 0..6 {
        stream.add("e", i.to_string().as_bytes(), None).await.unwrap();
        assert_eq!(payloads(&events(&mut fast, 1).await), [i.to_string()]);
    }
    let received = events(&mut slow, 2).await;
    assert_eq!(payloads(&received), ["0", "1"]);
    assert_eq!(next(&mut slow).await, ReaderEvent::Lagged { resume_after: received[1].id.clone() });
    // A reader from the resume point gets exactly what was missed.
    let resume =
        stream.reader(ReaderOptions::default().start(Start::After(received[1].id.clone()))).await.unwrap();
    assert_eq!(payloads(&events(&mut resume.subscribe(), 4).await), ["2", "3", "4", "5"]);
    resume.close().await;
    reader.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn close_is_prompt_idempotent_and_ends_subscriptions() {
    let name = unique("close");
    let stream = open(&name, StreamOptions::default()).await;
    let reader = stream.reader(ReaderOptions::default().block(Duration::from_secs(60))).await.unwrap();
    let mut subscription = reader.subscribe();
    // Let the reader block in XREAD: nothing to await but its start.
    stream.add("e", b"x", None).await.unwrap();
    events(&mut subscription, 1).await;
    let started = Instant::now();
    reader.close().await;
    reader.close().await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "close waited for the block: {:?}",
        started.elapsed()
    );
    assert_eq!(subscription.recv().await, None);
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn a_malformed_entry_is_skipped() {
    let name = unique("malformed_reader");
    let stream = open(&name, StreamOptions::default()).await;
    let reader = stream.reader(ReaderOptions::default()).await.unwrap();
    let mut subscription = reader.subscribe();
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let key = format!("pulse:{{{name}}}:stream:{name}");
    redis::cmd("XADD").arg(&key).arg("*").arg("garbage").arg("1").exec_async(&mut conn).await.unwrap();
    redis::cmd("XADD")
        .arg(&key)
        .arg("*")
        .arg("n")
        .arg("e")
        .arg("t")
        .arg(b"\xff".as_slice())
        .arg("p")
        .arg("x")
        .exec_async(&mut conn)
        .await
        .unwrap();
    stream.add("e", b"fine", None).await.unwrap();
    assert_eq!(payloads(&events(&mut subscription, 1).await), ["fine"]);
    reader.close().await;
    destroy_and_check(&stream, &name).await;
}

/// A kilobyte of payload: three such events fit in 3,500 bytes of queue
/// (each counts its payload, name, id and 64 more), a fourth does not.
const KILOBYTE: [u8; 1000] = [b'x'; 1000];

#[tokio::test]
async fn a_subscriber_s_queue_is_bounded_by_bytes_too() {
    let name = unique("lag_bytes");
    let stream = open(&name, StreamOptions::default()).await;
    let reader = stream.reader(ReaderOptions::default().queue(1000).max_bytes(3_500)).await.unwrap();
    let (mut slow, mut fast) = (reader.subscribe(), reader.subscribe());
    for _ in 0..6 {
        stream.add("e", &KILOBYTE, None).await.unwrap();
        events(&mut fast, 1).await;
    }
    let received = events(&mut slow, 3).await;
    assert_eq!(next(&mut slow).await, ReaderEvent::Lagged { resume_after: received[2].id.clone() });
    reader.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn a_waiting_reader_stops_reading_while_its_subscriber_is_full_and_skips_nothing() {
    let name = unique("wait");
    let stream = open(&name, StreamOptions::default()).await;
    let options =
        ReaderOptions::default().start(Start::Oldest).queue(2).max_bytes(3_500).overflow(Overflow::Wait);
    let reader = stream.reader(options).await.unwrap();
    let mut subscription = reader.subscribe();
    let sent: Vec<String> = (0..40).map(|i| format!("{i:04}")).collect();
    for payload in &sent {
        let mut large = payload.as_bytes().to_vec();
        large.extend_from_slice(&KILOBYTE);
        stream.add("e", &large, None).await.unwrap();
    }
    // Queues of 2 events and 3,500 bytes, 40 events of a kilobyte: the
    // reader waits for each to be taken, and every one arrives, in order.
    let received: Vec<String> = events(&mut subscription, sent.len())
        .await
        .iter()
        .map(|event| String::from_utf8_lossy(&event.payload[..4]).into_owned())
        .collect();
    assert_eq!(received, sent);
    assert!(subscription.try_recv().is_none(), "nothing but the events");
    reader.close().await;
    destroy_and_check(&stream, &name).await;
}

/// On a cluster, a reader with a doorbell holds no blocked `XREAD`: it
/// takes the entries a script publishes with them, without reading the
/// stream, and with a poll longer than the test, reads nothing before a
/// ring. An entry added without a ring is read from the stream at the
/// next ring, in its place, not skipped. Closing the reader unsubscribes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_reader_with_a_doorbell_takes_what_rings_and_skips_nothing() {
    let mut cluster = pulse_testkit::RedisCluster::start(3, 0);
    let ports: Vec<u16> = cluster.nodes().iter().map(pulse_testkit::RedisServer::port).collect();
    let redis = pulse_redis::Redis::open(&cluster.url()).unwrap();
    let name = unique("doorbell");
    let stream = pulse_streams::Stream::open(&redis, &name, StreamOptions::default()).await.unwrap();
    let key = pulse_streams::stream_key(&name, &name);
    let options = ReaderOptions::default().doorbell(true).poll(Duration::from_secs(3600));
    let reader = stream.reader(options).await.unwrap();
    let mut subscription = reader.subscribe();
    let master = cluster.serving(&key);
    let node = pulse_testkit::connect(&format!("redis://127.0.0.1:{}", ports[master])).await;
    let subscribers = || {
        let mut node = node.clone();
        let key = key.clone();
        async move {
            let reply: (String, u64) =
                redis::cmd("PUBSUB").arg("SHARDNUMSUB").arg(&key).query_async(&mut node).await.unwrap();
            reply.1
        }
    };
    let reads = || {
        let mut node = node.clone();
        async move {
            let stats: String = redis::cmd("INFO").arg("commandstats").query_async(&mut node).await.unwrap();
            stats
                .lines()
                .find_map(|line| line.strip_prefix("cmdstat_xread:calls="))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |calls| calls.parse::<u64>().unwrap())
        }
    };
    wait_until("the doorbell is subscribed", subscribers, |n| n == 1).await;

    // As the pool's scripts add to an inbox: the entry and its ring, with
    // the id before it, in one step.
    let ringing = redis::Script::new(
        "local function ns(s) return #s .. ':' .. s .. ',' end
         local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
         local prev = last and last[1] or '0-0'
         local id = redis.call('XADD', KEYS[1], '*', 'n', 'e', 'p', ARGV[1])
         redis.call('SPUBLISH', KEYS[1], ns(prev) .. ns(id) .. ns('e') .. ns(ARGV[1]))",
    );
    let mut conn = redis.shared().await.unwrap();
    let () = ringing.key(&key).arg("rung-1").invoke_async(&mut conn).await.unwrap();
    assert_eq!(payloads(&events(&mut subscription, 1).await), ["rung-1"]);
    // The reads at the start (and at the subscription's confirmation) are
    // done once the first ring is taken; the next entry comes with its ring.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = reads().await;
    let () = ringing.key(&key).arg("rung-2").invoke_async(&mut conn).await.unwrap();
    assert_eq!(payloads(&events(&mut subscription, 1).await), ["rung-2"]);
    assert_eq!(reads().await, before, "taken from the ring, not read");

    // Added without a ring: not read until the next ring, which says an
    // entry before its own is unread: both read, in order.
    stream.add("e", b"quiet", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(subscription.try_recv().is_none(), "read without a ring, with a poll of an hour");
    let () = ringing.key(&key).arg("rung-3").invoke_async(&mut conn).await.unwrap();
    assert_eq!(payloads(&events(&mut subscription, 2).await), ["quiet", "rung-3"]);
    assert!(reads().await > before, "read from the stream");

    for (index, port) in ports.iter().enumerate() {
        let mut each = pulse_testkit::connect(&format!("redis://127.0.0.1:{port}")).await;
        let info: String = redis::cmd("INFO").arg("clients").query_async(&mut each).await.unwrap();
        assert!(info.contains("blocked_clients:0"), "a blocked client on master {index}: {info}");
    }
    reader.close().await;
    wait_until("the doorbell is unsubscribed", subscribers, |n| n == 0).await;
}

/// Polls `read` until `done` holds of what it returns, for [`PATIENCE`].
async fn wait_until<T: std::fmt::Debug, F: std::future::Future<Output = T>>(
    what: &str,
    read: impl Fn() -> F,
    done: impl Fn(T) -> bool,
) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let value = read().await;
        if done(value) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
