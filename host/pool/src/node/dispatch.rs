//! Dispatch, stop, notify, retry and forget.

use redis::Value;
use tracing::Instrument;

use super::Node;
use crate::core::{Answer, Core, Dispatched, Outcome, Routed, protocol};
use crate::error::Result;
use crate::job::{DispatchOutcome, EventOutcome};
use crate::scripts;

/// Retries of a script refused for a stale revision or a moved owner; each
/// follows a catch-up, so more mean membership keeps changing under us.
const MAX_ROUTING_RETRIES: usize = 20;

impl Node {
    /// Dispatches job `key` with `payload` to the worker its key routes to,
    /// and waits for the worker to start it.
    ///
    /// # Errors
    /// [`Error::InvalidKey`], [`Error::PayloadTooLarge`], or Redis failures.
    /// Every expected answer is a [`DispatchOutcome`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the job is dispatched whether or not the
    /// answer is awaited.
    pub async fn dispatch(&self, key: &str, payload: &[u8]) -> Result<DispatchOutcome> {
        let span = self.trace_span("job.dispatch", key);
        let trace = pulse_telemetry::traceparent(&span).unwrap_or_default();
        let outcome = self
            .elsewhere(key)
            .unwrap_or(self)
            .dispatch_here(key, payload, &trace)
            .instrument(span.clone())
            .await;
        traced_outcome(&span, &outcome);
        outcome
    }

    /// The span of a call of this pool's API about job `key` (`key` empty:
    /// a batch), when traces are exported.
    pub(super) fn trace_span(&self, name: &'static str, key: &str) -> tracing::Span {
        tracing::trace_span!(
            target: pulse_telemetry::TARGET,
            "pulse",
            otel.name = name,
            otel.kind = "producer",
            otel.status_code = tracing::field::Empty,
            pulse.pool = %self.core.keys.pool,
            pulse.job.key = key,
            pulse.outcome = tracing::field::Empty,
        )
    }

    /// [`Node::dispatch`] in this node's slot group; `trace` is the
    /// traceparent the start carries ('' for none).
    async fn dispatch_here(&self, key: &str, payload: &[u8], trace: &str) -> Result<DispatchOutcome> {
        let started = std::time::Instant::now();
        let outcome = self.send_dispatch(key, payload, trace).await;
        if let Ok(outcome) = &outcome {
            self.core.metrics.dispatched(outcome, started.elapsed());
        }
        outcome
    }

    async fn send_dispatch(&self, key: &str, payload: &[u8], trace: &str) -> Result<DispatchOutcome> {
        self.validate(key, payload.len())?;
        let core = &self.core;
        // Registered before anything is sent: the answer cannot beat it.
        let mut waiter = core.waiters.register(core.next_request());
        for _ in 0..MAX_ROUTING_RETRIES {
            let mut conn = core.conn.clone();
            let (rev, worker) = core.route(key);
            let reply = core.dispatch_replies(&worker).await;
            let job = Start { worker: &worker, reply: &reply, key, payload, request: &waiter.request };
            let (answer, held) = match &self.confirm {
                // Untraced, it may share a script (see `lanes`).
                None if trace.is_empty() => {
                    let answer = self.lanes.dispatch(core, rev, job).await;
                    (answer.map_err(core.redis_error("dispatch"))?, true)
                }
                confirm => {
                    let cmd = dispatch_cmd(core, rev, trace, &[job]);
                    let (answer, held) = match confirm {
                        None => (scripts::query(&scripts::DISPATCH, &cmd, &mut conn).await, true),
                        Some(confirm) => confirmed(confirm, &cmd, &mut conn).await,
                    };
                    let answer = dispatched(answer.map_err(core.redis_error("dispatch"))?, 1)
                        .pop()
                        .expect("one answer per job");
                    (answer, held)
                }
            };
            return match answer? {
                // Started on the primary, which may lose it with a failover.
                Dispatched::Sent if !held => Ok(DispatchOutcome::Unconfirmed),
                Dispatched::Sent => started(waiter.wait(core.options.reply_timeout).await),
                Dispatched::Stale(rev) => {
                    core.routing_retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    core.catch_up(&rev).await;
                    continue;
                }
                other => Ok(not_sent(other)),
            };
        }
        Err(protocol("dispatch", "membership kept changing"))
    }

    /// Stops job `key`: its handler's `stop` is called on its worker and the
    /// job is removed; a job waiting for a worker is removed at once.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] or Redis failures; answers are [`EventOutcome`]s.
    ///
    /// # Cancel safety
    /// Not cancel safe: once routed, the stop is delivered whether or not its
    /// answer is awaited.
    pub async fn stop(&self, key: &str) -> Result<EventOutcome> {
        self.validate(key, 0)?;
        self.elsewhere(key).unwrap_or(self).send_event("stop", key, b"", "").await
    }

    /// Sends a notification to job `key`, in order with every other event
    /// for the key; held while the job waits for a worker.
    ///
    /// # Errors
    /// As [`Node::stop`], and [`Error::PayloadTooLarge`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once routed, the notification is delivered whether or
    /// not its answer is awaited.
    pub async fn notify(&self, key: &str, payload: &[u8]) -> Result<EventOutcome> {
        self.validate(key, payload.len())?;
        let span = self.trace_span("job.notify", key);
        let trace = pulse_telemetry::traceparent(&span).unwrap_or_default();
        let outcome = self
            .elsewhere(key)
            .unwrap_or(self)
            .send_event("notify", key, payload, &trace)
            .instrument(span.clone())
            .await;
        traced_outcome(&span, &outcome);
        outcome
    }

    /// Starts a failed job again from its first attempt; returns whether the
    /// job was failed.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
    pub async fn retry(&self, key: &str) -> Result<bool> {
        self.validate(key, 0)?;
        let node = self.elsewhere(key).unwrap_or(self);
        let reset = node.reset_failed(key, "retry").await?;
        if reset {
            node.core.assign(key).await?;
        }
        Ok(reset)
    }

    /// Removes a failed job, freeing its key; returns whether the job was
    /// failed.
    ///
    /// # Errors
    /// Redis failures.
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
    pub async fn forget(&self, key: &str) -> Result<bool> {
        self.validate(key, 0)?;
        self.elsewhere(key).unwrap_or(self).reset_failed(key, "forget").await
    }

    async fn reset_failed(&self, key: &str, mode: &str) -> Result<bool> {
        let keys = &self.core.keys;
        let mut conn = self.core.conn.clone();
        let done: i64 = scripts::RESET_FAILED
            .key(&keys.jobs)
            .key(keys.record(key))
            .key(&keys.queued)
            .key(keys.held(key))
            .arg(key)
            .arg(mode)
            .invoke_async(&mut conn)
            .await
            .map_err(self.core.redis_error("reset a failed job"))?;
        Ok(done == 1)
    }

    /// Routes a stop or notification; `trace` is the traceparent a
    /// notification carries ('' for none).
    async fn send_event(&self, kind: &str, key: &str, payload: &[u8], trace: &str) -> Result<EventOutcome> {
        let core = &self.core;
        let keys = &core.keys;
        let mut waiter = core.waiters.register(core.next_request());
        let (_, mut owner) = core.route(key);
        for _ in 0..MAX_ROUTING_RETRIES {
            let mut conn = core.conn.clone();
            let answer: Vec<Value> = scripts::ROUTE
                .key(&keys.jobs)
                .key(keys.record(key))
                .key(keys.held(key))
                .key(keys.inbox(&owner))
                .key(&keys.queued)
                .arg(kind)
                .arg(key)
                .arg(&owner)
                .arg(&core.replies)
                .arg(&waiter.request)
                .arg(payload)
                .arg(trace)
                .arg(core.ring())
                .invoke_async(&mut conn)
                .await
                .map_err(core.redis_error(if kind == "stop" { "stop" } else { "notify" }))?;
            return Ok(match Routed::parse(&answer)? {
                Routed::Sent => match waiter.wait(core.options.reply_timeout).await {
                    Some(Answer { outcome, message }) => match outcome {
                        Outcome::Stopped | Outcome::Notified => EventOutcome::Done,
                        Outcome::Error => EventOutcome::HandlerError(message),
                        Outcome::Failed => EventOutcome::JobFailed(message),
                        Outcome::Missing => EventOutcome::NoSuchJob,
                        other => return Err(protocol("route", other.as_str())),
                    },
                    None => EventOutcome::Unconfirmed,
                },
                Routed::Held => EventOutcome::Held,
                Routed::Stopped => EventOutcome::Done,
                Routed::Missing => EventOutcome::NoSuchJob,
                Routed::Failed(reason) => EventOutcome::JobFailed(reason),
                Routed::Owner(worker) => {
                    // Owned elsewhere than the slot says (it has not moved
                    // yet): send it there.
                    core.routing_retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    owner = worker;
                    continue;
                }
            });
        }
        Err(protocol("route", "the owner kept changing"))
    }

    pub(super) fn validate(&self, key: &str, payload: usize) -> Result<()> {
        self.core.options.check_job(key, payload)
    }
}

/// What a dispatch sent to a worker came to: the worker's answer, or
/// `Unconfirmed` when none came in time.
pub(super) fn started(answer: Option<Answer>) -> Result<DispatchOutcome> {
    Ok(match answer {
        Some(Answer { outcome, message }) => match outcome {
            Outcome::Started => DispatchOutcome::Started,
            Outcome::Refused => DispatchOutcome::Refused(message),
            Outcome::Failed => DispatchOutcome::Failed(message),
            other => return Err(protocol("dispatch", other.as_str())),
        },
        None => DispatchOutcome::Unconfirmed,
    })
}

/// `cmd` (one `dispatch.lua`) sent with `WAIT` behind it, loading the
/// script first if the server does not know it: its answer, and whether
/// the replicas `confirm` asks for hold it.
async fn confirmed(
    confirm: &super::confirm::Confirm,
    cmd: &redis::Cmd,
    conn: &mut pulse_redis::Shared,
) -> (redis::RedisResult<Value>, bool) {
    let pipe = || {
        let mut pipe = redis::pipe();
        pipe.ignore_errors().add_command(cmd.clone());
        pipe
    };
    let mut sent = confirm.send(pipe()).await;
    if let Ok(first) = &sent
        && let Some(Err(error)) = first.replies.first()
        && scripts::is_unknown_script(error)
    {
        sent = match scripts::load(&scripts::DISPATCH, conn).await {
            Ok(()) => confirm.send(pipe()).await,
            Err(error) => Err(error),
        };
    }
    match sent {
        Ok(sent) => {
            let held = sent.held;
            let reply = sent.replies.into_iter().next().unwrap_or_else(|| {
                Err(redis::RedisError::from((redis::ErrorKind::Client, "no reply to a dispatch")))
            });
            (reply, held)
        }
        Err(error) => (Err(error), false),
    }
}

/// What a dispatch that reached no worker came to (not `Sent` or `Stale`).
pub(super) fn not_sent(dispatched: Dispatched) -> DispatchOutcome {
    match dispatched {
        Dispatched::Queued => DispatchOutcome::Queued,
        Dispatched::Exists(state) => DispatchOutcome::AlreadyExists(state),
        Dispatched::Full => DispatchOutcome::PoolFull,
        Dispatched::Sent | Dispatched::Stale(_) => DispatchOutcome::Unconfirmed,
    }
}

/// A job's start as `dispatch.lua` takes it: the worker its key routes
/// to and the stream the worker answers on, the job's key and payload,
/// and the request id its answer carries.
#[derive(Clone, Copy)]
pub(super) struct Start<'a> {
    pub(super) worker: &'a str,
    pub(super) reply: &'a str,
    pub(super) key: &'a str,
    pub(super) payload: &'a [u8],
    pub(super) request: &'a str,
}

/// `dispatch.lua` for `starts`, all routed with slot table revision `rev`
/// (to workers of one slot group), carrying `trace`: each worker named
/// once, in the order of its first job.
pub(super) fn dispatch_cmd(core: &Core, rev: u64, trace: &str, starts: &[Start<'_>]) -> redis::Cmd {
    let mut workers: Vec<(&str, &str)> = Vec::new();
    let mut of_job = Vec::with_capacity(starts.len());
    for start in starts {
        let j = match workers.iter().position(|&(worker, _)| worker == start.worker) {
            Some(j) => {
                debug_assert_eq!(workers[j].1, start.reply, "one reply stream per worker in a script");
                j
            }
            None => {
                workers.push((start.worker, start.reply));
                workers.len() - 1
            }
        };
        of_job.push(j + 1);
    }
    let names: Vec<&str> = workers.iter().map(|&(worker, _)| worker).collect();
    let keys = core.dispatch_keys(&names, starts.iter().map(|start| start.key));
    let mut cmd = scripts::evalsha(&scripts::DISPATCH, &keys);
    cmd.arg(rev.to_string())
        .arg(core.options.max_jobs)
        .arg(starts.len())
        .arg(trace)
        .arg(core.ring())
        .arg(workers.len());
    for (worker, reply) in workers {
        cmd.arg(worker).arg(reply);
    }
    for (start, j) in starts.iter().zip(of_job) {
        cmd.arg(j).arg(start.key).arg(start.payload).arg(start.request);
    }
    cmd
}

/// The answers of one `dispatch.lua` for `count` jobs: one per job (a
/// stale revision is every job's).
pub(super) fn dispatched(value: Value, count: usize) -> Vec<Result<Dispatched>> {
    let bad = |what: String| (0..count).map(|_| Err(protocol("dispatch", &what))).collect();
    let answers: Vec<Vec<Value>> = match redis::from_redis_value(value) {
        Ok(answers) => answers,
        Err(error) => return bad(error.to_string()),
    };
    if let [only] = answers.as_slice()
        && let Ok(stale @ Dispatched::Stale(_)) = Dispatched::parse(only)
    {
        return (0..count).map(|_| Ok(stale.clone())).collect();
    }
    if answers.len() != count {
        return bad(format!("{} answers for {count} jobs", answers.len()));
    }
    answers.iter().map(|answer| Dispatched::parse(answer)).collect()
}

/// Records on `span` how its call ended: the outcome, or an error status.
pub(super) fn traced_outcome<T: std::fmt::Debug>(span: &tracing::Span, outcome: &Result<T>) {
    if span.is_disabled() {
        return;
    }
    match outcome {
        Ok(outcome) => span.record("pulse.outcome", format!("{outcome:?}")),
        Err(error) => span.record("otel.status_code", "ERROR").record("pulse.outcome", error.to_string()),
    };
}
