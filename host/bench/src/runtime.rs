//! The `runtime` scenario: what the plugin runtime costs, with the `echo`
//! plugin (each `notify` reads a setting and emits the payload back, so a
//! call includes two host calls), and with the same plugin written in
//! Python (`python-echo`) and JavaScript (`js-echo`), whose components
//! carry their interpreter.
//!
//! `pulse-bench runtime [echo|python-echo|js-echo]…` (default: all three).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_runtime::{
    BoxFuture, CallError, HostRefusal, Isolation, Job, JobOutputs, Plugin, PluginOptions, Runtime,
    RuntimeConfig,
};

use crate::report::{self, percentile};

/// Outputs that accept everything and keep nothing: the benchmark measures
/// the runtime, not a recorder.
struct Discard;

impl JobOutputs for Discard {
    fn emit<'a>(&'a self, _key: &'a str, _payload: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async { Ok(()) })
    }
    fn save_state<'a>(&'a self, _key: &'a str, _state: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async { Ok(()) })
    }
    fn complete<'a>(&'a self, _key: &'a str) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async { Ok(()) })
    }
    fn job_failed<'a>(&'a self, _key: &'a str, _error: &'a CallError) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

type BenchResult = Result<(), Box<dyn std::error::Error>>;

/// The plugins measured, by the name given on the command line: the
/// file's name, how many idle instances the memory figure is measured
/// over (an interpreter's instances are larger: fewer, then scaled to
/// 1,000), the memory limit per instance, MiB (the default, 64, for
/// Rust; JavaScript's collector needs room), and how many 64 KiB calls one
/// instance gets (componentize-py 0.25.1 keeps each `list<u8>` argument: a
/// Python instance grows by the payload on every call, about 850 calls of
/// 64 KiB fill 64 MiB).
const PLUGINS: [(&str, &str, usize, u64, usize); 3] = [
    ("echo", "echo", 1_000, 64, 5_000),
    ("python-echo", "python_echo", 200, 256, 500),
    ("js-echo", "js_echo", 200, 256, 5_000),
];

pub fn run(names: &[String], quick: bool) -> BenchResult {
    let chosen: Vec<_> = if names.is_empty() {
        PLUGINS.to_vec()
    } else {
        names
            .iter()
            .map(|name| {
                PLUGINS.iter().find(|(n, ..)| n == name).copied().ok_or_else(|| {
                    format!(
                        "unknown plugin {name:?}: the runtime scenario measures echo, python-echo and js-echo"
                    )
                })
            })
            .collect::<Result<_, _>>()?
    };
    for (name, file, idle, memory_mib, big_calls) in chosen {
        let idle = if quick { idle / 10 } else { idle };
        measure_plugin(name, file, idle, memory_mib << 20, big_calls, quick)?;
    }
    Ok(())
}

fn measure_plugin(
    name: &str,
    file: &str,
    idle: usize,
    memory: u64,
    big_calls: usize,
    quick: bool,
) -> BenchResult {
    let scale = if quick { 10 } else { 1 };
    let config = || RuntimeConfig::default().max_memory_per_instance(memory);
    let options = || PluginOptions {
        limits: pulse_runtime::Limits { memory, ..pulse_runtime::Limits::default() },
        ..PluginOptions::default()
    };
    let path = plugin_path(file)?;
    let bytes = std::fs::read(&path).map_err(|e| format!("failed to read {}: {e}", path.display()))?;

    let compile = median_of(3, || {
        let runtime = Runtime::new(config())?;
        let started = Instant::now();
        runtime.load(name, &bytes, options())?;
        Ok(started.elapsed())
    })?;
    let cache = tempfile::tempdir()?;
    // The first load fills the cache; the measured ones hit it.
    Runtime::new(config().cache_dir(cache.path()))?.load(name, &bytes, options())?;
    let cached = median_of(3, || {
        let runtime = Runtime::new(config().cache_dir(cache.path()))?;
        let started = Instant::now();
        runtime.load(name, &bytes, options())?;
        Ok(started.elapsed())
    })?;

    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let runtime = Runtime::new(config())?;
    let plugin = runtime.load(name, &bytes, options())?;
    let calls = tokio.block_on(measure_calls(&plugin, big_calls, scale))?;
    let worker_plugin =
        runtime.load(name, &bytes, PluginOptions { isolation: Isolation::Worker, ..options() })?;
    let runner = tokio.block_on(measure_runner(&plugin, &worker_plugin, scale))?;

    let mut line = report::Result::new("runtime")
        .field("plugin", name)
        .field("component_mib", format!("{:.1}", bytes.len() as f64 / f64::from(1 << 20)))
        .field("memory_limit_mib", memory >> 20)
        .field("calls_64kib", big_calls / scale)
        .millis("compile_ms", compile)
        .millis("cached_load_ms", cached);
    for (key, value) in calls.into_iter().chain(runner) {
        line = line.micros(key, value);
    }
    let (rss, mut fresh) = tokio.block_on(measure_idle_memory(&plugin, idle))?;
    // A runtime of its own, so that its slots are all unused.
    let unused = Runtime::new(config())?.load(name, &bytes, options())?;
    let mut fresh_instantiate = tokio.block_on(measure_fresh_instantiate(&unused, idle))?;
    let per_1000 = rss as f64 / f64::from(1 << 20) * 1_000.0 / idle as f64;
    line.micros("instantiate_fresh_p50_us", percentile(&mut fresh_instantiate, 50.0))
        .micros("runner_start_fresh_p50_us", percentile(&mut fresh, 50.0))
        .micros("runner_start_fresh_p99_us", percentile(&mut fresh, 99.0))
        .field("idle_instances", idle)
        .field("rss_mib_per_1000_idle", format!("{per_1000:.1}"))
        .print();
    Ok(())
}

/// Instantiation and direct calls on one instance.
async fn measure_calls(
    plugin: &Plugin,
    big_calls: usize,
    scale: usize,
) -> Result<Vec<(&'static str, Duration)>, CallError> {
    let outputs: Arc<dyn JobOutputs> = Arc::new(Discard);
    let mut instantiate = Vec::new();
    for round in 0..2_000 / scale + 100 {
        let started = Instant::now();
        let instance = plugin.instantiate(outputs.clone()).await?;
        let elapsed = started.elapsed();
        drop(instance);
        // The first rounds warm the pool's slots.
        if round >= 100 {
            instantiate.push(elapsed);
        }
    }
    let mut instance = plugin.instantiate(outputs.clone()).await?;
    instance.start(&Job::new("bench", "")).await?;
    let mut results = vec![
        ("instantiate_p50_us", percentile(&mut instantiate, 50.0)),
        ("instantiate_p99_us", percentile(&mut instantiate, 99.0)),
    ];
    for (size, rounds, p50, p99) in [
        (16, 20_000 / scale, "call_16b_p50_us", "call_16b_p99_us"),
        (64 * 1024, big_calls / scale, "call_64kib_p50_us", "call_64kib_p99_us"),
    ] {
        let payload = vec![7u8; size];
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let started = Instant::now();
            instance.notify("bench", &payload).await?;
            samples.push(started.elapsed());
        }
        results.push((p50, percentile(&mut samples, 50.0)));
        results.push((p99, percentile(&mut samples, 99.0)));
    }
    Ok(results)
}

/// The same work through a `JobRunner`, as the pool drives it: a start
/// (instance task, instantiation and the guest's `start`) and a notify
/// (queue, call, reply).
async fn measure_runner(
    job_plugin: &Plugin,
    worker_plugin: &Plugin,
    scale: usize,
) -> Result<Vec<(&'static str, Duration)>, CallError> {
    let runner = job_plugin.runner(Arc::new(Discard));
    let mut starts = Vec::new();
    for i in 0..2_000 / scale {
        let key = format!("start-{i}");
        let started = Instant::now();
        runner.start(Job::new(&key, "")).await?;
        starts.push(started.elapsed());
        runner.stop(&key).await?;
    }
    let worker = worker_plugin.runner(Arc::new(Discard));
    worker.start(Job::new("bench", "")).await?;
    let payload = vec![7u8; 16];
    let mut notifies = Vec::new();
    for _ in 0..20_000 / scale {
        let started = Instant::now();
        worker.notify("bench", payload.clone()).await?;
        notifies.push(started.elapsed());
    }
    runner.close().await;
    worker.close().await;
    Ok(vec![
        ("runner_start_p50_us", percentile(&mut starts, 50.0)),
        ("runner_start_p99_us", percentile(&mut starts, 99.0)),
        ("runner_notify_16b_p50_us", percentile(&mut notifies, 50.0)),
        ("runner_notify_16b_p99_us", percentile(&mut notifies, 99.0)),
    ])
}

/// Resident bytes that `count` idle per-job instances add, and how long
/// each of their starts took: as every instance stays live, each start
/// takes a slot of the pool no instance has used yet (its memory image
/// mapped, every page it touches a page fault), unlike
/// `runner_start_p50_us`, whose starts reuse one slot.
async fn measure_idle_memory(plugin: &Plugin, count: usize) -> Result<(u64, Vec<Duration>), CallError> {
    let runner = plugin.runner(Arc::new(Discard));
    let before = report::resident_bytes();
    let mut starts = Vec::with_capacity(count);
    for i in 0..count {
        let started = Instant::now();
        runner.start(Job::new(format!("idle-{i}"), "")).await?;
        starts.push(started.elapsed());
    }
    let after = report::resident_bytes();
    runner.close().await;
    Ok((after.saturating_sub(before), starts))
}

/// How long each of `count` instantiations takes when every instance
/// stays live: each takes a slot no instance has used yet.
async fn measure_fresh_instantiate(plugin: &Plugin, count: usize) -> Result<Vec<Duration>, CallError> {
    let outputs: Arc<dyn JobOutputs> = Arc::new(Discard);
    let mut live = Vec::with_capacity(count);
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        live.push(plugin.instantiate(outputs.clone()).await?);
        samples.push(started.elapsed());
    }
    Ok(samples)
}

fn median_of(
    runs: usize,
    mut measure: impl FnMut() -> Result<Duration, Box<dyn std::error::Error>>,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let mut samples = (0..runs).map(|_| measure()).collect::<Result<Vec<_>, _>>()?;
    Ok(percentile(&mut samples, 50.0))
}

/// Where `scripts/build-plugins` puts plugin `name`.
pub fn plugin_path(name: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../plugins/target/wasm32-wasip2/release")
        .join(format!("{name}.wasm"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} is not built: run scripts/build-plugins", path.display()))
    }
}
