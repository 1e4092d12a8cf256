//! Per-plugin limits and the store's resource limiter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::error::CallError;
use crate::metrics::PluginMetrics;

/// Limits that apply to every instance of one plugin.
///
/// Defaults:
/// - `memory`: 64 MiB per instance;
/// - `call_timeout`: 10 s per call (`start`, `stop`, `notify`, `on-timer`);
/// - `fuel`: none (needs fuel enabled in [`crate::RuntimeConfig`]);
/// - `instances`: none (the runtime's `max_instances` is the only bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest linear memory an instance may grow to, in bytes.
    pub memory: u64,
    /// Longest a single call may run, wall clock.
    pub call_timeout: Duration,
    /// Fuel (roughly, wasm instructions) a single call may use.
    pub fuel: Option<u64>,
    /// Instances of the plugin live at once, at most: its share of the
    /// runtime's `max_instances`, so that one plugin cannot take the
    /// instances another needs.
    pub instances: Option<u32>,
}

impl Default for Limits {
    fn default() -> Self {
        Self { memory: 64 << 20, call_timeout: Duration::from_secs(10), fuel: None, instances: None }
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
    quota: Arc<Quota>,
}

/// The live instances of one plugin, against its `instances` limit.
#[derive(Debug)]
pub(crate) struct Quota {
    plugin: String,
    limit: Option<u32>,
    live: AtomicU32,
}

impl Quota {
    pub(crate) fn new(plugin: &str, limit: Option<u32>) -> Arc<Self> {
        Arc::new(Self { plugin: plugin.to_owned(), limit, live: AtomicU32::new(0) })
    }
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
    /// The limiter of one new instance; refused when the plugin has all
    /// the instances its quota allows.
    pub(crate) fn new(
        memory: u64,
        metrics: Arc<PluginMetrics>,
        quota: Arc<Quota>,
    ) -> Result<Self, CallError> {
        let taken = quota.live.fetch_add(1, Ordering::AcqRel);
        if let Some(limit) = quota.limit
            && taken >= limit
        {
            quota.live.fetch_sub(1, Ordering::AcqRel);
            return Err(CallError::Instantiate(format!(
                "plugin {:?} has all of its {limit} instances live (its limits.instances); \
                 the other plugins keep theirs",
                quota.plugin
            )));
        }
        metrics.instances.increment(1.0);
        Ok(Self { memory, used: 0, metrics, quota })
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        self.quota.live.fetch_sub(1, Ordering::AcqRel);
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

#[cfg(test)]
mod tests {
    use wasmtime::{Engine, Instance, Module, Store};

    use super::*;

    const PAGE: u64 = 64 << 10;

    /// A module with one page of memory and a table of one element, and
    /// functions growing each (they answer what `memory.grow` and
    /// `table.grow` answer: the old size, or -1).
    const GROWING: &str = r#"
        (module
          (memory 1)
          (table 1 funcref)
          (func (export "grow_memory") (param i32) (result i32) (memory.grow (local.get 0)))
          (func (export "grow_table") (param i32) (result i32)
            (table.grow (ref.null func) (local.get 0))))
    "#;

    fn instance(memory: u64, quota: &Arc<Quota>) -> (Store<Limiter>, Instance) {
        let engine = Engine::default();
        let module = Module::new(&engine, wat::parse_str(GROWING).unwrap()).unwrap();
        let metrics = Arc::new(PluginMetrics::handler("limits-test"));
        let limiter = Limiter::new(memory, metrics, quota.clone()).unwrap();
        let mut store = Store::new(&engine, limiter);
        store.limiter(|limiter| limiter);
        let instance = Instance::new(&mut store, &module, &[]).unwrap();
        (store, instance)
    }

    #[test]
    fn memory_grows_to_the_limit_and_a_growth_past_it_traps_with_the_limit() {
        let quota = Quota::new("limits-test", None);
        let (mut store, instance) = instance(3 * PAGE, &quota);
        let grow = instance.get_typed_func::<i32, i32>(&mut store, "grow_memory").unwrap();
        assert_eq!(grow.call(&mut store, 2).unwrap(), 1, "1 page to 3: within the limit");
        assert_eq!(store.data().used, 3 * PAGE, "the growth is accounted, the initial page too");
        let error = grow.call(&mut store, 1).unwrap_err();
        let exceeded =
            error.downcast_ref::<MemoryLimitExceeded>().expect("a memory limit, not a generic trap");
        assert_eq!((exceeded.limit, exceeded.wanted), (3 * PAGE, 4 * PAGE));
    }

    #[test]
    fn tables_stop_growing_at_their_cap_without_a_trap() {
        let quota = Quota::new("limits-test", None);
        let (mut store, instance) = instance(PAGE, &quota);
        let grow = instance.get_typed_func::<i32, i32>(&mut store, "grow_table").unwrap();
        let cap = i32::try_from(MAX_TABLE_ELEMENTS).unwrap();
        assert_eq!(grow.call(&mut store, cap - 1).unwrap(), 1, "up to the cap");
        assert_eq!(grow.call(&mut store, 1).unwrap(), -1, "past it: refused, as the guest expects");
    }

    #[test]
    fn a_plugin_gets_no_more_instances_than_its_quota_and_gets_them_back() {
        let quota = Quota::new("limits-test", Some(1));
        let first = instance(PAGE, &quota);
        let metrics = Arc::new(PluginMetrics::handler("limits-test"));
        let refused = Limiter::new(PAGE, metrics.clone(), quota.clone()).unwrap_err();
        assert!(refused.to_string().contains("has all of its 1 instances live"), "{refused}");
        drop(first);
        assert!(Limiter::new(PAGE, metrics, quota).is_ok(), "a dropped instance gives its slot back");
    }
}
