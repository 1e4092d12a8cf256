//! `counter`: a long-running job that survives moves. Copy it for jobs that
//! work in the background rather than only on calls.
//!
//! - `start` resumes the count from the saved state (or 0) and arms a
//!   repeating `tick` timer every `interval-ms` (setting; default 1000).
//! - Each tick increments the count, saves it (so a move or a crash resumes
//!   from there) and emits it as progress. When the payload names a target
//!   (a decimal number), the job completes once the count reaches it.
//!   Built with the `v2` feature (the `counter-v2` plugin), it emits
//!   `v2 <count>`: a second release, for rolling upgrades.
//!   Built with the `broken` feature too (the `counter-broken` plugin), it
//!   is a bad release, to test the upgrade gate: it fails the start of
//!   every job with saved state, or, with the setting `trap-after-ticks`
//!   (a number), reads the state but traps at that tick of the job since
//!   it started on this release.
//! - `notify` with `reset` sets the count back to 0; anything else is
//!   refused as invalid input.
//!
//! One instance may serve several jobs (`isolation = "worker"`), so the
//! counts live in a map by key.

use std::collections::BTreeMap;
use std::sync::Mutex;

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });

use exports::pulse::job::handler::Guest;
use pulse::job::types::{HostError, Job, JobError, LogLevel};
use pulse::job::{env, host};

/// Running jobs of this instance. A component instance is single-threaded;
/// the mutex only makes the static safe to share.
static JOBS: Mutex<BTreeMap<String, Count>> = Mutex::new(BTreeMap::new());

/// Progress of one job.
struct Count {
    value: u64,
    target: Option<u64>,
    /// Ticks since the job started here.
    ticks: u64,
}

const DEFAULT_INTERVAL_MS: u64 = 1000;

struct Counter;

impl Guest for Counter {
    fn start(job: Job) -> Result<(), JobError> {
        let target = parse_target(&job.payload)?;
        if cfg!(feature = "broken") && job.state.is_some() && env::config("trap-after-ticks").is_none() {
            return Err(JobError::Fatal("this release cannot read the saved state".into()));
        }
        let value = match &job.state {
            Some(bytes) => {
                parse_number(bytes).ok_or_else(|| JobError::Fatal("saved state is not a count".into()))?
            }
            None => 0,
        };
        let interval = match env::config("interval-ms") {
            Some(text) => text.parse().map_err(|_| {
                JobError::Fatal(format!(
                    "setting interval-ms must be a whole number of milliseconds, got {text:?}"
                ))
            })?,
            None => DEFAULT_INTERVAL_MS,
        };
        host::set_timer(&job.key, "tick", interval, true).map_err(host_error)?;
        env::log(LogLevel::Info, &format!("start {} at {value}, target {target:?}", job.key));
        jobs().insert(job.key, Count { value, target, ticks: 0 });
        Ok(())
    }

    fn stop(key: String) -> Result<(), JobError> {
        // The count was saved on every tick: nothing to persist here.
        let count = jobs().remove(&key);
        env::log(LogLevel::Info, &format!("stop {key} at {:?}", count.map(|c| c.value)));
        Ok(())
    }

    fn notify(key: String, payload: Vec<u8>) -> Result<(), JobError> {
        if payload != b"reset" {
            return Err(JobError::InvalidInput(format!(
                "counter understands the notification `reset`, got {:?}",
                String::from_utf8_lossy(&payload)
            )));
        }
        host::save_state(&key, b"0").map_err(host_error)?;
        if let Some(count) = jobs().get_mut(&key) {
            count.value = 0;
        }
        Ok(())
    }

    fn on_timer(key: String, _name: String) -> Result<(), JobError> {
        let (value, done) = {
            let mut jobs = jobs();
            let count =
                jobs.get_mut(&key).ok_or_else(|| JobError::Fatal(format!("tick for unknown job {key:?}")))?;
            count.value += 1;
            count.ticks += 1;
            if cfg!(feature = "broken")
                && env::config("trap-after-ticks").and_then(|n| n.parse().ok()) == Some(count.ticks)
            {
                panic!("counter-broken traps at tick {} of job {key:?}", count.ticks);
            }
            (count.value, count.target.is_some_and(|t| count.value >= t))
        };
        let text = value.to_string();
        host::save_state(&key, text.as_bytes()).map_err(host_error)?;
        // The second release (`counter-v2`) says which it is; the saved
        // state stays the bare count, which both read.
        let emitted = if cfg!(feature = "v2") { format!("v2 {text}") } else { text };
        host::emit(&key, emitted.as_bytes()).map_err(host_error)?;
        if done {
            jobs().remove(&key);
            host::complete(&key).map_err(host_error)?;
        }
        Ok(())
    }
}

fn jobs() -> std::sync::MutexGuard<'static, BTreeMap<String, Count>> {
    // A poisoned lock means a panic, which already trapped the instance.
    JOBS.lock().unwrap_or_else(|poison| poison.into_inner())
}

fn parse_target(payload: &[u8]) -> Result<Option<u64>, JobError> {
    if payload.is_empty() {
        return Ok(None);
    }
    parse_number(payload).map(Some).ok_or_else(|| {
        JobError::InvalidInput(format!(
            "payload must be empty or a target count, got {:?}",
            String::from_utf8_lossy(payload)
        ))
    })
}

fn parse_number(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// A refused request ends the call: the job moved away, or the host is in
/// trouble and the retry policy decides.
fn host_error(err: HostError) -> JobError {
    match err {
        HostError::NotOwned => JobError::Fatal("job is no longer owned here".into()),
        HostError::LimitExceeded(msg) => JobError::Fatal(msg),
        HostError::Unavailable(msg) => JobError::Retryable(msg),
    }
}

export!(Counter);
