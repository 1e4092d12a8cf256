//! Calls of different keys run at once; calls of one key stay in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulse_pool::{
    DispatchOutcome, EventOutcome, HandlerError, Job, JobContext, JobHandler, Node, NodeOptions,
    WorkerOptions,
};
use pulse_testkit::unique;
use tokio::sync::Semaphore;

use crate::{Call, Calls, Recording, finish, options};

/// [`Recording`], whose start of a job with payload `hold` waits until the
/// test opens that job's gate.
#[derive(Clone)]
struct Gated {
    inner: Recording,
    gates: Gates,
}

#[derive(Clone, Default)]
struct Gates(Arc<Mutex<HashMap<String, Arc<Semaphore>>>>);

impl Gates {
    fn of(&self, key: &str) -> Arc<Semaphore> {
        self.0.lock().unwrap().entry(key.to_owned()).or_insert_with(|| Arc::new(Semaphore::new(0))).clone()
    }

    fn open(&self, key: &str) {
        self.of(key).add_permits(1);
    }
}

impl JobHandler for Gated {
    async fn start(&self, job: Job, ctx: JobContext) -> Result<(), HandlerError> {
        let (key, hold) = (job.key.clone(), job.payload == b"hold");
        let result = self.inner.start(job, ctx).await;
        if hold {
            let _permit = self.gates.of(&key).acquire_owned().await.unwrap();
        }
        result
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.inner.stop(key).await
    }

    async fn notify(&self, key: &str, payload: Vec<u8>, seq: u64) -> Result<(), HandlerError> {
        self.inner.notify(key, payload, seq).await
    }
}

async fn gated_node(pool: &str, calls: &Calls, gates: &Gates, max_concurrent_calls: usize) -> Node {
    pulse_testkit::init_tracing();
    let node = Node::join(&crate::client(), pool, options()).await.unwrap();
    let handler = Gated { inner: Recording::new(calls), gates: gates.clone() };
    node.add_worker_with(handler, WorkerOptions { max_concurrent_calls, ..WorkerOptions::default() })
        .await
        .unwrap();
    node
}

fn began(calls: &[Call], key: &str) -> bool {
    calls.iter().any(|call| matches!(call, Call::Start { key: k, .. } if k == key))
}

#[tokio::test]
async fn while_one_job_s_start_is_slow_the_worker_runs_the_others_and_keeps_each_job_s_order() {
    let pool = unique("concurrent");
    let (calls, gates) = (Calls::default(), Gates::default());
    let node = Arc::new(gated_node(&pool, &calls, &gates, 32).await);
    let slow = {
        let node = node.clone();
        tokio::spawn(async move { node.dispatch("slow", b"hold").await.unwrap() })
    };
    calls.wait_until("the slow start began", |calls| began(calls, "slow")).await;
    // Sent while its start is held: they wait behind it.
    let slow_events = {
        let node = node.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for payload in ["s1", "s2"] {
                outcomes.push(node.notify("slow", payload.as_bytes()).await.unwrap());
            }
            outcomes
        })
    };
    // Fifty other jobs of the same worker, each started and notified
    // three times, all while the slow start has not returned.
    let mut others = Vec::new();
    for i in 0..50 {
        let node = node.clone();
        others.push(tokio::spawn(async move {
            let key = format!("k{i}");
            assert_eq!(node.dispatch(&key, b"").await.unwrap(), DispatchOutcome::Started);
            for n in 1..=3 {
                assert_eq!(node.notify(&key, format!("{n}").as_bytes()).await.unwrap(), EventOutcome::Done);
            }
        }));
    }
    for other in others {
        other.await.unwrap();
    }
    assert!(!slow.is_finished(), "the slow start was confirmed before its gate opened");
    assert_eq!(calls.of("slow").len(), 1, "a notification of the slow job ran before its start returned");
    gates.open("slow");
    assert_eq!(slow.await.unwrap(), DispatchOutcome::Started);
    assert_eq!(slow_events.await.unwrap(), vec![EventOutcome::Done, EventOutcome::Done]);
    // Each job's calls in the order they were sent.
    let payloads = |key: &str| -> Vec<Vec<u8>> {
        calls
            .of(key)
            .into_iter()
            .map(|call| match call {
                Call::Start { payload, .. } => [b"start:".as_slice(), &payload].concat(),
                Call::Notify { payload, seq, .. } => {
                    format!("{seq}:").into_bytes().into_iter().chain(payload).collect()
                }
                Call::Stop { .. } => b"stop".to_vec(),
            })
            .collect()
    };
    assert_eq!(payloads("slow"), vec![b"start:hold".to_vec(), b"1:s1".to_vec(), b"2:s2".to_vec()]);
    for i in 0..50 {
        assert_eq!(
            payloads(&format!("k{i}")),
            vec![b"start:".to_vec(), b"1:1".to_vec(), b"2:2".to_vec(), b"3:3".to_vec()],
            "k{i}"
        );
    }
    let node = Arc::into_inner(node).unwrap();
    finish(&pool, &[&node]).await;
}

#[tokio::test]
async fn a_worker_makes_at_most_max_concurrent_calls_at_once() {
    let pool = unique("concurrent_max");
    let (calls, gates) = (Calls::default(), Gates::default());
    let node = Arc::new(gated_node(&pool, &calls, &gates, 2).await);
    let mut dispatches = Vec::new();
    for key in ["a", "b", "c"] {
        let node = node.clone();
        dispatches.push(tokio::spawn(async move { node.dispatch(key, b"hold").await.unwrap() }));
    }
    let started = |calls: &[Call]| ["a", "b", "c"].into_iter().filter(|key| began(calls, key)).count();
    calls.wait_until("two starts began", |calls| started(calls) == 2).await;
    // The third waits for a free call, however long the first two take.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(started(&calls.all()), 2, "a third call began beside two held ones");
    let first = ["a", "b", "c"].into_iter().find(|key| began(&calls.all(), key)).unwrap();
    gates.open(first);
    calls.wait_until("the third start began", |calls| started(calls) == 3).await;
    for key in ["a", "b", "c"] {
        gates.open(key);
    }
    for dispatch in dispatches {
        assert_eq!(dispatch.await.unwrap(), DispatchOutcome::Started);
    }
    let node = Arc::into_inner(node).unwrap();
    finish(&pool, &[&node]).await;
}

/// A worker whose one call is held while a backlog far over its inbox
/// bounds (4 entries, 8 KiB) waits, of 2 KiB starts: its reader stops
/// reading instead of skipping, and once the call returns every job starts,
/// each once, in the order it was dispatched.
#[tokio::test]
async fn a_backlog_far_over_the_inbox_bounds_waits_in_redis_and_every_entry_is_processed() {
    const BACKLOG: usize = 120;
    pulse_testkit::init_tracing();
    let pool = unique("backlog");
    let (calls, gates) = (Calls::default(), Gates::default());
    let node = Node::join(&crate::client(), &pool, options()).await.unwrap();
    let handler = Gated { inner: Recording::new(&calls), gates: gates.clone() };
    let bounded = WorkerOptions {
        max_concurrent_calls: 1,
        inbox_entries: 4,
        inbox_bytes: 8 << 10,
        ..WorkerOptions::default()
    };
    node.add_worker_with(handler, bounded).await.unwrap();
    let holder = Arc::new(Node::client(&crate::client(), &pool, options()).await.unwrap());
    let held = {
        let holder = holder.clone();
        tokio::spawn(async move { holder.dispatch("first", b"hold").await.unwrap() })
    };
    calls.wait_until("the held start began", |calls| began(calls, "first")).await;
    // Nobody waits for these answers: they come once the gate opens.
    let impatient = NodeOptions { reply_timeout: Duration::from_millis(50), ..options() };
    let dispatcher = Node::client(&crate::client(), &pool, impatient).await.unwrap();
    let keys: Vec<String> = (0..BACKLOG).map(|i| format!("backlog-{i:03}")).collect();
    let jobs: Vec<(String, Vec<u8>)> = keys.iter().map(|key| (key.clone(), vec![b'x'; 2 << 10])).collect();
    for outcome in dispatcher.dispatch_batch(&jobs).await {
        assert_eq!(outcome.unwrap(), DispatchOutcome::Unconfirmed);
    }
    gates.open("first");
    assert_eq!(held.await.unwrap(), DispatchOutcome::Started);
    calls
        .wait_until("every job of the backlog started", |calls| keys.iter().all(|key| began(calls, key)))
        .await;
    let started: Vec<String> = calls
        .all()
        .into_iter()
        .filter_map(|call| match call {
            Call::Start { key, .. } if key != "first" => Some(key),
            _ => None,
        })
        .collect();
    assert_eq!(started, keys, "each once, in the order dispatched");
    dispatcher.close().await;
    holder.close().await;
    finish(&pool, &[&node]).await;
}
