//! What a job does through the host, typed: events, state, timers,
//! settings, logs, its fence and its completion. Every refusal converts
//! into a [`JobError`] with `?`.

use std::time::Duration;

use crate::bindings::pulse::job::{env, host};
use crate::{HostError, JobError, JobFence, LogLevel};

impl From<HostError> for JobError {
    /// A refused request ends the call: the job moved away or a limit was
    /// passed (fatal), or the host cannot reach Redis now (retryable).
    fn from(error: HostError) -> Self {
        match error {
            HostError::NotOwned => JobError::Fatal("the job is no longer owned here".into()),
            HostError::LimitExceeded(message) => JobError::Fatal(message),
            HostError::Unavailable(message) => JobError::Retryable(message),
        }
    }
}

/// Publishes an event of job `key` on the pool's events stream.
///
/// # Errors
/// The host refused it (see [`HostError`]).
pub fn emit(key: &str, payload: &[u8]) -> Result<(), HostError> {
    host::emit(key, payload)
}

/// Stores job `key`'s state: its next `start`, here or elsewhere, gets it.
///
/// # Errors
/// The host refused it (see [`HostError`]).
pub fn save_state(key: &str, state: &[u8]) -> Result<(), HostError> {
    host::save_state(key, state)
}

/// Job `key` finished by itself: the host removes it and calls nothing
/// more for it.
///
/// # Errors
/// The host refused it (see [`HostError`]).
pub fn complete(key: &str) -> Result<(), HostError> {
    host::complete(key)
}

/// Arms timer `name` of job `key` to fire after `delay` (then every
/// `delay` when `repeat`); arming a name again replaces it. Timers live
/// with the job's instance: re-arm them in `start`.
///
/// # Errors
/// The host refused it: too many timers, a long name, a repeat of 0.
pub fn set_timer(key: &str, name: &str, delay: Duration, repeat: bool) -> Result<(), HostError> {
    let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
    host::set_timer(key, name, millis, repeat)
}

/// Disarms timer `name` of job `key`; whether one was armed.
pub fn cancel_timer(key: &str, name: &str) -> bool {
    host::cancel_timer(key, name)
}

/// The plugin's setting `name` (config.toml's `settings`), if set.
#[must_use]
pub fn setting(name: &str) -> Option<String> {
    env::config(name)
}

/// Setting `name` parsed as a `T`, `default` when it is not set.
///
/// # Errors
/// [`JobError::Fatal`] naming the setting and its value when it does not
/// parse: a misconfigured plugin cannot run its jobs.
pub fn setting_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, JobError> {
    match env::config(name) {
        None => Ok(default),
        Some(text) => text.trim().parse().map_err(|_| {
            JobError::Fatal(format!(
                "setting {name} = {text:?} is not a valid {}",
                std::any::type_name::<T>()
            ))
        }),
    }
}

/// The fence of the job whose call runs: pool, key and fencing token,
/// for a service the job writes to (outgoing HTTP requests carry it in the
/// `pulse-fence` header already).
#[must_use]
pub fn fence() -> Option<JobFence> {
    env::fence()
}

/// Logs `message` at `level` through the host's logs.
pub fn log(level: LogLevel, message: &str) {
    env::log(level, message);
}

/// Logs at debug level.
pub fn debug(message: &str) {
    env::log(LogLevel::Debug, message);
}

/// Logs at info level.
pub fn info(message: &str) {
    env::log(LogLevel::Info, message);
}

/// Logs at warn level.
pub fn warn(message: &str) {
    env::log(LogLevel::Warn, message);
}

/// Logs at error level.
pub fn error(message: &str) {
    env::log(LogLevel::Error, message);
}

/// A number written as decimal text (a payload, a saved count), trimmed.
#[must_use]
pub fn parse_number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// A payload that is empty or a decimal number: `None` when empty.
///
/// # Errors
/// [`JobError::InvalidInput`] naming what came instead (the job is
/// refused).
pub fn payload_number<T: std::str::FromStr>(payload: &[u8]) -> Result<Option<T>, JobError> {
    if payload.is_empty() {
        return Ok(None);
    }
    parse_number(payload).map(Some).ok_or_else(|| {
        JobError::InvalidInput(format!(
            "payload must be empty or a number, got {:?}",
            String::from_utf8_lossy(payload)
        ))
    })
}

#[cfg(feature = "serde")]
mod json {
    use super::{JobError, emit, save_state};
    use crate::Job;

    /// Publishes `value` as a JSON event of job `key`.
    ///
    /// # Errors
    /// The host refused it.
    pub fn emit_json<T: serde::Serialize>(key: &str, value: &T) -> Result<(), JobError> {
        Ok(emit(key, &to_vec(value)?)?)
    }

    /// Stores `value` as job `key`'s state, in JSON.
    ///
    /// # Errors
    /// The host refused it.
    pub fn save_json<T: serde::Serialize>(key: &str, value: &T) -> Result<(), JobError> {
        Ok(save_state(key, &to_vec(value)?)?)
    }

    /// The state `job` saved last with [`save_json`], if any.
    ///
    /// # Errors
    /// [`JobError::Fatal`] when it is not a `T` in JSON (a release that
    /// cannot read its jobs' state must say so).
    pub fn state_json<T: serde::de::DeserializeOwned>(job: &Job) -> Result<Option<T>, JobError> {
        job.state
            .as_deref()
            .map(|bytes| {
                serde_json::from_slice(bytes).map_err(|e| {
                    JobError::Fatal(format!("the saved state of job {:?} is not readable: {e}", job.key))
                })
            })
            .transpose()
    }

    fn to_vec<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, JobError> {
        serde_json::to_vec(value).map_err(|e| JobError::Fatal(format!("not serializable as JSON: {e}")))
    }
}

#[cfg(feature = "serde")]
pub use json::{emit_json, save_json, state_json};
