//! `echo`: the smallest useful job handler, and the one to copy: `start` and `notify`
//! emit their payload behind the setting `prefix`; `start` and `stop` log.

use pulse_plugin::{Job, JobError, JobHandler, emit, info, setting};

struct Echo;
impl JobHandler for Echo {
    fn start(job: Job) -> Result<(), JobError> {
        let (key, bytes, attempt, requeued) = (&job.key, job.payload.len(), job.attempt, job.requeued);
        info(&format!("start {key} ({bytes} bytes, attempt {attempt}, requeued {requeued})"));
        echo(key, &job.payload)
    }

    fn stop(key: &str) -> Result<(), JobError> {
        info(&format!("stop {key}"));
        Ok(())
    }

    fn notify(key: &str, payload: Vec<u8>) -> Result<(), JobError> {
        echo(key, &payload)
    }
}

fn echo(key: &str, payload: &[u8]) -> Result<(), JobError> {
    Ok(emit(key, &[setting("prefix").unwrap_or_default().as_bytes(), payload].concat())?)
}

pulse_plugin::export_handler!(Echo);
