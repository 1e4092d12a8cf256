//! Guest stdout and stderr, captured line by line into the host's log.
//!
//! Each line becomes a `tracing` event in the current span, which is the
//! span of the guest call that printed it (plugin and job key).

use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::bounds::{LogGate, gated};

/// A line longer than this is logged in pieces: a guest printing without
/// newlines must not grow the buffer without bound.
const MAX_LINE: usize = 4096;

/// Which stream a [`LineLog`] captures.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stdio {
    Stdout,
    Stderr,
}

/// A [`StdoutStream`] whose streams log complete lines, within the jobs'
/// log budget.
#[derive(Clone)]
pub(crate) struct LogOutput(pub(crate) Stdio, pub(crate) Arc<LogGate>);

impl IsTerminal for LogOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LineLog::new(self.0, self.1.clone()))
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LineLog::new(self.0, self.1.clone()))
    }
}

/// Buffers bytes until a newline, then logs the line.
struct LineLog {
    stdio: Stdio,
    gate: Arc<LogGate>,
    partial: Vec<u8>,
}

impl LineLog {
    fn new(stdio: Stdio, gate: Arc<LogGate>) -> Self {
        Self { stdio, gate, partial: Vec::new() }
    }

    fn write_bytes(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.partial.extend_from_slice(&bytes[..end]);
            self.flush_line();
            bytes = &bytes[end + 1..];
        }
        self.partial.extend_from_slice(bytes);
        while self.partial.len() >= MAX_LINE {
            let rest = self.partial.split_off(MAX_LINE);
            self.flush_line();
            self.partial = rest;
        }
    }

    fn flush_line(&mut self) {
        if self.partial.is_empty() {
            return;
        }
        let line = String::from_utf8_lossy(&self.partial);
        let stdio = self.stdio;
        gated(&self.gate, None, &line, |line| match stdio {
            Stdio::Stdout => tracing::info!(target: "pulse_runtime::guest", stream = "stdout", "{line}"),
            Stdio::Stderr => tracing::warn!(target: "pulse_runtime::guest", stream = "stderr", "{line}"),
        });
        self.partial.clear();
    }
}

impl Drop for LineLog {
    fn drop(&mut self) {
        self.flush_line();
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LineLog {
    async fn ready(&mut self) {}
}

impl OutputStream for LineLog {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.write_bytes(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        // A guest flush is not a line end: lines are logged whole.
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for LineLog {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.get_mut().write_bytes(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().flush_line();
        Poll::Ready(Ok(()))
    }
}
