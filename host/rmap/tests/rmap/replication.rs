//! Replicas on separate connections converge, and tell their subscribers.

use std::collections::HashMap;

use proptest::prelude::*;
use pulse_rmap::{Map, MapEvent};
use pulse_testkit::{assert_no_keys, unique};

use crate::{PATIENCE, eventually, join};

/// The user fields of the map's hash in Redis.
pub async fn redis_content(map_name: &str) -> HashMap<String, String> {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let mut fields: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("pulse:{{{map_name}}}:map:{map_name}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    fields.retain(|k, _| !k.starts_with('='));
    fields
}

#[derive(Debug, Clone)]
enum Op {
    Set(u8, u8),
    Delete(u8),
    TestAndSet(u8, u8, u8),
    Increment(u8, i8),
    Append(u8, u8),
    AppendUnique(u8, u8),
    Remove(u8, u8),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    // Few keys and values, so operations collide and conditions both hold
    // and fail.
    let key = 0u8..4;
    let value = 0u8..3;
    prop_oneof![
        4 => (key.clone(), value.clone()).prop_map(|(k, v)| Op::Set(k, v)),
        2 => key.clone().prop_map(Op::Delete),
        2 => (key.clone(), value.clone(), value.clone()).prop_map(|(k, t, v)| Op::TestAndSet(k, t, v)),
        1 => (key.clone(), -3i8..4).prop_map(|(k, d)| Op::Increment(k, d)),
        2 => (key.clone(), value.clone()).prop_map(|(k, v)| Op::Append(k, v)),
        2 => (key.clone(), value.clone()).prop_map(|(k, v)| Op::AppendUnique(k, v)),
        2 => (key.clone(), value.clone()).prop_map(|(k, v)| Op::Remove(k, v)),
        1 => Just(Op::Reset),
    ]
}

async fn run(map: &Map, op: &Op) {
    let key = |k: &u8| format!("k{k}");
    let value = |v: &u8| format!("v{v}");
    // Errors are part of the game (increment of a list); convergence is
    // what is checked.
    let _ = match op {
        Op::Set(k, v) => map.set(&key(k), &value(v)).await.map(drop),
        Op::Delete(k) => map.delete(&key(k)).await.map(drop),
        Op::TestAndSet(k, t, v) => map.test_and_set(&key(k), &value(t), &value(v)).await.map(drop),
        Op::Increment(k, d) => map.increment(&key(k), i64::from(*d)).await.map(drop),
        Op::Append(k, v) => map.append_values(&key(k), &[&value(v)]).await.map(drop),
        Op::AppendUnique(k, v) => map.append_unique_values(&key(k), &[&value(v)]).await.map(drop),
        Op::Remove(k, v) => map.remove_values(&key(k), &[&value(v)]).await.map(drop),
        Op::Reset => map.reset().await,
    };
}

async fn converge(writes: Vec<(usize, Op)>) {
    let name = unique("converge");
    let replicas = [join(&name).await, join(&name).await, join(&name).await];
    let writers = replicas.iter().enumerate().map(|(i, map)| {
        let mine: Vec<Op> = writes.iter().filter(|(r, _)| *r == i).map(|(_, op)| op.clone()).collect();
        async move {
            for op in &mine {
                run(map, op).await;
            }
        }
    });
    futures_util::future::join_all(writers).await;

    let expected = redis_content(&name).await;
    for (i, map) in replicas.iter().enumerate() {
        eventually(map, &format!("replica {i} equals Redis"), |m| m.snapshot() == expected).await;
    }
    replicas[0].destroy().await.unwrap();
    for map in &replicas {
        eventually(map, "the map is destroyed everywhere", Map::is_empty).await;
        map.close().await;
    }
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    assert_no_keys(&mut conn, &name).await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn replicas_converge_after_concurrent_writers(writes in prop::collection::vec((0usize..3, op()), 1..40)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(converge(writes));
    }
}

#[tokio::test]
async fn set_and_wait_returns_once_the_local_replica_shows_the_value() {
    let name = unique("set_and_wait");
    let (writer, reader) = (join(&name).await, join(&name).await);
    for i in 0..50 {
        // Another replica writes too, so the waiter sees changes it did not make.
        writer.set("other", &i.to_string()).await.unwrap();
        let value = format!("v{i}");
        reader.set_and_wait("k", &value, PATIENCE).await.unwrap();
        assert_eq!(reader.get("k"), Some(value), "no await between the write and the read");
    }
    writer.destroy().await.unwrap();
    writer.close().await;
    reader.close().await;
}

#[tokio::test]
async fn many_keys_set_at_once_are_one_revision_and_one_event() {
    let name = unique("set-many");
    let (writer, watcher) = (join(&name).await, join(&name).await);
    let mut events = watcher.subscribe();
    writer.set("a", "before").await.unwrap();
    // More pairs than one Lua call may unpack (about 8,000 values).
    let entries: Vec<(String, String)> = (0..5_000).map(|i| (format!("k{i}"), format!("v{i}"))).collect();
    let pairs: Vec<(&str, &str)> = entries.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    writer.set_many(&pairs).await.unwrap();
    writer.set_many(&[]).await.unwrap();
    writer.set("z", "after").await.unwrap();
    let expected_set = Some(MapEvent::Set { key: "a".into(), value: "before".into() });
    assert_eq!(tokio::time::timeout(PATIENCE, events.recv()).await.unwrap(), expected_set);
    let Some(MapEvent::SetMany { entries: heard }) =
        tokio::time::timeout(PATIENCE, events.recv()).await.unwrap()
    else {
        panic!("not one SetMany event");
    };
    assert_eq!(heard, entries);
    let expected_set = Some(MapEvent::Set { key: "z".into(), value: "after".into() });
    assert_eq!(tokio::time::timeout(PATIENCE, events.recv()).await.unwrap(), expected_set);
    // A new map: "a" was revision 1, the 5,000 keys revision 2 (the empty
    // call none), "z" revision 3.
    assert_eq!(watcher.revision(), 3, "one revision for 5,000 keys; none for an empty call");
    assert_eq!(watcher.len(), 5_002);
    assert_eq!(watcher.get("k4999").as_deref(), Some("v4999"));
    assert_eq!(watcher.get_with_revision("k4999"), (3, Some("v4999".into())), "read at the last revision");
    assert_eq!(watcher.get_with_revision("missing"), (3, None));
    assert_eq!(redis_content(&name).await, watcher.snapshot(), "the replica equals Redis");
    writer.destroy().await.unwrap();
    writer.close().await;
    watcher.close().await;
}

#[tokio::test]
async fn subscribers_hear_every_change_in_order() {
    let name = unique("subscribers");
    let (writer, watcher) = (join(&name).await, join(&name).await);
    let mut first = watcher.subscribe();
    let mut second = watcher.subscribe();
    writer.set("a", "1").await.unwrap();
    writer.append_values("l", &["x"]).await.unwrap();
    writer.delete("a").await.unwrap();
    writer.reset().await.unwrap();
    let expected = [
        MapEvent::Set { key: "a".into(), value: "1".into() },
        MapEvent::Set { key: "l".into(), value: pulse_rmap::encode_list(&["x"]) },
        MapEvent::Deleted { key: "a".into() },
        MapEvent::Reset,
    ];
    for subscription in [&mut first, &mut second] {
        for event in &expected {
            let got = tokio::time::timeout(PATIENCE, subscription.recv()).await.unwrap();
            assert_eq!(got.as_ref(), Some(event));
        }
    }
    assert_eq!(watcher.subscriber_count(), 2);
    drop(second);
    assert_eq!(watcher.subscriber_count(), 1);
    writer.destroy().await.unwrap();
    let destroyed = tokio::time::timeout(PATIENCE, first.recv()).await.unwrap();
    assert_eq!(destroyed, Some(MapEvent::Reset), "the destroy");
    watcher.close().await;
    assert_eq!(first.recv().await, None, "closing the map ends its subscriptions");
    writer.close().await;
}
