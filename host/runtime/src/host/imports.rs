//! The `env` and `host` interfaces of `wit/job.wit`, as the guest calls
//! them.
//!
//! Every request that acts for a job first checks that the job runs in this
//! instance (`not-owned` otherwise); what it means for the pool is decided by
//! [`crate::JobOutputs`].

use std::time::Duration;

use super::HostState;
use crate::bindings::pulse::job::env;
use crate::bindings::pulse::job::host::Host;
use crate::bindings::pulse::job::types::{self, HostError, LogLevel};
use crate::bounds::{MAX_TIMER_NAME, MAX_TIMERS_PER_JOB, gated};
use crate::error::HostRefusal;

impl types::Host for HostState {}

impl env::Host for HostState {
    async fn log(&mut self, level: LogLevel, message: String) -> wasmtime::Result<()> {
        // The current span is the call's: plugin and job key. Cut and
        // rate-limited like every line a job makes (`bounds`); a line of a
        // level the log leaves out costs nothing of the job's budget.
        let shown = match level {
            LogLevel::Trace => tracing::enabled!(target: "pulse_runtime::guest", tracing::Level::TRACE),
            LogLevel::Debug => tracing::enabled!(target: "pulse_runtime::guest", tracing::Level::DEBUG),
            LogLevel::Info => tracing::enabled!(target: "pulse_runtime::guest", tracing::Level::INFO),
            LogLevel::Warn => tracing::enabled!(target: "pulse_runtime::guest", tracing::Level::WARN),
            LogLevel::Error => tracing::enabled!(target: "pulse_runtime::guest", tracing::Level::ERROR),
        };
        if !shown {
            return Ok(());
        }
        gated(&self.log_gate, None, &message, |message| match level {
            LogLevel::Trace => tracing::trace!(target: "pulse_runtime::guest", "{message}"),
            LogLevel::Debug => tracing::debug!(target: "pulse_runtime::guest", "{message}"),
            LogLevel::Info => tracing::info!(target: "pulse_runtime::guest", "{message}"),
            LogLevel::Warn => tracing::warn!(target: "pulse_runtime::guest", "{message}"),
            LogLevel::Error => tracing::error!(target: "pulse_runtime::guest", "{message}"),
        });
        Ok(())
    }

    async fn config(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        Ok(self.settings.get(&name).cloned())
    }

    async fn fence(&mut self) -> wasmtime::Result<Option<types::JobFence>> {
        // The job of the call running: the one its outgoing requests are
        // fenced by. A producer's store runs no job.
        let key = self.http_hooks.current();
        if !self.jobs.contains_key(key) {
            return Ok(None);
        }
        Ok(self.outputs.fence(key).map(|fence| types::JobFence {
            pool: fence.pool,
            key: fence.key,
            token: fence.token,
        }))
    }
}

impl Host for HostState {
    async fn set_timer(
        &mut self,
        key: String,
        name: String,
        delay_ms: u64,
        repeat: bool,
    ) -> wasmtime::Result<Result<(), HostError>> {
        let Some(slot) = self.jobs.get(&key) else { return Ok(Err(HostError::NotOwned)) };
        if name.len() > MAX_TIMER_NAME {
            return Ok(Err(HostError::LimitExceeded(format!(
                "a timer name may have at most {MAX_TIMER_NAME} bytes, not {}",
                name.len()
            ))));
        }
        if repeat && delay_ms == 0 {
            return Ok(Err(HostError::LimitExceeded(
                "a repeating timer needs delay-ms of at least 1".into(),
            )));
        }
        if !slot.timers.contains_key(&name) && slot.timers.len() >= MAX_TIMERS_PER_JOB {
            return Ok(Err(HostError::LimitExceeded(format!(
                "a job may have at most {MAX_TIMERS_PER_JOB} timers armed"
            ))));
        }
        self.arm_timer(&key, &name, Duration::from_millis(delay_ms), repeat);
        Ok(Ok(()))
    }

    async fn cancel_timer(&mut self, key: String, name: String) -> wasmtime::Result<bool> {
        Ok(self.jobs.get_mut(&key).is_some_and(|slot| slot.timers.remove(&name).is_some()))
    }

    async fn emit(&mut self, key: String, payload: Vec<u8>) -> wasmtime::Result<Result<(), HostError>> {
        if !self.jobs.contains_key(&key) {
            return Ok(Err(HostError::NotOwned));
        }
        Ok(self.outputs.emit(&key, payload).await.map_err(into_wit))
    }

    async fn save_state(&mut self, key: String, state: Vec<u8>) -> wasmtime::Result<Result<(), HostError>> {
        if !self.jobs.contains_key(&key) {
            return Ok(Err(HostError::NotOwned));
        }
        let saved = self.outputs.save_state(&key, state.clone()).await;
        if saved.is_ok()
            && let Some(slot) = self.jobs.get_mut(&key)
        {
            slot.job.state = Some(state);
        }
        Ok(saved.map_err(into_wit))
    }

    async fn complete(&mut self, key: String) -> wasmtime::Result<Result<(), HostError>> {
        if !self.jobs.contains_key(&key) {
            return Ok(Err(HostError::NotOwned));
        }
        let completed = self.outputs.complete(&key).await;
        if completed.is_ok() {
            // Dropping the slot cancels the job's timers.
            self.jobs.remove(&key);
            self.completed.push(key);
        }
        Ok(completed.map_err(into_wit))
    }
}

fn into_wit(refusal: HostRefusal) -> HostError {
    match refusal {
        HostRefusal::NotOwned => HostError::NotOwned,
        HostRefusal::LimitExceeded(message) => HostError::LimitExceeded(message),
        HostRefusal::Unavailable(message) => HostError::Unavailable(message),
    }
}
