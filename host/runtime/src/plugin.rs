//! A loaded plugin: checked against the contract and pre-instantiated once.

use std::collections::BTreeMap;
use std::sync::Arc;

use wasmtime::component::{Component, InstancePre};

use crate::bindings::JobHandlerPre;
use crate::engine::RuntimeInner;
use crate::error::{CallError, LoadError};
use crate::host::HostState;
use crate::instance::Instance;
use crate::limits::{Limits, Quota};
use crate::metrics::PluginMetrics;
use crate::outbound::Outbound;
use crate::outputs::JobOutputs;
use crate::ready::{Ready, ReadyInstances, Registry};
use crate::runner::JobRunner;

/// How many instances serve a worker's jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Isolation {
    /// One instance per job, created on start and dropped on stop: a trap or
    /// an exhausted limit ends one job, and memory is accounted per job.
    #[default]
    Job,
    /// One instance serves all jobs of a worker: denser, but a trap restarts
    /// the worker's other jobs (from their saved state) in a new instance.
    Worker,
}

/// How to run a plugin.
///
/// Defaults: [`Limits::default`], no settings, [`Isolation::Job`].
#[derive(Debug, Clone, Default)]
pub struct PluginOptions {
    /// Limits of every instance.
    pub limits: Limits,
    /// Settings the plugin reads with `config(name)`.
    pub settings: BTreeMap<String, String>,
    /// Instances per job or per worker.
    pub isolation: Isolation,
    /// What its jobs may reach over HTTP (nothing by default).
    pub outbound: Outbound,
}

/// A plugin ready to run: compiled, checked and pre-instantiated. Cheap to
/// clone.
#[derive(Clone)]
pub struct Plugin {
    pub(crate) inner: Arc<PluginInner>,
}

pub(crate) struct PluginInner {
    pub(crate) name: String,
    pub(crate) pre: JobHandlerPre<HostState>,
    pub(crate) limits: Limits,
    pub(crate) settings: Arc<BTreeMap<String, String>>,
    pub(crate) isolation: Isolation,
    pub(crate) fuel_enabled: bool,
    pub(crate) metrics: Arc<PluginMetrics>,
    pub(crate) quota: Arc<Quota>,
    pub(crate) outbound: Arc<Outbound>,
    /// Its idle outgoing connections, shared by its instances.
    pub(crate) connections: Arc<crate::outbound::Connections>,
    /// Its instances made ahead of need (job isolation).
    pub(crate) ready: Arc<Ready>,
    /// Every plugin's of the runtime, to free room for a start.
    pub(crate) ready_registry: Arc<Registry>,
}

/// The 8 bytes every WebAssembly binary starts with: magic, then a version
/// and layer word that tells a component (`0d 00 01 00`) from a core module
/// (`01 00 00 00`).
const MAGIC: &[u8; 4] = b"\0asm";
const COMPONENT_LAYER: [u8; 4] = [0x0d, 0x00, 0x01, 0x00];

impl Plugin {
    pub(crate) fn load(
        runtime: Arc<RuntimeInner>,
        name: &str,
        bytes: &[u8],
        options: PluginOptions,
    ) -> Result<Self, LoadError> {
        let plugin = || name.to_owned();
        check_options(name, &options.limits, &runtime)?;
        let instance_pre = compile(&runtime, name, bytes, HANDLER_WORLD)?;
        // Fails when an export of the world is missing or mistyped.
        let pre = JobHandlerPre::new(instance_pre).map_err(|e| LoadError::WrongWorld {
            plugin: plugin(),
            world: HANDLER_WORLD,
            message: format!("{e:#}"),
        })?;
        let ready = Arc::new(Ready::new(runtime.config.ready_ceiling()));
        runtime.ready.add(&ready);
        Ok(Self {
            inner: Arc::new(PluginInner {
                name: plugin(),
                pre,
                limits: options.limits,
                settings: Arc::new(options.settings),
                isolation: options.isolation,
                fuel_enabled: runtime.config.fuel_enabled(),
                metrics: Arc::new(PluginMetrics::handler(name)),
                quota: Quota::new(name, options.limits.instances),
                outbound: Arc::new(options.outbound),
                connections: Arc::default(),
                ready: ready.clone(),
                ready_registry: runtime.ready.clone(),
            }),
        })
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its isolation.
    pub fn isolation(&self) -> Isolation {
        self.inner.isolation
    }

    /// Its limits.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Its instances made ahead of need (job isolation: a task of the
    /// plugin makes them after each start, for the next), and how many
    /// starts took one.
    pub fn ready_instances(&self) -> ReadyInstances {
        self.inner.ready.counts()
    }

    /// One instance on its own, outside any runner: for measuring and
    /// embedding. Its timers never fire (no task receives their ticks); run
    /// jobs through [`Plugin::runner`].
    ///
    /// # Errors
    /// [`CallError::Instantiate`] when the pool is full or instantiation
    /// traps.
    ///
    /// # Cancel safety
    /// Cancel safe: an instance made but not returned is dropped, and its
    /// quota slot with it.
    pub async fn instantiate(&self, outputs: Arc<dyn JobOutputs>) -> Result<Instance, CallError> {
        // A sender whose receiver is already gone: ticks go nowhere.
        let (commands, _) = tokio::sync::mpsc::channel(1);
        Instance::new(&self.inner, outputs, commands.downgrade()).await
    }

    /// A runner for one worker's jobs, whose requests go to `outputs`.
    pub fn runner(&self, outputs: Arc<dyn JobOutputs>) -> JobRunner {
        JobRunner::new(self.clone(), outputs)
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.inner.name)
            .field("isolation", &self.inner.isolation)
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}

const HANDLER_WORLD: &str = "job-handler";

/// Checks that `bytes` are a component, compiles it and checks that the
/// host provides everything it imports.
pub(crate) fn compile(
    runtime: &RuntimeInner,
    name: &str,
    bytes: &[u8],
    world: &'static str,
) -> Result<InstancePre<HostState>, LoadError> {
    let plugin = || name.to_owned();
    if !bytes.starts_with(MAGIC) {
        return Err(LoadError::NotWasm { plugin: plugin() });
    }
    if bytes.get(4..8) != Some(&COMPONENT_LAYER[..]) {
        return Err(LoadError::CoreModule { plugin: plugin() });
    }
    let component = Component::new(&runtime.engine, bytes)
        .map_err(|e| LoadError::Compile { plugin: plugin(), message: format!("{e:#}") })?;
    memory_images(&component).map_err(|e| LoadError::Compile {
        plugin: plugin(),
        message: format!("cannot make its initial memory image: {e:#}"),
    })?;
    // Fails when the component imports something the host lacks.
    runtime.linker.instantiate_pre(&component).map_err(|e| LoadError::WrongWorld {
        plugin: plugin(),
        world,
        message: format!("{e:#}"),
    })
}

/// Makes the memory images every instance of `component` maps
/// copy-on-write now, at load, instead of at its first start.
///
/// Each is a memfd, written and then sealed read-only. Linux refuses the
/// seal (`EBUSY`) while a page just written is still referenced elsewhere,
/// as by another CPU's batch of pages on their way to the page lists,
/// which passes within milliseconds: made lazily, that failed a job's
/// start (seen once, with the 11.5 MB JavaScript component). So a refusal
/// is tried again, a few times, before the plugin fails to load.
fn memory_images(component: &Component) -> wasmtime::Result<()> {
    let mut wait = std::time::Duration::from_millis(5);
    for _ in 0..6 {
        match component.initialize_copy_on_write_image() {
            Err(error) if is_busy(&error) => std::thread::sleep(wait),
            done => return done,
        }
        wait *= 2;
    }
    component.initialize_copy_on_write_image()
}

/// Whether `error` comes from a system call that answered `EBUSY`.
fn is_busy(error: &wasmtime::Error) -> bool {
    const EBUSY: i32 = 16;
    error.chain().any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.raw_os_error() == Some(EBUSY))
    })
}

/// Checks a plugin's limits against the runtime's.
pub(crate) fn check_options(name: &str, limits: &Limits, runtime: &RuntimeInner) -> Result<(), LoadError> {
    let invalid = |message: String| LoadError::InvalidOptions { plugin: name.to_owned(), message };
    let ceiling = runtime.config.memory_ceiling();
    if limits.memory > ceiling {
        return Err(invalid(format!(
            "memory limit {} bytes exceeds the runtime's max_memory_per_instance of {ceiling} bytes",
            limits.memory
        )));
    }
    if limits.call_timeout.is_zero() {
        return Err(invalid("call_timeout must be longer than zero".into()));
    }
    if limits.instances == Some(0) {
        return Err(invalid("instances must be at least 1".into()));
    }
    if limits.fuel.is_some() && !runtime.config.fuel_enabled() {
        return Err(invalid("a fuel limit needs fuel enabled in the runtime configuration".into()));
    }
    Ok(())
}
