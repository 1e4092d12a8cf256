//! Many dispatches at once, and what one dispatch costs Redis.

use std::sync::Arc;
use std::time::Instant;

use pulse_pool::DispatchOutcome;
use pulse_testkit::unique;

use crate::{Calls, finish, node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_dispatches_are_all_confirmed_without_retries() {
    let pool = unique("load");
    let calls = Calls::default();
    let node = Arc::new(node(&pool, 4, &calls).await);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for lane in 0..32 {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in (lane..10_000).step_by(32) {
                outcomes.push(node.dispatch(&format!("job-{i}"), &[7; 100]).await.unwrap());
            }
            outcomes
        }));
    }
    let mut started_jobs = 0;
    for task in tasks {
        for outcome in task.await.unwrap() {
            assert_eq!(outcome, DispatchOutcome::Started, "every dispatch is confirmed");
            started_jobs += 1;
        }
    }
    eprintln!("10,000 dispatches confirmed in {:?}", started.elapsed());
    assert_eq!(started_jobs, 10_000);
    assert_eq!(calls.starts(), 10_000);
    assert_eq!(node.routing_retries(), 0, "no dispatch needed a retry");
    finish(&pool, &[&node]).await;
}

/// Executed Redis commands so far (Lua-internal calls included).
async fn commands(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    crate::command_calls(conn).await.values().sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_costs_the_same_few_commands_at_1000_and_50000_jobs() {
    // A server of its own: no other test's commands in the counts.
    let server = pulse_testkit::RedisServer::start();
    let client = pulse_redis::Redis::open(server.url()).unwrap();
    let calls = Calls::default();
    let node = Arc::new(pulse_pool::Node::join(&client, "cost", crate::options()).await.unwrap());
    for _ in 0..4 {
        node.add_worker(crate::Recording::new(&calls)).await.unwrap();
    }
    let mut conn = server.connect().await;
    let mut per_dispatch = Vec::new();
    let mut running = 0usize;
    for size in [1_000usize, 50_000] {
        // Fill the pool to `size` running jobs, 32 at a time.
        let mut tasks = Vec::new();
        for lane in 0..32 {
            let node = node.clone();
            tasks.push(tokio::spawn(async move {
                for i in (running + lane..size).step_by(32) {
                    assert_eq!(
                        node.dispatch(&format!("fill-{i}"), b"").await.unwrap(),
                        DispatchOutcome::Started
                    );
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        running = size;
        const N: u64 = 500;
        let idle_start = commands(&mut conn).await;
        let started = Instant::now();
        for i in 0..N {
            assert_eq!(
                node.dispatch(&format!("measured-{size}-{i}"), b"").await.unwrap(),
                DispatchOutcome::Started
            );
        }
        let elapsed = started.elapsed();
        let busy = commands(&mut conn).await - idle_start;
        // The same time with nothing dispatched: what the pool does anyway.
        let idle_from = commands(&mut conn).await;
        tokio::time::sleep(elapsed).await;
        let idle = commands(&mut conn).await - idle_from;
        let cost = (busy.saturating_sub(idle)) as f64 / N as f64;
        eprintln!(
            "{size} running jobs: {cost:.2} commands per dispatch ({busy} busy, {idle} idle, {elapsed:?})"
        );
        per_dispatch.push(cost);
        running += N as usize;
    }
    assert!(per_dispatch.iter().all(|c| *c <= 12.0), "commands per dispatch: {per_dispatch:?}");

    // Commands clients sent (MONITOR shows those run by
    // scripts as coming from `lua`) for the dispatcher, the worker and the
    // reply, between markers; minus the same time idle (blocking reads
    // that time out, timers). Only the kinds a dispatch's path sends
    // count: each worker's periodic check (`MULTI`, `SCARD`, `XLEN`,
    // `SSCAN`, about 20 commands every few seconds) falls in one window
    // or the other as it happens, and on a loaded machine the busy window
    // is long enough to hold one while the idle one does not.
    const PATH: [&str; 4] = ["EVALSHA", "XREAD", "XADD", "XDEL"];
    let monitor = redis::Client::open(server.url()).unwrap().get_async_monitor().await.unwrap();
    let mut lines = monitor.into_on_message::<String>();
    let counter = tokio::spawn(async move {
        use futures_util::StreamExt as _;
        let (mut window, mut counts) = (None, [0u64; 2]);
        while let Some(line) = lines.next().await {
            if line.contains("\"window-0\"") {
                window = Some(0);
            } else if line.contains("\"window-1\"") {
                window = Some(1);
            } else if line.contains("\"window-end\"") {
                if window == Some(1) {
                    return counts;
                }
                window = None;
            } else if let Some(w) = window
                && !line.contains(" lua]")
                && PATH.iter().any(|command| line.contains(&format!("] \"{command}\"")))
            {
                counts[w] += 1;
            }
        }
        counts
    });
    const TRIPS: u64 = 1_000;
    redis::cmd("ECHO").arg("window-0").exec_async(&mut conn).await.unwrap();
    let started = Instant::now();
    for i in 0..TRIPS {
        assert_eq!(node.dispatch(&format!("trip-{i}"), b"").await.unwrap(), DispatchOutcome::Started);
    }
    let elapsed = started.elapsed();
    redis::cmd("ECHO").arg("window-end").exec_async(&mut conn).await.unwrap();
    redis::cmd("ECHO").arg("window-1").exec_async(&mut conn).await.unwrap();
    tokio::time::sleep(elapsed).await;
    redis::cmd("ECHO").arg("window-end").exec_async(&mut conn).await.unwrap();
    let [busy, idle] = counter.await.unwrap();
    let sent = busy.saturating_sub(idle) as f64 / TRIPS as f64;
    eprintln!("{sent:.3} commands sent per dispatch in 4 round trips ({busy} busy, {idle} idle)");
    // Four round trips: the dispatch script, the worker's read, its answer
    // pipelined with the deletion of the processed entry (two commands in
    // MONITOR), the dispatcher's read.
    assert!(sent <= 5.02, "commands sent per dispatch: {sent:.3}");
    assert!(
        (per_dispatch[0] - per_dispatch[1]).abs() <= 1.0,
        "cost grows with the job count: {per_dispatch:?}"
    );
    let _ = &calls;
    node.close().await;
    let _ = finish;
}
