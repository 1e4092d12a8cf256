//! The host as a library: [`run::run`] serves the configured plugins as
//! pool workers. The `pulse-host` binary is its command line; the
//! benchmark program runs the same code, so its figures are the host's.

// A reload's future nests the upgrade gate's in the worker replacements':
// computing its layout goes deeper than the default limit of 128.
#![recursion_limit = "256"]

mod adapter;
pub mod defaults;
mod gate;
pub mod local;
mod pages;
pub mod registry;
mod reload;
mod rollout;
pub mod run;
pub mod scaffold;
mod serve;

pub use serve::digest;
