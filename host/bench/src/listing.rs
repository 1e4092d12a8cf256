//! The `listing` scenario: a page of a pool's jobs, as `pulse-host jobs
//! --limit 100` reads it, in a pool of 1,000,000 jobs (`--jobs N`; 10,000
//! with `--quick`).
//!
//! The jobs are dispatched in batches of 1,000 to a pool without workers
//! (they wait, queued: the listing reads the same records either way).
//! Then, 20 times each: open a view of the pool (one connection, as the
//! command does) and read one page of 100 jobs; the same with a key
//! prefix that matches a tenth of the jobs; and with `state = failed`,
//! which no job is in, so the page reads its 10 rounds of the pool and
//! finds nothing (the worst case a page has). Reported: p50 and max per
//! kind, against the target of 100 ms; the jobs on the first page.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::{JobState, JobsQuery, Node, NodeOptions, PoolView};

use crate::Args;
use crate::report;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const POOL: &str = "bench-listing";
const ROUNDS: usize = 20;
const BATCH: usize = 1_000;
const TARGET: Duration = Duration::from_millis(100);

pub fn run(args: &Args) -> BenchResult {
    let jobs = args.jobs.unwrap_or(if args.quick { 10_000 } else { 1_000_000 });
    let redis = pulse_testkit::RedisServer::start();
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    tokio.block_on(async {
        let client = pulse_redis::Redis::open(redis.url())?;
        let node = Arc::new(Node::client(&client, POOL, NodeOptions::default()).await?);
        let filled = Instant::now();
        fill(&node, jobs).await?;
        let fill_s = filled.elapsed().as_secs_f64();
        let kinds = [
            ("all", JobsQuery { limit: 100, ..JobsQuery::default() }),
            ("prefix", JobsQuery { limit: 100, prefix: "job-7".into(), ..JobsQuery::default() }),
            ("failed", JobsQuery { limit: 100, state: Some(JobState::Failed), ..JobsQuery::default() }),
        ];
        for (kind, query) in kinds {
            let mut samples = Vec::with_capacity(ROUNDS);
            let mut shown = 0;
            for _ in 0..ROUNDS {
                let started = Instant::now();
                let view = PoolView::open(&client, POOL).await?;
                let page = view.list_jobs(&query).await?;
                samples.push(started.elapsed());
                shown = page.jobs.len();
            }
            let p50 = report::percentile(&mut samples, 50.0);
            let max = samples.iter().copied().max().unwrap_or_default();
            report::Result::new("listing")
                .field("kind", kind)
                .field("jobs", jobs)
                .field("fill_per_s", format!("{:.0}", jobs as f64 / fill_s))
                .field("limit", query.limit)
                .field("page_jobs", shown)
                .millis("p50_ms", p50)
                .millis("max_ms", max)
                .millis("target_ms", TARGET)
                .print();
        }
        // (No shutdown: the private server goes with its million jobs.)
        node.close().await;
        Ok(())
    })
}

/// Dispatches `jobs` jobs (`job-0` …) in batches, 4 in flight.
async fn fill(node: &Arc<Node>, jobs: usize) -> BenchResult {
    let mut lanes = Vec::new();
    for lane in 0..4 {
        let node = node.clone();
        lanes.push(tokio::spawn(async move {
            for start in (lane * BATCH..jobs).step_by(4 * BATCH) {
                let batch: Vec<(String, Vec<u8>)> =
                    (start..(start + BATCH).min(jobs)).map(|i| (format!("job-{i}"), Vec::new())).collect();
                for (outcome, (key, _)) in node.dispatch_batch(&batch).await.into_iter().zip(&batch) {
                    match outcome {
                        Ok(pulse_pool::DispatchOutcome::Queued) => {}
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
    Ok(())
}
