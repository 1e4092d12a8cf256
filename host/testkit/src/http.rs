//! [`HttpServer`]: a small HTTP/1.1 server on loopback for tests of
//! plugins' outgoing requests, a thread per connection. It keeps a
//! connection open for the next request (keep-alive) unless the client
//! asks to close it, and counts what it received per path and the
//! connections it accepted.
//!
//! [`HttpServer::start_tls`] serves HTTPS instead, with a certificate for
//! `127.0.0.1` and `localhost` made for it and trusted by nothing: its
//! [`HttpServer::ca_file`] is the PEM file to trust it by.
//! [`HttpServer::start_h2`] serves HTTPS that speaks HTTP/2 only (see
//! `h2`).
//!
//! Paths (a query is ignored): `/slow/MS` answers after MS milliseconds;
//! `/drip/MS` sends the head at once and the body (`drip`) after MS
//! milliseconds; `/closing/…` answers its set body as any other path,
//! offering to keep the connection alive, then closes it 20 ms later (a
//! server whose keep-alive timeout runs out); `/big/N` answers N
//! bytes; `/echo` answers the request's body; any other path answers the
//! body set with [`HttpServer::set`] (404 when none), with an `ETag` (304
//! to a matching `If-None-Match`).
//!
//! `POST /fenced/…` is a write to a service that honours fences, as
//! docs/design.md describes one: it keeps the largest token it accepted
//! per pool and key (of the `pulse-fence: <pool>/<key>/<token>` header)
//! and refuses a write with a smaller one (409), or without the header
//! (428); [`HttpServer::fenced_writes`] lists the verdicts. After
//! [`HttpServer::hold_next`], the next request for a path is kept,
//! unanswered and not yet judged, until [`HttpServer::release`]: a write still on
//! its way, as a slow network or a proxy's queue would keep it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

mod h2;

/// A request the server received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// `GET`, `POST`…
    pub method: String,
    /// The path and query.
    pub path: String,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body (as `Content-Length` gave it).
    pub body: Vec<u8>,
}

/// A write to a `/fenced/` path and what the server made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedWrite {
    /// The path.
    pub path: String,
    /// The `pulse-fence` header, if any.
    pub fence: Option<String>,
    /// Its token, if it had one.
    pub token: Option<u64>,
    /// The body.
    pub body: Vec<u8>,
    /// Whether the write was accepted: its token was at least the largest
    /// accepted for its pool and key.
    pub accepted: bool,
}

#[derive(Debug, Default)]
struct State {
    bodies: HashMap<String, Vec<u8>>,
    received: Vec<Received>,
    /// Per path, how many of the next requests wait.
    hold_next: HashMap<String, usize>,
    /// Per path, how many times its held requests were released.
    releases: HashMap<String, u64>,
    /// `<pool>/<key>` -> the largest token accepted.
    newest: HashMap<String, u64>,
    fenced: Vec<FencedWrite>,
    /// Connections accepted.
    connections: usize,
    /// Requests being answered now, and the most at once so far (counted
    /// by the HTTP/2 server).
    in_flight: usize,
    most_at_once: usize,
}

/// The server; it stops accepting when dropped (connections in progress
/// finish).
#[derive(Debug)]
pub struct HttpServer {
    address: SocketAddr,
    state: Arc<Mutex<State>>,
    /// HTTPS: the PEM file of the server's certificate.
    ca_file: Option<tempfile::NamedTempFile>,
}

/// Connections the server's listening socket queues before it accepts
/// them: what real servers keep (nginx 511, Go's the system's maximum),
/// where std's `TcpListener::bind` keeps 128. Hosts that open a few
/// hundred connections at once overflowed 128 while the accepting thread
/// started a thread for each: the kernel dropped the overflow's SYNs, and
/// each such client connected a second later (BENCHMARKS.md, `fetch`).
const BACKLOG: i32 = 1024;

/// A listening socket on a free loopback port, with [`BACKLOG`].
fn loopback_listener() -> TcpListener {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a TCP socket");
    socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).expect("bind a loopback port");
    socket.listen(BACKLOG).expect("listen on a loopback port");
    socket.into()
}

impl HttpServer {
    /// Starts a server on a free loopback port.
    pub fn start() -> Self {
        Self::serve_on(None)
    }

    /// Starts an HTTPS server on a free loopback port, with a self-signed
    /// certificate for `127.0.0.1` and `localhost` (see [`Self::ca_file`]).
    pub fn start_tls() -> Self {
        let (ca_file, config) = self_signed();
        let mut server = Self::serve_on(Some(Arc::new(config)));
        server.ca_file = Some(ca_file);
        server
    }

    fn serve_on(tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let listener = loopback_listener();
        let address = listener.local_addr().expect("the listener's address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::downgrade(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let (Ok(stream), Some(state)) = (stream, shared.upgrade()) else { return };
                let _ = stream.set_nodelay(true);
                lock(&state).connections += 1;
                let tls = tls.clone();
                std::thread::spawn(move || match tls {
                    None => serve(stream, &state),
                    Some(config) => {
                        let Ok(connection) = rustls::ServerConnection::new(config) else { return };
                        let mut stream = rustls::StreamOwned::new(connection, stream);
                        serve(&mut stream, &state);
                        stream.conn.send_close_notify();
                        let _ = stream.flush();
                    }
                });
            }
        });
        Self { address, state, ca_file: None }
    }

    /// The PEM file of an HTTPS server's certificate: what a client must
    /// trust to reach it. `None` for plain HTTP.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_ref().map(tempfile::NamedTempFile::path)
    }

    /// The server's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT` + `path` (`https://` for an HTTPS server).
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.ca_file.is_some() { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.address)
    }

    /// Answers `path` with `body` from now on.
    pub fn set(&self, path: &str, body: &[u8]) {
        lock(&self.state).bodies.insert(path.to_owned(), body.to_vec());
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state).received.clone()
    }

    /// How many requests were received so far: [`Self::received`]'s
    /// length without the copy, which holds every connection's thread up
    /// while a long list is copied (a benchmark counting tens of thousands
    /// of requests would slow the server it measures).
    pub fn received_count(&self) -> usize {
        lock(&self.state).received.len()
    }

    /// The next request for `path` waits, received but unanswered and
    /// unjudged, until [`Self::release`]; later ones pass.
    pub fn hold_next(&self, path: &str) {
        *lock(&self.state).hold_next.entry(path.to_owned()).or_default() += 1;
    }

    /// Lets the requests for `path` held so far through.
    pub fn release(&self, path: &str) {
        *lock(&self.state).releases.entry(path.to_owned()).or_default() += 1;
    }

    /// Every write to a `/fenced/` path judged so far, in the order judged.
    pub fn fenced_writes(&self) -> Vec<FencedWrite> {
        lock(&self.state).fenced.clone()
    }

    /// How many requests for `path` it received.
    pub fn count(&self, path: &str) -> usize {
        lock(&self.state).received.iter().filter(|r| r.path == path).count()
    }

    /// How many connections the server accepted.
    pub fn connections(&self) -> usize {
        lock(&self.state).connections
    }

    /// The most requests an HTTP/2 server ([`Self::start_h2`]) answered at
    /// once.
    pub fn most_at_once(&self) -> usize {
        lock(&self.state).most_at_once
    }
}

/// A server TLS configuration with a new self-signed certificate for
/// `127.0.0.1` and `localhost`, and the PEM file of that certificate.
fn self_signed() -> (tempfile::NamedTempFile, rustls::ServerConfig) {
    let names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(names).expect("a self-signed certificate");
    let mut ca_file = tempfile::NamedTempFile::new().expect("a temporary file");
    ca_file.write_all(cert.pem().as_bytes()).expect("write the certificate");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .expect("a server configuration");
    (ca_file, config)
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poison| poison.into_inner())
}

fn serve(mut stream: impl Read + Write, state: &Mutex<State>) {
    let mut reader = BufReader::new(&mut stream);
    while serve_one(&mut reader, state) {}
}

/// Answers the next request of a connection; whether the connection stays
/// open for another.
fn serve_one<S: Read + Write>(reader: &mut BufReader<S>, state: &Mutex<State>) -> bool {
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
        return false;
    }
    let mut words = line.split_whitespace();
    let (method, path) =
        (words.next().unwrap_or_default().to_owned(), words.next().unwrap_or_default().to_owned());
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
    let if_none_match = headers.iter().find(|(name, _)| name == "if-none-match").map(|(_, v)| v.clone());
    let length = headers.iter().find(|(name, _)| name == "content-length").and_then(|(_, v)| v.parse().ok());
    let keep_alive = !headers.iter().any(|(name, v)| name == "connection" && v.eq_ignore_ascii_case("close"));
    let mut request_body = vec![0; length.unwrap_or(0)];
    if reader.read_exact(&mut request_body).is_err() {
        return false;
    }
    let fence = headers.iter().find(|(name, _)| name == "pulse-fence").map(|(_, v)| v.clone());
    let post = method == "POST";
    let body = lock(state).bodies.get(&path).cloned();
    lock(state).received.push(Received { method, path: path.clone(), headers, body: request_body.clone() });
    let route = path.split('?').next().unwrap_or_default().to_owned();
    let held = {
        let mut state = lock(state);
        match state.hold_next.get_mut(&route) {
            Some(next) if *next > 0 => {
                *next -= 1;
                Some(state.releases.get(&route).copied().unwrap_or(0))
            }
            _ => None,
        }
    };
    if let Some(releases) = held {
        while lock(state).releases.get(&route).copied().unwrap_or(0) == releases {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let route = route.as_str();
    if let Some(ms) = route.strip_prefix("/drip/") {
        let writer = reader.get_mut();
        let _ = writer
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\n")
            .and_then(|()| writer.flush());
        std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
        let _ = writer.write_all(b"drip\n").and_then(|()| writer.flush());
        return false;
    }
    let (status, body, etag) = if route.starts_with("/fenced/") && post {
        let (status, body) = judge(state, &path, fence, request_body);
        (status, body.into_bytes(), None)
    } else if route == "/echo" {
        ("200 OK", request_body, None)
    } else if let Some(ms) = route.strip_prefix("/slow/") {
        std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
        ("200 OK", b"slow".to_vec(), None)
    } else if let Some(bytes) = route.strip_prefix("/big/") {
        ("200 OK", vec![b'x'; bytes.parse().unwrap_or(0)], None)
    } else if let Some(body) = body {
        let etag = format!(
            "\"{:x}\"",
            body.iter().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(*b)))
        );
        if if_none_match.as_deref() == Some(etag.as_str()) {
            ("304 Not Modified", Vec::new(), Some(etag))
        } else {
            ("200 OK", body, Some(etag))
        }
    } else {
        ("404 Not Found", b"no such path".to_vec(), None)
    };
    let etag = etag.map(|etag| format!("etag: {etag}\r\n")).unwrap_or_default();
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\n{etag}connection: {connection}\r\n\r\n",
        body.len()
    );
    // One write: a head and a body written apart on a kept connection
    // would wait for the client's delayed acknowledgement (Nagle).
    let mut answer = head.into_bytes();
    answer.extend_from_slice(&body);
    let writer = reader.get_mut();
    let written = writer.write_all(&answer).and_then(|()| writer.flush());
    if route.starts_with("/closing/") {
        std::thread::sleep(Duration::from_millis(20));
        return false;
    }
    keep_alive && written.is_ok()
}

/// Judges a write to a `/fenced/` path as a service honouring fences does:
/// in one step, compare the write's token with the largest accepted for
/// its pool and key, and accept (keeping the new largest) or refuse.
fn judge(state: &Mutex<State>, path: &str, fence: Option<String>, body: Vec<u8>) -> (&'static str, String) {
    // `<pool>/<key>/<token>`: the key is percent-encoded, so it holds no '/'.
    let parsed = fence.as_deref().and_then(|fence| {
        let (job, token) = fence.rsplit_once('/')?;
        Some((job.to_owned(), token.parse::<u64>().ok()?))
    });
    let mut state = lock(state);
    let (verdict, accepted, token) = match &parsed {
        None => (("428 Precondition Required", "no pulse-fence header".to_owned()), false, None),
        Some((job, token)) => {
            let newest = state.newest.get(job).copied().unwrap_or(0);
            if *token < newest {
                (("409 Conflict", format!("stale fence: token {token} < {newest}")), false, Some(*token))
            } else {
                state.newest.insert(job.clone(), *token);
                (("200 OK", format!("applied under token {token}")), true, Some(*token))
            }
        }
    };
    state.fenced.push(FencedWrite { path: path.to_owned(), fence, token, body, accepted });
    verdict
}
