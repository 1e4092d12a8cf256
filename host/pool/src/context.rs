//! [`JobContext`]: a handler's way back into the pool, fenced by the job's
//! token: once the job is no longer this worker's, every request is
//! refused with [`ContextError::NotOwned`] and changes nothing.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::core::{CallScope, Core, EmitQueue, What, WorkerFence, Write};

/// Why the pool refused a handler's request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// The job is no longer owned by this worker (it moved, stopped,
    /// completed or failed).
    #[error("the job is no longer owned by this worker")]
    NotOwned,
    /// The data is over the pool's limit.
    #[error("{size} bytes exceed the limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Redis could not be reached; nothing was recorded.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// Told to the worker when a job ends through its context.
#[derive(Debug)]
pub(crate) enum Ended {
    Completed { key: String, token: String },
    Failed { key: String, token: String },
}

/// A handler's handle on its job. Cheap to clone; keep it for as long as
/// the job runs.
#[derive(Clone)]
pub struct JobContext {
    pub(crate) core: Arc<Core>,
    pub(crate) worker: String,
    /// The worker's own fence (see `core::fence`).
    pub(crate) fence: WorkerFence,
    /// The worker's queue of events to write (see `core::emits`): every
    /// write here goes after what it holds.
    pub(crate) emits: Arc<EmitQueue>,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) ended: mpsc::UnboundedSender<Ended>,
}

impl std::fmt::Debug for JobContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobContext")
            .field("key", &self.key)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl JobContext {
    /// The job's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The job's pool.
    pub fn pool(&self) -> &str {
        &self.core.keys.pool
    }

    /// The worker running the job.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// The fencing token of this run of the job: a decimal number larger
    /// than the token of every earlier owner of the job anywhere in the
    /// pool, also across a shutdown of the pool or Redis losing its data
    /// (see `take_tokens` in `lua/prelude.lua`), so a system the job writes
    /// to can refuse writes from an older run.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Whether the job's code may run now: false once its worker's lease
    /// may have ended or the worker was evicted (the job may already run
    /// elsewhere). Check it before running anything of the job's outside a
    /// handler call (a timer) and before any effect it has.
    pub fn is_live(&self) -> bool {
        self.core.lease.valid_for(&self.fence)
    }

    /// Whether the job is lost here: its worker's lease may have ended or
    /// the worker was evicted, so the job may run elsewhere now. False
    /// while the worker only waits to write its jobs back after Redis lost
    /// the pool's data (then [`Self::is_live`] is false, but the job stays
    /// here). Cut off anything of the job's still running when this turns
    /// true: the worker writes nothing of what it returns.
    ///
    /// Once true it stays true: the worker fences itself, as it would at
    /// its own next check, so a renewal that lands just after cannot leave
    /// it serving a job whose call was cut off; it drops its jobs and
    /// joins again, and they start again from the pool's state.
    pub fn is_lost(&self) -> bool {
        let lost = !self.is_live() && !self.core.lease.data_loss_pending(&self.fence);
        if lost {
            self.fence.fence();
        }
        lost
    }

    /// A call of the job's code runs from now until the scope is
    /// dropped: what the job writes meanwhile (events, its state, its
    /// completion) waits, and is written in one step when the call ends,
    /// with the answer to the call when the worker made it (see
    /// `core::emits`). The worker opens one around each handler call it
    /// makes; open one around any other call of the job's code (a timer's).
    pub fn call_scope(&self) -> CallScope {
        self.emits.scope(&self.key)
    }

    /// Stores the job's state; the next start of the job receives it.
    ///
    /// During a call (see [`Self::call_scope`]) the state is written with
    /// the call's other writes when the call ends, and `Ok` means it is
    /// queued: a state that reaches Redis after the job moved is dropped,
    /// as it would have been refused. Otherwise it is written at once.
    ///
    /// # Errors
    /// [`ContextError`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once queued or sent, the write happens whether or
    /// not the future is polled to completion.
    pub async fn save_state(&self, state: &[u8]) -> Result<(), ContextError> {
        self.check_size(state.len())?;
        self.write(What::State(state.to_vec()), false).await
    }

    /// Publishes an output event of the job on the pool's events stream
    /// (topic: the job's key).
    ///
    /// While the job's worker may run it, the event is queued and written,
    /// fenced by the job's token, with the worker's next round trip (during
    /// a call, when the call ends, with its other writes): after the events
    /// the job emitted before, and with or before the answer to the call
    /// that emitted it and any later write of the job (see `core::emits`).
    /// An event of a job that is no longer this worker's when it reaches
    /// Redis is dropped, as its emit would have been refused. Otherwise
    /// (the worker's lease may have ended, or Redis lost the pool's data)
    /// it is written at once and Redis's answer is returned.
    ///
    /// # Errors
    /// [`ContextError`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once queued or sent, the write happens whether or
    /// not the future is polled to completion.
    pub async fn emit(&self, payload: &[u8]) -> Result<(), ContextError> {
        self.check_size(payload.len())?;
        self.write(What::Event(payload.to_vec()), true).await
    }

    /// Declares the job finished: it is removed from the pool and its
    /// handler is not called again for it. During a call (see
    /// [`Self::call_scope`]) the removal is written with the call's other
    /// writes when the call ends, and `Ok` means it is queued.
    ///
    /// # Errors
    /// [`ContextError`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once queued or sent, the write happens whether or
    /// not the future is polled to completion.
    pub async fn complete(&self) -> Result<(), ContextError> {
        if self.may_queue() && self.emits.in_call(&self.key) {
            self.queue(What::Finish).await;
        } else {
            let losses = self.core.lease.losses(&self.fence);
            let done = self
                .core
                .finish(&self.emits, &self.worker, &self.key, &self.token)
                .await
                .map_err(unavailable)?;
            if !done {
                return Err(self.refused(losses).await);
            }
        }
        let _ = self.ended.send(Ended::Completed { key: self.key.clone(), token: self.token.clone() });
        Ok(())
    }

    /// Marks the job failed with `reason`: it stays listed and blocks its
    /// key until retried or forgotten; its handler is not called again.
    ///
    /// # Errors
    /// [`ContextError`].
    ///
    /// # Cancel safety
    /// Not cancel safe: once sent, the write happens whether or not the
    /// future is polled to completion.
    pub async fn fail(&self, reason: &str) -> Result<(), ContextError> {
        let losses = self.core.lease.losses(&self.fence);
        if !self
            .core
            .fail(&self.emits, &self.worker, &self.key, &self.token, reason, 0)
            .await
            .map_err(unavailable)?
        {
            return Err(self.refused(losses).await);
        }
        let _ = self.ended.send(Ended::Failed { key: self.key.clone(), token: self.token.clone() });
        Ok(())
    }

    /// Whether a write may wait in the worker's queue: its worker may run
    /// the job, and no loss of the pool's data is pending.
    fn may_queue(&self) -> bool {
        self.is_live() && !self.core.lease.data_loss_pending(&self.fence)
    }

    /// Writes `what`: queued when it may be and a call of the job runs (or
    /// `outside_calls`), else at once with Redis's answer.
    async fn write(&self, what: What, outside_calls: bool) -> Result<(), ContextError> {
        if self.may_queue() && (outside_calls || self.emits.in_call(&self.key)) {
            self.queue(what).await;
            return Ok(());
        }
        let losses = self.core.lease.losses(&self.fence);
        let write = Write { key: self.key.clone(), token: self.token.clone(), what };
        if self.emits.write_now(&self.core, write).await.map_err(unavailable)? {
            Ok(())
        } else {
            Err(self.refused(losses).await)
        }
    }

    /// Queues `what`; when the queue is full, sends it at once with what is
    /// queued (its call's writes then land in more than one step).
    async fn queue(&self, what: What) {
        let write = Write { key: self.key.clone(), token: self.token.clone(), what };
        if self.emits.push(write)
            && let Err(error) = self.emits.send_now(&self.core, &self.key).await
        {
            // Still queued: the worker sends it again.
            tracing::debug!(job.key = %self.key, error = %error, "failed to send a full queue of writes");
        }
    }

    fn check_size(&self, size: usize) -> Result<(), ContextError> {
        let limit = self.core.options.max_payload;
        if size > limit { Err(ContextError::TooLarge { size, limit }) } else { Ok(()) }
    }

    /// Why a script refused the job's token: the job is not this
    /// worker's any more ([`ContextError::NotOwned`]), unless Redis lost
    /// the pool's data and the worker has not written its jobs back yet;
    /// then the job is still its own and the request may succeed shortly
    /// ([`ContextError::Unavailable`]). `losses`: what the worker knew of
    /// losses when the request was sent (`Lease::losses`); a request sent
    /// while a loss was pending and refused by then, but looked at after
    /// the worker wrote its jobs back, is still the loss's doing. Costs one
    /// `GET` per refusal only.
    async fn refused(&self, losses: (u64, u64)) -> ContextError {
        let (known, pending) = self.core.lease.epoch_and_pending(&self.fence);
        let (lost, written_back) = losses;
        if pending || lost > written_back || self.core.lease.losses(&self.fence) != losses {
            return lost_data();
        }
        let mut conn = self.core.conn.clone();
        let epoch: redis::RedisResult<Option<String>> =
            redis::cmd("GET").arg(&self.core.keys.epoch).query_async(&mut conn).await;
        match epoch {
            Ok(Some(epoch)) if epoch == known => ContextError::NotOwned,
            // Gone or another one: a loss its node has not noticed yet.
            Ok(_) => lost_data(),
            Err(error) => unavailable(error),
        }
    }
}

fn lost_data() -> ContextError {
    ContextError::Unavailable("Redis lost the pool's data; the job is written back shortly".into())
}

fn unavailable(error: impl std::fmt::Display) -> ContextError {
    ContextError::Unavailable(error.to_string())
}
