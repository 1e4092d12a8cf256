//! A call's writes (its events, its saved state, its job's completion)
//! land in one step with the answer to the call, or not at all: nothing
//! of a call is in Redis while the call still runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pulse_pool::{EventOutcome, HandlerError, Job, JobContext, JobHandler};
use pulse_testkit::unique;
use tokio::sync::Semaphore;

use crate::{PATIENCE, finish};

/// On `notify`: saves the payload as its state, emits it, and completes
/// the job when the payload starts with `complete`; then says it wrote (a permit of
/// `written`) and waits until the test lets the call return.
#[derive(Clone)]
struct Writer {
    contexts: Arc<Mutex<HashMap<String, JobContext>>>,
    written: Arc<Semaphore>,
    gate: Arc<Semaphore>,
}

impl Default for Writer {
    fn default() -> Self {
        Self {
            contexts: Arc::default(),
            written: Arc::new(Semaphore::new(0)),
            gate: Arc::new(Semaphore::new(0)),
        }
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
        if payload.starts_with(b"complete") {
            ctx.complete().await.unwrap();
        }
        self.written.add_permits(1);
        self.gate.acquire().await.unwrap().forget();
        Ok(())
    }
}

/// What Redis holds of a job: its saved state, the payloads it emitted,
/// and whether it is listed.
type Held = (Option<Vec<u8>>, Vec<Vec<u8>>, bool);

/// What Redis holds of job `key` of pool `pool`.
async fn held(pool: &str, key: &str) -> Held {
    held_in(&mut pulse_testkit::connect(pulse_testkit::shared_redis_url()).await, pool, key).await
}

/// What the server behind `conn` holds of job `key` of pool `pool`.
async fn held_in(conn: &mut redis::aio::MultiplexedConnection, pool: &str, key: &str) -> Held {
    let state: Option<Vec<u8>> = redis::cmd("HGET")
        .arg(format!("pulse:{{{pool}}}:job:{key}"))
        .arg("state")
        .query_async(conn)
        .await
        .unwrap();
    let emitted = crate::stream_events(conn, &format!("pulse:{{{pool}}}:stream:events"))
        .await
        .into_iter()
        .filter(|event| event.topic.as_deref() == Some(key))
        .map(|event| event.payload)
        .collect();
    let listed: bool =
        redis::cmd("HEXISTS").arg(format!("pulse:{{{pool}}}:jobs")).arg(key).query_async(conn).await.unwrap();
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
    writer.written.acquire().await.unwrap().forget();
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
    writer.written.acquire().await.unwrap().forget();
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

/// A host's workers of one slot group flush together: the calls of three
/// workers that end at once are written by fewer `write.lua` calls than
/// workers (one each before), and each worker's items keep their own
/// fence, job set and inbox.
#[tokio::test]
async fn calls_of_several_workers_that_end_together_are_written_together() {
    let writes = written_together(0).await;
    assert!(
        (1..=2).contains(&writes),
        "{writes} write scripts for the calls of 3 workers that ended together"
    );
}

/// A flush of a host's workers takes their writes up to one worker's
/// bound of 4 MiB: three workers that wrote 3 MiB each (a state and an
/// event of 1.5 MiB) are written by a script each.
#[tokio::test]
async fn a_flush_of_several_workers_is_no_longer_than_one_worker_s_bound() {
    let writes = written_together(3 << 19).await;
    assert_eq!(writes, 3, "write scripts for the calls of 3 workers that wrote 3 MiB each");
}

/// Runs a call on each of three workers of a node, each saving a state
/// and emitting an event of its payload (its name and `padding` bytes),
/// the first completing its job; the three end at once. Checks what each
/// wrote, and returns how many `write.lua` calls wrote it.
async fn written_together(padding: usize) -> usize {
    // A private server: every command it logs is this test's.
    let server = pulse_testkit::RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let pool = "together";
    let options = pulse_pool::NodeOptions { max_payload: padding + (1 << 20), ..crate::options() };
    let node = pulse_pool::Node::join(&client, pool, options).await.unwrap();
    let writer = Writer::default();
    for _ in 0..3 {
        node.add_worker(writer.clone()).await.unwrap();
    }
    // One job on each worker.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let keys = loop {
        let mut keys: Vec<(String, String)> = Vec::new();
        for i in 0..200 {
            let key = format!("job-{i}");
            if let Some(worker) = node.owner(&key)
                && !keys.iter().any(|(_, known)| *known == worker)
            {
                keys.push((key, worker));
            }
        }
        if keys.len() == 3 {
            break keys;
        }
        assert!(tokio::time::Instant::now() < deadline, "the three workers never all held slots");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for (key, _) in &keys {
        node.dispatch(key, b"").await.unwrap();
    }
    let node = Arc::new(node);
    let mut conn = server.connect().await;
    // From here every command is logged, with its first arguments.
    for (name, value) in [("slowlog-log-slower-than", "0"), ("slowlog-max-len", "100000")] {
        let () = redis::cmd("CONFIG").arg("SET").arg(name).arg(value).query_async(&mut conn).await.unwrap();
    }
    let () = redis::cmd("SLOWLOG").arg("RESET").query_async(&mut conn).await.unwrap();

    // A call on each worker, all three held until each wrote; the first
    // completes its job. Then all three end at once.
    let payloads = ["complete", "two", "three"].map(|name| format!("{name}{}", "x".repeat(padding)));
    let notified: Vec<_> = keys
        .iter()
        .zip(payloads.clone())
        .map(|((key, _), payload)| {
            let (node, key) = (node.clone(), key.clone());
            tokio::spawn(async move { node.notify(&key, payload.as_bytes()).await.unwrap() })
        })
        .collect();
    writer.written.acquire_many(3).await.unwrap().forget();
    writer.gate.add_permits(3);
    for notified in notified {
        assert_eq!(notified.await.unwrap(), EventOutcome::Done);
    }

    // Each worker's writes landed under its own keys.
    for ((key, worker), payload) in keys.iter().zip(&payloads) {
        let (state, emitted, listed) = held_in(&mut conn, pool, key).await;
        assert!(emitted == [payload.as_bytes()], "{key}'s event");
        let in_job_set: bool = redis::cmd("SISMEMBER")
            .arg(format!("pulse:{{{pool}}}:worker:{worker}:jobs"))
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let inbox: u64 = redis::cmd("XLEN")
            .arg(format!("pulse:{{{pool}}}:stream:inbox.{worker}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if payload.starts_with("complete") {
            assert_eq!(
                (state, listed, in_job_set),
                (None, false, false),
                "{key} completed: gone from {worker}'s jobs"
            );
        } else {
            let saved = state.is_some_and(|state| state == payload.as_bytes());
            assert_eq!((saved, listed, in_job_set), (true, true, true), "{key} saved its state");
        }
        assert_eq!(inbox, 0, "{worker}'s processed entries are deleted");
    }

    // The `write.lua` calls: the only script whose second key is the
    // events stream.
    let log: Vec<redis::Value> =
        redis::cmd("SLOWLOG").arg("GET").arg(-1).query_async(&mut conn).await.unwrap();
    let events_key = format!("pulse:{{{pool}}}:stream:events");
    let writes = log
        .iter()
        .filter(|entry| {
            let redis::Value::Array(fields) = entry else { return false };
            let Some(redis::Value::Array(args)) = fields.get(3) else { return false };
            let arg = |at: usize| match args.get(at) {
                Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            };
            arg(0).eq_ignore_ascii_case("evalsha") && arg(4) == events_key
        })
        .count();
    let node = Arc::into_inner(node).unwrap();
    node.close().await;
    writes
}
