//! `hog`: allocates without bound on demand, to test memory limits.
//!
//! Payload `hog` allocates 1 MiB blocks and keeps them until the allocator
//! fails, which aborts (traps) the instance once the host refuses to grow its
//! memory. See `../on-demand.rs` for when payloads are read.

wit_bindgen::generate!({ path: "../../wit", world: "job-handler" });
include!("../../on-demand.rs");

const BLOCK: usize = 1 << 20;

fn misbehave(payload: &[u8]) -> Result<(), JobError> {
    if payload == b"hog" {
        let mut kept: Vec<Vec<u8>> = Vec::new();
        loop {
            // Touch every block and hide it from the optimiser, or the
            // allocation is removed and the limit is never reached.
            let block = std::hint::black_box(vec![1u8; BLOCK]);
            kept.push(block);
            std::hint::black_box(&kept);
        }
    }
    Ok(())
}
