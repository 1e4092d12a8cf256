//! End-to-end tests of pulse-host against real Redis servers and real
//! plugins. One binary; one module per family of scenarios:
//!
//! - `failover`: worker processes killed (-9) or frozen (SIGSTOP) while
//!   they run jobs; a journal in Redis of every handler call.
//! - `fixtures`: the test kit itself: private servers, restarts, the leak check.
//! - `plugins`: the plugins build as components, and `config.toml` names them.
#![allow(clippy::unwrap_used, reason = "tests and their helpers: a panic is the failure report")]

mod failover;
mod fixtures;
mod plugins;
