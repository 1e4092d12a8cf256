//! The pool on a Redis Cluster and behind Sentinel: the same guarantees as
//! on one server, judged from the handlers' side, also while a primary is
//! killed and its replica takes over.

use std::collections::HashMap;
use std::time::Duration;

use pulse_pool::{DispatchOutcome, EventOutcome, Node, NodeOptions};
use pulse_testkit::{RedisCluster, RedisSentinels, RedisServer};

use crate::{Call, Calls, PATIENCE, Recording};

/// Jobs dispatched before the fault, and after it is over; while it
/// lasts, one every `PACE`.
const BEFORE: usize = 30;
const AFTER: usize = 20;
const PACE: Duration = Duration::from_millis(5);

fn options() -> NodeOptions {
    // Leases outlast a failover (a second or two to notice, one to
    // promote), so no worker fences itself: every job must keep its one
    // run.
    NodeOptions {
        lease_ttl: Duration::from_secs(20),
        reply_timeout: Duration::from_secs(5),
        ..crate::options()
    }
}

/// Dispatches `key` until the pool answers (a primary may be down):
/// started, or there already from an attempt whose answer was lost.
async fn dispatch_until_answered(node: &Node, key: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match node.dispatch(key, b"").await {
            Ok(DispatchOutcome::Started | DispatchOutcome::AlreadyExists(_)) => return,
            Ok(DispatchOutcome::Unconfirmed) => {}
            Ok(other) => panic!("{key}: {other:?}"),
            Err(error) => assert!(tokio::time::Instant::now() < deadline, "{key}: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each key's starts, by worker: every job started exactly once.
fn started_once(calls: &Calls, keys: &[String]) -> bool {
    let mut starts: HashMap<&str, usize> = HashMap::new();
    let all = calls.all();
    for call in &all {
        if let Call::Start { key, .. } = call {
            *starts.entry(key.as_str()).or_default() += 1;
        }
    }
    keys.iter().all(|key| starts.get(key.as_str()) == Some(&1))
}

/// Two nodes of two workers each on `redis`; jobs dispatched, notified
/// and stopped; `fault` (a primary killed, failed over, a slot migrated)
/// run on a thread of its own after the first jobs started, while more
/// jobs are dispatched. Every job starts exactly once, the notifications
/// reach the job's one run in order, and the pool shuts down without a
/// key left behind. Returns what `fault` returned.
async fn run_through_a_failover<T: Send + 'static>(
    redis: &pulse_redis::Redis,
    pool: &str,
    fault: impl FnOnce() -> T + Send + 'static,
) -> T {
    run_through_a_failover_in(redis, pool, 1, fault).await
}

/// [`run_through_a_failover`] for a pool of `groups` slot groups.
async fn run_through_a_failover_in<T: Send + 'static>(
    redis: &pulse_redis::Redis,
    pool: &str,
    groups: u32,
    fault: impl FnOnce() -> T + Send + 'static,
) -> T {
    pulse_testkit::init_tracing();
    let calls = Calls::default();
    let options = NodeOptions { slot_groups: groups, ..options() };
    let first = Node::join(redis, pool, options.clone()).await.unwrap();
    let second = Node::join(redis, pool, options).await.unwrap();
    for node in [&first, &second] {
        for _ in 0..2 {
            node.add_worker(Recording::new(&calls)).await.unwrap();
        }
    }
    let mut keys: Vec<String> = (0..BEFORE).map(|i| format!("job-{i}")).collect();
    for key in &keys {
        assert_eq!(first.dispatch(key, b"").await.unwrap(), DispatchOutcome::Started);
    }
    assert_eq!(second.notify("job-0", b"one").await.unwrap(), EventOutcome::Done);
    calls.wait_until("the first jobs started", |_| started_once(&calls, &keys)).await;

    // Jobs go on being dispatched, one every few milliseconds, while the
    // fault runs and for `AFTER` more once it is over.
    let fault = tokio::task::spawn_blocking(fault);
    let mut pace = tokio::time::interval(PACE);
    // After a dispatch that waited out the fault, no burst to catch up.
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut after = 0;
    while after < AFTER {
        pace.tick().await;
        let over = fault.is_finished();
        let key = format!("job-{}", keys.len());
        dispatch_until_answered(&second, &key).await;
        keys.push(key);
        after += usize::from(over);
    }
    let outcome = fault.await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !matches!(first.notify("job-0", b"two").await, Ok(EventOutcome::Done)) {
        assert!(tokio::time::Instant::now() < deadline, "job-0 never took its second notification");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    calls.wait_until("every job started", |_| started_once(&calls, &keys)).await;
    let notes: Vec<Vec<u8>> = calls
        .of("job-0")
        .into_iter()
        .filter_map(|call| match call {
            Call::Notify { payload, .. } => Some(payload),
            _ => None,
        })
        .collect();
    assert_eq!(notes.first().map(Vec::as_slice), Some(&b"one"[..]), "{notes:?}");
    assert_eq!(notes.last().map(Vec::as_slice), Some(&b"two"[..]), "{notes:?}");
    assert!(started_once(&calls, &keys), "a job started twice: {:?}", calls.all());
    assert_eq!(first.stop("job-1").await.unwrap(), EventOutcome::Done);
    assert!(calls.of("job-1").iter().any(|call| matches!(call, Call::Stop { .. })));

    let jobs = first.shutdown(PATIENCE).await.unwrap();
    assert_eq!(jobs as usize, keys.len() - 1);
    second.close().await;
    first.close().await;
    let left = keys_left(redis, pool, groups).await;
    assert!(left.is_empty(), "keys left: {left:?}");
    outcome
}

/// The keys of every slot group of `pool` that Redis holds.
async fn keys_left(redis: &pulse_redis::Redis, pool: &str, groups: u32) -> Vec<String> {
    let mut conn = redis.shared().await.unwrap();
    let mut left = Vec::new();
    for group in 0..groups {
        let tag = format!("{{{}}}", pulse_pool::group_tag(pool, group, groups));
        let mut cursor = 0;
        loop {
            let (next, batch) = conn.scan_beside(&tag, &format!("*{tag}*"), cursor).await.unwrap();
            left.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    left
}

/// On a healthy cluster of three masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_runs_on_a_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let redis = pulse_redis::Redis::open(&cluster.url()).unwrap();
    redis.verify().await.unwrap();
    let pool = pulse_testkit::unique("cluster");
    run_through_a_failover(&redis, &pool, || {}).await;
}

/// A pool of 16 slot groups on a cluster of three masters: the groups
/// spread over every master, and the pool keeps every guarantee.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_slot_groups_spreads_over_the_cluster_s_masters() {
    let mut cluster = RedisCluster::start(3, 0);
    let ports: Vec<u16> = cluster.nodes().iter().map(RedisServer::port).collect();
    let redis = pulse_redis::Redis::open(&cluster.url()).unwrap();
    redis.verify().await.unwrap();
    let pool = pulse_testkit::unique("cluster-groups");
    let mut per_master = [0; 3];
    for group in 0..16 {
        per_master[cluster.serving(&format!("{{{}}}", pulse_pool::group_tag(&pool, group, 16)))] += 1;
    }
    assert!(per_master.iter().all(|&groups| (4..=6).contains(&groups)), "groups per master: {per_master:?}");
    let spread = pool.clone();
    let (_, held) = tokio::join!(run_through_a_failover_in(&redis, &pool, 16, || {}), async {
        // While the jobs run: every master holds some of the pool's jobs.
        let mut conn = redis.shared().await.unwrap();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let mut held = [0u64; 3];
            for group in 0..16 {
                let tag = pulse_pool::group_tag(&spread, group, 16);
                let jobs: u64 = redis::cmd("HLEN")
                    .arg(format!("pulse:{{{tag}}}:jobs"))
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                held[cluster.serving(&format!("{{{tag}}}"))] += jobs;
            }
            if held.iter().all(|&jobs| jobs > 0) || tokio::time::Instant::now() > deadline {
                // Its inboxes and reply streams are read when their
                // doorbells ring: no reader holds a blocked XREAD.
                let mut blocked = Vec::new();
                for port in &ports {
                    let mut node = pulse_testkit::connect(&format!("redis://127.0.0.1:{port}")).await;
                    let info: String =
                        redis::cmd("INFO").arg("clients").query_async(&mut node).await.unwrap();
                    blocked.extend(
                        info.lines().filter(|line| line.starts_with("blocked_clients:")).map(str::to_owned),
                    );
                }
                return (held, blocked);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (held, blocked) = held;
    assert!(held.iter().all(|&jobs| jobs > 0), "jobs per master: {held:?}");
    assert!(blocked.iter().all(|line| line == "blocked_clients:0"), "blocked readers: {blocked:?}");
}

/// On a cluster with slot groups a worker answers each node's dispatches
/// on a stream of its own, where it picks the ids, so it answers with
/// plain commands: a start costs one script, the dispatch. An answer
/// whose id another writer took (an entry added after the worker's last)
/// is added again after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_worker_answers_dispatches_without_a_script() {
    pulse_testkit::init_tracing();
    let mut cluster = RedisCluster::start(3, 0);
    let ports: Vec<u16> = cluster.nodes().iter().map(RedisServer::port).collect();
    let redis = pulse_redis::Redis::open(&cluster.url()).unwrap();
    let pool = pulse_testkit::unique("cluster-answers");
    let calls = Calls::default();
    let node = Node::join(&redis, &pool, NodeOptions { slot_groups: 2, ..options() }).await.unwrap();
    let worker = node.add_worker(Recording::new(&calls)).await.unwrap();
    let dispatch = |prefix: &'static str, n: usize| {
        let node = &node;
        async move {
            for i in 0..n {
                let key = format!("{prefix}-{i}");
                assert_eq!(node.dispatch(&key, b"").await.unwrap(), DispatchOutcome::Started, "{key}");
            }
        }
    };
    // Both groups' streams are opened and read.
    dispatch("first", 10).await;

    let mut masters = Vec::new();
    for port in &ports {
        masters.push(pulse_testkit::connect(&format!("redis://127.0.0.1:{port}")).await);
    }
    for master in &mut masters {
        let () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(master).await.unwrap();
    }
    dispatch("plain", 50).await;
    let mut scripts = 0;
    for master in &mut masters {
        let calls = crate::command_calls(master).await;
        scripts += ["evalsha", "eval"].iter().filter_map(|command| calls.get(*command)).sum::<u64>();
    }
    // 50 dispatches, and what the nodes' upkeep ran meanwhile; a script
    // per answer would make it 100 or more.
    assert!((50..=65).contains(&scripts), "{scripts} scripts for 50 starts");

    let mut conn = redis.shared().await.unwrap();
    let taken = "99999999999999-0";
    let mut streams = Vec::new();
    for group in 0..2 {
        let tag = pulse_pool::group_tag(&pool, group, 2);
        let stream = format!("pulse:{{{tag}}}:stream:replies.{}.{worker}", node.id());
        let added: Option<String> = redis::cmd("XADD")
            .arg(&stream)
            .arg("NOMKSTREAM")
            .arg(taken)
            .arg("n")
            .arg("hello")
            .arg("p")
            .arg("")
            .query_async(&mut conn)
            .await
            .unwrap();
        if added.is_some() {
            streams.push(stream);
        }
    }
    assert!(!streams.is_empty(), "no stream where the worker answers");
    dispatch("after", 20).await;
    for stream in &streams {
        let after: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg(format!("({taken}"))
            .arg("+")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!after.ids.is_empty(), "{stream}: no answer after the entry that took its id");
    }
    let keys: Vec<String> = ["first", "plain", "after"]
        .into_iter()
        .zip([10, 50, 20])
        .flat_map(|(prefix, n)| (0..n).map(move |i| format!("{prefix}-{i}")))
        .collect();
    assert!(started_once(&calls, &keys), "a job started twice or not at all: {:?}", calls.all());
    node.close().await;
    let left: Vec<String> = keys_left(&redis, &pool, 2)
        .await
        .into_iter()
        .filter(|key| key.contains(":stream:replies."))
        .collect();
    assert!(left.is_empty(), "reply streams left: {left:?}");
}

/// The streams where a worker answered a node's dispatches go, with their
/// readers, once the worker has left the pool: the other worker's stay,
/// and dispatches go on to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_where_a_worker_answered_go_when_it_leaves() {
    pulse_testkit::init_tracing();
    let cluster = RedisCluster::start(3, 0);
    let redis = pulse_redis::Redis::open(&cluster.url()).unwrap();
    let pool = pulse_testkit::unique("replies-left");
    let calls = Calls::default();
    let node = Node::join(&redis, &pool, NodeOptions { slot_groups: 2, ..options() }).await.unwrap();
    let leaving = node.add_worker(Recording::new(&calls)).await.unwrap();
    let staying = node.add_worker(Recording::new(&calls)).await.unwrap();
    let mut conn = redis.shared().await.unwrap();
    // The worker's streams (one per group it answered in) that exist.
    let streams = async |conn: &mut pulse_redis::Shared, worker: &str| {
        let mut found = Vec::new();
        for group in 0..2 {
            let tag = pulse_pool::group_tag(&pool, group, 2);
            let stream = format!("pulse:{{{tag}}}:stream:replies.{}.{worker}", node.id());
            let exists: bool = redis::cmd("EXISTS").arg(&stream).query_async(conn).await.unwrap();
            if exists {
                found.push(stream);
            }
        }
        found
    };
    let mut keys = Vec::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while streams(&mut conn, &leaving).await.is_empty() || streams(&mut conn, &staying).await.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "{} jobs did not reach both workers", keys.len());
        let key = format!("before-{}", keys.len());
        assert_eq!(node.dispatch(&key, b"").await.unwrap(), DispatchOutcome::Started, "{key}");
        keys.push(key);
    }
    let kept = streams(&mut conn, &staying).await;

    node.remove_worker(&leaving).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let left = streams(&mut conn, &leaving).await;
        if left.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still there after the worker left: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(streams(&mut conn, &staying).await, kept, "the staying worker's streams");
    // (The leaving worker's jobs moved to the other one and started
    // there again.)
    let after: Vec<String> = (0..20).map(|i| format!("after-{i}")).collect();
    for key in &after {
        assert_eq!(node.dispatch(key, b"").await.unwrap(), DispatchOutcome::Started, "{key}");
    }
    assert!(started_once(&calls, &after), "a job started twice or not at all: {:?}", calls.all());
    node.close().await;
}

/// A master serving some of a grouped pool's slot groups is killed and
/// its replica promoted while jobs are dispatched to every group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_slot_groups_follows_a_cluster_master_killed_under_it() {
    let (cluster, redis, pool, tag) = cluster_with_replicas("groups-kill").await;
    // The master of group 0, which holds the pool-wide records too.
    let _cluster = run_through_a_failover_in(&redis, &pool, 8, kill_master_of(cluster, tag)).await;
}

/// A full node configured with another number of slot groups than the
/// pool has is refused, with the numbers and the way to change them;
/// nothing of the pool changes. A client-only node follows the pool's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_other_slot_groups_than_its_pool_is_refused() {
    let server = RedisServer::start();
    let redis = pulse_redis::Redis::open(server.url()).unwrap();
    let pool = pulse_testkit::unique("groups-differ");
    let node = Node::join(&redis, &pool, NodeOptions { slot_groups: 4, ..options() }).await.unwrap();
    for (groups, pool_has) in [(1, 4), (8, 4)] {
        let error =
            Node::join(&redis, &pool, NodeOptions { slot_groups: groups, ..options() }).await.unwrap_err();
        assert!(
            matches!(error, pulse_pool::Error::SlotGroupsDiffer { configured, pool_has: has, .. } if configured == groups && has == pool_has),
            "{error}"
        );
        assert!(error.to_string().contains("slot_groups = 4"), "{error}");
    }
    let error = Node::join(&redis, &pool, NodeOptions { slot_groups: 3, ..options() }).await.unwrap_err();
    assert!(matches!(error, pulse_pool::Error::InvalidSlotGroups(3)), "{error}");
    // A client-only node follows the pool's groups, whatever it was told:
    // its dispatches reach every group.
    let calls = Calls::default();
    node.add_worker(Recording::new(&calls)).await.unwrap();
    let client = Node::client(&redis, &pool, options()).await.unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    for key in &keys {
        assert_eq!(client.dispatch(key, b"").await.unwrap(), DispatchOutcome::Started);
    }
    assert!(started_once(&calls, &keys));
    assert_eq!(client.jobs().await.unwrap().len(), keys.len());
    client.close().await;
    node.shutdown(PATIENCE).await.unwrap();
    node.close().await;
    // A pool of one group refuses a node of several the same way.
    let single = pulse_testkit::unique("groups-single");
    let node = Node::join(&redis, &single, options()).await.unwrap();
    let error = Node::join(&redis, &single, NodeOptions { slot_groups: 2, ..options() }).await.unwrap_err();
    assert!(matches!(error, pulse_pool::Error::SlotGroupsDiffer { pool_has: 1, .. }), "{error}");
    node.close().await;
}

/// A cluster of three masters with a replica each, and the pool's hash
/// tag, the key whose slot holds every key of the pool.
async fn cluster_with_replicas(name: &str) -> (RedisCluster, pulse_redis::Redis, String, String) {
    let cluster = RedisCluster::start(3, 1);
    let redis = pulse_redis::Redis::open(&cluster.url()).unwrap();
    redis.verify().await.unwrap();
    let pool = pulse_testkit::unique(name);
    let tag = format!("{{{pool}}}");
    (cluster, redis, pool, tag)
}

/// The master serving the pool's slot is killed (SIGKILL) and its replica
/// promoted. The replica is in step before the kill (`WAIT`): what a write
/// not yet replicated costs is the data-loss case, tested on one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_follows_a_cluster_master_killed_under_it() {
    let (cluster, redis, pool, tag) = cluster_with_replicas("cluster-kill").await;
    let _cluster = run_through_a_failover(&redis, &pool, kill_master_of(cluster, tag)).await;
}

/// The fault of the tests above: the master serving `tag` is killed once
/// its replica is in step (`WAIT 1`), and the fault lasts until the
/// replica took over.
fn kill_master_of(mut cluster: RedisCluster, tag: String) -> impl FnOnce() -> RedisCluster + Send + 'static {
    let serving = cluster.serving(&tag);
    move || {
        let node = &mut cluster.nodes()[serving];
        let waited = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &node.port().to_string(), "WAIT", "1", "5000"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&waited.stdout).trim(), "1", "the replica is in step");
        node.kill();
        cluster.wait_for_promotion(&tag, serving);
        cluster
    }
}

/// The master serving the pool's slot hands it to its replica (`CLUSTER
/// FAILOVER`) while jobs are dispatched: the old master turns replica and
/// answers writes with `READONLY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_follows_a_cluster_failover_under_load() {
    let (cluster, redis, pool, tag) = cluster_with_replicas("cluster-failover").await;
    let serving = cluster.serving(&tag);
    let cluster = run_through_a_failover(&redis, &pool, move || {
        cluster.fail_over(serving);
        cluster
    })
    .await;
    assert_ne!(cluster.serving(&tag), serving, "the replica serves the pool's slot now");
}

/// The pool's slot moves to another master while jobs are dispatched:
/// its keys move a few at a time, and meanwhile commands are redirected
/// (`ASK`) or asked to wait (`TRYAGAIN`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_keeps_running_while_its_slot_migrates() {
    let (cluster, redis, pool, tag) = cluster_with_replicas("cluster-migrate").await;
    let serving = cluster.serving(&tag);
    let to = (serving + 1) % 3;
    let cluster = run_through_a_failover(&redis, &pool, move || {
        cluster.migrate_slot_of(&tag, to);
        cluster
    })
    .await;
    assert_eq!(cluster.serving(&format!("{{{pool}}}")), to, "the slot moved");
}

/// A slot group's slot moves to another master while jobs are dispatched
/// to every group: its readers' subscriptions are dropped by the old
/// master and made again on the new one, and the entries announced in
/// between are read from the streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_slot_groups_keeps_running_while_a_group_s_slot_migrates() {
    let (cluster, redis, pool, _) = cluster_with_replicas("groups-migrate").await;
    let tag = format!("{{{}}}", pulse_pool::group_tag(&pool, 1, 16));
    let serving = cluster.serving(&tag);
    let to = (serving + 1) % 3;
    let moved = tag.clone();
    let cluster = run_through_a_failover_in(&redis, &pool, 16, move || {
        cluster.migrate_slot_of(&moved, to);
        cluster
    })
    .await;
    assert_eq!(cluster.serving(&tag), to, "the slot moved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_follows_a_sentinel_failover() {
    let set = RedisSentinels::start();
    let redis = pulse_redis::Redis::open(&set.url()).unwrap();
    redis.verify().await.unwrap();
    let pool = pulse_testkit::unique("sentinel");
    // The fault lasts until the sentinels name the replica.
    let _set = run_through_a_failover(&redis, &pool, move || {
        let mut set = set;
        set.servers[0].kill();
        set.wait_for_primary(1);
        set
    })
    .await;
}

/// With `confirm_replicas` 1 a dispatch is confirmed started only once the
/// replica holds it: while the replica is stopped (SIGSTOP), single and
/// batched dispatches are unconfirmed, though the primary took them and
/// their worker starts them, where a node without the setting confirms
/// them; once the replica answers again, dispatches are confirmed.
async fn confirmed_only_once_held(redis: &pulse_redis::Redis, pool: &str, replica: &RedisServer) {
    pulse_testkit::init_tracing();
    let calls = Calls::default();
    let confirming =
        NodeOptions { confirm_replicas: 1, reply_timeout: Duration::from_millis(500), ..crate::options() };
    let node = Node::join(redis, pool, confirming).await.unwrap();
    node.add_worker(Recording::new(&calls)).await.unwrap();
    let plain = Node::client(redis, pool, crate::options()).await.unwrap();
    assert_eq!(node.dispatch("held", b"").await.unwrap(), DispatchOutcome::Started);

    replica.pause();
    assert_eq!(node.dispatch("unheld", b"").await.unwrap(), DispatchOutcome::Unconfirmed);
    let batch = node.dispatch_batch(&[("unheld-batch".to_owned(), Vec::new())]).await;
    assert_eq!(batch[0].as_ref().unwrap(), &DispatchOutcome::Unconfirmed);
    assert_eq!(plain.dispatch("primary-only", b"").await.unwrap(), DispatchOutcome::Started);
    calls
        .wait_until("the unconfirmed jobs started", |calls| {
            ["unheld", "unheld-batch"]
                .iter()
                .all(|key| calls.iter().any(|c| matches!(c, Call::Start { key: k, .. } if k == key)))
        })
        .await;

    replica.resume();
    assert_eq!(node.dispatch("held-again", b"").await.unwrap(), DispatchOutcome::Started);
    let batch = node.dispatch_batch(&[("held-batch".to_owned(), Vec::new())]).await;
    assert_eq!(batch[0].as_ref().unwrap(), &DispatchOutcome::Started);
    plain.close().await;
    node.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_is_confirmed_only_once_a_replica_holds_it() {
    let primary = RedisServer::start_tcp_with(&[]);
    let replica = pulse_testkit::start_replica(&primary);
    let redis = pulse_redis::Redis::open(&format!("redis://127.0.0.1:{}", primary.port())).unwrap();
    confirmed_only_once_held(&redis, "confirmed", &replica).await;
}

/// The same on a cluster: `WAIT` goes with the scripts to the pool's
/// master, and the replica stopped is that master's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_dispatch_is_confirmed_only_once_a_replica_holds_it() {
    let (mut cluster, redis, pool, tag) = cluster_with_replicas("cluster-confirm").await;
    let replica = cluster.replica_of(cluster.serving(&tag));
    confirmed_only_once_held(&redis, &pool, &cluster.nodes()[replica]).await;
}

/// A pool of 16 slot groups confirms on the replicas of each group's own
/// master: with every replica stopped, no dispatch is confirmed, single or
/// batched, whichever master its group is on (a `WAIT` sent to a master
/// the scripts did not write to would answer at once); once they answer
/// again, every one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_slot_groups_confirms_each_dispatch_on_its_group_s_replica() {
    let (mut cluster, redis, pool, _) = cluster_with_replicas("groups-confirm").await;
    let replicas: Vec<usize> = (0..3).map(|master| cluster.replica_of(master)).collect();
    let options = NodeOptions {
        slot_groups: 16,
        confirm_replicas: 1,
        reply_timeout: Duration::from_millis(500),
        ..crate::options()
    };
    let calls = Calls::default();
    let node = Node::join(&redis, &pool, options).await.unwrap();
    node.add_worker(Recording::new(&calls)).await.unwrap();
    let keys = |prefix: &str| (0..12).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    let batch = |prefix: &str| keys(prefix).into_iter().map(|key| (key, Vec::new())).collect::<Vec<_>>();

    for &replica in &replicas {
        cluster.nodes()[replica].pause();
    }
    for key in keys("unheld") {
        assert_eq!(node.dispatch(&key, b"").await.unwrap(), DispatchOutcome::Unconfirmed, "{key}");
    }
    for outcome in node.dispatch_batch(&batch("unheld-batch")).await {
        assert_eq!(outcome.unwrap(), DispatchOutcome::Unconfirmed);
    }
    for &replica in &replicas {
        cluster.nodes()[replica].resume();
    }
    for key in keys("held") {
        assert_eq!(node.dispatch(&key, b"").await.unwrap(), DispatchOutcome::Started, "{key}");
    }
    for outcome in node.dispatch_batch(&batch("held-batch")).await {
        assert_eq!(outcome.unwrap(), DispatchOutcome::Started);
    }
    node.close().await;
}
