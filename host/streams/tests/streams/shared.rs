//! Events that share an entry: each is read, filtered, resumed after and
//! acknowledged on its own, by its id `<entry id>.<index>`.

use pulse_streams::{
    Event, ReaderEvent, ReaderOptions, SinkOptions, Start, Stream, StreamOptions, TopicFilter, stream_key,
};
use pulse_testkit::unique;

use crate::{PATIENCE, destroy_and_check, open, payloads};

/// Stream `name` holding `a` (topic k1), then one entry holding `b0` (k1),
/// `b1` (k2) and `b2` (k1), then `c` (k2); and that entry's id.
async fn with_a_shared_entry(name: &str) -> (Stream, String) {
    let stream = open(name, StreamOptions::default()).await;
    stream.add("emit", b"a", Some("k1")).await.unwrap();
    let mut batch = Vec::new();
    for (topic, payload) in [("k1", "b0"), ("k2", "b1"), ("k1", "b2")] {
        pulse_rmap::push_netstring(&mut batch, topic.as_bytes());
        pulse_rmap::push_netstring(&mut batch, payload.as_bytes());
    }
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let shared: String = redis::cmd("XADD")
        .arg(stream_key(name, name))
        .arg("*")
        .arg("n")
        .arg("emit")
        .arg("b")
        .arg(batch)
        .arg("k")
        .arg(3)
        .query_async(&mut conn)
        .await
        .unwrap();
    stream.add("emit", b"c", Some("k2")).await.unwrap();
    (stream, shared)
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|event| event.id.clone()).collect()
}

#[tokio::test]
async fn pages_and_the_newest_events_split_shared_entries_and_resume_inside_them() {
    let name = unique("shared_range");
    let (stream, x) = with_a_shared_entry(&name).await;

    let latest = stream.latest(3).await.unwrap();
    assert_eq!(payloads(&latest), ["c", "b2", "b1"]);
    assert_eq!(ids(&latest)[1..], [format!("{x}.2"), format!("{x}.1")]);
    assert!(latest.iter().all(|event| event.name == "emit"));

    // Two at a time: a page may end inside an entry, and the next one
    // begins after the last event it returned.
    let (page, next) = stream.range(None, 2).await.unwrap();
    assert_eq!(
        (payloads(&page), next.clone()),
        (vec!["a".to_owned(), "b0".to_owned()], Some(format!("{x}.0")))
    );
    assert_eq!(page[1].topic.as_deref(), Some("k1"));
    let (page, next) = stream.range(next.as_deref(), 2).await.unwrap();
    assert_eq!(
        (payloads(&page), next.clone()),
        (vec!["b1".to_owned(), "b2".to_owned()], Some(format!("{x}.2")))
    );
    let (page, next) = stream.range(next.as_deref(), 2).await.unwrap();
    assert_eq!(payloads(&page), ["c"]);
    let (page, next) = stream.range(next.as_deref(), 2).await.unwrap();
    assert_eq!((page, next), (Vec::new(), None));
    // The entry's own id stands for all of it.
    let (page, _) = stream.range(Some(&x), 10).await.unwrap();
    assert_eq!(payloads(&page), ["c"]);
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn readers_get_each_event_of_a_shared_entry_and_start_inside_one() {
    let name = unique("shared_reader");
    let (stream, x) = with_a_shared_entry(&name).await;
    let collect = |options: ReaderOptions, count: usize| {
        let stream = stream.clone();
        async move {
            let reader = stream.reader(options).await.unwrap();
            let mut subscription = reader.subscribe();
            let mut events = Vec::new();
            while events.len() < count {
                match tokio::time::timeout(PATIENCE, subscription.recv()).await.unwrap().unwrap() {
                    ReaderEvent::Event(event) => events.push(event),
                    other => panic!("unexpected {other:?}"),
                }
            }
            reader.close().await;
            events
        }
    };
    let all = collect(ReaderOptions::default().start(Start::Oldest), 5).await;
    assert_eq!(payloads(&all), ["a", "b0", "b1", "b2", "c"]);
    assert_eq!(ids(&all)[1..4], [format!("{x}.0"), format!("{x}.1"), format!("{x}.2")]);
    let after = collect(ReaderOptions::default().start(Start::After(format!("{x}.0"))), 3).await;
    assert_eq!(payloads(&after), ["b1", "b2", "c"]);
    let k1 = ReaderOptions::default().start(Start::Oldest).filter(TopicFilter::Exact("k1".into()));
    assert_eq!(payloads(&collect(k1, 3).await), ["a", "b0", "b2"]);
    // A reader that starts at the newest entry sees what comes after it.
    let reader = stream.reader(ReaderOptions::default()).await.unwrap();
    let mut subscription = reader.subscribe();
    stream.add("emit", b"d", None).await.unwrap();
    let next = tokio::time::timeout(PATIENCE, subscription.recv()).await.unwrap().unwrap();
    assert!(matches!(next, ReaderEvent::Event(ref event) if event.payload == b"d"), "{next:?}");
    reader.close().await;
    destroy_and_check(&stream, &name).await;
}

#[tokio::test]
async fn a_sink_acknowledges_a_shared_entry_once_each_of_its_events_is() {
    let name = unique("shared_sink");
    let (stream, x) = with_a_shared_entry(&name).await;
    let mut sink = stream.sink("g", SinkOptions::default().start(Start::Oldest)).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(tokio::time::timeout(PATIENCE, sink.recv()).await.unwrap().unwrap());
    }
    assert_eq!(payloads(&got), ["a", "b0", "b1", "b2", "c"]);
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let pending = |conn: &mut redis::aio::MultiplexedConnection| {
        let key = stream_key(&name, &name);
        let mut conn = conn.clone();
        async move {
            let reply: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
                .arg(key)
                .arg("g")
                .arg("-")
                .arg("+")
                .arg(10)
                .query_async(&mut conn)
                .await
                .unwrap();
            reply.ids.into_iter().map(|pending| pending.id).collect::<Vec<String>>()
        }
    };
    for event in &got[..3] {
        sink.ack(&event.id).await.unwrap();
    }
    let c = got[4].id.clone();
    assert_eq!(pending(&mut conn).await, [x.clone(), c.clone()], "b2 is not acknowledged yet");
    sink.ack(&got[3].id).await.unwrap();
    assert_eq!(pending(&mut conn).await, [c]);
    sink.ack(&got[4].id).await.unwrap();
    assert!(pending(&mut conn).await.is_empty());
    sink.close().await;
    destroy_and_check(&stream, &name).await;
}
