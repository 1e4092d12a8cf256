//! Every operation, on one map with a replica that must show the result.

use pulse_rmap::{Error, Map, MapOptions, Swap};
use pulse_testkit::{assert_no_keys, unique};

use crate::{PATIENCE, client, eventually, join};

/// A map under a unique name, and a connection for the leak check.
async fn fresh(test: &str) -> (Map, String) {
    let name = unique(test);
    (join(&name).await, name)
}

async fn destroy_and_check(map: Map, name: &str) {
    map.destroy().await.unwrap();
    map.close().await;
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    assert_no_keys(&mut conn, name).await;
}

#[tokio::test]
async fn set_get_delete_and_local_reads() {
    let (map, name) = fresh("set_get_delete").await;
    assert_eq!(map.set("a", "1").await.unwrap(), None);
    assert_eq!(map.set("a", "2").await.unwrap(), Some("1".into()));
    assert_eq!(map.set_and_wait("b", "", PATIENCE).await.unwrap(), None);
    assert_eq!(map.get("b"), Some(String::new()), "an empty value is a present value");
    eventually(&map, "a is 2", |m| m.get("a").as_deref() == Some("2")).await;
    let mut keys = map.keys();
    keys.sort();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(map.len(), 2);
    map.set_and_wait("c", "2", PATIENCE).await.unwrap();
    let counts = map.value_counts();
    assert_eq!(counts, [("2".to_owned(), 2), (String::new(), 1)].into(), "how many keys hold each value");
    assert_eq!(map.delete("c").await.unwrap(), Some("2".into()));

    assert_eq!(map.delete("a").await.unwrap(), Some("2".into()));
    assert_eq!(map.delete("a").await.unwrap(), None, "deleting an absent key changes nothing");
    eventually(&map, "a is gone", |m| m.get("a").is_none()).await;
    destroy_and_check(map, &name).await;
}

#[tokio::test]
async fn conditional_writes_act_only_when_their_condition_holds() {
    let (map, name) = fresh("conditional_writes").await;
    assert!(map.set_if_not_exists("k", "first").await.unwrap());
    assert!(!map.set_if_not_exists("k", "second").await.unwrap());

    let lost = map.test_and_set("k", "wrong", "x").await.unwrap();
    assert_eq!(lost, Swap { previous: Some("first".into()), done: false });
    let missing = map.test_and_set("absent", "", "x").await.unwrap();
    assert_eq!(missing, Swap { previous: None, done: false }, "a missing key never matches, not even \"\"");
    let won = map.test_and_set("k", "first", "third").await.unwrap();
    assert_eq!(won, Swap { previous: Some("first".into()), done: true });

    assert!(!map.test_and_delete("k", "first").await.unwrap().done);
    assert!(map.test_and_delete("k", "third").await.unwrap().done);

    map.set("x", "1").await.unwrap();
    map.set("y", "2").await.unwrap();
    assert!(!map.test_and_reset(&[("x", "1"), ("y", "3")]).await.unwrap());
    assert!(!map.test_and_reset(&[("x", "1"), ("missing", "")]).await.unwrap());
    eventually(&map, "x and y are set", |m| m.len() == 2).await;
    assert!(map.test_and_reset(&[("x", "1"), ("y", "2")]).await.unwrap());
    eventually(&map, "the map is empty", Map::is_empty).await;
    destroy_and_check(map, &name).await;
}

#[tokio::test]
async fn increment_counts_and_refuses_non_integers() {
    let (map, name) = fresh("increment").await;
    assert_eq!(map.increment("n", 1).await.unwrap(), 1);
    assert_eq!(map.increment("n", 41).await.unwrap(), 42);
    assert_eq!(map.increment("n", -42).await.unwrap(), 0);
    map.set("text", "abc").await.unwrap();
    assert!(matches!(map.increment("text", 1).await, Err(Error::Redis { .. })));
    eventually(&map, "n is 0", |m| m.get("n").as_deref() == Some("0")).await;
    destroy_and_check(map, &name).await;
}

#[tokio::test]
async fn lists_append_dedupe_and_remove() {
    let (map, name) = fresh("lists").await;
    assert_eq!(map.append_values("l", &["bar"]).await.unwrap(), ["bar"]);
    assert_eq!(map.append_values("l", &["baz", "bar"]).await.unwrap(), ["bar", "baz", "bar"]);
    assert_eq!(map.remove_values("l", &["bar"]).await.unwrap(), Some(vec!["baz".into()]));
    assert_eq!(map.remove_values("l", &["nope"]).await.unwrap(), Some(vec!["baz".into()]));
    assert_eq!(map.remove_values("l", &["baz"]).await.unwrap(), None, "an emptied list is deleted");
    assert_eq!(map.remove_values("absent", &["x"]).await.unwrap(), None);

    assert_eq!(map.append_unique_values("u", &["a", "b", "c", "a"]).await.unwrap(), ["a", "b", "c"]);
    assert_eq!(map.append_unique_values("u", &["d", "a", "e"]).await.unwrap(), ["a", "b", "c", "d", "e"]);
    assert_eq!(map.append_unique_values("u", &["e"]).await.unwrap(), ["a", "b", "c", "d", "e"]);
    assert_eq!(map.append_values("u", &[]).await.unwrap(), ["a", "b", "c", "d", "e"]);
    // Values with the list format's own separators survive.
    map.append_values("odd", &["1:x,", ",", ""]).await.unwrap();

    eventually(&map, "the replica shows the lists", |m| {
        m.get("l").is_none()
            && m.get_values("u") == Some(vec!["a".into(), "b".into(), "c".into(), "d".into(), "e".into()])
            && m.get_values("odd") == Some(vec!["1:x,".into(), ",".into(), String::new()])
    })
    .await;
    destroy_and_check(map, &name).await;
}

#[tokio::test]
async fn invalid_names_and_keys_are_refused() {
    let client = client();
    for bad in ["", "has space", "br{ace}", "é"] {
        let error = Map::join(&client, bad, MapOptions::default()).await.unwrap_err();
        assert!(matches!(error, Error::InvalidName { .. }), "{bad:?}: {error}");
        assert!(error.to_string().contains("allowed"), "{error}");
    }
    let error = Map::join(&client, "ok", MapOptions::default().hash_tag("bad tag")).await.unwrap_err();
    assert!(error.to_string().contains("hash tag"), "{error}");

    let (map, name) = fresh("invalid_keys").await;
    for bad in ["", "=rev", "=epoch"] {
        assert!(matches!(map.set(bad, "x").await, Err(Error::InvalidKey { .. })), "{bad:?}");
        assert!(matches!(map.append_values(bad, &["x"]).await, Err(Error::InvalidKey { .. })));
    }
    destroy_and_check(map, &name).await;
}

#[tokio::test]
async fn a_closed_map_reads_but_refuses_writes() {
    let (map, name) = fresh("closed").await;
    map.set_and_wait("k", "v", PATIENCE).await.unwrap();
    map.close().await;
    map.close().await;
    assert_eq!(map.get("k"), Some("v".into()));
    assert!(matches!(map.set("k", "w").await, Err(Error::Closed(_))));
    assert_eq!(map.background_tasks(), 0);

    let cleaner = join(&name).await;
    destroy_and_check(cleaner, &name).await;
}
