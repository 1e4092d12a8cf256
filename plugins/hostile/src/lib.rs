//! `hostile`: misbehaves against the host's bounds, on demand. Each
//! payload (of `start` or of a notification) names one misbehaviour; the
//! host must keep each within its documented limit (docs/limits.md) while
//! other jobs and pools carry on.
//!
//! - `timer-names`: arms 64 timers with 8 MiB names; fails `fatal` with
//!   the host's refusal, if any.
//! - `long-error`: fails `fatal` with an 8 MiB reason.
//! - `long-retry`: fails `retryable` with an 8 MiB reason.
//! - `log-flood`: logs 20,000 lines of 8 KiB through `env.log`, and as
//!   many to stdout.
//! - `timer-fail`: arms a timer every 10 ms whose callback fails
//!   `retryable` with a 1 MiB reason.
//! - `emit-flood`: emits 64 events of 1 MiB; fails `fatal` if the host
//!   refuses one.
//!
//! - `remember`: keeps the job's key in its instance's memory (a static
//!   and the heap); `recall` emits what its instance remembers (nothing
//!   when it remembers nothing): an instance must never see what an
//!   earlier one left in memory.
//!
//! With the setting `stop` = `loop`, `stop` never returns.
//! Anything else starts (or is notified) and does nothing.

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });

use exports::pulse::job::handler::Guest;
use pulse::job::types::{HostError, Job, JobError, LogLevel};
use pulse::job::{env, host};

use std::sync::atomic::{AtomicU8, Ordering};

const MIB: usize = 1 << 20;

/// What `remember` kept: on the heap, and a copy in static memory.
static REMEMBERED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());
static REMEMBERED_STATIC: [AtomicU8; 64] = [const { AtomicU8::new(0) }; 64];

struct Hostile;

impl Guest for Hostile {
    fn start(job: Job) -> Result<(), JobError> {
        misbehave(&job.key, &job.payload)
    }

    fn stop(_key: String) -> Result<(), JobError> {
        if env::config("stop").as_deref() == Some("loop") {
            let mut spins = 0u64;
            loop {
                spins = std::hint::black_box(spins.wrapping_add(1));
            }
        }
        Ok(())
    }

    fn notify(key: String, payload: Vec<u8>) -> Result<(), JobError> {
        misbehave(&key, &payload)
    }

    fn on_timer(_key: String, _name: String) -> Result<(), JobError> {
        Err(JobError::Retryable("t".repeat(MIB)))
    }
}

fn misbehave(key: &str, payload: &[u8]) -> Result<(), JobError> {
    match payload {
        b"timer-names" => {
            for i in 0..64 {
                let name = format!("{i:02}{}", "n".repeat(8 * MIB));
                host::set_timer(key, &name, 3_600_000, false).map_err(refused)?;
            }
            Ok(())
        }
        b"long-error" => Err(JobError::Fatal("e".repeat(8 * MIB))),
        b"long-retry" => Err(JobError::Retryable("r".repeat(8 * MIB))),
        b"log-flood" => {
            let line = "l".repeat(8 * 1024);
            for _ in 0..20_000 {
                env::log(LogLevel::Info, &line);
                println!("{line}");
            }
            Ok(())
        }
        b"timer-fail" => host::set_timer(key, "fail", 10, true).map_err(refused),
        b"emit-flood" => {
            let event = vec![b'x'; MIB];
            for _ in 0..64 {
                host::emit(key, &event).map_err(refused)?;
            }
            Ok(())
        }
        b"remember" => {
            let bytes = key.as_bytes();
            *REMEMBERED.lock().unwrap_or_else(|poison| poison.into_inner()) = bytes.to_vec();
            for (kept, byte) in REMEMBERED_STATIC.iter().zip(bytes) {
                kept.store(*byte, Ordering::Relaxed);
            }
            Ok(())
        }
        b"recall" => {
            let mut memory = REMEMBERED.lock().unwrap_or_else(|poison| poison.into_inner()).clone();
            memory.extend(REMEMBERED_STATIC.iter().map(|b| b.load(Ordering::Relaxed)).filter(|b| *b != 0));
            host::emit(key, &memory).map_err(refused)
        }
        _ => Ok(()),
    }
}

fn refused(error: HostError) -> JobError {
    JobError::Fatal(format!("the host refused: {error:?}"))
}

export!(Hostile);
