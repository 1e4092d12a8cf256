//! [`Instance`]: one component instance in its own store, and the guest
//! calls it makes under its plugin's limits.
//!
//! A [`crate::JobRunner`] drives instances from tasks that serialize their
//! calls and deliver timer ticks (see `actor`); an instance created alone
//! with [`crate::Plugin::instantiate`] is for measuring and embedding: its
//! timers never fire, as no task receives their ticks.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;
use wasmtime::Store;

use crate::actor::WeakCommands;
use crate::bindings::JobHandler;
use crate::bindings::pulse::job::types as wit;
use crate::bounds::{LogGate, MAX_ERROR_TEXT, cut};
use crate::error::{CallError, JobError};
use crate::host::{HostState, JobSlot};
use crate::job::Job;
use crate::limits::{Limiter, Limits, MemoryLimitExceeded};
use crate::metrics::PluginMetrics;
use crate::outbound::OutboundHooks;
use crate::outputs::{JobOutputs, LOSS_CHECK};
use crate::plugin::PluginInner;

/// The guest call to make.
#[derive(Debug, Clone, Copy)]
pub(crate) enum GuestCall<'a> {
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

/// One instance of a plugin: a store, the guest in it, and the jobs it runs.
///
/// After a call fails with an error that [poisons](CallError::poisons_instance)
/// the instance, drop it.
pub struct Instance {
    store: Store<HostState>,
    bindings: JobHandler,
    limits: Limits,
    fuel_enabled: bool,
    metrics: Arc<PluginMetrics>,
}

impl Instance {
    /// Creates a store and instantiates the plugin in it; timer ticks go to
    /// `commands`.
    pub(crate) async fn new(
        plugin: &PluginInner,
        outputs: Arc<dyn JobOutputs>,
        commands: WeakCommands,
    ) -> Result<Self, CallError> {
        let limiter = Limiter::new(plugin.limits.memory, plugin.metrics.clone(), plugin.quota.clone())?;
        let gate = LogGate::new(plugin.metrics.log_dropped.clone());
        let http = OutboundHooks::new(
            &plugin.name,
            (plugin.outbound.clone(), plugin.connections.clone()),
            outputs.clone(),
            plugin.metrics.clone(),
            true,
        );
        let state = HostState::new(limiter, plugin.settings.clone(), outputs, commands, gate, http);
        let mut store = new_store(plugin.pre.engine(), state, plugin.fuel_enabled)?;
        let started = std::time::Instant::now();
        let bindings = plugin
            .pre
            .instantiate_async(&mut store)
            .await
            .map_err(|e| classify(e, &plugin.limits).into_instantiate())?;
        plugin.metrics.instantiated(started.elapsed());
        Ok(Self {
            store,
            bindings,
            limits: plugin.limits,
            fuel_enabled: plugin.fuel_enabled,
            metrics: plugin.metrics.clone(),
        })
    }

    /// Sends this instance's requests to `outputs` and its timers' ticks
    /// to `commands` from now on: an instance made ahead of need is bound
    /// by the start that takes it.
    pub(crate) fn bind(&mut self, outputs: Arc<dyn JobOutputs>, commands: WeakCommands) {
        self.store.data_mut().bind(outputs, commands);
    }

    /// Starts `job` in this instance.
    ///
    /// # Errors
    /// [`CallError::AlreadyRunning`], the handler's refusal, or the trap or
    /// limit that ended the call; the job does not run here afterwards.
    ///
    /// # Cancel safety
    /// Not cancel safe: a guest call dropped part way leaves the instance in
    /// whatever state the guest reached; drop the instance then.
    pub async fn start(&mut self, job: &Job) -> Result<(), CallError> {
        if self.runs(&job.key) {
            return Err(CallError::AlreadyRunning(job.key.clone()));
        }
        // Before the call: `start` may already arm timers or save state.
        self.jobs().insert(job.key.clone(), JobSlot::new(job.clone()));
        let result = self.call(GuestCall::Start(job)).await;
        if result.is_err() {
            self.drop_job(&job.key);
        }
        result
    }

    /// Stops job `key`; it stops whatever the handler answers.
    ///
    /// # Errors
    /// [`CallError::NotRunning`], or the handler's error, trap or limit.
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Instance::start`]).
    pub async fn stop(&mut self, key: &str) -> Result<(), CallError> {
        if !self.runs(key) {
            return Err(CallError::NotRunning(key.to_owned()));
        }
        let result = self.call(GuestCall::Stop(key)).await;
        self.drop_job(key);
        result
    }

    /// Delivers a notification to job `key`.
    ///
    /// # Errors
    /// [`CallError::NotRunning`], or the handler's error, trap or limit;
    /// when [`CallError::ends_job`] holds, the job no longer runs here.
    ///
    /// # Cancel safety
    /// Not cancel safe (see [`Instance::start`]).
    pub async fn notify(&mut self, key: &str, payload: &[u8]) -> Result<(), CallError> {
        if !self.runs(key) {
            return Err(CallError::NotRunning(key.to_owned()));
        }
        let result = self.call(GuestCall::Notify(key, payload)).await;
        if let Err(error) = &result
            && error.ends_job()
        {
            self.drop_job(key);
        }
        result
    }

    /// Whether job `key` runs in this instance.
    pub fn runs(&self, key: &str) -> bool {
        self.store.data().jobs.contains_key(key)
    }

    /// How many jobs run in this instance.
    pub fn job_count(&self) -> usize {
        self.store.data().jobs.len()
    }

    pub(crate) fn jobs(&mut self) -> &mut HashMap<String, JobSlot> {
        &mut self.store.data_mut().jobs
    }

    /// Removes a job; dropping its slot cancels its timers.
    pub(crate) fn drop_job(&mut self, key: &str) {
        self.jobs().remove(key);
    }

    /// Records a timer's call beginning `late` after its due time.
    pub(crate) fn timer_late(&self, late: std::time::Duration) {
        self.metrics.timer_late(late);
    }

    /// What the instance's jobs may still log.
    pub(crate) fn log_gate(&self) -> Arc<LogGate> {
        self.store.data().log_gate.clone()
    }

    /// Takes the jobs that completed during the last call.
    pub(crate) fn take_completed(&mut self) -> Vec<String> {
        std::mem::take(&mut self.store.data_mut().completed)
    }

    /// Takes every job out, as a dead instance's survivors.
    pub(crate) fn take_jobs(&mut self) -> Vec<Job> {
        std::mem::take(self.jobs()).into_values().map(|slot| slot.job).collect()
    }

    /// Makes one guest call under the plugin's limits.
    pub(crate) async fn call(&mut self, call: GuestCall<'_>) -> Result<(), CallError> {
        let limits = self.limits;
        refuel(&mut self.store, &limits, self.fuel_enabled)?;
        let span = tracing::info_span!("call", job.key = call.key(), call = call.name());
        self.store.data().log_gate.enter(call.key());
        self.store.data_mut().http_hooks.enter(call.key());
        let outputs = self.store.data().outputs.clone();
        // Held until the call's end: what it wrote is written in one step.
        let _scope = outputs.call_scope(call.key());
        let handler = self.bindings.pulse_job_handler();
        let store = &mut self.store;
        let outcome = async {
            match call {
                GuestCall::Start(job) => handler.call_start(store, &to_wit(job)).await,
                GuestCall::Stop(key) => handler.call_stop(store, key).await,
                GuestCall::Notify(key, payload) => handler.call_notify(store, key, payload).await,
                GuestCall::Timer(key, name) => handler.call_on_timer(store, key, name).await,
            }
        };
        // Dropping the call future at the timeout, or once its job is lost,
        // abandons the guest mid-call; the instance is then poisoned and
        // dropped (see `poisons_instance`).
        let began = std::time::Instant::now();
        let result = match bounded(outcome.instrument(span), limits.call_timeout, &*outputs, call.key()).await
        {
            Err(cut) => Err(cut),
            Ok(Err(trap)) => Err(classify(trap, &limits)),
            Ok(Ok(Err(guest))) => Err(CallError::Guest(from_wit(guest))),
            Ok(Ok(Ok(()))) => Ok(()),
        };
        self.metrics.call(call.name(), &result, began.elapsed());
        result
    }
}

/// `call`'s outcome, unless it runs past `timeout` or job `key` is lost
/// first (asked every [`LOSS_CHECK`]): then the call is dropped. One timer
/// at a time serves both, so a short call costs what a timeout alone
/// does.
async fn bounded<F: Future>(
    call: F,
    timeout: Duration,
    outputs: &dyn JobOutputs,
    key: &str,
) -> Result<F::Output, CallError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut call = std::pin::pin!(call);
    loop {
        let check = (tokio::time::Instant::now() + LOSS_CHECK).min(deadline);
        if let Ok(outcome) = tokio::time::timeout_at(check, &mut call).await {
            return Ok(outcome);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CallError::Timeout(timeout));
        }
        if outputs.lost(key) {
            return Err(CallError::Lost(key.to_owned()));
        }
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance").field("jobs", &self.job_count()).finish_non_exhaustive()
    }
}

/// A store for one instance, limited by its state's limiter.
pub(crate) fn new_store(
    engine: &wasmtime::Engine,
    state: HostState,
    fuel_enabled: bool,
) -> Result<Store<HostState>, CallError> {
    let mut store = Store::new(engine, state);
    store.limiter(|state| &mut state.limiter);
    // Yield to the async runtime at every epoch tick, so a guest that
    // computes without end cannot hold a worker thread and the call
    // timeout can fire (a new store's deadline is 0: set it first).
    store.epoch_deadline_async_yield_and_update(1);
    if fuel_enabled {
        store.set_fuel(u64::MAX).map_err(|e| CallError::Instantiate(format!("{e:#}")))?;
    }
    Ok(store)
}

/// Gives the store the fuel budget of one call (when fuel is enabled).
pub(crate) fn refuel(
    store: &mut Store<HostState>,
    limits: &Limits,
    fuel_enabled: bool,
) -> Result<(), CallError> {
    if fuel_enabled {
        let fuel = limits.fuel.unwrap_or(u64::MAX);
        store.set_fuel(fuel).map_err(|e| CallError::Trap(format!("{e:#}")))?;
    }
    Ok(())
}

/// Turns a wasmtime error from a call into a typed outcome.
pub(crate) fn classify(error: wasmtime::Error, limits: &Limits) -> CallError {
    if let Some(limit) = error.downcast_ref::<MemoryLimitExceeded>() {
        return CallError::MemoryLimit { limit: limit.limit };
    }
    if let Some(wasmtime::Trap::OutOfFuel) = error.downcast_ref::<wasmtime::Trap>() {
        return CallError::FuelExhausted(limits.fuel.unwrap_or(0));
    }
    // The root cause says what happened ("wasm trap: wasm `unreachable`
    // instruction executed"); the guest backtrace goes to the debug log.
    tracing::debug!(error = ?error, "guest call failed");
    CallError::Trap(cut(error.root_cause().to_string(), MAX_ERROR_TEXT))
}

impl CallError {
    /// A failure while instantiating is reported as such, unless a limit
    /// explains it.
    pub(crate) fn into_instantiate(self) -> CallError {
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
        wit::JobError::InvalidInput(message) => JobError::InvalidInput(cut(message, MAX_ERROR_TEXT)),
        wit::JobError::Retryable(message) => JobError::Retryable(cut(message, MAX_ERROR_TEXT)),
        wit::JobError::Fatal(message) => JobError::Fatal(cut(message, MAX_ERROR_TEXT)),
    }
}
