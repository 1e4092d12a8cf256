//! The trace span of an API request (`POST /api/pools/{pool}/jobs`…), a
//! child of the caller's span when the request carries a W3C
//! `traceparent`: a dispatch made through the API continues the caller's
//! trace, down to the worker's start and the guest's own requests.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument as _;

/// Serves `request` (of route `method` `path`) inside its trace span.
pub(crate) async fn serve(
    method: &'static str,
    path: &'static str,
    request: Request,
    next: Next,
) -> Response {
    let span = tracing::trace_span!(
        target: pulse_telemetry::TARGET,
        "pulse",
        otel.name = format_args!("{method} {path}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = path,
        http.response.status_code = tracing::field::Empty,
    );
    if span.is_disabled() {
        return next.run(request).await;
    }
    if let Some(parent) = pulse_telemetry::header(request.headers()) {
        pulse_telemetry::follow(&span, parent);
    }
    let response = next.run(request).instrument(span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    if response.status().is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}
