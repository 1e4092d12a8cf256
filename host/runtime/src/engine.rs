//! The process-wide engine: [`RuntimeConfig`] and [`Runtime`].
//!
//! One wasmtime [`Engine`] per process, configured for many small, short
//! calls into many instances: the component model, async calls, epoch
//! interruption driven by one ticker thread, the pooling allocator with
//! copy-on-write memory images, and optionally a compilation cache on disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::bindings::JobHandler;
use crate::error::{EngineError, LoadError};
use crate::host::HostState;
use crate::plugin::{Plugin, PluginOptions};
use crate::producer::{Producer, ProducerOptions};

/// Bytes of address space one linear-memory slot of the pool takes on
/// 64-bit hosts when `memory_reservation` is left at wasmtime's default:
/// 4 GiB, which lets compiled code skip bounds checks.
pub const DEFAULT_MEMORY_RESERVATION: u64 = 4 << 30;

/// Guard region after each memory slot (wasmtime's default on 64-bit).
const MEMORY_GUARD: u64 = 32 << 20;

/// The share of the 128 TiB user address space of x86-64 Linux the pool may
/// reserve; the rest stays for the heap, stacks and libraries.
const ADDRESS_SPACE_BUDGET: u64 = 64 << 40;

/// Memory mappings one live instance adds: 4.02 measured with
/// `/proc/self/maps` over 1,000 live instances of the `echo` plugin (the
/// runtime's capacity test checks it still holds), plus a margin.
pub const MAPPINGS_PER_INSTANCE: u64 = 5;

/// Mappings kept free for everything else in the process.
const MAPPINGS_HEADROOM: u64 = 8_192;

/// Core instances a component may hold: a Rust component has its main module
/// and a few shims; the budget per component is generous, the pool-wide
/// total is what costs.
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;
/// Average core instances per component, for the pool-wide total.
const CORE_INSTANCES_AVERAGE: u32 = 8;

/// Bytes of an ended instance's memory, and of each of its tables, that
/// may stay resident for the next instance in its slot (see
/// `wasmtime_config`): only pages the instance touched, so a slot keeps at
/// most this much after its instance ends.
const KEEP_RESIDENT: usize = 1 << 20;

/// How many instances a job-isolated plugin keeps made ahead of need by
/// default, at most (see `ready`).
pub const DEFAULT_READY_INSTANCES: u32 = 8;

/// The most `ready_instances` may be.
pub const MAX_READY_INSTANCES: u32 = 64;

/// Settings of the process-wide engine.
///
/// Defaults:
/// - `max_instances`: 1,000 live instances at once (jobs in job isolation,
///   workers in worker isolation, across all plugins);
/// - `max_memory_per_instance`: 64 MiB, the ceiling for every plugin's
///   memory limit;
/// - `memory_reservation`: 4 GiB of address space per instance
///   ([`DEFAULT_MEMORY_RESERVATION`]); smaller values fit more instances
///   but make compiled code check bounds;
/// - `epoch_tick`: 10 ms between epoch increments: how often a running guest
///   yields to the async runtime, and so the granularity of call timeouts;
/// - `fuel`: off; on, plugins may set a per-call fuel budget;
/// - `cache_dir`: none (no compilation cache);
/// - `ready_instances`: 8, the most instances each job-isolated plugin
///   keeps made ahead of need (0: none).
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    max_instances: u32,
    ready_instances: u32,
    max_memory_per_instance: u64,
    memory_reservation: u64,
    epoch_tick: Duration,
    fuel: bool,
    cache_dir: Option<PathBuf>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            max_instances: 1_000,
            ready_instances: DEFAULT_READY_INSTANCES,
            max_memory_per_instance: 64 << 20,
            memory_reservation: DEFAULT_MEMORY_RESERVATION,
            epoch_tick: Duration::from_millis(10),
            fuel: false,
            cache_dir: None,
        }
    }
}

impl RuntimeConfig {
    /// How many instances may be live at once.
    #[must_use]
    pub fn max_instances(mut self, count: u32) -> Self {
        self.max_instances = count;
        self
    }

    /// The most instances each plugin in job isolation keeps made ahead
    /// of need, so that a start does not wait for one (0: none). At most
    /// [`MAX_READY_INSTANCES`].
    #[must_use]
    pub fn ready_instances(mut self, count: u32) -> Self {
        self.ready_instances = count;
        self
    }

    /// The largest memory any instance may grow to, in bytes.
    #[must_use]
    pub fn max_memory_per_instance(mut self, bytes: u64) -> Self {
        self.max_memory_per_instance = bytes;
        self
    }

    /// Address space reserved per instance memory, in bytes.
    #[must_use]
    pub fn memory_reservation(mut self, bytes: u64) -> Self {
        self.memory_reservation = bytes;
        self
    }

    /// Time between epoch increments.
    #[must_use]
    pub fn epoch_tick(mut self, tick: Duration) -> Self {
        self.epoch_tick = tick;
        self
    }

    /// Whether plugins may have a per-call fuel budget.
    #[must_use]
    pub fn fuel(mut self, enabled: bool) -> Self {
        self.fuel = enabled;
        self
    }

    /// Where compiled plugins are cached, so a restart does not recompile
    /// unchanged ones.
    #[must_use]
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache_dir = Some(dir.into());
        self
    }

    /// Whether fuel budgets are enabled.
    pub fn fuel_enabled(&self) -> bool {
        self.fuel
    }

    /// How many instances may be live at once.
    pub fn instance_ceiling(&self) -> u32 {
        self.max_instances
    }

    /// The most instances a job-isolated plugin keeps ready.
    pub fn ready_ceiling(&self) -> u32 {
        self.ready_instances
    }

    /// The memory ceiling per instance, in bytes.
    pub fn memory_ceiling(&self) -> u64 {
        self.max_memory_per_instance
    }

    /// The address space reserved per instance memory, in bytes.
    pub fn reservation(&self) -> u64 {
        self.memory_reservation
    }

    /// Checks that the pool fits this machine: its address space within
    /// `ADDRESS_SPACE_BUDGET` and its memory mappings within the kernel's
    /// `vm.max_map_count`.
    ///
    /// # Errors
    /// [`EngineError::Invalid`] naming the setting and the largest value
    /// that fits.
    pub fn validate(&self) -> Result<(), EngineError> {
        if self.max_instances == 0 {
            return Err(EngineError::Invalid("max_instances must be at least 1".into()));
        }
        if self.ready_instances > MAX_READY_INSTANCES {
            return Err(EngineError::Invalid(format!(
                "ready_instances must be 0 to {MAX_READY_INSTANCES}, got {}",
                self.ready_instances
            )));
        }
        if self.max_memory_per_instance > self.memory_reservation {
            return Err(EngineError::Invalid(format!(
                "max_memory_per_instance ({} bytes) must not exceed memory_reservation ({} bytes)",
                self.max_memory_per_instance, self.memory_reservation
            )));
        }
        if self.epoch_tick.is_zero() || self.epoch_tick > Duration::from_secs(1) {
            return Err(EngineError::Invalid(format!(
                "epoch_tick must be between 1 ms and 1 s, got {:?}",
                self.epoch_tick
            )));
        }
        let per_instance = self.memory_reservation + MEMORY_GUARD;
        let fits = ADDRESS_SPACE_BUDGET / per_instance;
        if u64::from(self.max_instances) > fits {
            return Err(EngineError::Invalid(format!(
                "max_instances = {} does not fit in the address space: each instance reserves {} MiB, \
                 so at most {fits} fit; lower max_instances or memory_reservation",
                self.max_instances,
                per_instance >> 20
            )));
        }
        if let Some(max_map_count) = read_max_map_count() {
            let fits = max_map_count.saturating_sub(MAPPINGS_HEADROOM) / MAPPINGS_PER_INSTANCE;
            if u64::from(self.max_instances) > fits {
                return Err(EngineError::Invalid(format!(
                    "max_instances = {} needs about {} memory mappings but vm.max_map_count is \
                     {max_map_count}: at most {fits} instances fit; raise vm.max_map_count \
                     (sysctl) or lower max_instances",
                    self.max_instances,
                    u64::from(self.max_instances) * MAPPINGS_PER_INSTANCE + MAPPINGS_HEADROOM
                )));
            }
        }
        Ok(())
    }

    fn wasmtime_config(&self) -> Result<Config, EngineError> {
        let mut pool = PoolingAllocationConfig::new();
        let instances = self.max_instances;
        pool.total_component_instances(instances)
            .total_core_instances(instances.saturating_mul(CORE_INSTANCES_AVERAGE))
            .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
            // Rust components have one linear memory and a couple of tables.
            .total_memories(instances)
            .max_memories_per_component(1)
            .total_tables(instances.saturating_mul(4))
            .max_tables_per_component(8)
            // One async call at a time per store, one store per instance.
            .total_stacks(instances)
            .max_memory_size(usize::try_from(self.max_memory_per_instance).unwrap_or(usize::MAX))
            // An ended instance's slot is reset by writing back only the
            // pages it touched, found with Linux's PAGEMAP_SCAN (6.7 and
            // later; elsewhere the lowest bytes are written back and the rest
            // unmapped): no `madvise` and no page faults when the slot is
            // used again, for up to these many bytes.
            .linear_memory_keep_resident(KEEP_RESIDENT)
            .table_keep_resident(KEEP_RESIDENT)
            .pagemap_scan(Enabled::Auto);

        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .consume_fuel(self.fuel)
            .memory_init_cow(true)
            .memory_reservation(self.memory_reservation)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        if let Some(dir) = &self.cache_dir {
            let mut cache = wasmtime::CacheConfig::new();
            cache.with_directory(dir);
            let cache = wasmtime::Cache::new(cache).map_err(|e| {
                EngineError::Invalid(format!("cannot use {} as compilation cache: {e}", dir.display()))
            })?;
            config.cache(Some(cache));
        }
        Ok(config)
    }
}

fn read_max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count").ok()?.trim().parse().ok()
}

/// The plugin runtime of a process: one engine, one linker with the host
/// functions, and the epoch ticker. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

pub(crate) struct RuntimeInner {
    pub(crate) engine: Engine,
    pub(crate) linker: Linker<HostState>,
    pub(crate) config: RuntimeConfig,
    /// Its plugins' instances made ahead of need.
    pub(crate) ready: Arc<crate::ready::Registry>,
}

impl Runtime {
    /// Builds the engine and starts its epoch ticker (a thread that ends
    /// when the last clone of the runtime is dropped).
    ///
    /// # Errors
    /// [`EngineError`] when the configuration does not validate or wasmtime
    /// refuses it (for example the pool cannot reserve its memory).
    pub fn new(config: RuntimeConfig) -> Result<Self, EngineError> {
        config.validate()?;
        let engine =
            Engine::new(&config.wasmtime_config()?).map_err(|e| EngineError::Engine(format!("{e:#}")))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| EngineError::Engine(format!("failed to add WASI to the linker: {e:#}")))?;
        // Outgoing HTTP only (no incoming handler); what a request may reach
        // is decided per plugin (`outbound`).
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| EngineError::Engine(format!("failed to add wasi:http to the linker: {e:#}")))?;
        JobHandler::add_to_linker::<_, HasSelf<HostState>>(&mut linker, |state| state).map_err(|e| {
            EngineError::Engine(format!("failed to add the host functions to the linker: {e:#}"))
        })?;
        spawn_epoch_ticker(&engine, config.epoch_tick)
            .map_err(|e| EngineError::Engine(format!("failed to start the epoch ticker thread: {e}")))?;
        Ok(Self { inner: Arc::new(RuntimeInner { engine, linker, config, ready: Arc::default() }) })
    }

    /// Loads, checks and pre-instantiates the plugin at `path`.
    ///
    /// # Errors
    /// [`LoadError`] naming the plugin and what is wrong with it.
    pub fn load_file(&self, name: &str, path: &Path, options: PluginOptions) -> Result<Plugin, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            plugin: name.to_owned(),
            path: path.to_owned(),
            source,
        })?;
        self.load(name, &bytes, options)
    }

    /// Loads, checks and pre-instantiates a plugin from its bytes.
    ///
    /// # Errors
    /// [`LoadError`] naming the plugin and what is wrong with it.
    pub fn load(&self, name: &str, bytes: &[u8], options: PluginOptions) -> Result<Plugin, LoadError> {
        Plugin::load(self.inner.clone(), name, bytes, options)
    }

    /// Loads, checks and pre-instantiates the job producer at `path`.
    ///
    /// # Errors
    /// [`LoadError`] naming the producer and what is wrong with it.
    pub fn load_producer_file(
        &self,
        name: &str,
        path: &Path,
        options: ProducerOptions,
    ) -> Result<Producer, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            plugin: name.to_owned(),
            path: path.to_owned(),
            source,
        })?;
        self.load_producer(name, &bytes, options)
    }

    /// Loads, checks and pre-instantiates the job producer of `bytes`.
    ///
    /// # Errors
    /// [`LoadError`] naming the producer and what is wrong with it.
    pub fn load_producer(
        &self,
        name: &str,
        bytes: &[u8],
        options: ProducerOptions,
    ) -> Result<Producer, LoadError> {
        Producer::load(&self.inner, name, bytes, options)
    }

    /// The configuration the runtime was built with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("config", &self.inner.config).finish_non_exhaustive()
    }
}

/// Increments the engine's epoch every `tick`, so running guests reach their
/// yield deadline (see `Instance`). A plain thread: it must tick even when
/// every async worker thread is busy running guest code.
fn spawn_epoch_ticker(engine: &Engine, tick: Duration) -> std::io::Result<()> {
    let weak = engine.weak();
    std::thread::Builder::new().name("pulse-epoch".into()).spawn(move || {
        loop {
            std::thread::sleep(tick);
            match weak.upgrade() {
                Some(engine) => engine.increment_epoch(),
                None => return,
            }
        }
    })?;
    Ok(())
}
