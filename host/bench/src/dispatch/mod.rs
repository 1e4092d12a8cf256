//! The `dispatch` scenario: confirmed starts per second and their latency.
//!
//! A client-only node in this process dispatches; 4 workers run in another
//! process (`processes`), so dispatch and work do not share a runtime.
//! The handlers:
//!
//! - `noop`: a handler that does nothing (this program, re-run as
//!   `serve-workers`): the figures are the pool's own cost.
//! - `echo-job`: the `echo` plugin in job isolation (an instance per job),
//!   run by the host's own code (`pulse_host::run`, this program re-run as
//!   `serve-host` with a generated config). Its jobs are stopped after
//!   each line, and it runs one at a time twice: into slots of the
//!   instance pool never used, then into those the first line left
//!   (`slots_used_before`).
//! - `echo-worker`: the same in worker isolation (an instance per worker).
//! - `echo-http`: `echo-worker` again, but every dispatch is a `POST` to the
//!   host's HTTP API (a keep-alive HTTP/1.1 connection per dispatcher,
//!   hyper's client connection with no pool around it, so that the client
//!   takes little of the cores it shares with the host): the API's cost
//!   on top of the pool's, and the metrics recorder's, which that host
//!   installs.
//! - `echo-http2`: the same over HTTP/2 in clear (prior knowledge), every
//!   dispatcher's requests streams of one shared connection, as a
//!   multiplexing client sends them.
//! - `slow`: the `slow` plugin in job isolation with
//!   `max_concurrent_calls = 32`, each start waiting 50 ms (a WASI sleep),
//!   with 32 and 128 dispatchers: how far a worker's
//!   concurrent calls go (at most 128 / 50 ms = 2,560/s; one call at a
//!   time per worker would be 4 / 50 ms = 80/s).
//! - `slow-serial`: the same with `max_concurrent_calls = 1`, 128
//!   dispatchers: one call at a time per worker, for comparison.
//! - `batch`: the `noop` workers, the jobs sent in batches of 1,000
//!   through the pool's `dispatch_batch`, with 1 and 4 batches in flight
//!   (`dispatchers` counts batches).
//! - `batch-http`: `echo-worker` behind the HTTP API, the jobs sent in
//!   batches of 1,000 by `POST /api/pools/{pool}/batch`.
//!
//! `pulse-bench dispatch [HANDLER…]` runs the named ones (default: all but
//! `slow-serial`; `batch` names both batch lines). Job counts: 20,000 for
//! `noop`, `echo-worker`, `echo-http`, `echo-http2` and the batches, 5,000 for
//! `echo-job` (each live job holds an instance),
//! 2,000 for `slow`, 400 for `slow-serial`; `--jobs N` sets all of them.

mod batch;
mod commandstats;
mod processes;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{Node, NodeOptions};

use crate::Args;
use crate::report::{self, percentile};
use commandstats::{Servers, Spent};
use processes::spawn_noop_workers;
pub(crate) use processes::{Dispatcher, Lane, free_address, spawn_host, wait_for_workers};
pub use processes::{SERVE_HOST, SERVE_WORKERS, serve_host, serve_workers};
pub(crate) use processes::{end_processes, spawn_serve_host};

pub(crate) const WORKERS: usize = 4;
pub(crate) const PAYLOAD: [u8; 100] = [7; 100];
/// What `slow`'s start waits, in milliseconds.
const SLOW_PAYLOAD: &[u8] = b"50";
/// How long the worker process may take to have its workers joined.
pub(crate) const STARTUP: Duration = Duration::from_secs(60);

type BenchResult = Result<(), Box<dyn std::error::Error>>;

/// What runs the jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handler {
    NoOp,
    EchoJob,
    EchoWorker,
    EchoHttp,
    EchoHttp2,
    Slow,
    SlowSerial,
    Batch,
    BatchHttp,
}

impl Handler {
    const ALL: [Self; 9] = [
        Self::NoOp,
        Self::EchoJob,
        Self::EchoWorker,
        Self::EchoHttp,
        Self::EchoHttp2,
        Self::Slow,
        Self::SlowSerial,
        Self::Batch,
        Self::BatchHttp,
    ];
    /// Run when none is named.
    const DEFAULT: [Self; 8] = [
        Self::NoOp,
        Self::EchoJob,
        Self::EchoWorker,
        Self::EchoHttp,
        Self::EchoHttp2,
        Self::Slow,
        Self::Batch,
        Self::BatchHttp,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::NoOp => "noop",
            Self::EchoJob => "echo-job",
            Self::EchoWorker => "echo-worker",
            Self::EchoHttp => "echo-http",
            Self::EchoHttp2 => "echo-http2",
            Self::Slow => "slow",
            Self::SlowSerial => "slow-serial",
            Self::Batch => "batch-pool",
            Self::BatchHttp => "batch-http",
        }
    }

    /// Concurrent dispatchers of each measured line.
    fn dispatchers(self) -> &'static [usize] {
        match self {
            Self::Slow => &[32, 128],
            Self::SlowSerial => &[128],
            Self::Batch | Self::BatchHttp => &[1, 4],
            // One at a time twice: into slots of the instance pool no
            // instance used yet, then into those the first line's stopped
            // jobs left (see `Line::slots_used`).
            Self::EchoJob => &[1, 1, 32],
            _ => &[1, 32],
        }
    }

    fn payload(self) -> &'static [u8] {
        match self {
            Self::Slow | Self::SlowSerial => SLOW_PAYLOAD,
            _ => &PAYLOAD,
        }
    }

    /// Whether each live job holds an instance (job isolation): its jobs
    /// are stopped after each line.
    fn instance_per_job(self) -> bool {
        matches!(self, Self::EchoJob | Self::Slow | Self::SlowSerial)
    }

    fn default_jobs(self, quick: bool) -> usize {
        match (self, quick) {
            (Self::EchoJob, false) => 5_000,
            (Self::EchoJob, true) => 500,
            (Self::Slow, false) => 2_000,
            (Self::Slow, true) => 500,
            (Self::SlowSerial, _) => 400,
            (_, false) => 20_000,
            (_, true) => 2_000,
        }
    }
}

pub fn run(args: &Args) -> BenchResult {
    let handlers: Vec<Handler> = match &args.rest[1..] {
        [] => Handler::DEFAULT.to_vec(),
        names => names
            .iter()
            .map(|name| match name.as_str() {
                "batch" => Ok(vec![Handler::Batch, Handler::BatchHttp]),
                name => Handler::ALL.into_iter().find(|h| h.name() == name).map(|h| vec![h]).ok_or_else(|| {
                    format!(
                        "unknown handler {name:?}: the handlers are noop, echo-job, echo-worker, echo-http, echo-http2, slow, slow-serial, batch-pool and batch-http (batch: both)"
                    )
                }),
            })
            .collect::<Result<Vec<_>, _>>()?
            .concat(),
    };
    let deployments = Deployment::all(args)?;
    if deployments.iter().any(|d| d.groups > 1)
        && let Some(handler) = handlers.iter().find(|h| !matches!(h, Handler::NoOp | Handler::Batch))
    {
        return Err(format!(
            "{} runs a host from a generated config: with --groups, only noop and batch-pool run",
            handler.name()
        )
        .into());
    }
    let confirm = args.confirm_replicas.unwrap_or(0);
    let config_dir = tempfile::tempdir()?;
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for handler in handlers {
        for deployment in &deployments {
            run_handler(&tokio, deployment, handler, args, confirm, config_dir.path())?;
        }
    }
    Ok(())
}

/// A Redis the scenario runs on, up while it runs: a private server, one
/// with a replica (to confirm dispatches on), the one `--redis` names (a
/// cluster read at each seed), or a private cluster (of three masters
/// unless `--masters` says).
struct Deployment {
    /// `single` or `cluster`: the `layout` field of its lines.
    layout: &'static str,
    url: String,
    /// The servers whose figures a line reads: the server, or each master.
    servers: Vec<String>,
    /// The pools' slot groups.
    groups: u32,
    _processes: (Option<pulse_testkit::RedisServer>, Option<pulse_testkit::RedisServer>),
    _cluster: Option<pulse_testkit::RedisCluster>,
}

impl Deployment {
    /// What `--redis` and `--confirm-replicas` ask for. `--redis cluster`
    /// is two: a private single server (one slot group), then a private
    /// cluster of 3 masters (`--groups`, default 16), so one run compares
    /// them.
    fn all(args: &Args) -> Result<Vec<Self>, Box<dyn std::error::Error>> {
        let single = |server: pulse_testkit::RedisServer, replica| Self {
            layout: "single",
            url: server.url().to_owned(),
            servers: vec![server.url().to_owned()],
            groups: 1,
            _processes: (Some(server), replica),
            _cluster: None,
        };
        Ok(match (args.redis.as_deref(), args.confirm_replicas) {
            (Some("cluster"), _) => {
                let mut cluster = pulse_testkit::RedisCluster::start(args.masters.unwrap_or(3), 0);
                let masters =
                    cluster.nodes().iter().map(|node| format!("redis://127.0.0.1:{}", node.port())).collect();
                let grouped = Self {
                    layout: "cluster",
                    url: cluster.url(),
                    servers: masters,
                    groups: args.groups.unwrap_or(16),
                    _processes: (None, None),
                    _cluster: Some(cluster),
                };
                vec![single(pulse_testkit::RedisServer::start_tcp_with(&[]), None), grouped]
            }
            (Some(url), _) => {
                // A cluster's figures are read from each master it names.
                let seeds = pulse_redis::cluster_seeds(url)?;
                vec![Self {
                    layout: if seeds.is_some() { "cluster" } else { "single" },
                    url: url.to_owned(),
                    servers: seeds.unwrap_or_else(|| vec![url.to_owned()]),
                    groups: args.groups.unwrap_or(1),
                    _processes: (None, None),
                    _cluster: None,
                }]
            }
            (None, None) => vec![single(pulse_testkit::RedisServer::start(), None)],
            // With confirmations, a primary on TCP with a replica in sync.
            (None, Some(_)) => {
                let primary = pulse_testkit::RedisServer::start_tcp_with(&[]);
                let replica = pulse_testkit::start_replica(&primary);
                vec![single(primary, Some(replica))]
            }
        })
    }
}

/// Where a line runs and what it was told: the fields every `dispatch`
/// line starts with.
pub(crate) struct Line {
    layout: &'static str,
    groups: u32,
    workers: usize,
    /// Jobs the pool runs already.
    running: usize,
    confirm: u32,
    /// Instances the host made and dropped before this line (an instance
    /// per job): a line of no more jobs than that takes slots of the
    /// instance pool used before, whose page tables and memory image are
    /// in place; the first line's starts each take a slot never used.
    slots_used: usize,
}

impl Line {
    pub(crate) fn fields(&self, result: report::Result) -> report::Result {
        result
            .field("layout", self.layout)
            .field("slot_groups", self.groups)
            .field("workers", self.workers)
            .field("running_before", self.running)
            .field("confirm_replicas", self.confirm)
            .field("slots_used_before", self.slots_used)
    }
}

/// The lines of `handler` on `deployment`.
fn run_handler(
    tokio: &tokio::runtime::Runtime,
    deployment: &Deployment,
    handler: Handler,
    args: &Args,
    confirm: u32,
    config_dir: &std::path::Path,
) -> BenchResult {
    let url = &deployment.url;
    let jobs = args.jobs.unwrap_or(handler.default_jobs(args.quick));
    // `--workers` sets the no-op workers; a host runs the config's.
    let workers_count = match handler {
        Handler::NoOp | Handler::Batch => args.workers.unwrap_or(WORKERS),
        _ => WORKERS,
    };
    let pool = format!("bench-{}", handler.name());
    let api = matches!(handler, Handler::EchoHttp | Handler::EchoHttp2 | Handler::BatchHttp)
        .then(free_address)
        .transpose()?;
    let mut workers = match handler {
        Handler::NoOp | Handler::Batch => spawn_noop_workers(url, &pool, deployment.groups, workers_count)?,
        _ => spawn_host(url, &pool, handler, jobs, api, config_dir)?,
    };
    let result = tokio.block_on(async {
        let client = pulse_redis::Redis::open(url.as_str())?;
        let options = NodeOptions {
            confirm_replicas: confirm,
            slot_groups: deployment.groups,
            ..NodeOptions::default()
        };
        let node = Arc::new(Node::client(&client, &pool, options).await?);
        wait_for_workers(&node, workers_count, std::slice::from_mut(&mut workers)).await?;
        let dispatcher = match api {
            Some(address) => Dispatcher::http(address, &pool, handler == Handler::EchoHttp2).await?,
            None => Dispatcher::Node(node.clone()),
        };
        let mut servers = Servers::open(&deployment.servers, workers.id()).await?;
        let mut line = Line {
            layout: deployment.layout,
            groups: deployment.groups,
            workers: workers_count,
            running: 0,
            confirm,
            slots_used: 0,
        };
        let asked = args.dispatchers.map(|n| vec![n]);
        for &concurrency in asked.as_deref().unwrap_or(handler.dispatchers()) {
            let keys = match handler {
                Handler::Batch | Handler::BatchHttp => {
                    batch::measure(&dispatcher, &mut servers, handler, concurrency, jobs, &line).await?
                }
                _ => measure(&dispatcher, &mut servers, handler, concurrency, jobs, &line).await?,
            };
            if handler.instance_per_job() {
                // Each live job holds an instance: stop them, so the
                // host's instance count stays at one run's jobs.
                stop_all(&node, keys).await?;
                line.slots_used += jobs;
            } else {
                line.running += jobs;
            }
        }
        if !matches!(handler, Handler::NoOp | Handler::Batch) {
            // The host exits once its pool is shut down.
            node.shutdown(Duration::from_secs(120)).await?;
        }
        node.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    // Closing its stdin ends the no-op worker process.
    drop(workers.stdin.take());
    if result.is_err() {
        let _ = workers.kill();
    }
    let status = workers.wait()?;
    result?;
    if !status.success() {
        return Err(format!("the {} worker process failed: {status}", handler.name()).into());
    }
    Ok(())
}

/// Stops `keys`, 32 at a time.
async fn stop_all(node: &Arc<Node>, keys: Vec<String>) -> BenchResult {
    let mut lanes = Vec::new();
    for lane in 0..32 {
        let node = node.clone();
        let keys: Vec<String> = keys.iter().skip(lane).step_by(32).cloned().collect();
        lanes.push(tokio::spawn(async move {
            for key in keys {
                node.stop(&key).await?;
            }
            Ok::<_, pulse_pool::Error>(())
        }));
    }
    for lane in lanes {
        lane.await??;
    }
    Ok(())
}

/// Dispatches `jobs` new jobs from `concurrency` lanes and prints the
/// figures; returns their keys.
async fn measure(
    dispatcher: &Dispatcher,
    servers: &mut Servers,
    handler: Handler,
    concurrency: usize,
    jobs: usize,
    line: &Line,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let before = servers.read().await?;
    let started = Instant::now();
    let mut lanes = Vec::new();
    for lane in 0..concurrency {
        let mut dispatcher = dispatcher.lane().await?;
        lanes.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut unconfirmed = 0u64;
            for i in (lane..jobs).step_by(concurrency) {
                let key = key_of(concurrency, i);
                let sent = Instant::now();
                let started = dispatcher.started(&key, handler.payload()).await;
                samples.push((i, sent.elapsed()));
                if !started {
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
    let spent = Spent::new(before, servers.read().await?);
    samples.sort_by_key(|(i, _)| *i);
    let tenth = (jobs / 10).max(1);
    let keys = samples.iter().map(|(i, _)| key_of(concurrency, *i)).collect();
    let mut first: Vec<Duration> = samples[..tenth].iter().map(|(_, d)| *d).collect();
    let mut last: Vec<Duration> = samples[jobs - tenth..].iter().map(|(_, d)| *d).collect();
    let mut all: Vec<Duration> = samples.into_iter().map(|(_, d)| d).collect();
    let result = line
        .fields(report::Result::new("dispatch").field("handler", handler.name()))
        .field("dispatchers", concurrency)
        .field("jobs", jobs)
        .field("rate_per_s", format!("{:.0}", jobs as f64 / elapsed.as_secs_f64()))
        .millis("p50_ms", percentile(&mut all, 50.0))
        .millis("p90_ms", percentile(&mut all, 90.0))
        .millis("p99_ms", percentile(&mut all, 99.0))
        .millis("max_ms", percentile(&mut all, 100.0))
        .millis("first10_p50_ms", percentile(&mut first, 50.0))
        .millis("last10_p50_ms", percentile(&mut last, 50.0));
    spent.fields(result, jobs).field("unconfirmed", unconfirmed).print();
    spent.after.print_by_command(&spent.before, handler.name(), concurrency, jobs);
    Ok(keys)
}

pub(super) fn key_of(concurrency: usize, i: usize) -> String {
    format!("c{concurrency}-{i}")
}
