//! The one place the WIT contract becomes Rust: `bindgen!` over `wit/`.
//! Kept alone in a small module because the macro is slow to expand.
//!
//! Imports are async (a host function may wait on Redis) and trappable (an
//! `Err` stops the guest); exports are async, so a call can be bounded by a
//! timeout and a spinning guest yields at epoch ticks.
//!
//! The `job-handler` world is generated here; `producer` generates the
//! `job-producer` world over the same `types` and `env`, so one linker
//! serves both kinds of plugin.
#![allow(missing_docs, reason = "generated code; the WIT file carries the documentation")]

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "job-handler",
    imports: { default: async | trappable },
    exports: { default: async },
});

pub mod producer {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "job-producer",
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "pulse:job/types": crate::bindings::pulse::job::types,
            "pulse:job/env": crate::bindings::pulse::job::env,
        },
    });
}
