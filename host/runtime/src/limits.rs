//! Per-plugin limits and the store's resource limiter.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::PluginMetrics;

/// Limits that apply to every instance of one plugin.
///
/// Defaults:
/// - `memory`: 64 MiB per instance;
/// - `call_timeout`: 10 s per call (`start`, `stop`, `notify`, `on-timer`);
/// - `fuel`: none (needs fuel enabled in [`crate::RuntimeConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest linear memory an instance may grow to, in bytes.
    pub memory: u64,
    /// Longest a single call may run, wall clock.
    pub call_timeout: Duration,
    /// Fuel (roughly, wasm instructions) a single call may use.
    pub fuel: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self { memory: 64 << 20, call_timeout: Duration::from_secs(10), fuel: None }
    }
}

/// The error a denied memory growth traps with, so the call is classified
/// as a memory limit rather than a generic trap.
#[derive(Debug, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (wanted {wanted} bytes)")]
pub(crate) struct MemoryLimitExceeded {
    pub(crate) limit: u64,
    pub(crate) wanted: u64,
}

/// Enforces [`Limits::memory`] and caps tables; traps on denial instead of
/// failing the growth, so a guest allocator cannot misreport the cause.
/// It also accounts the instance's memory to its plugin's metrics: added
/// as it grows, taken back when the store (and so the limiter) is dropped.
pub(crate) struct Limiter {
    memory: u64,
    /// The instance's linear memory now, bytes.
    used: u64,
    metrics: Arc<PluginMetrics>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").field("memory", &self.memory).field("used", &self.used).finish()
    }
}

/// Table elements an instance may have: generous for any Rust component
/// (they use a few hundred), small enough to stop a runaway.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl Limiter {
    pub(crate) fn new(memory: u64, metrics: Arc<PluginMetrics>) -> Self {
        metrics.instances.increment(1.0);
        Self { memory, used: 0, metrics }
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.metrics.instances.decrement(1.0);
        self.metrics.memory.decrement(self.used as f64);
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let wanted = desired as u64;
        if wanted > self.memory {
            tracing::warn!(limit = self.memory, wanted, "denied memory growth");
            return Err(MemoryLimitExceeded { limit: self.memory, wanted }.into());
        }
        // Also called for the initial memory (current 0). A component may
        // have several memories: each growth adds its own difference.
        let grown = wanted.saturating_sub(current as u64);
        self.used += grown;
        self.metrics.memory.increment(grown as f64);
        Ok(true)
    }

    // The pooling allocator can refuse a growth the limiter allowed (its slot
    // is smaller); that is a memory limit too, not a silent -1 to the guest.
    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(MemoryLimitExceeded { limit: self.memory, wanted: self.memory }.into())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}
