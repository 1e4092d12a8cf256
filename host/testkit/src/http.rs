//! [`HttpServer`]: a small HTTP/1.1 server on loopback for tests of
//! plugins' outgoing requests. It answers each request on a connection of
//! its own (`Connection: close`) and counts what it received per path.
//!
//! Paths (a query is ignored): `/slow/MS` answers after MS milliseconds; `/big/N` answers N
//! bytes; `/echo` answers the request's body; any other path answers the
//! body set with [`HttpServer::set`] (404 when none), with an `ETag` (304
//! to a matching `If-None-Match`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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

#[derive(Debug, Default)]
struct State {
    bodies: HashMap<String, Vec<u8>>,
    received: Vec<Received>,
}

/// The server; it stops accepting when dropped (connections in progress
/// finish).
#[derive(Debug)]
pub struct HttpServer {
    address: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl HttpServer {
    /// Starts a server on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let address = listener.local_addr().expect("the listener's address");
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::downgrade(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let (Ok(stream), Some(state)) = (stream, shared.upgrade()) else { return };
                std::thread::spawn(move || serve(stream, &state));
            }
        });
        Self { address, state }
    }

    /// The server's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    /// Answers `path` with `body` from now on.
    pub fn set(&self, path: &str, body: &[u8]) {
        lock(&self.state).bodies.insert(path.to_owned(), body.to_vec());
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.state).received.clone()
    }

    /// How many requests for `path` it received.
    pub fn count(&self, path: &str) -> usize {
        lock(&self.state).received.iter().filter(|r| r.path == path).count()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poison| poison.into_inner())
}

fn serve(stream: TcpStream, state: &Mutex<State>) {
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
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
    let mut request_body = vec![0; length.unwrap_or(0)];
    if reader.read_exact(&mut request_body).is_err() {
        return;
    }
    let body = lock(state).bodies.get(&path).cloned();
    lock(state).received.push(Received { method, path: path.clone(), headers, body: request_body.clone() });
    let route = path.split('?').next().unwrap_or_default();
    let (status, body, etag) = if route == "/echo" {
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
    let head =
        format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\n{etag}connection: close\r\n\r\n", body.len());
    let _ = writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(&body));
}
