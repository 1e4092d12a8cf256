//! Schedules: a [`JobProducer`] asked for its [`Plan`] at every tick of a
//! shared [`Ticker`] (so on one node per interval), and the plan applied to
//! the pool.
//!
//! Applying is idempotent: jobs of `start` that exist (running, waiting or
//! failed) are left alone, found with one `HMGET`, so a plan repeated every
//! tick dispatches nothing and logs nothing; the keys a schedule started
//! are kept in a set, which `stop_all` stops except those still planned.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tracing::Instrument as _;

use crate::error::Result;
use crate::job::{DispatchOutcome, EventOutcome};
use crate::node::Node;
use crate::ticker::Ticker;

/// Dispatches or stops of one plan in flight at once.
const CONCURRENCY: usize = 32;

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

/// Why a producer gave no plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProducerError {
    /// No plan this time: logged, and asked again at the next tick.
    Failed(String),
    /// The schedule is over, on every node; its jobs keep running.
    Finished,
}

/// Makes the plans of a schedule.
pub trait JobProducer: Send + Sync + 'static {
    /// The plan for now.
    fn plan(&self) -> impl Future<Output = std::result::Result<Plan, ProducerError>> + Send;
}

/// What applying one plan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Jobs dispatched and started (or waiting for a worker).
    pub started: usize,
    /// Jobs stopped.
    pub stopped: usize,
    /// Dispatches and stops that failed (each logged).
    pub failed: usize,
}

/// A running schedule. Dropping it ends it on this node only; the other
/// nodes holding it carry on (and take every tick).
#[derive(Debug)]
pub struct Schedule {
    name: String,
    task: tokio::task::JoinHandle<()>,
}

impl Schedule {
    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until the schedule is over: its producer answered
    /// [`ProducerError::Finished`] (on any node) or its ticker was stopped.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn ended(&mut self) {
        let _ = (&mut self.task).await;
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Node {
    /// Runs schedule `name` of this pool: every `interval`, on one of the
    /// nodes running it, `producer` is asked for a plan, which is applied.
    /// The first plan is asked for at once (on one node), unless the
    /// schedule already runs elsewhere.
    ///
    /// # Errors
    /// [`crate::Error::InvalidTicker`], [`crate::Error::ZeroInterval`], or
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Cancel safe: the schedule's task starts only once it returns.
    pub async fn schedule<P: JobProducer>(
        self: &Arc<Self>,
        name: &str,
        interval: Duration,
        producer: P,
    ) -> Result<Schedule> {
        let ticker = Ticker::new(self.core.clone(), name, interval, true).await?;
        let span = tracing::info_span!("pool.schedule", pool = %self.pool(), schedule = %name);
        // On the node's tracker: it ends when the node closes.
        let closed = self.core.token.clone();
        let run = run(self.clone(), ticker, producer);
        let task = self.core.tasks.spawn(
            async move {
                tokio::select! {
                    () = closed.cancelled() => {}
                    () = run => {}
                }
            }
            .instrument(span),
        );
        Ok(Schedule { name: name.to_owned(), task })
    }

    /// Applies `plan` as schedule `name`'s (see the module docs).
    ///
    /// # Errors
    /// Redis failures reading or recording the schedule's jobs; failures of
    /// single dispatches and stops are logged and counted instead.
    ///
    /// # Cancel safety
    /// Not cancel safe: the dispatches and stops sent before it is dropped
    /// take effect; the rest do not (the next plan applies them).
    pub async fn apply_plan(self: &Arc<Self>, name: &str, plan: Plan) -> Result<Applied> {
        let core = &self.core;
        let set = core.keys.schedule(name);
        let mut conn = core.conn.clone();
        let mut applied = Applied::default();
        let planned: HashSet<&str> = plan.start.iter().map(|(key, _)| key.as_str()).collect();

        // Starts: only the keys that do not exist.
        let mut missing = Vec::new();
        if !plan.start.is_empty() {
            let keys: Vec<&str> = plan.start.iter().map(|(key, _)| key.as_str()).collect();
            let existing = self.existing(&keys).await.map_err(core.redis_error("read a schedule's jobs"))?;
            let mut seen = HashSet::new();
            for ((key, payload), existing) in plan.start.iter().zip(existing) {
                if !existing && seen.insert(key.as_str()) {
                    missing.push((key.clone(), payload.clone()));
                }
            }
        }
        let started = for_each(self, missing, |node, (key, payload)| async move {
            let outcome = node.dispatch(&key, &payload).await;
            (key, outcome)
        })
        .await;
        let mut recorded = Vec::new();
        for (key, outcome) in started {
            match outcome {
                Ok(DispatchOutcome::Started | DispatchOutcome::Queued) => {
                    applied.started += 1;
                    recorded.push(key);
                }
                // Dispatched by someone else since the HMGET: running.
                Ok(DispatchOutcome::AlreadyExists(_)) => {}
                Ok(DispatchOutcome::Unconfirmed) => {
                    tracing::warn!(pool = %core.keys.pool, schedule = name, key, "dispatch unconfirmed; it shows at the next tick");
                    recorded.push(key);
                }
                Ok(other) => {
                    applied.failed += 1;
                    tracing::warn!(pool = %core.keys.pool, schedule = name, key, outcome = ?other, "the schedule's job did not start");
                }
                Err(error) => {
                    applied.failed += 1;
                    tracing::warn!(pool = %core.keys.pool, schedule = name, key, error = %error, "failed to dispatch the schedule's job");
                }
            }
        }
        if !recorded.is_empty() {
            redis::cmd("SADD")
                .arg(&set)
                .arg(&recorded)
                .query_async::<()>(&mut conn)
                .await
                .map_err(core.redis_error("record a schedule's jobs"))?;
        }

        // Stops: the plan's list, and with stop_all whatever the schedule
        // started that is no longer planned.
        let mut stops: Vec<String> = plan.stop.clone();
        if plan.stop_all {
            let members: Vec<String> = redis::cmd("SMEMBERS")
                .arg(&set)
                .query_async(&mut conn)
                .await
                .map_err(core.redis_error("read a schedule's jobs"))?;
            stops.extend(members.into_iter().filter(|key| !planned.contains(key.as_str())));
        }
        let mut seen = HashSet::new();
        stops.retain(|key| seen.insert(key.clone()));
        let stopped = for_each(self, stops, |node, key| async move {
            let outcome = node.stop(&key).await;
            (key, outcome)
        })
        .await;
        let mut forgotten = Vec::new();
        for (key, outcome) in stopped {
            match outcome {
                Ok(EventOutcome::Done | EventOutcome::Held) => {
                    applied.stopped += 1;
                    forgotten.push(key);
                }
                Ok(EventOutcome::NoSuchJob) => forgotten.push(key),
                Ok(other) => {
                    applied.failed += 1;
                    tracing::warn!(pool = %core.keys.pool, schedule = name, key, outcome = ?other, "the schedule's job did not stop cleanly");
                    if matches!(other, EventOutcome::HandlerError(_)) {
                        forgotten.push(key);
                    }
                }
                Err(error) => {
                    applied.failed += 1;
                    tracing::warn!(pool = %core.keys.pool, schedule = name, key, error = %error, "failed to stop the schedule's job");
                }
            }
        }
        if !forgotten.is_empty() {
            redis::cmd("SREM")
                .arg(&set)
                .arg(&forgotten)
                .query_async::<()>(&mut conn)
                .await
                .map_err(core.redis_error("record a schedule's jobs"))?;
        }
        Ok(applied)
    }
}

/// Runs `op` on every item, [`CONCURRENCY`] at a time.
async fn for_each<T, R, F, Fut>(node: &Arc<Node>, items: Vec<T>, op: F) -> Vec<R>
where
    T: Send + 'static,
    R: Send + 'static,
    F: Fn(Arc<Node>, T) -> Fut,
    Fut: Future<Output = R> + Send + 'static,
{
    let mut results = Vec::with_capacity(items.len());
    let mut running = JoinSet::new();
    for item in items {
        if running.len() >= CONCURRENCY
            && let Some(Ok(result)) = running.join_next().await
        {
            results.push(result);
        }
        running.spawn(op(node.clone(), item));
    }
    while let Some(result) = running.join_next().await {
        if let Ok(result) = result {
            results.push(result);
        }
    }
    results
}

/// The schedule's task: a plan per tick fired here.
async fn run<P: JobProducer>(node: Arc<Node>, mut ticker: Ticker, producer: P) {
    let pool = node.pool().to_owned();
    let name = ticker.name().to_owned();
    while let Some(tick) = ticker.tick().await {
        tracing::debug!(pool, schedule = name, seq = tick.seq, "asking for a plan");
        match producer.plan().await {
            Ok(plan) => match node.apply_plan(&name, plan).await {
                Ok(applied) if applied != Applied::default() => {
                    tracing::info!(
                        pool,
                        schedule = name,
                        started = applied.started,
                        stopped = applied.stopped,
                        failed = applied.failed,
                        "plan applied"
                    );
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(pool, schedule = name, error = %error, "failed to apply the plan; asking again at the next tick");
                }
            },
            Err(ProducerError::Failed(message)) => {
                tracing::warn!(pool, schedule = name, error = %message, "the producer made no plan; asking again at the next tick");
            }
            Err(ProducerError::Finished) => {
                tracing::info!(
                    pool,
                    schedule = name,
                    "the producer finished; the schedule ends on every node"
                );
                let set = node.core.keys.schedule(&name);
                if let Err(error) = ticker.stop().await {
                    tracing::warn!(pool, schedule = name, error = %error, "failed to remove the schedule's ticker");
                }
                let mut conn = node.core.conn.clone();
                if let Err(error) = redis::cmd("DEL").arg(&set).query_async::<()>(&mut conn).await {
                    tracing::warn!(pool, schedule = name, error = %error, "failed to remove the schedule's job list");
                }
                return;
            }
        }
    }
    tracing::info!(pool, schedule = name, "the schedule was stopped");
}
