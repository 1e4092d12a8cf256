//! `slow`: takes its time on demand, to test call timeouts and drains.
//!
//! A payload that is a decimal number of milliseconds makes the call sleep
//! that long (through WASI clocks, so the host is not blocked), after
//! printing `sleeping <ms> ms` to stdout (so a test sees the call run). See
//! `../on-demand.rs` for when payloads are read.

use std::time::Duration;

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });
include!("../../on-demand.rs");

fn misbehave(payload: &[u8]) -> Result<(), JobError> {
    let millis = std::str::from_utf8(payload).ok().and_then(|text| text.parse::<u64>().ok());
    if let Some(millis) = millis {
        println!("sleeping {millis} ms");
        std::thread::sleep(Duration::from_millis(millis));
    }
    Ok(())
}
