//! Connections: accepted up to a limit, each closed when its client takes
//! too long to send a request's headers or stays silent too long, so that
//! slow or idle clients cannot hold the host's sockets and tasks.

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
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// The longest a client may take to send a request's headers.
    pub header_timeout: Duration,
    /// The longest a connection may stay without a byte either way.
    pub idle_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
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
                Ok((stream, _)) => stream,
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
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _slot = slot;
            let (io, activity) = Watched::new(stream);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(options.header_timeout);
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
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
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
