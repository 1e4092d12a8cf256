// The handler shape the test plugins share, included textually by each
// (`include!` after `wit_bindgen::generate!`). Each plugin defines
// `fn misbehave(payload: &[u8]) -> Result<(), JobError>`: how it reacts to a
// payload. The handler passes it
// - the job's payload, on `start`;
// - the notification's payload, on `notify`;
// - the setting `stop-payload`, on `stop`, when that setting is present.
// Anything the plugin does not recognise succeeds, so a test starts a job
// normally and makes it misbehave later with a notification.

use exports::pulse::job::handler::Guest;
use pulse::job::env;
use pulse::job::types::{Job, JobError};

struct OnDemand;

impl Guest for OnDemand {
    fn start(job: Job) -> Result<(), JobError> {
        misbehave(&job.payload)
    }

    fn stop(_key: String) -> Result<(), JobError> {
        match env::config("stop-payload") {
            Some(payload) => misbehave(payload.as_bytes()),
            None => Ok(()),
        }
    }

    fn notify(_key: String, payload: Vec<u8>) -> Result<(), JobError> {
        misbehave(&payload)
    }

    fn on_timer(key: String, name: String) -> Result<(), JobError> {
        Err(JobError::InvalidInput(format!(
            "this plugin arms no timers, yet timer {name:?} fired for {key:?}"
        )))
    }
}

export!(OnDemand);
