//! [`HttpServer::start_h2`]: HTTPS that speaks HTTP/2 only (the one
//! protocol its ALPN offers), as a server that multiplexes requests does:
//! hyper's HTTP/2 server on a Tokio runtime of its own thread. It answers
//! a path's body set with [`HttpServer::set`] (404 when none) and
//! `/slow/MS` after MS milliseconds, records what it receives, and counts
//! its connections and the most requests it answered at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::{HttpServer, Received, State, lock, loopback_listener, self_signed};

impl HttpServer {
    /// Starts an HTTPS server speaking HTTP/2 only on a free loopback
    /// port, with a self-signed certificate as [`Self::start_tls`] has.
    pub fn start_h2() -> Self {
        let (ca_file, mut config) = self_signed();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = loopback_listener();
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let address = listener.local_addr().expect("the listener's address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::downgrade(&state);
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a Tokio runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("a Tokio listener");
                loop {
                    let Ok((tcp, _)) = listener.accept().await else { return };
                    let Some(state) = shared.upgrade() else { return };
                    let _ = tcp.set_nodelay(true);
                    lock(&state).connections += 1;
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else { return };
                        let service =
                            hyper::service::service_fn(move |request| answer(request, state.clone()));
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            });
        });
        Self { address, state, ca_file: Some(ca_file) }
    }
}

async fn answer(
    request: hyper::Request<hyper::body::Incoming>,
    state: Arc<Mutex<State>>,
) -> Result<hyper::Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes().to_vec();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap_or_default().to_owned()))
        .collect();
    let set = {
        let mut state = lock(&state);
        state.received.push(Received { method: parts.method.to_string(), path: path.clone(), headers, body });
        state.in_flight += 1;
        state.most_at_once = state.most_at_once.max(state.in_flight);
        state.bodies.get(&path).cloned()
    };
    let (status, body) = if let Some(ms) = parts.uri.path().strip_prefix("/slow/") {
        tokio::time::sleep(Duration::from_millis(ms.parse().unwrap_or(0))).await;
        (200, b"slow".to_vec())
    } else if let Some(body) = set {
        (200, body)
    } else {
        (404, b"no such path".to_vec())
    };
    lock(&state).in_flight -= 1;
    Ok(hyper::Response::builder().status(status).body(Full::new(Bytes::from(body))).expect("a response"))
}
