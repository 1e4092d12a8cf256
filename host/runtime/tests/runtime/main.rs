//! The plugin runtime against the real plugins of `plugins/` (built by
//! `scripts/build-plugins`) and small inline components.
//!
//! - `calls`: start, notify, stop, timers, state, logs, worker isolation.
//! - `failures`: traps, endless loops, unbounded allocation, guest errors.
//! - `languages`: one contract, in Rust, Python and JavaScript plugins.
//! - `load`: components refused at load, configuration refused.
//! - `capacity`: a thousand live instances and what they cost.
//! - `outbound`: outgoing HTTP: allow-lists, limits, the fence.
//! - `producers`: job producers and their plans.
//! - `ready`: instances made ahead of need in job isolation.
#![allow(clippy::unwrap_used, reason = "tests and their helpers: a panic is the failure report")]

mod calls;
mod capacity;
mod failures;
mod languages;
mod load;
mod outbound;
mod producers;
mod ready;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use pulse_runtime::{Isolation, JobRunner, Limits, Plugin, PluginOptions, Recorder, Runtime, RuntimeConfig};

/// How long a test waits for something that takes milliseconds: generous,
/// for a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// A runtime with the default configuration.
pub fn runtime() -> Runtime {
    Runtime::new(RuntimeConfig::default()).expect("the default configuration builds")
}

/// Options with `isolation` and these settings.
pub fn options(isolation: Isolation, settings: &[(&str, &str)]) -> PluginOptions {
    PluginOptions {
        limits: Limits::default(),
        settings: settings
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        isolation,
        ..PluginOptions::default()
    }
}

/// Loads the built plugin `name` (a `pulse_testkit::plugins` constant).
pub fn load(runtime: &Runtime, name: &str, options: PluginOptions) -> Plugin {
    let path = pulse_testkit::plugins::path(name);
    runtime.load_file(name, &path, options).unwrap_or_else(|e| panic!("failed to load {name}: {e}"))
}

/// A runner of `plugin` recording its outputs.
pub fn runner(plugin: &Plugin) -> (JobRunner, Recorder) {
    let recorder = Recorder::new();
    (plugin.runner(Arc::new(recorder.clone())), recorder)
}
