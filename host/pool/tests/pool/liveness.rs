//! Liveness under faults: idle readers that stay connected and hear at
//! once, jobs listed on a worker that runs them, leaving and shutting down
//! without starting jobs in vain, requests refused after a data loss
//! answered as unavailable, a node whose token is cancelled fenced at
//! once, a dead host's jobs moved once each to live workers. Judged from
//! the handlers' side.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulse_pool::{
    ContextError, DispatchOutcome, HandlerError, Job, JobContext, JobHandler, Node, NodeOptions,
};
use pulse_testkit::{RedisServer, unique};

use crate::{Call, Calls, PATIENCE, Recording, finish, node, options};

async fn connections_received(server: &RedisServer) -> u64 {
    let mut conn = server.connect().await;
    let info: String = redis::cmd("INFO").arg("stats").query_async(&mut conn).await.unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_readers_keep_their_connections_and_hear_at_once_after_they_are_killed() {
    // A private server: CLIENT KILL would cut other tests' connections.
    let server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let calls = Calls::default();
    let host = Node::join(&client, "idle", options()).await.unwrap();
    for _ in 0..2 {
        host.add_worker(Recording::new(&calls)).await.unwrap();
    }
    let dispatcher = Node::client(&client, "idle", options()).await.unwrap();
    assert_eq!(dispatcher.dispatch("warm", b"").await.unwrap(), DispatchOutcome::Started);

    // Blocking reads outlast their client's response timeout: no reader
    // times out, reconnects and backs off while nothing happens.
    let before = connections_received(&server).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let opened = connections_received(&server).await - before - 1; // the check's own
    assert_eq!(opened, 0, "idle nodes opened {opened} connections in 3 s");

    // Every reader loses its connection; each reconnects and hears the
    // next dispatches (the inboxes and both reply streams).
    let mut conn = server.connect().await;
    let _: redis::Value =
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal").query_async(&mut conn).await.unwrap();
    // The dispatcher's own command connection was cut too: its first
    // command may fail (and it reconnects); the readers must not be deaf.
    let mut first = dispatcher.dispatch("job-0", b"").await;
    if first.is_err() {
        first = dispatcher.dispatch("job-0", b"").await;
    }
    assert_eq!(first.unwrap(), DispatchOutcome::Started);
    for i in 1..10 {
        assert_eq!(dispatcher.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    calls
        .wait_until("every job started", |calls| {
            calls.iter().filter(|c| matches!(c, Call::Start { .. })).count() == 11
        })
        .await;
    dispatcher.close().await;
    host.close().await;
}

#[tokio::test]
async fn a_job_listed_on_a_worker_that_does_not_run_it_starts_again() {
    let pool = unique("orphan");
    let calls = Calls::default();
    let node = node(&pool, 1, &calls).await;
    assert_eq!(node.dispatch("real", b"").await.unwrap(), DispatchOutcome::Started);
    let worker = node.workers().await.unwrap().remove(0).id;
    // Redis lists a job on the worker, which never heard of it (as after a
    // hand-back cut short, or a write-back racing a start).
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let token: u64 =
        redis::cmd("INCR").arg(format!("pulse:{{{pool}}}:tokens")).query_async(&mut conn).await.unwrap();
    redis::pipe()
        .hset(format!("pulse:{{{pool}}}:jobs"), "orphan", format!("running|{worker}|{token}|0"))
        .hset_multiple(
            format!("pulse:{{{pool}}}:job:orphan"),
            &[("payload", "lost"), ("created", "1"), ("attempt", "1")],
        )
        .sadd(format!("pulse:{{{pool}}}:worker:{worker}:jobs"), "orphan")
        .exec_async(&mut conn)
        .await
        .unwrap();
    // Without any traffic, the worker finds it and it starts again.
    calls
        .wait_until("the orphan started", |calls| {
            calls.iter().any(|c| matches!(c, Call::Start { key, payload, requeued: true, .. } if key == "orphan" && payload == b"lost"))
        })
        .await;
    crate::wait_for_state(&node, "orphan", pulse_pool::JobState::Running).await;
    assert_eq!(calls.of("real").len(), 1, "the job it runs is left alone");
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_node_leaving_with_two_workers_hands_each_job_straight_to_the_other_node() {
    let pool = unique("leave-node");
    let calls = Calls::default();
    let leaving = node(&pool, 2, &calls).await;
    let staying = node(&pool, 2, &calls).await;
    for i in 0..100 {
        assert_eq!(staying.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    let workers = staying.workers().await.unwrap();
    let of_leaving: HashSet<String> =
        workers.iter().filter(|w| w.node == leaving.id()).map(|w| w.id.clone()).collect();
    let before = calls.all().len();
    leaving.close().await;
    calls
        .wait_until("every job runs on the staying node", |calls| {
            let placement = crate::membership::placement_of(calls);
            placement.len() == 100 && placement.values().all(|w| !of_leaving.contains(w))
        })
        .await;
    let after = &calls.all()[before..];
    let mut starts: HashMap<&str, usize> = HashMap::new();
    for call in after {
        if let Call::Start { worker, key, .. } = call {
            assert!(!of_leaving.contains(worker), "{key} started on {worker}, which was leaving");
            *starts.entry(key).or_default() += 1;
        }
    }
    assert!(starts.values().all(|n| *n == 1), "a job started more than once: {starts:?}");
    crate::membership::assert_no_overlap(&calls.all());
    finish(&pool, &[&staying]).await;
}

#[tokio::test]
async fn once_a_pool_shutdown_began_no_job_starts_anywhere() {
    let pool = unique("shutdown-starts");
    let calls = Calls::default();
    let a = node(&pool, 2, &calls).await;
    let b = node(&pool, 2, &calls).await;
    for i in 0..100 {
        assert_eq!(a.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    let before = calls.all().len();
    assert_eq!(a.shutdown(PATIENCE).await.unwrap(), 100);
    let after = &calls.all()[before..];
    let started: Vec<&Call> = after.iter().filter(|c| matches!(c, Call::Start { .. })).collect();
    assert!(
        started.is_empty(),
        "{} jobs started during the shutdown: {:?}",
        started.len(),
        &started[..started.len().min(3)]
    );
    let stopped: HashSet<&str> =
        after.iter().filter(|c| matches!(c, Call::Stop { .. })).map(Call::key).collect();
    assert_eq!(stopped.len(), 100, "every job is stopped once");
    a.close().await;
    b.close().await;
}

/// Keeps each job's context, to make requests outside handler calls.
#[derive(Clone, Default)]
struct Keeping {
    contexts: Arc<Mutex<HashMap<String, JobContext>>>,
}

impl JobHandler for Keeping {
    async fn start(&self, job: Job, ctx: JobContext) -> Result<(), HandlerError> {
        self.contexts.lock().unwrap().insert(job.key, ctx);
        Ok(())
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.contexts.lock().unwrap().remove(key);
        Ok(())
    }
    async fn notify(&self, _key: &str, _payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_lost_its_data_a_running_job_s_requests_are_unavailable_never_not_owned() {
    let mut server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let handler = Keeping::default();
    let node = Node::join(&client, "lost", options()).await.unwrap();
    node.add_worker(handler.clone()).await.unwrap();
    assert_eq!(node.dispatch("job", b"").await.unwrap(), DispatchOutcome::Started);
    let ctx = handler.contexts.lock().unwrap()["job"].clone();
    ctx.save_state(b"1").await.unwrap();

    server.restart();
    // Until the worker has written its job back, the job is still its own:
    // a refusal is the loss's doing and says so.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut unavailable = 0;
    loop {
        match ctx.save_state(b"2").await {
            Ok(()) => break,
            Err(ContextError::Unavailable(_)) => unavailable += 1,
            Err(error) => panic!("after a data loss the job's request was refused with {error:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "the job was never written back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(unavailable > 0, "the first request after the loss cannot have succeeded");
    assert!(ctx.is_live());
    assert_eq!(node.status("job").await.unwrap().unwrap().state, pulse_pool::JobState::Running);
    node.close().await;
}

/// Starts a job only once the test lets it.
#[derive(Clone)]
struct Gated {
    gate: Arc<tokio::sync::Semaphore>,
}

impl JobHandler for Gated {
    async fn start(&self, _job: Job, _ctx: JobContext) -> Result<(), HandlerError> {
        self.gate.acquire().await.unwrap().forget();
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn notify(&self, _key: &str, _payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test]
async fn a_job_is_listed_starting_until_its_handler_s_start_returned() {
    let pool = unique("starting");
    pulse_testkit::init_tracing();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let node = Node::join(&crate::client(), &pool, options()).await.unwrap();
    node.add_worker(Gated { gate: gate.clone() }).await.unwrap();
    let dispatch = {
        let node = Node::client(&crate::client(), &pool, options()).await.unwrap();
        tokio::spawn(async move {
            let outcome = node.dispatch("slow", b"").await.unwrap();
            node.close().await;
            outcome
        })
    };
    crate::wait_for_state(&node, "slow", pulse_pool::JobState::Starting).await;
    let listed = node.jobs().await.unwrap();
    assert_eq!(listed[0].state, pulse_pool::JobState::Starting, "{listed:?}");
    gate.add_permits(1);
    assert_eq!(dispatch.await.unwrap(), DispatchOutcome::Started);
    assert_eq!(node.status("slow").await.unwrap().unwrap().state, pulse_pool::JobState::Running);
    finish(&pool, &[&node]).await;
}

/// Panics in `start`: a handler with a bug.
#[derive(Clone)]
struct Panicking;

impl JobHandler for Panicking {
    async fn start(&self, job: Job, _ctx: JobContext) -> Result<(), HandlerError> {
        panic!("a handler bug while starting {}", job.key);
    }

    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }

    async fn notify(&self, _key: &str, _payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_handler_panics_stops_holding_its_jobs_and_they_run_elsewhere() {
    let pool = unique("panicking");
    let fast = pulse_pool::NodeOptions { lease_ttl: Duration::from_millis(800), ..options() };
    let buggy = Node::join(&crate::client(), &pool, fast.clone()).await.unwrap();
    buggy.add_worker(Panicking).await.unwrap();
    let calls = Calls::default();
    let sound = Node::join(&crate::client(), &pool, fast.clone()).await.unwrap();
    sound.add_worker(Recording::new(&calls)).await.unwrap();
    let dispatcher = Node::client(
        &crate::client(),
        &pool,
        pulse_pool::NodeOptions { reply_timeout: Duration::from_millis(200), ..fast },
    )
    .await
    .unwrap();
    // About half route to the buggy worker: its task panics at the first,
    // and is never answered.
    let keys: Vec<String> = (0..10).map(|i| format!("job-{i}")).collect();
    for key in &keys {
        dispatcher.dispatch(key, b"").await.unwrap();
    }
    // Its node renews its lease no longer: the worker is evicted and every
    // job starts on the sound worker.
    calls
        .wait_until("every job started on the sound worker", |calls| {
            keys.iter().all(|key| calls.iter().any(|c| matches!(c, Call::Start { key: k, .. } if k == key)))
        })
        .await;
    dispatcher.close().await;
    buggy.close().await;
    finish(&pool, &[&sound]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_the_token_a_node_was_given_fences_its_workers_at_once() {
    // A private server: the node ends abruptly and leaves its state.
    let server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let root = tokio_util::sync::CancellationToken::new();
    // Its lease would keep the worker's fence up for 108 s: only the
    // cancellation can bring it down within the wait below.
    let options =
        NodeOptions { lease_ttl: Duration::from_secs(120), cancel: root.child_token(), ..options() };
    let node = Node::join(&client, "cancelled", options).await.unwrap();
    let handler = Keeping::default();
    node.add_worker(handler.clone()).await.unwrap();
    assert_eq!(node.dispatch("job", b"").await.unwrap(), DispatchOutcome::Started);
    let ctx = handler.contexts.lock().unwrap()["job"].clone();
    assert!(ctx.is_live());

    root.cancel();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while ctx.is_live() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job may still run after its node's token was cancelled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A host of more workers than one eviction used to take dies: every
/// slot it held goes straight to a live worker, and each of its jobs is
/// assigned once, started once on a survivor, never routed through
/// another of the dead host's workers on the way (which would issue it a
/// second token, and start it only after a second eviction).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_host_s_jobs_move_once_each_straight_to_live_workers() {
    dead_host_s_jobs_move_once_each("dead-host", 1, 20, 200).await;
}

/// The same in a pool of 4 slot groups: the dead host is a member of
/// every group, and in each its jobs move once, straight to the
/// survivor's workers, with one token per dispatch and per move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_pool_of_slot_groups_a_dead_host_s_jobs_move_once_each_in_every_group() {
    dead_host_s_jobs_move_once_each("dead-grouped", 4, 4, 120).await;
}

/// A survivor of 2 workers and a host of `dead_workers` run `jobs` jobs
/// in pool `pool` of `groups` slot groups; the host dies (its token is
/// cancelled). Each of its jobs starts once on the survivor, which holds
/// every slot of every group, and the groups' token counters add up to
/// one token per dispatch and per move.
async fn dead_host_s_jobs_move_once_each(pool: &str, groups: u32, dead_workers: usize, jobs: usize) {
    pulse_testkit::init_tracing();
    // A private server: the dead host leaves its state behind.
    let server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let short = NodeOptions { lease_ttl: Duration::from_secs(2), slot_groups: groups, ..options() };
    let (live, dead) = (Calls::default(), Calls::default());
    let survivor = Node::join(&client, pool, short.clone()).await.unwrap();
    for _ in 0..2 {
        survivor.add_worker(Recording::new(&live)).await.unwrap();
    }
    let root = tokio_util::sync::CancellationToken::new();
    let host = Node::join(&client, pool, NodeOptions { cancel: root.child_token(), ..short }).await.unwrap();
    for _ in 0..dead_workers {
        host.add_worker(Recording::new(&dead)).await.unwrap();
    }
    // Each group's token counter from a known start (a new counter would
    // start at Redis's clock).
    const COUNTED_FROM: u64 = 1_000;
    let mut conn = server.connect().await;
    for group in 0..groups {
        let tag = pulse_pool::group_tag(pool, group, groups);
        redis::cmd("SET")
            .arg(format!("pulse:{{{tag}}}:tokens"))
            .arg(COUNTED_FROM)
            .exec_async(&mut conn)
            .await
            .unwrap();
    }
    let keys: Vec<String> = (0..jobs).map(|i| format!("job-{i}")).collect();
    for key in &keys {
        assert_eq!(survivor.dispatch(key, b"").await.unwrap(), DispatchOutcome::Started);
    }
    let started = |calls: &[Call]| -> HashMap<String, usize> {
        let mut starts = HashMap::new();
        for call in calls {
            if let Call::Start { key, .. } = call {
                *starts.entry(key.clone()).or_default() += 1;
            }
        }
        starts
    };
    let all_started = |a: &Calls, b: &Calls| {
        let (a, b) = (started(&a.all()), started(&b.all()));
        keys.iter().all(|key| a.contains_key(key) || b.contains_key(key))
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !all_started(&live, &dead) {
        assert!(tokio::time::Instant::now() < deadline, "not every job started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let moved: HashSet<String> = started(&dead.all()).into_keys().collect();
    assert!(moved.len() > jobs / 2, "the host ran {} of {jobs} jobs", moved.len());
    let groups_moved: HashSet<u32> = moved
        .iter()
        .map(|key| pulse_pool::hash::group_of(key, pulse_pool::hash::VIRTUAL_SLOTS, groups))
        .collect();
    assert_eq!(groups_moved.len(), groups as usize, "the host ran jobs of every group");

    root.cancel();
    live.wait_until("every job of the dead host started on a survivor", |calls| {
        let starts = started(calls);
        moved.iter().all(|key| starts.contains_key(key))
    })
    .await;
    let starts = started(&live.all());
    let twice: Vec<_> = starts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "started twice on the survivor: {twice:?}");

    let survivors: HashSet<String> = survivor
        .workers()
        .await
        .unwrap()
        .into_iter()
        .filter(|w| w.node == survivor.id())
        .map(|w| w.id)
        .collect();
    let mut tokens = 0;
    for group in 0..groups {
        let tag = pulse_pool::group_tag(pool, group, groups);
        let table = pulse_testkit::slot_table(&mut conn, &tag).await;
        assert_eq!(table.len(), 4096, "group {group}: every slot is held");
        let holders: HashSet<&String> = table.values().collect();
        assert!(
            holders.iter().all(|w| survivors.contains(*w)),
            "group {group}: {holders:?} of {survivors:?}"
        );
        let counted: u64 =
            redis::cmd("GET").arg(format!("pulse:{{{tag}}}:tokens")).query_async(&mut conn).await.unwrap();
        tokens += counted - COUNTED_FROM;
    }
    // One token per dispatch, one per move: a job routed to a dead worker
    // on its way would have taken two.
    assert_eq!(tokens, (jobs + moved.len()) as u64, "{} jobs moved", moved.len());
    survivor.close().await;
}
