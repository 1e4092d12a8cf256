//! Per-plugin limits and the store's resource limiter.

use std::time::Duration;

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
#[derive(Debug)]
pub(crate) struct Limiter {
    memory: u64,
}

/// Table elements an instance may have: generous for any Rust component
/// (they use a few hundred), small enough to stop a runaway.
const MAX_TABLE_ELEMENTS: usize = 100_000;

impl Limiter {
    pub(crate) fn new(memory: u64) -> Self {
        Self { memory }
    }
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let wanted = desired as u64;
        if wanted > self.memory {
            tracing::warn!(limit = self.memory, wanted, "denied memory growth");
            return Err(MemoryLimitExceeded { limit: self.memory, wanted }.into());
        }
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
