//! Connections: accepted up to a limit, each closed when its client takes
//! too long to send a request's headers (or to finish the TLS handshake)
//! or stays silent too long, so that slow or idle clients cannot hold the
//! host's sockets and tasks. Over TLS when `ServeOptions::tls` says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Api, router};

/// How connections are served.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The longest a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// The longest a connection may stay without a byte either way.
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
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
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
            let (io, activity) = Watched::new(stream);
            match options.tls.clone() {
                None => serve_connection(io, activity, service, &options, shutdown).await,
                Some(tls) => {
                    let handshake = tokio_rustls::TlsAcceptor::from(tls).accept(io);
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

/// Serves HTTP/1.1 on `io` until the client is done, stays idle too long,
/// or `shutdown` is cancelled (then the request in flight finishes).
async fn serve_connection<I>(
    io: I,
    activity: Activity,
    service: TowerToHyperService<axum::Router>,
    options: &ServeOptions,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Answers to pipelined requests go out in one write.
    builder.timer(TokioTimer::new()).header_read_timeout(options.header_timeout).pipeline_flush(true);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = connection.as_mut() => break,
            () = activity.idle(options.idle_timeout), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
            () = shutdown.cancelled(), if !closing => {
                closing = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// When a byte last moved on a connection: ms since it was accepted.
#[derive(Clone)]
struct Activity {
    born: tokio::time::Instant,
    last: Arc<AtomicU64>,
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing moved for `timeout`.
    async fn idle(&self, timeout: Duration) {
        loop {
            let due = self.born + Duration::from_millis(self.last.load(Ordering::Relaxed)) + timeout;
            if tokio::time::Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    }
}

/// A stream that notes its [`Activity`].
struct Watched {
    stream: tokio::net::TcpStream,
    activity: Activity,
}

impl Watched {
    fn new(stream: tokio::net::TcpStream) -> (Self, Activity) {
        let activity = Activity { born: tokio::time::Instant::now(), last: Arc::new(AtomicU64::new(0)) };
        (Self { stream, activity: activity.clone() }, activity)
    }

    fn touch(&self) {
        self.activity.touch();
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
