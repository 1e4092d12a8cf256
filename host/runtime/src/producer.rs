//! A job producer: a component of the `job-producer` world, asked for the
//! plan of a schedule. Each call runs in a fresh instance under the
//! producer's limits, so nothing a producer computes survives between
//! plans: its settings are its whole input.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::Instrument as _;

use crate::bindings::producer::JobProducerPre;
use crate::bindings::producer::exports::pulse::job::producer as wit;
use crate::bounds::{LogGate, MAX_ERROR_TEXT, cut};
use crate::engine::RuntimeInner;
use crate::error::{CallError, JobError, LoadError};
use crate::host::HostState;
use crate::instance::{classify, new_store, refuel};
use crate::limits::{Limiter, Limits, Quota};
use crate::metrics::PluginMetrics;
use crate::outbound::{Outbound, OutboundHooks};
use crate::outputs::NoJobs;
use crate::plugin::{check_options, compile};

const PRODUCER_WORLD: &str = "job-producer";

/// How to run a producer. Defaults: [`Limits::default`], no settings.
#[derive(Debug, Clone, Default)]
pub struct ProducerOptions {
    /// Limits of each call.
    pub limits: Limits,
    /// Settings the producer reads with `config(name)`.
    pub settings: BTreeMap<String, String>,
    /// What it may reach over HTTP (nothing by default).
    pub outbound: Outbound,
}

/// Which jobs should run, as a producer answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Jobs to have running: key and payload.
    pub start: Vec<(String, Vec<u8>)>,
    /// Keys to stop.
    pub stop: Vec<String>,
    /// Stop every job the schedule started that is not in `start`.
    pub stop_all: bool,
}

/// A producer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanAnswer {
    /// The plan for now.
    Plan(Plan),
    /// The schedule is over.
    Finished,
}

/// A producer ready to be asked: compiled, checked and pre-instantiated.
/// Cheap to clone.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<ProducerInner>,
}

struct ProducerInner {
    name: String,
    pre: JobProducerPre<HostState>,
    limits: Limits,
    settings: Arc<BTreeMap<String, String>>,
    fuel_enabled: bool,
    metrics: Arc<PluginMetrics>,
    quota: Arc<Quota>,
    outbound: Arc<Outbound>,
    connections: Arc<crate::outbound::Connections>,
}

impl Producer {
    pub(crate) fn load(
        runtime: &RuntimeInner,
        name: &str,
        bytes: &[u8],
        options: ProducerOptions,
    ) -> Result<Self, LoadError> {
        check_options(name, &options.limits, runtime)?;
        let instance_pre = compile(runtime, name, bytes, PRODUCER_WORLD)?;
        let pre = JobProducerPre::new(instance_pre).map_err(|e| LoadError::WrongWorld {
            plugin: name.to_owned(),
            world: PRODUCER_WORLD,
            message: format!("{e:#}"),
        })?;
        Ok(Self {
            inner: Arc::new(ProducerInner {
                name: name.to_owned(),
                pre,
                limits: options.limits,
                settings: Arc::new(options.settings),
                fuel_enabled: runtime.config.fuel_enabled(),
                metrics: Arc::new(PluginMetrics::producer(name)),
                quota: Quota::new(name, options.limits.instances),
                outbound: Arc::new(options.outbound),
                connections: Arc::default(),
            }),
        })
    }

    /// The producer's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Asks the producer for its plan, in a new instance.
    ///
    /// # Errors
    /// [`CallError::Guest`] with [`JobError::Retryable`] when the producer
    /// answered `failed`; the trap or limit that ended the call.
    ///
    /// # Cancel safety
    /// Cancel safe: the guest call runs on its own instance, which is dropped
    /// with the future.
    pub async fn plan(&self) -> Result<PlanAnswer, CallError> {
        let inner = &self.inner;
        let state = HostState::new(
            Limiter::new(inner.limits.memory, inner.metrics.clone(), inner.quota.clone())?,
            inner.settings.clone(),
            Arc::new(NoJobs),
            // A sender whose receiver is gone: a producer has no timers.
            tokio::sync::mpsc::channel(1).0.downgrade(),
            LogGate::new(inner.metrics.log_dropped.clone()),
            OutboundHooks::new(
                &inner.name,
                (inner.outbound.clone(), inner.connections.clone()),
                Arc::new(NoJobs),
                inner.metrics.clone(),
                false,
            ),
        );
        let mut store = new_store(inner.pre.engine(), state, inner.fuel_enabled)?;
        refuel(&mut store, &inner.limits, inner.fuel_enabled)?;
        let span = tracing::info_span!("plan", producer = %inner.name);
        let call = async {
            let started = std::time::Instant::now();
            let bindings = inner
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| classify(e, &inner.limits).into_instantiate())?;
            inner.metrics.instantiated(started.elapsed());
            bindings.pulse_job_producer().call_plan(&mut store).await.map_err(|e| classify(e, &inner.limits))
        };
        let began = std::time::Instant::now();
        let answer = match tokio::time::timeout(inner.limits.call_timeout, call.instrument(span)).await {
            Err(_elapsed) => Err(CallError::Timeout(inner.limits.call_timeout)),
            Ok(Err(error)) => Err(error),
            Ok(Ok(Err(wit::ProducerError::Finished))) => Ok(PlanAnswer::Finished),
            Ok(Ok(Err(wit::ProducerError::Failed(message)))) => {
                Err(CallError::Guest(JobError::Retryable(cut(message, MAX_ERROR_TEXT))))
            }
            Ok(Ok(Ok(plan))) => Ok(PlanAnswer::Plan(Plan {
                start: plan.start.into_iter().map(|job| (job.key, job.payload)).collect(),
                stop: plan.stop,
                stop_all: plan.stop_all,
            })),
        };
        inner.metrics.call("plan", &answer, began.elapsed());
        answer
    }
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("name", &self.inner.name)
            .field("limits", &self.inner.limits)
            .finish_non_exhaustive()
    }
}
