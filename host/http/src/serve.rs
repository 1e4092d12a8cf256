//! Connections: accepted up to a limit, each closed when its client takes
//! too long to send a request's headers (or to finish the TLS handshake)
//! or asks nothing for too long, so that slow or idle clients cannot hold
//! the host's sockets and tasks. HTTP/1.1, and HTTP/2 for clients that
//! speak it (prior knowledge in clear, ALPN over TLS), where many
//! requests share a connection. Over TLS when `ServeOptions::tls` says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Api, router};

/// How connections are served.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The longest a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// The longest a connection may stay without a request in flight.
    pub idle_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// HTTPS with this configuration (see [`tls_config`]); plain HTTP
    /// when `None`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// The TLS configuration of a server with the certificate chain in PEM
/// file `cert` and its private key in PEM file `key`.
///
/// # Errors
/// What is wrong with the files, naming them.
pub fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|error| format!("http.tls_cert_file {}: {error}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("http.tls_cert_file {}: no certificate in it (PEM expected)", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|error| {
        format!("http.tls_key_file {}: {error} (a PEM private key expected)", key.display())
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| format!("http.tls_cert_file and http.tls_key_file do not go together: {error}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            tls: None,
        }
    }
}

/// Serves `router(api)` on `listener` until `shutdown` is cancelled; then
/// lets requests in flight finish (the caller bounds how long).
///
/// # Errors
/// None today: a failed accept is logged and retried.
///
/// # Cancel safety
/// Cancel safe: dropping it stops accepting; connections already served
/// end with their tasks.
pub async fn serve(
    listener: tokio::net::TcpListener,
    api: Api,
    shutdown: CancellationToken,
    options: ServeOptions,
) -> std::io::Result<()> {
    // What the status page charts is sampled while the API is served.
    let sampler = tokio::spawn(crate::series::sample(api.clone(), shutdown.clone()));
    let router = router(api);
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let connections = TaskTracker::new();
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Without it, the answer to the second of two
                    // pipelined requests waits for the client's delayed
                    // acknowledgement of the first (Nagle): 40 ms.
                    let _ = stream.set_nodelay(true);
                    stream
                }
                Err(error) => {
                    // Out of file descriptors, say: wait rather than spin.
                    tracing::warn!(error = %error, "failed to accept an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let (shutdown, options) = (shutdown.clone(), options.clone());
        connections.spawn(async move {
            let _slot = slot;
            // From the accept: a TLS handshake counts against the first
            // request's deadline.
            let activity = Activity::new();
            match options.tls.clone() {
                None => serve_connection(stream, activity, service, &options, shutdown).await,
                Some(tls) => {
                    let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(stream);
                    match tokio::time::timeout(options.header_timeout, handshake).await {
                        Ok(Ok(io)) => serve_connection(io, activity, service, &options, shutdown).await,
                        Ok(Err(error)) => tracing::debug!(error = %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
        });
    }
    sampler.abort();
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Serves HTTP/1.1, or HTTP/2 when the client opens with its preface
/// (over TLS: when ALPN chose `h2`), on `io` until the client is done,
/// stays idle too long, or `shutdown` is cancelled (then the requests in
/// flight finish).
async fn serve_connection<I>(
    io: I,
    activity: Activity,
    service: TowerToHyperService<axum::Router>,
    options: &ServeOptions,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Answers to pipelined requests go out in one write.
    builder.http1().timer(TokioTimer::new()).header_read_timeout(options.header_timeout).pipeline_flush(true);
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(MAX_STREAMS);
    let service = Counted { inner: service, activity: activity.clone() };
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    // Once closing, the connection is dropped when nothing was in flight
    // for `header_timeout`: an HTTP/2 client that does not answer the
    // close's ping would otherwise keep it.
    let mut closing = false;
    loop {
        let idle = if closing { options.header_timeout } else { options.idle_timeout };
        tokio::select! {
            _ = connection.as_mut() => break,
            () = activity.idle(options.header_timeout, idle) => {
                if closing {
                    break;
                }
                closing = true;
                activity.touch();
                connection.as_mut().graceful_shutdown();
            }
            () = shutdown.cancelled(), if !closing => {
                closing = true;
                activity.touch();
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Requests in flight at once on one HTTP/2 connection (hyper's default,
/// said here): with `max_connections`, what bounds the requests served at
/// once.
const MAX_STREAMS: u32 = 200;

/// The requests of a connection: when one last began or ended, and how
/// many are in flight. Idleness is counted in requests, not bytes, so
/// that neither HTTP/2's pings nor headers sent a byte at a time keep a
/// connection that asks nothing.
#[derive(Clone)]
struct Activity(Arc<Requests>);

struct Requests {
    born: tokio::time::Instant,
    /// ms since `born` when a request last began or ended.
    last: AtomicU64,
    in_flight: AtomicUsize,
    begun: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self(Arc::new(Requests {
            born: tokio::time::Instant::now(),
            last: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            begun: AtomicBool::new(false),
        }))
    }

    fn touch(&self) {
        let ms = u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last.store(ms, Ordering::Relaxed);
    }

    /// A request begins; it ends when the guard is dropped.
    fn begin(&self) -> InFlight {
        self.0.begun.store(true, Ordering::Relaxed);
        self.0.in_flight.fetch_add(1, Ordering::Relaxed);
        self.touch();
        InFlight(self.clone())
    }

    /// Resolves once no request began within `first` of the connection's
    /// start, or, after one did, none was in flight for `timeout`.
    async fn idle(&self, first: Duration, timeout: Duration) {
        loop {
            let wait = if self.0.begun.load(Ordering::Relaxed) { timeout } else { first };
            let due = self.0.born + Duration::from_millis(self.0.last.load(Ordering::Relaxed)) + wait;
            if tokio::time::Instant::now() >= due {
                if self.0.in_flight.load(Ordering::Relaxed) == 0 {
                    return;
                }
                self.touch();
                continue;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// A request in flight (see [`Activity::begin`]).
struct InFlight(Activity);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// The router, each request counted in its connection's [`Activity`]
/// until its answer is ready (every answer's body is whole by then).
#[derive(Clone)]
struct Counted {
    inner: TowerToHyperService<axum::Router>,
    activity: Activity,
}

impl hyper::service::Service<hyper::Request<hyper::body::Incoming>> for Counted {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, request: hyper::Request<hyper::body::Incoming>) -> Self::Future {
        let in_flight = self.activity.begin();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            drop(in_flight);
            answer
        })
    }
}
