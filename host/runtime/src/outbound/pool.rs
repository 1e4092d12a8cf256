//! The idle connections of a plugin's outgoing requests, per destination:
//! a request takes one that is open and free, or connects afresh; once
//! its response's body has been read to the end, the connection waits
//! here for the next request to the same destination (HTTP/1.1
//! keep-alive). Bounded per destination, and closed once idle for
//! [`IDLE_TIMEOUT`] (when next looked at, or by the server).
//!
//! Shared by every instance of the plugin: a connection carries no job.
//! Each request is still fenced as it is sent, with its own job's fence
//! header, and a request whose job no longer runs is not written.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use super::send::RequestBody;

/// Idle connections kept per destination, at most.
const MAX_IDLE: usize = 32;

/// How long a connection may wait unused before it is closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a connection goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Destination {
    pub(crate) https: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
}

struct Idle {
    sender: SendRequest<RequestBody>,
    since: Instant,
}

/// The idle connections of one plugin.
#[derive(Default)]
pub(crate) struct Connections {
    idle: Mutex<HashMap<Destination, Vec<Idle>>>,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: usize = self.lock().values().map(Vec::len).sum();
        f.debug_struct("Connections").field("idle", &idle).finish()
    }
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Destination, Vec<Idle>>> {
        self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An open connection to `to` that is free for a request, if one
    /// waits; the newest first (the least likely to have been closed).
    pub(crate) fn take(&self, to: &Destination) -> Option<SendRequest<RequestBody>> {
        let mut idle = self.lock();
        let waiting = idle.get_mut(to)?;
        while let Some(Idle { sender, since }) = waiting.pop() {
            if since.elapsed() < IDLE_TIMEOUT && sender.is_ready() && !sender.is_closed() {
                return Some(sender);
            }
        }
        idle.remove(to);
        None
    }

    /// Keeps `sender` for the next request to `to` once the response it
    /// sent has been read to its end; a connection the server closes, or
    /// whose body was not read to its end, is dropped instead.
    pub(crate) fn keep(self: &std::sync::Arc<Self>, to: Destination, mut sender: SendRequest<RequestBody>) {
        let connections = std::sync::Arc::downgrade(self);
        tokio::spawn(async move {
            if sender.ready().await.is_err() {
                return;
            }
            let Some(connections) = connections.upgrade() else { return };
            let mut idle = connections.lock();
            let waiting = idle.entry(to).or_default();
            waiting.retain(|idle| idle.since.elapsed() < IDLE_TIMEOUT && !idle.sender.is_closed());
            if waiting.len() < MAX_IDLE {
                waiting.push(Idle { sender, since: Instant::now() });
            }
        });
    }
}
