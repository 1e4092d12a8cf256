//! `spin`: loops forever on demand, to test call time limits.
//!
//! Payload `spin` enters a loop that never returns and never yields: only the
//! host's epoch deadline can end it. See `../on-demand.rs` for when payloads
//! are read.

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });
include!("../../on-demand.rs");

fn misbehave(payload: &[u8]) -> Result<(), JobError> {
    if payload == b"spin" {
        let mut turns: u64 = 0;
        loop {
            // `black_box` keeps the optimiser from proving anything about
            // the loop.
            turns = std::hint::black_box(turns.wrapping_add(1));
        }
    }
    Ok(())
}
