//! `pulse-host try PLUGIN.wasm SCRIPT`: runs a job handler component in
//! this process, without Redis, on a clock of its own, as a script says.
//! The plugin author's first loop: no pool, no second process.
//!
//! A script is one step a line (`#` starts a comment):
//!
//! - `start KEY [PAYLOAD]`: starts job KEY (its saved state, if any, is
//!   given to it, as after a move);
//! - `notify KEY PAYLOAD`;
//! - `advance DURATION` (`5s`, `250ms`): moves the clock on, firing the
//!   timers that fall due, in order;
//! - `stop KEY`;
//! - `crash-and-move KEY`: the job's instance is dropped without a call
//!   (as when its host dies) and a new one starts it with `requeued` and
//!   the state it saved last.
//!
//! What the plugin does is printed as it happens: `emit`, `state`,
//! `complete`, `failed` lines on stdout, its logs on stderr. Each step
//! prints `ok` or its error. The exit code is 0, or 5 when the plugin
//! trapped (a step's call or a timer).
//!
//! The plugin runs as a host runs it: the same runtime, limits and
//! settings, and outbound HTTP under the same allow-list rules (none
//! allowed unless given).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use pulse_plugin_test::Harness;
use pulse_runtime::{CallError, Output, Plugin};

/// One step of a script.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Start { key: String, payload: Vec<u8> },
    Notify { key: String, payload: Vec<u8> },
    Advance(Duration),
    Stop { key: String },
    CrashAndMove { key: String },
}

/// The steps of `text`, each with its line number; the first wrong line
/// is an error naming it and what is allowed.
fn parse(text: &str) -> anyhow::Result<Vec<(usize, Step)>> {
    let mut steps = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        let (key, payload) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        let (key, payload) = (key.to_owned(), payload.trim().as_bytes().to_vec());
        let need_key = |step: Step| match key.is_empty() {
            true => anyhow::bail!("line {number}: `{word}` needs a job key"),
            false => Ok(step),
        };
        let step = match word {
            "start" => need_key(Step::Start { key: key.clone(), payload })?,
            "notify" => need_key(Step::Notify { key: key.clone(), payload })?,
            "stop" => need_key(Step::Stop { key: key.clone() })?,
            "crash-and-move" => need_key(Step::CrashAndMove { key: key.clone() })?,
            "advance" => Step::Advance(pulse_config::units::duration(rest).with_context(|| {
                format!("line {number}: `advance {rest}`: write a duration such as 5s or 250ms")
            })?),
            other => anyhow::bail!(
                "line {number}: unknown step {other:?}: allowed are start KEY [PAYLOAD], notify KEY PAYLOAD, advance DURATION, stop KEY, crash-and-move KEY"
            ),
        };
        steps.push((number, step));
    }
    Ok(steps)
}

fn show(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => bytes.iter().fold(String::from("0x"), |mut hex, b| {
            let _ = write!(hex, "{b:02x}");
            hex
        }),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// An output as `try` prints it.
fn print(output: &Output) {
    say(&match output {
        Output::Emit { key, payload } => format!("emit {key}: {}", show(payload)),
        Output::SaveState { key, state } => format!("state {key}: {}", show(state)),
        Output::Complete { key } => format!("complete {key}"),
        Output::Failed { key, error } => format!("failed {key}: {error}"),
    });
}

/// Loads the component at `path` as a host would load a `[[plugin]]` of
/// that file with these `settings` (`KEY=VALUE`) and outbound hosts, with
/// the default runtime and limits.
///
/// # Errors
/// A setting without `=`, a component that is not a job handler, a
/// file that cannot be read: each naming what is wrong.
pub fn load(path: &Path, settings: &[String], allow_outbound: &[String]) -> anyhow::Result<Loaded> {
    let path = std::fs::canonicalize(path).with_context(|| format!("failed to read {}", path.display()))?;
    let mut text = format!("[[plugin]]\nname = \"try\"\npath = {:?}\n", path.display().to_string());
    let hosts: Vec<String> = allow_outbound.iter().map(|host| format!("{host:?}")).collect();
    let _ = writeln!(text, "allowed_outbound_hosts = [{}]\n[plugin.settings]", hosts.join(", "));
    for setting in settings {
        let (key, value) =
            setting.split_once('=').with_context(|| format!("--settings {setting:?}: write KEY=VALUE"))?;
        let _ = writeln!(text, "{key:?} = {value:?}");
    }
    let config = pulse_config::parse(Path::new("try.toml"), &text, &crate::defaults::defaults())?;
    let (runtime, mut plugins, _) = crate::serve::load_all(&config)?;
    Ok(Loaded { plugin: plugins.remove(0).plugin, runtime })
}

/// A plugin loaded for `try`, with the runtime it runs in.
pub struct Loaded {
    plugin: Plugin,
    runtime: pulse_runtime::Runtime,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("plugin", &self.plugin.name()).finish_non_exhaustive()
    }
}

/// Runs `script` against `plugin` (see the module's documentation);
/// returns whether the plugin trapped.
///
/// # Errors
/// A script that cannot be read or has a wrong line (nothing is run).
pub async fn run(loaded: Loaded, script: &Path) -> anyhow::Result<bool> {
    let text =
        std::fs::read_to_string(script).with_context(|| format!("failed to read {}", script.display()))?;
    let steps = parse(&text).with_context(|| format!("{}", script.display()))?;
    let trapped = Arc::new(AtomicBool::new(false));
    let mut harness = Harness::new(loaded.plugin, loaded.runtime);
    let seen = trapped.clone();
    harness.observe(move |output| {
        if let Output::Failed { error: CallError::Trap(_), .. } = output {
            seen.store(true, Ordering::Relaxed);
        }
        print(output);
    });
    for (line, step) in steps {
        say(&format!("> {}", describe(&step)));
        let result = match step {
            Step::Start { key, payload } => harness.start(&key, payload).await,
            Step::Notify { key, payload } => harness.notify(&key, payload).await,
            Step::Stop { key } => harness.stop(&key).await,
            Step::Advance(by) => {
                harness.advance(by).await;
                Ok(())
            }
            Step::CrashAndMove { key } => harness.crash_and_move(&key).await,
        };
        match result {
            Ok(()) => say("ok"),
            Err(error) => {
                if matches!(error, CallError::Trap(_)) {
                    trapped.store(true, Ordering::Relaxed);
                }
                say(&format!("error (line {line}): {error}"));
            }
        }
    }
    harness.close().await;
    Ok(trapped.load(Ordering::Relaxed))
}

fn describe(step: &Step) -> String {
    match step {
        Step::Start { key, payload } => format!("start {key} {}", show(payload)).trim_end().to_owned(),
        Step::Notify { key, payload } => format!("notify {key} {}", show(payload)),
        Step::Advance(by) => format!("advance {by:?}"),
        Step::Stop { key } => format!("stop {key}"),
        Step::CrashAndMove { key } => format!("crash-and-move {key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_is_read_step_by_step_and_a_wrong_line_is_named() {
        let steps =
            parse("# a comment\nstart c1\nnotify c1 reset  # why\nadvance 2s\ncrash-and-move c1\nstop c1\n")
                .unwrap();
        let steps: Vec<Step> = steps.into_iter().map(|(_, step)| step).collect();
        assert_eq!(
            steps,
            [
                Step::Start { key: "c1".into(), payload: Vec::new() },
                Step::Notify { key: "c1".into(), payload: b"reset".to_vec() },
                Step::Advance(Duration::from_secs(2)),
                Step::CrashAndMove { key: "c1".into() },
                Step::Stop { key: "c1".into() },
            ]
        );
        let error = parse("start c1\njump c1\n").unwrap_err().to_string();
        assert!(error.contains("line 2: unknown step \"jump\": allowed are start KEY"), "{error}");
        let error = parse("advance soon\n").unwrap_err().to_string();
        assert!(error.contains("line 1: `advance soon`: write a duration"), "{error}");
        let error = parse("stop\n").unwrap_err().to_string();
        assert!(error.contains("line 1: `stop` needs a job key"), "{error}");
    }
}
