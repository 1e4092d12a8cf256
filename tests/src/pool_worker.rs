//! `pool-worker`: a process hosting workers of a pool whose handler writes
//! every call to a journal in Redis, for tests that kill, freeze and
//! restart processes.
//!
//! Usage: `pool-worker <redis-url> <pool> <workers> <lease-ttl-ms>`.
//! Prints `ready <node id>` once its workers hold their slots; closes the
//! node (handing its jobs back) when its standard input ends.
//!
//! Journal entries (list `pulse-test:{pool}:journal`), one per call:
//! `kind|key|token|worker|pid|detail|#n` (n numbers the process's entries:
//! a write retried after a timeout may appear twice) where kind is `start` (detail:
//! `requeued`), `stop`, `notify` (detail: `seq:payload`), `drop` (the
//! worker lost its lease and dropped the job without calling it) or
//! `refused` (detail: the refusal).
//!
//! With `PULSE_TEST_SAVE_MS` set, each job, like a long-running one, saves
//! its state that often from a task of its own, outside handler calls, as
//! long as its context says it is live; a save refused as not owned (the
//! job moved although its context said live) is journalled as `refused`
//! and ends the task.
//!
//! `PULSE_TEST_JOURNAL`, when set, is the URL of another Redis for the
//! journal (for tests that empty the pool's Redis).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pulse_pool::{HandlerError, Job, JobContext, JobHandler, Node, NodeOptions, WorkerOptions};
use tokio::io::AsyncReadExt as _;

#[derive(Clone)]
struct Journal {
    conn: pulse_redis::Shared,
    key: String,
    /// The token and worker of each job its worker runs.
    runs: Arc<Mutex<HashMap<String, (String, String)>>>,
    /// Entries written so far.
    written: Arc<std::sync::atomic::AtomicU64>,
    /// The saving task of each job its worker runs.
    savers: Arc<Mutex<HashMap<String, tokio::task::JoinHandle<()>>>>,
    /// How often a job saves its state (`PULSE_TEST_SAVE_MS`).
    save_every: Option<Duration>,
}

impl Journal {
    async fn write(&self, kind: &str, key: &str, detail: &str) {
        let (token, worker) = self.runs.lock().expect("not poisoned").get(key).cloned().unwrap_or_default();
        self.write_as(kind, key, &token, &worker, detail).await;
    }

    async fn write_as(&self, kind: &str, key: &str, token: &str, worker: &str, detail: &str) {
        // A number unique in the process: a write retried after a timeout
        // (it may have gone through) is recognisable as the same entry.
        let n = self.written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let entry = format!("{kind}|{key}|{token}|{worker}|{}|{detail}|#{n}", std::process::id());
        // The journal is the tests' evidence: an entry is never dropped
        // (a write can time out right after the process was frozen).
        let mut conn = self.conn.clone();
        loop {
            let written: redis::RedisResult<()> =
                redis::cmd("RPUSH").arg(&self.key).arg(&entry).query_async(&mut conn).await;
            match written {
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(error = %error, "failed to write the journal; trying again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

impl JobHandler for Journal {
    async fn start(&self, job: Job, ctx: JobContext) -> Result<(), HandlerError> {
        self.runs
            .lock()
            .expect("not poisoned")
            .insert(job.key.clone(), (ctx.token().to_owned(), ctx.worker().to_owned()));
        self.write("start", &job.key, if job.requeued { "requeued" } else { "" }).await;
        if let Some(period) = self.save_every {
            let saver = tokio::spawn(save_periodically(self.clone(), ctx, period));
            if let Some(old) = self.savers.lock().expect("not poisoned").insert(job.key, saver) {
                old.abort();
            }
        }
        Ok(())
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.end_saver(key);
        self.write("stop", key, "").await;
        self.runs.lock().expect("not poisoned").remove(key);
        Ok(())
    }

    async fn notify(&self, key: &str, payload: Vec<u8>, seq: u64) -> Result<(), HandlerError> {
        self.write("notify", key, &format!("{seq}:{}", String::from_utf8_lossy(&payload))).await;
        Ok(())
    }

    async fn abandon(&self, key: &str) {
        self.end_saver(key);
        self.write("drop", key, "").await;
        self.runs.lock().expect("not poisoned").remove(key);
    }
}

impl Journal {
    fn end_saver(&self, key: &str) {
        if let Some(saver) = self.savers.lock().expect("not poisoned").remove(key) {
            saver.abort();
        }
    }
}

/// A job's own work between handler calls: saves a count every `period`
/// while its context says it may run.
async fn save_periodically(journal: Journal, ctx: JobContext, period: Duration) {
    let mut count: u64 = 0;
    loop {
        tokio::time::sleep(period).await;
        if !ctx.is_live() {
            continue;
        }
        match ctx.save_state(count.to_string().as_bytes()).await {
            Ok(()) => count += 1,
            Err(pulse_pool::ContextError::Unavailable(_)) => {}
            // Refused after the context stopped being live: the process
            // stalled between the check and the request (a freeze), long
            // enough for its lease to end and the job to move; the fence
            // did its work.
            Err(pulse_pool::ContextError::NotOwned) if !ctx.is_live() => return,
            Err(error) => {
                journal.write_as("refused", ctx.key(), ctx.token(), ctx.worker(), &error.to_string()).await;
                return;
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(std::env::var("PULSE_TEST_LOG").unwrap_or_else(|_| "warn,pulse_pool=info".into()))
        .init();
    let args: Vec<String> = std::env::args().collect();
    let [_, url, pool, workers, ttl_ms] = args.as_slice() else {
        return Err("usage: pool-worker <redis-url> <pool> <workers> <lease-ttl-ms>".into());
    };
    let client = pulse_redis::Redis::open(url.as_str())?;
    let options = NodeOptions { lease_ttl: Duration::from_millis(ttl_ms.parse()?), ..NodeOptions::default() };
    let node = Node::join(&client, pool, options).await?;
    let journal_client = match std::env::var("PULSE_TEST_JOURNAL") {
        Ok(url) => pulse_redis::Redis::open(url.as_str())?,
        Err(_) => client.clone(),
    };
    let journal = Journal {
        conn: journal_client.shared().await?,
        key: format!("pulse-test:{{{pool}}}:journal"),
        runs: Arc::default(),
        written: Arc::default(),
        savers: Arc::default(),
        save_every: std::env::var("PULSE_TEST_SAVE_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map(Duration::from_millis),
    };
    // Calls of different jobs a worker makes at once: PULSE_TEST_CALLS, or
    // the pool's default.
    let worker_options = match std::env::var("PULSE_TEST_CALLS").ok().and_then(|n| n.parse().ok()) {
        Some(calls) => WorkerOptions { max_concurrent_calls: calls, ..WorkerOptions::default() },
        None => WorkerOptions::default(),
    };
    for _ in 0..workers.parse::<usize>()? {
        // A handler per worker, as the host has: each knows its own
        // worker's runs. A worker dropping a job it lost in a freeze may
        // do so after another worker of this process started the job
        // again; with one map of runs, the drop was journalled under the
        // new run's token, and its saver ended. The journal and its
        // numbering stay the process's.
        let handler = Journal { runs: Arc::default(), savers: Arc::default(), ..journal.clone() };
        node.add_worker_with(handler, worker_options.clone()).await?;
    }
    #[allow(clippy::print_stdout, reason = "the readiness line the test waits for")]
    {
        println!("ready {}", node.id());
    }
    let mut rest = Vec::new();
    tokio::io::stdin().read_to_end(&mut rest).await?;
    node.close().await;
    Ok(())
}
