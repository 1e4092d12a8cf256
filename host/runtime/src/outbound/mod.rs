//! Outgoing HTTP (`wasi:http/outgoing-handler`): what a plugin may reach.
//!
//! A plugin reaches nothing unless its allow-list names the destination
//! ([`AllowedHost`]: scheme, host or `*.`-suffix, port or any). The check
//! applies to the URI the request is sent to, built from the scheme and
//! authority the guest set; the guest cannot set a `Host` header (wasi-http
//! forbids it and writes it from the authority), so a header cannot point a
//! request elsewhere. Redirects are answers like any other: nothing follows
//! them. A request is sent only while the job that makes it may run (its
//! worker's fence is up and it still owns the job); one in flight when that
//! ends is cancelled. Each request of a job carries the job's fence in a
//! header (`pulse-fence: <pool>/<key>/<token>` by default), so the service
//! it reaches can refuse a late write of a run that lost the job. Denials answer the guest `HTTP-request-denied` (an
//! error, not a trap), and are logged and counted.
//!
//! # Layout
//! - this file: the limits, and the hook every request of an instance
//!   goes through (allow-list, fence, requests in flight, metrics).
//! - `rules`: allow-list entries, parsed and matched.
//! - `send`: the connection, TLS (webpki roots plus a plugin's CA file)
//!   and the timeouts of one request.

mod pool;
mod rules;
mod send;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tracing::Instrument as _;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

pub(crate) use pool::Connections;
pub use rules::{AllowedHost, AllowedHostError};
use send::{Bounds, FENCE_CHECK, Sent, StillRuns};
pub use send::{OutboundTls, OutboundTlsError};

use crate::metrics::PluginMetrics;
use crate::outputs::JobOutputs;

/// What a plugin may reach over HTTP, and within which limits.
///
/// Defaults: no destination allowed; `connect_timeout` 5 s (for the
/// whole connection: TCP, then TLS); `first_byte_timeout` 10 s (also
/// between two frames of the body); `max_request_bytes` 8 MiB;
/// `max_response_bytes` 4 MiB; `max_requests` 8 in flight per instance;
/// `tls` trusts the webpki roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    /// The destinations requests may go to.
    pub allowed: Vec<AllowedHost>,
    /// Longest wait for a connection: resolving the name, connecting and
    /// the TLS handshake together.
    pub connect_timeout: Duration,
    /// Longest wait for the response's head, and between two frames of its
    /// body.
    pub first_byte_timeout: Duration,
    /// Largest request body a plugin may send, in bytes: a request that
    /// declares a larger one is not sent, and one whose body streams past
    /// it is cut off; either fails with `HTTP-request-body-size`.
    pub max_request_bytes: u64,
    /// Largest response body, in bytes.
    pub max_response_bytes: u64,
    /// Requests one instance may have in flight at once.
    pub max_requests: u32,
    /// The certificate authorities HTTPS requests trust.
    pub tls: OutboundTls,
    /// The header every request of a job carries its fence in
    /// (`<pool>/<key>/<token>`, see [`crate::Fence::header_value`]); a
    /// value the guest set under that name is replaced. `None`: requests
    /// carry no fence.
    pub fence_header: Option<http::HeaderName>,
}

/// The header a job's requests carry its fence in, unless its plugin
/// names another or none.
pub const FENCE_HEADER: &str = "pulse-fence";

impl Default for Outbound {
    fn default() -> Self {
        Self {
            allowed: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(10),
            // 8 MiB: a job's payload (at most 1 MiB by default) forwarded
            // with room to spare, far below what one request could tie up
            // otherwise (an instance's whole memory, 64 MiB by default).
            max_request_bytes: 8 << 20,
            max_response_bytes: 4 << 20,
            max_requests: 8,
            tls: OutboundTls::default(),
            fence_header: Some(http::HeaderName::from_static(FENCE_HEADER)),
        }
    }
}

impl Outbound {
    /// These rules with requests carrying their job's fence in header
    /// `name`, or in none.
    ///
    /// # Errors
    /// `name` is not a valid header name.
    pub fn fenced_by(self, name: Option<&str>) -> Result<Self, http::header::InvalidHeaderName> {
        let fence_header = name.map(http::HeaderName::try_from).transpose()?;
        Ok(Self { fence_header, ..self })
    }

    /// Whether any entry allows the destination.
    pub fn allows(&self, https: bool, host: &str, port: u16) -> bool {
        self.allowed.iter().any(|entry| entry.allows(https, host, port))
    }
}

/// How an instance's requests are checked and sent.
pub(crate) struct OutboundHooks {
    rules: Arc<Outbound>,
    outputs: Arc<dyn JobOutputs>,
    /// The job whose call the instance runs now: its requests are its.
    current: String,
    /// Whether requests are fenced by their job (a producer's are not: it
    /// runs no job).
    fenced: bool,
    in_flight: Arc<AtomicU32>,
    metrics: Arc<PluginMetrics>,
    plugin: Arc<str>,
    /// The plugin's idle connections.
    connections: Arc<Connections>,
}

impl OutboundHooks {
    pub(crate) fn new(
        plugin: &str,
        (rules, connections): (Arc<Outbound>, Arc<Connections>),
        outputs: Arc<dyn JobOutputs>,
        metrics: Arc<PluginMetrics>,
        fenced: bool,
    ) -> Self {
        Self {
            rules,
            connections,
            outputs,
            current: String::new(),
            fenced,
            in_flight: Arc::default(),
            metrics,
            plugin: plugin.into(),
        }
    }

    /// Its requests go to `outputs` from now on (see
    /// [`crate::Instance::bind`]).
    pub(crate) fn bind(&mut self, outputs: Arc<dyn JobOutputs>) {
        self.outputs = outputs;
    }

    /// A call of job `key` begins: its requests are fenced by that job.
    pub(crate) fn enter(&mut self, key: &str) {
        key.clone_into(&mut self.current);
    }

    /// The job whose call runs (or ran last).
    pub(crate) fn current(&self) -> &str {
        &self.current
    }
}

type Answer = Result<(http::Response<WasiBody>, Sent), HttpError>;

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Sent,
    ) -> Box<dyn Future<Output = Answer> + Send> {
        drop(fut);
        let key = self.current.clone();
        let fenced = self.fenced;
        let uri = request.uri();
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let host = uri.host().unwrap_or_default().to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let destination = format!("{}://{host}:{port}", if https { "https" } else { "http" });
        let denied = |why: &'static str| {
            tracing::warn!(plugin = %self.plugin, job.key = %key, %destination, "outgoing HTTP request denied: {why}");
            self.metrics.http_denied.increment(1);
            Box::new(std::future::ready(Err(HttpError::HttpRequestDenied)))
                as Box<dyn Future<Output = Answer> + Send>
        };
        if !self.rules.allows(https, &host, port) {
            return denied("the destination is not in allowed_outbound_hosts");
        }
        if fenced && !self.outputs.may_run(&key) {
            return denied("the job no longer runs here");
        }
        if self.in_flight.load(Ordering::Relaxed) >= self.rules.max_requests {
            return denied("the instance has limits.http_requests requests in flight");
        }
        if fenced && let Some(name) = &self.rules.fence_header {
            // Replaces whatever the guest set under the name: a job cannot
            // send another run's fence.
            let fence = self.outputs.fence(&key).map(|fence| fence.header_value());
            match fence.map(http::HeaderValue::try_from) {
                Some(Ok(value)) => {
                    request.headers_mut().insert(name.clone(), value);
                }
                _ => {
                    request.headers_mut().remove(name);
                }
            }
        }
        let traced = client_span(&request);
        pulse_telemetry::inject(&traced, request.headers_mut());
        let rules = self.rules.clone();
        let connections = self.connections.clone();
        // The fence of a request in flight, from sending until its body is
        // read: told and counted once when it falls.
        let still_runs = fenced.then(|| {
            let (outputs, key, destination) = (self.outputs.clone(), key.clone(), destination.clone());
            let metrics = self.metrics.clone();
            let told = std::sync::atomic::AtomicBool::new(false);
            Arc::new(move || {
                let runs = outputs.may_run(&key);
                if !runs && !told.swap(true, Ordering::Relaxed) {
                    tracing::warn!(job.key = %key, %destination, "outgoing HTTP request cancelled: the job no longer runs here");
                    metrics.http_denied.increment(1);
                }
                runs
            }) as StillRuns
        });
        let waiting = still_runs.clone();
        let bounds = Bounds {
            connect: shorter(options.and_then(|o| o.connect_timeout), rules.connect_timeout),
            first_byte: shorter(options.and_then(|o| o.first_byte_timeout), rules.first_byte_timeout),
            between_bytes: shorter(options.and_then(|o| o.between_bytes_timeout), rules.first_byte_timeout),
            request_bytes: rules.max_request_bytes,
            body_bytes: rules.max_response_bytes,
            still_runs,
        };
        let guard = InFlight::enter(&self.in_flight);
        let metrics = self.metrics.clone();
        let started = std::time::Instant::now();
        Box::new(async move {
            let _guard = guard;
            // Until the response's head: the body checks for itself.
            let fence = async {
                let Some(still_runs) = waiting else { return std::future::pending().await };
                loop {
                    tokio::time::sleep(FENCE_CHECK).await;
                    if !still_runs() {
                        return;
                    }
                }
            };
            let sent = tokio::select! {
                sent = send::send(request, bounds, &rules.tls, &connections).instrument(traced.clone()) => sent,
                () = fence => return Err(HttpError::HttpRequestDenied),
            };
            traced_response(&traced, &sent);
            metrics.http_request(
                &host,
                sent.as_ref().map(|(response, _)| response.status().as_u16()).ok(),
                started.elapsed(),
            );
            sent
        })
    }
}

/// The trace span of an outgoing request, a child of the guest call's
/// (disabled unless traces are exported): the request carries its
/// `traceparent`, so the service called continues the job's trace.
fn client_span(request: &http::Request<WasiBody>) -> tracing::Span {
    let span = tracing::trace_span!(
        target: pulse_telemetry::TARGET,
        "pulse",
        otel.name = %request.method(),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        http.request.method = %request.method(),
        url.full = %request.uri(),
        server.address = request.uri().host().unwrap_or_default(),
        http.response.status_code = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    );
    span
}

/// Records how an outgoing request ended on its trace span.
fn traced_response(span: &tracing::Span, sent: &Answer) {
    if span.is_disabled() {
        return;
    }
    match sent {
        Ok((response, _)) => {
            span.record("http.response.status_code", response.status().as_u16());
            if response.status().is_server_error() {
                span.record("otel.status_code", "ERROR");
            }
        }
        Err(error) => {
            span.record("otel.status_code", "ERROR").record("error.type", format!("{error:?}"));
        }
    }
}

/// The shorter of what the guest asked (if anything) and the limit.
fn shorter(asked: Option<Duration>, limit: Duration) -> Duration {
    asked.map_or(limit, |asked| asked.min(limit))
}

/// Counts an instance's requests in flight.
struct InFlight(Arc<AtomicU32>);

impl InFlight {
    fn enter(counter: &Arc<AtomicU32>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
