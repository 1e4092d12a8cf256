//! Workers in separate processes (`pool-worker`) that are killed or frozen
//! while they run jobs, with a journal of every handler call in Redis.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead as _, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pulse_pool::hash::{VIRTUAL_SLOTS, slot_of};
use pulse_pool::{DispatchOutcome, EventOutcome, JobState, Node, NodeOptions};
use pulse_testkit::{RedisServer, slot_table};

/// How long a test waits for what takes seconds (a lease to expire).
const PATIENCE: Duration = Duration::from_secs(60);

/// A `pool-worker` process.
pub(crate) struct WorkerProcess {
    child: Child,
    stdin: Option<ChildStdin>,
    pub(crate) node: String,
}

impl WorkerProcess {
    pub(crate) fn spawn(url: &str, pool: &str, workers: usize, lease_ttl_ms: u64) -> Self {
        Self::spawn_with(url, pool, workers, lease_ttl_ms, &[])
    }

    /// With environment variables (`PULSE_TEST_SAVE_MS`, `PULSE_TEST_JOURNAL`).
    pub(crate) fn spawn_with(
        url: &str,
        pool: &str,
        workers: usize,
        lease_ttl_ms: u64,
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_pool-worker"))
            .args([url, pool, &workers.to_string(), &lease_ttl_ms.to_string()])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let node =
            line.trim().strip_prefix("ready ").unwrap_or_else(|| panic!("not ready: {line:?}")).to_owned();
        let stdin = child.stdin.take();
        Self { child, stdin, node }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends `signal`; a `-STOP` returns once every thread of the process
    /// has stopped. Linux stops a multi-threaded process in steps: the
    /// signal wakes one thread, which then stops the others, so they may
    /// run on for a moment after `kill` returns (under load, long enough to
    /// process an event sent after it): a test that marks the process
    /// frozen must not do so before it is.
    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
        if signal == "-STOP" {
            let deadline = Instant::now() + PATIENCE;
            while !self.stopped() {
                assert!(Instant::now() < deadline, "process {} did not stop", self.pid());
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Whether every thread of the process is stopped (state `T`).
    fn stopped(&self) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else { return false };
        tasks.flatten().all(|task| {
            std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                // `pid (comm) state ...`: the state follows the last ')'.
                stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
            })
        })
    }

    /// Closes the node (its jobs go to the others) and waits for the exit.
    pub(crate) fn close(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "pool-worker exited with {status}");
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One journal entry: `kind|key|token|worker|pid|detail`, or a marker the
/// test wrote (`kind` = `killed`, `frozen`, `resumed`; `key` = the pid).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) kind: String,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) worker: String,
    pub(crate) pid: String,
    pub(crate) detail: String,
}

/// For each journal entry, whether a store that checks fencing tokens
/// would take it: false for a handler's write under a token older than
/// one its job was started with before (a call of a superseded run that
/// finished late, after its process was frozen).
pub(crate) fn current_writes(entries: &[Entry]) -> Vec<bool> {
    let mut newest: HashMap<&str, u64> = HashMap::new();
    entries
        .iter()
        .map(|e| {
            let Ok(token) = e.token.parse::<u64>() else { return true };
            let seen = newest.entry(e.key.as_str()).or_insert(0);
            if e.kind == "start" {
                *seen = (*seen).max(token);
            }
            token >= *seen
        })
        .collect()
}

pub(crate) async fn journal(conn: &mut redis::aio::MultiplexedConnection, pool: &str) -> Vec<Entry> {
    let lines: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("pulse-test:{{{pool}}}:journal"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    // A journal write retried after a timeout may have gone through twice:
    // the same line, with the same entry number.
    let mut seen = HashSet::new();
    lines
        .into_iter()
        .filter(|line| seen.insert(line.clone()))
        .map(|line| {
            let line = line.rsplit_once("|#").map_or(line.as_str(), |(entry, _)| entry).to_owned();
            let f: Vec<&str> = line.splitn(6, '|').collect();
            let field = |i: usize| f.get(i).copied().unwrap_or_default().to_owned();
            Entry {
                kind: field(0),
                key: field(1),
                token: field(2),
                worker: field(3),
                pid: field(4),
                detail: field(5),
            }
        })
        .collect()
}

pub(crate) async fn mark(conn: &mut redis::aio::MultiplexedConnection, pool: &str, kind: &str, pid: u32) {
    redis::cmd("RPUSH")
        .arg(format!("pulse-test:{{{pool}}}:journal"))
        .arg(format!("{kind}|{pid}"))
        .exec_async(conn)
        .await
        .unwrap();
}

/// Dispatches `count` jobs `job-<i>`, 32 at a time; all must start.
pub(crate) async fn dispatch_all(client: &Arc<Node>, count: usize) {
    let mut lanes = Vec::new();
    for lane in 0..32 {
        let client = client.clone();
        lanes.push(tokio::spawn(async move {
            for i in (lane..count).step_by(32) {
                assert_eq!(
                    client.dispatch(&format!("job-{i}"), b"").await.unwrap(),
                    DispatchOutcome::Started
                );
            }
        }));
    }
    for lane in lanes {
        lane.await.unwrap();
    }
}

/// Waits until every one of `count` jobs runs on the worker its key routes
/// to, every node of `nodes` hosts workers and no other node does, and the
/// journal shows each job started last on its worker; returns job -> worker.
pub(crate) async fn settled(
    client: &Node,
    conn: &mut redis::aio::MultiplexedConnection,
    pool: &str,
    count: usize,
    nodes: &[&str],
) -> HashMap<String, String> {
    let deadline = Instant::now() + PATIENCE;
    // The journal may live on another server than the pool.
    let mut pool_conn = client.redis_client().shared().await.unwrap();
    loop {
        let workers = client.workers().await.unwrap();
        let slots = slot_table(&mut pool_conn, pool).await;
        let members = slots.len() == VIRTUAL_SLOTS as usize
            && workers.iter().all(|w| w.slots > 0)
            && workers.iter().all(|w| nodes.contains(&w.node.as_str()))
            && nodes.iter().all(|node| workers.iter().any(|w| w.node == *node));
        let jobs = client.jobs().await.unwrap();
        let mut last: HashMap<&str, &Entry> = HashMap::new();
        let entries = journal(conn, pool).await;
        for e in &entries {
            match e.kind.as_str() {
                "start" => {
                    last.insert(&e.key, e);
                }
                // The end of the run it belongs to (a late drop of an older
                // run ends nothing).
                "stop" | "drop" if last.get(e.key.as_str()).is_some_and(|run| run.token == e.token) => {
                    last.insert(&e.key, e);
                }
                _ => {}
            }
        }
        let placed = members
            && jobs.len() == count
            && jobs.iter().all(|job| {
                let owner = &slots[&slot_of(&job.key, VIRTUAL_SLOTS)];
                job.state == JobState::Running
                    && job.worker.as_deref() == Some(owner.as_str())
                    && last.get(job.key.as_str()).is_some_and(|e| e.kind == "start" && e.worker == *owner)
            });
        if placed {
            return jobs.into_iter().map(|job| (job.key, job.worker.unwrap_or_default())).collect();
        }
        if Instant::now() >= deadline {
            let owner = |key: &str| slots.get(&slot_of(key, VIRTUAL_SLOTS)).cloned().unwrap_or_default();
            let wrong: Vec<String> = jobs
                .iter()
                .filter(|job| {
                    last.get(job.key.as_str())
                        .is_none_or(|e| e.kind != "start" || e.worker != owner(&job.key))
                })
                .take(5)
                .map(|job| {
                    format!("{job:?} routes to {}, journal {:?}", owner(&job.key), last.get(job.key.as_str()))
                })
                .collect();
            panic!("the pool did not settle: {workers:?}, {} jobs; for instance {wrong:#?}", jobs.len());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks that no key ever ran on two processes at once: per key, a start
/// follows only a stop or drop of the run before, or the killing or
/// freezing of the process running it (a frozen process's runs end there:
/// if it is evicted it drops them on waking without running them, which
/// the frozen-process test checks; if not, nobody else starts them).
pub(crate) fn assert_no_overlap(entries: &[Entry]) {
    let mut running: HashMap<String, String> = HashMap::new(); // key -> pid
    for (i, e) in entries.iter().enumerate() {
        match e.kind.as_str() {
            "killed" | "frozen" => running.retain(|_, pid| *pid != e.key),
            "start" => {
                if let Some(pid) = running.get(&e.key) {
                    panic!("entry {i}: {e:?} started while process {pid} ran it");
                }
                running.insert(e.key.clone(), e.pid.clone());
            }
            "stop" | "drop" if running.get(&e.key) == Some(&e.pid) => {
                running.remove(&e.key);
            }
            _ => {}
        }
    }
}

pub(crate) fn client_options() -> NodeOptions {
    NodeOptions { reply_timeout: Duration::from_secs(30), ..NodeOptions::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_a_host_moves_exactly_its_jobs_once_and_no_job_of_the_survivor() {
    let server = RedisServer::start();
    let pool = "failover";
    let mut a = WorkerProcess::spawn(server.url(), pool, 2, 2_000);
    let b = WorkerProcess::spawn(server.url(), pool, 2, 2_000);
    let redis = pulse_redis::Redis::open(server.url()).unwrap();
    let client = Arc::new(Node::client(&redis, pool, client_options()).await.unwrap());
    dispatch_all(&client, 1_000).await;
    let mut conn = server.connect().await;
    let before = settled(&client, &mut conn, pool, 1_000, &[&a.node, &b.node]).await;
    let workers = client.workers().await.unwrap();
    let on_a: HashSet<String> = workers.iter().filter(|w| w.node == a.node).map(|w| w.id.clone()).collect();
    let moved: HashSet<String> =
        before.iter().filter(|(_, w)| on_a.contains(*w)).map(|(key, _)| key.clone()).collect();
    assert!(moved.len() > 300, "process a holds only {} of 1,000 jobs", moved.len());

    let a_pid = a.pid();
    let killed_at = Instant::now();
    a.kill();
    mark(&mut conn, pool, "killed", a_pid).await;
    let after = settled(&client, &mut conn, pool, 1_000, &[&b.node]).await;
    eprintln!("{} jobs of the killed process run again after {:?}", moved.len(), killed_at.elapsed());

    let entries = journal(&mut conn, pool).await;
    assert_no_overlap(&entries);
    let b_pid = b.pid().to_string();
    for key in before.keys() {
        let of_key: Vec<&Entry> = entries.iter().filter(|e| e.key == *key && e.pid == b_pid).collect();
        let starts = of_key.iter().filter(|e| e.kind == "start").count();
        let stops = of_key.iter().filter(|e| e.kind == "stop").count();
        // Each job started once on the survivor and was never stopped
        // there: the killed host's jobs came over once, and the
        // survivor's own jobs did not move, not even between its workers.
        assert_eq!((starts, stops), (1, 0), "job {key} on the survivor: {of_key:?}");
        if moved.contains(key) {
            assert_eq!(of_key[0].detail, "requeued", "job {key} came back without its flag: {of_key:?}");
        } else {
            assert_eq!(after[key], before[key], "job {key} of the survivor moved");
        }
    }
    // The killed host's slots went to the survivor's workers, balanced.
    let table = slot_table(&mut conn, pool).await;
    let mut held: HashMap<&str, usize> = HashMap::new();
    for worker in table.values() {
        *held.entry(worker).or_default() += 1;
    }
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.values().all(|n| *n == VIRTUAL_SLOTS as usize / 2), "{held:?}");
    b.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_process_runs_nothing_of_the_jobs_it_lost_and_its_notifications_arrive_elsewhere() {
    let server = RedisServer::start();
    let pool = "frozen";
    let a = WorkerProcess::spawn(server.url(), pool, 2, 1_000);
    let b = WorkerProcess::spawn(server.url(), pool, 2, 1_000);
    let redis = pulse_redis::Redis::open(server.url()).unwrap();
    let client = Arc::new(Node::client(&redis, pool, client_options()).await.unwrap());
    dispatch_all(&client, 200).await;
    let mut conn = server.connect().await;
    let before = settled(&client, &mut conn, pool, 200, &[&a.node, &b.node]).await;
    let a_pid = a.pid().to_string();
    let a_tokens: HashSet<String> = journal(&mut conn, pool)
        .await
        .into_iter()
        .filter(|e| e.kind == "start" && e.pid == a_pid)
        .map(|e| e.token)
        .collect();
    assert!(!a_tokens.is_empty());

    a.signal("-STOP");
    mark(&mut conn, pool, "frozen", a.pid()).await;
    // Notifications sent while the process is frozen: those for its jobs
    // wait in its inbox, then go with the jobs to their next worker.
    let mut sends = Vec::new();
    for key in before.keys().cloned() {
        let client = client.clone();
        sends.push(tokio::spawn(async move { (client.notify(&key, b"n1").await.unwrap(), key) }));
    }
    for send in sends {
        let (outcome, key) = send.await.unwrap();
        assert!(matches!(outcome, EventOutcome::Done | EventOutcome::Held), "notify {key}: {outcome:?}");
    }
    settled(&client, &mut conn, pool, 200, &[&b.node]).await;

    a.signal("-CONT");
    mark(&mut conn, pool, "resumed", a.pid()).await;
    // It joins again and takes its share back, under new tokens.
    settled(&client, &mut conn, pool, 200, &[&a.node, &b.node]).await;

    let entries = journal(&mut conn, pool).await;
    assert_no_overlap(&entries);
    let frozen = entries.iter().position(|e| e.kind == "frozen").unwrap();
    for e in &entries[frozen..] {
        if e.pid == a_pid && e.kind != "drop" {
            assert!(!a_tokens.contains(&e.token), "the resumed process ran a job it lost: {e:?}");
        }
    }
    let dropped = entries[frozen..].iter().filter(|e| e.pid == a_pid && e.kind == "drop").count();
    if dropped != a_tokens.len() {
        let text: Vec<String> = entries.iter().map(|e| format!("{e:?}")).collect();
        std::fs::write("/tmp/journal.txt", text.join("\n")).unwrap();
    }
    assert_eq!(dropped, a_tokens.len(), "each job it lost is dropped once");
    // Every notification arrived exactly once, numbered right after the start.
    for key in before.keys() {
        let notes: Vec<&Entry> = entries.iter().filter(|e| e.kind == "notify" && e.key == *key).collect();
        assert_eq!(notes.len(), 1, "job {key}: {notes:?}");
        assert_eq!(notes[0].detail, "1:n1", "job {key}: {notes:?}");
    }
    a.close();
    b.close();
}

/// What the traffic task did: acknowledged notifications per key (in the
/// order sent) and the keys it stopped.
#[derive(Default)]
struct Traffic {
    dispatched: HashSet<String>,
    stopped: HashSet<String>,
    /// Stops answered `Done`: the job must never run again.
    done: HashSet<String>,
    notified: HashMap<String, Vec<u64>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_of_joins_leaves_kills_and_freezes_loses_doubles_and_reorders_nothing() {
    let server = RedisServer::start();
    let pool = "chaos";
    let spawn = || WorkerProcess::spawn(server.url(), pool, 2, 1_000);
    let mut live: Vec<WorkerProcess> = (0..3).map(|_| spawn()).collect();
    let redis = pulse_redis::Redis::open(server.url()).unwrap();
    let client = Arc::new(Node::client(&redis, pool, client_options()).await.unwrap());
    let mut conn = server.connect().await;

    // Checked between requests, never cutting one off: a request sent but
    // cancelled before its answer would act on the pool unrecorded.
    let stop_traffic = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = tokio::spawn({
        let client = client.clone();
        let stop_traffic = stop_traffic.clone();
        let mut conn = server.connect().await;
        async move {
            let mut done = Traffic::default();
            let mut rng = fastrand::Rng::with_seed(7);
            let mut next_note: HashMap<String, u64> = HashMap::new();
            let mut i = 0;
            loop {
                if stop_traffic.load(std::sync::atomic::Ordering::Relaxed) {
                    return done;
                }
                let key = format!("job-{}", rng.usize(..1_000));
                let act = async {
                    match rng.u8(..40) {
                        0..=11 if !done.dispatched.contains(&key) => {
                            // Unconfirmed: accepted, its answer late.
                            let outcome = client.dispatch(&key, b"").await.unwrap();
                            assert!(
                                matches!(
                                    outcome,
                                    DispatchOutcome::Started
                                        | DispatchOutcome::Queued
                                        | DispatchOutcome::Unconfirmed
                                ),
                                "{key}: {outcome:?}"
                            );
                            done.dispatched.insert(key.clone());
                        }
                        12 if done.dispatched.contains(&key) && !done.stopped.contains(&key) => {
                            // Held: it stops right after its next start.
                            let outcome = client.stop(&key).await.unwrap();
                            assert!(
                                matches!(
                                    outcome,
                                    EventOutcome::Done | EventOutcome::Held | EventOutcome::Unconfirmed
                                ),
                                "{key}: {outcome:?}"
                            );
                            done.stopped.insert(key.clone());
                            if outcome == EventOutcome::Done {
                                // Marks in the journal when the answer came.
                                let marker = format!("done|{key}");
                                let _: () = redis::cmd("RPUSH")
                                    .arg(format!("pulse-test:{{{pool}}}:journal"))
                                    .arg(marker)
                                    .query_async(&mut conn)
                                    .await
                                    .unwrap();
                                done.done.insert(key.clone());
                            }
                        }
                        _ if done.dispatched.contains(&key) && !done.stopped.contains(&key) => {
                            let n = next_note.entry(key.clone()).or_insert(0);
                            *n += 1;
                            let sent = *n;
                            let outcome = client.notify(&key, sent.to_string().as_bytes()).await;
                            if matches!(outcome, Ok(EventOutcome::Done | EventOutcome::Held)) {
                                done.notified.entry(key.clone()).or_default().push(sent);
                            }
                        }
                        _ => {}
                    }
                };
                act.await;
                i += 1;
                if i % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        }
    });

    // Membership chaos for a bounded time, always one process serving.
    let mut rng = fastrand::Rng::with_seed(11);
    let until = Instant::now() + Duration::from_secs(15);
    let mut frozen: Vec<(WorkerProcess, Instant)> = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.u64(300..900))).await;
        let now = Instant::now();
        while let Some(index) = frozen.iter().position(|(_, at)| *at <= now) {
            let (process, _) = frozen.remove(index);
            process.signal("-CONT");
            mark(&mut conn, pool, "resumed", process.pid()).await;
            live.push(process);
        }
        match rng.u8(..4) {
            0 if live.len() < 5 => live.push(spawn()),
            1 if live.len() > 1 => {
                let mut process = live.remove(rng.usize(..live.len()));
                let pid = process.pid();
                process.kill();
                mark(&mut conn, pool, "killed", pid).await;
            }
            2 if live.len() > 1 => {
                let process = live.remove(rng.usize(..live.len()));
                process.signal("-STOP");
                mark(&mut conn, pool, "frozen", process.pid()).await;
                frozen.push((process, now + Duration::from_millis(rng.u64(500..3_000))));
            }
            3 if live.len() > 1 => tokio::task::spawn_blocking({
                let process = live.remove(rng.usize(..live.len()));
                move || process.close()
            })
            .await
            .unwrap(),
            _ => {}
        }
    }
    for (process, _) in frozen.drain(..) {
        process.signal("-CONT");
        mark(&mut conn, pool, "resumed", process.pid()).await;
        live.push(process);
    }
    stop_traffic.store(true, std::sync::atomic::Ordering::Relaxed);
    let done = traffic.await.unwrap();

    let running: usize = done.dispatched.len() - done.stopped.len();
    let nodes: Vec<&str> = live.iter().map(|p| p.node.as_str()).collect();
    // On a failure, the journal is kept beside the test's other temporary
    // files for whoever investigates.
    let dump = std::env::temp_dir().join("pulse-chaos-journal.txt");
    let entries = journal(&mut conn, pool).await;
    let text: Vec<String> = entries.iter().map(|e| format!("{e:?}")).collect();
    std::fs::write(&dump, text.join("\n")).unwrap();
    let jobs: HashSet<String> = client.jobs().await.unwrap().into_iter().map(|j| j.key).collect();
    let expected: HashSet<String> = done.dispatched.difference(&done.stopped).cloned().collect();
    eprintln!(
        "chaos: missing {:?}, extra {:?} (journal in {})",
        expected.difference(&jobs).take(5).collect::<Vec<_>>(),
        jobs.difference(&expected).take(5).collect::<Vec<_>>(),
        dump.display()
    );
    let placed = settled(&client, &mut conn, pool, running, &nodes).await;
    let entries = journal(&mut conn, pool).await;
    assert_no_overlap(&entries);
    for key in &done.dispatched {
        assert_eq!(placed.contains_key(key), !done.stopped.contains(key), "{key}");
    }
    // A job whose stop answered `Done` never ran again.
    for key in &done.done {
        let answered = entries.iter().position(|e| e.kind == "done" && e.key == *key).unwrap();
        let later: Vec<&Entry> =
            entries[answered..].iter().filter(|e| e.key == *key && e.kind == "start").collect();
        assert!(later.is_empty(), "{key} ran after its stop answered done: {later:?}");
    }
    // Every acknowledged notification arrives (a held one right after its
    // job's start, so perhaps after the pool settled), in order; an event
    // the handler ran just before its process was killed may come again.
    // A call in flight when its process was frozen finishes when the
    // process resumes: its write lands late, under the token of a run that
    // a newer start has superseded. That is what the job's fencing token
    // is for: a store that checks it refuses the write, and so does this
    // count (`stale`).
    let deadline = Instant::now() + PATIENCE;
    let entries = loop {
        let entries = journal(&mut conn, pool).await;
        let current = current_writes(&entries);
        let mut missing = Vec::new();
        for (key, sent) in &done.notified {
            let seen: Vec<u64> = entries
                .iter()
                .zip(&current)
                .filter(|(e, current)| **current && e.kind == "notify" && e.key == *key)
                .filter_map(|(e, _)| e.detail.split_once(':')?.1.parse().ok())
                .collect();
            assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{key}: reordered {seen:?}");
            missing.extend(
                sent.iter().filter(|n| !seen.contains(n)).map(|n| format!("{key}: {n} (seen {seen:?})")),
            );
        }
        if missing.is_empty() {
            break entries;
        }
        assert!(Instant::now() < deadline, "notifications lost: {missing:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let marks = |kind: &str| entries.iter().filter(|e| e.kind == kind).count();
    eprintln!(
        "chaos: {} kills, {} freezes; {} dispatched, {} stopped, {} notifications acknowledged, {} journal entries ({} stale)",
        marks("killed"),
        marks("frozen"),
        done.dispatched.len(),
        done.stopped.len(),
        done.notified.values().map(Vec::len).sum::<usize>(),
        entries.len(),
        current_writes(&entries).iter().filter(|current| !**current).count()
    );
    for process in live {
        process.close();
    }
    let _ = std::fs::remove_file(&dump);
}
