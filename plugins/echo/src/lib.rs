//! `echo`: the smallest useful job handler, and the one to copy.
//!
//! - `start` logs the job and emits its payload as an output event.
//! - `notify` answers each notification by emitting its payload back.
//! - `stop` logs.
//!
//! Setting `prefix` (in the plugin's `settings`) is prepended to every
//! emitted payload, which shows how a plugin reads its configuration.

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });

use exports::pulse::job::handler::Guest;
use pulse::job::types::{Job, JobError, LogLevel};
use pulse::job::{env, host};

struct Echo;

impl Guest for Echo {
    fn start(job: Job) -> Result<(), JobError> {
        env::log(
            LogLevel::Info,
            &format!(
                "start {} ({} bytes, attempt {}, requeued {})",
                job.key,
                job.payload.len(),
                job.attempt,
                job.requeued
            ),
        );
        echo(&job.key, &job.payload)
    }

    fn stop(key: String) -> Result<(), JobError> {
        env::log(LogLevel::Info, &format!("stop {key}"));
        Ok(())
    }

    fn notify(key: String, payload: Vec<u8>) -> Result<(), JobError> {
        echo(&key, &payload)
    }

    fn on_timer(key: String, name: String) -> Result<(), JobError> {
        // echo arms no timers: a call here is a host bug worth seeing.
        Err(JobError::InvalidInput(format!("echo arms no timers, yet timer {name:?} fired for {key:?}")))
    }
}

/// Emits `payload`, behind the configured prefix, for `key`.
fn echo(key: &str, payload: &[u8]) -> Result<(), JobError> {
    let mut out = env::config("prefix").unwrap_or_default().into_bytes();
    out.extend_from_slice(payload);
    // A refusal means the job is no longer ours (or a limit): the job cannot
    // do its one task, so say so rather than pretend.
    host::emit(key, &out).map_err(|e| JobError::Retryable(format!("emit refused: {e:?}")))
}

export!(Echo);
