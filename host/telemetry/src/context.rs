//! W3C trace context: a span's `traceparent`, and a span continued or
//! linked from one.

use std::collections::HashMap;

use opentelemetry::Context;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The header (and carrier field) of W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// The `traceparent` of `span` (`00-<trace id>-<span id>-<flags>`); none
/// when the span is not exported (no telemetry).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(TRACEPARENT)
}

/// The remote span `traceparent` names, if it is well formed.
fn remote(traceparent: &str) -> Option<Context> {
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), traceparent.to_owned())]);
    let context = TraceContextPropagator::new().extract(&carrier);
    context.span().span_context().is_valid().then_some(context)
}

/// Makes `span` a child of the remote span `traceparent` names (a span
/// of another process: the dispatcher, an HTTP client). Call before the
/// span is entered; a malformed or empty `traceparent` leaves it as is.
pub fn follow(span: &tracing::Span, traceparent: &str) {
    if span.is_disabled() || traceparent.is_empty() {
        return;
    }
    if let Some(context) = remote(traceparent) {
        let _ = span.set_parent(context);
    }
}

/// Links `span` to the remote span `traceparent` names (the trace that
/// started a job, from a later notification's span).
pub fn link(span: &tracing::Span, traceparent: &str) {
    if span.is_disabled() || traceparent.is_empty() {
        return;
    }
    if let Some(context) = remote(traceparent) {
        span.add_link(context.span().span_context().clone());
    }
}

/// Sets `traceparent` in `headers` to `span`'s, replacing what was there;
/// leaves them as they are when the span is not exported.
pub fn inject(span: &tracing::Span, headers: &mut http::HeaderMap) {
    if let Some(value) = traceparent(span).and_then(|text| http::HeaderValue::try_from(text).ok()) {
        headers.insert(TRACEPARENT, value);
    }
}

/// The `traceparent` of a request's `headers`, if any.
pub fn header(headers: &http::HeaderMap) -> Option<&str> {
    headers.get(TRACEPARENT)?.to_str().ok()
}
