//! One component instance and the task that owns it.
//!
//! An instance is driven by one task (an actor) that receives [`Command`]s
//! in order and makes one guest call at a time: this is what serializes the
//! calls to an instance and keeps the order per key. Timer ticks arrive on
//! the same channel, so they interleave with calls in arrival order.
//!
//! A call that traps, times out or exhausts a limit poisons the instance:
//! its store is dropped. Jobs it served besides the one that failed (worker
//! isolation) are started again in a fresh instance, from the state they
//! last saved, with `requeued` set.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;
use wasmtime::Store;

use crate::bindings::JobHandler;
use crate::bindings::pulse::job::types as wit;
use crate::error::{CallError, JobError};
use crate::host::{HostState, JobSlot};
use crate::job::Job;
use crate::limits::{Limiter, MemoryLimitExceeded};
use crate::outputs::JobOutputs;
use crate::plugin::PluginInner;

/// Commands queued per instance before callers wait: deep enough that a
/// burst of notifications does not stall its senders, small enough to bound
/// memory per instance.
pub(crate) const COMMAND_QUEUE: usize = 256;

/// A reply to a call.
pub(crate) type Reply = oneshot::Sender<Result<(), CallError>>;

/// What an instance's task is asked to do.
pub(crate) enum Command {
    Start { job: Job, reply: Reply },
    Stop { key: String, reply: Reply },
    Notify { key: String, payload: Vec<u8>, reply: Reply },
    Timer { key: String, name: String, generation: u64 },
}

/// Told when a job ends inside the instance, not as the answer to a call:
/// it completed, its timer callback failed, or its restart failed. Carries
/// the instance id, so a stale report never removes a newer instance's job.
pub(crate) type OnGone = Arc<dyn Fn(&str, u64) + Send + Sync>;

/// The guest call to make.
enum GuestCall<'a> {
    Start(&'a Job),
    Stop(&'a str),
    Notify(&'a str, &'a [u8]),
    Timer(&'a str, &'a str),
}

impl GuestCall<'_> {
    fn name(&self) -> &'static str {
        match self {
            GuestCall::Start(_) => "start",
            GuestCall::Stop(_) => "stop",
            GuestCall::Notify(..) => "notify",
            GuestCall::Timer(..) => "on-timer",
        }
    }

    fn key(&self) -> &str {
        match self {
            GuestCall::Start(job) => &job.key,
            GuestCall::Stop(key) | GuestCall::Notify(key, _) | GuestCall::Timer(key, _) => key,
        }
    }
}

/// A live instance: its store and its exports.
struct Live {
    store: Store<HostState>,
    bindings: JobHandler,
}

/// The task that owns an instance.
pub(crate) struct Actor {
    id: u64,
    plugin: Arc<PluginInner>,
    outputs: Arc<dyn JobOutputs>,
    commands: mpsc::WeakSender<Command>,
    on_gone: OnGone,
    live: Option<Live>,
}

impl Actor {
    /// Spawns the task behind a new channel; the instance itself is created
    /// by the first `start`.
    pub(crate) fn spawn(
        id: u64,
        plugin: Arc<PluginInner>,
        outputs: Arc<dyn JobOutputs>,
        on_gone: OnGone,
        tasks: &tokio_util::task::TaskTracker,
    ) -> mpsc::Sender<Command> {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let span = tracing::info_span!("instance", plugin = %plugin.name, instance = id);
        let actor = Self { id, plugin, outputs, commands: tx.downgrade(), on_gone, live: None };
        tasks.spawn(actor.run(rx).instrument(span));
        tx
    }

    /// Serves commands until every sender is gone.
    async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        while let Some(command) = rx.recv().await {
            match command {
                Command::Start { job, reply } => {
                    let _ = reply.send(self.start(job).await);
                }
                Command::Stop { key, reply } => {
                    let _ = reply.send(self.stop(&key).await);
                }
                Command::Notify { key, payload, reply } => {
                    let _ = reply.send(self.notify(&key, &payload).await);
                }
                Command::Timer { key, name, generation } => self.tick(&key, &name, generation).await,
            }
            self.report_completed();
        }
    }

    fn jobs(&mut self) -> Option<&mut HashMap<String, JobSlot>> {
        self.live.as_mut().map(|live| &mut live.store.data_mut().jobs)
    }

    fn runs(&mut self, key: &str) -> bool {
        self.jobs().is_some_and(|jobs| jobs.contains_key(key))
    }

    /// Removes a job from the instance; dropping its slot cancels its timers.
    fn drop_job(&mut self, key: &str) {
        if let Some(jobs) = self.jobs() {
            jobs.remove(key);
        }
    }

    async fn start(&mut self, job: Job) -> Result<(), CallError> {
        if self.runs(&job.key) {
            return Err(CallError::AlreadyRunning(job.key));
        }
        if self.live.is_none() {
            self.live = Some(self.instantiate().await?);
        }
        let key = job.key.clone();
        if let Some(jobs) = self.jobs() {
            // Before the call: `start` may already arm timers or save state.
            jobs.insert(key.clone(), JobSlot::new(job.clone()));
        }
        let result = self.call(GuestCall::Start(&job)).await;
        if let Err(error) = &result {
            self.drop_job(&key);
            self.after_failure(&key, error).await;
        }
        result
    }

    async fn stop(&mut self, key: &str) -> Result<(), CallError> {
        if !self.runs(key) {
            return Err(CallError::NotRunning(key.to_owned()));
        }
        let result = self.call(GuestCall::Stop(key)).await;
        // The job stops whatever the handler answered.
        self.drop_job(key);
        if let Err(error) = &result {
            self.after_failure(key, error).await;
        }
        result
    }

    async fn notify(&mut self, key: &str, payload: &[u8]) -> Result<(), CallError> {
        if !self.runs(key) {
            return Err(CallError::NotRunning(key.to_owned()));
        }
        let result = self.call(GuestCall::Notify(key, payload)).await;
        if let Err(error) = &result
            && error.ends_job()
        {
            self.drop_job(key);
            self.after_failure(key, error).await;
        }
        result
    }

    async fn tick(&mut self, key: &str, name: &str, generation: u64) {
        let due = self
            .jobs()
            .and_then(|jobs| jobs.get_mut(key))
            .is_some_and(|slot| slot.take_tick(name, generation));
        if !due {
            return; // cancelled, replaced, or the job is gone
        }
        match self.call(GuestCall::Timer(key, name)).await {
            Ok(()) => {}
            Err(error) if !error.ends_job() => {
                tracing::warn!(job.key = key, timer = name, error = %error, "timer callback failed");
            }
            Err(error) => {
                self.drop_job(key);
                self.after_failure(key, &error).await;
                self.end_job(key, &error).await;
            }
        }
    }

    /// Reports jobs that completed during the last call.
    fn report_completed(&mut self) {
        let completed = match self.live.as_mut() {
            Some(live) => std::mem::take(&mut live.store.data_mut().completed),
            None => return,
        };
        for key in completed {
            (self.on_gone)(&key, self.id);
        }
    }

    /// A job ended here without a caller to tell: report it. (`&mut self`
    /// only because `Actor` is `Send` but not `Sync`.)
    async fn end_job(&mut self, key: &str, error: &CallError) {
        tracing::warn!(job.key = key, error = %error, "job failed");
        self.outputs.job_failed(key, error).await;
        (self.on_gone)(key, self.id);
    }

    /// After a failed call: if it poisoned the instance, drop it and start
    /// its other jobs again in a new one.
    async fn after_failure(&mut self, failed_key: &str, error: &CallError) {
        if !error.poisons_instance() {
            return;
        }
        let Some(dead) = self.live.take() else { return };
        let survivors: Vec<Job> = {
            let mut store = dead.store;
            let jobs = std::mem::take(&mut store.data_mut().jobs);
            jobs.into_values().map(|slot| slot.job).filter(|job| job.key != failed_key).collect()
        };
        tracing::warn!(error = %error, restarting = survivors.len(), "instance discarded");
        if survivors.is_empty() {
            return;
        }
        match self.instantiate().await {
            Ok(live) => self.live = Some(live),
            Err(error) => {
                for job in &survivors {
                    self.end_job(&job.key, &error).await;
                }
                return;
            }
        }
        for mut job in survivors {
            job.requeued = true;
            // A restart that poisons the new instance restarts the rest again,
            // each time with one job fewer: this ends.
            if let Err(error) = Box::pin(self.start(job.clone())).await {
                self.end_job(&job.key, &error).await;
            }
        }
    }

    /// Creates a store and instance for this plugin.
    async fn instantiate(&mut self) -> Result<Live, CallError> {
        let plugin = &self.plugin;
        let state = HostState::new(
            Limiter::new(plugin.limits.memory),
            plugin.settings.clone(),
            self.outputs.clone(),
            self.commands.clone(),
        );
        let mut store = Store::new(plugin.pre.engine(), state);
        store.limiter(|state| &mut state.limiter);
        // Yield to the async runtime at every epoch tick, so a guest that
        // computes without end cannot hold a worker thread and the call
        // timeout can fire (a new store's deadline is 0: set it first).
        store.epoch_deadline_async_yield_and_update(1);
        if plugin.fuel_enabled {
            store.set_fuel(u64::MAX).map_err(|e| CallError::Instantiate(format!("{e:#}")))?;
        }
        let bindings = plugin
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| classify(e, &plugin.limits).into_instantiate())?;
        Ok(Live { store, bindings })
    }

    /// Makes one guest call under the plugin's limits.
    async fn call(&mut self, call: GuestCall<'_>) -> Result<(), CallError> {
        let limits = self.plugin.limits;
        let Some(live) = self.live.as_mut() else {
            return Err(CallError::NotRunning(call.key().to_owned()));
        };
        if self.plugin.fuel_enabled {
            let fuel = limits.fuel.unwrap_or(u64::MAX);
            live.store.set_fuel(fuel).map_err(|e| CallError::Trap(format!("{e:#}")))?;
        }
        let span = tracing::info_span!("call", job.key = call.key(), call = call.name());
        let handler = live.bindings.pulse_job_handler();
        let store = &mut live.store;
        let outcome = async {
            match call {
                GuestCall::Start(job) => handler.call_start(store, &to_wit(job)).await,
                GuestCall::Stop(key) => handler.call_stop(store, key).await,
                GuestCall::Notify(key, payload) => handler.call_notify(store, key, payload).await,
                GuestCall::Timer(key, name) => handler.call_on_timer(store, key, name).await,
            }
        };
        // Dropping the call future at the timeout abandons the guest mid-call;
        // the instance is then poisoned and dropped (see `poisons_instance`).
        match tokio::time::timeout(limits.call_timeout, outcome.instrument(span)).await {
            Err(_elapsed) => Err(CallError::Timeout(limits.call_timeout)),
            Ok(Err(trap)) => Err(classify(trap, &limits)),
            Ok(Ok(Err(guest))) => Err(CallError::Guest(from_wit(guest))),
            Ok(Ok(Ok(()))) => Ok(()),
        }
    }
}

/// Turns a wasmtime error from a call into a typed outcome.
fn classify(error: wasmtime::Error, limits: &crate::Limits) -> CallError {
    if let Some(limit) = error.downcast_ref::<MemoryLimitExceeded>() {
        return CallError::MemoryLimit { limit: limit.limit };
    }
    if let Some(wasmtime::Trap::OutOfFuel) = error.downcast_ref::<wasmtime::Trap>() {
        return CallError::FuelExhausted(limits.fuel.unwrap_or(0));
    }
    CallError::Trap(format!("{error:?}"))
}

impl CallError {
    /// A failure while instantiating is reported as such, unless a limit
    /// explains it.
    fn into_instantiate(self) -> CallError {
        match self {
            CallError::Trap(message) => CallError::Instantiate(message),
            other => other,
        }
    }
}

fn to_wit(job: &Job) -> wit::Job {
    wit::Job {
        key: job.key.clone(),
        payload: job.payload.clone(),
        created_at_ms: job.created_at_ms,
        requeued: job.requeued,
        attempt: job.attempt,
        state: job.state.clone(),
    }
}

fn from_wit(error: wit::JobError) -> JobError {
    match error {
        wit::JobError::InvalidInput(message) => JobError::InvalidInput(message),
        wit::JobError::Retryable(message) => JobError::Retryable(message),
        wit::JobError::Fatal(message) => JobError::Fatal(message),
    }
}
