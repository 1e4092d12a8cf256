//! A worker's emitted events on their way to Redis.
//!
//! [`crate::JobContext::emit`] does not wait for Redis. After the checks it
//! can make at once (the size, the worker's fence, no loss of the pool's
//! data pending) the event joins its worker's queue, and the call goes on.
//! The queue is written with the next round trip the worker makes for its
//! jobs: usually the one that answers the call that emitted the event, so
//! an emit costs no round trip of its own, and the events of many calls
//! share one script call.
//!
//! Order: every write made in the name of a worker's jobs (its answers, a
//! saved state, a completion, a failure, a hand-back) sends what is queued
//! first, in the same pipeline, and one batch is sent at a time. So each
//! job's events reach Redis in the order it emitted them, before the
//! answer to the call that emitted them and before any later write of the
//! job.
//!
//! Fencing is unchanged: each event is written under its job's token in
//! one script (`emit.lua`), and an event whose job is no longer its
//! worker's when the batch arrives is dropped and counted
//! (`pulse_emits_dropped_total`), as its emit would have been refused.
//! An event whose batch was cut off by a dropped connection is sent
//! again, so it may be written twice. A batch that meets Redis without
//! its script (after a restart or `SCRIPT FLUSH`; each worker loads it
//! when it starts) is sent again after the commands that went with it.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use redis::{Cmd, RedisResult, Script, Value};
use tokio::sync::Notify;

use super::Core;
use crate::scripts;

/// Events one script call writes, at most.
const BATCH: usize = 256;

/// Payload bytes a worker's queue holds, at most, before an emit waits for
/// them to be written (an emit of a larger event still goes alone).
const QUEUE_BYTES: usize = 4 << 20;

/// An event waiting to be written.
#[derive(Debug)]
pub(crate) struct Emit {
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) payload: Vec<u8>,
}

#[derive(Default)]
struct Pending {
    events: VecDeque<Emit>,
    bytes: usize,
    /// Batches taken from the queue and not yet answered.
    in_flight: usize,
}

/// One worker's queue of events to write (see the module's docs).
pub(crate) struct EmitQueue {
    /// The worker whose jobs emit them.
    worker: String,
    pending: Mutex<Pending>,
    /// Held from taking a batch until its pipeline is answered: batches
    /// reach Redis in the order they were taken.
    sending: tokio::sync::Mutex<()>,
    /// Told of each event queued: the worker writes events no call in
    /// flight will carry (emitted from a timer) without waiting.
    queued: Notify,
}

impl EmitQueue {
    pub(crate) fn new(worker: &str) -> Self {
        Self {
            worker: worker.to_owned(),
            pending: Mutex::default(),
            sending: tokio::sync::Mutex::default(),
            queued: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Held for a queue operation, never across an await.
        self.pending.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Queues `emit`, unless the queue holds [`QUEUE_BYTES`] already: then
    /// it is given back, to be written first.
    pub(crate) fn push(&self, emit: Emit) -> Result<(), Emit> {
        let mut pending = self.lock();
        if !pending.events.is_empty() && pending.bytes + emit.payload.len() > QUEUE_BYTES {
            return Err(emit);
        }
        pending.bytes += emit.payload.len();
        pending.events.push_back(emit);
        drop(pending);
        self.queued.notify_one();
        Ok(())
    }

    /// Whether nothing is queued or being written: a write may go on its
    /// own.
    pub(crate) fn is_quiet(&self) -> bool {
        let pending = self.lock();
        pending.events.is_empty() && pending.in_flight == 0
    }

    /// Whether an event waits whose job has no call in flight (`busy`):
    /// no answer will carry it soon, so it should be written now.
    pub(crate) fn has_unaccompanied(&self, busy: impl Fn(&str) -> bool) -> bool {
        self.lock().events.iter().any(|emit| !busy(&emit.key))
    }

    /// Resolves once an event was queued since the last time it resolved.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub(crate) async fn queued(&self) {
        self.queued.notified().await;
    }

    /// Writes the queued events, then `then`, in one pipeline and in that
    /// order; returns the answers to `then`'s commands. The events of a
    /// batch that did not reach Redis go back to the front of the queue.
    ///
    /// # Cancel safety
    /// Not cancel safe: a batch taken is written, or put back, only if the
    /// future runs to its end.
    pub(crate) async fn send(&self, core: &Core, then: &[Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
        let _turn = self.sending.lock().await;
        let events: Vec<Emit> = {
            let mut pending = self.lock();
            pending.bytes = 0;
            pending.in_flight += 1;
            pending.events.drain(..).collect()
        };
        let result = self.write(core, &events, then).await;
        let mut pending = self.lock();
        pending.in_flight -= 1;
        if result.is_err() {
            pending.bytes += events.iter().map(|emit| emit.payload.len()).sum::<usize>();
            for emit in events.into_iter().rev() {
                pending.events.push_front(emit);
            }
        }
        result
    }

    /// Sends `cmd`, an [`scripts::evalsha`] of `script`, after the queued
    /// events; alone when none is queued or being written.
    pub(crate) async fn ordered<T: redis::FromRedisValue>(
        &self,
        core: &Core,
        script: &Script,
        cmd: Cmd,
    ) -> RedisResult<T> {
        if self.is_quiet() {
            return scripts::query(script, &cmd, &mut core.conn.clone()).await;
        }
        match self.send(core, std::slice::from_ref(&cmd)).await?.pop() {
            Some(Ok(value)) => Ok(redis::from_redis_value(value)?),
            // The events before it were written: sending it again alone
            // keeps the order.
            Some(Err(error)) if scripts::is_unknown_script(&error) => {
                scripts::query(script, &cmd, &mut core.conn.clone()).await
            }
            Some(Err(error)) => Err(error),
            None => unreachable!("one command sent, one answer"),
        }
    }

    async fn write(
        &self,
        core: &Core,
        events: &[Emit],
        then: &[Cmd],
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        if events.is_empty() && then.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let batches: Vec<&[Emit]> = events.chunks(BATCH).collect();
        for batch in &batches {
            pipe.add_command(emit_cmd(core, &self.worker, batch));
        }
        for cmd in then {
            pipe.add_command(cmd.clone());
        }
        let mut conn = core.conn.clone();
        let mut replies: Vec<RedisResult<Value>> = pipe.query_async(&mut conn).await?;
        let rest = replies.split_off(batches.len());
        for (batch, reply) in batches.into_iter().zip(replies) {
            let reply = match reply {
                // Redis forgot its scripts since the worker loaded them (a
                // restart, `SCRIPT FLUSH`): this batch lands after `then`,
                // the only case it does.
                Err(error) if scripts::is_unknown_script(&error) => {
                    scripts::query(&scripts::EMIT, &emit_cmd(core, &self.worker, batch), &mut conn).await
                }
                other => other.and_then(|value| Ok(redis::from_redis_value(value)?)),
            };
            written(core, batch, reply);
        }
        Ok(rest)
    }
}

/// `emit.lua` for `batch`, emitted by jobs of `worker`.
pub(crate) fn emit_cmd(core: &Core, worker: &str, batch: &[Emit]) -> Cmd {
    let keys = &core.keys;
    let mut cmd = scripts::evalsha(
        &scripts::EMIT,
        &[
            keys.jobs.clone(),
            keys.events.clone(),
            keys.events_written.clone(),
            keys.events_bytes_earlier.clone(),
        ],
    );
    cmd.arg(core.options.events_retention).arg(core.options.events_max_bytes).arg(worker);
    for emit in batch {
        cmd.arg(&emit.key).arg(&emit.token).arg(&emit.payload);
    }
    cmd
}

/// Whether each event of a batch was written, from `emit.lua`'s answer:
/// one `1` (written) or `0` (refused) per event, in order.
pub(crate) fn written_flags(flags: &str) -> impl Iterator<Item = bool> + '_ {
    flags.bytes().map(|flag| flag == b'1')
}

/// Counts and logs the events of `batch` that were not written.
fn written(core: &Core, batch: &[Emit], reply: RedisResult<String>) {
    match reply {
        Ok(flags) => {
            for (emit, written) in batch.iter().zip(written_flags(&flags)) {
                if !written {
                    tracing::debug!(job.key = %emit.key, token = %emit.token, "dropped an event: the job is no longer this worker's");
                    core.metrics.emits_dropped.increment(1);
                }
            }
        }
        Err(error) => {
            tracing::warn!(events = batch.len(), error = %error, "failed to write emitted events; they are dropped");
            core.metrics.emits_dropped.increment(batch.len() as u64);
        }
    }
}
