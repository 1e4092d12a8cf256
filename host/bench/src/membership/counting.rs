//! The counting handler of the membership scenarios and the worker
//! processes that run it: each start and stop counted per key in Redis.

use std::collections::HashMap;
use std::process::Child;
use std::time::Duration;

use pulse_pool::{HandlerError, Job, JobContext, JobHandler, Node, NodeOptions};

use super::{BenchResult, LEASE_TTL, SERVE_COUNTING};
use crate::Args;

/// Counts live runs per key in `pulse-bench:{pool}:runs:<pid>`, starts per
/// key in `pulse-bench:{pool}:starts:<pid>` and all starts in
/// `pulse-bench:{pool}:starts`; records when each key last started (Unix
/// ms) in `pulse-bench:{pool}:started:<pid>`.
#[derive(Clone)]
pub(super) struct Counting {
    conn: pulse_redis::Shared,
    runs: String,
    starts: String,
    starts_per_key: String,
    started_at: String,
}

impl Counting {
    pub(super) async fn new(client: &pulse_redis::Redis, pool: &str) -> BenchResult<Self> {
        let conn = client.shared().await?;
        let pid = std::process::id();
        Ok(Self {
            conn,
            runs: runs_key(pool, pid),
            starts: starts_key(pool),
            starts_per_key: starts_per_key(pool, pid),
            started_at: started_key(pool, pid),
        })
    }

    async fn count(&self, key: &str, delta: i64) -> Result<(), HandlerError> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.hincr(&self.runs, key, delta).ignore();
        if delta > 0 {
            pipe.incr(&self.starts, 1).ignore();
            pipe.hincr(&self.starts_per_key, key, 1).ignore();
            pipe.hset(&self.started_at, key, unix_ms()).ignore();
        }
        pipe.query_async::<()>(&mut conn).await.map_err(|error| HandlerError::Retryable(error.to_string()))
    }
}

pub(super) fn runs_key(pool: &str, pid: u32) -> String {
    format!("pulse-bench:{{{pool}}}:runs:{pid}")
}

pub(super) fn starts_key(pool: &str) -> String {
    format!("pulse-bench:{{{pool}}}:starts")
}

pub(super) fn starts_per_key(pool: &str, pid: u32) -> String {
    format!("pulse-bench:{{{pool}}}:starts:{pid}")
}

pub(super) fn started_key(pool: &str, pid: u32) -> String {
    format!("pulse-bench:{{{pool}}}:started:{pid}")
}

/// This machine's wall clock in Unix milliseconds: the handlers and the
/// scenario run on one machine.
pub(super) fn unix_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(now.as_millis()).unwrap_or(u64::MAX)
}

impl JobHandler for Counting {
    async fn start(&self, job: Job, _ctx: JobContext) -> Result<(), HandlerError> {
        self.count(&job.key, 1).await
    }
    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.count(key, -1).await
    }
    async fn notify(&self, _key: &str, _payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn abandon(&self, key: &str) {
        let _ = self.count(key, -1).await;
    }
}

/// Live runs per key in process `pid`.
pub(super) async fn runs(
    conn: &mut pulse_redis::Shared,
    pool: &str,
    pid: u32,
) -> BenchResult<HashMap<String, i64>> {
    Ok(redis::cmd("HGETALL").arg(runs_key(pool, pid)).query_async(conn).await?)
}

pub(super) fn options() -> NodeOptions {
    NodeOptions { lease_ttl: LEASE_TTL, reply_timeout: Duration::from_secs(30), ..NodeOptions::default() }
}

/// A process of counting workers (this program as `serve-counting`).
pub(super) struct Process(pub(super) Child);

impl Process {
    pub(super) fn spawn(url: &str, pool: &str, workers: usize) -> BenchResult<Self> {
        let workers = workers.to_string();
        Ok(Self(crate::process::spawn_ready(&[
            SERVE_COUNTING,
            "--redis",
            url,
            "--pool",
            pool,
            "--workers",
            &workers,
        ])?))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// The worker process: counting workers until its stdin closes.
pub fn serve_counting(args: &Args) -> BenchResult {
    let url = args.redis.clone().ok_or("serve-counting needs --redis")?;
    let pool = args.pool.clone().ok_or("serve-counting needs --pool")?;
    let workers = args.workers.ok_or("serve-counting needs --workers")?;
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let client = pulse_redis::Redis::open(url.as_str())?;
        let node = Node::join(&client, &pool, options()).await?;
        let handler = Counting::new(&client, &pool).await?;
        for _ in 0..workers {
            node.add_worker(handler.clone()).await?;
        }
        println!("ready");
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        })
        .await?;
        node.close().await;
        Ok(())
    })
}

/// Starts per key in process `pid`.
pub(super) async fn starts_of(
    conn: &mut pulse_redis::Shared,
    pool: &str,
    pid: u32,
) -> BenchResult<HashMap<String, i64>> {
    Ok(redis::cmd("HGETALL").arg(starts_per_key(pool, pid)).query_async(conn).await?)
}

/// Starts so far, in every process of the pool.
pub(super) async fn starts(conn: &mut pulse_redis::Shared, pool: &str) -> BenchResult<usize> {
    let starts: Option<usize> = redis::cmd("GET").arg(starts_key(pool)).query_async(conn).await?;
    Ok(starts.unwrap_or(0))
}
