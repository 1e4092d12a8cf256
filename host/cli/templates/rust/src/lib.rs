//! `{{name}}`: a pulse-host job handler.
//!
//! - `start` emits `hello <payload>`, resumes its count from the saved
//!   state (or 0) and arms a `tick` timer every `interval-ms` (setting;
//!   default 1000).
//! - Each tick adds one to the count, saves it (a move or a crash resumes
//!   from there) and emits it.
//! - `notify` emits its payload back.

use std::time::Duration;

use pulse_plugin::{Job, JobError, JobHandler, Jobs, emit, info, parse_number, save_state, set_timer, setting_or};

/// Each running job's count (an instance may serve several jobs).
static COUNTS: Jobs<u64> = Jobs::new();

struct Plugin;

impl JobHandler for Plugin {
    fn start(job: Job) -> Result<(), JobError> {
        let count = job.state.as_deref().and_then(parse_number).unwrap_or(0);
        info(&format!("start {} at {count}", job.key));
        emit(&job.key, &[b"hello ", job.payload.as_slice()].concat())?;
        let every = setting_or("interval-ms", 1000)?;
        set_timer(&job.key, "tick", Duration::from_millis(every), true)?;
        COUNTS.insert(&job.key, count);
        Ok(())
    }

    fn stop(key: &str) -> Result<(), JobError> {
        COUNTS.remove(key);
        Ok(())
    }

    fn notify(key: &str, payload: Vec<u8>) -> Result<(), JobError> {
        Ok(emit(key, &payload)?)
    }

    fn on_timer(key: &str, _name: &str) -> Result<(), JobError> {
        let count = COUNTS.with(key, |count| {
            *count += 1;
            *count
        });
        let count = count.ok_or_else(|| JobError::Fatal(format!("tick for unknown job {key:?}")))?;
        save_state(key, count.to_string().as_bytes())?;
        Ok(emit(key, count.to_string().as_bytes())?)
    }
}

pulse_plugin::export_handler!(Plugin);
