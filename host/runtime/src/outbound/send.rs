//! Sending an allowed request: over a kept connection of the plugin to
//! the same destination, or a new one (through rustls for `https`, with
//! HTTP/2 where the server offers it by ALPN, HTTP/1.1 otherwise), each
//! step within its timeout, and a body within its size.
//!
//! The same steps as wasmtime-wasi-http's `default_send_request`, with the
//! TLS configuration built once per plugin rather than per request, and
//! with the certificate authorities of the plugin's `outbound_ca_file`
//! trusted beside the webpki roots.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error as HttpError, WasiBody};

use super::pool::{Connections, Destination, Sender};

/// The certificate authorities a plugin's HTTPS requests trust: the webpki
/// roots, and those of its `outbound_ca_file` if it has one.
#[derive(Clone)]
pub struct OutboundTls {
    config: Arc<rustls::ClientConfig>,
    ca_file: Option<PathBuf>,
}

/// Why a CA file was refused: names the file, what was wrong, and what is
/// expected.
#[derive(Debug, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct OutboundTlsError {
    path: PathBuf,
    why: String,
}

const EXPECTED: &str = "expected PEM certificates (\"-----BEGIN CERTIFICATE-----\")";

/// The webpki roots alone, built once for every plugin without a CA file.
static WEBPKI: LazyLock<Arc<rustls::ClientConfig>> = LazyLock::new(|| client_config(webpki_roots()));

fn webpki_roots() -> rustls::RootCertStore {
    rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() }
}

fn client_config(roots: rustls::RootCertStore) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    // HTTP/2 where the server offers it: one connection then carries
    // every request of the plugin to that server at once.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

impl Default for OutboundTls {
    fn default() -> Self {
        Self { config: WEBPKI.clone(), ca_file: None }
    }
}

impl OutboundTls {
    /// The webpki roots and every certificate of the PEM file at `path`.
    pub fn with_ca_file(path: &Path) -> Result<Self, OutboundTlsError> {
        let refuse = |why: String| OutboundTlsError { path: path.to_owned(), why };
        let certificates = CertificateDer::pem_file_iter(path)
            .map_err(|error| refuse(format!("{error}: {EXPECTED}")))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| refuse(format!("{error}: {EXPECTED}")))?;
        if certificates.is_empty() {
            return Err(refuse(format!("holds no certificate: {EXPECTED}")));
        }
        let mut roots = webpki_roots();
        for (index, certificate) in certificates.into_iter().enumerate() {
            roots.add(certificate).map_err(|error| {
                refuse(format!("certificate {} is not a usable authority: {error}", index + 1))
            })?;
        }
        Ok(Self { config: client_config(roots), ca_file: Some(path.to_owned()) })
    }
}

impl PartialEq for OutboundTls {
    fn eq(&self, other: &Self) -> bool {
        self.ca_file == other.ca_file
    }
}

impl Eq for OutboundTls {}

impl std::fmt::Debug for OutboundTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundTls").field("ca_file", &self.ca_file).finish_non_exhaustive()
    }
}

/// Whether the job that made a request may still run (see
/// `JobOutputs::may_run`).
pub(super) type StillRuns = Arc<dyn Fn() -> bool + Send + Sync>;

/// How often a request in flight (waiting for its answer, or reading its
/// body) checks that its job may still run.
pub(super) const FENCE_CHECK: Duration = Duration::from_millis(50);

/// The timeouts of one request, the sizes of its body and its response's
/// body, and the fence its body is read under.
pub(super) struct Bounds {
    /// For the whole connection: name resolution, TCP and TLS together.
    pub connect: Duration,
    pub first_byte: Duration,
    pub between_bytes: Duration,
    /// The request's body, at most.
    pub request_bytes: u64,
    /// The response's body, at most.
    pub body_bytes: u64,
    /// `None`: not fenced (a producer's request).
    pub still_runs: Option<StillRuns>,
}

pub(super) type Sent = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

trait Io: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Io for T {}

/// A request's body as it is sent: the guest's, within its size.
pub(crate) type RequestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, HttpError>;

/// Sends `request` to the authority of its URI (already checked against
/// the allow-list) over an idle connection of `connections` or a new one,
/// and returns the response's head with its body; the connection goes
/// back to `connections` once that body is read. A request whose body is
/// declared larger than `bounds.request_bytes` is not sent; one whose
/// body streams past it is cut off.
pub(super) async fn send(
    request: http::Request<WasiBody>,
    bounds: Bounds,
    tls: &OutboundTls,
    connections: &Arc<Connections>,
) -> Result<(http::Response<WasiBody>, Sent), HttpError> {
    let limit = bounds.request_bytes;
    let too_large = || HttpError::HttpRequestBodySize(Some(limit));
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|length| length.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit)
        || http_body::Body::size_hint(request.body()).lower() > limit
    {
        return Err(too_large());
    }
    let uri = request.uri().clone();
    let authority = uri.authority().ok_or(HttpError::HttpRequestUriInvalid)?;
    let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
    let host = authority.host().to_owned();
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    // An HTTP/1.1 request line names the path only (scheme and authority
    // are for a proxy); HTTP/2 sends both as pseudo-headers.
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let origin_form =
        http::Uri::builder().path_and_query(path).build().map_err(|_| HttpError::HttpRequestUriInvalid)?;
    let to = Destination { https, host, port };
    let (mut sender, mut reused) = match connections.take(&to) {
        Some(idle) => (idle, true),
        None => (connect(&to, tls, bounds.connect).await?, false),
    };
    let mut again = if reused { Again::of(&request, matches!(sender, Sender::Http1(_))) } else { None };
    let ended_empty = again.as_ref().map(|again| again.ended_empty.clone());
    let mut request =
        request.map(|body| LimitedBody { body, left: limit, limit, ended_empty }.boxed_unsync());
    loop {
        // Checked again just before the request is written: connecting may
        // have spanned a freeze of the process after which the job runs
        // elsewhere, and on resuming the write could beat the fence's timer.
        if let Some(still_runs) = &bounds.still_runs
            && !still_runs()
        {
            return Err(HttpError::HttpRequestDenied);
        }
        *request.uri_mut() = match sender {
            Sender::Http1(_) => origin_form.clone(),
            Sender::Http2(_) => uri.clone(),
        };
        let sent = tokio::time::timeout(bounds.first_byte, try_send(&mut sender, request))
            .await
            .map_err(|_| HttpError::ConnectionReadTimeout)?;
        match sent {
            Ok(response) => {
                connections.keep(to, sender);
                let response = response.map(|incoming| Bounded::new(incoming, bounds).boxed_unsync());
                // The connection runs on a task of its own (it outlives
                // the request when it is kept): nothing left to drive.
                let rest: Sent = Box::new(std::future::ready(Ok(())));
                return Ok((response, rest));
            }
            Err(mut error) => match error.take_message() {
                // Not written on a kept connection: it was closed while it
                // waited (the server's keep-alive ran out). Again, once,
                // on a new one.
                Some(unsent) if reused => {
                    request = unsent;
                    sender = connect(&to, tls, bounds.connect).await?;
                    reused = false;
                }
                // Written on a kept connection that the server closed as
                // the request arrived: an idempotent request with an
                // empty body is made again from its head ([`Again`]).
                None if reused && again.as_ref().is_some_and(|again| again.applies(error.error())) => {
                    request = again.take().expect("checked just above").request();
                    sender = connect(&to, tls, bounds.connect).await?;
                    reused = false;
                }
                _ => return Err(request_error(error.into_error(), limit)),
            },
        }
    }
}

/// The head of a request sent on a kept connection, kept so that the
/// request can be made again if the server closes that connection under
/// it.
///
/// A server closes an idle connection when its keep-alive runs out; a
/// request written in the moment before the client saw the close fails
/// without an answer (the server never read it, or read it and closed).
/// As browsers and Go's client do, such a request is sent once more on a
/// new connection, but only when sending it twice cannot do anything
/// twice: its method is idempotent (RFC 9110 §9.2.2: `GET`, `HEAD`,
/// `OPTIONS`, `TRACE`, `PUT`, `DELETE`) or it carries an
/// `Idempotency-Key`, and its body ended without a byte, so the head alone
/// makes it again. A `POST` (a write to a fenced service, say) fails
/// instead, and its plugin decides.
struct Again {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    /// Set once the body ended without a byte (at once for a body known
    /// to be empty): until then the request cannot be made again.
    ended_empty: Arc<AtomicBool>,
}

impl Again {
    /// The head of `request`, to be sent over HTTP/1.1 (`http1`) or
    /// HTTP/2, if it is one that may be sent twice.
    fn of(request: &http::Request<WasiBody>, http1: bool) -> Option<Self> {
        use http::{Method, header};
        let method = request.method();
        let headers = request.headers();
        let idempotent =
            [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE, Method::PUT, Method::DELETE]
                .contains(method)
                || headers.contains_key("idempotency-key");
        let body = request.body();
        // Over HTTP/1.1 hyper sends a `GET` or `HEAD` whose length neither
        // a header nor the body declares without a body at all.
        let bodiless = http1
            && (method == Method::GET || method == Method::HEAD)
            && !headers.contains_key(header::CONTENT_LENGTH)
            && !headers.contains_key(header::TRANSFER_ENCODING)
            && http_body::Body::size_hint(body).exact().is_none_or(|length| length == 0);
        idempotent.then(|| Self {
            method: method.clone(),
            uri: request.uri().clone(),
            version: request.version(),
            headers: headers.clone(),
            ended_empty: Arc::new(AtomicBool::new(bodiless || http_body::Body::is_end_stream(body))),
        })
    }

    /// Whether `error`, of this request written on a kept connection, is
    /// the connection closing under it, and the request can be made again.
    fn applies(&self, error: &hyper::Error) -> bool {
        use std::io::ErrorKind;
        let closed = error.is_incomplete_message()
            || std::error::Error::source(error)
                .and_then(|source| source.downcast_ref::<std::io::Error>())
                .is_some_and(|error| {
                    matches!(
                        error.kind(),
                        ErrorKind::ConnectionReset
                            | ErrorKind::ConnectionAborted
                            | ErrorKind::BrokenPipe
                            | ErrorKind::UnexpectedEof
                    )
                });
        closed && self.ended_empty.load(Ordering::Acquire)
    }

    /// The request again, with an empty body.
    fn request(self) -> http::Request<RequestBody> {
        let mut request = http::Request::new(empty_body());
        *request.method_mut() = self.method;
        *request.uri_mut() = self.uri;
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers;
        request
    }
}

/// A body without a byte.
fn empty_body() -> RequestBody {
    http_body_util::Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Sends `request` on `sender`'s connection; hands it back if it was not
/// written.
async fn try_send(
    sender: &mut Sender,
    request: http::Request<RequestBody>,
) -> Result<
    http::Response<hyper::body::Incoming>,
    hyper::client::conn::TrySendError<http::Request<RequestBody>>,
> {
    match sender {
        Sender::Http1(sender) => sender.try_send_request(request).await,
        Sender::Http2(sender) => sender.try_send_request(request).await,
    }
}

/// A new connection to `to`: name resolution, TCP and TLS within one
/// `timeout`, then the HTTP/2 handshake if TLS agreed on it, the HTTP/1.1
/// one otherwise; the connection is driven on a task of its own until it
/// closes.
async fn connect(to: &Destination, tls: &OutboundTls, timeout: Duration) -> Result<Sender, HttpError> {
    let Destination { https, host, port } = to;
    // An IPv6 address keeps its brackets in the URI, not in the name.
    let bare = host.trim_start_matches('[').trim_end_matches(']').to_owned();
    // One deadline for every step of connecting, so that a slow TCP
    // connection leaves the TLS handshake only what remains of it.
    let deadline = tokio::time::Instant::now() + timeout;
    let tcp = match tokio::time::timeout_at(deadline, TcpStream::connect((bare.as_str(), *port))).await {
        Ok(tcp) => tcp.map_err(HttpError::Connect)?,
        Err(_) => return Err(HttpError::ConnectionTimeout),
    };
    let _ = tcp.set_nodelay(true);
    let (stream, http2): (Box<dyn Io>, bool) = if *https {
        let name = match bare.parse::<std::net::IpAddr>() {
            Ok(ip) => ServerName::from(ip),
            Err(_) => ServerName::try_from(bare).map_err(|_| HttpError::HttpRequestUriInvalid)?,
        };
        let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
        match tokio::time::timeout_at(deadline, connector.connect(name, tcp)).await {
            Ok(Ok(stream)) => {
                let http2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                (Box::new(stream), http2)
            }
            Ok(Err(error)) => {
                tracing::warn!(%host, port, error = %error, "TLS handshake of an outgoing request failed");
                return Err(tls_error(&error));
            }
            Err(_) => return Err(HttpError::ConnectionTimeout),
        }
    } else {
        (Box::new(tcp), false)
    };
    let io = TokioIo::new(stream);
    if http2 {
        let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new()).handshake(io);
        let (sender, connection) = tokio::time::timeout_at(deadline, handshake)
            .await
            .map_err(|_| HttpError::ConnectionTimeout)??;
        tokio::spawn(drive(connection));
        Ok(Sender::Http2(sender))
    } else {
        let handshake = hyper::client::conn::http1::Builder::new().handshake(io);
        let (sender, connection) = tokio::time::timeout_at(deadline, handshake)
            .await
            .map_err(|_| HttpError::ConnectionTimeout)??;
        tokio::spawn(drive(connection));
        Ok(Sender::Http1(sender))
    }
}

/// Drives an outgoing connection until it closes.
async fn drive(connection: impl Future<Output = hyper::Result<()>>) {
    if let Err(error) = connection.await {
        tracing::debug!(error = %error, "an outgoing connection ended with an error");
    }
}

/// The wasi-http error of a request that failed while it was sent:
/// `HTTP-request-body-size` when its body passed the limit ([`LimitedBody`]),
/// otherwise what hyper says.
fn request_error(error: hyper::Error, limit: u64) -> HttpError {
    let source = std::error::Error::source(&error).and_then(|source| source.downcast_ref::<HttpError>());
    match source {
        Some(HttpError::HttpRequestBodySize(_)) => HttpError::HttpRequestBodySize(Some(limit)),
        _ => HttpError::from(error),
    }
}

/// A request body that fails with `HTTP-request-body-size` once it passes
/// `limit` bytes; hyper then abandons the request and closes its
/// connection, so the server never sees the body's end.
struct LimitedBody {
    body: WasiBody,
    left: u64,
    limit: u64,
    /// Where a request that may be sent again ([`Again`]) learns that
    /// its body ended without a byte; dropped once a byte or trailers
    /// went out.
    ended_empty: Option<Arc<AtomicBool>>,
}

impl http_body::Body for LimitedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        match &frame {
            Some(Ok(frame)) => {
                let size = frame.data_ref().map_or(0, |data| data.len() as u64);
                if size > self.left {
                    self.left = 0;
                    return Poll::Ready(Some(Err(HttpError::HttpRequestBodySize(Some(self.limit)))));
                }
                self.left -= size;
                if size > 0 || frame.is_trailers() {
                    self.ended_empty = None;
                }
            }
            None => {
                if let Some(ended_empty) = &self.ended_empty {
                    ended_empty.store(true, Ordering::Release);
                }
            }
            Some(Err(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.body)
    }
}

/// The wasi-http error of a failed TLS handshake: an untrusted or
/// invalid certificate, an alert from the server, or another protocol
/// error.
fn tls_error(error: &std::io::Error) -> HttpError {
    match error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(_)) => HttpError::TlsCertificateError,
        Some(rustls::Error::AlertReceived(alert)) => HttpError::TlsAlertReceived {
            alert_id: Some(u8::from(*alert)),
            alert_message: Some(format!("{alert:?}")),
        },
        _ => HttpError::TlsProtocolError,
    }
}

/// A response body that fails with `connection-read-timeout` when no
/// frame arrives for `between_bytes`, with `HTTP-response-body-size` once
/// it passes `body_bytes`, and with `HTTP-request-denied` once its job may
/// no longer run (checked before each frame is handed on, and every
/// [`FENCE_CHECK`] while one is awaited): a response still arriving when
/// the fence falls is cut off, its connection closed.
struct Bounded {
    incoming: hyper::body::Incoming,
    timeout: tokio::time::Interval,
    left: u64,
    limit: u64,
    fence: Option<(StillRuns, tokio::time::Interval)>,
}

impl Bounded {
    fn new(incoming: hyper::body::Incoming, bounds: Bounds) -> Self {
        // (A zero period would make the interval panic.)
        let mut timeout = tokio::time::interval(bounds.between_bytes.max(Duration::from_nanos(1)));
        timeout.reset();
        let fence = bounds.still_runs.map(|still_runs| (still_runs, tokio::time::interval(FENCE_CHECK)));
        Self { incoming, timeout, left: bounds.body_bytes, limit: bounds.body_bytes, fence }
    }

    /// Whether the job may still run; wakes the reader at the next check.
    fn still_runs(&mut self, cx: &mut Context<'_>) -> bool {
        let Some((still_runs, checks)) = &mut self.fence else { return true };
        while checks.poll_tick(cx).is_ready() {}
        still_runs()
    }
}

impl http_body::Body for Bounded {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        if !self.still_runs(cx) {
            return Poll::Ready(Some(Err(HttpError::HttpRequestDenied)));
        }
        let frame = match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(error))) => {
                return Poll::Ready(Some(Err(if error.is_timeout() {
                    HttpError::HttpResponseTimeout
                } else {
                    HttpError::from(error)
                })));
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                ready!(self.timeout.poll_tick(cx));
                return Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout)));
            }
        };
        self.timeout.reset();
        let size = frame.data_ref().map_or(0, |data| data.len() as u64);
        if size > self.left {
            self.left = 0;
            return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(self.limit)))));
        }
        self.left -= size;
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.incoming)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.incoming)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of `n` frames of 1 KiB whose size is not known in advance
    /// (sent chunked).
    struct Frames(usize);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = HttpError;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
            if self.0 == 0 {
                return Poll::Ready(None);
            }
            self.0 -= 1;
            Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(vec![b'x'; 1024])))))
        }
    }

    fn bounds(request_bytes: u64) -> Bounds {
        Bounds {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(5),
            between_bytes: Duration::from_secs(5),
            request_bytes,
            body_bytes: 1 << 20,
            still_runs: None,
        }
    }

    fn post(address: std::net::SocketAddr, body: WasiBody, length: Option<u64>) -> http::Request<WasiBody> {
        let mut request = http::Request::post(format!("http://{address}/"));
        if let Some(length) = length {
            request = request.header(http::header::CONTENT_LENGTH, length);
        }
        request.body(body).expect("a valid request")
    }

    #[tokio::test]
    async fn a_body_streamed_past_the_limit_is_cut_off_with_the_body_size_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        // Reads the connection until the client closes it.
        let server = async {
            let (mut connection, _) = listener.accept().await.unwrap();
            let mut received = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut connection, &mut received).await;
            received.len()
        };
        let request = post(address, Frames(5).boxed_unsync(), None);
        let tls = OutboundTls::default();
        let connections = Arc::default();
        let (sent, received) = tokio::join!(send(request, bounds(3000), &tls, &connections), server);
        assert!(
            matches!(sent, Err(HttpError::HttpRequestBodySize(Some(3000)))),
            "{:?}",
            sent.err().map(|e| e.to_string())
        );
        assert!(received < 5 * 1024, "the whole body reached the server: {received} bytes");
    }

    /// A server whose keep-alive runs out as a request arrives: it
    /// answers the first request of each connection (`ok`, keeping the
    /// connection), and reads the second and closes the connection
    /// without an answer. Lists each request it read as its connection's
    /// number and its request line.
    async fn closing_server() -> (std::net::SocketAddr, Arc<std::sync::Mutex<Vec<(usize, String)>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let read = Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = read.clone();
        tokio::spawn(async move {
            for number in 0.. {
                let (connection, _) = listener.accept().await.unwrap();
                let log = log.clone();
                tokio::spawn(async move {
                    let mut connection = tokio::io::BufReader::new(connection);
                    for answered in [true, false] {
                        let Some(line) = read_request(&mut connection).await else { return };
                        log.lock().unwrap().push((number, line));
                        if answered {
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            tokio::io::AsyncWriteExt::write_all(&mut connection, answer).await.unwrap();
                        }
                    }
                });
            }
        });
        (address, read)
    }

    /// Reads a request's head and its (chunked or absent) body; returns
    /// its request line, or `None` when the connection closed first.
    async fn read_request(connection: &mut tokio::io::BufReader<TcpStream>) -> Option<String> {
        use tokio::io::AsyncBufReadExt as _;
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if connection.read_line(&mut line).await.ok()? == 0 {
                return None;
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_owned());
        }
        if head.iter().any(|line| line.eq_ignore_ascii_case("transfer-encoding: chunked")) {
            // Up to the empty line after the last chunk (the bodies here
            // hold no empty line of their own).
            let mut end = String::new();
            while end != "\r\n" {
                end.clear();
                connection.read_line(&mut end).await.ok()?;
            }
        }
        head.into_iter().next()
    }

    fn request(
        method: &str,
        address: std::net::SocketAddr,
        path: &str,
        body: WasiBody,
    ) -> http::Request<WasiBody> {
        http::Request::builder().method(method).uri(format!("http://{address}{path}")).body(body).unwrap()
    }

    /// Sends `request`, reads its answer's body, and waits until its
    /// connection is kept for the next request.
    async fn answered(request: http::Request<WasiBody>, connections: &Arc<Connections>) -> String {
        let (response, _) = send(request, bounds(1024), &OutboundTls::default(), connections).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        tokio::time::timeout(Duration::from_secs(10), async {
            while connections.idle() == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the connection kept within 10 s");
        String::from_utf8_lossy(&body).into_owned()
    }

    #[tokio::test]
    async fn an_idempotent_request_whose_kept_connection_the_server_closed_under_it_is_sent_again_on_a_new_one()
     {
        let (address, read) = closing_server().await;
        let connections = Arc::default();
        assert_eq!(answered(request("GET", address, "/first", empty_body()), &connections).await, "ok");
        // Each request is its kept connection's second: the server reads
        // it and closes, and it is answered on the next connection. Their
        // bodies: one that ends without a byte once read (as a guest's
        // finished empty body does; sent chunked, but a `GET` goes without
        // one), and one known to be empty.
        let requests =
            [("DELETE", Frames(0).boxed_unsync()), ("GET", Frames(0).boxed_unsync()), ("GET", empty_body())];
        for (number, (method, body)) in requests.into_iter().enumerate() {
            let again = request(method, address, &format!("/again/{number}"), body);
            assert_eq!(answered(again, &connections).await, "ok", "sent again on a new connection");
        }
        let read = read.lock().unwrap().clone();
        let expected = [
            (0, "GET /first HTTP/1.1"),
            (0, "DELETE /again/0 HTTP/1.1"),
            (1, "DELETE /again/0 HTTP/1.1"),
            (1, "GET /again/1 HTTP/1.1"),
            (2, "GET /again/1 HTTP/1.1"),
            (2, "GET /again/2 HTTP/1.1"),
            (3, "GET /again/2 HTTP/1.1"),
        ];
        assert_eq!(read, expected.map(|(number, line)| (number, line.to_owned())));
    }

    #[tokio::test]
    async fn a_post_whose_kept_connection_the_server_closed_under_it_fails_and_is_not_sent_again() {
        let (address, read) = closing_server().await;
        let connections = Arc::default();
        assert_eq!(answered(request("GET", address, "/first", empty_body()), &connections).await, "ok");
        let post = request("POST", address, "/write", Frames(1).boxed_unsync());
        let sent = send(post, bounds(4096), &OutboundTls::default(), &connections).await;
        assert!(sent.is_err(), "the server closed the connection without answering");
        // The next request opens the second connection: nothing was sent
        // there before it.
        assert_eq!(answered(request("GET", address, "/next", empty_body()), &connections).await, "ok");
        let read = read.lock().unwrap().clone();
        let expected = [(0, "GET /first HTTP/1.1"), (0, "POST /write HTTP/1.1"), (1, "GET /next HTTP/1.1")];
        assert_eq!(read, expected.map(|(number, line)| (number, line.to_owned())));
    }

    #[tokio::test]
    async fn a_body_declared_larger_than_the_limit_is_not_sent_at_all() {
        // Nothing listens there: a connection attempt would fail otherwise.
        let address = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let request = post(address, Frames(5).boxed_unsync(), Some(5 * 1024));
        let sent = send(request, bounds(3000), &OutboundTls::default(), &Arc::default()).await;
        assert!(
            matches!(sent, Err(HttpError::HttpRequestBodySize(Some(3000)))),
            "{:?}",
            sent.err().map(|e| e.to_string())
        );
    }
}
