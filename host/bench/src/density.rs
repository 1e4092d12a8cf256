//! The `density` scenario: how many live jobs one host holds, and what
//! they cost it.
//!
//! One host process (`pulse_host::run`, this program re-run as
//! `serve-host`) serves a pool of `counter` with 4 workers; 100,000 jobs
//! (`--jobs N`) are dispatched in batches of 1,000, and each ticks every
//! 10 s (10,000 timer calls per second in all, each saving its count and
//! emitting it). Once every job has ticked, the scenario reads, over a
//! measured window:
//!
//! - the host's resident memory per live job (`rss_per_job_kib`: RSS with
//!   the jobs less RSS with none, over the jobs), and the part of it that
//!   is the host's own (`rss_anon_per_job_kib`: `RssAnon`, without the
//!   plugin's initial memory image, mapped copy-on-write into every
//!   instance: `VmRSS` counts its pages once per instance that read them,
//!   the machine holds them once);
//! - timer calls per second and how late they began (the host's
//!   `pulse_plugin_timer_lateness_seconds`: mean and the bucket holding
//!   the 99th percentile);
//! - notifications (`notify`, the count reset to 0) sent one at a time by
//!   4 senders, each timed until the handler's answer came back: p50, p99.
//!
//! Then a second host joins with the same configuration: the time until it
//! holds its share of the jobs, every job running (`join_ms`), how many
//! moved and how many moves that took (`moves_per_moved_job`, target 1),
//! and the second host's resident memory.
//!
//! Lines: `job` isolation (an instance per job) and `worker` isolation (one
//! per worker); `density job` or `density worker` runs one. In job
//! isolation each instance reserves `memory_reservation` of address space
//! and takes about 5 memory mappings: 100,000 need `vm.max_map_count` of
//! at least about 510,000 (`sysctl -w vm.max_map_count=1048576`); the
//! host refuses to start otherwise, naming the setting.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{DispatchOutcome, EventOutcome, Node, NodeOptions};

use crate::Args;
use crate::dispatch::{end_processes, free_address, spawn_serve_host, wait_for_workers};
use crate::report::{self, percentile};
use crate::rollout::moved_jobs;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const POOL: &str = "bench-density";
const WORKERS: usize = 4;
/// Each job's timer.
const INTERVAL: Duration = Duration::from_secs(10);
/// Jobs per dispatched batch, and batches in flight.
const BATCH: usize = 1_000;
const LANES: usize = 4;
/// The memory each instance may have and reserves: in worker isolation
/// one instance holds a quarter of the jobs' counts.
const MEMORY: &str = "32MiB";
/// Notifications sent one at a time, by so many senders.
const NOTIFY_SENDERS: usize = 4;
/// How long the scenario waits for the jobs, or for a joining host.
const PATIENCE: Duration = Duration::from_secs(600);
/// The hosts' timer histogram.
const LATENESS: &str = "pulse_plugin_timer_lateness_seconds";

pub fn run(args: &Args) -> BenchResult {
    let jobs = args.jobs.unwrap_or(if args.quick { 1_000 } else { 100_000 });
    let named: Vec<&str> = args.rest[1..].iter().map(String::as_str).collect();
    let isolations = if named.is_empty() { vec!["job", "worker"] } else { named };
    for isolation in isolations {
        if !matches!(isolation, "job" | "worker") {
            return Err(format!("density takes `job` or `worker`, got {isolation:?}").into());
        }
        line(jobs, isolation)?;
    }
    Ok(())
}

/// One isolation's line, on a Redis and hosts of its own.
fn line(jobs: usize, isolation: &str) -> BenchResult {
    let redis = pulse_testkit::RedisServer::start();
    let dir = tempfile::tempdir()?;
    let apis = [free_address()?, free_address()?];
    let configs =
        [config(dir.path(), apis[0], jobs, isolation, 0)?, config(dir.path(), apis[1], jobs, isolation, 1)?];
    // The hosts' own errors (a setting this machine cannot fit) go to
    // this program's stderr.
    let mut hosts = vec![spawn_serve_host(&configs[0], redis.url(), Stdio::null())?];
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = tokio.block_on(async {
        let client = pulse_redis::Redis::open(redis.url())?;
        let node = Arc::new(Node::client(&client, POOL, NodeOptions::default()).await?);
        wait_for_workers(&node, WORKERS, &mut hosts).await?;
        let first = hosts[0].id().to_string();
        let (idle, idle_anon) = (report::resident_bytes_of(&first), report::anonymous_bytes_of(&first));
        let started = Instant::now();
        let keys = dispatch(&node, jobs).await?;
        let dispatched_in = started.elapsed();
        // Every job ticks once within an interval of its start; the window
        // then sees each tick about once.
        ticked_once(&apis[..1], jobs, &mut hosts).await?;
        let (rss, anon) = (report::resident_bytes_of(&first), report::anonymous_bytes_of(&first));
        let before = crate::scrape::histogram(&apis[..1], LATENESS).await?;
        let measuring = Instant::now();
        // A whole interval: every job ticks once in it, however their
        // starts fell.
        let mut notified = notify(&node, &keys, INTERVAL).await?;
        tokio::time::sleep(INTERVAL.saturating_sub(measuring.elapsed())).await;
        let lateness = crate::scrape::histogram(&apis[..1], LATENESS).await?.minus(&before);
        let measured = measuring.elapsed();
        let first_workers: HashSet<String> = node.workers().await?.into_iter().map(|w| w.id).collect();
        // The second host counts no move before it starts.
        let moved_before = moved_jobs(&apis[..1]).await?;
        let joining = Instant::now();
        hosts.push(spawn_serve_host(&configs[1], redis.url(), Stdio::null())?);
        wait_for_workers(&node, 2 * WORKERS, &mut hosts).await?;
        let (moved_in, joined_in) = joined(&node, jobs, &first_workers, &apis, joining, &mut hosts).await?;
        let moves = moved_jobs(&apis).await? - moved_before;
        let second = report::resident_bytes_of(&hosts[1].id().to_string());
        report::Result::new("density")
            .field("isolation", isolation)
            .field("jobs", jobs)
            .field("workers", WORKERS)
            .field("interval_ms", INTERVAL.as_millis())
            .field("dispatch_per_s", format!("{:.0}", jobs as f64 / dispatched_in.as_secs_f64()))
            .field("rss_idle_mib", report::mib(idle))
            .field("rss_mib", report::mib(rss))
            .field("rss_per_job_kib", per_job_kib(rss, idle, jobs))
            .field("rss_anon_per_job_kib", per_job_kib(anon, idle_anon, jobs))
            .field("timers_per_s", format!("{:.0}", lateness.count / measured.as_secs_f64()))
            .field("timer_late_mean_ms", format!("{:.2}", lateness.mean_ms()))
            .field("timer_late_p99_le_ms", lateness.quantile_field(0.99))
            .field("notifies", notified.len())
            .millis("notify_p50_ms", percentile(&mut notified, 50.0))
            .millis("notify_p99_ms", percentile(&mut notified, 99.0))
            .millis("join_ms", joined_in)
            .field("moved", moved_in)
            .field("moves_per_moved_job", format!("{:.2}", moves as f64 / moved_in.max(1) as f64))
            .field("second_host_rss_mib", report::mib(second))
            .print();
        node.shutdown(PATIENCE).await?;
        node.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    end_processes(hosts, &result);
    result
}

/// Writes host `index`'s config: the pool's `counter` plugin in
/// `isolation`, its API at `api`.
fn config(
    dir: &Path,
    api: SocketAddr,
    jobs: usize,
    isolation: &str,
    index: usize,
) -> BenchResult<std::path::PathBuf> {
    let plugin = crate::runtime::plugin_path("counter")?;
    let instances = if isolation == "job" { jobs + 64 } else { 64 };
    let text = format!(
        "[http]\nlisten = \"{api}\"\n\n[runtime]\nmax_instances = {instances}\n\
         max_memory_per_instance = \"{MEMORY}\"\nmemory_reservation = \"{MEMORY}\"\n\n\
         [[plugin]]\nname = \"counter\"\npath = {path:?}\npool = \"{POOL}\"\nworkers = {WORKERS}\n\
         isolation = \"{isolation}\"\n[plugin.limits]\nmemory = \"{MEMORY}\"\n\
         [plugin.settings]\ninterval-ms = \"{interval}\"\n",
        path = plugin.display().to_string(),
        interval = INTERVAL.as_millis(),
    );
    let path = dir.join(format!("host{index}.toml"));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Dispatches `jobs` jobs in batches, `LANES` in flight; every one must
/// start. Returns their keys.
async fn dispatch(node: &Arc<Node>, jobs: usize) -> BenchResult<Vec<String>> {
    let keys: Vec<String> = (0..jobs).map(|i| format!("d-{i}")).collect();
    let batches: Vec<Vec<(String, Vec<u8>)>> =
        keys.chunks(BATCH).map(|chunk| chunk.iter().map(|key| (key.clone(), Vec::new())).collect()).collect();
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        let node = node.clone();
        let mine: Vec<_> = batches.iter().skip(lane).step_by(LANES).cloned().collect();
        lanes.push(tokio::spawn(async move {
            for batch in mine {
                for (outcome, (key, _)) in node.dispatch_batch(&batch).await.into_iter().zip(&batch) {
                    match outcome {
                        Ok(DispatchOutcome::Started) => {}
                        other => return Err(format!("{key}: {other:?}")),
                    }
                }
            }
            Ok(())
        }));
    }
    for lane in lanes {
        lane.await??;
    }
    Ok(keys)
}

/// Waits until the hosts at `apis` made at least `jobs` timer calls.
async fn ticked_once(apis: &[SocketAddr], jobs: usize, hosts: &mut [Child]) -> BenchResult {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let calls = crate::scrape::histogram(apis, LATENESS).await?.count;
        if calls >= jobs as f64 {
            return Ok(());
        }
        alive(hosts)?;
        if Instant::now() > deadline {
            return Err(format!("{calls} timer calls of {jobs} jobs after {PATIENCE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends notifications to random jobs, one at a time per sender, for
/// `window`; returns how long each took to be answered.
async fn notify(node: &Arc<Node>, keys: &[String], window: Duration) -> BenchResult<Vec<Duration>> {
    let keys = Arc::new(keys.to_vec());
    let until = Instant::now() + window;
    let mut senders = Vec::new();
    for sender in 0..NOTIFY_SENDERS {
        let (node, keys) = (node.clone(), keys.clone());
        senders.push(tokio::spawn(async move {
            let mut times = Vec::new();
            // A fixed stride through the keys: no two senders share one.
            let mut index = sender * 7_919;
            while Instant::now() < until {
                index = (index + NOTIFY_SENDERS * 104_729) % keys.len();
                let sent = Instant::now();
                match node.notify(&keys[index], b"reset").await {
                    Ok(EventOutcome::Done) => times.push(sent.elapsed()),
                    other => return Err(format!("notify {}: {other:?}", keys[index])),
                }
            }
            Ok(times)
        }));
    }
    let mut times = Vec::new();
    for sender in senders {
        times.extend(sender.await??);
    }
    Ok(times)
}

/// Waits until the workers that joined after `first` hold their share of
/// the jobs, all of them moved there (`pulse_moved_jobs_total` of the
/// hosts at `apis`), every job runs, and a second look half a second
/// later reads the same; returns the jobs they hold and the time from
/// `started` (the second host's start) until the first of those looks.
async fn joined(
    node: &Node,
    jobs: usize,
    first: &HashSet<String>,
    apis: &[SocketAddr],
    started: Instant,
    hosts: &mut [Child],
) -> BenchResult<(u64, Duration)> {
    let deadline = started + PATIENCE;
    // The first time every condition held, and what it read then: settled
    // once the next look reads the same.
    let mut settled: Option<(Duration, u64, u64)> = None;
    loop {
        let workers = node.workers().await?;
        let joined: Vec<_> = workers.iter().filter(|w| !first.contains(&w.id)).collect();
        let held: u64 = joined.iter().map(|w| w.jobs).sum();
        let all: u64 = workers.iter().map(|w| w.jobs).sum();
        let slots = |ws: &mut dyn Iterator<Item = u32>| ws.map(u64::from).sum::<u64>().max(1);
        let share = slots(&mut joined.iter().map(|w| w.slots));
        // The joiners' share of the slots, in jobs, give or take a tenth.
        let expected = jobs as u64 * share / slots(&mut workers.iter().map(|w| w.slots));
        let moves = moved_jobs(apis).await?;
        let now = joined.len() == WORKERS
            && held > 0
            && held.abs_diff(expected) <= expected / 10
            && moves >= held
            && all == jobs as u64
            && node.job_counts().await?.running == jobs as u64;
        match (now, settled) {
            (true, Some((at, was_held, was_moves))) if was_held == held && was_moves == moves => {
                return Ok((held, at));
            }
            (true, _) => settled = Some((started.elapsed(), held, moves)),
            (false, _) => settled = None,
        }
        alive(hosts)?;
        if Instant::now() > deadline {
            return Err(format!(
                "{} workers joined holding {held} jobs of {expected} after {PATIENCE:?}",
                joined.len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Fails when one of the hosts ended.
fn alive(hosts: &mut [Child]) -> BenchResult {
    for host in hosts.iter_mut() {
        if let Some(status) = host.try_wait()? {
            return Err(format!("a host ended: {status}").into());
        }
    }
    Ok(())
}

/// What `jobs` jobs added, per job, from `before` to `after` bytes.
fn per_job_kib(after: u64, before: u64, jobs: usize) -> String {
    format!("{:.1}", after.saturating_sub(before) as f64 / 1024.0 / jobs as f64)
}
