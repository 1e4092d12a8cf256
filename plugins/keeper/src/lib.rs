//! `keeper`: a job producer that keeps one job running per entry of a list,
//! and the one to copy for schedules.
//!
//! Settings (in the schedule's `settings`):
//! - `jobs`: the list, entries separated by commas, each `key` or
//!   `key=payload` (the payload defaults to the key). Each tick the plan
//!   is "these jobs, and nothing else this schedule started": add an entry
//!   and its job starts, remove it and its job stops, at the next tick.
//! - `finished`: "true" ends the schedule (the answer `finished`).
//!
//! Without `jobs` the producer answers `failed`, which the host logs and
//! asks again at the next tick.

wit_bindgen::generate!({ path: "../../wit", world: "job-producer" });

use exports::pulse::job::producer::{Guest, JobPlan, JobSpec, ProducerError};
use pulse::job::env;
use pulse::job::types::LogLevel;

struct Keeper;

impl Guest for Keeper {
    fn plan() -> Result<JobPlan, ProducerError> {
        if env::config("finished").as_deref() == Some("true") {
            env::log(LogLevel::Info, "finished: the schedule ends");
            return Err(ProducerError::Finished);
        }
        let Some(list) = env::config("jobs") else {
            return Err(ProducerError::Failed(
                "the setting `jobs` is missing: a comma-separated list of keys".into(),
            ));
        };
        let start: Vec<JobSpec> = list
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let (key, payload) = entry.split_once('=').unwrap_or((entry, entry));
                JobSpec { key: key.trim().to_owned(), payload: payload.trim().as_bytes().to_vec() }
            })
            .collect();
        env::log(LogLevel::Debug, &format!("plan: {} job(s)", start.len()));
        Ok(JobPlan { start, stop: Vec::new(), stop_all: true })
    }
}

export!(Keeper);
