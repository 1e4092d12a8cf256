//! The benchmark program of pulse-host.
//!
//! ```text
//! cargo run --release -p pulse-bench -- SCENARIO [--quick]
//! ```
//!
//! Each scenario prints one line per configuration, for machines to read:
//! `RESULT scenario=NAME key=value …`, plain numbers with the unit in the key
//! (`_ms`, `_us`, `_mib`, `_per_s`). Scenarios:
//!
//! - `runtime`: plugin compile and cached load time, instantiation latency,
//!   call overhead at 16 B and 64 KiB, resident memory of idle instances.
//!
//! `--quick` runs fewer iterations (a smoke test of the program itself).
#![allow(clippy::print_stdout, reason = "the program's output is its RESULT lines")]

mod report;
mod runtime;

use std::process::ExitCode;

const USAGE: &str = "usage: pulse-bench SCENARIO [--quick]\nscenarios: runtime";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let scenarios: Vec<&str> = args.iter().map(String::as_str).filter(|a| !a.starts_with("--")).collect();
    if let Some(unknown) = args.iter().find(|a| a.starts_with("--") && *a != "--quick") {
        eprintln!("pulse-bench: unknown option {unknown}\n{USAGE}");
        return ExitCode::from(2);
    }
    let [scenario] = scenarios.as_slice() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match *scenario {
        "runtime" => runtime::run(quick),
        other => {
            eprintln!("pulse-bench: unknown scenario {other:?}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("pulse-bench: {scenario} failed: {error}");
            ExitCode::FAILURE
        }
    }
}
