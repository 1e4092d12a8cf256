//! `counter`: a long-running job that survives moves; copy it for background work.
//! `start` resumes from the saved count (or 0) and ticks every `interval-ms`
//! (setting; default 1000). Each tick saves the count (a move or a crash resumes
//! there) and emits it; a payload naming a target completes the job when reached.
//! `notify` with `reset` sets the count to 0. Built with `v2` (`counter-v2`),
//! ticks emit `v2 <count>`; with `broken` too (`counter-broken`), a bad release:
//! it fails every start with saved state or, with the setting `trap-after-ticks`
//! (N), traps at the job's Nth tick here.

use std::time::Duration;

use pulse_plugin::{Job, JobError, JobHandler, Jobs, emit, info, save_state, setting};

/// Each running job of this instance (it may serve several).
static JOBS: Jobs<Count> = Jobs::new();

struct Count {
    value: u64,
    target: Option<u64>,
    ticks: u64,
}

struct Counter;

impl JobHandler for Counter {
    fn start(job: Job) -> Result<(), JobError> {
        let target = pulse_plugin::payload_number(&job.payload)?;
        if cfg!(feature = "broken") && job.state.is_some() && setting("trap-after-ticks").is_none() {
            return Err(JobError::Fatal("this release cannot read the saved state".into()));
        }
        let value = job.state.as_deref().map_or(Some(0), pulse_plugin::parse_number);
        let value = value.ok_or_else(|| JobError::Fatal("saved state is not a count".into()))?;
        let interval = pulse_plugin::setting_or("interval-ms", 1000)?;
        pulse_plugin::set_timer(&job.key, "tick", Duration::from_millis(interval), true)?;
        info(&format!("start {} at {value}, target {target:?}", job.key));
        JOBS.insert(&job.key, Count { value, target, ticks: 0 });
        Ok(())
    }

    fn stop(key: &str) -> Result<(), JobError> {
        info(&format!("stop {key} at {:?}", JOBS.remove(key).map(|count| count.value)));
        Ok(())
    }

    fn notify(key: &str, payload: Vec<u8>) -> Result<(), JobError> {
        if payload != b"reset" {
            let got = String::from_utf8_lossy(&payload);
            return Err(JobError::InvalidInput(format!("counter takes `reset` only, got {got:?}")));
        }
        save_state(key, b"0")?;
        JOBS.with(key, |count| count.value = 0);
        Ok(())
    }

    fn on_timer(key: &str, _name: &str) -> Result<(), JobError> {
        let Count { value, target, ticks } = JOBS
            .with(key, |count| Count { value: count.value + 1, ticks: count.ticks + 1, ..*count })
            .ok_or_else(|| JobError::Fatal(format!("tick for unknown job {key:?}")))?;
        if cfg!(feature = "broken") && setting("trap-after-ticks").and_then(|n| n.parse().ok()) == Some(ticks)
        {
            panic!("counter-broken traps at tick {ticks} of job {key:?}");
        }
        JOBS.insert(key, Count { value, target, ticks });
        save_state(key, value.to_string().as_bytes())?;
        emit(key, if cfg!(feature = "v2") { format!("v2 {value}") } else { value.to_string() }.as_bytes())?;
        if target.is_some_and(|target| value >= target) {
            JOBS.remove(key);
            pulse_plugin::complete(key)?;
        }
        Ok(())
    }
}

pulse_plugin::export_handler!(Counter);
