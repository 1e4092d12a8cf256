//! The connections of a plugin's outgoing requests, per destination: a
//! request takes one that is open and free, or connects afresh.
//!
//! - **HTTP/1.1** carries one request at a time: once its response's body
//!   has been read to the end, the connection waits here for the next
//!   request to the same destination (keep-alive). Bounded per
//!   destination.
//! - **HTTP/2**, where a server offers it (over TLS, by ALPN), carries
//!   many requests at once: one connection per destination is shared by
//!   every request to it. Requests that set out before the first
//!   connection to a destination answered each connect; the first to
//!   answer is the connection kept, the others close once their requests
//!   end.
//!
//! A connection unused for [`IDLE_TIMEOUT`] is closed (when next looked
//! at, or by the server).
//!
//! Shared by every instance of the plugin: a connection carries no job.
//! Each request is still fenced as it is sent, with its own job's fence
//! header, and a request whose job no longer runs is not written.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hyper::client::conn::{http1, http2};
use tokio::time::Instant;

use super::send::RequestBody;

/// Idle HTTP/1.1 connections kept per destination, at most. It must
/// exceed the requests a plugin has in flight to one destination at its
/// busiest, or each request beyond it connects afresh and its connection
/// is dropped once answered: 4,000 jobs polling a 20 ms service once a
/// second keep about 40 in flight per host, and with 32 kept the hosts
/// opened 300 to 800 connections in 15 s of a calm run, 130 to 300 with
/// 256 (BENCHMARKS.md, `fetch`). Idle ones close after [`IDLE_TIMEOUT`].
/// How many may be open at once is not bounded yet.
const MAX_IDLE: usize = 256;

/// How long a connection may wait unused before it is closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a connection goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Destination {
    pub(crate) https: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// A connection's way to send a request.
pub(crate) enum Sender {
    Http1(http1::SendRequest<RequestBody>),
    Http2(http2::SendRequest<RequestBody>),
}

struct Idle {
    sender: http1::SendRequest<RequestBody>,
    since: Instant,
}

struct Shared {
    sender: http2::SendRequest<RequestBody>,
    /// When a request last took it.
    used: Instant,
}

#[derive(Default)]
struct Kept {
    idle: HashMap<Destination, Vec<Idle>>,
    shared: HashMap<Destination, Shared>,
}

/// The connections of one plugin.
#[derive(Default)]
pub(crate) struct Connections {
    kept: Mutex<Kept>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.lock().shared.len();
        f.debug_struct("Connections").field("idle", &self.idle()).field("shared", &shared).finish()
    }
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many HTTP/1.1 connections wait for a request, over every
    /// destination.
    pub(crate) fn idle(&self) -> usize {
        self.lock().idle.values().map(Vec::len).sum()
    }

    /// An open connection to `to` that can take a request, if there is
    /// one: the destination's HTTP/2 connection, or its newest idle
    /// HTTP/1.1 one (the least likely to have been closed).
    pub(crate) fn take(&self, to: &Destination) -> Option<Sender> {
        let mut kept = self.lock();
        if let Some(shared) = kept.shared.get_mut(to) {
            if shared.used.elapsed() < IDLE_TIMEOUT && !shared.sender.is_closed() {
                shared.used = Instant::now();
                return Some(Sender::Http2(shared.sender.clone()));
            }
            kept.shared.remove(to);
        }
        let waiting = kept.idle.get_mut(to)?;
        while let Some(Idle { sender, since }) = waiting.pop() {
            if since.elapsed() < IDLE_TIMEOUT && sender.is_ready() && !sender.is_closed() {
                return Some(Sender::Http1(sender));
            }
        }
        kept.idle.remove(to);
        None
    }

    /// Keeps `sender` for the next requests to `to`: an HTTP/2 connection
    /// at once; an HTTP/1.1 one once the response it sent has been read
    /// to its end (one the server closes, or whose body was not read to
    /// its end, is dropped instead).
    pub(crate) fn keep(self: &std::sync::Arc<Self>, to: Destination, sender: Sender) {
        let mut sender = match sender {
            Sender::Http2(sender) => {
                let mut kept = self.lock();
                if kept.shared.get(&to).is_none_or(|shared| shared.sender.is_closed()) {
                    kept.shared.insert(to, Shared { sender, used: Instant::now() });
                }
                return;
            }
            Sender::Http1(sender) => sender,
        };
        let connections = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            if sender.ready().await.is_err() {
                return;
            }
            let Some(connections) = connections.upgrade() else { return };
            let mut kept = connections.lock();
            let waiting = kept.idle.entry(to).or_default();
            waiting.retain(|idle| idle.since.elapsed() < IDLE_TIMEOUT && !idle.sender.is_closed());
            if waiting.len() < MAX_IDLE {
                waiting.push(Idle { sender, since: Instant::now() });
            }
        });
    }
}
