//! A collector for tests of traces: an [`HttpServer`] that accepts OTLP/HTTP
//! exports (`POST /v1/traces`, protobuf), and the spans read back from
//! what it received, decoded with the OpenTelemetry protocol's own types.

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

use crate::HttpServer;

/// A span as a collector received it; ids in lowercase hex.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// Its name.
    pub name: String,
    /// `SPAN_KIND_…` as a number (2 server, 3 client, 4 producer, 5
    /// consumer; 1 internal).
    pub kind: i32,
    /// Its trace.
    pub trace_id: String,
    /// Its id.
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// Its attributes, each value as text.
    pub attributes: BTreeMap<String, String>,
    /// The spans it links to: (trace id, span id).
    pub links: Vec<(String, String)>,
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// Whether its status is an error.
    pub error: bool,
}

impl Span {
    /// Attribute `name`, or `""`.
    pub fn attribute(&self, name: &str) -> &str {
        self.attributes.get(name).map_or("", String::as_str)
    }
}

/// Starts a collector on a free loopback port: its base address
/// (`http://…`) is what `[telemetry] otlp_endpoint` takes.
pub fn collector() -> HttpServer {
    let server = HttpServer::start();
    server.set("/v1/traces", b"");
    server
}

/// Every span `collector` received, in the order it received them.
///
/// # Panics
/// On an export that is not a valid `ExportTraceServiceRequest`.
pub fn spans(collector: &HttpServer) -> Vec<Span> {
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut spans = Vec::new();
    for received in collector.received().into_iter().filter(|r| r.path == "/v1/traces" && r.method == "POST")
    {
        let export =
            ExportTraceServiceRequest::decode(received.body.as_slice()).expect("an OTLP trace export");
        for resource in export.resource_spans {
            let attributes = resource.resource.map(|r| text_of(&r.attributes)).unwrap_or_default();
            let service = attributes.get("service.name").cloned().unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Span {
                        name: span.name,
                        kind: span.kind,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: text_of(&span.attributes),
                        links: span.links.iter().map(|l| (hex(&l.trace_id), hex(&l.span_id))).collect(),
                        service: service.clone(),
                        error: span.status.is_some_and(|s| s.code == 2),
                    });
                }
            }
        }
    }
    spans
}

fn text_of(attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key.clone(), value)
        })
        .collect()
}
