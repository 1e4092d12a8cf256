//! What a node records into the [`metrics`] facade, labelled with its
//! pool. Nothing is recorded unless the embedding program installs a
//! recorder first (`pulse-host` renders them at `/metrics`); handles are
//! taken once per node, so a dispatch costs two atomic updates.
//!
//! - `pulse_dispatch_seconds`: histogram of [`crate::Node::dispatch`],
//!   from the call to its answer.
//! - `pulse_dispatches_total{outcome}`: `started`, `queued`, `exists`,
//!   `refused`, `failed`, `full`, `unconfirmed`.
//! - `pulse_rebalances_total`: times a worker of this node moved jobs whose
//!   keys route elsewhere after a slot-table change;
//!   `pulse_moved_jobs_total`: the jobs its workers handed to others, for
//!   those changes and when they left.
//! - `pulse_evictions_total`: workers this node's janitor evicted (lease
//!   expired); `pulse_evicted_jobs_total`: the jobs they held, queued again.
//! - `pulse_lease_renewals_failed_total`: renewals that did not reach Redis.
//! - `pulse_emits_dropped_total`: events jobs emitted that were not written:
//!   their job was no longer its worker's when they reached Redis (see
//!   `core::emits`), or Redis refused the write.

use metrics::{Counter, Histogram};

use crate::job::DispatchOutcome;

pub(crate) struct PoolMetrics {
    dispatch_seconds: Histogram,
    /// In the order of [`outcome_index`].
    dispatches: [Counter; 7],
    pub(crate) rebalances: Counter,
    pub(crate) moved_jobs: Counter,
    pub(crate) evictions: Counter,
    pub(crate) evicted_jobs: Counter,
    pub(crate) renewals_failed: Counter,
    pub(crate) emits_dropped: Counter,
}

const OUTCOMES: [&str; 7] = ["started", "queued", "exists", "refused", "failed", "full", "unconfirmed"];

fn outcome_index(outcome: &DispatchOutcome) -> usize {
    match outcome {
        DispatchOutcome::Started => 0,
        DispatchOutcome::Queued => 1,
        DispatchOutcome::AlreadyExists(_) => 2,
        DispatchOutcome::Refused(_) => 3,
        DispatchOutcome::Failed(_) => 4,
        DispatchOutcome::PoolFull => 5,
        DispatchOutcome::Unconfirmed => 6,
    }
}

impl PoolMetrics {
    pub(crate) fn new(pool: &str) -> Self {
        let label = || ("pool", pool.to_owned());
        let counter = |name: &'static str| metrics::counter!(name, &[label()]);
        Self {
            dispatch_seconds: metrics::histogram!("pulse_dispatch_seconds", &[label()]),
            dispatches: OUTCOMES.map(|outcome| {
                metrics::counter!("pulse_dispatches_total", "pool" => pool.to_owned(), "outcome" => outcome)
            }),
            rebalances: counter("pulse_rebalances_total"),
            moved_jobs: counter("pulse_moved_jobs_total"),
            evictions: counter("pulse_evictions_total"),
            evicted_jobs: counter("pulse_evicted_jobs_total"),
            renewals_failed: counter("pulse_lease_renewals_failed_total"),
            emits_dropped: counter("pulse_emits_dropped_total"),
        }
    }

    pub(crate) fn dispatched(&self, outcome: &DispatchOutcome, took: std::time::Duration) {
        self.dispatch_seconds.record(took.as_secs_f64());
        self.dispatches[outcome_index(outcome)].increment(1);
    }
}

impl std::fmt::Debug for PoolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMetrics").finish_non_exhaustive()
    }
}
