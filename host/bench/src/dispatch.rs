//! The `dispatch` scenario: confirmed starts per second and their latency.
//!
//! A client-only node in this process dispatches; a full node with 4
//! workers runs in another process (this program, re-run as
//! `serve-workers`), so dispatch and work do not share a runtime. The
//! handler does nothing: the figures are the pool's own cost.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{DispatchOutcome, HandlerError, Job, JobContext, JobHandler, Node, NodeOptions};

use crate::Args;
use crate::report::{self, percentile};

/// The hidden scenario name of the worker process.
pub const SERVE_WORKERS: &str = "serve-workers";
const POOL: &str = "bench";
const WORKERS: usize = 4;
const PAYLOAD: [u8; 100] = [7; 100];

type BenchResult = Result<(), Box<dyn std::error::Error>>;

/// A handler that accepts everything and does nothing.
struct NoOp;

impl JobHandler for NoOp {
    async fn start(&self, _job: Job, _ctx: JobContext) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn stop(&self, _key: &str) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn notify(&self, _key: &str, _payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        Ok(())
    }
}

pub fn run(args: &Args) -> BenchResult {
    let jobs = args.jobs.unwrap_or(if args.quick { 2_000 } else { 20_000 });
    let server = match &args.redis {
        Some(_) => None,
        None => Some(pulse_testkit::RedisServer::start()),
    };
    let url = args.redis.clone().or_else(|| server.as_ref().map(|s| s.url().to_owned())).ok_or("no Redis")?;
    let mut workers = Command::new(std::env::current_exe()?)
        .args([SERVE_WORKERS, "--redis", &url])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut ready = String::new();
    BufReader::new(workers.stdout.take().ok_or("no stdout")?).read_line(&mut ready)?;
    if ready.trim() != "ready" {
        return Err(format!("the worker process did not start: {ready:?}").into());
    }
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = tokio.block_on(async {
        let client = redis::Client::open(url.as_str())?;
        let node = Arc::new(Node::client(&client, POOL, NodeOptions::default()).await?);
        let mut stats = client.get_multiplexed_async_connection().await?;
        let mut running = 0;
        for concurrency in [1, 32] {
            measure(&node, &mut stats, concurrency, jobs, running).await?;
            running += jobs;
        }
        node.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    // Closing its stdin ends the worker process.
    drop(workers.stdin.take());
    workers.wait()?;
    result
}

async fn measure(
    node: &Arc<Node>,
    stats: &mut redis::aio::MultiplexedConnection,
    concurrency: usize,
    jobs: usize,
    running: usize,
) -> BenchResult {
    let before = commandstats(stats).await?;
    let started = Instant::now();
    let mut lanes = Vec::new();
    for lane in 0..concurrency {
        let node = node.clone();
        lanes.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut unconfirmed = 0u64;
            for i in (lane..jobs).step_by(concurrency) {
                let key = format!("c{concurrency}-{i}");
                let sent = Instant::now();
                let outcome = node.dispatch(&key, &PAYLOAD).await;
                samples.push((i, sent.elapsed()));
                if !matches!(outcome, Ok(DispatchOutcome::Started)) {
                    unconfirmed += 1;
                }
            }
            (samples, unconfirmed)
        }));
    }
    let mut samples = Vec::with_capacity(jobs);
    let mut unconfirmed = 0;
    for lane in lanes {
        let (lane_samples, lane_unconfirmed) = lane.await?;
        samples.extend(lane_samples);
        unconfirmed += lane_unconfirmed;
    }
    let elapsed = started.elapsed();
    let after = commandstats(stats).await?;
    samples.sort_by_key(|(i, _)| *i);
    let tenth = (jobs / 10).max(1);
    let mut first: Vec<Duration> = samples[..tenth].iter().map(|(_, d)| *d).collect();
    let mut last: Vec<Duration> = samples[jobs - tenth..].iter().map(|(_, d)| *d).collect();
    let mut all: Vec<Duration> = samples.into_iter().map(|(_, d)| d).collect();
    let per_job = |value: u64| value as f64 / jobs as f64;
    report::Result::new("dispatch")
        .field("handler", "noop")
        .field("dispatchers", concurrency)
        .field("workers", WORKERS)
        .field("jobs", jobs)
        .field("running_before", running)
        .field("rate_per_s", format!("{:.0}", jobs as f64 / elapsed.as_secs_f64()))
        .millis("p50_ms", percentile(&mut all, 50.0))
        .millis("p90_ms", percentile(&mut all, 90.0))
        .millis("p99_ms", percentile(&mut all, 99.0))
        .millis("max_ms", percentile(&mut all, 100.0))
        .millis("first10_p50_ms", percentile(&mut first, 50.0))
        .millis("last10_p50_ms", percentile(&mut last, 50.0))
        .field("cmds_per_job", format!("{:.2}", per_job(after.0 - before.0)))
        .field("redis_cpu_us_per_job", format!("{:.1}", per_job(after.1 - before.1)))
        .field("unconfirmed", unconfirmed)
        .print();
    Ok(())
}

/// (executed commands, their CPU µs) so far, from `INFO commandstats`
/// (Lua-internal calls included).
async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<(u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    let field = |line: &str, name: &str| -> u64 {
        line.split(name).nth(1).and_then(|rest| rest.split(',').next()?.parse().ok()).unwrap_or(0)
    };
    Ok(info
        .lines()
        .filter(|line| line.starts_with("cmdstat_"))
        .fold((0, 0), |(calls, usec), line| (calls + field(line, "calls="), usec + field(line, "usec="))))
}

/// The worker process: a full node with 4 no-op workers, until its stdin
/// closes.
pub fn serve_workers(args: &Args) -> BenchResult {
    let url = args.redis.clone().ok_or("serve-workers needs --redis")?;
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let client = redis::Client::open(url.as_str())?;
        let node = Node::join(&client, POOL, NodeOptions::default()).await?;
        for _ in 0..WORKERS {
            node.add_worker(NoOp).await?;
        }
        println!("ready");
        // Blocks until the parent closes our stdin (or dies).
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await?;
        Ok(())
    })
}
