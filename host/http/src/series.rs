//! What the status page charts: for each pool, one point a second over the
//! last 15 minutes, kept by the host from the moment it serves the pool,
//! so a page opened now shows the quarter hour before it.
//!
//! A point holds this host's rates (dispatches, guest `start` calls, failed
//! guest calls and jobs moved or requeued, per second), the p50 and p99 of
//! its guest calls over that second, and the pool's job counts (read from
//! Redis, as `/metrics` does). Rates and quantiles come from the same
//! recorder `/metrics` renders, differenced between two samples.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use serde::Serialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::Api;
use crate::error::ApiError;

/// Points kept: 15 minutes, one a second.
pub(crate) const POINTS: usize = 900;
/// Time between points.
const EVERY: Duration = Duration::from_secs(1);

/// One second of a pool.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Point {
    /// When it was taken, ms since the Unix epoch.
    t: u64,
    dispatches: f64,
    starts: f64,
    failures: f64,
    moves: f64,
    /// Guest call latency over the second, ms (none without calls).
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    running: u64,
    queued: u64,
    failed: u64,
}

/// The points of every pool, and the totals of the last sample.
#[derive(Debug, Default)]
pub(crate) struct Series {
    points: HashMap<String, VecDeque<Point>>,
    last: HashMap<String, Totals>,
}

/// A pool's counters at one sample.
#[derive(Debug, Default, Clone)]
struct Totals {
    dispatches: f64,
    starts: f64,
    failures: f64,
    moves: f64,
    /// Guest call latency buckets, as rendered (bounds ascending): upper
    /// bound (s) and cumulative count.
    buckets: Vec<(f64, f64)>,
}

/// Samples every pool of `api` each second until `shutdown`.
pub(crate) async fn sample(api: Api, shutdown: CancellationToken) {
    let mut ticker = tokio::time::interval(EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let text = api.inner.metrics.as_ref().map(|handle| handle.render()).unwrap_or_default();
        let lines = parse(&text);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        for (name, pool) in api.pools() {
            // A pool whose counts cannot be read this second (Redis away)
            // gets no point: the chart shows the gap.
            let Ok(counts) = pool.node.job_counts().await else { continue };
            let totals = totals(&lines, &name, pool.plugin.as_deref());
            let mut series = crate::write(&api.inner.series);
            // The recorder's counters start at zero with the process: the
            // first point counts what happened since.
            let previous = series.last.insert(name.clone(), totals.clone()).unwrap_or_default();
            let seconds = EVERY.as_secs_f64();
            let rate = |now: f64, before: f64| ((now - before).max(0.0) / seconds * 100.0).round() / 100.0;
            let before =
                |bound: f64| previous.buckets.iter().find(|(b, _)| *b == bound).map_or(0.0, |(_, c)| *c);
            let window: Vec<(f64, f64)> =
                totals.buckets.iter().map(|&(bound, count)| (bound, count - before(bound))).collect();
            let point = Point {
                t: now,
                dispatches: rate(totals.dispatches, previous.dispatches),
                starts: rate(totals.starts, previous.starts),
                failures: rate(totals.failures, previous.failures),
                moves: rate(totals.moves, previous.moves),
                p50_ms: quantile(&window, 0.5),
                p99_ms: quantile(&window, 0.99),
                running: counts.running,
                queued: counts.queued,
                failed: counts.failed,
            };
            let points = series.points.entry(name).or_default();
            if points.len() == POINTS {
                points.pop_front();
            }
            points.push_back(point);
        }
    }
}

/// `GET /api/pools/{pool}/series`: the pool's points, oldest first.
pub(crate) async fn get(State(api): State<Api>, Path(pool): Path<String>) -> Result<Json<Value>, ApiError> {
    api.pool(&pool)?;
    let series = crate::read(&api.inner.series);
    let points: Vec<&Point> = series.points.get(&pool).map(|p| p.iter().collect()).unwrap_or_default();
    Ok(Json(json!({"every_ms": EVERY.as_millis() as u64, "points": points})))
}

/// One sample line of the Prometheus text: name, labels, value.
struct Line<'a> {
    name: &'a str,
    labels: Vec<(&'a str, &'a str)>,
    value: f64,
}

impl Line<'_> {
    fn label(&self, name: &str) -> Option<&str> {
        self.labels.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

/// The sample lines of `text` (label values holding `,` or `"` are not
/// written by this host's metrics, whose labels are pool, plugin, call,
/// outcome, state and bucket bounds).
fn parse(text: &str) -> Vec<Line<'_>> {
    text.lines()
        .filter(|line| line.starts_with("pulse_"))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let labels = labels
                .split(',')
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key, value.trim_matches('"')))
                })
                .collect();
            Some(Line { name, labels, value })
        })
        .collect()
}

/// Pool `pool`'s counters in `lines`; its plugin's, when this host runs
/// its workers.
fn totals(lines: &[Line<'_>], pool: &str, plugin: Option<&str>) -> Totals {
    let mut totals = Totals::default();
    for line in lines {
        let of_pool = line.label("pool") == Some(pool);
        let of_plugin = plugin.is_some() && line.label("plugin") == plugin;
        match line.name {
            "pulse_dispatches_total" if of_pool => totals.dispatches += line.value,
            "pulse_moved_jobs_total" | "pulse_evicted_jobs_total" if of_pool => totals.moves += line.value,
            "pulse_plugin_calls_total" if of_plugin => {
                if line.label("call") == Some("start") {
                    totals.starts += line.value;
                }
                if !matches!(line.label("outcome"), Some("ok" | "lost")) {
                    totals.failures += line.value;
                }
            }
            "pulse_plugin_call_seconds_bucket" if of_plugin => {
                let bound = match line.label("le") {
                    Some("+Inf") => f64::INFINITY,
                    Some(bound) => bound.parse().unwrap_or(f64::INFINITY),
                    None => continue,
                };
                totals.buckets.push((bound, line.value));
            }
            _ => {}
        }
    }
    totals
}

/// The `q` quantile, ms, of a window of cumulative buckets (upper bound in
/// seconds, count), interpolated within its bucket as Prometheus does.
fn quantile(window: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = window.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in window {
        if count >= rank {
            if bound.is_infinite() {
                return Some(lower.0 * 1000.0);
            }
            let within = if count > lower.1 { (rank - lower.1) / (count - lower.1) } else { 1.0 };
            return Some(((lower.0 + (bound - lower.0) * within) * 1000.0 * 1000.0).round() / 1000.0);
        }
        lower = (bound, count);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_s_counters_and_latency_are_read_from_the_metrics_text() {
        let text = "pulse_dispatches_total{pool=\"echo\",outcome=\"started\"} 10\n\
                    pulse_dispatches_total{pool=\"echo\",outcome=\"exists\"} 2\n\
                    pulse_dispatches_total{pool=\"other\",outcome=\"started\"} 99\n\
                    pulse_moved_jobs_total{pool=\"echo\"} 3\n\
                    pulse_plugin_calls_total{plugin=\"e\",call=\"start\",outcome=\"ok\"} 7\n\
                    pulse_plugin_calls_total{plugin=\"e\",call=\"start\",outcome=\"trap\"} 1\n\
                    pulse_plugin_calls_total{plugin=\"e\",call=\"notify\",outcome=\"guest_error\"} 2\n\
                    pulse_plugin_call_seconds_bucket{plugin=\"e\",le=\"0.001\"} 8\n\
                    pulse_plugin_call_seconds_bucket{plugin=\"e\",le=\"0.01\"} 10\n\
                    pulse_plugin_call_seconds_bucket{plugin=\"e\",le=\"+Inf\"} 10\n";
        let totals = totals(&parse(text), "echo", Some("e"));
        assert_eq!((totals.dispatches, totals.moves, totals.starts, totals.failures), (12.0, 3.0, 8.0, 3.0));
        let window = totals.buckets.clone();
        // 5 of 10 calls fall under 1 ms: the median is within the first bucket.
        assert_eq!(quantile(&window, 0.5), Some(0.625));
        assert_eq!(quantile(&window, 0.99), Some(9.55));
        assert_eq!(quantile(&[(0.001, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
    }
}
