//! The one place the WIT contract becomes Rust: `bindgen!` over `wit/`.
//! Kept alone in a small module because the macro is slow to expand.
//!
//! Imports are async (a host function may wait on Redis) and trappable (an
//! `Err` stops the guest); exports are async, so a call can be bounded by a
//! timeout and a spinning guest yields at epoch ticks.
#![allow(missing_docs, reason = "generated code; the WIT file carries the documentation")]

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "job-handler",
    imports: { default: async | trappable },
    exports: { default: async },
});
