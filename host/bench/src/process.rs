//! Worker processes: this program re-run as one of its hidden scenarios.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};

/// Starts this program with `args` and waits until it prints `ready`. Its
/// stdin is a pipe: closing it ends the process.
pub fn spawn_ready(args: &[&str]) -> Result<Child, Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut ready = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut ready)?;
    if ready.trim() != "ready" {
        return Err(format!("the worker process did not start: {ready:?}").into());
    }
    Ok(child)
}
