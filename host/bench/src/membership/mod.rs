//! The `failover` and `rebalance` scenarios: what membership changes cost.
//!
//! Handlers count their starts and stops per key in Redis (one hash per
//! process), so the figures say how many runs each job has: lost (none),
//! duplicated (more than one), moved (started again).
//!
//! - `failover`: two processes with 2 workers each (lease TTL 2 s) run
//!   1,000 jobs; one is killed with SIGKILL. Reported: when the survivor's
//!   handler started the last of them (`started_ms`, from the time each
//!   handler's `start` recorded), when the survivor's counts showed every
//!   job running (`recovered_ms`) and when the listing did (`listed_ms`),
//!   lost and duplicated jobs. Target: `started_ms` at most TTL + grace (a
//!   fifth of the TTL) + a tick (a quarter) = 2.9 s.
//! - `rebalance`: 4 workers run 1,000 jobs; a fifth joins, then the first
//!   leaves. Reported per change: the time until every job runs on its
//!   slot's worker, jobs moved vs the jobs whose slot owner changed,
//!   misplaced jobs after settling, most and fewest jobs per worker. Then
//!   `kill-host`: two processes of 2 workers run 1,000 jobs and the first
//!   to join is killed with SIGKILL: the survivor's own jobs that were
//!   started again (`survivors_moved`, target 0) and the killed process's
//!   jobs started on the survivor (`moved` against `expected_moves`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{DispatchOutcome, JobState, Node};

use crate::Args;
use crate::report;

mod counting;

pub use counting::serve_counting;
use counting::{Counting, Process, options, runs, started_key, starts, starts_of, unix_ms};

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// The hidden scenario name of a counting worker process.
pub const SERVE_COUNTING: &str = "serve-counting";
const JOBS: usize = 1_000;
const LEASE_TTL: Duration = Duration::from_secs(2);
/// How long a change may take before the scenario gives up on it.
const PATIENCE: Duration = Duration::from_secs(60);

/// Dispatches `job-0` … `job-<jobs - 1>`, 32 at a time; each must start.
pub(crate) async fn dispatch_all(node: &Arc<Node>, jobs: usize) -> BenchResult {
    let mut lanes = Vec::new();
    for lane in 0..32 {
        let node = node.clone();
        lanes.push(tokio::spawn(async move {
            for i in (lane..jobs).step_by(32) {
                match node.dispatch(&format!("job-{i}"), b"").await {
                    Ok(DispatchOutcome::Started) => {}
                    other => return Err(format!("job-{i}: {other:?}")),
                }
            }
            Ok(())
        }));
    }
    for lane in lanes {
        lane.await??;
    }
    Ok(())
}

/// Whether the listing shows `jobs` jobs, each running on a worker not in
/// `dead`.
async fn all_listed(node: &Node, jobs: usize, dead: &HashSet<String>) -> BenchResult<bool> {
    let listed = node.jobs().await?;
    Ok(listed.len() == jobs
        && listed.iter().all(|job| {
            job.state == JobState::Running && job.worker.as_ref().is_some_and(|w| !dead.contains(w))
        }))
}

/// Slots per worker, and job -> worker, as Redis has them now.
async fn placement(node: &Node) -> BenchResult<(BTreeMap<String, u32>, HashMap<String, String>)> {
    let slots = node.workers().await?.into_iter().filter(|w| w.slots > 0).map(|w| (w.id, w.slots)).collect();
    let jobs = node
        .jobs()
        .await?
        .into_iter()
        .filter(|job| job.state == JobState::Running)
        .filter_map(|job| Some((job.key, job.worker?)))
        .collect();
    Ok((slots, jobs))
}

/// Two processes of 2 counting workers each on a private Redis, the
/// first (to be killed) joined first.
struct TwoHosts {
    doomed: Process,
    survivor: Process,
    /// Last: dropped after the processes, which leave through it.
    server: pulse_testkit::RedisServer,
}

impl TwoHosts {
    fn start(pool: &str) -> BenchResult<Self> {
        let server = pulse_testkit::RedisServer::start();
        let doomed = Process::spawn(server.url(), pool, 2)?;
        let survivor = Process::spawn(server.url(), pool, 2)?;
        Ok(Self { server, doomed, survivor })
    }

    /// A client-only node and a connection, once `jobs` jobs run.
    async fn dispatch(&self, pool: &str, jobs: usize) -> BenchResult<(Arc<Node>, pulse_redis::Shared)> {
        let client = pulse_redis::Redis::open(self.server.url())?;
        let node = Arc::new(Node::client(&client, pool, options()).await?);
        let conn = client.shared().await?;
        dispatch_all(&node, jobs).await?;
        Ok((node, conn))
    }

    /// Kills the first process with SIGKILL.
    fn kill_doomed(&mut self) -> BenchResult {
        self.doomed.0.kill()?;
        self.doomed.0.wait()?;
        Ok(())
    }
}

pub fn failover(args: &Args) -> BenchResult {
    let jobs = args.jobs.unwrap_or(if args.quick { 200 } else { JOBS });
    let pool = "failover";
    let mut hosts = TwoHosts::start(pool)?;
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let (node, mut conn) = hosts.dispatch(pool, jobs).await?;
        let doomed_pid = hosts.doomed.0.id();
        let doomed_runs = runs(&mut conn, pool, doomed_pid).await?;
        let on_doomed = doomed_runs.values().filter(|n| **n > 0).count();
        // The killed process's workers: those its jobs are listed on.
        let (_, placed) = placement(&node).await?;
        let dead: HashSet<String> = doomed_runs
            .iter()
            .filter(|(_, n)| **n > 0)
            .filter_map(|(key, _)| placed.get(key).cloned())
            .collect();
        let killed = Instant::now();
        let killed_ms = unix_ms();
        hosts.kill_doomed()?;
        // Until every job has exactly one run on the survivor, and the
        // listing shows every job running there.
        let survivor_pid = hosts.survivor.0.id();
        let deadline = killed + PATIENCE;
        let (mut recovered, mut listed) = (None, None);
        let (lost, duplicated) = loop {
            let live = runs(&mut conn, pool, survivor_pid).await?;
            let running = live.values().filter(|n| **n == 1).count();
            let duplicated = live.values().filter(|n| **n > 1).count();
            if running == jobs {
                recovered.get_or_insert_with(|| killed.elapsed());
            }
            if listed.is_none() && all_listed(&node, jobs, &dead).await? {
                listed = Some(killed.elapsed());
            }
            if (recovered.is_some() && listed.is_some()) || Instant::now() > deadline {
                break (jobs - running - duplicated, duplicated);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let started_at: HashMap<String, u64> =
            redis::cmd("HGETALL").arg(started_key(pool, survivor_pid)).query_async(&mut conn).await?;
        let last_start =
            started_at.values().copied().filter(|at| *at >= killed_ms).max().unwrap_or(killed_ms);
        let target = LEASE_TTL + LEASE_TTL / 5 + LEASE_TTL / 4;
        let never = PATIENCE;
        report::Result::new("failover")
            .field("jobs", jobs)
            .field("jobs_on_killed", on_doomed)
            .millis("lease_ttl_ms", LEASE_TTL)
            .millis("started_ms", Duration::from_millis(last_start - killed_ms))
            .millis("recovered_ms", recovered.unwrap_or(never))
            .millis("listed_ms", listed.unwrap_or(never))
            .millis("target_ms", target)
            .field("lost", lost)
            .field("duplicated", duplicated)
            .print();
        finish(&node).await
    })?;
    drop(hosts);
    Ok(())
}

pub fn rebalance(args: &Args) -> BenchResult {
    let jobs = args.jobs.unwrap_or(if args.quick { 200 } else { JOBS });
    let server = pulse_testkit::RedisServer::start();
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let client = pulse_redis::Redis::open(server.url())?;
        let pool = "rebalance";
        let node = Arc::new(Node::join(&client, pool, options()).await?);
        let handler = Counting::new(&client, pool).await?;
        for _ in 0..4 {
            node.add_worker(handler.clone()).await?;
        }
        let mut conn = client.shared().await?;
        dispatch_all(&node, jobs).await?;
        for change in ["join", "leave-first"] {
            let (_, before) = placement(&node).await?;
            let starts_before = starts(&mut conn, pool).await?;
            let began = Instant::now();
            if change == "join" {
                node.add_worker(handler.clone()).await?;
            } else {
                node.remove_worker("w1").await?;
            }
            let deadline = began + PATIENCE;
            let (settled, slots, after) = loop {
                let (slots, after) = placement(&node).await?;
                let live = runs(&mut conn, pool, std::process::id()).await?;
                let placed = after.len() == jobs
                    && after.iter().all(|(key, worker)| node.owner(key).as_ref() == Some(worker))
                    && live.values().filter(|n| **n == 1).count() == jobs;
                if placed || Instant::now() > deadline {
                    break (began.elapsed(), slots, after);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            let moved = starts(&mut conn, pool).await? - starts_before;
            let expected =
                before.iter().filter(|(key, worker)| node.owner(key).as_ref() != Some(*worker)).count();
            let misplaced =
                after.iter().filter(|(key, worker)| node.owner(key).as_ref() != Some(*worker)).count();
            let mut per_worker: HashMap<&str, usize> = slots.keys().map(|w| (w.as_str(), 0)).collect();
            for worker in after.values() {
                *per_worker.entry(worker).or_default() += 1;
            }
            let line = report::Result::new("rebalance")
                .field("change", change)
                .field("jobs", jobs)
                .field("workers_after", slots.len())
                .millis("settle_ms", settled)
                .field("moved", moved)
                .field("expected_moves", expected)
                .field("misplaced", misplaced);
            spread(line, per_worker.values().copied(), &slots).print();
        }
        finish(&node).await
    })?;
    kill_host(jobs)
}

/// The `kill-host` change of `rebalance`: two processes of 2 workers each
/// run `jobs` jobs; the first to join is killed with SIGKILL. The
/// survivor's own jobs should not move at all (`survivors_moved`), and the
/// killed process's jobs should each start once on the survivor.
fn kill_host(jobs: usize) -> BenchResult {
    let pool = "rebalance-kill";
    let mut hosts = TwoHosts::start(pool)?;
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let (node, mut conn) = hosts.dispatch(pool, jobs).await?;
        let (doomed_pid, survivor_pid) = (hosts.doomed.0.id(), hosts.survivor.0.id());
        let live_keys = |runs: HashMap<String, i64>| -> HashSet<String> {
            runs.into_iter().filter(|(_, n)| *n > 0).map(|(key, _)| key).collect()
        };
        let on_doomed = live_keys(runs(&mut conn, pool, doomed_pid).await?);
        let on_survivor = live_keys(runs(&mut conn, pool, survivor_pid).await?);
        let (_, placed) = placement(&node).await?;
        let dead: HashSet<String> = on_doomed.iter().filter_map(|key| placed.get(key).cloned()).collect();
        let starts_before = starts_of(&mut conn, pool, survivor_pid).await?;
        let killed = Instant::now();
        hosts.kill_doomed()?;
        let deadline = killed + PATIENCE;
        let settled = loop {
            let live = runs(&mut conn, pool, survivor_pid).await?;
            let running = live.values().filter(|n| **n == 1).count();
            if (running == jobs && all_listed(&node, jobs, &dead).await?) || Instant::now() > deadline {
                break killed.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let starts_after = starts_of(&mut conn, pool, survivor_pid).await?;
        let started_again = |key: &String| {
            starts_after.get(key).copied().unwrap_or(0) - starts_before.get(key).copied().unwrap_or(0)
        };
        let survivors_moved = on_survivor.iter().filter(|key| started_again(key) > 0).count();
        let moved: i64 = on_doomed.iter().map(started_again).sum();
        let (slots, placed) = placement(&node).await?;
        let mut per_worker: HashMap<String, usize> = HashMap::new();
        for (_, worker) in placed {
            *per_worker.entry(worker).or_default() += 1;
        }
        let line = report::Result::new("rebalance")
            .field("change", "kill-host")
            .field("jobs", jobs)
            .field("workers_after", per_worker.len())
            .millis("settle_ms", settled)
            .field("moved", moved)
            .field("expected_moves", on_doomed.len())
            .field("survivors_moved", survivors_moved)
            .field("survivor_jobs", on_survivor.len());
        spread(line, per_worker.values().copied(), &slots).print();
        finish(&node).await
    })?;
    drop(hosts);
    Ok(())
}

/// Shuts the scenario's pool down and closes its node.
async fn finish(node: &Node) -> BenchResult {
    node.shutdown(PATIENCE).await?;
    node.close().await;
    Ok(())
}

/// `line` with the most and fewest jobs and slots a worker has.
fn spread(
    line: report::Result,
    jobs_per_worker: impl Iterator<Item = usize> + Clone,
    slots: &BTreeMap<String, u32>,
) -> report::Result {
    line.field("max_per_worker", jobs_per_worker.clone().max().unwrap_or(0))
        .field("min_per_worker", jobs_per_worker.min().unwrap_or(0))
        .field("max_slots", slots.values().max().copied().unwrap_or(0))
        .field("min_slots", slots.values().min().copied().unwrap_or(0))
}
