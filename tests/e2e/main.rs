//! End-to-end tests of pulse-host against real Redis servers and real
//! plugins. One binary; one module per family of scenarios:
//!
//! - `failover`: worker processes killed (-9) or frozen (SIGSTOP) while
//!   they run jobs; a journal in Redis of every handler call.
//! - `liveness`: a process frozen past its lease, Redis restarted empty
//!   under load: the pool settles without traffic, nothing runs after the
//!   fence, no running job fails.
//! - `fixtures`: the test kit itself: private servers, restarts, the leak check.
//! - `plugins`: the plugins build as components, and `config.toml` names them.
#![allow(clippy::unwrap_used, reason = "tests and their helpers: a panic is the failure report")]

mod failover;
mod fixtures;
mod liveness;
mod plugins;
