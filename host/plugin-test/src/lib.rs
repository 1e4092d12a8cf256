//! Drive a job handler component from a plugin's own tests, with no
//! Redis and no host: the runtime a host runs it in, the same limits and
//! settings, and the steps of `pulse-host try` as methods.
//!
//! ```ignore
//! #[tokio::test(start_paused = true)]
//! async fn it_counts_and_resumes_after_a_move() {
//!     let mut plugin = pulse_plugin_test::Harness::load("target/wasm32-wasip2/release/counter.wasm")
//!         .setting("interval-ms", "1000")
//!         .build()
//!         .unwrap();
//!     plugin.start("c1", "").await.unwrap();
//!     plugin.advance(Duration::from_secs(3)).await;
//!     assert_eq!(plugin.emitted("c1"), ["1", "2", "3"]);
//!     plugin.crash_and_move("c1").await.unwrap();
//!     assert_eq!(plugin.saved_state("c1").as_deref(), Some(&b"3"[..]));
//! }
//! ```
//!
//! Time: timers fire on tokio's clock. Run the test with a paused clock
//! (`#[tokio::test(start_paused = true)]`) and [`Harness::advance`] moves
//! it on, firing the timers that fall due, in order.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use pulse_runtime::{CallError, Output};
use pulse_runtime::{Job, JobRunner, Plugin, PluginOptions, Recorder, Runtime, RuntimeConfig};

/// A component loaded for a test (see the crate's docs).
pub struct Harness {
    plugin: Plugin,
    recorder: Recorder,
    runner: JobRunner,
    /// Each job as it was started: what a move starts it with again.
    started: HashMap<String, Job>,
    _runtime: Runtime,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").field("plugin", &self.plugin.name()).finish_non_exhaustive()
    }
}

/// How to load a component: its file and settings ([`Harness::load`]).
#[derive(Debug, Clone)]
pub struct Load {
    path: PathBuf,
    options: PluginOptions,
}

impl Load {
    /// Gives the plugin setting `name` (as `[plugin.settings]` does).
    #[must_use]
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.options.settings.insert(name.to_owned(), value.to_owned());
        self
    }

    /// Runs it with these options (limits, isolation, outbound rules).
    #[must_use]
    pub fn options(mut self, options: PluginOptions) -> Self {
        let settings = std::mem::take(&mut self.options.settings);
        self.options =
            PluginOptions { settings: settings.into_iter().chain(options.settings).collect(), ..options };
        self
    }

    /// Compiles and checks the component, as a host loading it would.
    ///
    /// # Errors
    /// A file that cannot be read, a component of another world, or a
    /// runtime that cannot start: each says what is wrong.
    pub fn build(self) -> Result<Harness, String> {
        let runtime = Runtime::new(RuntimeConfig::default()).map_err(|e| e.to_string())?;
        let name =
            self.path.file_stem().map_or_else(|| "plugin".to_owned(), |s| s.to_string_lossy().into_owned());
        let plugin = runtime.load_file(&name, &self.path, self.options).map_err(|e| e.to_string())?;
        Ok(Harness::new(plugin, runtime))
    }
}

impl Harness {
    /// A harness around a plugin loaded already (with the runtime it was
    /// loaded in): `pulse-host try` loads it as a host's config would.
    pub fn new(plugin: Plugin, runtime: Runtime) -> Self {
        let recorder = Recorder::new();
        let runner = plugin.runner(Arc::new(recorder.clone()));
        Harness { plugin, recorder, runner, started: HashMap::new(), _runtime: runtime }
    }

    /// Calls `observer` with each output as the plugin makes it (timer
    /// callbacks' included), besides recording it.
    pub fn observe(&self, observer: impl Fn(&Output) + Send + Sync + 'static) {
        self.recorder.observe(observer);
    }

    /// Closes the plugin's instances (no call is made).
    pub async fn close(self) {
        self.runner.close().await;
    }

    /// The component at `path`, with no settings and the default limits,
    /// in job isolation: add to it, then [`Load::build`].
    pub fn load(path: impl AsRef<Path>) -> Load {
        Load {
            path: path.as_ref().to_path_buf(),
            options: PluginOptions { settings: BTreeMap::new(), ..PluginOptions::default() },
        }
    }

    /// Starts job `key` with `payload`, and the state it saved last if it
    /// saved one.
    ///
    /// # Errors
    /// What the call ended with: the plugin's job error, a trap, a limit.
    pub async fn start(&mut self, key: &str, payload: impl AsRef<[u8]>) -> Result<(), CallError> {
        let created_at_ms = self.started.len() as u64 + 1;
        let job = Job {
            key: key.to_owned(),
            payload: payload.as_ref().to_vec(),
            created_at_ms,
            requeued: false,
            attempt: 1,
            state: None,
        };
        self.started.insert(key.to_owned(), job.clone());
        self.runner.start(Job { state: self.recorder.saved_state(key), ..job }).await
    }

    /// Sends job `key` a notification.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn notify(&mut self, key: &str, payload: impl AsRef<[u8]>) -> Result<(), CallError> {
        self.runner.notify(key, payload.as_ref().to_vec()).await
    }

    /// Stops job `key`.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn stop(&mut self, key: &str) -> Result<(), CallError> {
        self.runner.stop(key).await
    }

    /// Drops job `key`'s instance without a call (as when its host dies)
    /// and starts it in a new one, `requeued`, with the state it saved
    /// last and the payload it was started with.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn crash_and_move(&mut self, key: &str) -> Result<(), CallError> {
        self.runner.abandon(key).await;
        let next = self.plugin.runner(Arc::new(self.recorder.clone()));
        std::mem::replace(&mut self.runner, next).close().await;
        let job = self.started.get(key).cloned().unwrap_or_else(|| Job {
            key: key.to_owned(),
            attempt: 1,
            ..Job::default()
        });
        self.runner.start(Job { requeued: true, state: self.recorder.saved_state(key), ..job }).await
    }

    /// Moves the (paused) clock on by `by`, firing the timers that fall
    /// due, in order, and letting each callback finish ([`advance`]).
    pub async fn advance(&self, by: Duration) {
        advance(by).await;
    }

    /// What job `key` emitted, in order, as text (lossy).
    pub fn emitted(&self, key: &str) -> Vec<String> {
        self.recorder
            .emitted(key)
            .iter()
            .map(|payload| String::from_utf8_lossy(payload).into_owned())
            .collect()
    }

    /// The state job `key` saved last.
    pub fn saved_state(&self, key: &str) -> Option<Vec<u8>> {
        self.recorder.saved_state(key)
    }

    /// Everything the plugin asked of the host, in order: emits, saved
    /// states, completions, and the jobs that failed outside a call (a
    /// timer's trap).
    pub fn outputs(&self) -> Vec<Output> {
        self.recorder.outputs()
    }

    /// Whether job `key` runs.
    pub fn is_running(&self, key: &str) -> bool {
        self.runner.is_running(key)
    }
}

/// Moves tokio's paused clock on by `by`, a millisecond at a time, letting
/// what each tick woke (a timer's callback) run to its end before the next
/// timer falls due.
pub async fn advance(by: Duration) {
    let step = Duration::from_millis(1);
    let mut left = by;
    while !left.is_zero() {
        let now = step.min(left);
        tokio::time::advance(now).await;
        left -= now;
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }
}
