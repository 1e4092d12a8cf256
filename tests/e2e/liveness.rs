//! Liveness under faults, judged from the handlers' journal: a process
//! frozen past its lease, and a Redis restarted empty under load. The
//! jobs' own work between handler calls (a save every 100 ms, as a
//! long-running job would) shows whether any of it ran after the fence.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pulse_pool::{DispatchOutcome, JobState, Node};
use pulse_testkit::RedisServer;

use crate::failover::{
    Entry, WorkerProcess, assert_no_overlap, client_options, dispatch_all, journal, mark, settled,
};

const SAVE: (&str, &str) = ("PULSE_TEST_SAVE_MS", "100");

/// No process calls a handler, or does a job's work, for a job another
/// process has started since under a newer token; and no job's own work
/// was ever refused as not owned while its context said it was live (as
/// the refusal came back: a process frozen between its check and its
/// request finds its context fenced by then).
fn assert_nothing_after_takeover(entries: &[Entry]) {
    let mut latest: HashMap<&str, (u64, &str)> = HashMap::new(); // key -> (token, pid)
    for (i, e) in entries.iter().enumerate() {
        let token: u64 = e.token.parse().unwrap_or(0);
        match e.kind.as_str() {
            "start" => {
                let newest = latest.get(e.key.as_str()).is_none_or(|(t, _)| token > *t);
                if newest {
                    latest.insert(&e.key, (token, &e.pid));
                }
            }
            "refused" => {
                let history: Vec<(usize, &Entry)> = entries
                    .iter()
                    .enumerate()
                    .filter(|(_, other)| other.key == e.key || other.key.is_empty())
                    .collect();
                let around: Vec<String> = entries[i.saturating_sub(40)..(i + 5).min(entries.len())]
                    .iter()
                    .map(|e| format!("{} {} {} {} {}", e.kind, e.key, e.token, e.worker, e.detail))
                    .collect();
                panic!(
                    "entry {i}: a job's work ran on a worker that had lost it: {e:?}; the job's history: {history:#?}; around: {around:#?}"
                )
            }
            "stop" | "notify" => {
                if let Some((newer, pid)) = latest.get(e.key.as_str())
                    && *newer > token
                    && *pid != e.pid
                {
                    panic!("entry {i}: {e:?} ran after process {pid} started the job under token {newer}");
                }
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_frozen_past_its_lease_settles_without_traffic_and_runs_nothing_it_lost() {
    for (pool, freeze) in [("freeze-11", 1_100), ("freeze-13", 1_300)] {
        let server = RedisServer::start();
        let a = WorkerProcess::spawn_with(server.url(), pool, 2, 1_000, &[SAVE]);
        let b = WorkerProcess::spawn_with(server.url(), pool, 2, 1_000, &[SAVE]);
        let redis = pulse_redis::Redis::open(server.url()).unwrap();
        let client = Arc::new(Node::client(&redis, pool, client_options()).await.unwrap());
        dispatch_all(&client, 200).await;
        let mut conn = server.connect().await;
        settled(&client, &mut conn, pool, 200, &[&a.node, &b.node]).await;

        a.signal("-STOP");
        mark(&mut conn, pool, "frozen", a.pid()).await;
        tokio::time::sleep(Duration::from_millis(freeze)).await;
        a.signal("-CONT");
        mark(&mut conn, pool, "resumed", a.pid()).await;
        // No traffic from here on: the pool settles by itself, every job
        // started (by its handler) on the worker its key routes to.
        let resumed = Instant::now();
        settled(&client, &mut conn, pool, 200, &[&a.node, &b.node]).await;
        eprintln!("frozen {freeze} ms with a 1 s lease: settled {:?} after resuming", resumed.elapsed());

        let entries = journal(&mut conn, pool).await;
        assert_no_overlap(&entries);
        assert_nothing_after_takeover(&entries);
        a.close();
        b.close();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_under_dispatch_load_keeps_running_jobs_where_they_run_and_fails_none() {
    let mut server = RedisServer::start();
    // The journal lives apart: the pool's Redis comes back empty.
    let journal_server = RedisServer::start();
    let pool = "emptied";
    let env = [SAVE, ("PULSE_TEST_JOURNAL", journal_server.url())];
    let a = WorkerProcess::spawn_with(server.url(), pool, 2, 2_000, &env);
    let b = WorkerProcess::spawn_with(server.url(), pool, 2, 2_000, &env);
    let redis = pulse_redis::Redis::open(server.url()).unwrap();
    let client = Arc::new(Node::client(&redis, pool, client_options()).await.unwrap());
    dispatch_all(&client, 100).await;
    let mut journal_conn = journal_server.connect().await;
    settled(&client, &mut journal_conn, pool, 100, &[&a.node, &b.node]).await;

    // Dispatches go on while Redis restarts empty.
    let loading = Arc::new(AtomicBool::new(true));
    // Its own client, which gives up on an answer soon: a start sent as
    // Redis goes down is never answered.
    let options = pulse_pool::NodeOptions { reply_timeout: Duration::from_secs(2), ..client_options() };
    let load_client = Arc::new(Node::client(&redis, pool, options).await.unwrap());
    let load = {
        let (client, loading) = (load_client.clone(), loading.clone());
        tokio::spawn(async move {
            let mut started = HashSet::new();
            let mut i = 0;
            while loading.load(Ordering::Relaxed) {
                let key = format!("load-{i}");
                if let Ok(DispatchOutcome::Started) = client.dispatch(&key, b"").await {
                    started.insert(key);
                }
                i += 1;
            }
            started
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    mark(&mut journal_conn, pool, "restarted", server.pid().unwrap()).await;
    server.restart();
    tokio::time::sleep(Duration::from_secs(1)).await;
    loading.store(false, Ordering::Relaxed);
    let load_started = load.await.unwrap();

    // Every job that ran is written back and runs where it ran; no job
    // failed because Redis restarted.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let jobs = client.jobs().await.unwrap_or_default();
        let failed: Vec<_> = jobs.iter().filter(|j| j.state == JobState::Failed).collect();
        assert!(failed.is_empty(), "jobs failed after Redis restarted: {failed:?}");
        let running: HashSet<&str> =
            jobs.iter().filter(|j| j.state == JobState::Running).map(|j| j.key.as_str()).collect();
        let initial = (0..100).all(|i| running.contains(format!("job-{i}").as_str()));
        // A load job confirmed after the restart was written by the new
        // Redis; one confirmed before it, by its worker's write-back.
        if initial && load_started.iter().all(|k| running.contains(k.as_str())) {
            break;
        }
        if Instant::now() > deadline {
            let missing: Vec<String> = (0..100)
                .map(|i| format!("job-{i}"))
                .chain(load_started.iter().cloned())
                .filter(|k| !running.contains(k.as_str()))
                .collect();
            let entries = journal(&mut journal_conn, pool).await;
            let about: Vec<&Entry> =
                entries.iter().filter(|e| missing.first() == Some(&e.key) || e.kind == "restarted").collect();
            let listed: Vec<_> = jobs.iter().filter(|j| missing.contains(&j.key)).collect();
            panic!(
                "not every running job came back: missing {missing:?}, listed as {listed:?}; journal of the first: {about:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let entries = journal(&mut journal_conn, pool).await;
    assert_no_overlap(&entries);
    assert_nothing_after_takeover(&entries);
    let restarted = entries.iter().position(|e| e.kind == "restarted").unwrap();
    // Written back, not dropped: a job may move afterwards (the workers
    // joined the new table in another order), with a stop and a start.
    for e in &entries[restarted..] {
        assert!(
            !(e.key.starts_with("job-") && e.kind == "drop"),
            "a job that ran before the restart was dropped: {e:?}"
        );
    }
    a.close();
    b.close();
}
