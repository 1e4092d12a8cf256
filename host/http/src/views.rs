//! How jobs read in JSON, the same for the API and the CLI's `--json`.

use pulse_pool::{JobInfo, JobState};
use serde_json::{Value, json};

/// A job state as the API and the CLI write it.
pub fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Starting => "starting",
        JobState::Running => "running",
        JobState::Moving => "moving",
        JobState::Queued => "queued",
        JobState::Failed => "failed",
    }
}

/// A job: key, state, worker, created_at_ms, attempt, reason.
pub fn job_json(job: &JobInfo) -> Value {
    json!({
        "key": job.key,
        "state": state_name(job.state),
        "worker": job.worker,
        "created_at_ms": job.created_at_ms,
        "attempt": job.attempt,
        "reason": job.reason,
    })
}
