//! The `rollout` scenario: a new release of a plugin rolled through a
//! live pool.
//!
//! Two host processes (`pulse_host::run`, this program re-run as
//! `serve-host`) serve one pool of `counter` (version 1), 2 workers each,
//! with 1,000 jobs ticking once a second (`--jobs N`). Then the plugin's
//! file is replaced by `counter-v2`, each config says `version = "2"`, and
//! each host gets SIGHUP in turn, the next once the previous one's workers
//! all run version 2. Reported: the time each reload took and the whole
//! rollout (`total_ms`), job moves per job (from the hosts'
//! `pulse_moved_jobs_total`; target ≤ 1: each job moves once, when its
//! worker is replaced), and jobs lost (the pool's running count after).
//! Each new worker is judged by the upgrade gate for `GATE_WINDOW`.
//!
//! Then a bad release (`counter-broken`, version 3: it fails the start of
//! every job with saved state) is put on the first host, which gets
//! SIGHUP: its canary fails the gate and the release is undone. The
//! `bad-release` line reports the time from the SIGHUP until every worker
//! runs version 2 again with every job running (`recovered_ms`), the jobs
//! failed at the end (target 0), and moves: per job of the canary (target
//! 2: there and back) and of the others (target 0).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{Node, NodeOptions};

use crate::Args;
use crate::dispatch::{end_processes, free_address, spawn_serve_host, wait_for_workers};
use crate::report;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const POOL: &str = "bench-rollout";
const HOSTS: usize = 2;
const WORKERS_PER_HOST: usize = 2;
/// How long one host's reload may take before the scenario gives up.
const PATIENCE: Duration = Duration::from_secs(120);
/// `upgrade_window` of the plugin: each new worker's trial.
const GATE_WINDOW: &str = "2s";

pub fn run(args: &Args) -> BenchResult {
    let jobs = args.jobs.unwrap_or(if args.quick { 100 } else { 1_000 });
    let redis = pulse_testkit::RedisServer::start();
    let dir = tempfile::tempdir()?;
    let plugin = dir.path().join("counter.wasm");
    std::fs::copy(crate::runtime::plugin_path("counter")?, &plugin)?;
    let apis: Vec<std::net::SocketAddr> = (0..HOSTS).map(|_| free_address()).collect::<Result<_, _>>()?;
    let configs: Vec<_> = (0..HOSTS).map(|host| dir.path().join(format!("host{host}.toml"))).collect();
    let write_configs = |version: &str| -> BenchResult {
        for (path, api) in configs.iter().zip(&apis) {
            let config = format!(
                "[http]\nlisten = \"{api}\"\n\n[runtime]\nmax_instances = {instances}\n\n\
                 [[plugin]]\nname = \"counter\"\npath = {path:?}\npool = \"{POOL}\"\nworkers = {WORKERS_PER_HOST}\n\
                 version = \"{version}\"\nupgrade_window = \"{GATE_WINDOW}\"\n[plugin.settings]\ninterval-ms = \"1000\"\n",
                instances = jobs + 64,
                path = plugin.display().to_string(),
            );
            std::fs::write(path, config)?;
        }
        Ok(())
    };
    write_configs("1")?;
    let mut hosts = Vec::new();
    for config in &configs {
        hosts.push(spawn_serve_host(config, redis.url(), Stdio::null())?);
    }
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = tokio.block_on(async {
        let client = pulse_redis::Redis::open(redis.url())?;
        let node = Arc::new(Node::client(&client, POOL, NodeOptions::default()).await?);
        wait_for_workers(&node, HOSTS * WORKERS_PER_HOST, &mut hosts).await?;
        crate::membership::dispatch_all(&node, jobs).await?;
        let moved_before = moved_jobs(&apis).await?;
        std::fs::copy(crate::runtime::plugin_path("counter_v2")?, dir.path().join("counter.new"))?;
        std::fs::rename(dir.path().join("counter.new"), &plugin)?;
        write_configs("2")?;
        let started = Instant::now();
        let mut reloads = Vec::new();
        for (index, host) in hosts.iter().enumerate() {
            let reload = Instant::now();
            hang_up(host)?;
            wait_for_release(&node, "2", (index + 1) * WORKERS_PER_HOST).await?;
            reloads.push(format!("{}", reload.elapsed().as_millis()));
        }
        let total = started.elapsed();
        let moved = moved_jobs(&apis).await? - moved_before;
        let counts = node.job_counts().await?;
        report::Result::new("rollout")
            .field("jobs", jobs)
            .field("hosts", HOSTS)
            .field("workers", HOSTS * WORKERS_PER_HOST)
            .field("reload_ms", reloads.join("/"))
            .millis("total_ms", total)
            .field("moves", moved)
            .field("moves_per_job", format!("{:.2}", moved as f64 / jobs as f64))
            .field("lost", jobs as u64 - counts.running.min(jobs as u64))
            .field("failed", counts.failed)
            .field("gate_window", GATE_WINDOW)
            .print();
        bad_release(&node, &hosts[0], &apis, dir.path(), &plugin, &write_configs, jobs).await?;
        node.shutdown(Duration::from_secs(120)).await?;
        node.close().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    });
    end_processes(hosts, &result);
    result
}

/// The bad release on the first host (see the module's documentation).
async fn bad_release(
    node: &Node,
    host: &Child,
    apis: &[std::net::SocketAddr],
    dir: &std::path::Path,
    plugin: &std::path::Path,
    write_configs: &dyn Fn(&str) -> BenchResult,
    jobs: usize,
) -> BenchResult {
    let before = node.workers().await?;
    let moved_before = moved_jobs(apis).await?;
    let broken = crate::runtime::plugin_path("counter_broken")?;
    let digest = pulse_host::digest(&std::fs::read(&broken)?);
    std::fs::copy(broken, dir.join("counter.new"))?;
    std::fs::rename(dir.join("counter.new"), plugin)?;
    write_configs("3")?;
    let started = Instant::now();
    hang_up(host)?;
    let deadline = started + PATIENCE;
    loop {
        let workers = node.workers().await?;
        let counts = node.job_counts().await?;
        let back =
            workers.len() == HOSTS * WORKERS_PER_HOST && workers.iter().all(|w| w.release.version == "2");
        if back && counts.running == jobs as u64 && node.refused_release(&digest).await?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the bad release was not undone within {PATIENCE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = started.elapsed();
    let after = node.workers().await?;
    // The canary's worker is the one replaced (there and back).
    let canary_jobs: u64 =
        before.iter().filter(|w| !after.iter().any(|a| a.id == w.id)).map(|w| w.jobs).sum();
    let moved = moved_jobs(apis).await? - moved_before;
    let counts = node.job_counts().await?;
    report::Result::new("bad-release")
        .field("jobs", jobs)
        .millis("recovered_ms", recovered)
        .field("failed", counts.failed)
        .field("canary_jobs", canary_jobs)
        .field("moves", moved)
        .field("moves_per_canary_job", format!("{:.2}", moved as f64 / canary_jobs.max(1) as f64))
        .field(
            "moves_per_other_job",
            format!(
                "{:.2}",
                moved.saturating_sub(2 * canary_jobs) as f64 / (jobs as u64 - canary_jobs).max(1) as f64
            ),
        )
        .print();
    Ok(())
}

fn hang_up(host: &Child) -> BenchResult {
    let status = Command::new("kill").args(["-HUP", &host.id().to_string()]).status()?;
    if !status.success() {
        return Err("kill -HUP failed".into());
    }
    Ok(())
}

/// Waits until `count` of the pool's workers run `version` and the pool
/// lists its usual number of workers (the replaced ones left).
async fn wait_for_release(node: &Node, version: &str, count: usize) -> BenchResult {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let workers = node.workers().await?;
        let new = workers.iter().filter(|w| w.release.version == version).count();
        if new >= count && workers.len() == HOSTS * WORKERS_PER_HOST {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{new} of {count} workers ran version {version} after {PATIENCE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `pulse_moved_jobs_total` of every host, added up; an error when a
/// host's metrics cannot be read.
pub(crate) async fn moved_jobs(apis: &[std::net::SocketAddr]) -> Result<u64, String> {
    Ok(crate::scrape::total(apis, "pulse_moved_jobs_total").await? as u64)
}
