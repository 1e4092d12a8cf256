//! The client commands: a client-only node that dispatches, stops,
//! notifies, lists and reads events, then leaves without a trace (its reply
//! stream is deleted on close).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use pulse_http::views::{job_json, state_name};
use pulse_pool::{DispatchOutcome, EventOutcome, JobInfo, Node, NodeOptions, WorkerInfo};
use pulse_streams::{ReaderEvent, ReaderOptions, Start, Stream, StreamOptions};
use serde_json::json;

/// Exit codes of client commands, one per outcome (documented in
/// docs/cli.md).
pub mod exit {
    /// Done: started, stopped, notified, queued or held.
    pub const OK: u8 = 0;
    /// An error: bad input, Redis unreachable, invalid config.
    pub const ERROR: u8 = 1;
    /// No such job, or the key is already taken.
    pub const NOT_FOUND_OR_EXISTS: u8 = 3;
    /// The handler refused (invalid input) or returned an error.
    pub const REFUSED: u8 = 4;
    /// The job failed.
    pub const FAILED: u8 = 5;
    /// The pool is full.
    pub const FULL: u8 = 6;
    /// Sent, but not confirmed in time.
    pub const UNCONFIRMED: u8 = 7;
}

pub async fn connect(client: &redis::Client, pool: &str, options: NodeOptions) -> anyhow::Result<Node> {
    Node::client(client, pool, options).await.with_context(|| format!("failed to reach pool {pool:?}"))
}

pub fn dispatch_code(outcome: &DispatchOutcome) -> (u8, String) {
    match outcome {
        DispatchOutcome::Started => (exit::OK, "started".into()),
        DispatchOutcome::Queued => (exit::OK, "queued: no worker is alive; it starts when one joins".into()),
        DispatchOutcome::AlreadyExists(state) => {
            (exit::NOT_FOUND_OR_EXISTS, format!("already exists ({})", state_name(*state)))
        }
        DispatchOutcome::Refused(message) => (exit::REFUSED, format!("refused: {message}")),
        DispatchOutcome::Failed(message) => (exit::FAILED, format!("failed: {message}")),
        DispatchOutcome::PoolFull => (exit::FULL, "the pool is full (max_jobs)".into()),
        DispatchOutcome::Unconfirmed => {
            (exit::UNCONFIRMED, "sent, but no worker confirmed the start in time".into())
        }
    }
}

/// Dispatches the jobs of a JSON-lines file, 32 at a time; prints one line
/// per job. The exit code is the first non-zero one, or 0.
pub async fn dispatch_many(node: &Node, file: &std::path::Path) -> anyhow::Result<(u8, String)> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line {
        key: String,
        #[serde(default)]
        payload: String,
    }
    let text = std::fs::read_to_string(file).with_context(|| format!("failed to read {}", file.display()))?;
    let mut jobs = Vec::new();
    for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let job: Line = serde_json::from_str(line).with_context(|| {
            format!("{}:{}: expected {{\"key\": \"…\", \"payload\": \"…\"}}", file.display(), number + 1)
        })?;
        jobs.push(job);
    }
    let mut code = exit::OK;
    let mut out = String::new();
    for batch in jobs.chunks(32) {
        let outcomes = futures_util::future::join_all(
            batch.iter().map(|job| node.dispatch(&job.key, job.payload.as_bytes())),
        )
        .await;
        for (job, outcome) in batch.iter().zip(outcomes) {
            let (job_code, message) = dispatch_code(&outcome?);
            if code == exit::OK {
                code = job_code;
            }
            out.push_str(&format!("{}: {message}\n", job.key));
        }
    }
    Ok((code, out.trim_end().to_owned()))
}

pub fn event_code(outcome: &EventOutcome, done: &str) -> (u8, String) {
    match outcome {
        EventOutcome::Done => (exit::OK, done.into()),
        EventOutcome::Held => {
            (exit::OK, "held: the job waits for a worker and gets it after its start".into())
        }
        EventOutcome::NoSuchJob => (exit::NOT_FOUND_OR_EXISTS, "no such job".into()),
        EventOutcome::JobFailed(reason) => (exit::FAILED, format!("the job failed: {reason}")),
        EventOutcome::HandlerError(message) => {
            (exit::REFUSED, format!("the handler returned an error: {message}"))
        }
        EventOutcome::Unconfirmed => (exit::UNCONFIRMED, "sent, but not confirmed in time".into()),
    }
}

pub fn print_jobs(jobs: &mut [JobInfo], as_json: bool) {
    jobs.sort_by(|a, b| a.key.cmp(&b.key));
    let mut out = std::io::stdout().lock();
    if as_json {
        let _ = writeln!(out, "{}", serde_json::Value::Array(jobs.iter().map(job_json).collect()));
        return;
    }
    let _ = writeln!(out, "{:<32} {:<8} {:<8} {:>7}  reason", "KEY", "STATE", "WORKER", "ATTEMPT");
    for job in jobs.iter() {
        let _ = writeln!(
            out,
            "{:<32} {:<8} {:<8} {:>7}  {}",
            job.key,
            state_name(job.state),
            job.worker.as_deref().unwrap_or("-"),
            job.attempt,
            job.reason.as_deref().unwrap_or("")
        );
    }
}

pub fn print_workers(workers: &[WorkerInfo], as_json: bool) {
    let mut out = std::io::stdout().lock();
    if as_json {
        let list: Vec<_> = workers
            .iter()
            .map(|w| json!({"id": w.id, "node": w.node, "join": w.join, "slot": w.slot, "jobs": w.jobs}))
            .collect();
        let _ = writeln!(out, "{}", serde_json::Value::Array(list));
        return;
    }
    let _ = writeln!(out, "{:<8} {:<20} {:>5} {:>5} {:>6}", "WORKER", "NODE", "JOIN", "SLOT", "JOBS");
    for w in workers {
        let slot = w.slot.map_or_else(|| "-".to_owned(), |s| s.to_string());
        let _ = writeln!(out, "{:<8} {:<20} {:>5} {:>5} {:>6}", w.id, w.node, w.join, slot, w.jobs);
    }
}

pub fn print_nodes(nodes: &[pulse_pool::NodeInfo], as_json: bool) {
    let mut out = std::io::stdout().lock();
    if as_json {
        let list: Vec<_> = nodes.iter().map(|n| json!({"id": n.id, "workers": n.workers})).collect();
        let _ = writeln!(out, "{}", serde_json::Value::Array(list));
        return;
    }
    let _ = writeln!(out, "{:<20} WORKERS", "NODE");
    for node in nodes {
        let _ = writeln!(out, "{:<20} {}", node.id, node.workers.join(" "));
    }
}

/// Prints what plugins emitted in `pool`; with `follow`, keeps printing
/// new events until interrupted.
pub async fn events(
    client: &redis::Client,
    pool: &str,
    follow: bool,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let stream = Stream::open(client, "events", StreamOptions::default().hash_tag(pool)).await?;
    let reader = stream.reader(ReaderOptions::default().start(Start::Oldest)).await?;
    let mut events = reader.subscribe();
    let mut printed_any = false;
    loop {
        let next = if follow || !printed_any {
            // The first read waits briefly for the backlog; follow waits forever.
            let wait = if follow { None } else { Some(std::time::Duration::from_millis(300)) };
            match wait {
                Some(wait) => tokio::time::timeout(wait, events.recv()).await.ok().flatten(),
                None => tokio::select! {
                    event = events.recv() => event,
                    _ = tokio::signal::ctrl_c() => None,
                },
            }
        } else {
            tokio::time::timeout(std::time::Duration::from_millis(100), events.recv()).await.ok().flatten()
        };
        let Some(event) = next else { break };
        let ReaderEvent::Event(event) = event else { continue };
        printed_any = true;
        let key = event.topic.clone().unwrap_or_default();
        let payload = String::from_utf8_lossy(&event.payload);
        let mut out = std::io::stdout().lock();
        if as_json {
            let _ = writeln!(
                out,
                "{}",
                json!({"id": event.id, "key": key, "payload": payload, "created_at_ms": event.created_at_ms()})
            );
        } else {
            let _ = writeln!(out, "{} {key}: {payload}", event.id);
        }
    }
    reader.close().await;
    Ok(ExitCode::from(exit::OK))
}
