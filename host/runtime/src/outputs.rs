//! Where a handler's requests go: the [`JobOutputs`] seam, and
//! [`Recorder`], an in-memory implementation for tests and examples.
//!
//! The pool implements [`JobOutputs`] with Redis scripts fenced by the job's
//! token; the runtime only forwards the requests and their answers.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::error::{CallError, HostRefusal};

/// A boxed future, as [`JobOutputs`] methods return (the trait is used as a
/// `dyn` object inside every store).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The host side of `emit`, `save-state` and `complete`, and the report of
/// jobs that ended outside any caller's call.
pub trait JobOutputs: Send + Sync + 'static {
    /// Publishes an output event of job `key`.
    fn emit<'a>(&'a self, key: &'a str, payload: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>>;

    /// Stores the state of job `key`, replacing the previous one.
    fn save_state<'a>(&'a self, key: &'a str, state: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>>;

    /// Records that job `key` completed by itself. On `Ok` the runtime drops
    /// the job and calls nothing more for it.
    fn complete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), HostRefusal>>;

    /// Job `key` ended, not in a call someone is waiting for: a timer
    /// callback failed or trapped, or a restart after another job's trap
    /// failed. The job no longer runs here.
    fn job_failed<'a>(&'a self, key: &'a str, error: &'a CallError) -> BoxFuture<'a, ()>;

    /// The fence of job `key`'s run here: what `env.fence` answers and what
    /// its outgoing HTTP requests carry. The default has none.
    fn fence(&self, key: &str) -> Option<Fence> {
        let _ = key;
        None
    }

    /// Whether job `key`'s code may run now. Asked before every guest call
    /// for the job, timer callbacks included: a host that may have lost
    /// the job (its lease ended) answers false, and the call is not made.
    /// The default always allows.
    fn may_run(&self, key: &str) -> bool {
        let _ = key;
        true
    }

    /// A guest call of job `key` begins; it ends when the returned value is
    /// dropped. What the call writes (`emit`, `save-state`, `complete`)
    /// may wait for its end, to be written in one step: the pool's
    /// implementation does so. Opened around every guest call, timer
    /// callbacks included. The default keeps nothing.
    fn call_scope(&self, key: &str) -> Option<Box<dyn Send>> {
        let _ = key;
        None
    }

    /// Whether job `key` is lost here: it may run elsewhere now (its
    /// worker's lease may have ended). Asked every [`LOSS_CHECK`] while a
    /// guest call for the job runs: the call is cut off at once, its
    /// instance discarded, and it ends with [`CallError::Lost`]. Not the
    /// same as `!may_run`: a host waiting for its jobs to be written back
    /// after Redis lost its data calls nothing meanwhile, but a call in
    /// flight keeps its instance. The default is never.
    fn lost(&self, key: &str) -> bool {
        let _ = key;
        false
    }
}

/// How often a guest call checks that its job is not lost
/// ([`JobOutputs::lost`]).
pub const LOSS_CHECK: Duration = Duration::from_millis(50);

/// The outputs of an instance that runs no job: a producer's (its world
/// does not import the job requests; a component that imports them anyway
/// gets `not-owned`), or one made ahead of need until a start binds it
/// (`ready`). Every job request is refused, and no job's code may run.
pub(crate) struct NoJobs;

impl JobOutputs for NoJobs {
    fn emit<'a>(&'a self, _key: &'a str, _payload: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async { Err(HostRefusal::NotOwned) })
    }

    fn save_state<'a>(&'a self, _key: &'a str, _state: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async { Err(HostRefusal::NotOwned) })
    }

    fn complete<'a>(&'a self, _key: &'a str) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async { Err(HostRefusal::NotOwned) })
    }

    fn job_failed<'a>(&'a self, _key: &'a str, _error: &'a CallError) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// A producer's requests are not fenced, so this is asked of a
    /// job-handler's instance only.
    fn may_run(&self, _key: &str) -> bool {
        false
    }
}

/// The fence of one run of a job (the `fence` record of the WIT
/// contract): a service the job writes to keeps the largest `token` it saw
/// per pool and key and refuses writes with a smaller one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The job's pool.
    pub pool: String,
    /// The job's key.
    pub key: String,
    /// The run's fencing token.
    pub token: u64,
}

impl Fence {
    /// The value of the header outgoing requests carry:
    /// `<pool>/<key>/<token>`, the key percent-encoded (every byte but
    /// ASCII letters, digits, `-`, `.`, `_` and `~`), so the value is
    /// visible ASCII and splits at its two `/`.
    pub fn header_value(&self) -> String {
        let mut value = String::with_capacity(self.pool.len() + self.key.len() + 22);
        value.push_str(&self.pool);
        value.push('/');
        for byte in self.key.bytes() {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                value.push(char::from(byte));
            } else {
                value.push_str(&format!("%{byte:02X}"));
            }
        }
        value.push('/');
        value.push_str(&self.token.to_string());
        value
    }
}

/// One request a handler made, as [`Recorder`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// `emit(key, payload)`.
    Emit {
        /// The job.
        key: String,
        /// What it emitted.
        payload: Vec<u8>,
    },
    /// `save-state(key, state)`.
    SaveState {
        /// The job.
        key: String,
        /// What it saved.
        state: Vec<u8>,
    },
    /// `complete(key)`.
    Complete {
        /// The job.
        key: String,
    },
    /// [`JobOutputs::job_failed`].
    Failed {
        /// The job.
        key: String,
        /// Why.
        error: CallError,
    },
}

impl Output {
    /// The job the output is for.
    pub fn key(&self) -> &str {
        match self {
            Output::Emit { key, .. }
            | Output::SaveState { key, .. }
            | Output::Complete { key }
            | Output::Failed { key, .. } => key,
        }
    }
}

/// An in-memory [`JobOutputs`]: records every request in order, keeps the
/// last saved state per key, and refuses requests for keys told to refuse.
#[derive(Debug, Default, Clone)]
pub struct Recorder {
    inner: Arc<RecorderInner>,
}

#[derive(Debug, Default)]
struct RecorderInner {
    state: Mutex<RecorderState>,
    changed: Notify,
    observer: Mutex<Option<Observer>>,
}

/// What [`Recorder::observe`] calls with each output.
#[derive(Clone)]
struct Observer(Arc<dyn Fn(&Output) + Send + Sync>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

#[derive(Debug, Default)]
struct RecorderState {
    outputs: Vec<Output>,
    saved: HashMap<String, Vec<u8>>,
    refusals: HashMap<String, HostRefusal>,
    fenced: std::collections::HashSet<String>,
    fences: HashMap<String, Fence>,
    lost: std::collections::HashSet<String>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every output so far, in order.
    pub fn outputs(&self) -> Vec<Output> {
        self.lock().outputs.clone()
    }

    /// The outputs of one job, in order.
    pub fn outputs_of(&self, key: &str) -> Vec<Output> {
        self.lock().outputs.iter().filter(|o| o.key() == key).cloned().collect()
    }

    /// The payloads job `key` emitted, in order.
    pub fn emitted(&self, key: &str) -> Vec<Vec<u8>> {
        self.lock()
            .outputs
            .iter()
            .filter_map(|o| match o {
                Output::Emit { key: k, payload } if k == key => Some(payload.clone()),
                _ => None,
            })
            .collect()
    }

    /// The state job `key` saved last.
    pub fn saved_state(&self, key: &str) -> Option<Vec<u8>> {
        self.lock().saved.get(key).cloned()
    }

    /// From now on, refuse every request for `key` with `refusal`.
    pub fn refuse(&self, key: &str, refusal: HostRefusal) {
        self.lock().refusals.insert(key.to_owned(), refusal);
    }

    /// From now on, answer that job `key`'s code may not run (as a host
    /// that lost the job does).
    pub fn fence(&self, key: &str) {
        self.lock().fenced.insert(key.to_owned());
    }

    /// From now on, answer that job `key` is lost (as a host whose lease
    /// ended does): a call running for it is cut off, and none is made.
    pub fn lose(&self, key: &str) {
        let mut state = self.lock();
        state.fenced.insert(key.to_owned());
        state.lost.insert(key.to_owned());
    }

    /// From now on, give job `key` `fence` (`env.fence`, and the header of
    /// its outgoing requests).
    pub fn set_fence(&self, fence: Fence) {
        self.lock().fences.insert(fence.key.clone(), fence);
    }

    /// Waits until `done` holds for the outputs so far, or `timeout` passes.
    /// Returns the outputs either way; the caller asserts on them.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&[Output]) -> bool) -> Vec<Output> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register interest before checking, so no change is missed
            // between the check and the wait.
            let changed = self.inner.changed.notified();
            {
                let state = self.lock();
                if done(&state.outputs) {
                    return state.outputs.clone();
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.outputs();
            }
        }
    }

    /// From now on, calls `observer` with each output as it is recorded
    /// (outside the recorder's lock), after it is recorded: what `pulse-host
    /// try` prints as it happens.
    pub fn observe(&self, observer: impl Fn(&Output) + Send + Sync + 'static) {
        *self.inner.observer.lock().unwrap_or_else(|poison| poison.into_inner()) =
            Some(Observer(Arc::new(observer)));
    }

    fn lock(&self) -> MutexGuard<'_, RecorderState> {
        // A panic while holding this lock is already a test failure.
        self.inner.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Records `output` (refused first when told), then tells the
    /// observer and the waiters.
    fn push(&self, output: Output) {
        let observer = self.inner.observer.lock().unwrap_or_else(|poison| poison.into_inner()).clone();
        if let Some(Observer(observer)) = observer {
            observer(&output);
        }
        let mut state = self.lock();
        if let Output::SaveState { key, state: bytes } = &output {
            state.saved.insert(key.clone(), bytes.clone());
        }
        state.outputs.push(output);
        drop(state);
        self.inner.changed.notify_waiters();
    }

    fn record(&self, key: &str, output: Output) -> Result<(), HostRefusal> {
        if let Some(refusal) = self.lock().refusals.get(key) {
            return Err(refusal.clone());
        }
        self.push(output);
        Ok(())
    }
}

impl JobOutputs for Recorder {
    fn emit<'a>(&'a self, key: &'a str, payload: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async move { self.record(key, Output::Emit { key: key.to_owned(), payload }) })
    }

    fn save_state<'a>(&'a self, key: &'a str, state: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async move { self.record(key, Output::SaveState { key: key.to_owned(), state }) })
    }

    fn complete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async move { self.record(key, Output::Complete { key: key.to_owned() }) })
    }

    fn may_run(&self, key: &str) -> bool {
        !self.lock().fenced.contains(key)
    }

    fn fence(&self, key: &str) -> Option<Fence> {
        self.lock().fences.get(key).cloned()
    }

    fn lost(&self, key: &str) -> bool {
        self.lock().lost.contains(key)
    }

    fn job_failed<'a>(&'a self, key: &'a str, error: &'a CallError) -> BoxFuture<'a, ()> {
        Box::pin(async move { self.push(Output::Failed { key: key.to_owned(), error: error.clone() }) })
    }
}
