//! Traces: OpenTelemetry spans of one dispatch, from the client that
//! dispatched a job to the worker that starts it, its guest call and the
//! HTTP requests the guest sends, exported over OTLP/HTTP.
//!
//! The code makes its trace spans with `tracing` under one target,
//! [`TARGET`], at `TRACE` level; the layer of [`Telemetry::layer`] turns
//! those, and only those, into OpenTelemetry spans. Without `[telemetry]`
//! no layer wants them, so each costs one cached interest check: the
//! logs' own spans and filters are untouched either way.
//!
//! A trace crosses Redis as a W3C `traceparent` text ([`traceparent`],
//! [`follow`], [`link`]): the dispatch writes its span's into the job's
//! start event and record, so the worker's span (and a later start on
//! another worker) continues the dispatcher's trace, and a notification
//! carries its sender's plus the job's, so its span links to the trace
//! that started the job. `tracestate` is not carried.

mod client;
mod context;

pub use context::{TRACEPARENT, follow, header, inject, link, traceparent};

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

/// The `tracing` target of trace spans: what the exporting layer keeps.
pub const TARGET: &str = "pulse_trace";

/// Where and what to export.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The collector's OTLP/HTTP base address; spans go to
    /// `<otlp_endpoint>/v1/traces`.
    pub otlp_endpoint: String,
    /// `service.name`.
    pub service_name: String,
    /// `service.version`.
    pub service_version: String,
    /// The share of traces begun here that are kept (0.0 to 1.0); a trace
    /// begun by a caller follows the caller's choice.
    pub sample_ratio: f64,
}

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
#[error("telemetry: cannot export to {endpoint}: {reason}")]
pub struct Error {
    endpoint: String,
    reason: String,
}

/// The exporting tracer; spans are sent in batches (every 5 s, or as
/// `OTEL_BSP_SCHEDULE_DELAY` says, in ms) until [`Telemetry::shutdown`].
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Builds the exporter and tracer. Call inside a Tokio runtime: the
    /// exporter sends its requests on it.
    ///
    /// # Errors
    /// An exporter that cannot be built (a malformed endpoint).
    pub fn start(settings: &Settings) -> Result<Self, Error> {
        let endpoint = format!("{}/v1/traces", settings.otlp_endpoint.trim_end_matches('/'));
        let error = |reason: String| Error { endpoint: endpoint.clone(), reason };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint.clone())
            .with_http_client(client::Exporting::new())
            .build()
            .map_err(|e| error(e.to_string()))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name(settings.service_name.clone())
            .with_attributes([
                KeyValue::new("service.version", settings.service_version.clone()),
                KeyValue::new("process.pid", i64::from(std::process::id())),
            ])
            .build();
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio)));
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        Ok(Self { provider })
    }

    /// The `tracing` layer that makes OpenTelemetry spans of the spans of
    /// [`TARGET`] (and of nothing else).
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        let tracer = self.provider.tracer("pulse-host");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| meta.target() == TARGET))
    }

    /// Sends the spans still buffered and stops exporting.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(error)) = done {
            tracing::warn!(%error, "telemetry: the last spans could not be sent");
        }
    }
}
