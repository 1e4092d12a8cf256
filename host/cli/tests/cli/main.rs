//! The `pulse-host` binary, as users run it: real processes, real Redis,
//! real plugins.
//!
//! - `bounds`: a hostile plugin against the host's limits.
//! - `check`: configurations and plugins refused with precise messages.
//! - `clients`: client commands: events in full, read-only listings.
//! - `docs`: the commands and options docs/cli.md and the README show
//!   against the binary's `--help`.
//! - `exposure`: HTTP clients that are slow, idle, too many or foreign;
//!   the token; Redis over TLS with an ACL user; no secret printed.
//! - `gate`: the upgrade gate undoing a bad release.
//! - `hosting`: a host runs plugins as workers; the CLI drives their jobs.
//! - `languages`: Python and JavaScript plugins across a killed host.
//! - `outbound`: plugins calling HTTP (`fetcher`) across a killed host.
//! - `registry`: plugins pushed, signed and pulled from an OCI registry.
//! - `scaffold`: `new` writes a plugin project whole or not at all.
//! - `schedules`: a host runs a producer plugin's schedule.
//! - `http`: the HTTP API, metrics and health of a running host.
//! - `tries`: `try` runs a component alone on a scripted clock.
//! - `upgrades`: a new release of a plugin rolled through two hosts by SIGHUP.
//! - `status_page`: the status page in headless Chromium.
#![allow(clippy::unwrap_used, reason = "tests and their helpers: a panic is the failure report")]

mod bounds;
mod check;
mod clients;
mod docs;
mod exposure;
mod gate;
mod hosting;
mod http;
mod languages;
mod outbound;
mod registry;
mod scaffold;
mod schedules;
mod status_page;
mod traces;
mod tries;
mod upgrades;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a test waits for a host to do something that takes
/// milliseconds.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_pulse-host")
}

/// Writes `config.toml` into `dir` with these plugin tables (`path`s of
/// built plugins by name) and extra text.
pub fn write_config(dir: &Path, plugins: &[(&str, &str, &str)], extra: &str) -> PathBuf {
    let mut text = String::from(extra);
    for (name, plugin, more) in plugins {
        let path = pulse_testkit::plugins::path(plugin);
        text.push_str(&format!("\n[[plugin]]\nname = \"{name}\"\npath = \"{}\"\n{more}\n", path.display()));
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs a client command; returns its exit code and standard output.
pub fn cli(config: &Path, redis: Option<&str>, args: &[&str]) -> (i32, String) {
    let mut command = Command::new(binary());
    command.arg("--config").arg(config).env_remove("PULSE_REDIS_URL");
    if let Some(url) = redis {
        command.args(["--redis", url]);
    }
    let output = command.args(args).output().unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Runs a client command against `redis`; returns its exit code, standard
/// output and standard error.
pub fn cli_all(config: &Path, redis: &str, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(binary())
        .arg("--config")
        .arg(config)
        .args(["--redis", redis])
        .env_remove("PULSE_REDIS_URL")
        .args(args)
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code().unwrap_or(-1), text(&output.stdout), text(&output.stderr))
}

/// A `pulse-host run` process, terminated when dropped.
#[derive(Debug)]
pub struct Host {
    pub child: Child,
}

impl Host {
    pub fn start(config: &Path, redis: Option<&str>) -> Self {
        Self::spawn(config, redis, Stdio::null())
    }

    /// A host whose log goes to the file `log`.
    pub fn start_logging(config: &Path, redis: Option<&str>, log: &Path) -> Self {
        Self::spawn(config, redis, std::fs::File::create(log).unwrap().into())
    }

    fn spawn(config: &Path, redis: Option<&str>, stderr: Stdio) -> Self {
        let mut command = Command::new(binary());
        command.arg("--config").arg(config).env_remove("PULSE_REDIS_URL");
        if let Some(url) = redis {
            command.args(["--redis", url]);
        }
        let child =
            command.arg("run").stdin(Stdio::null()).stdout(Stdio::null()).stderr(stderr).spawn().unwrap();
        Self { child }
    }

    /// Sends SIGTERM and waits; returns the exit code.
    pub fn terminate(self) -> i32 {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        self.wait("SIGTERM")
    }

    /// Waits until the host exits by itself (after `why`); returns the
    /// exit code.
    pub fn wait(mut self, why: &str) -> i32 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(Instant::now() < deadline, "the host did not exit after {why}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a host may take to serve a plugin whose component is not
/// compiled yet: an interpreter (Python, JavaScript) takes seconds to
/// compile, more on a loaded machine.
pub const COMPILE_PATIENCE: Duration = Duration::from_secs(120);

/// Waits until `done` holds, polling.
pub fn eventually(what: &str, done: impl FnMut() -> bool) {
    eventually_within(what, PATIENCE, done);
}

/// Waits until `done` holds, polling, for at most `patience`.
pub fn eventually_within(what: &str, patience: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Each job of `pool` with its worker (empty when none), from `jobs --json`.
pub fn job_workers(config: &Path, redis: Option<&str>, pool: &str) -> Vec<(String, String)> {
    let (code, out) = cli(config, redis, &["jobs", "--pool", pool, "--json"]);
    assert_eq!(code, 0, "{out}");
    let jobs: serde_json::Value = serde_json::from_str(&out).unwrap();
    jobs.as_array()
        .unwrap()
        .iter()
        .map(|job| (job["key"].as_str().unwrap().to_owned(), job["worker"].as_str().unwrap_or("").to_owned()))
        .collect()
}

/// Each job's emitted payloads in `pool`, from `events --json`, in order.
pub fn emitted(
    config: &Path,
    redis: Option<&str>,
    pool: &str,
) -> std::collections::HashMap<String, Vec<String>> {
    let (code, out) = cli(config, redis, &["events", "--pool", pool, "--json"]);
    assert_eq!(code, 0, "{out}");
    let mut by_job: std::collections::HashMap<String, Vec<String>> = std::collections::HashMap::new();
    for line in out.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = event["key"].as_str().unwrap().to_owned();
        by_job.entry(key).or_default().push(event["payload"].as_str().unwrap_or_default().to_owned());
    }
    by_job
}

/// Waits until pool `pool` has `count` workers.
pub fn wait_for_workers(config: &Path, redis: Option<&str>, pool: &str, count: usize) {
    wait_for_workers_within(config, redis, pool, count, PATIENCE);
}

/// [`wait_for_workers`], for at most `patience`.
pub fn wait_for_workers_within(
    config: &Path,
    redis: Option<&str>,
    pool: &str,
    count: usize,
    patience: Duration,
) {
    eventually_within(&format!("{count} workers serve {pool}"), patience, || {
        let (code, out) = cli(config, redis, &["workers", "--pool", pool, "--json"]);
        code == 0
            && serde_json::from_str::<serde_json::Value>(&out).ok().and_then(|v| v.as_array().map(Vec::len))
                == Some(count)
    });
}
