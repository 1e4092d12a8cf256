//! What the runtime records into the [`metrics`] facade: every guest call
//! by outcome, instantiation latency, and the memory and instances each
//! plugin holds. Nothing is recorded unless the embedding program installs
//! a recorder (`pulse-host` renders them at `/metrics`); handles are taken
//! once per plugin, so a call costs an atomic add.
//!
//! Names (all labelled `plugin`):
//! - `pulse_plugin_calls_total{call, outcome}`: `call` is `start`, `stop`,
//!   `notify` or `on-timer` for a handler, `plan` for a producer; `outcome`
//!   one of [`OUTCOMES`].
//! - `pulse_plugin_call_seconds`: a histogram of guest calls (those
//!   counted in `pulse_plugin_calls_total`), whatever their outcome.
//! - `pulse_plugin_instantiate_seconds`: a histogram.
//! - `pulse_plugin_timer_lateness_seconds`: a histogram of how long after
//!   its due time a timer's `on-timer` call began (the time it waited for
//!   the instance's earlier calls and for a thread).
//! - `pulse_plugin_memory_bytes`: linear memory of the live instances.
//! - `pulse_plugin_instances`: live instances, those made ahead of need
//!   (`ready`) included.
//! - `pulse_plugin_log_lines_dropped_total`: log lines of its jobs dropped
//!   over their log rate (`bounds`).
//! - `pulse_plugin_http_requests_total{host, status}`: outgoing HTTP
//!   requests sent, by destination host and status class (`2xx` … `5xx`,
//!   or `error` when no response came).
//! - `pulse_plugin_http_denied_total`: outgoing requests refused (not
//!   allowed, job fenced, too many in flight) or cancelled by the fence.
//! - `pulse_plugin_http_request_seconds`: a histogram, until the response's
//!   head.

use metrics::{Counter, Gauge, Histogram};

use crate::error::CallError;

/// The outcomes of a guest call, as labelled.
pub const OUTCOMES: [&str; 7] =
    ["ok", "guest_error", "trap", "timeout", "memory_limit", "fuel_exhausted", "lost"];

/// The calls a job handler answers, as labelled.
const HANDLER_CALLS: &[&str] = &["start", "stop", "notify", "on-timer"];
/// The call a job producer answers.
const PRODUCER_CALLS: &[&str] = &["plan"];

/// One plugin's metric handles.
pub(crate) struct PluginMetrics {
    names: &'static [&'static str],
    /// `[call][outcome]`, calls in the order of `names`.
    calls: Vec<[Counter; OUTCOMES.len()]>,
    call_seconds: Histogram,
    instantiate: Histogram,
    timer_lateness: Histogram,
    pub(crate) memory: Gauge,
    pub(crate) instances: Gauge,
    /// `pulse_plugin_log_lines_dropped_total`: lines over a job's log rate.
    pub(crate) log_dropped: Counter,
    pub(crate) http_denied: Counter,
    http_seconds: Histogram,
    plugin: String,
}

impl PluginMetrics {
    /// The handles of a job handler plugin.
    pub(crate) fn handler(plugin: &str) -> Self {
        Self::new(plugin, HANDLER_CALLS)
    }

    /// The handles of a job producer.
    pub(crate) fn producer(plugin: &str) -> Self {
        Self::new(plugin, PRODUCER_CALLS)
    }

    fn new(plugin: &str, names: &'static [&'static str]) -> Self {
        let calls = names
            .iter()
            .map(|call| {
                OUTCOMES.map(|outcome| {
                    metrics::counter!(
                        "pulse_plugin_calls_total",
                        "plugin" => plugin.to_owned(),
                        "call" => *call,
                        "outcome" => outcome
                    )
                })
            })
            .collect();
        Self {
            names,
            calls,
            call_seconds: metrics::histogram!("pulse_plugin_call_seconds", "plugin" => plugin.to_owned()),
            instantiate: metrics::histogram!("pulse_plugin_instantiate_seconds", "plugin" => plugin.to_owned()),
            timer_lateness: metrics::histogram!(
                "pulse_plugin_timer_lateness_seconds",
                "plugin" => plugin.to_owned()
            ),
            memory: metrics::gauge!("pulse_plugin_memory_bytes", "plugin" => plugin.to_owned()),
            instances: metrics::gauge!("pulse_plugin_instances", "plugin" => plugin.to_owned()),
            log_dropped: metrics::counter!("pulse_plugin_log_lines_dropped_total", "plugin" => plugin.to_owned()),
            http_denied: metrics::counter!("pulse_plugin_http_denied_total", "plugin" => plugin.to_owned()),
            http_seconds: metrics::histogram!("pulse_plugin_http_request_seconds", "plugin" => plugin.to_owned()),
            plugin: plugin.to_owned(),
        }
    }

    /// Counts one guest call `call` (one of the plugin's calls) that ended with
    /// `result` after `took`. Calls the host refused before reaching the
    /// guest (fenced, not running, instantiation) are not guest calls and
    /// not counted.
    pub(crate) fn call<T>(&self, call: &str, result: &Result<T, CallError>, took: std::time::Duration) {
        let outcome = match result {
            Ok(_) => 0,
            Err(CallError::Guest(_)) => 1,
            Err(CallError::Trap(_)) => 2,
            Err(CallError::Timeout(_)) => 3,
            Err(CallError::MemoryLimit { .. }) => 4,
            Err(CallError::FuelExhausted(_)) => 5,
            Err(CallError::Lost(_)) => 6,
            Err(_) => return,
        };
        if let Some(counters) = self.names.iter().position(|c| *c == call).and_then(|i| self.calls.get(i)) {
            counters[outcome].increment(1);
        }
        self.call_seconds.record(took.as_secs_f64());
    }

    /// Counts an outgoing request to `host` answered with `status` (`None`:
    /// no answer) after `took`. Its labels vary, so the handle is looked up
    /// per request (a request costs far more).
    pub(crate) fn http_request(&self, host: &str, status: Option<u16>, took: std::time::Duration) {
        let class = match status {
            Some(status @ 100..=599) => ["1xx", "2xx", "3xx", "4xx", "5xx"][usize::from(status / 100 - 1)],
            _ => "error",
        };
        metrics::counter!(
            "pulse_plugin_http_requests_total",
            "plugin" => self.plugin.clone(),
            "host" => host.to_owned(),
            "status" => class
        )
        .increment(1);
        self.http_seconds.record(took.as_secs_f64());
    }

    /// Records a timer's call beginning `late` after its due time.
    pub(crate) fn timer_late(&self, late: std::time::Duration) {
        self.timer_lateness.record(late.as_secs_f64());
    }

    pub(crate) fn instantiated(&self, took: std::time::Duration) {
        self.instantiate.record(took.as_secs_f64());
    }
}
