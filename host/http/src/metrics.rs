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

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!("pulse_jobs", "Jobs of the pool by state (running includes moving), read at scrape");
    describe_gauge!("pulse_workers", "Workers of the pool, on every host");
    describe_histogram!("pulse_dispatch_seconds", Unit::Seconds, "Dispatch latency, from call to answer");
    describe_counter!("pulse_dispatches_total", "Dispatches from this host by outcome");
    describe_counter!("pulse_rebalances_total", "Times a worker here moved jobs after a slot-table change");
    describe_counter!("pulse_moved_jobs_total", "Jobs workers here moved to the worker their key routes to");
    describe_counter!("pulse_evictions_total", "Workers this host evicted because their lease expired");
    describe_counter!("pulse_evicted_jobs_total", "Jobs of evicted workers, queued for their next worker");
    describe_counter!("pulse_lease_renewals_failed_total", "Lease renewals that failed");
    describe_counter!(
        "pulse_emits_dropped_total",
        "Emitted events not written: their job had moved, or Redis refused"
    );
    describe_counter!("pulse_plugin_calls_total", "Guest calls by plugin, call and outcome");
    describe_histogram!(
        "pulse_plugin_instantiate_seconds",
        Unit::Seconds,
        "Time to instantiate a plugin (pre-instantiated component)"
    );
    describe_gauge!("pulse_plugin_memory_bytes", Unit::Bytes, "Linear memory of a plugin's live instances");
    describe_gauge!("pulse_plugin_instances", "Live instances of a plugin");
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
