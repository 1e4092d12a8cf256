//! `dispatch --from-file`: a JSON-lines file of jobs, every line checked
//! before any job is sent, then dispatched in batches.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use pulse_pool::{Node, NodeOptions};

use crate::client::{dispatch_code, exit};

/// Jobs of a file sent in one batch ([`Node::dispatch_batch`]).
const FILE_BATCH: usize = 1000;
/// Batches in flight at once.
const FILE_BATCHES: usize = 4;
/// What a line must be.
const LINE_FORM: &str = "expected {\"key\": \"…\", \"payload\": \"…\"} (payload optional)";

/// A job of the file: its key and payload.
pub type FileJob = (String, Vec<u8>);

/// Reads the jobs of `file`, one JSON object per line (blank lines are
/// skipped), and checks each against the pool's limits in `options`.
///
/// # Errors
/// When the file cannot be read, or any line is refused: the error lists
/// every refused line as `not sent: FILE:LINE: why` (what is wrong and
/// what is allowed), and says that nothing was sent.
pub fn read(file: &Path, options: &NodeOptions) -> anyhow::Result<Vec<FileJob>> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line {
        key: String,
        #[serde(default)]
        payload: String,
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("failed to read {}", file.display()))?;
    let (mut jobs, mut refused) = (Vec::new(), Vec::new());
    for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let checked = serde_json::from_str::<Line>(line)
            .map_err(|error| {
                // serde's position counts lines within the line.
                let text = error.to_string();
                let what = text.split(" at line ").next().unwrap_or(&text);
                format!("{what} (column {}): {LINE_FORM}", error.column())
            })
            .and_then(|job| check(&job.key, job.payload.len(), options).map(|()| job));
        match checked {
            Ok(job) => jobs.push((job.key, job.payload.into_bytes())),
            Err(why) => refused.push(format!("not sent: {}:{}: {why}", file.display(), number + 1)),
        }
    }
    if refused.is_empty() {
        return Ok(jobs);
    }
    anyhow::bail!(
        "{}: {} of {} line(s) refused, so nothing was sent:\n{}",
        file.display(),
        refused.len(),
        refused.len() + jobs.len(),
        refused.join("\n")
    )
}

/// Whether the pool takes a job with this key and payload size, with its
/// limits, so a file is refused whole before any of it is sent. Err says
/// what is wrong and what is allowed.
fn check(key: &str, payload: usize, options: &NodeOptions) -> Result<(), String> {
    options.check_job(key, payload).map_err(|error| error.to_string())
}

/// Dispatches `jobs` in batches of 1,000 (4 in flight), and prints each
/// job's outcome, in file order. The exit code is the first non-zero one,
/// or 0. When a job's dispatch fails (Redis failed), no further batch is
/// sent: the jobs whose outcome is unknown (they may have been accepted)
/// are listed on stderr as `unknown: KEY`, the jobs not sent as `not sent:
/// KEY`, and the exit code is 7 (unconfirmed).
///
/// # Cancel safety
/// Not cancel safe: the jobs sent so far are dispatched; the rest are
/// not.
pub async fn dispatch(node: &Node, jobs: &[FileJob]) -> u8 {
    use futures_util::StreamExt;

    let mut code = exit::OK;
    let (mut unknown, mut refused, mut failure) = (Vec::new(), Vec::new(), None);
    let mut in_flight = futures_util::stream::FuturesOrdered::new();
    let mut batches = jobs.chunks(FILE_BATCH);
    let mut sent = 0;
    loop {
        while failure.is_none() && in_flight.len() < FILE_BATCHES {
            let Some(batch) = batches.next() else { break };
            sent += batch.len();
            in_flight.push_back(async move { (batch, node.dispatch_batch(batch).await) });
        }
        let Some((batch, outcomes)) = in_flight.next().await else { break };
        let mut out = std::io::stdout().lock();
        for ((key, _), outcome) in batch.iter().zip(outcomes) {
            match outcome {
                Ok(outcome) => {
                    let (job_code, message) = dispatch_code(&outcome);
                    if code == exit::OK {
                        code = job_code;
                    }
                    let _ = writeln!(out, "{key}: {message}");
                }
                // Refused before it was sent ([`read`] checks the same
                // rules, so only a pool with other rules gets here).
                Err(
                    error
                    @ (pulse_pool::Error::InvalidKey { .. } | pulse_pool::Error::PayloadTooLarge { .. }),
                ) => {
                    failure.get_or_insert(error);
                    refused.push(key.as_str());
                }
                Err(error) => {
                    failure.get_or_insert(error);
                    unknown.push(key.as_str());
                }
            }
        }
        let _ = out.flush();
    }
    let Some(error) = failure else { return code };
    let not_sent = &jobs[sent..];
    eprintln!("pulse-host: {error}");
    eprintln!(
        "pulse-host: the outcome of {} job(s) is unknown (they may have been accepted); {} job(s) were not sent:",
        unknown.len(),
        not_sent.len() + refused.len()
    );
    let mut err = std::io::stderr().lock();
    for key in unknown {
        let _ = writeln!(err, "unknown: {key}");
    }
    for key in refused.into_iter().chain(not_sent.iter().map(|(key, _)| key.as_str())) {
        let _ = writeln!(err, "not sent: {key}");
    }
    exit::UNCONFIRMED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_or_payload_the_pool_refuses_is_named_with_what_is_allowed() {
        let options = NodeOptions::default();
        assert_eq!(check("job-1", 10, &options), Ok(()));
        assert_eq!(check(&"k".repeat(options.max_key_len), 0, &options), Ok(()));
        let long = check(&"k".repeat(1 << 20), 0, &options).unwrap_err();
        assert!(
            long.contains("1048576 bytes") && long.contains("1 to 256 bytes") && long.len() < 200,
            "{long}"
        );
        let nul = check("a\0b", 0, &options).unwrap_err();
        assert!(nul.contains(r#""a\0b""#) && nul.contains("control character"), "{nul}");
        assert!(check("", 0, &options).unwrap_err().contains("empty"));
        let payload = check("k", options.max_payload + 1, &options).unwrap_err();
        assert!(payload.contains("the limit of 1048576 bytes"), "{payload}");
    }
}
