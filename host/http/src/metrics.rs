//! `/metrics`: the process's [`metrics`] recorder rendered in Prometheus
//! text format, plus the gauges read from Redis at each scrape (jobs by
//! state and workers, per pool: O(workers) each, whatever the number of
//! jobs).
//!
//! The pool and the runtime record through the `metrics` facade into the
//! recorder [`install`] sets; it must be installed before they take their
//! handles, so before any node joins or plugin loads.

use std::sync::OnceLock;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::Api;
use crate::error::ApiError;

/// Latency buckets, seconds: 100 µs to 10 s.
const BUCKETS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0];

/// How often histograms fold their samples into buckets: between scrapes
/// they would otherwise keep every sample.
const UPKEEP: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process's recorder (once; later calls return the same
/// handle) and starts folding histogram samples every few seconds. Call it
/// in a Tokio runtime, before any node joins or plugin loads.
///
/// # Panics
/// When another recorder was installed by other code.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
                .expect("the buckets are not empty")
                .install_recorder()
                .expect("no other metrics recorder is installed in this process");
            describe();
            // Owned by the recorder, which lives as long as the process: a
            // thread of its own, not a task of whichever runtime installed
            // it first (which may end while the recorder goes on).
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("pulse-metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP);
                        upkeep.run_upkeep();
                    }
                })
                .expect("a thread can be started at startup");
            handle
        })
        .clone()
}

/// What a metric is, for its `# TYPE` line.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric the host exports, with its kind, unit and `# HELP` text:
/// the pool's, the runtime's and this crate's gauges read from Redis.
/// docs/http.md's table lists exactly these (a test checks both, and that
/// the pool and the runtime record no other).
const METRICS: &[(&str, Kind, Option<metrics::Unit>, &str)] = {
    use Kind::{Counter, Gauge, Histogram};
    use metrics::Unit::{Bytes, Seconds};
    &[
        ("pulse_jobs", Gauge, None, "Jobs of the pool by state (running includes moving), read at scrape"),
        ("pulse_workers", Gauge, None, "Workers of the pool, on every host"),
        ("pulse_dispatch_seconds", Histogram, Some(Seconds), "Dispatch latency, from call to answer"),
        ("pulse_dispatches_total", Counter, None, "Dispatches from this host by outcome"),
        ("pulse_rebalances_total", Counter, None, "Times a worker here moved jobs after a slot-table change"),
        (
            "pulse_moved_jobs_total",
            Counter,
            None,
            "Jobs workers here moved to the worker their key routes to",
        ),
        ("pulse_evictions_total", Counter, None, "Workers this host evicted because their lease expired"),
        ("pulse_evicted_jobs_total", Counter, None, "Jobs of evicted workers, queued for their next worker"),
        ("pulse_lease_renewals_failed_total", Counter, None, "Lease renewals that failed"),
        (
            "pulse_emits_dropped_total",
            Counter,
            None,
            "Emitted events not written: their job had moved, or Redis refused",
        ),
        ("pulse_plugin_calls_total", Counter, None, "Guest calls by plugin, call and outcome"),
        ("pulse_plugin_call_seconds", Histogram, Some(Seconds), "Time of a guest call, whatever its outcome"),
        (
            "pulse_plugin_instantiate_seconds",
            Histogram,
            Some(Seconds),
            "Time to instantiate a plugin (pre-instantiated component)",
        ),
        (
            "pulse_plugin_timer_lateness_seconds",
            Histogram,
            Some(Seconds),
            "How long after its due time a timer's on-timer call began",
        ),
        ("pulse_plugin_memory_bytes", Gauge, Some(Bytes), "Linear memory of a plugin's live instances"),
        ("pulse_plugin_instances", Gauge, None, "Live instances of a plugin"),
        (
            "pulse_plugin_log_lines_dropped_total",
            Counter,
            None,
            "Log lines of a plugin's jobs dropped over their rate limit",
        ),
        (
            "pulse_plugin_http_requests_total",
            Counter,
            None,
            "Outgoing HTTP requests of a plugin by host and status class (or error)",
        ),
        (
            "pulse_plugin_http_request_seconds",
            Histogram,
            Some(Seconds),
            "Outgoing HTTP requests of a plugin, from sending to the response's head",
        ),
        (
            "pulse_plugin_http_denied_total",
            Counter,
            None,
            "Outgoing HTTP requests of a plugin denied or cancelled",
        ),
        (
            "pulse_rollout_trial",
            Gauge,
            None,
            "1 while a new release of the pool's plugin is on trial on this host",
        ),
        (
            "pulse_rollout_verdicts_total",
            Counter,
            None,
            "Upgrade gate verdicts on a new release's workers here (passed, failed, interrupted)",
        ),
        (
            "pulse_rollout_held_jobs_total",
            Counter,
            None,
            "Jobs a release on trial failed, held rather than failed (they move back if it is undone)",
        ),
    ]
};

fn describe() {
    for &(name, kind, unit, help) in METRICS {
        match (kind, unit) {
            (Kind::Counter, None) => metrics::describe_counter!(name, help),
            (Kind::Counter, Some(unit)) => metrics::describe_counter!(name, unit, help),
            (Kind::Gauge, None) => metrics::describe_gauge!(name, help),
            (Kind::Gauge, Some(unit)) => metrics::describe_gauge!(name, unit, help),
            (Kind::Histogram, None) => metrics::describe_histogram!(name, help),
            (Kind::Histogram, Some(unit)) => metrics::describe_histogram!(name, unit, help),
        }
    }
}

/// `GET /metrics`.
pub(crate) async fn render(State(api): State<Api>) -> Result<Response, ApiError> {
    let Some(handle) = &api.inner.metrics else {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "no_metrics",
            "this server was started without a metrics recorder",
        ));
    };
    for (name, pool) in api.pools() {
        let counts = pool.node.job_counts().await?;
        for (state, count) in
            [("running", counts.running), ("queued", counts.queued), ("failed", counts.failed)]
        {
            metrics::gauge!("pulse_jobs", "pool" => name.clone(), "state" => state).set(count as f64);
        }
        let workers: usize = pool.node.nodes().iter().map(|n| n.workers.len()).sum();
        metrics::gauge!("pulse_workers", "pool" => name.clone()).set(workers as f64);
    }
    let mut response = handle.render().into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::METRICS;

    /// Every `"pulse_…"` string in `source`: the names a crate records.
    fn recorded(source: &str) -> BTreeSet<&str> {
        source
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|text| {
                text.starts_with("pulse_") && text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            })
            .collect()
    }

    /// The metric names in the first column of docs/http.md's table under
    /// `## Metrics` (one cell may name several, each in backticks).
    fn documented(doc: &str) -> BTreeSet<&str> {
        let section = doc.split("\n## Metrics\n").nth(1).expect("docs/http.md has a `## Metrics` section");
        let section = section.split("\n## ").next().unwrap_or(section);
        section
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .flat_map(|line| line.split(" |").next().unwrap_or_default().split(", "))
            .map(|name| name.trim_matches('`'))
            .collect()
    }

    /// The `pulse_…` metric names `text` uses, histogram series folded
    /// into their metric.
    fn used(text: &str) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for (at, _) in text.match_indices("pulse_") {
            let name: String =
                text[at..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .map_or(name.clone(), str::to_owned);
            names.insert(name);
        }
        names
    }

    #[test]
    fn the_dashboard_shows_every_metric_and_the_alerts_use_only_exported_ones() {
        let exported: BTreeSet<String> = METRICS.iter().map(|(name, ..)| (*name).to_owned()).collect();
        let dashboard = used(include_str!("../../../deploy/grafana/pulse-host.json"));
        assert_eq!(
            dashboard, exported,
            "deploy/grafana/pulse-host.json (left) against what the host exports"
        );
        for (file, text) in [
            ("alerts.yml", include_str!("../../../deploy/prometheus/alerts.yml")),
            ("alerts.test.yml", include_str!("../../../deploy/prometheus/alerts.test.yml")),
        ] {
            let unknown: Vec<_> = used(text).difference(&exported).cloned().collect();
            assert!(
                unknown.is_empty(),
                "deploy/prometheus/{file} uses {unknown:?}, which the host does not export"
            );
        }
    }

    #[test]
    fn docs_http_md_lists_exactly_the_metrics_the_host_exports() {
        let exported: BTreeSet<&str> = METRICS.iter().map(|(name, ..)| *name).collect();
        // What `render` sets here, the pool and the runtime record.
        let this = include_str!("metrics.rs");
        let render = this.split("async fn render").nth(1).and_then(|rest| rest.split("#[cfg(test)]").next());
        let mut sources = recorded(render.expect("this file has `render`"));
        sources.extend(recorded(include_str!("../../pool/src/metrics.rs")));
        sources.extend(recorded(include_str!("../../runtime/src/metrics.rs")));
        sources.extend(recorded(include_str!("../../cli/src/gate.rs")));
        assert_eq!(sources, exported, "METRICS (right) differs from what the host records (left)");
        let documented = documented(include_str!("../../../docs/http.md"));
        let missing: Vec<_> = exported.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&exported).collect();
        assert!(
            missing.is_empty() && unknown.is_empty(),
            "docs/http.md's metrics table misses {missing:?} and lists {unknown:?}, which the host does not export"
        );
    }
}
