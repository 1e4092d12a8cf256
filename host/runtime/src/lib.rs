//! The plugin runtime: loads job handler components, sandboxes them and
//! calls them. It knows nothing of Redis: what a handler asks of the pool
//! goes through [`JobOutputs`].
//!
//! # Layout
//! - `engine`: [`RuntimeConfig`] and [`Runtime`], the one wasmtime engine
//!   of a process (pooling allocator, epoch ticker, compilation cache).
//! - `plugin`: [`Plugin`], a component checked against `wit/job.wit` and
//!   pre-instantiated; [`PluginOptions`], [`Isolation`].
//! - `producer`: [`Producer`], a job producer component asked for the
//!   [`Plan`] of a schedule.
//! - `runner`: [`JobRunner`], one worker's jobs, routed to instances.
//! - `instance`: [`Instance`], one store and its guest, and the calls under
//!   the plugin's limits.
//! - `actor`: the task that owns an instance, serializes its calls and
//!   delivers its timer ticks; restarts jobs after a trap.
//! - `ready`: instances made ahead of need in job isolation
//!   ([`ReadyInstances`]), so a start does not instantiate on its way.
//! - `host`: the store's data and the host functions guests import.
//! - `limits`: [`Limits`] per plugin and the store's resource limiter.
//! - `bounds`: the sizes and rates a plugin controls, and their limits.
//! - `outbound`: outgoing HTTP under [`Outbound`]: the allow-list, the
//!   fence, the limits, and the sender (TLS with a plugin's own CAs).
//! - `outputs`: [`JobOutputs`], the seam to the pool, and [`Recorder`].
//! - `job`: [`Job`], as a handler receives it.
//! - `metrics`: what the runtime records into the `metrics` facade.
//! - `error`: [`LoadError`], [`CallError`], [`JobError`], [`HostRefusal`].
//! - `bindings`: the one `bindgen!` of the WIT contract.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use pulse_runtime::{Job, PluginOptions, Recorder, Runtime, RuntimeConfig};
//!
//! let runtime = Runtime::new(RuntimeConfig::default())?;
//! let plugin = runtime.load_file("echo", "echo.wasm".as_ref(), PluginOptions::default())?;
//! let outputs = Recorder::new();
//! let runner = plugin.runner(Arc::new(outputs.clone()));
//! runner.start(Job::new("job-1", "hello")).await?;
//! runner.notify("job-1", b"again".to_vec()).await?;
//! runner.stop("job-1").await?;
//! assert_eq!(outputs.emitted("job-1"), [b"hello".to_vec(), b"again".to_vec()]);
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod actor;
mod bindings;
pub mod bounds;
mod engine;
mod error;
mod host;
mod instance;
mod job;
mod limits;
pub mod metrics;
mod outbound;
mod outputs;
mod plugin;
mod producer;
mod ready;
mod runner;

pub use engine::{
    DEFAULT_MEMORY_RESERVATION, DEFAULT_READY_INSTANCES, MAPPINGS_PER_INSTANCE, MAX_READY_INSTANCES, Runtime,
    RuntimeConfig,
};
pub use error::{CallError, EngineError, HostRefusal, JobError, LoadError};
pub use instance::Instance;
pub use job::Job;
pub use limits::Limits;
pub use outbound::{AllowedHost, AllowedHostError, FENCE_HEADER, Outbound, OutboundTls, OutboundTlsError};
pub use outputs::{BoxFuture, Fence, JobOutputs, LOSS_CHECK, Output, Recorder};
pub use plugin::{Isolation, Plugin, PluginOptions};
pub use producer::{Plan, PlanAnswer, Producer, ProducerOptions};
pub use ready::ReadyInstances;
pub use runner::JobRunner;
