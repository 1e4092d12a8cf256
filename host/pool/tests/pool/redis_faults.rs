//! Redis restarting under the pool: with its data (append-only file,
//! `appendfsync always`) and empty.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use pulse_pool::{DispatchOutcome, JobState, Node, NodeOptions};
use pulse_testkit::RedisServer;

use crate::{Call, Calls, PATIENCE, Recording};

fn options() -> NodeOptions {
    NodeOptions {
        lease_ttl: Duration::from_secs(2),
        reply_timeout: Duration::from_secs(2),
        ..crate::options()
    }
}

/// Dispatches `job-<i>` until the pool answers (Redis may be down):
/// started, or already there from an attempt whose answer was lost.
async fn dispatch_until_answered(node: &Node, i: usize) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match node.dispatch(&format!("job-{i}"), b"").await {
            Ok(DispatchOutcome::Started | DispatchOutcome::AlreadyExists(_)) => return,
            // The answer was lost with a connection: ask again.
            Ok(DispatchOutcome::Unconfirmed) => {}
            Ok(other) => panic!("job-{i}: {other:?}"),
            Err(error) => {
                assert!(tokio::time::Instant::now() < deadline, "job-{i}: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Waits until `workers` workers hold slots, `count` jobs run in Redis,
/// and each handler run is the one Redis names, where its key routes.
async fn all_running(node: &Node, calls: &Calls, count: usize, workers: usize) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let joined = node.workers().await.unwrap_or_default().iter().filter(|w| w.slots > 0).count();
        let jobs = node.jobs().await.unwrap_or_default();
        let running = crate::membership::placement_of(&calls.all());
        // Settled: every worker joined and each job runs where its key
        // routes. After a data loss the workers join again one after the
        // other, and a job written back on one may then move to another.
        if joined == workers
            && jobs.len() == count
            && jobs.iter().all(|job| {
                job.state == JobState::Running
                    && running.get(&job.key) == job.worker.as_ref()
                    && node.owner(&job.key) == job.worker
            })
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{} of {count} jobs run", jobs.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_with_its_data_under_load_loses_and_doubles_nothing() {
    let mut server = RedisServer::start_persistent();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let calls = Calls::default();
    let node = Arc::new(Node::join(&client, "aof", options()).await.unwrap());
    for _ in 0..3 {
        node.add_worker(Recording::new(&calls)).await.unwrap();
    }
    let load = tokio::spawn({
        let node = node.clone();
        async move {
            for i in 0..600 {
                dispatch_until_answered(&node, i).await;
            }
        }
    });
    calls.wait_until("a third of the jobs started", |c| c.len() >= 200).await;
    server.restart();
    load.await.unwrap();
    all_running(&node, &calls, 600, 3).await;
    crate::membership::assert_no_overlap(&calls.all());
    let all = calls.all();
    let started: HashSet<&str> = all
        .iter()
        .filter_map(|c| match c {
            Call::Start { key, .. } => Some(key.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 600);
    node.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_empty_is_detected_and_the_running_jobs_are_written_back() {
    let mut server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let calls = Calls::default();
    let node = Node::join(&client, "empty", options()).await.unwrap();
    for _ in 0..2 {
        node.add_worker(Recording::new(&calls)).await.unwrap();
    }
    for i in 0..50 {
        assert_eq!(node.dispatch(&format!("job-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    let epoch = |conn: redis::aio::MultiplexedConnection| async move {
        let mut conn = conn;
        let epoch: Option<String> =
            redis::cmd("GET").arg("pulse:{empty}:epoch").query_async(&mut conn).await.unwrap();
        epoch
    };
    let before = epoch(server.connect().await).await.unwrap();
    server.restart();
    // Only the workers can put the jobs back: Redis came back empty.
    all_running(&node, &calls, 50, 2).await;
    let after = epoch(server.connect().await).await.unwrap();
    assert_ne!(before, after, "the pool has a new epoch");
    // The jobs are the pool's again: they stop, and new ones start.
    assert_eq!(node.stop("job-0").await.unwrap(), pulse_pool::EventOutcome::Done);
    assert_eq!(node.dispatch("job-new", b"").await.unwrap(), DispatchOutcome::Started);
    crate::membership::assert_no_overlap(&calls.all());
    node.close().await;
}

/// A job's start, as its handler got it.
#[derive(Clone)]
struct Start {
    key: String,
    token: u64,
    state: Option<Vec<u8>>,
}

/// A handler that keeps each job's context (for the test to write with,
/// as a plugin's timer does, outside any call), notes each start, and
/// keeps what its jobs saved, as the runtime does.
#[derive(Clone, Default)]
struct Kept {
    contexts: Arc<std::sync::Mutex<Vec<pulse_pool::JobContext>>>,
    starts: Arc<std::sync::Mutex<Vec<Start>>>,
    saved: Arc<std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>>,
}

impl Kept {
    fn context(&self, key: &str) -> pulse_pool::JobContext {
        self.contexts.lock().unwrap().iter().rev().find(|ctx| ctx.key() == key).cloned().unwrap()
    }

    fn starts_of(&self, key: &str) -> Vec<Start> {
        self.starts.lock().unwrap().iter().filter(|start| start.key == key).cloned().collect()
    }

    fn tokens_of(&self, key: &str) -> Vec<u64> {
        self.starts_of(key).iter().map(|start| start.token).collect()
    }

    async fn save(&self, key: &str, state: &[u8]) {
        self.context(key).save_state(state).await.unwrap();
        self.saved.lock().unwrap().insert(key.to_owned(), state.to_vec());
    }
}

impl pulse_pool::JobHandler for Kept {
    async fn start(
        &self,
        job: pulse_pool::Job,
        ctx: pulse_pool::JobContext,
    ) -> Result<(), pulse_pool::HandlerError> {
        let token = ctx.token().parse().unwrap();
        self.starts.lock().unwrap().push(Start { key: job.key, token, state: job.state });
        self.contexts.lock().unwrap().push(ctx);
        Ok(())
    }

    async fn stop(&self, _key: &str) -> Result<(), pulse_pool::HandlerError> {
        Ok(())
    }

    async fn notify(&self, _key: &str, _payload: Vec<u8>, _seq: u64) -> Result<(), pulse_pool::HandlerError> {
        Ok(())
    }

    async fn saved_state(&self, key: &str) -> Option<Vec<u8>> {
        self.saved.lock().unwrap().get(key).cloned()
    }
}

/// A service that keeps the newest token per job refuses writes with an
/// older one: a job's token must never go back, also when Redis loses the
/// counter with the rest of the pool's data, or a shutdown removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_token_only_grows_across_redis_losing_its_data_and_a_shutdown() {
    let mut server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let tokens = Kept::default();
    let node = Node::join(&client, "tokens", options()).await.unwrap();
    node.add_worker(tokens.clone()).await.unwrap();
    for key in ["kept", "again"] {
        assert_eq!(node.dispatch(key, b"").await.unwrap(), DispatchOutcome::Started);
    }
    assert_eq!(node.stop("again").await.unwrap(), pulse_pool::EventOutcome::Done);
    server.restart();
    // The worker writes `kept` back under its token; `again` ran nowhere
    // when Redis lost it, so nothing but the counter remembers its token.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        // Queued when it came before the workers joined again.
        match node.dispatch("again", b"").await {
            Ok(DispatchOutcome::Started | DispatchOutcome::Queued | DispatchOutcome::AlreadyExists(_)) => {
                break;
            }
            other => assert!(tokio::time::Instant::now() < deadline, "{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while tokens.tokens_of("again").len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "again did not start after the loss");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let runs = tokens.tokens_of("again");
    assert!(runs[1] > runs[0], "after Redis lost its data: {runs:?}");
    node.shutdown(PATIENCE).await.unwrap();

    let node = Node::join(&client, "tokens", options()).await.unwrap();
    node.add_worker(tokens.clone()).await.unwrap();
    assert_eq!(node.dispatch("again", b"").await.unwrap(), DispatchOutcome::Started);
    let runs = tokens.tokens_of("again");
    assert!(runs[2] > runs[1], "after a shutdown: {runs:?}");
    assert_eq!(tokens.tokens_of("kept").len(), 1, "kept was written back, not started again");
    node.shutdown(PATIENCE).await.unwrap();
}

/// Redis restarted empty lost the state a running job saved; its worker
/// writes it back with the job, so when the job moves its next start
/// resumes from it, not from nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_redis_restarted_empty_a_job_that_moves_resumes_from_the_state_it_saved() {
    let mut server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let first = Kept::default();
    let leaving = Node::join(&client, "state-back", options()).await.unwrap();
    leaving.add_worker(first.clone()).await.unwrap();
    assert_eq!(leaving.dispatch("counter", b"").await.unwrap(), DispatchOutcome::Started);
    first.save("counter", b"count 41").await;
    server.restart();
    // Written back by its worker: listed running again.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while leaving.status("counter").await.ok().flatten().map(|job| job.state) != Some(JobState::Running) {
        assert!(tokio::time::Instant::now() < deadline, "the job was not written back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = Kept::default();
    let staying = Node::join(&client, "state-back", options()).await.unwrap();
    staying.add_worker(second.clone()).await.unwrap();
    leaving.close().await;
    while second.starts_of("counter").is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the job did not move");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let states: Vec<_> = second.starts_of("counter").into_iter().map(|start| start.state).collect();
    assert_eq!(states, [Some(b"count 41".to_vec())]);
    staying.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_emitted_across_a_redis_restart_with_its_data_are_all_written_in_order() {
    let mut server = RedisServer::start_persistent();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let node = Node::join(&client, "emits", options()).await.unwrap();
    let keeper = Kept::default();
    node.add_worker(keeper.clone()).await.unwrap();
    assert_eq!(node.dispatch("e", b"").await.unwrap(), DispatchOutcome::Started);
    let ctx = keeper.contexts.lock().unwrap()[0].clone();

    // Emitting 1..=N; Redis restarts after the first third. An emit that
    // is refused (the worker's fence fell while Redis was away, and it
    // wrote at once) is made again, as a plugin would.
    const N: usize = 600;
    let emitter = tokio::spawn(async move {
        for i in 1..=N {
            while ctx.emit(i.to_string().as_bytes()).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Spread over about 1.5 s, so that events are emitted while
            // Redis is away.
            tokio::time::sleep(Duration::from_micros(2_500)).await;
        }
    });
    let mut conn = server.connect().await;
    let events_key = "pulse:{emits}:stream:events";
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let len = crate::stream_events(&mut conn, events_key).await.len();
        if len >= N / 3 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{len} events written before the restart");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.restart();
    emitter.await.unwrap();

    // Every event arrives, in the order emitted (a batch whose answer the
    // restart cut off is sent again, so one may arrive twice).
    let mut conn = server.connect().await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let numbers: Vec<usize> = crate::stream_events(&mut conn, events_key)
            .await
            .iter()
            .map(|event| String::from_utf8_lossy(&event.payload).parse().unwrap())
            .collect();
        let mut seen = HashSet::new();
        let first: Vec<usize> = numbers.iter().copied().filter(|n| seen.insert(*n)).collect();
        assert!(first.iter().zip(1..).all(|(n, i)| *n == i), "events out of order: {numbers:?}");
        if first.len() == N {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{} of {N} events written: {numbers:?}", first.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_of_the_events_never_sees_an_id_twice_across_redis_restarting_empty() {
    let mut server = RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let node = Node::join(&client, "follow", options()).await.unwrap();
    let keeper = Kept::default();
    node.add_worker(keeper.clone()).await.unwrap();
    assert_eq!(node.dispatch("e", b"").await.unwrap(), DispatchOutcome::Started);
    let ctx = keeper.contexts.lock().unwrap()[0].clone();
    let emitted = pulse_pool::EmittedEvents::open(&client, "follow").await.unwrap();
    let mut following = emitted.follow(None).await.unwrap();

    // Emits 1..=N, spread over about 1.5 s; Redis restarts empty after the
    // first third, so what was written before is lost.
    const N: usize = 600;
    let emitter = tokio::spawn(async move {
        for i in 1..=N {
            while ctx.emit(i.to_string().as_bytes()).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_micros(2_500)).await;
        }
    });
    let mut ids: Vec<String> = Vec::new();
    let mut restarted = false;
    loop {
        let next = tokio::time::timeout(PATIENCE, following.recv()).await.expect("the follower saw no event");
        let Some(pulse_pool::Followed::Event(event)) = next else { panic!("the follower ended: {next:?}") };
        if let Some(last) = ids.last() {
            assert!(
                pulse_streams::id_after(&event.id, last),
                "id {} after {last}: seen twice or gone back",
                event.id
            );
        }
        ids.push(event.id.clone());
        if !restarted && ids.len() >= N / 3 {
            server.restart();
            restarted = true;
        }
        if event.payload == N.to_string().as_bytes() {
            break;
        }
    }
    emitter.await.unwrap();
    following.close().await;
    node.close().await;
}
