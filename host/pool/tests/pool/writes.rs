//! A call's writes (its events, its saved state, its job's completion)
//! land in one step with the answer to the call, or not at all: nothing
//! of a call is in Redis while the call still runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pulse_pool::{EventOutcome, HandlerError, Job, JobContext, JobHandler};
use pulse_testkit::unique;
use tokio::sync::{Notify, Semaphore};

use crate::{PATIENCE, finish};

/// On `notify`: saves the payload as its state, emits it, and completes
/// the job when the payload is `complete`; then says it wrote and waits
/// until the test lets the call return.
#[derive(Clone)]
struct Writer {
    contexts: Arc<Mutex<HashMap<String, JobContext>>>,
    wrote: Arc<Notify>,
    gate: Arc<Semaphore>,
}

impl Default for Writer {
    fn default() -> Self {
        Self { contexts: Arc::default(), wrote: Arc::default(), gate: Arc::new(Semaphore::new(0)) }
    }
}

impl JobHandler for Writer {
    async fn start(&self, job: Job, ctx: JobContext) -> Result<(), HandlerError> {
        self.contexts.lock().unwrap().insert(job.key, ctx);
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.contexts.lock().unwrap().remove(key);
        Ok(())
    }

    async fn notify(&self, key: &str, payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        let ctx = self.contexts.lock().unwrap()[key].clone();
        ctx.save_state(&payload).await.unwrap();
        ctx.emit(&payload).await.unwrap();
        if payload == b"complete" {
            ctx.complete().await.unwrap();
        }
        self.wrote.notify_one();
        self.gate.acquire().await.unwrap().forget();
        Ok(())
    }
}

/// What Redis holds of a job: its saved state, the payloads it emitted,
/// and whether it is listed.
type Held = (Option<Vec<u8>>, Vec<Vec<u8>>, bool);

/// What Redis holds of job `key` of pool `pool`.
async fn held(pool: &str, key: &str) -> Held {
    let mut conn = pulse_testkit::connect(pulse_testkit::shared_redis_url()).await;
    let state: Option<Vec<u8>> = redis::cmd("HGET")
        .arg(format!("pulse:{{{pool}}}:job:{key}"))
        .arg("state")
        .query_async(&mut conn)
        .await
        .unwrap();
    let emitted = crate::emitted_by(pool, key).await;
    let listed: bool = redis::cmd("HEXISTS")
        .arg(format!("pulse:{{{pool}}}:jobs"))
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    (state, emitted, listed)
}

/// Waits until `check` holds of what Redis holds of job `key`.
async fn wait_held(pool: &str, key: &str, check: impl Fn(&Held) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = held(pool, key).await;
        if check(&now) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "job {key} holds {now:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_call_s_state_events_and_completion_land_with_its_answer_and_not_before() {
    let pool = unique("call_writes");
    let node = pulse_pool::Node::join(&crate::client(), &pool, crate::options()).await.unwrap();
    let writer = Writer::default();
    node.add_worker(writer.clone()).await.unwrap();
    node.dispatch("w", b"").await.unwrap();
    let node = Arc::new(node);

    // A call that saved, emitted and still runs: nothing of it is in Redis,
    // though another job's call is answered meanwhile.
    let notified = tokio::spawn({
        let node = node.clone();
        async move { node.notify("w", b"one").await.unwrap() }
    });
    writer.wrote.notified().await;
    node.dispatch("other", b"").await.unwrap();
    assert_eq!(held(&pool, "w").await, (None, vec![], true), "written before the call ended");

    // Its end writes both, with its answer.
    writer.gate.add_permits(1);
    assert_eq!(notified.await.unwrap(), EventOutcome::Done);
    assert_eq!(held(&pool, "w").await, (Some(b"one".to_vec()), vec![b"one".to_vec()], true));

    // A completion waits for the call's end too.
    let notified = tokio::spawn({
        let node = node.clone();
        async move { node.notify("w", b"complete").await.unwrap() }
    });
    writer.wrote.notified().await;
    assert_eq!(held(&pool, "w").await, (Some(b"one".to_vec()), vec![b"one".to_vec()], true));
    writer.gate.add_permits(1);
    assert_eq!(notified.await.unwrap(), EventOutcome::Done);
    assert_eq!(held(&pool, "w").await, (None, vec![b"one".to_vec(), b"complete".to_vec()], false));

    // Outside the worker's calls (a timer's call of the job's code), a
    // scope holds the writes until it is dropped.
    node.dispatch("t", b"").await.unwrap();
    let ctx = writer.contexts.lock().unwrap()["t"].clone();
    let scope = ctx.call_scope();
    ctx.save_state(b"7").await.unwrap();
    ctx.emit(b"7").await.unwrap();
    node.dispatch("another", b"").await.unwrap();
    assert_eq!(held(&pool, "t").await, (None, vec![], true), "written before the scope ended");
    drop(scope);
    wait_held(&pool, "t", |now| now.0.is_some() || !now.1.is_empty()).await;
    assert_eq!(held(&pool, "t").await, (Some(b"7".to_vec()), vec![b"7".to_vec()], true));

    // Outside any call, a state is written at once, as before.
    ctx.save_state(b"8").await.unwrap();
    assert_eq!(held(&pool, "t").await.0, Some(b"8".to_vec()));

    let node = Arc::into_inner(node).unwrap();
    finish(&pool, &[&node]).await;
}
