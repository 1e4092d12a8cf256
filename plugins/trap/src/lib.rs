//! `trap`: traps on demand, to show that a trap ends one job, not the host.
//!
//! Payload `trap` panics (a trap, since plugins abort on panic); payload
//! `fail` returns a fatal error; payload `retry` a retryable one; payload
//! `invalid` an invalid-input one. See `../on-demand.rs` for when payloads
//! are read.

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });
include!("../../on-demand.rs");

fn misbehave(payload: &[u8]) -> Result<(), JobError> {
    match payload {
        b"trap" => panic!("trap requested"),
        b"fail" => Err(JobError::Fatal("failure requested".into())),
        b"retry" => Err(JobError::Retryable("retry requested".into())),
        b"invalid" => Err(JobError::InvalidInput("invalid input requested".into())),
        _ => Ok(()),
    }
}
