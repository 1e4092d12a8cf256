//! A tour of the plugin runtime with the example plugins, on one machine and
//! without Redis: `scripts/demo` runs it.
//!
//! It starts an `echo` job and notifies it, runs a `counter` job that ticks,
//! saves its state and completes by itself, and shows a trapping job fail
//! alone while its neighbour carries on.
#![allow(clippy::print_stdout, reason = "a demo talks to the person running it")]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pulse_runtime::{Isolation, Job, Output, PluginOptions, Recorder, Runtime, RuntimeConfig};

fn plugin(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../plugins/target/wasm32-wasip2/release/{name}.wasm"))
}

fn settings(pairs: &[(&str, &str)]) -> PluginOptions {
    let settings = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    PluginOptions { settings, ..PluginOptions::default() }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_target(false)
        .without_time()
        .with_ansi(terminal)
        .with_env_filter("info")
        .init();
    let runtime = Runtime::new(RuntimeConfig::default())?;
    let outputs = Recorder::new();

    println!("\n== echo: start, two notifications, stop ==");
    let echo = runtime.load_file("echo", &plugin("echo"), settings(&[("prefix", "echo says: ")]))?;
    let runner = echo.runner(Arc::new(outputs.clone()));
    runner.start(Job::new("greeting", "hello")).await?;
    runner.notify("greeting", b"how are you?".to_vec()).await?;
    runner.notify("greeting", b"bye".to_vec()).await?;
    runner.stop("greeting").await?;
    for payload in outputs.emitted("greeting") {
        println!("  emitted: {}", String::from_utf8_lossy(&payload));
    }

    println!("\n== counter: ticks every 200 ms, saves its count, completes at 5 ==");
    let counter = runtime.load_file(
        "counter",
        &plugin("counter"),
        PluginOptions { isolation: Isolation::Worker, ..settings(&[("interval-ms", "200")]) },
    )?;
    let runner = counter.runner(Arc::new(outputs.clone()));
    runner.start(Job::new("countdown", "5")).await?;
    let done = outputs
        .wait_until(Duration::from_secs(10), |o| {
            o.iter().any(|o| matches!(o, Output::Complete { key } if key == "countdown"))
        })
        .await;
    for output in done.iter().filter(|o| o.key() == "countdown") {
        match output {
            Output::Emit { payload, .. } => println!("  progress: {}", String::from_utf8_lossy(payload)),
            Output::SaveState { state, .. } => println!("  saved state: {}", String::from_utf8_lossy(state)),
            other => println!("  {other:?}"),
        }
    }

    println!("\n== trap: one job traps, its neighbour carries on ==");
    let trap = runtime.load_file("trap", &plugin("trap"), PluginOptions::default())?;
    let runner = trap.runner(Arc::new(outputs.clone()));
    runner.start(Job::new("steady", "ok")).await?;
    runner.start(Job::new("doomed", "ok")).await?;
    match runner.notify("doomed", b"trap".to_vec()).await {
        Err(error) => println!("  doomed failed: {error}"),
        Ok(()) => println!("  doomed did not trap?"),
    }
    runner.notify("steady", b"still here".to_vec()).await?;
    println!("  steady still runs: {}", runner.is_running("steady"));
    Ok(())
}
