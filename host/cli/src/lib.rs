//! The host as a library: [`run::run`] serves the configured plugins as
//! pool workers. The `pulse-host` binary is its command line; the
//! benchmark program runs the same code, so its figures are the host's.

mod adapter;
pub mod defaults;
mod reload;
pub mod run;
mod serve;
