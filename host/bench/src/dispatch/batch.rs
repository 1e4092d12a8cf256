//! The batch lines of the `dispatch` scenario: jobs sent 1,000 at a time,
//! with `lanes` batches in flight; confirmed jobs per second and each
//! batch's time.

use std::time::{Duration, Instant};

use super::commandstats::{Servers, Spent};
use super::{Dispatcher, Handler, Line, PAYLOAD, key_of};
use crate::report::{self, percentile};

/// Jobs per batch (the HTTP API's largest batch).
const BATCH: usize = 1000;

/// Dispatches `jobs` new jobs in batches from `lanes` lanes and prints the
/// figures; returns their keys.
pub(super) async fn measure(
    dispatcher: &Dispatcher,
    servers: &mut Servers,
    handler: Handler,
    lanes: usize,
    jobs: usize,
    line: &Line,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let keys: Vec<String> = (0..jobs).map(|i| key_of(lanes, i)).collect();
    let batches: Vec<Vec<(String, Vec<u8>)>> = keys
        .chunks(BATCH)
        .map(|chunk| chunk.iter().map(|key| (key.clone(), PAYLOAD.to_vec())).collect())
        .collect();
    let before = servers.read().await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for lane in 0..lanes {
        let mut dispatcher = dispatcher.lane().await?;
        let mine: Vec<_> = batches.iter().skip(lane).step_by(lanes).cloned().collect();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            let mut confirmed = 0;
            for batch in mine {
                let sent = Instant::now();
                confirmed += dispatcher.started_batch(&batch).await;
                times.push(sent.elapsed());
            }
            (times, confirmed)
        }));
    }
    let mut times: Vec<Duration> = Vec::new();
    let mut confirmed = 0;
    for task in tasks {
        let (lane_times, lane_confirmed) = task.await?;
        times.extend(lane_times);
        confirmed += lane_confirmed;
    }
    let elapsed = started.elapsed();
    let spent = Spent::new(before, servers.read().await?);
    let result = line
        .fields(report::Result::new("dispatch").field("handler", handler.name()))
        .field("dispatchers", lanes)
        .field("batch", BATCH)
        .field("jobs", jobs)
        .field("rate_per_s", format!("{:.0}", confirmed as f64 / elapsed.as_secs_f64()))
        .millis("batch_p50_ms", percentile(&mut times, 50.0))
        .millis("batch_max_ms", percentile(&mut times, 100.0));
    spent.fields(result, jobs).field("unconfirmed", jobs - confirmed).print();
    spent.after.print_by_command(&spent.before, handler.name(), lanes, jobs);
    Ok(keys)
}
