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
//! ends is cancelled. Denials answer the guest `HTTP-request-denied` (an
//! error, not a trap), and are logged and counted.

use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::metrics::PluginMetrics;
use crate::outputs::JobOutputs;

/// What a plugin may reach over HTTP, and within which limits.
///
/// Defaults: no destination allowed; `connect_timeout` 5 s;
/// `first_byte_timeout` 10 s (also between two frames of the body);
/// `max_response_bytes` 4 MiB; `max_requests` 8 in flight per instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbound {
    /// The destinations requests may go to.
    pub allowed: Vec<AllowedHost>,
    /// Longest wait for a connection.
    pub connect_timeout: Duration,
    /// Longest wait for the response's head, and between two frames of its
    /// body.
    pub first_byte_timeout: Duration,
    /// Largest response body, in bytes.
    pub max_response_bytes: u64,
    /// Requests one instance may have in flight at once.
    pub max_requests: u32,
}

impl Default for Outbound {
    fn default() -> Self {
        Self {
            allowed: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(10),
            max_response_bytes: 4 << 20,
            max_requests: 8,
        }
    }
}

/// One allowed destination: `http://host`, `https://host:port`,
/// `https://*.example.com:*`. Without a port, the scheme's own (80 or
/// 443); `*` is any port. A host starting with `*.` matches every name
/// below that suffix (not the suffix itself). Names compare without case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    https: bool,
    host: HostPattern,
    /// `None`: any port.
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// Matches names ending in `.` + this.
    Below(String),
}

/// Why an allow-list entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{entry:?} {why}: allowed are \"http://HOST\", \"https://HOST\", with an optional \":PORT\" or \":*\", where HOST is a name, an IP address ([…] for IPv6) or \"*.\" and a name"
)]
pub struct AllowedHostError {
    entry: String,
    why: &'static str,
}

impl FromStr for AllowedHost {
    type Err = AllowedHostError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        let refuse = |why| AllowedHostError { entry: entry.to_owned(), why };
        let (https, rest) = if let Some(rest) = entry.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = entry.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(refuse("has no http:// or https:// scheme"));
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(refuse("names more than a scheme, a host and a port"));
        }
        let (host, port) = match rest.rsplit_once(':') {
            // An IPv6 address without a port: its colons are inside […].
            Some((host, port)) if !port.contains(']') => (host, Some(port)),
            _ => (rest, None),
        };
        let port = match port {
            None => Some(if https { 443 } else { 80 }),
            Some("*") => None,
            Some(port) => {
                Some(port.parse::<u16>().map_err(|_| refuse("has a port that is not 0 to 65535 or *"))?)
            }
        };
        let host = host.to_ascii_lowercase();
        let valid = |name: &str| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '[' | ']' | ':'))
        };
        let host = match host.strip_prefix("*.") {
            Some(suffix) if valid(suffix) && !suffix.contains(['[', ':', '*']) => {
                HostPattern::Below(suffix.to_owned())
            }
            Some(_) => return Err(refuse("has an invalid name after \"*.\"")),
            None if valid(&host) => HostPattern::Exact(host),
            None => return Err(refuse("has an invalid host")),
        };
        Ok(Self { https, host, port })
    }
}

impl AllowedHost {
    /// Whether a request to `host`:`port` over HTTPS (`https`) or HTTP is
    /// allowed by this entry.
    pub fn allows(&self, https: bool, host: &str, port: u16) -> bool {
        let host = host.to_ascii_lowercase();
        let host_matches = match &self.host {
            HostPattern::Exact(name) => *name == host,
            HostPattern::Below(suffix) => {
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix.as_str())
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
        };
        self.https == https && host_matches && self.port.is_none_or(|allowed| allowed == port)
    }
}

impl Outbound {
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
}

impl OutboundHooks {
    pub(crate) fn new(
        plugin: &str,
        rules: Arc<Outbound>,
        outputs: Arc<dyn JobOutputs>,
        metrics: Arc<PluginMetrics>,
        fenced: bool,
    ) -> Self {
        Self {
            rules,
            outputs,
            current: String::new(),
            fenced,
            in_flight: Arc::default(),
            metrics,
            plugin: plugin.into(),
        }
    }

    /// A call of job `key` begins: its requests are fenced by that job.
    pub(crate) fn enter(&mut self, key: &str) {
        key.clone_into(&mut self.current);
    }
}

type Sent = Box<dyn Future<Output = Result<(), HttpError>> + Send>;
type Answer = Result<(http::Response<WasiBody>, Sent), HttpError>;

/// How often a request in flight checks that its job may still run.
const FENCE_CHECK: Duration = Duration::from_millis(50);

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
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
        let rules = self.rules.clone();
        let options = RequestOptions {
            connect_timeout: Some(shorter(options.and_then(|o| o.connect_timeout), rules.connect_timeout)),
            first_byte_timeout: Some(shorter(
                options.and_then(|o| o.first_byte_timeout),
                rules.first_byte_timeout,
            )),
            between_bytes_timeout: Some(shorter(
                options.and_then(|o| o.between_bytes_timeout),
                rules.first_byte_timeout,
            )),
        };
        let guard = InFlight::enter(&self.in_flight);
        let outputs = self.outputs.clone();
        let metrics = self.metrics.clone();
        let started = std::time::Instant::now();
        Box::new(async move {
            let _guard = guard;
            let fence = async {
                if !fenced {
                    return std::future::pending().await;
                }
                loop {
                    tokio::time::sleep(FENCE_CHECK).await;
                    if !outputs.may_run(&key) {
                        return;
                    }
                }
            };
            let sent = tokio::select! {
                sent = wasmtime_wasi_http::default_send_request(request, Some(options)) => sent,
                () = fence => {
                    tracing::warn!(job.key = %key, %destination, "outgoing HTTP request cancelled: the job no longer runs here");
                    metrics.http_denied.increment(1);
                    return Err(HttpError::HttpRequestDenied);
                }
            };
            metrics.http_request(
                &host,
                sent.as_ref().map(|(response, _)| response.status().as_u16()).ok(),
                started.elapsed(),
            );
            let (response, io) = sent?;
            let limit = rules.max_response_bytes;
            let response = response.map(|body| limited(body, limit));
            Ok((response, Box::new(io) as Sent))
        })
    }
}

/// The shorter of what the guest asked (if anything) and the limit.
fn shorter(asked: Option<Duration>, limit: Duration) -> Duration {
    asked.map_or(limit, |asked| asked.min(limit))
}

/// A response body that ends with `HTTP-response-body-size` once it
/// passes `limit` bytes.
fn limited(
    body: impl http_body::Body<Data = Bytes, Error = HttpError> + Send + 'static,
    limit: u64,
) -> WasiBody {
    use http_body_util::BodyExt as _;
    Limited { inner: body.boxed_unsync(), left: limit, limit }.boxed_unsync()
}

struct Limited {
    inner: WasiBody,
    left: u64,
    limit: u64,
}

impl http_body::Body for Limited {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        let size = frame.data_ref().map_or(0, |data| data.len() as u64);
        if size > self.left {
            self.left = 0;
            return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(self.limit)))));
        }
        self.left -= size;
        Poll::Ready(Some(Ok(frame)))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(entry: &str) -> AllowedHost {
        entry.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn an_entry_allows_its_scheme_host_and_port_only() {
        let exact = rule("https://api.example.com");
        assert!(exact.allows(true, "api.example.com", 443));
        assert!(exact.allows(true, "API.Example.com", 443), "names compare without case");
        assert!(!exact.allows(false, "api.example.com", 443), "another scheme");
        assert!(!exact.allows(true, "api.example.com", 8443), "another port");
        assert!(!exact.allows(true, "example.com", 443), "another host");
        assert!(!exact.allows(true, "api.example.com.evil.net", 443), "a longer name");
        let port = rule("http://127.0.0.1:8080");
        assert!(port.allows(false, "127.0.0.1", 8080));
        assert!(!port.allows(false, "127.0.0.1", 80));
        let any_port = rule("http://localhost:*");
        assert!(any_port.allows(false, "localhost", 1) && any_port.allows(false, "localhost", 65535));
        let ipv6 = rule("http://[::1]:9000");
        assert!(ipv6.allows(false, "[::1]", 9000));
    }

    #[test]
    fn a_wildcard_allows_the_names_below_it_not_itself() {
        let below = rule("https://*.example.com:443");
        assert!(below.allows(true, "a.example.com", 443));
        assert!(below.allows(true, "a.b.example.com", 443));
        assert!(!below.allows(true, "example.com", 443), "the suffix itself");
        assert!(!below.allows(true, "badexample.com", 443), "a name that only ends alike");
        assert!(!below.allows(true, "a.example.com", 80), "another port");
    }

    #[test]
    fn malformed_entries_are_refused_with_what_is_allowed() {
        for entry in [
            "api.example.com",
            "ftp://example.com",
            "https://example.com/path",
            "https://user@example.com",
            "https://example.com:99999",
            "https://*.",
            "https://a.*.example.com",
            "https://",
        ] {
            let error = entry.parse::<AllowedHost>().unwrap_err().to_string();
            assert!(error.contains(entry) && error.contains("allowed are"), "{entry}: {error}");
        }
    }
}
