//! The pool against real private Redis servers, with in-process handlers
//! that record every call.
//!
//! - `concurrency`: calls of different keys at once, of one key in order.
//! - `deployments`: a Redis Cluster and Sentinel, a primary killed.
//! - `dispatch`: routing, outcomes, unique keys, queued jobs, failures.
//! - `events`: stop and notify, order, sequence numbers, duplicates.
//! - `membership`: workers joining and leaving while jobs run.
//! - `liveness`: idle readers, orphaned jobs, leaving, shutdown, data loss.
//! - `load`: many dispatches; Redis commands per dispatch.
//! - `redis_faults`: Redis restarting with its data and empty.
//! - `schedules`: tickers and schedules.
//! - `writes`: a call's writes land in one step with its answer.
#![allow(clippy::unwrap_used, reason = "tests and their helpers: a panic is the failure report")]

mod concurrency;
mod deployments;
mod dispatch;
mod events;
mod liveness;
mod load;
mod membership;
mod redis_faults;
mod replace;
mod schedules;
mod writes;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulse_pool::{HandlerError, Job, JobContext, JobHandler, Node, NodeOptions};
use tokio::sync::Notify;

/// How long a test waits for something that takes milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// One call a handler received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Start { worker: String, key: String, payload: Vec<u8>, attempt: u32, requeued: bool },
    Stop { worker: String, key: String },
    Notify { worker: String, key: String, payload: Vec<u8>, seq: u64 },
}

impl Call {
    pub fn key(&self) -> &str {
        match self {
            Call::Start { key, .. } | Call::Stop { key, .. } | Call::Notify { key, .. } => key,
        }
    }
}

/// Every call of every handler of a test, in order.
#[derive(Clone, Default, Debug)]
pub struct Calls {
    calls: Arc<Mutex<Vec<Call>>>,
    changed: Arc<Notify>,
}

impl Calls {
    fn push(&self, call: Call) {
        self.calls.lock().unwrap().push(call);
        self.changed.notify_waiters();
    }

    pub fn all(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn of(&self, key: &str) -> Vec<Call> {
        self.all().into_iter().filter(|c| c.key() == key).collect()
    }

    pub fn starts(&self) -> usize {
        self.all().iter().filter(|c| matches!(c, Call::Start { .. })).count()
    }

    /// Waits until `done` holds for the calls so far.
    pub async fn wait_until(&self, what: &str, done: impl Fn(&[Call]) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let changed = self.changed.notified();
            if done(&self.all()) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
            let _ = tokio::time::timeout(Duration::from_millis(100), changed).await;
        }
    }
}

/// A handler that records its calls and reacts to payloads:
/// `refuse` (invalid input), `fatal`, `retry` (always retryable),
/// `retry-once` (retryable on the first attempt), `complete` (completes
/// itself during start), `held` (held, unless started again after a
/// move); anything else starts.
#[derive(Clone, Debug)]
pub struct Recording {
    calls: Calls,
    workers: Arc<Mutex<HashMap<String, String>>>,
    /// Holds (`HandlerError::Held`) a notification `hold`.
    holds: bool,
}

impl Recording {
    pub fn new(calls: &Calls) -> Self {
        Self { calls: calls.clone(), workers: Arc::default(), holds: false }
    }

    /// A recording handler that holds the notification `hold`.
    pub fn holding(calls: &Calls) -> Self {
        Self { holds: true, ..Self::new(calls) }
    }

    fn worker_of(&self, key: &str) -> String {
        self.workers.lock().unwrap().get(key).cloned().unwrap_or_default()
    }
}

impl JobHandler for Recording {
    async fn start(&self, job: Job, ctx: JobContext) -> Result<(), HandlerError> {
        self.workers.lock().unwrap().insert(job.key.clone(), ctx.worker().to_owned());
        self.calls.push(Call::Start {
            worker: ctx.worker().to_owned(),
            key: job.key.clone(),
            payload: job.payload.clone(),
            attempt: job.attempt,
            requeued: job.requeued,
        });
        match job.payload.as_slice() {
            b"refuse" => Err(HandlerError::InvalidInput("refused on purpose".into())),
            b"fatal" => Err(HandlerError::Fatal("failed on purpose".into())),
            b"retry" => Err(HandlerError::Retryable("not yet".into())),
            b"retry-once" if job.attempt == 1 => Err(HandlerError::Retryable("not yet".into())),
            b"held" if !job.requeued => Err(HandlerError::Held("not on this worker".into())),
            b"complete" => {
                ctx.complete().await.unwrap();
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.calls.push(Call::Stop { worker: self.worker_of(key), key: key.to_owned() });
        Ok(())
    }

    async fn notify(&self, key: &str, payload: Vec<u8>, seq: u64) -> Result<(), HandlerError> {
        self.calls.push(Call::Notify {
            worker: self.worker_of(key),
            key: key.to_owned(),
            payload: payload.clone(),
            seq,
        });
        match payload.as_slice() {
            b"fatal" => Err(HandlerError::Fatal("notification failed on purpose".into())),
            b"oops" => Err(HandlerError::Retryable("notification not handled".into())),
            b"hold" if self.holds => Err(HandlerError::Held("not on this worker".into())),
            _ => Ok(()),
        }
    }
}

/// Waits until `node` lists job `key` in `state` (a start shows as
/// `Starting` until its worker has answered it, a moment after the handler
/// returned).
pub async fn wait_for_state(node: &Node, key: &str, state: pulse_pool::JobState) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = node.status(key).await.unwrap().map(|job| job.state);
        if now == Some(state) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{key} is {now:?}, not {state:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Calls per command so far (`INFO commandstats`: lower-case names,
/// Lua-internal calls included), since the server started or its counts
/// were reset.
pub async fn command_calls(conn: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    info.lines()
        .filter_map(|line| {
            let (command, rest) = line.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((command.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

/// A client of the binary's shared private Redis.
pub fn client() -> pulse_redis::Redis {
    pulse_redis::Redis::open(pulse_testkit::shared_redis_url()).unwrap()
}

/// Options with a short reply timeout and backoff, for tests.
pub fn options() -> NodeOptions {
    NodeOptions { retry_backoff: Duration::from_millis(10), ..NodeOptions::default() }
}

/// A full node of pool `pool` with `workers` recording workers.
pub async fn node(pool: &str, workers: usize, calls: &Calls) -> Node {
    pulse_testkit::init_tracing();
    let node = Node::join(&client(), pool, options()).await.unwrap();
    for _ in 0..workers {
        node.add_worker(Recording::new(calls)).await.unwrap();
    }
    node
}

/// The events of events stream `stream` as a reader gets them, oldest
/// first (each event of an entry shared by several on its own).
pub async fn stream_events(
    conn: &mut impl redis::aio::ConnectionLike,
    stream: &str,
) -> Vec<pulse_streams::Event> {
    let reply: redis::streams::StreamRangeReply =
        redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query_async(conn).await.unwrap();
    reply
        .ids
        .iter()
        .flat_map(|entry| pulse_streams::Event::from_entry(entry).expect("a well-formed entry"))
        .collect()
}

/// The payloads of the events job `key` of pool `pool` emitted, in the
/// stream's order (on the shared Redis).
pub async fn emitted_by(pool: &str, key: &str) -> Vec<Vec<u8>> {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    stream_events(&mut conn, &format!("pulse:{{{pool}}}:stream:events"))
        .await
        .into_iter()
        .filter(|event| event.topic.as_deref() == Some(key))
        .map(|event| event.payload)
        .collect()
}

/// Stops every job, closes the nodes, removes what only a pool shutdown
/// removes (membership maps, counters), and checks nothing else is left.
pub async fn finish(pool: &str, nodes: &[&Node]) {
    if let Some(node) = nodes.first() {
        for job in node.jobs().await.unwrap() {
            node.stop(&job.key).await.unwrap();
            node.forget(&job.key).await.unwrap();
        }
    }
    for node in nodes {
        node.close().await;
    }
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let counters = ["tokens", "joins", "epoch", "events-written", "events-count", "events-bytes", "tickers"];
    for suffix in ["map:slots", "map:workers", "stream:events"].into_iter().chain(counters) {
        redis::cmd("DEL").arg(format!("pulse:{{{pool}}}:{suffix}")).exec_async(&mut conn).await.unwrap();
    }
    pulse_testkit::assert_no_keys(&mut conn, pool).await;
}
