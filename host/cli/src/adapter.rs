//! A plugin as a pool worker: the pool's [`JobHandler`] over the runtime's
//! [`JobRunner`], and the runtime's [`JobOutputs`] over the pool's
//! [`JobContext`]; a producer plugin as a schedule's [`JobProducer`]. The
//! one place that sees both pool and runtime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use pulse_pool::{ContextError, HandlerError, JobContext, JobHandler, JobProducer, Plan, ProducerError};
use pulse_runtime::{
    BoxFuture, CallError, Fence, HostRefusal, JobError, JobOutputs, JobRunner, PlanAnswer, Plugin, Producer,
};
use tracing::Instrument as _;

use crate::gate::Record;

/// The contexts of the jobs a worker runs, by key: how a plugin's requests
/// reach the pool, fenced by each job's token. Each is shared, not copied:
/// one guest call asks for its job's several times (whether it may run,
/// its call's scope, each emit), and a copy is three strings.
#[derive(Default, Clone)]
struct Contexts(Arc<Mutex<HashMap<String, Arc<JobContext>>>>);

impl Contexts {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<JobContext>>> {
        // Held for one map operation (in `check`, with a look at one
        // context's fence, which takes no lock of this map), never across
        // an await.
        self.0.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn insert(&self, key: String, ctx: JobContext) {
        self.lock().insert(key, Arc::new(ctx));
    }

    fn get(&self, key: &str) -> Option<Arc<JobContext>> {
        self.lock().get(key).cloned()
    }

    /// Whether job `key` has a context and `holds` says true of it.
    fn check(&self, key: &str, holds: impl FnOnce(&JobContext) -> bool) -> bool {
        self.lock().get(key).is_some_and(|ctx| holds(ctx))
    }

    fn remove(&self, key: &str) -> Option<Arc<JobContext>> {
        self.lock().remove(key)
    }

    /// [`Self::remove`], as a context of its own (for the upgrade gate,
    /// which may hold it).
    fn take(&self, key: &str) -> Option<JobContext> {
        self.remove(key).map(Arc::unwrap_or_clone)
    }
}

/// One worker's plugin, counting what it does in `record` (for the
/// upgrade gate, which also has it hold the jobs it fails on trial).
pub struct WasmHandler {
    runner: JobRunner,
    contexts: Contexts,
    record: Arc<Record>,
    /// The plugin's name and release, for trace spans.
    plugin: Arc<str>,
    release: Arc<pulse_pool::Release>,
}

impl WasmHandler {
    pub(crate) fn new(plugin: &Plugin, release: &pulse_pool::Release, record: Arc<Record>) -> Self {
        let contexts = Contexts::default();
        let outputs = PoolOutputs { contexts: contexts.clone(), record: record.clone() };
        let runner = plugin.runner(Arc::new(outputs));
        Self { runner, contexts, record, plugin: plugin.name().into(), release: Arc::new(release.clone()) }
    }

    /// The trace span of a guest call (`plugin.start`, `plugin.notify`):
    /// the requests the guest sends are its children. Disabled unless
    /// traces are exported.
    fn trace_span(&self, name: &'static str, key: &str) -> tracing::Span {
        tracing::trace_span!(
            target: pulse_telemetry::TARGET,
            "pulse",
            otel.name = name,
            otel.status_code = tracing::field::Empty,
            pulse.job.key = key,
            pulse.plugin = %self.plugin,
            pulse.release = %self.release.digest,
            pulse.release.version = %self.release.version,
            "error.message" = tracing::field::Empty,
        )
    }

    /// What a call that ended job `key` with `error` answers the pool:
    /// the error, or [`HandlerError::Held`] while the worker is on trial.
    fn ended(&self, key: &str, error: HandlerError, ctx: Option<JobContext>) -> HandlerError {
        match self.record.failed(key, &error.to_string(), ctx) {
            true => HandlerError::Held(format!("the plugin's new release failed it on trial: {error}")),
            false => error,
        }
    }
}

impl JobHandler for WasmHandler {
    async fn start(&self, job: pulse_pool::Job, ctx: JobContext) -> Result<(), HandlerError> {
        let key = job.key.clone();
        let requeued = job.requeued;
        self.record.started();
        self.contexts.insert(key.clone(), ctx);
        let job = pulse_runtime::Job {
            key: job.key,
            payload: job.payload,
            created_at_ms: job.created_at_ms,
            requeued: job.requeued,
            attempt: job.attempt,
            state: job.state,
        };
        let span = self.trace_span("plugin.start", &key);
        let started = self.runner.start(job).instrument(span.clone()).await;
        traced_error(&span, &started);
        let Err(error) = started else { return Ok(()) };
        let ctx = self.contexts.take(&key);
        match handler_error(error) {
            // A job with saved state refused: the release cannot read it.
            error @ HandlerError::Fatal(_) => Err(self.ended(&key, error, ctx)),
            error @ HandlerError::InvalidInput(_) if requeued => Err(self.ended(&key, error, ctx)),
            error => Err(error),
        }
    }

    async fn stop(&self, key: &str) -> Result<(), HandlerError> {
        self.record.release(key);
        let result = self.runner.stop(key).await;
        self.contexts.remove(key);
        match result {
            Ok(()) | Err(CallError::NotRunning(_)) => Ok(()),
            Err(error) => Err(handler_error(error)),
        }
    }

    async fn notify(&self, key: &str, payload: Vec<u8>, _seq: u64) -> Result<(), HandlerError> {
        if let Some(reason) = self.record.held(key) {
            return Err(HandlerError::Held(format!(
                "the plugin's new release failed the job on trial: {reason}"
            )));
        }
        let span = self.trace_span("plugin.notify", key);
        let notified = self.runner.notify(key, payload).instrument(span.clone()).await;
        traced_error(&span, &notified);
        let Err(error) = notified else { return Ok(()) };
        if !error.ends_job() {
            return Err(handler_error(error));
        }
        let ctx = self.contexts.take(key);
        match handler_error(error) {
            error @ HandlerError::Fatal(_) => Err(self.ended(key, error, ctx)),
            error => Err(error),
        }
    }

    async fn abandon(&self, key: &str) {
        self.record.release(key);
        self.contexts.remove(key);
        self.runner.abandon(key).await;
    }

    async fn saved_state(&self, key: &str) -> Option<Vec<u8>> {
        self.runner.saved_state(key).await
    }
}

/// Records a guest call's error on its trace span.
fn traced_error(span: &tracing::Span, result: &Result<(), CallError>) {
    if let Err(error) = result
        && !span.is_disabled()
    {
        span.record("otel.status_code", "ERROR").record("error.message", error.to_string());
    }
}

/// What a plugin's outcome means for the pool: its own errors keep their
/// kind; traps and exhausted limits end the job (fatal) with their reason;
/// an instance that could not be created may be next time (retryable).
fn handler_error(error: CallError) -> HandlerError {
    match error {
        CallError::Guest(JobError::InvalidInput(message)) => HandlerError::InvalidInput(message),
        CallError::Guest(JobError::Retryable(message)) => HandlerError::Retryable(message),
        CallError::Guest(JobError::Fatal(message)) => HandlerError::Fatal(message),
        CallError::Instantiate(message) => {
            HandlerError::Retryable(format!("failed to instantiate the plugin: {message}"))
        }
        // The job may run elsewhere: nothing of it is this worker's to
        // record (the worker writes nothing of a call that ended so), and
        // never a failure.
        error @ (CallError::Lost(_) | CallError::Fenced(_)) => HandlerError::Retryable(error.to_string()),
        other => HandlerError::Fatal(other.to_string()),
    }
}

/// A plugin's requests, sent to the pool through its job's context.
struct PoolOutputs {
    contexts: Contexts,
    record: Arc<Record>,
}

impl JobOutputs for PoolOutputs {
    fn emit<'a>(&'a self, key: &'a str, payload: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async move {
            let ctx = self.contexts.get(key).ok_or(HostRefusal::NotOwned)?;
            ctx.emit(&payload).await.map_err(refusal)?;
            self.record.output();
            Ok(())
        })
    }

    fn save_state<'a>(&'a self, key: &'a str, state: Vec<u8>) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async move {
            let ctx = self.contexts.get(key).ok_or(HostRefusal::NotOwned)?;
            ctx.save_state(&state).await.map_err(refusal)?;
            self.record.output();
            Ok(())
        })
    }

    fn complete<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), HostRefusal>> {
        Box::pin(async move {
            let ctx = self.contexts.get(key).ok_or(HostRefusal::NotOwned)?;
            ctx.complete().await.map_err(refusal)?;
            self.contexts.remove(key);
            self.record.output();
            Ok(())
        })
    }

    fn call_scope(&self, key: &str) -> Option<Box<dyn Send>> {
        let ctx = self.contexts.get(key)?;
        Some(Box::new(ctx.call_scope()))
    }

    fn may_run(&self, key: &str) -> bool {
        self.contexts.check(key, JobContext::is_live)
    }

    fn lost(&self, key: &str) -> bool {
        self.contexts.check(key, JobContext::is_lost)
    }

    fn fence(&self, key: &str) -> Option<Fence> {
        let ctx = self.contexts.get(key)?;
        // Tokens are the counter's decimal values (`take_tokens`).
        let token = ctx.token().parse().ok()?;
        Some(Fence { pool: ctx.pool().to_owned(), key: key.to_owned(), token })
    }

    fn job_failed<'a>(&'a self, key: &'a str, error: &'a CallError) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(ctx) = self.contexts.take(key) else { return };
            if !ctx.is_live() {
                return; // the worker lost the job: its record is not ours to change
            }
            if self.record.failed(key, &error.to_string(), Some(ctx.clone())) {
                return; // held: the release is on trial
            }
            if let Err(refused) = ctx.fail(&error.to_string()).await {
                tracing::warn!(job.key = key, error = %refused, "failed to record a job's failure");
            }
        })
    }
}

fn refusal(error: ContextError) -> HostRefusal {
    match error {
        ContextError::NotOwned => HostRefusal::NotOwned,
        ContextError::TooLarge { size, limit } => {
            HostRefusal::LimitExceeded(format!("{size} bytes exceed the limit of {limit} bytes"))
        }
        ContextError::Unavailable(message) => HostRefusal::Unavailable(message),
    }
}

/// A producer plugin as a schedule's [`JobProducer`].
#[derive(Debug)]
pub struct WasmProducer {
    producer: Producer,
}

impl WasmProducer {
    pub fn new(producer: &Producer) -> Self {
        Self { producer: producer.clone() }
    }
}

impl JobProducer for WasmProducer {
    async fn plan(&self) -> Result<Plan, ProducerError> {
        match self.producer.plan().await {
            Ok(PlanAnswer::Plan(plan)) => {
                Ok(Plan { start: plan.start, stop: plan.stop, stop_all: plan.stop_all })
            }
            Ok(PlanAnswer::Finished) => Err(ProducerError::Finished),
            Err(error) => Err(ProducerError::Failed(format!("producer {:?}: {error}", self.producer.name()))),
        }
    }
}
