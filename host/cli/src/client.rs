//! The client commands: a client-only node that dispatches, stops,
//! notifies, lists and reads events, then leaves without a trace (its reply
//! stream is deleted on close).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use pulse_pool::{
    DispatchOutcome, EventOutcome, JobInfo, JobState, JobsQuery, Node, NodeOptions, PoolView, RefusedRelease,
    Rollout, RolloutState, WorkerInfo,
};
use pulse_pool::{Emitted, EmittedEvents, Followed};
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

/// # Cancel safety
/// Cancel safe up to joining; a node joined and dropped leaves its reply
/// stream to expire.
pub async fn connect(client: &pulse_redis::Redis, pool: &str, options: NodeOptions) -> anyhow::Result<Node> {
    Node::client(client, pool, options).await.with_context(|| format!("failed to reach pool {pool:?}"))
}

/// Leaves the pool, giving up after 2 s: a client whose Redis went away
/// has nothing to clean up that would not expire, and must still exit.
///
/// # Cancel safety
/// Not cancel safe: call it to completion so the node leaves nothing
/// behind.
pub async fn close(node: &Node) {
    if tokio::time::timeout(std::time::Duration::from_secs(2), node.close()).await.is_err() {
        tracing::warn!(pool = node.pool(), "Redis did not answer while leaving the pool; exiting anyway");
    }
}

/// A read-only view of `pool`: it does not join the pool.
///
/// # Cancel safety
/// Cancel safe: it only connects.
pub async fn view(client: &pulse_redis::Redis, pool: &str) -> anyhow::Result<PoolView> {
    PoolView::open(client, pool).await.with_context(|| format!("failed to reach pool {pool:?}"))
}

pub fn dispatch_code(outcome: &DispatchOutcome) -> (u8, String) {
    match outcome {
        DispatchOutcome::Started => (exit::OK, "started".into()),
        DispatchOutcome::Queued => (exit::OK, "queued: no worker is alive; it starts when one joins".into()),
        DispatchOutcome::AlreadyExists(state) => {
            (exit::NOT_FOUND_OR_EXISTS, format!("already exists ({})", state.as_str()))
        }
        DispatchOutcome::Refused(message) => (exit::REFUSED, format!("refused: {message}")),
        DispatchOutcome::Failed(message) => (exit::FAILED, format!("failed: {message}")),
        DispatchOutcome::PoolFull => (exit::FULL, "the pool is full (max_jobs)".into()),
        DispatchOutcome::Unconfirmed => {
            (exit::UNCONFIRMED, "sent, but no worker confirmed the start in time".into())
        }
    }
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

/// `jobs`: one page when `limit` is given (its next cursor on stderr),
/// otherwise every page, filtered by `state` and `prefix`.
pub async fn list_jobs(
    view: &PoolView,
    state: Option<&str>,
    prefix: String,
    limit: Option<usize>,
    cursor: Option<u64>,
    as_json: bool,
) -> anyhow::Result<(u8, String)> {
    let state = match state {
        None => None,
        Some(text) => Some(JobState::parse_filter(text).map_err(|why| anyhow::anyhow!("--state {why}"))?),
    };
    if let Some(limit) = limit
        && !(1..=pulse_pool::MAX_PAGE).contains(&limit)
    {
        anyhow::bail!("--limit {limit}: allowed are 1 to {}", pulse_pool::MAX_PAGE);
    }
    let mut query = JobsQuery {
        state,
        prefix,
        limit: limit.unwrap_or(pulse_pool::MAX_PAGE),
        cursor: cursor.unwrap_or(0),
    };
    let mut jobs = Vec::new();
    loop {
        let page = view.list_jobs(&query).await?;
        jobs.extend(page.jobs);
        match (page.next_cursor, limit) {
            (Some(next), None) => query.cursor = next,
            (Some(next), Some(_)) => {
                eprintln!("more jobs: --cursor {next}");
                break;
            }
            (None, _) => break,
        }
    }
    print_jobs(&mut jobs, as_json);
    Ok((exit::OK, String::new()))
}

pub fn print_jobs(jobs: &mut [JobInfo], as_json: bool) {
    jobs.sort_by(|a, b| a.key.cmp(&b.key));
    let mut out = std::io::stdout().lock();
    if as_json {
        let _ = writeln!(out, "{}", serde_json::to_string(&jobs).unwrap_or_default());
        return;
    }
    let _ = writeln!(out, "{:<32} {:<8} {:<8} {:>7}  reason", "KEY", "STATE", "WORKER", "ATTEMPT");
    for job in jobs.iter() {
        let _ = writeln!(
            out,
            "{:<32} {:<8} {:<8} {:>7}  {}",
            job.key,
            job.state.as_str(),
            job.worker.as_deref().unwrap_or("-"),
            job.attempt,
            job.reason.as_deref().unwrap_or("")
        );
    }
}

/// Prints workers, each with the machine and process of its node (from
/// `nodes`, as [`print_nodes`] takes them).
pub fn print_workers(workers: &[WorkerInfo], nodes: &[pulse_pool::NodeInfo], as_json: bool) {
    let identity = |node: &str| nodes.iter().find(|n| n.id == node).and_then(|n| n.identity.as_ref());
    let mut out = std::io::stdout().lock();
    if as_json {
        let list: Vec<_> = workers
            .iter()
            .map(|w| {
                let identity = identity(&w.node);
                json!({"id": w.id, "node": w.node, "join": w.join, "slots": w.slots, "jobs": w.jobs,
                       "digest": w.release.digest, "version": w.release.version,
                       "host": identity.map(|i| &i.host), "pid": identity.map(|i| i.pid)})
            })
            .collect();
        let _ = writeln!(out, "{}", serde_json::Value::Array(list));
        return;
    }
    let _ = writeln!(
        out,
        "{:<8} {:<26} {:<28} {:>5} {:>5} {:>6}  RELEASE",
        "WORKER", "NODE", "HOST", "JOIN", "SLOTS", "JOBS"
    );
    for w in workers {
        let host = identity(&w.node).map(|i| format!("{} pid {}", i.host, i.pid)).unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<8} {:<26} {:<28} {:>5} {:>5} {:>6}  {}",
            w.id, w.node, host, w.join, w.slots, w.jobs, w.release
        );
    }
}

fn print_workers_to(out: &mut impl Write, workers: &[WorkerInfo]) {
    let _ =
        writeln!(out, "{:<8} {:<26} {:>5} {:>5} {:>6}  RELEASE", "WORKER", "NODE", "JOIN", "SLOTS", "JOBS");
    for w in workers {
        let _ = writeln!(
            out,
            "{:<8} {:<26} {:>5} {:>5} {:>6}  {}",
            w.id, w.node, w.join, w.slots, w.jobs, w.release
        );
    }
}

/// `rollout --clear DIGEST|all`: the exit code and what to print.
pub async fn clear_refused(view: &PoolView, digest: &str) -> anyhow::Result<(u8, String)> {
    let all = digest == "all";
    if !all && !is_digest(digest) {
        anyhow::bail!(
            "--clear takes a release's digest (`sha256:` and 64 hex digits, as `rollout` lists it) or `all`, not {digest:?}"
        );
    }
    let cleared = view.clear_refused((!all).then_some(digest)).await?;
    Ok(match (cleared, all) {
        (false, true) => (exit::OK, "the pool refuses no release".to_owned()),
        (false, false) => (exit::NOT_FOUND_OR_EXISTS, format!("the pool does not refuse release {digest}")),
        (true, true) => {
            (exit::OK, "cleared every refused release: hosts bringing one try it again".to_owned())
        }
        (true, false) => (exit::OK, format!("cleared release {digest}: hosts bringing it try it again")),
    })
}

fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `rollout start --file FILE [--version V]`: announces the release of
/// `digest`, which hosts find at `path` (a file or a registry reference).
pub async fn start_rollout(
    view: &PoolView,
    digest: &str,
    path: &str,
    version: &str,
) -> anyhow::Result<(u8, String)> {
    if version.contains('|') {
        anyhow::bail!("--version may not hold `|`, got {version:?}");
    }
    if let Some(why) = view.refused_releases().await?.into_iter().find(|r| r.digest == digest) {
        anyhow::bail!(
            "the pool refuses {digest}: {} (clear it with `rollout --pool {} --clear {digest}` once fixed)",
            why.reason,
            view.pool()
        );
    }
    view.announce_rollout(digest, version, path).await?;
    Ok((
        exit::OK,
        format!(
            "announced {digest} ({path}) to pool {}: its hosts take it one at a time; `rollout --pool {}` follows it",
            view.pool(),
            view.pool()
        ),
    ))
}

/// `rollout pause`, `resume`, `undo`.
pub async fn set_rollout(view: &PoolView, state: RolloutState) -> anyhow::Result<(u8, String)> {
    Ok(match view.set_rollout_state(state).await? {
        true => (exit::OK, format!("the pool's rollout is {}", state.as_str())),
        false => (
            exit::NOT_FOUND_OR_EXISTS,
            "the pool has no rollout (announce one with `rollout start --pool P --file FILE`)".to_owned(),
        ),
    })
}

/// Which releases of its plugin a pool's workers run: per release, its
/// workers, hosts and jobs; the rollout announced for the pool; then every
/// worker with its own, and the releases the pool refuses.
pub fn print_rollout(
    workers: &[WorkerInfo],
    recorded: Option<&str>,
    announced: Option<&Rollout>,
    refused: &[RefusedRelease],
    as_json: bool,
) {
    let mut releases: Vec<(&pulse_pool::Release, Vec<&WorkerInfo>)> = Vec::new();
    for worker in workers {
        match releases.iter_mut().find(|(release, _)| **release == worker.release) {
            Some((_, members)) => members.push(worker),
            None => releases.push((&worker.release, vec![worker])),
        }
    }
    fn nodes_of<'a>(members: &[&'a WorkerInfo]) -> Vec<&'a str> {
        let mut nodes: Vec<&str> = members.iter().map(|w| w.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes
    }
    let mut out = std::io::stdout().lock();
    if as_json {
        let list: Vec<_> = releases
            .iter()
            .map(|(release, members)| {
                json!({
                    "digest": release.digest,
                    "version": release.version,
                    "nodes": nodes_of(members),
                    "workers": members.iter().map(|w| json!({"id": w.id, "node": w.node, "jobs": w.jobs})).collect::<Vec<_>>(),
                    "jobs": members.iter().map(|w| w.jobs).sum::<u64>(),
                })
            })
            .collect();
        let _ = writeln!(
            out,
            "{}",
            json!({"handler": recorded, "releases": list, "rollout": announced, "refused": refused})
        );
        return;
    }
    let _ = writeln!(out, "{:<32} {:>5} {:>7} {:>6}", "RELEASE", "HOSTS", "WORKERS", "JOBS");
    for (release, members) in &releases {
        let jobs: u64 = members.iter().map(|w| w.jobs).sum();
        let _ = writeln!(
            out,
            "{:<32} {:>5} {:>7} {:>6}",
            release.to_string(),
            nodes_of(members).len(),
            members.len(),
            jobs
        );
    }
    let state = match releases.len() {
        0 => "no workers".to_owned(),
        1 => "every worker runs one release".to_owned(),
        n => format!("rolling: workers run {n} releases"),
    };
    let _ = writeln!(out, "\n{state}; the pool's handler: {}\n", recorded.unwrap_or("none recorded"));
    if let Some(rollout) = announced {
        let hosts: Vec<String> =
            rollout.hosts.iter().map(|(node, outcome)| format!("{node} {outcome}")).collect();
        let _ = writeln!(
            out,
            "rollout of {} {} ({}): {}{}{}; hosts: {}\n",
            rollout.version,
            rollout.digest,
            rollout.path,
            rollout.state.as_str(),
            rollout.turn.as_ref().map(|node| format!(", {node}'s turn")).unwrap_or_default(),
            if rollout.reason.is_empty() { String::new() } else { format!(": {}", rollout.reason) },
            if hosts.is_empty() { "none yet".to_owned() } else { hosts.join(", ") },
        );
    }
    print_workers_to(&mut out, workers);
    for release in refused {
        let _ = writeln!(out, "\nrefused {}: {}", release.digest, release.reason);
    }
}

pub fn print_nodes(nodes: &[pulse_pool::NodeInfo], as_json: bool) {
    let mut out = std::io::stdout().lock();
    if as_json {
        let _ = writeln!(out, "{}", json!(nodes));
        return;
    }
    let _ = writeln!(out, "{:<26} {:<24} {:<32} RELEASES", "NODE", "WORKERS", "HOST");
    for node in nodes {
        let releases: Vec<String> = node.releases.iter().map(ToString::to_string).collect();
        let host = node.identity.as_ref().map_or_else(String::new, |identity| {
            let http = identity.http.as_deref().map(|http| format!(" {http}")).unwrap_or_default();
            format!("{} pid {} v{}{http}", identity.host, identity.pid, identity.version)
        });
        let _ = writeln!(
            out,
            "{:<26} {:<24} {:<32} {}",
            node.id,
            node.workers.join(" "),
            host,
            releases.join(", ")
        );
    }
}

/// Prints what plugins emitted in `pool`: every event up to the newest one
/// at the call; with `follow`, then every new one until interrupted.
///
/// # Cancel safety
/// Cancel safe: it reads and prints; dropping it stops following.
pub async fn events(
    client: &pulse_redis::Redis,
    pool: &str,
    follow: bool,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let emitted = EmittedEvents::open(client, pool).await?;
    // The bound first: what is added while the backlog prints comes after.
    let newest = emitted.newest_id().await?;
    let mut after: Option<String> = None;
    if let Some(newest) = &newest {
        loop {
            let (page, next) = emitted.page_until(after.as_deref(), newest, 1000).await?;
            for event in &page {
                print_event(event, as_json);
            }
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
    }
    if !follow {
        return Ok(ExitCode::from(exit::OK));
    }
    let mut following = emitted.follow(newest).await?;
    loop {
        let next = tokio::select! {
            event = following.recv() => event,
            _ = tokio::signal::ctrl_c() => None,
        };
        match next {
            Some(Followed::Event(event)) => print_event(&event, as_json),
            Some(Followed::Lagged { resume_after }) => {
                eprintln!("events: fell behind; events after {resume_after} were skipped");
            }
            None => break,
        }
    }
    following.close().await;
    Ok(ExitCode::from(exit::OK))
}

fn print_event(event: &Emitted, as_json: bool) {
    let key = &event.key;
    let payload = String::from_utf8_lossy(&event.payload);
    let mut out = std::io::stdout().lock();
    if as_json {
        let _ = writeln!(
            out,
            "{}",
            json!({"id": event.id, "key": key, "payload": payload, "created_at_ms": event.created_at_ms})
        );
    } else {
        let _ = writeln!(out, "{} {key}: {payload}", event.id);
    }
}

/// A job's status for people: its state, then its history, a line each.
pub(crate) fn describe_job(job: &pulse_pool::JobInfo) -> String {
    let mut text = format!(
        "{}: {} on {} (attempt {}){}",
        job.key,
        job.state.as_str(),
        job.worker.as_deref().unwrap_or("no worker"),
        job.attempt,
        job.reason.as_ref().map(|r| format!(", failed: {r}")).unwrap_or_default()
    );
    for event in &job.history {
        text.push_str(&format!("\n  {}  {}", pulse_oci::rfc3339(event.at_ms), event.event));
        if let Some(worker) = &event.worker {
            text.push_str(&format!(" {worker}"));
        }
    }
    text
}
